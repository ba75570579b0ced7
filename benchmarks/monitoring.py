"""What the broker costs while it watches: one monitoring cycle, its memory, its file, its lists.

1. **Monitoring cycle** (in process: a real `Broker`, policy marble with `--prestart ahead`,
   learning on, with the fakes of tests/broker/fakes.py, so no process runs): 6 running jobs
   on one node of 6 GPUs (5 rigid jobs on 1 GPU and one malleable job started as a
   secondary on the GPU left) and 48 on 8 such nodes (8 secondaries). Every run has a
   progress file on disk, as a job that does not speak the prestart protocol writes it, so
   every cycle looks at each secondary's file. A *cycle* is what the broker does every
   `--monitor-interval`: `_prestart_secondaries()` (may a secondary's next run be
   prestarted?) and the look for acknowledgements (`check_acks`); the learner's look
   (every `--learn-interval`, 30 s by default: the progress of every run) is timed apart.
   Files unchanged between cycles, and each rewritten before every cycle (the write is
   not timed). Median and p99 of --cycles cycles, in microseconds.
2. **RSS and listing with 10,000 queued jobs**: a real broker (`marbled --gpus 6`) whose GPUs
   a job holds; its VmRSS idle and with 10,000 queued jobs; `GET /v1/jobs` (every job),
   `GET /v1/jobs?state=queued&limit=100`, and `marble status` (one process, as a user runs
   it) with them: median of --repeat; the SQLite file's size.
3. **RSS with 100,000 events**: a state directory with a history of 25,000 finished jobs
   (a run and 4 events each, written as the broker writes them), a broker started on it:
   its VmRSS, `GET /v1/jobs/ID`, and the file's size.

    .venv/bin/python benchmarks/monitoring.py [--cycles 2000] [--repeat 5] [--json F]
    .venv/bin/python benchmarks/monitoring.py --smoke      # CI: small counts, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # tests.broker.fakes (appended: PYTHONPATH wins)

from marbled.cli.client import BrokerClient  # noqa: E402
from marbled.core.policy import get_policy  # noqa: E402
from marbled.core.spec import JobSpec  # noqa: E402
from marbled.daemon.broker import Broker  # noqa: E402
from marbled.daemon.config import BrokerConfig  # noqa: E402
from marbled.demo import start_broker  # noqa: E402
from marbled.paths import DB_NAME, socket_path  # noqa: E402
from marbled.resources import load_profile  # noqa: E402
from marbled.store.db import Store  # noqa: E402
from tests.broker.fakes import FakeClock, FakeLauncher, pump  # noqa: E402

HOLDER = {"gpus": 6, "command": ["sleep", "100000"], "name": "holder"}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _quantiles(seconds: list[float], unit: float = 1e6) -> dict:
    ordered = sorted(seconds)
    return {"median": round(statistics.median(ordered) * unit, 1),
            "p99": round(ordered[int(0.99 * (len(ordered) - 1))] * unit, 1)}


# ------------------------------------------------------------------ 1. the cycle


async def _cycle_figures(state_dir: Path, nodes: int, cycles: int) -> dict:
    clock, launcher = FakeClock(), FakeLauncher()
    config = BrokerConfig(
        state_dir=state_dir, nodes={f"n{i}": tuple(map(str, range(6))) for i in range(nodes)},
        book=load_profile(), profile_ref="summit-v100", broker_node="n0",
        monitor_interval=1.0, prestart="ahead",
        coalesce_s=0.0)  # a quiet period after run ends is real time: `pump` would not wait it
    broker = Broker(config, Store(None), launcher, get_policy("marble"), clock)
    broker.recover()
    task = asyncio.get_running_loop().create_task(broker.run())
    try:
        await pump()
        # Every GPU taken by a rigid job, a malleable job waiting; then one rigid run per
        # node ends, and each malleable job starts as a secondary on the GPU it leaves.
        broker.submit([JobSpec.from_mapping({"gpus": 1, "command": ["true"]})] * (6 * nodes))
        await pump(50)
        broker.submit([JobSpec.from_mapping({"model": "inception-v3", "steps": 10**6,
                                             "command": ["true"]})] * nodes)
        await pump(50)
        ending = {}
        for r in launcher.runs:
            node = broker.state.jobs[int(r.request.env["MARBLE_JOB_ID"])].placement.node
            ending.setdefault(node, r)
        for r in ending.values():
            r.exit(0)
        await pump(100)
        await clock.advance(0.01)
        await pump(100)
        runs = [r for r in launcher.runs if r not in ending.values()]
        roles = [broker.state.jobs[int(r.request.env["MARBLE_JOB_ID"])].role for r in runs]
        step = 1
        for r in runs:
            r.report(step)

        def one() -> float:
            t0 = time.perf_counter()
            broker._prestart_secondaries()
            broker.runs.check_acks()
            return time.perf_counter() - t0

        def learner() -> float:
            t0 = time.perf_counter()
            broker.learner.tick()
            return time.perf_counter() - t0

        for _ in range(20):  # warm up (caches, the first read of each file)
            one()
        unchanged = [one() for _ in range(cycles)]
        learn_unchanged = [learner() for _ in range(max(cycles // 10, 20))]
        rewritten, learn_rewritten = [], []
        for i in range(cycles):
            step += 1
            for r in runs:
                r.report(step)
            if i % 10 == 0:
                learn_rewritten.append(learner())
            else:
                rewritten.append(one())
        return {"running": len(runs),
                "secondaries": sum(1 for role in roles if role and role.value == "secondary"),
                "cycle_unchanged_us": _quantiles(unchanged),
                "cycle_rewritten_us": _quantiles(rewritten),
                "learner_unchanged_us": _quantiles(learn_unchanged),
                "learner_rewritten_us": _quantiles(learn_rewritten)}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def cycle_part(tmp: Path, cycles: int) -> list[dict]:
    out = []
    for nodes in (1, 8):
        fig = asyncio.run(_cycle_figures(tmp / f"cycle-{nodes}", nodes, cycles))
        fig["load"] = load_average()
        out.append(fig)
        print(f"cycle, {fig['running']:>2} running ({fig['secondaries']} secondaries): "
              f"files unchanged {fig['cycle_unchanged_us']['median']} us median "
              f"({fig['cycle_unchanged_us']['p99']} p99), rewritten "
              f"{fig['cycle_rewritten_us']['median']} us ({fig['cycle_rewritten_us']['p99']} "
              f"p99); the learner's look {fig['learner_unchanged_us']['median']} / "
              f"{fig['learner_rewritten_us']['median']} us; load {fig['load']}", flush=True)
    return out


# ------------------------------------------------------------------ 2. queued jobs


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def _timed(fn, repeat: int) -> tuple[dict, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return _quantiles(times, 1e3), result


def queued_part(tmp: Path, jobs: int, repeat: int) -> dict:
    state = tmp / "queued"
    proc = start_broker(state, "marble", 6, 1.0)
    try:
        client = BrokerClient(socket_path(state), timeout=120)
        client.post("/v1/jobs", HOLDER)
        time.sleep(0.5)
        idle = rss_mb(proc.pid)
        for first in range(0, jobs, 1000):
            client.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["true"]}]
                                     * min(1000, jobs - first)})
        time.sleep(0.5)
        queued = rss_mb(proc.pid)
        every, listed = _timed(lambda: client.get("/v1/jobs"), repeat)
        paged, page = _timed(lambda: client.get("/v1/jobs?state=queued&limit=100"), repeat)
        marble = [str(Path(sys.executable).with_name("marble")), "--state-dir", str(state),
                  "status"]
        status, _ = _timed(lambda: subprocess.run(marble, check=True, capture_output=True),
                           repeat)
        after = rss_mb(proc.pid)
        size = (state / DB_NAME).stat().st_size + _wal_size(state)
        fig = {"jobs": jobs, "rss_idle_mb": idle, "rss_queued_mb": queued,
               "rss_after_listing_mb": after, "list_all_ms": every,
               "list_all_bytes": len(json.dumps(listed)), "list_page_ms": paged,
               "page_jobs": len(page["jobs"]), "marble_status_ms": status,
               "db_bytes": size, "load": load_average()}
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        shutil.rmtree(state, ignore_errors=True)
    print(f"{jobs} queued: RSS {fig['rss_idle_mb']} MB idle, {fig['rss_queued_mb']} MB "
          f"queued, {fig['rss_after_listing_mb']} MB after the listings; GET /v1/jobs "
          f"{fig['list_all_ms']['median']} ms ({fig['list_all_bytes'] / 1e6:.1f} MB), "
          f"?state=queued&limit=100 {fig['list_page_ms']['median']} ms, marble status "
          f"{fig['marble_status_ms']['median']} ms (p99 {fig['marble_status_ms']['p99']}); "
          f"SQLite {size / 1e6:.1f} MB; load {fig['load']}", flush=True)
    return fig


def _wal_size(state: Path) -> int:
    wal = state / (DB_NAME + "-wal")
    return wal.stat().st_size if wal.exists() else 0


# ------------------------------------------------------------------ 3. a long history


def history(state: Path, jobs: int) -> int:
    """A state directory whose store holds `jobs` finished jobs, a run and 4 events each;
    the number of events."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    Store(state / DB_NAME).close()  # the schema, as a broker makes it
    con = sqlite3.connect(state / DB_NAME)
    t = 1.7e9
    with con:
        con.executemany(
            "INSERT INTO jobs (id, name, model, steps, gpus_request, demand, nodes, retries, "
            "failures, malleable, max_share, command, emulate, after, state, step, "
            "suspensions, submitted_at, started_at, finished_at, exit_code, reason) VALUES "
            "(?, NULL, NULL, NULL, 1, 1, 1, 0, 0, 0, 1, '[\"true\"]', 0, '[]', 'done', 0, 0, "
            "?, ?, ?, 0, 'exited 0')", [(i, t + i, t + i + 0.1, t + i + 0.2)
                                        for i in range(1, jobs + 1)])
        con.executemany(
            "INSERT INTO runs (id, job_id, node, gpu_ids, devices, gpu_count, share, role, "
            "started_at, ended_at, start_step, end_step, exit_code, end_reason, pid, "
            "pid_start) VALUES (?, ?, 'n0', '0', '0', 1, 1, 'primary', ?, ?, 0, NULL, 0, "
            "'done', 4242, 1)", [(i, i, t + i + 0.1, t + i + 0.2) for i in range(1, jobs + 1)])
        events = []
        for i in range(1, jobs + 1):
            events += [
                (t + i, "submitted", i, None, '{"demand": 1, "malleable": false}'),
                (t + i + 0.1, "started", i, i,
                 '{"node": "n0", "gpus": [0], "role": "primary", "step": 0}'),
                (t + i + 0.15, "placed", i, i, '{"node": "n0", "devices": "0"}'),
                (t + i + 0.2, "done", i, i,
                 '{"exit_code": 0, "step": null, "detail": "exited 0"}')]
        con.executemany("INSERT INTO events (at, kind, job_id, run_id, data) "
                        "VALUES (?, ?, ?, ?, ?)", events)
    con.close()
    return len(events)


def history_part(tmp: Path, jobs: int, repeat: int) -> dict:
    state = tmp / "history"
    events = history(state, jobs)
    proc = start_broker(state, "marble", 6, 1.0)
    try:
        client = BrokerClient(socket_path(state), timeout=120)
        time.sleep(0.5)
        rss = rss_mb(proc.pid)
        one, _ = _timed(lambda: client.get(f"/v1/jobs/{jobs // 2}"), repeat)
        page, _ = _timed(lambda: client.get("/v1/jobs?state=queued&limit=100"), repeat)
        fig = {"events": events, "jobs": jobs, "rss_mb": rss, "job_detail_ms": one,
               "unfinished_page_ms": page,
               "db_bytes": (state / DB_NAME).stat().st_size + _wal_size(state),
               "load": load_average()}
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        shutil.rmtree(state, ignore_errors=True)
    print(f"{events} events ({jobs} finished jobs): RSS {fig['rss_mb']} MB; GET /v1/jobs/ID "
          f"{fig['job_detail_ms']['median']} ms; SQLite {fig['db_bytes'] / 1e6:.1f} MB; "
          f"load {fig['load']}", flush=True)
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=10_000, help="queued jobs (part 2)")
    ap.add_argument("--history", type=int, default=25_000,
                    help="finished jobs of the history (part 3; 4 events each)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--parts", default="cycle,queued,history")
    ap.add_argument("--smoke", action="store_true", help="small counts (CI)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.smoke:
        args.cycles, args.jobs, args.history, args.repeat = 50, 500, 500, 2
    parts = set(args.parts.split(","))
    print(f"monitoring, memory and listings; load {load_average()}")
    out: dict = {"smoke": args.smoke, "load_before": load_average()}
    with tempfile.TemporaryDirectory(prefix="marble-mon-") as tmp_name:
        tmp = Path(tmp_name)
        if "cycle" in parts:
            out["cycle"] = cycle_part(tmp, args.cycles)
        if "queued" in parts:
            out["queued"] = queued_part(tmp, args.jobs, args.repeat)
        if "history" in parts:
            out["history"] = history_part(tmp, args.history, args.repeat)
    out["load_after"] = load_average()
    print(f"load at end {out['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
