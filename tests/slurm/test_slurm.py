"""marbled inside real Slurm allocations, every run a real job step (fake GPUs, see conftest).

The broker runs outside the allocation's steps as it would under salloc, with
SLURM_JOB_ID naming the allocation; its runs are `srun --exact` steps whose GPU
sets come from Slurm and are read back from the steps themselves (`devices`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marbled.batch.slurm import STEP_INFO, slurm_allocation
from marbled.cli.client import BrokerClient
from marbled.paths import socket_path
from marbled.resources import workload_path
from tests import REPO
from tests.scenarios import (
    JOBS,
    JOBSET3_DONE,
    check_no_gpu_shared,
    db_rows,
    jobset,
    project,
    run_figure5,
    training,
)
from tests.slurm.conftest import allocated_node, api_reader, slurm_job_state, wait_slurm_job

pytestmark = pytest.mark.slurm

ONE_NODE = ("--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")


def _placed(daemon) -> dict[int, dict]:
    return {r["run_id"]: json.loads(r["data"])
            for r in daemon.query("SELECT run_id, data FROM events WHERE kind = 'placed'")}


def _broker(daemon_factory, job_id: str, *args: str, state_dir: Path | None = None,
            time_scale: float = 0.01):
    return daemon_factory("--launcher", "slurm", *args, gpus=None, state_dir=state_dir,
                          time_scale=time_scale, env={"SLURM_JOB_ID": job_id})


def test_allocation_discovery_reads_nodes_gpus_cpus_and_end_time(allocate, slurm_api):
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--gres=gpu:6",
                   "--time=7")
    alloc = slurm_allocation(job, api_reader(slurm_api))
    assert alloc.job_id == job
    assert alloc.nodes == {"n1": tuple("012345"), "n2": tuple("012345")}
    assert alloc.cpus == {"n1": 4, "n2": 4}
    squeue = json.loads(subprocess.run(["squeue", "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    (mine,) = [j for j in squeue["jobs"] if str(j["job_id"]) == job]
    assert alloc.end_time == mine["end_time"]  # the same instant, from the other tool


def test_a_whole_node_allocation_has_every_gpu_of_its_nodes(allocate, slurm_api):
    """`--exclusive` with no GPU request (the batch scripts' way, for any GPU count): both
    readers see every GPU of each node, though pyslurm's TRES strings list none."""
    job = allocate("--nodes=2", "--exclusive", "--mem=0")
    alloc = slurm_allocation(job, api_reader(slurm_api))
    gpus = int(os.environ.get("MARBLE_SLURM_GPUS", "6"))
    assert alloc.nodes == {n: tuple(str(i) for i in range(gpus)) for n in ("n1", "n2")}
    assert alloc.cpus == {"n1": 16, "n2": 16}


def test_figure5_through_real_job_steps(daemon_factory, allocate):
    """Figure 5 with every run a job step: ResNet-50 primary on 3, Inception-v3 secondary
    on 3 then promoted to 4 (a new step), VGG-16 secondary on 2; GPU sets from the steps."""
    job = allocate(*ONE_NODE)
    node = allocated_node(job)
    d = _broker(daemon_factory, job)
    all_runs = run_figure5(d, node)
    placed = _placed(d)
    assert set(placed) == {r["id"] for r in all_runs}  # every run reported from its step
    assert len({p["step"] for p in placed.values()}) == len(all_runs)  # one step per run
    assert all(p["node"] == node for p in placed.values())
    acks = d.query("SELECT data FROM events WHERE kind = 'acknowledged'")
    # every suspension reached its job (scancel --signal=TSTP): Inception-v3's, and VGG-16's
    # where it did not end within the broker's wait for due runs (coalesce_max_s)
    suspended = [r for r in all_runs if r["end_reason"] == "suspended"]
    assert len(acks) == len(suspended) >= 1


def test_two_node_allocation_runs_jobs_on_both_nodes(daemon_factory, allocate):
    """Two nodes are two pools: MARBLE decides per node and every step runs where the broker
    put it. The broker is on neither node, so jobs acknowledge by marker file only."""
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")
    d = _broker(daemon_factory, job)
    assert sorted(d.client.get("/v1/status")["nodes"]) == ["n1", "n2"]
    d.submit(*jobset(4))
    jobs = d.wait_all(timeout=180)
    assert [j["state"] for j in jobs] == ["done"] * 5
    runs = d.runs()
    assert {r["node"] for r in runs} == {"n1", "n2"}
    placed = _placed(d)
    for run in runs:
        assert placed[run["id"]]["node"] == run["node"]  # SLURMD_NODENAME inside the step
    check_no_gpu_shared(runs)
    acks = [json.loads(r["data"]) for r in d.query(
        "SELECT data FROM events WHERE kind = 'acknowledged'")]
    assert acks and all(a["via"] == "marker" for a in acks)


def test_allocation_end_suspends_all_and_a_new_allocation_finishes(daemon_factory, allocate,
                                                                    tmp_path):
    """A 1-minute allocation: at its end time minus --drain-before the broker suspends every
    job and exits 75; a broker in a new allocation, on another node, finishes every job."""
    state = tmp_path / "state"
    first_job = allocate(*ONE_NODE, "--nodelist=n1", "--time=1")
    first = _broker(daemon_factory, first_job, "--drain-before", "50", state_dir=state,
                    time_scale=0.05)
    first.submit(*jobset(3))
    assert first.proc.wait(timeout=90) == 75, first.log()
    drain = first.query("SELECT data FROM events WHERE kind = 'drain'")
    assert "the allocation ends" in json.loads(drain[0]["data"])["reason"]
    rows = first.query("SELECT id, state, step FROM jobs ORDER BY id")
    suspended = [r for r in rows if r["state"] == "suspended"]
    # each suspended job's checkpoint is where its last run ended; some had trained (one
    # that started just before the drain may not have reached its first step: seen twice
    # under CI load, the drain 10 s after the allocation's start)
    assert suspended and any(r["step"] > 0 for r in suspended)
    for r in suspended:
        (last,) = first.query("SELECT end_step FROM runs WHERE job_id = ? ORDER BY id DESC "
                              "LIMIT 1", r["id"])
        # (None: stopped before any step it could report, so nothing to resume from)
        assert last["end_step"] == r["step"] or (last["end_step"], r["step"]) == (None, 0), (
            dict(r), dict(last))
    assert not first.query("SELECT id FROM runs WHERE ended_at IS NULL")
    last_first_run = max(r["id"] for r in first.runs())
    subprocess.run(["scancel", first_job], check=True)

    second_job = allocate(*ONE_NODE, "--nodelist=n2")
    second = _broker(daemon_factory, second_job, state_dir=state)
    jobs = second.wait_all(timeout=120)
    assert [j["state"] for j in jobs] == ["done"] * 3
    for job_id, steps in ((1, 900), (2, 2000), (3, 800)):
        chain = second.query("SELECT * FROM runs WHERE job_id = ? ORDER BY id", job_id)
        assert chain[0]["start_step"] == 0 and chain[-1]["end_step"] == steps
        for a, b in zip(chain, chain[1:], strict=False):
            assert a["end_step"] == b["start_step"]
    assert {r["node"] for r in second.runs() if r["id"] > last_first_run} == {"n2"}


def _sbatch(script: str, tmp_path: Path, *args: str, opts: str = "") -> str:
    env = {**os.environ, "MARBLE_STATE_DIR": str(tmp_path / "state"),
           "MARBLED_OPTS": f"--time-scale 0.01 --monitor-interval 0.1 {opts}",
           "MARBLE_WAIT_INTERVAL": "0.5",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out", *args,
         str(REPO / "jobscripts" / script),
         str(workload_path("paper-jobset3"))],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _db(tmp_path: Path, sql: str) -> list[tuple]:
    return db_rows(tmp_path / "state" / "marble.db", sql)

def test_marble_sbatch_runs_a_job_set_to_the_end(tmp_path, slurm_cluster):
    job = _sbatch("marble.sbatch", tmp_path)
    assert wait_slurm_job(job, timeout=120) == "COMPLETED", \
        (tmp_path / f"slurm-{job}.out").read_text()
    assert _db(tmp_path, JOBS) == JOBSET3_DONE


def test_chain_sbatch_survives_the_end_warning_and_resubmits_itself(tmp_path, slurm_cluster):
    """Slurm's warning signal (what --signal=B:USR2@T sends, here sent at once with scancel)
    reaches the broker through the batch shell: every job suspended, the script queues its
    successor on the same state directory, and the successor finishes every job."""
    first = _sbatch("marble-chain.sbatch", tmp_path, opts="--time-scale 0.05")
    out = tmp_path / f"slurm-{first}.out"
    broker = BrokerClient(socket_path(tmp_path / "state"), timeout=5)
    deadline = time.monotonic() + 60
    while not training(broker):
        assert slurm_job_state(first) in ("PENDING", "RUNNING", "CONFIGURING"), out.read_text()
        assert time.monotonic() < deadline, "no job trained in the first allocation"
        time.sleep(0.2)
    subprocess.run(["scancel", "--batch", f"--signal={signal.SIGUSR2.name[3:]}", first],
                   check=True)
    assert wait_slurm_job(first, timeout=120) == "COMPLETED", out.read_text()
    text = out.read_text()
    assert "carries on" in text, text
    second = text.split("allocation ")[-1].split()[0]
    assert wait_slurm_job(second, timeout=120) == "COMPLETED", \
        (tmp_path / f"slurm-{second}.out").read_text()
    first_drain = _db(tmp_path, "SELECT data FROM events WHERE kind = 'drain' ORDER BY id")[0]
    assert "SIGUSR2" in json.loads(first_drain[0])["reason"]
    suspended = _db(tmp_path, "SELECT job_id, end_step FROM runs WHERE end_reason = 'suspended'")
    assert len(suspended) >= 2 and all(step > 20 for _, step in suspended)
    assert _db(tmp_path, JOBS) == JOBSET3_DONE


def test_job_step_ignoring_sigtstp_is_stopped_through_scancel(daemon_factory, allocate,
                                                             tmp_path):
    """Escalation through Slurm: no acknowledgement -> scancel --signal=TERM to the step;
    the job resumes from its last periodic checkpoint and ends at exactly its steps."""
    job = allocate(*ONE_NODE)
    d = _broker(daemon_factory, job, "--suspend-timeout", "0.5", "--kill-timeout", "2")
    log = tmp_path / "steps.log"
    cmd = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01",
           "--ignore-suspend", "--checkpoint-every", "50", "--step-log", str(log)]
    d.submit({"model": "resnet-50", "steps": 600, "emulate": True},
             {"model": "inception-v3", "steps": 1500, "command": cmd})
    jobs = d.wait_all(timeout=120)
    assert [j["state"] for j in jobs] == ["done", "done"]
    first, resumed = d.query("SELECT * FROM runs WHERE job_id = 2 ORDER BY id")[:2]
    assert (first["end_reason"], first["exit_code"]) == ("suspended", -signal.SIGTERM)
    assert resumed["start_step"] % 50 == 0 and resumed["start_step"] > 0
    assert sorted(set(int(s) for s in log.read_text().split())) == list(range(1, 1501))
    kinds = [r["kind"] for r in d.query("SELECT kind FROM events WHERE job_id = 2")]
    assert "suspend-timeout" in kinds and "stop" in kinds


def test_broker_killed_hard_readopts_its_job_steps(daemon_factory, allocate, tmp_path):
    """kill -9 of the broker inside an allocation: the steps run on; the next broker adopts
    them (srun pid + start time), signals them through scancel, and starts nothing twice."""
    job = allocate(*ONE_NODE)
    state = tmp_path / "state"
    first = _broker(daemon_factory, job, state_dir=state, time_scale=0.02)
    first.submit({"model": "resnet-50", "steps": 900, "emulate": True},
                 {"model": "inception-v3", "steps": 2000, "emulate": True})
    first.wait_for(lambda: all(j["step"] > 20 for j in first.jobs()), what="progress")
    first.stop(signal.SIGKILL)
    second = _broker(daemon_factory, job, state_dir=state, time_scale=0.02)
    jobs = second.wait_all(timeout=120)
    assert [j["state"] for j in jobs] == ["done", "done"]
    adopted = second.query("SELECT job_id FROM events WHERE kind = 'adopted'")
    assert {r["job_id"] for r in adopted} == {1, 2}
    runs = second.runs()
    for a in runs:
        for b in runs:
            if a["id"] < b["id"] and a["job_id"] == b["job_id"]:
                assert b["started_at"] >= a["ended_at"]  # never two runs of one job at once
    inc = [r for r in runs if r["job_id"] == 2]
    # the adopted secondary was promoted: suspended through scancel, resumed on 4 GPUs
    assert [r["end_reason"] for r in inc] == ["suspended", "done"]
    assert inc[1]["gpu_count"] == 4 and inc[0]["end_step"] == inc[1]["start_step"] > 0


def test_two_node_job_runs_as_one_step_over_both_nodes_and_survives_a_suspension(
        daemon_factory, allocate, tmp_path):
    """--nodes 2: one step with a task and 3 GPUs on each node; a suspension reaches both
    tasks, rank 0 checkpoints, and the resumed step carries on at the checkpointed step."""
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")
    d = _broker(daemon_factory, job, time_scale=0.02)
    log = tmp_path / "steps.log"
    cmd = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.02",
           "--step-log", str(log)]
    (gang,) = d.submit({"model": "resnet-50", "steps": 1200, "nodes": 2, "command": cmd})
    assert (gang["nodes"], gang["demand"]) == (2, 3)
    d.wait_for(lambda: d.jobs()[0]["step"] > 100, what="progress")
    d.client.post(f"/v1/jobs/{gang['id']}/suspend")
    (done,) = d.wait_all(timeout=120)
    assert done["state"] == "done"
    first, resumed = d.query("SELECT * FROM runs WHERE job_id = 1 ORDER BY id")
    for run in (first, resumed):
        assert (run["node"], run["gpu_count"], run["role"]) == ("n1,n2", 6, "primary")
        per_node = run["devices"].split(";")  # what each task saw, in the run's node order
        assert [len(d.split(",")) for d in per_node] == [3, 3]
    assert first["end_reason"] == "suspended" and first["end_step"] > 100
    assert first["end_step"] == resumed["start_step"] and resumed["end_step"] == 1200
    # rank 0 alone logs steps: every step exactly once, none lost across the resume
    assert [int(s) for s in log.read_text().split()] == list(range(1, 1201))
    placed = _placed(d)
    assert {p["node"] for p in placed.values()} == {"n1,n2"}


@pytest.mark.parametrize(("next_node", "step_said"), [("n2", True), ("n1", True),
                                                      ("n1", False)])
def test_allocation_gone_while_the_broker_was_dead_loses_no_job(daemon_factory, allocate,
                                                                tmp_path, next_node, step_said):
    """The worst end: the broker is killed (-9), then the allocation ends with runs open.
    The next broker, in an allocation on another node or on the same one, closes those runs
    as suspended and runs every job to its end from its last checkpoint. On the same node
    its runs are adopted as the broker's own (their node is in the allocation); before, a
    run ended by its allocation's end (SIGTERM, Slurm's CANCELLED record) was judged the
    job's failure there, and the job failed (a hunt of overlapping allocations). Without
    the step's info file (`step_said` False: removed here, as when the allocation ends
    before a step just launched has started its shim, which writes it), the launch's record
    says which allocation it ran in; before, such a plain command failed (a hunt)."""
    state = tmp_path / "state"
    first_job = allocate(*ONE_NODE, "--nodelist=n1")
    first = _broker(daemon_factory, first_job, state_dir=state, time_scale=0.05)
    first.submit(*jobset(3))
    first.wait_for(lambda: all(j["step"] > 20 for j in first.jobs()[:2]), what="progress")
    first.stop(signal.SIGKILL)
    if not step_said:
        for info in state.glob(f"jobs/*/{STEP_INFO}"):
            info.unlink()
    subprocess.run(["scancel", first_job], check=True)  # its job steps end with it
    wait_slurm_job(first_job, timeout=60)
    assert len(first.query("SELECT id FROM runs WHERE ended_at IS NULL")) >= 2

    second = _broker(daemon_factory, allocate(*ONE_NODE, f"--nodelist={next_node}"),
                     state_dir=state)
    jobs = second.wait_all(timeout=120)
    assert [j["state"] for j in jobs] == ["done"] * 3, [j["reason"] for j in jobs]
    closed = [json.loads(r["data"])["detail"] for r in second.query(
        "SELECT data FROM events WHERE kind = 'suspended'")]
    said = "left with its allocation" if next_node == "n2" else \
        f"its allocation {first_job} ended, and the run with it"
    assert sum(said in d for d in closed) >= 2, closed
    assert db_rows(state / "marble.db", JOBS) == JOBSET3_DONE


def test_a_step_launched_into_an_ended_allocation_never_ran_and_is_no_failure(
        daemon_factory, allocate):
    """srun into an allocation that has ended says "Slurm job N has expired" and exits 1
    before any step: the command never ran, so the run is a refusal (run again later), not
    the job's failure. A hunt met it where a broker launched a step as it was killed and its
    allocation cancelled: the next broker, on the same node, failed that plain command."""
    job = allocate(*ONE_NODE, "--nodelist=n1")
    d = _broker(daemon_factory, job)
    subprocess.run(["scancel", job], check=True)
    wait_slurm_job(job, timeout=60)
    (sub,) = d.submit({"command": ["true"], "gpus": 1})
    ends = d.wait_for(lambda: d.query(
        "SELECT kind, data FROM events WHERE job_id = ? AND kind IN ('suspended', 'failed')",
        sub["id"]), timeout=30, what="the first run's end")
    assert ends[0]["kind"] == "suspended", dict(ends[0])
    detail = json.loads(ends[0]["data"])["detail"]
    assert f"srun could not use its allocation: Slurm job {job} has expired" in detail, detail
    assert "its command never ran: again in" in detail


def test_a_job_step_runs_where_its_job_was_submitted_from(daemon_factory, allocate, tmp_path):
    """`marble submit -- python train.py` from a project directory: the step (srun --chdir)
    finds the script and its data there, and keeps its checkpoint in the state directory."""
    job = allocate(*ONE_NODE)
    d = _broker(daemon_factory, job)
    home = project(tmp_path / "project", "cifar")
    out = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "submit", "--model",
                          "resnet-50", "--steps", "30", "--", sys.executable, "train.py"],
                         cwd=home, env={**os.environ, "MARBLE_STATE_DIR": str(d.state_dir)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (done,) = d.wait_all(timeout=120)
    assert done["state"] == "done", done["reason"]
    assert (home / "trained.txt").read_text() == f"cifar 30 {home}\n"
    assert (d.state_dir / "jobs" / "1" / "checkpoint" / "step.json").is_file()
    assert _placed(d)  # it ran as a job step


def test_marble_profile_runs_each_count_as_a_job_step(allocate, tmp_path):
    """`marble profile` in an allocation: every count (and the resume) is its own job step on
    the node, with the GPUs Slurm gave it, and the curve comes out of those steps. 300 steps
    a count: with 60 (0.2 s at time scale 0.01, four progress reports) a loaded machine once
    timed the 1-GPU count at the 2-GPU rate."""
    job = allocate(*ONE_NODE)
    node = allocated_node(job)
    work = tmp_path / "work"
    out = subprocess.run(
        [sys.executable, "-m", "marbled.cli.client_cmd", "profile", "--model", "resnet-50",
         "--launcher", "slurm", "--gpus", "1-3", "--steps", "300", "--time-scale", "0.01",
         "--workdir", str(work), "--output", str(tmp_path / "p.yaml"), "--json", "--",
         sys.executable, "-m", "marbled.worker.emulate", "--profile", "summit-v100",
         "--time-scale", "0.01"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "SLURM_JOB_ID": job})
    assert out.returncode == 0, out.stderr
    steps = {}
    for g in (1, 2, 3):
        info = json.loads((work / "resnet-50" / f"{g}-gpus" / "slurm-step.json").read_text())
        assert info["job_id"] == job and info["node"] == node
        assert len(info["gpus"].split(",")) == g  # SLURM_STEP_GPUS: Slurm's own choice
        steps[g] = info["step_id"]
    assert len(set(steps.values())) == 3
    result = json.loads(out.stdout)
    measured = {c["gpus"]: c["steps_per_second"] for c in result["counts"]}
    assert measured[2] > measured[1] * 1.5  # the curve of resnet-50 (3.35, 6.02, 6.53)


def test_a_per_gpu_job_is_a_step_with_a_task_per_gpu_that_meet(daemon_factory, allocate,
                                                                 tmp_path):
    """--per-gpu on 2 nodes x 2 GPUs: one step of 4 tasks, each seeing its node's 2 GPUs (as
    under torchrun: LOCAL_RANK picks one), whose SLURM_* numbers the step shim turns into
    RANK...; they meet at the first node's NodeAddr (a real gloo all-reduce: 1+2+3+4)."""
    pytest.importorskip("torch")
    from tests.integration.test_ranks import RANK

    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")
    d = _broker(daemon_factory, job)
    (tmp_path / "rank.py").write_text(RANK)
    (gang,) = d.submit({"command": [sys.executable, "rank.py", "gloo"], "gpus": 2, "nodes": 2,
                        "per_gpu": True, "chdir": str(tmp_path)})
    (done,) = d.wait_all(timeout=120)
    assert done["state"] == "done", done["reason"]
    (run,) = d.query("SELECT * FROM runs")
    assert (run["node"], run["gpu_count"]) == ("n1,n2", 4)
    assert [len(g.split(",")) for g in run["devices"].split(";")] == [2, 2]
    envs = [json.loads((tmp_path / f"rank-{run['id']}-{r}.json").read_text())["env"]
            for r in range(4)]
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"]) for e in envs] == \
        [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"]) for e in envs} == \
        {("4", "2", "127.0.0.1")}
    assert all(len(e["CUDA_VISIBLE_DEVICES"].split(",")) == 2 for e in envs)
    assert [(tmp_path / f"sum-{run['id']}-{r}").read_text() for r in range(4)] == ["10"] * 4
    # srun labels each task's lines (`1: `): `marble logs --rank 1` shows rank 1's alone
    log = f"/v1/jobs/{gang['id']}/log?rank=1"
    assert d.client.get(log)["text"] == "out of rank 1\n"
    assert d.client.get(log + "&stream=stderr")["text"] == "err of rank 1\n"


def test_a_rank_that_fails_ends_its_step_and_the_job_names_it(daemon_factory, allocate,
                                                                 tmp_path):
    """Rank 1 of a per-GPU step exits 3 while rank 0 sleeps 60 s, as a rank blocked at the
    rendezvous or in a collective whose peer died: the step ends at once
    (--kill-on-bad-exit), as a local per-GPU run does, and the failure names rank 1."""
    from tests.integration.test_ranks import RANK

    d = _broker(daemon_factory, allocate(*ONE_NODE))
    (tmp_path / "rank.py").write_text(RANK)
    d.submit({"command": [sys.executable, "rank.py", "fail"], "gpus": 2, "per_gpu": True,
              "chdir": str(tmp_path)})
    started = time.monotonic()
    (failed,) = d.wait_all(timeout=90)
    assert time.monotonic() - started < 40, "rank 0 was left to sleep its 60 s"
    assert failed["state"] == "failed", failed
    assert "rank 1" in failed["reason"], failed["reason"]
    (run,) = d.query("SELECT * FROM runs")
    assert run["exit_code"] != 0
