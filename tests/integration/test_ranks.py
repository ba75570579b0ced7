"""One process per GPU on a real broker (emulated GPUs, CPU, gloo): the ranks of a per-GPU
job and their rendezvous, a rank that fails, the ranks' logs, two emulated nodes, and
torchrun as a job's command, whose workers the broker's signals must reach."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.suspend_resume import gone as _gone
from marbled import examples
from marbled.batch.ranks import descendants
from marbled.worker.protocol import PROGRESS_FILE, read_json

pytestmark = pytest.mark.daemon

ENV = {"OMP_NUM_THREADS": "1"}
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
             "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "MARBLE_RUN_ID", "MARBLE_CHECKPOINT_DIR",
             "MARBLE_PER_GPU", "TF_CONFIG")

# A rank: says what it got and where it runs, then does what argv[1] says.
RANK = '''
import json, os, sys, time
rank = os.environ["RANK"]
tag = f"{os.environ['MARBLE_RUN_ID']}-{rank}"
with open(f"rank-{tag}.json", "w") as f:
    json.dump({"env": {k: os.environ.get(k) for k in VARS}, "pid": os.getpid(),
               "pgid": os.getpgid(0)}, f)
print(f"out of rank {rank}", flush=True)
print(f"err of rank {rank}", file=sys.stderr, flush=True)
if sys.argv[1] == "fail":
    if rank == "1":
        time.sleep(0.3)
        sys.exit(3)
    time.sleep(60)  # as a rank blocked in a collective whose peer died
elif sys.argv[1] == "gloo":
    import torch, torch.distributed as dist
    from datetime import timedelta
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    t = torch.tensor([int(rank) + 1])
    dist.all_reduce(t)
    with open(f"sum-{tag}", "w") as f:
        f.write(str(int(t.item())))
    os._exit(0)
'''.replace("VARS", repr(RANK_VARS))

# A torchrun worker: the stop agreed at each step (all_reduce MAX of the SIGTSTP flag), rank 0
# saves and acknowledges, every rank exits; "stubborn" ignores SIGTSTP and SIGTERM.
WORKER = '''
import json, os, signal, sys, time
from pathlib import Path
from marbled.worker.protocol import JobProtocol
proto = JobProtocol.from_env().install()
rank = int(os.environ["RANK"])
tag = f"{os.environ['MARBLE_RUN_ID']}-{rank}"
Path(f"worker-{tag}.pid").write_text(str(os.getpid()))


def on_tstp(signum, frame):  # the signal itself came (not only the broker's request file)
    Path(f"tstp-{tag}").touch()
    proto._on_tstp(signum, frame)


signal.signal(signal.SIGTSTP, on_tstp)
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)
import torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
ckpt = Path(os.environ["MARBLE_CHECKPOINT_DIR"]) / "step.json"
step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
proto.restored(step)
target = int(os.environ["MARBLE_TARGET_STEPS"])
while step < target:
    flag = torch.tensor([int(proto.suspend_requested)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        if rank == 0:
            ckpt.write_text(json.dumps({"step": step}))
            proto.acknowledge(step)
        # stopped by another rank's flag: wait a while for its own signal, which the broker
        # sends each worker's group in turn (a loaded machine took over a step between two)
        deadline = time.monotonic() + 5
        while not Path(f"tstp-{tag}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0)
    time.sleep(0.02)
    step += 1
    proto.report(step)
    if step == 5:
        Path(f"trained-{tag}").touch()
if rank == 0:
    ckpt.write_text(json.dumps({"step": step}))
    proto.report(step, force=True)
os._exit(0)
'''

PROFILE = """system: two-gpu
gpus_per_node: 2
models:
  two: {steps_per_second: [1.0, 1.8]}
"""


def _ranks(workdir: Path, run_id: int) -> list[dict]:
    found = sorted(workdir.glob(f"rank-{run_id}-*.json"))
    return [json.loads(p.read_text()) for p in found]


def _job(d, job_id: int) -> dict:
    return d.client.get(f"/v1/jobs/{job_id}")


def _log(d, job_id: int, run_id: int, stream: str) -> str:
    return (d.state_dir / "jobs" / str(job_id) / f"run-{run_id}.{stream}.log").read_text()


def test_a_per_gpu_job_runs_a_rank_on_each_gpu_with_the_rendezvous(daemon_factory, tmp_path):
    """Two ranks in the run's own process group, each on its own GPU, find each other through
    MASTER_ADDR/MASTER_PORT (a real gloo all-reduce); each line of their output is in the
    run's log behind its rank; the job shows per_gpu."""
    pytest.importorskip("torch")
    (tmp_path / "rank.py").write_text(RANK)
    d = daemon_factory(gpus=2, env=ENV)
    (job,) = d.submit({"command": [sys.executable, "rank.py", "gloo"], "gpus": 2,
                       "per_gpu": True, "chdir": str(tmp_path)})
    (done,) = d.wait_all(timeout=60)
    assert done["state"] == "done", done
    assert done["per_gpu"] is True
    (run,) = d.runs()
    ranks = _ranks(tmp_path, run["id"])
    envs = [r["env"] for r in ranks]
    # as under torchrun: each sees the run's GPUs, LOCAL_RANK says which is its own
    assert [(e["RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == \
        [("0", "0", "0,1"), ("1", "1", "0,1")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["NODE_RANK"], e["MASTER_ADDR"],
             e["MASTER_PORT"], e["MARBLE_CHECKPOINT_DIR"], e["MARBLE_PER_GPU"])
            for e in envs} == {("2", "2", "0", "127.0.0.1", envs[0]["MASTER_PORT"],
                                envs[0]["MARBLE_CHECKPOINT_DIR"], "1")}
    assert [r["pgid"] for r in ranks] == [run["pid"], run["pid"]]  # killpg reaches both
    assert [(tmp_path / f"sum-{run['id']}-{r}").read_text() for r in (0, 1)] == ["3", "3"]
    out, err = (_log(d, job["id"], run["id"], s) for s in ("stdout", "stderr"))
    assert sorted(out.splitlines()) == ["[rank 0] out of rank 0", "[rank 1] out of rank 1"]
    assert "[rank 0] err of rank 0" in err.splitlines()
    assert "[rank 1] err of rank 1" in err.splitlines()


def test_a_rank_that_fails_ends_the_run_and_stops_the_others(daemon_factory, tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    d = daemon_factory(gpus=2, env=ENV)
    (job,) = d.submit({"command": [sys.executable, "rank.py", "fail"], "gpus": 2,
                       "per_gpu": True, "chdir": str(tmp_path)})
    started = time.monotonic()
    (failed,) = d.wait_all(timeout=30)
    assert time.monotonic() - started < 20  # not rank 0's 60 s
    assert failed["state"] == "failed"
    assert "rank 1 of 2 exited with code 3" in failed["reason"], failed["reason"]
    (run,) = d.runs()
    assert run["exit_code"] == 3
    rank0 = _ranks(tmp_path, run["id"])[0]
    assert _gone(rank0["pid"])
    assert "marbled: rank 1 exited with 3; stopping the other 1 rank(s)" in \
        _log(d, job["id"], run["id"], "stderr")
    (event,) = [json.loads(e["data"]) for e in d.query(
        "SELECT data FROM events WHERE kind = 'failed' OR (kind LIKE '%end%' AND run_id = ?)",
        run["id"]) if e["data"] and "rank" in json.loads(e["data"])]
    assert event["rank"] == 1


def test_two_emulated_nodes_run_a_rank_on_every_gpu_of_both(daemon_factory, tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    d = daemon_factory("--nodes", "2", gpus=2, env=ENV)
    d.submit({"command": [sys.executable, "rank.py", "env"], "gpus": 2, "nodes": 2,
              "per_gpu": True, "chdir": str(tmp_path)})
    (done,) = d.wait_all(timeout=30)
    assert done["state"] == "done", done
    (run,) = d.runs()
    assert run["node"] == "node0,node1"
    envs = [r["env"] for r in _ranks(tmp_path, run["id"])]
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"])
            for e in envs] == [("0", "0", "0", "0,1"), ("1", "0", "1", "0,1"),
                               ("2", "1", "0", "0,1"), ("3", "1", "1", "0,1")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs} == {("4", "2")}
    # MultiWorkerMirroredStrategy's cluster: the four ranks, each its own index
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(4)]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 4 and all(c["cluster"]["worker"] == workers for c in configs)


def _torchrun(tmp_path: Path) -> list[str]:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not Path(torchrun).exists():
        pytest.skip("no torchrun")
    (tmp_path / "worker.py").write_text(WORKER)
    # as a user types it: the broker, not a shell, puts the run's GPU count in
    return [torchrun, "--standalone", "--nproc-per-node=$MARBLE_GPUS", "worker.py", "train"]


def _worker_pids(tmp_path: Path, run_id: int, count: int = 2) -> list[int] | None:
    """The pids the run's workers wrote; None until each has written its own."""
    texts = [p.read_text() if p.exists() else "" for p in
             (tmp_path / f"worker-{run_id}-{r}.pid" for r in range(count))]
    return [int(t) for t in texts] if all(texts) else None


def ranks_job(tmp_path: Path, launch: str) -> dict:
    """A job of the WORKER's ranks: under torchrun, or one process per GPU (`launch`)."""
    if launch == "torchrun":
        return {"command": _torchrun(tmp_path)}
    (tmp_path / "worker.py").write_text(WORKER)
    return {"command": [sys.executable, "worker.py", "train"], "per_gpu": True}


@pytest.mark.parametrize("launch", ["torchrun", "per_gpu"])
def test_ranks_are_suspended_and_resumed(daemon_factory, tmp_path, launch):
    """torchrun: SIGTSTP to its group alone reaches no worker (each is in its own session),
    so the broker signals the workers' groups too. per_gpu: one killpg reaches every rank.
    Either way the ranks agree, rank 0 acknowledges, all exit, and the job resumes from that
    step and finishes."""
    pytest.importorskip("torch")
    job = ranks_job(tmp_path, launch)
    profile = tmp_path / "two-gpu.yaml"
    profile.write_text(PROFILE)
    # no report before the suspension: the broker's request file, read with each report,
    # would stop the ranks without the signal (the signal is what is tested here)
    d = daemon_factory("--profile", str(profile), gpus=2,
                       env={**ENV, "MARBLE_REPORT_INTERVAL": "600"})
    (job,) = d.submit({**job, "model": "two", "steps": 150, "chdir": str(tmp_path)})
    d.wait_for(lambda: all((tmp_path / f"trained-1-{r}").exists() for r in (0, 1)),
               timeout=60, what="training")
    d.client.post(f"/v1/jobs/{job['id']}/suspend", {})
    first = d.wait_for(lambda: [r for r in d.runs() if r["ended_at"]], timeout=30,
                       what="the suspension")[0]
    assert first["end_reason"] == "suspended" and first["end_step"] > 0, dict(first)
    assert all((tmp_path / f"tstp-{first['id']}-{r}").exists() for r in (0, 1))
    pids = _worker_pids(tmp_path, first["id"])
    assert pids and all(_gone(pid) for pid in pids)
    (done,) = d.wait_all(timeout=60)
    assert done["state"] == "done", done
    second = d.runs()[1]
    assert second["start_step"] == first["end_step"] and second["end_step"] == 150


def test_no_torchrun_worker_outlives_its_run(daemon_factory, tmp_path):
    """Workers that ignore SIGTSTP and SIGTERM: the escalation's SIGKILL reaches them, not
    only the agent (whose death would leave them training)."""
    pytest.importorskip("torch")
    command = [*_torchrun(tmp_path)[:-1], "stubborn"]
    d = daemon_factory("--kill-timeout", "0.5", gpus=2, env=ENV)
    (job,) = d.submit({"command": command, "gpus": 2, "chdir": str(tmp_path)})
    (run,) = d.wait_for(lambda: [r for r in d.runs() if r["pid"]], what="the run")
    pids = d.wait_for(lambda: _worker_pids(tmp_path, run["id"]), timeout=60, what="workers")
    d.client.post(f"/v1/jobs/{job['id']}/cancel", {})
    (ended,) = d.wait_all(timeout=30)
    assert ended["state"] == "cancelled"
    d.wait_for(lambda: all(_gone(pid) for pid in pids), timeout=5, what="the workers' end")
    kinds = [(e["kind"], json.loads(e["data"] or "{}").get("signal"))
             for e in d.query("SELECT kind, data FROM events WHERE run_id = ?", run["id"])]
    assert ("stop", "SIGKILL") in kinds


def _ranks_process(tmp_path: Path, count: int, *command: str):
    """marbled.batch.ranks run as the local launcher runs it (its own session), on `count`
    ranks."""
    envs = json.dumps([{"RANK": str(r)} for r in range(count)])
    return subprocess.run([sys.executable, "-m", "marbled.batch.ranks", envs, *command],
                          cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          start_new_session=True)


def test_ranks_that_end_at_once_are_all_seen_to_end(tmp_path):
    """Ranks that exit before the next one starts (a dropped Popen would be reaped by the
    next Popen, and never seen to end)."""
    done = _ranks_process(tmp_path, 4, "true")
    assert (done.returncode, done.stderr) == (0, "")


def test_a_run_whose_ranks_completed_ends_0_through_the_sigterm_of_a_stop(tmp_path):
    """The broker's stop (SIGTERM to the run's group) can come just as the ranks end. The
    run's process outlives SIGTERM to collect their exits; it must still, having recorded
    exit 0, end with 0: the interpreter's finalization restores the default actions first,
    and a SIGTERM then killed it (-15), so a per-GPU plain command that had completed was
    taken for one stopped and ran again (a hunt of kills and shutdowns under malleable on
    two nodes found it). Here SIGTERMs come every 0.2 ms from the ranks' end to the run's."""
    out = tmp_path / "ranks.txt"
    envs = json.dumps([{"RANK": str(r)} for r in range(2)])
    proc = subprocess.Popen([sys.executable, "-m", "marbled.batch.ranks", envs, "sh", "-c",
                             f"echo $RANK >> {out}"], cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 30
    # (a run that ended between two looks is checked as it ended, with no SIGTERM to outlive)
    while len(out.read_text().split() if out.exists() else ()) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "the ranks never ran"
        time.sleep(0.001)
    storms = 0
    while proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
            storms += 1
        time.sleep(0.0002)
    assert proc.wait() == 0, f"killed after its ranks completed ({storms} SIGTERMs sent)"
    assert sorted(out.read_text().split()) == ["0", "1"]


def test_the_run_ends_as_its_failed_rank_did(tmp_path):
    """Rank 1 killed: the run ends killed by the same signal; rank 0 and what either rank
    started (a `sleep` each, which holds its output open) are killed; every line is kept."""
    done = _ranks_process(tmp_path, 2, "sh", "-c",
                          'sleep 30 & echo $! > sleep-$RANK.pid; '
                          'echo "half a line" | tr -d "\\n"; sleep 0.5; '
                          '[ "$RANK" = 1 ] && kill -9 $$; wait')
    assert done.returncode == -signal.SIGKILL
    pids = [int((tmp_path / f"sleep-{r}.pid").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 5  # SIGKILLed (not our children: not waited for)
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, "a rank's process outlived the run"
        time.sleep(0.02)
    assert sorted(done.stdout.splitlines()) == ["[rank 0] half a line", "[rank 1] half a line"]
    assert "marbled: rank 1 was killed by signal 9; stopping the other 1 rank(s)" in done.stderr


# Two emulated nodes of 2 GPUs; its best count is 1, so a job with --nodes 2 runs one rank on
# each node: the smallest run whose ranks span nodes.
PROFILE_ONE_PER_NODE = """system: two-nodes
gpus_per_node: 2
models:
  one: {steps_per_second: [1.0, 0.9]}
"""


@pytest.mark.timeout(150)  # a rank left waiting in a collective would hang here: fail instead
def test_a_two_node_ddp_job_suspends_resumes_and_retries_a_killed_rank(daemon_factory, tmp_path):
    """train_ddp.py with --per-gpu on 2 emulated nodes (a rank on each): suspended by the
    broker, resumed from the acknowledged step; then one rank SIGKILLed mid-step: the run
    fails, the other rank is stopped (not left in its all-reduce for --timeout), and the
    retry resumes from the checkpoint and retraces the lost steps bit-equal."""
    pytest.importorskip("torch")
    from tests.frameworks.test_torch_worker import _losses

    profile = tmp_path / "two-nodes.yaml"
    profile.write_text(PROFILE_ONE_PER_NODE)
    d = daemon_factory("--nodes", "2", "--profile", str(profile), "--retry-delay", "0",
                       gpus=2, env=ENV)
    loss_log = tmp_path / "loss.log"
    script = examples.SCRIPTS / examples.EXAMPLES["ddp"].file
    steps = 1500
    (job,) = d.submit({
        "command": [sys.executable, str(script), "--batch", "16", "--timeout", "60",
                    "--report-interval", "0.05", "--loss-log", str(loss_log)],
        "model": "one", "steps": steps, "nodes": 2, "per_gpu": True, "retries": 1,
        "chdir": str(tmp_path)})
    progress = d.state_dir / "jobs" / str(job["id"]) / PROGRESS_FILE

    def trained(run_id: int, beyond: int) -> bool:
        p = read_json(progress) or {}
        return p.get("run_id") == run_id and p.get("step", 0) > beyond

    d.wait_for(lambda: trained(1, 20), timeout=60, what="the first run's training")
    d.client.post(f"/v1/jobs/{job['id']}/suspend", {})
    first = d.wait_for(lambda: [r for r in d.runs() if r["ended_at"]], timeout=30,
                       what="the suspension")[0]
    assert first["end_reason"] == "suspended", dict(first)
    at = first["end_step"]

    d.wait_for(lambda: trained(2, at + 10), timeout=60, what="the resumed run's training")
    second = d.runs()[1]
    ranks = descendants(second["pid"])[:2]  # its children first: the ranks, rank 0 first
    os.kill(ranks[1], signal.SIGKILL)
    # well before the 60 s after which rank 0's all-reduce would give up on its own
    d.wait_for(lambda: d.runs()[1]["ended_at"], timeout=20, what="the failed run's end")
    (done,) = d.wait_all(timeout=90)
    assert done["state"] == "done", done

    runs = d.runs()
    assert [r["node"] for r in runs] == ["node0,node1"] * 3
    assert [(r["start_step"], r["end_reason"]) for r in runs] == \
        [(0, "suspended"), (at, "failed"), (at, "done")], [dict(r) for r in runs]
    assert runs[2]["end_step"] == steps
    assert "marbled: rank 1 was killed by signal 9; stopping the other 1 rank(s)" in \
        _log(d, job["id"], runs[1]["id"], "stderr")
    assert any(json.loads(e["data"] or "{}").get("rank") == 1 for e in d.query(
        "SELECT data FROM events WHERE run_id = ?", runs[1]["id"]))
    # rank 0's log: steps 1..lost (the suspended run's, then the failed run's), then the
    # retry's from `at` on; the steps it retraced have the failed run's losses, bit for bit
    logged = _losses(loss_log)
    lost = next(i for i in range(1, len(logged)) if logged[i][0] <= logged[i - 1][0])
    # it acknowledged nothing: it ends where its retry resumed (its last report is in its event)
    assert runs[1]["end_step"] == at < lost < steps
    (failed,) = [json.loads(e["data"]) for e in d.query(
        "SELECT data FROM events WHERE kind = 'failed' AND run_id = ?", runs[1]["id"])]
    assert at < failed["last_reported_step"] <= lost
    assert [s for s, _ in logged] == [*range(1, lost + 1), *range(at + 1, steps + 1)]
    assert logged[lost:2 * lost - at] == logged[at:lost]


# A non-DDP script on 4 GPUs: rank 1 raises, rank 0 waits (as in a collective whose peer died).
RAISES = '''
import os, sys, time
rank = os.environ["RANK"]
print(f"rank {rank} loading", file=sys.stderr, flush=True)
if rank == "1":
    time.sleep(0.3)
    raise RuntimeError("boom on rank 1")
time.sleep(60)
'''


def test_a_failed_rank_s_own_error_is_the_reason_not_the_launchers_summary(daemon_factory,
                                                                           tmp_path):
    """The job's reason, the `failed` event and `marble explain` quote the failing rank's
    exception (its traceback's last line), not "marbled: rank 1 exited with 1; stopping the
    other 3 rank(s)", which ends the run's stderr."""
    (tmp_path / "raises.py").write_text(RAISES)
    d = daemon_factory(gpus=4, env=ENV)
    (job,) = d.submit({"command": [sys.executable, "raises.py"], "gpus": 4,
                       "per_gpu": True, "chdir": str(tmp_path)})
    (failed,) = d.wait_all(timeout=30)
    assert failed["state"] == "failed"
    assert failed["reason"] == "rank 1 of 4 exited with code 1: RuntimeError: boom on rank 1", \
        failed["reason"]
    (run,) = d.runs()
    assert _log(d, job["id"], run["id"], "stderr").rstrip().endswith(
        "marbled: rank 1 exited with 1; stopping the other 3 rank(s)")
    (event,) = [json.loads(e["data"]) for e in d.query(
        "SELECT data FROM events WHERE kind = 'failed' AND run_id = ?", run["id"])]
    assert event["rank"] == 1 and event["error"] == "RuntimeError: boom on rank 1"
    tail = event["stderr_tail"].splitlines()
    assert tail[0] == "rank 1 loading" and tail[1] == "Traceback (most recent call last):"
    assert tail[-1] == "RuntimeError: boom on rank 1"  # rank 1's lines only, unlabelled
    done = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "explain",
                           str(job["id"])], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "MARBLE_STATE_DIR": str(d.state_dir)})
    assert done.returncode == 0, done.stderr
    assert "a run failed: rank 1 of 4 exited with code 1: RuntimeError: boom on rank 1" \
        in done.stdout, done.stdout
    assert "stopping the other" not in done.stdout


def test_a_two_node_per_gpu_job_is_shown_with_its_nodes_and_ranks(daemon_factory, tmp_path):
    """`marble submit` acknowledges the ranks of a job on 2 nodes of 2 GPUs (4, not "2
    GPUs"), `marble status` names each node's GPUs of its run, `marble show` its ranks."""
    (tmp_path / "waits.py").write_text("import time\ntime.sleep(60)\n")
    d = daemon_factory("--nodes", "2", gpus=2, env=ENV)

    def marble(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args],
                              capture_output=True, text=True, timeout=30, cwd=tmp_path,
                              env={**os.environ, "MARBLE_STATE_DIR": str(d.state_dir)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    said = marble("submit", "--gpus", "2", "--nodes", "2", "--per-gpu", "--", sys.executable,
                  "waits.py")
    assert said.strip() == \
        "submitted job 1: 2 GPUs on each of 2 nodes, 4 ranks (fixed, one process per GPU)", said
    d.wait_for(lambda: d.runs() and d.runs()[0]["pid"], timeout=20, what="its run")
    table = marble("status").splitlines()
    header = next(line for line in table if line.lstrip().startswith("ID"))
    (row,) = [line for line in table if line.lstrip().startswith("1 ")]
    assert "node0:0,1 node1:0,1" in row, table
    assert row.index("node0") == header.index("GPUS")
    shown = marble("show", "1")
    assert "True: 4 ranks, one process per GPU (2 GPUs on each of 2 nodes)" in shown, shown


CHATTY = '''
import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    sys.exit(3)
n = 0
while True:
    n += 1
    print(f"rank 0 line {n}", file=sys.stderr, flush=True)
'''


def test_the_stop_of_the_other_ranks_is_the_last_line_of_the_run_s_stderr(daemon_factory,
                                                                          tmp_path):
    """A rank that prints without a pause when another fails: its lines still in the pipe as
    it is killed are relayed before the supervisor's "stopping the other rank(s)" line, not
    after it (before, that line came in the middle of rank 0's last lines in 3 of 3 runs;
    the failure's reason is read from the end of the log)."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    d = daemon_factory(gpus=2, env=ENV)
    (job,) = d.submit({"command": [sys.executable, "chatty.py"], "gpus": 2, "per_gpu": True,
                       "chdir": str(tmp_path)})
    (failed,) = d.wait_all(timeout=30)
    assert failed["state"] == "failed"
    (run,) = d.runs()
    lines = _log(d, job["id"], run["id"], "stderr").splitlines()
    assert lines[-1] == "marbled: rank 1 exited with 3; stopping the other 1 rank(s)", \
        lines[-3:]
    assert sum("stopping the other" in line for line in lines) == 1
