"""One policy decision, on the pure core and as the daemon sees it (issue 15, decision latency).

    .venv/bin/python benchmarks/decision_latency.py [--policy P ...] [--nodes N ...]
        [--queued Q ...] [--samples S] [--states K] [--daemon-samples D] [--daemon-free F]
        [--daemon-queued Q ...] [--no-daemon] [--no-core] [--smoke] [--json FILE]

The matrix is policy x jobs queued (10, 100, 1,000, 10,000) x nodes of 6 GPUs (1, 8, 64),
in these scenarios:

* `free`: all GPUs free, the queue full (a decision that starts as many jobs as fit);
* `ended`: a loaded cluster where one run has just ended;
* `chain` (core only): Q jobs of 3 GPUs each waiting for the one before, the first running,
  the other GPUs free: a decision in which nothing can start, behind a long queue.

**core**: `Policy.decide()` timed in this process on states taken from the simulator
(`policy_matrix.py --decision`'s workload: Poisson jobs of its four models, all at t = 0):
its first decision (`free`) and its first decisions after a run ends (`ended`, several
states), each cut to exactly the first Q waiting jobs (the running and finished ones
kept), each decided `--samples` times in all; median and p99 in ms.

**daemon**: a real `Broker` (its store SQLite in memory) on the fake launcher and clock of
tests/broker/fakes.py, in a real asyncio loop: the time from the event -- a run's exit --
to the launcher's `launch()` call of the first run it starts (`first`), to the last one
(`last`: with all GPUs free, dozens of runs), and the broker's time in `Broker.decide`
(what `marbled_decision_seconds` observes) for that event. A run asked to suspend (a
reshape) acknowledges its checkpoint and exits at once, so `first` is the broker's own
latency: its quiet period after a run's end (`coalesce_s`, 10 ms: ends that come together
are one decision) and its decision. For `free` the harness pauses the loop, cancels every
run but one, tops the queue up to Q and lets that run end; `ended` lets the oldest run
end, the cluster loaded. Each `free` sample rebuilds the cluster, so the daemon takes fewer
samples (its p99 is then the maximum).

`--smoke` (CI): two policies, 8 nodes, 10 and 1,000 queued, a few samples, in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from marbled.core.model import Job, JobState, Node, Role, Start, State
from marbled.core.policy import POLICIES, get_policy
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import Arrival, poisson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # benchmarks.*, tests.broker.fakes (appended: PYTHONPATH wins)

from benchmarks.policy_matrix import MIX, PROFILE, Enough  # noqa: E402

GPUS = 6
QUEUED = (10, 100, 1000, 10_000)
NODES = (1, 8, 64)
SCENARIOS = ("free", "ended")  # also "chain" on the core
TARGET_MS = {8: 1.0, 64: 5.0}  # p99 with 10,000 queued (issue 15)


def workload(jobs: int) -> list[Arrival]:
    """`jobs` Poisson jobs of policy_matrix's mix, all arriving at t = 0."""
    return [Arrival(0.0, a.spec) for a in poisson(jobs, 60.0, MIX, (500, 5000), 0)]


def quantiles(times: list[float]) -> dict:
    t = sorted(times)
    return {"median_ms": statistics.median(t) * 1e3,
            "p99_ms": t[min(len(t) - 1, round(0.99 * (len(t) - 1)))] * 1e3,
            "max_ms": t[-1] * 1e3, "samples": len(t)}


# ---------------------------------------------------------------- on the pure core


def cut(state: State, queued: int) -> State:
    """The same state with only the first `queued` waiting jobs (all others kept)."""
    keep = set(itertools.islice((j.id for j in state.waiting()), queued))
    return State(nodes=dict(state.nodes),
                 jobs={i: j for i, j in state.jobs.items() if i in keep or not j.waiting})


class Probe:
    """Wraps a policy in the simulator: keeps its first decision (all GPUs free) and its
    first decisions after a run ended, each cut to `queued` waiting jobs."""

    def __init__(self, policy, queued: int, states: int):
        self.policy, self.name = policy, policy.name
        self.queued, self.states = queued, states
        self.free: tuple[State, float] | None = None
        self.ended: list[tuple[State, float]] = []
        self._unfinished: int | None = None

    def decide(self, state, now):
        if self.free is None:
            self.free = (cut(state, self.queued), now)
        elif state.unfinished < self._unfinished and len(self.ended) < self.states:
            if sum(1 for _ in itertools.islice(state.waiting(), self.queued)) == self.queued:
                self.ended.append((cut(state, self.queued), now))
            if len(self.ended) >= self.states:
                raise Enough
        self._unfinished = state.unfinished
        return self.policy.decide(state, now)

    def next_decision(self, state, now):
        return self.policy.next_decision(state, now)

    def feasible(self, job, state):  # the simulator checks each job against the policy
        return self.policy.feasible(job, state)


def time_decisions(policy, states: list[tuple[State, float]],
                   samples: int) -> tuple[list[float], list[float]]:
    """`samples` timed decisions, spread evenly over `states` (decide() is pure): wall
    times, and the CPU time of this thread (without the time another process had the
    core: on a shared machine the wall p99 is mostly that)."""
    wall, cpu, clock, thread = [], [], time.perf_counter, time.thread_time
    per = max(1, samples // len(states))
    for state, now in states:
        policy.decide(state, now)  # warm: the first call may build caches
        for _ in range(per):
            t0, c0 = clock(), thread()
            policy.decide(state, now)
            c1, t1 = thread(), clock()
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
    return wall, cpu


def chain(nodes: int, queued: int) -> State:
    """`queued` jobs waiting each for the one before; the first of the chain runs."""
    state = State(nodes={f"node{i}": Node(f"node{i}", tuple(range(GPUS))) for i in range(nodes)})
    state.submit(Job(1, 3, True))
    state.apply(Start(1, "node0", (0, 1, 2), Role.PRIMARY))
    for i in range(2, queued + 2):
        state.submit(Job(i, 3, True, after=(i - 1,)))
    return state


def core_cell(name: str, nodes: int, queued: int, samples: int, states: int) -> dict:
    book = load_profile(PROFILE)
    probe = Probe(get_policy(name), queued, states)
    # Enough jobs that `queued` still wait while the cluster fills and `states` runs end.
    arrivals = workload(queued + GPUS * nodes + GPUS * states + 10)
    with contextlib.suppress(Enough):
        Simulator(book, probe, GPUS, nodes, 5.0, 5.0).run(arrivals)
    policy = get_policy(name)
    if not hasattr(policy, "background"):
        return _core_figures(policy, probe, nodes, queued, samples)
    policy.background = ProcessPoolExecutor(1)  # a planner's plans, beside (as in the daemon)
    try:
        return _core_figures(policy, probe, nodes, queued, samples)
    finally:
        policy.background.shutdown(wait=False, cancel_futures=True)


def _core_figures(policy, probe: Probe, nodes: int, queued: int, samples: int) -> dict:
    out = {}
    for scenario, got in (("free", [probe.free]), ("ended", probe.ended)):
        if not got or got[0] is None:
            continue
        gc.collect()
        first = got[0][0]
        wall, cpu = time_decisions(policy, got, samples)
        out[scenario] = {**quantiles(wall), "cpu": quantiles(cpu),
                         "states": len(got),
                         "starts": sum(1 for a in policy.decide(*got[0])
                                       if type(a).__name__ == "Start"),
                         "running": len(first.engaged()),
                         "free_gpus": sum(len(first.free(n)) for n in first.nodes)}
    wall, cpu = time_decisions(policy, [(chain(nodes, queued), 0.0)], samples)
    out["chain"] = {**quantiles(wall), "cpu": quantiles(cpu)}
    return out


# ---------------------------------------------------------------- as the daemon sees it


async def daemon_cell(name: str, nodes: int, queued: int, samples: int,
                      free_samples: int) -> dict:
    from marbled.daemon.broker import Broker
    from marbled.daemon.config import BrokerConfig
    from marbled.store.db import Store
    from tests.broker.fakes import FakeClock, FakeLauncher

    class Launcher(FakeLauncher):
        async def launch(self, request):
            launches.append(time.perf_counter())
            return await super().launch(request)

    launches: list[float] = []
    decisions: list[float] = []
    book = load_profile(PROFILE)
    specs = iter([a.spec for a in workload(queued + GPUS * nodes * (2 + free_samples)
                                           + GPUS * samples + 10)])
    with tempfile.TemporaryDirectory(prefix="marbled-latency-") as tmp:
        cfg = BrokerConfig(state_dir=Path(tmp), book=book, profile_ref=PROFILE,
                           nodes={f"n{i}": tuple(map(str, range(GPUS))) for i in range(nodes)},
                           broker_node="n0", monitor_interval=1.0, suspend_timeout=60.0,
                           kill_timeout=10.0, prestart="off", retry_delay=30.0)
        launcher = Launcher()
        broker = Broker(cfg, Store(None), launcher, get_policy(name), FakeClock())
        broker.recover()
        real_decide = broker.decide

        def timed_decide() -> None:
            t0 = time.perf_counter()
            real_decide()
            decisions.append(time.perf_counter() - t0)

        def pause(paused: bool) -> None:
            broker.decide = (lambda: None) if paused else timed_decide

        answered: dict[int, int] = {}

        def answer() -> None:
            """Runs asked to stop do so at once: a suspended one acknowledges its checkpoint
            (at step 1) and exits, a cancelled one exits on SIGTERM."""
            for run in launcher.runs:
                if len(run.signals) > answered.get(id(run), 0):
                    answered[id(run)] = len(run.signals)
                    if run.signals[-1] in ("SIGTSTP", "SIGTERM", "SIGKILL"):
                        with contextlib.suppress(asyncio.InvalidStateError):
                            if run.signals[-1] == "SIGTSTP":
                                run.acknowledge(1)
                            run.exit(0 if run.signals[-1] == "SIGTSTP" else -15)

        async def settle_loop(quiet: int = 30) -> None:
            """Run the loop until nothing happens for `quiet` rounds."""
            idle, seen = 0, (-1, -1)
            while idle < quiet:
                await asyncio.sleep(0)
                answer()
                now = (len(launches), len(decisions))
                busy = broker.runs.launching or broker.ends.coalescing  # (a real-time wait)
                idle = idle + 1 if now == seen and not busy else 0
                seen = now

        def waiting() -> int:
            return sum(1 for _ in broker.state.waiting())

        def top_up(to: int) -> None:
            need = to - waiting()
            if need > 0:
                broker.submit(list(itertools.islice(specs, need)))

        def oldest_live():
            ids = sorted(j for j in broker.runs.live
                         if broker.state.jobs[j].state is JobState.RUNNING)
            return broker.runs.live[ids[0]].handle if ids else None

        async def event(run) -> dict | None:
            """Let `run` end; what the broker did about it."""
            launches.clear()
            decisions.clear()
            t0 = time.perf_counter()
            run.exit(0)
            await settle_loop()
            if not launches:
                return None
            return {"first": launches[0] - t0, "last": launches[-1] - t0,
                    "decide": sum(decisions)}

        task = asyncio.get_running_loop().create_task(broker.run())
        try:
            pause(True)
            top_up(queued + GPUS * nodes)
            await settle_loop()
            pause(False)
            broker.wake()
            await settle_loop()  # the cluster fills
            out: dict[str, dict] = {}
            got: dict[str, list[dict]] = {"ended": [], "free": []}
            missed = {"ended": 0, "free": 0}
            for _ in range(samples):
                pause(True)
                top_up(queued)
                await settle_loop()
                pause(False)
                run = oldest_live()
                r = await event(run) if run else None
                got["ended"].append(r) if r else missed.__setitem__("ended",
                                                                    missed["ended"] + 1)
            for _ in range(free_samples):
                pause(True)
                live = sorted(broker.runs.live)
                for job_id in live[:-1]:
                    broker.cancel(job_id)
                await settle_loop()
                top_up(queued)
                await settle_loop()
                pause(False)
                run = oldest_live()
                r = await event(run) if run else None
                got["free"].append(r) if r else missed.__setitem__("free", missed["free"] + 1)
            for scenario, rows in got.items():
                if rows:
                    out[scenario] = {
                        key: quantiles([r[key] for r in rows])
                        for key in ("first", "last", "decide")}
                    out[scenario]["no_launch"] = missed[scenario]
            return out
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# ---------------------------------------------------------------- the table


def print_core(rows: list[dict]) -> None:
    print("\non the pure core: one Policy.decide(), ms (median / p99 wall / p99 CPU time)")
    print(f"{'policy':10}{'nodes':>6}{'queued':>8}  {'all GPUs free':>28}  "
          f"{'after a run ends':>28}  {'a chain of dependencies':>28}")
    for r in rows:
        cells = []
        for s in (*SCENARIOS, "chain"):
            c = r["core"].get(s)
            cells.append(f"{c['median_ms']:8.3f} /{c['p99_ms']:8.3f} /{c['cpu']['p99_ms']:8.3f}"
                         if c else f"{'-':>28}")
        flag = ""
        target = TARGET_MS.get(r["nodes"])
        if target and r["queued"] == max(QUEUED) and any(
                r["core"].get(s, {}).get("p99_ms", 0) > target for s in SCENARIOS):
            cpu = any(r["core"].get(s, {}).get("cpu", {}).get("p99_ms", 0) > target
                      for s in SCENARIOS)
            flag = f"  p99 > {target:g} ms" + (" (CPU time too)" if cpu else " (wall only)")
        print(f"{r['policy']:10}{r['nodes']:>6}{r['queued']:>8}  " + "  ".join(
            f"{c:>28}" for c in cells) + flag)


def print_daemon(rows: list[dict]) -> None:
    print("\nas seen by the daemon: a run's exit -> the launcher's launch(), ms "
          "(median / p99; decide: the broker's time in Broker.decide)")
    print(f"{'policy':10}{'nodes':>6}{'queued':>8}  {'scenario':9}{'first launch':>20}"
          f"{'last launch':>20}{'decide':>20}{'n':>5}")
    for r in rows:
        for s in SCENARIOS:
            c = r["daemon"].get(s)
            if not c:
                continue
            print(f"{r['policy']:10}{r['nodes']:>6}{r['queued']:>8}  {s:9}" + "".join(
                f"{c[k]['median_ms']:9.2f} /{c[k]['p99_ms']:8.2f}" + " " * 2
                for k in ("first", "last", "decide")) + f"{c['first']['samples']:>5}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", action="append", choices=sorted(POLICIES),
                    help="only this policy (repeatable; default: all)")
    ap.add_argument("--nodes", action="append", type=int,
                    help=f"nodes of {GPUS} GPUs (repeatable; default: {NODES})")
    ap.add_argument("--queued", action="append", type=int,
                    help=f"jobs waiting (repeatable; default: {QUEUED})")
    ap.add_argument("--samples", type=int, default=200,
                    help="core: timed decisions per scenario (default 200)")
    ap.add_argument("--states", type=int, default=20,
                    help="core: states after a run ends the samples are spread over")
    ap.add_argument("--daemon-samples", type=int, default=30,
                    help="daemon: runs that end on a loaded cluster (default 30)")
    ap.add_argument("--daemon-free", type=int, default=5,
                    help="daemon: decisions with all GPUs free (each rebuilds; default 5)")
    ap.add_argument("--daemon-queued", action="append", type=int,
                    help="daemon: jobs waiting (default: as --queued)")
    ap.add_argument("--no-daemon", action="store_true", help="only the pure core")
    ap.add_argument("--no-core", action="store_true", help="only the daemon")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: marble and moldable, 8 nodes, 10 and 1,000 queued, few samples")
    ap.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = ap.parse_args()
    if args.smoke:
        args.policy = args.policy or ["marble", "moldable"]
        args.nodes = args.nodes or [8]
        args.queued = args.queued or [10, 1000]
        args.samples, args.states = min(args.samples, 20), min(args.states, 4)
        args.daemon_samples, args.daemon_free = min(args.daemon_samples, 3), \
            min(args.daemon_free, 1)
    policies = args.policy or sorted(POLICIES)
    nodes_list, queued_list = args.nodes or list(NODES), args.queued or list(QUEUED)
    daemon_queued = args.daemon_queued or queued_list
    load = os.getloadavg()
    print(f"decision latency: {len(policies)} policies x nodes {nodes_list} of {GPUS} GPUs x "
          f"queued {queued_list}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} CPUs")
    rows = []
    t0 = time.perf_counter()
    for name in policies:
        for nodes in nodes_list:
            for queued in sorted(set(queued_list) | set(daemon_queued)):
                row = {"policy": name, "nodes": nodes, "queued": queued, "core": {},
                       "daemon": {}}
                if not args.no_core and queued in queued_list:
                    row["core"] = core_cell(name, nodes, queued, args.samples, args.states)
                if not args.no_daemon and queued in daemon_queued:
                    row["daemon"] = asyncio.run(daemon_cell(
                        name, nodes, queued, args.daemon_samples, args.daemon_free))
                rows.append(row)
                print(f"  {name} {nodes} nodes {queued} queued done "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if not args.no_core:
        print_core([r for r in rows if r["core"]])
    if not args.no_daemon:
        print_daemon([r for r in rows if r["daemon"]])
    print(f"\n{time.perf_counter() - t0:.0f} s; load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": PROFILE, "gpus_per_node": GPUS, "load_average": load,
                       "cpus": os.cpu_count(), "targets_p99_ms_at_10000": TARGET_MS,
                       "cells": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
