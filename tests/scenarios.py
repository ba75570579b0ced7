"""Scenarios and checks shared by the tiers that run the paper's walk-throughs for real
(emulated GPUs, real Slurm job steps, LSF stand-ins)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from marbled.cli.client import BrokerClient, BrokerUnreachable
from marbled.resources import load_job_file, workload_path

# paper job set 3 (Figure 5), every job done at exactly its steps
JOBSET3_DONE = [(1, "done", 900), (2, "done", 2000), (3, "done", 800)]
JOBS = "SELECT id, state, step FROM jobs ORDER BY id"


def jobset(n: int) -> list[dict]:
    path = workload_path(f"paper-jobset{n}")
    return [s.to_mapping() for s in load_job_file(path)]


def runs_by_job(daemon) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in daemon.runs():
        out.setdefault(r["job_id"], []).append(r)
    return out


def check_figure5(daemon) -> None:
    """Job set 3 ended as Figure 5 draws it: ResNet-50 primary on 3, Inception-v3 secondary
    on 3 then promoted to 4 at its checkpointed step, VGG-16 secondary on 2 to its end."""
    runs = runs_by_job(daemon)
    (r50,) = runs[1]
    assert (r50["role"], r50["gpu_count"]) == ("primary", 3)
    inc_first, inc_resumed = runs[2]
    assert (inc_first["role"], inc_first["gpu_count"], inc_first["end_reason"]) == (
        "secondary", 3, "suspended")
    assert (inc_resumed["role"], inc_resumed["gpu_count"]) == ("primary", 4)
    assert 0 < inc_first["end_step"] == inc_resumed["start_step"]
    assert inc_resumed["end_step"] == 2000
    assert (runs[3][0]["role"], runs[3][0]["gpu_count"]) == ("secondary", 2)
    assert runs[3][-1]["end_step"] == 800


def run_figure5(daemon, node: str, timeout: float = 120.0) -> list:
    """Job set 3 through `daemon`, whose only node is `node` (6 GPUs): every job done, the
    Figure 5 schedule, no GPU shared as the runs saw them. The runs, for more checks."""
    nodes = daemon.client.get("/v1/status")["nodes"]
    assert {n: len(v["gpus"]) for n, v in nodes.items()} == {node: 6}
    daemon.submit(*jobset(3))
    jobs = daemon.wait_all(timeout=timeout)
    assert [j["state"] for j in jobs] == ["done"] * 3
    check_figure5(daemon)
    runs = daemon.runs()
    check_no_gpu_shared(runs)
    return runs


def devices(run) -> set[str]:
    assert run["devices"], f"run {run['id']} never reported its GPUs"
    return set(run["devices"].split(","))


# When the batch system picks a run's GPUs, the broker's times of a run bound the GPUs'
# holding only loosely: a run starts (in the store) before its step has its GPUs, and
# ends when the broker has seen the exit, after the GPUs were released. Runs that overlap
# for less than this did not share GPUs; double-booking would overlap for whole runs.
NOTICE_SLACK = 0.5


def check_no_gpu_shared(runs) -> None:
    """Runs at the same time on the same node held disjoint GPUs, as the runs saw them."""
    for a in runs:
        assert len(devices(a)) == a["gpu_count"]
        for b in runs:
            together = min(a["ended_at"], b["ended_at"]) - max(a["started_at"], b["started_at"])
            if a["id"] < b["id"] and a["node"] == b["node"] and together > NOTICE_SLACK:
                assert devices(a).isdisjoint(devices(b)), (dict(a), dict(b))


def training(broker: BrokerClient) -> bool:
    """True once two jobs run and have trained some steps."""
    try:
        jobs = broker.get("/v1/jobs")["jobs"]
    except (BrokerUnreachable, OSError):
        return False
    return sum(j["state"] == "running" and j["step"] > 20 for j in jobs) >= 2


def db_rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def as_schema_version_1(path) -> None:
    """Turn a current database back into what marbled with schema version 1 wrote."""
    con = sqlite3.connect(path)
    for column in ("devices", "share"):
        con.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    for column in ("nodes", "retries", "failures", "not_before", "max_share", "chdir",
                   "per_gpu", "nodes_min", "env"):
        con.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    con.execute("DROP TABLE gpu_samples")
    con.execute("DROP TABLE samples")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.commit()
    con.close()


# A training script as a user writes one: it reads its data by a relative path, keeps its
# checkpoint where the broker says (MARBLE_CHECKPOINT_DIR), and writes its result next to it.
TRAIN = '''
import json, os, sys, time
from pathlib import Path
from marbled.worker.protocol import JobProtocol
proto = JobProtocol.from_env().install()
from marbled.worker.loop import StepLoop


class Checkpoint:
    saved_step = None
    path = Path(os.environ["MARBLE_CHECKPOINT_DIR"]) / "step.json"

    def restore(self):
        self.saved_step = json.loads(self.path.read_text())["step"] if self.path.exists() else 0
        return self.saved_step

    def save(self, step):
        self.path.write_text(json.dumps({"step": step}))
        self.saved_step = step


data = Path("data.txt").read_text().strip()
loop = StepLoop(Checkpoint(), protocol=proto)
for step in loop.steps():
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.005)
with open("trained.txt", "a") as f:
    f.write(f"{data} {loop.step} {os.getcwd()}\\n")
'''


def project(path: Path, data: str) -> Path:
    path.mkdir(parents=True)
    (path / "train.py").write_text(TRAIN)
    (path / "data.txt").write_text(data + "\n")
    return path


def with_multi_node_jobs(arrivals: list, every: int = 5) -> list:
    """A simulator workload with every `every`-th job on two nodes instead: a range (1-2)
    and a fixed count by turns, for the policies that place multi-node jobs."""
    from dataclasses import replace

    return [replace(a, spec=replace(a.spec, nodes=2, nodes_min=1 if i // every % 2 else None))
            if i % every == every - 1 else a for i, a in enumerate(arrivals)]
