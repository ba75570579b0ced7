"""PyTorch suspend/resume (marbled.worker.torch, jobscripts/train_torch.py), torch on the CPU.

There are no GPUs here: the GPU ids that the broker hands out are EMULATED, and torch
trains on the CPU (with one thread, so that runs compare bit for bit). What is real:
the processes, signals, checkpoint files, and the optimizer and RNG state they carry.
"""

import pytest

torch = pytest.importorskip("torch")

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from marbled.worker.protocol import ACK_FILE, PROGRESS_FILE, JobProtocol, read_json  # noqa: E402
from marbled.worker.torch import CheckpointError, TorchCheckpoint  # noqa: E402
from tests import REPO  # noqa: E402

TRAIN = str(REPO / "jobscripts" / "train_torch.py")
# One thread: float sums depend on how the work is split, and two jobs share 2 cores.
LENET = [sys.executable, TRAIN, "--arch", "lenet", "--threads", "1"]


def _env(run_dir: Path | None, ckpt_dir: Path, run_id: int | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MARBLE_") and k != "CUDA_VISIBLE_DEVICES"}
    env["MARBLE_CHECKPOINT_DIR"] = str(ckpt_dir)
    env["MARBLE_LAUNCH_TIME"] = repr(time.time())
    if run_dir is not None:
        env["MARBLE_RUN_DIR"] = str(run_dir)
        env["MARBLE_RUN_ID"] = str(run_id)
    return env


def _launch(where: Path, args: list[str], run_id: int | None = None,
            managed: bool = True) -> subprocess.Popen:
    """Start train_torch.py as the broker would (own session); output in where/*.log."""
    where.mkdir(parents=True, exist_ok=True)
    tag = f"run{run_id}" if run_id else "run"
    with open(where / f"{tag}.out", "ab") as out, open(where / f"{tag}.err", "ab") as err:
        return subprocess.Popen([*LENET, *args], cwd=where, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True,
                                env=_env(where if managed else None, where / "checkpoint",
                                         run_id))


def _output(where: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(where.glob("run*.*")))


def _finish(proc: subprocess.Popen, where: Path, timeout: float = 90) -> None:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, f"exit code {code}\n{_output(where)}"


def _losses(path: Path) -> list[tuple[int, str]]:
    """(step, repr of the loss): equal strings are equal floats, bit for bit."""
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(int(step), loss) for step, loss in rows]


def _check_resumed_losses(log: Path, ref_log: Path, steps: int, resumed_at: int) -> None:
    got, ref = _losses(log), _losses(ref_log)
    assert [s for s, _ in got] == list(range(1, steps + 1))  # each step exactly once
    assert [s for s, _ in ref] == list(range(1, steps + 1))
    diff = [(s, a, b) for (s, a), (_, b) in zip(got, ref, strict=True) if a != b]
    assert not diff, f"losses differ from the uninterrupted run at {diff[:5]}"
    first, resumed = float(got[0][1]), float(got[resumed_at][1])
    assert resumed < 0.5 * first, (first, resumed)  # trained state, not a fresh model


def test_lenet_on_cpu_suspended_by_sigtstp_resumes_bit_identical(tmp_path):
    """LeNet on the CPU, no daemon (no GPU, emulated or real): SIGTSTP at step >= 30 ->
    checkpoint + ack + exit 0; the relaunch finishes; the loss of every step 1..120 is
    bit-identical to an uninterrupted run, so optimizer and RNG state were restored."""
    steps = 120
    ref_dir, job = tmp_path / "reference", tmp_path / "job"
    ref = _launch(ref_dir, ["--steps", str(steps), "--loss-log", str(tmp_path / "ref.log")],
                  managed=False)
    log = tmp_path / "job.log"
    args = ["--steps", str(steps), "--loss-log", str(log), "--report-interval", "0.02"]
    first = _launch(job, args, run_id=1)
    deadline = time.monotonic() + 90
    while (read_json(job / PROGRESS_FILE) or {}).get("step", 0) < 30:
        assert first.poll() is None, f"ended before the suspension\n{_output(job)}"
        assert time.monotonic() < deadline, "no progress to step 30"
        time.sleep(0.01)
    first.send_signal(signal.SIGTSTP)
    _finish(first, job)
    ack = read_json(job / ACK_FILE)
    assert ack["run_id"] == 1 and 30 <= ack["step"] < steps
    at = ack["step"]
    assert (job / "checkpoint" / f"ckpt-{at:09d}.pt").is_file()
    assert [s for s, _ in _losses(log)] == list(range(1, at + 1))  # stopped right there

    second = _launch(job, args, run_id=2)
    _finish(second, job)
    progress = read_json(job / PROGRESS_FILE)
    assert (progress["run_id"], progress["start_step"], progress["step"]) == (2, at, steps)
    assert f"steps={steps} (this run {at}->{steps})" in (job / "run2.out").read_text()
    _finish(ref, ref_dir)
    _check_resumed_losses(log, tmp_path / "ref.log", steps, at)


# -- in-process: TorchCheckpoint with a JobProtocol of the test's own


@pytest.fixture
def protocol(tmp_path):
    """A JobProtocol with its SIGTSTP handler installed in the test process, for one test."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proto = JobProtocol(run_id=1, run_dir=run_dir, checkpoint_dir=tmp_path / "checkpoint")
    try:
        yield proto.install()
    finally:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)


class _Big(torch.nn.Module):
    def __init__(self, numel: int):
        super().__init__()
        self.head = torch.nn.Linear(4, 2)
        self.big = torch.nn.Parameter(torch.zeros(numel))


def test_sigtstp_during_checkpoint_save_on_cpu_completes_save_and_suspends_once(protocol):
    """CPU only (no GPU): SIGTSTP lands a few ms into the save of a 160 MB checkpoint.
    The save completes and loads; the next step boundary suspends without saving the
    same step again, and the acknowledgement names that step."""
    model = _Big(40_000_000)  # 160 MB of float32
    with torch.no_grad():
        model.big[::1000] = 1.5
    ckpt = TorchCheckpoint(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           protocol=protocol, fast_exit=False)
    sent = []

    def suspend() -> None:
        sent.append(time.time())
        os.kill(os.getpid(), signal.SIGTSTP)

    timer = threading.Timer(0.005, suspend)
    t0 = time.time()
    timer.start()
    path = ckpt.save(7)
    t1 = time.time()
    timer.join()
    assert sent and t0 < sent[0] < t1, "the signal did not arrive during the save"
    assert protocol.suspend_requested and sent[0] <= protocol.signalled_at <= t1
    assert ckpt.saved_step == 7 and path.name == "ckpt-000000007.pt"
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["big"], model.big.detach())
    assert not list(path.parent.glob(".*tmp"))

    saves = []
    ckpt.save = lambda step: saves.append(step)  # any second save would show here
    inode = path.stat().st_ino
    with pytest.raises(SystemExit) as exited:
        ckpt.step_finished(7)
    assert exited.value.code == 0
    assert saves == [] and path.stat().st_ino == inode
    ack = read_json(protocol.run_dir / ACK_FILE)
    assert ack["step"] == 7 and ack["run_id"] == 1 and ack["save_seconds"] < 0.1


def _small(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train_step(model, optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()


def test_truncated_newest_checkpoint_falls_back_to_previous_on_cpu(tmp_path, capsys):
    """CPU only: the newest checkpoint is truncated -> restore() warns on stderr naming
    it, moves it aside, and restores the previous one (weights, Adam state, RNG)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proto = JobProtocol(run_id=3, run_dir=run_dir, checkpoint_dir=tmp_path / "checkpoint")
    model, opt = _small(0)
    ckpt = TorchCheckpoint(model, opt, protocol=proto)
    _train_step(model, opt)
    ckpt.save(10)
    at10 = {k: v.clone() for k, v in model.state_dict().items()}
    draw_after_10 = torch.rand(3)
    _train_step(model, opt)
    ckpt.save(20)
    newest = ckpt.path(20)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    model2, opt2 = _small(1)
    restored = TorchCheckpoint(model2, opt2, protocol=proto)
    assert restored.restore() == 10
    err = capsys.readouterr().err
    assert "ckpt-000000020.pt cannot be loaded" in err and "restored step 10" in err
    assert all(torch.equal(v, at10[k]) for k, v in model2.state_dict().items())
    assert opt2.state_dict()["state"][0]["step"] == 1  # Adam's state came back too
    assert torch.equal(torch.rand(3), draw_after_10)  # and the RNG
    assert [s for s, _ in restored.checkpoints()] == [10]
    assert (tmp_path / "checkpoint" / "ckpt-000000020.pt.corrupt").exists()
    assert restored.saved_step == 10
    assert read_json(run_dir / PROGRESS_FILE)["start_step"] == 10


def test_checkpoint_keep_and_unreadable_only_checkpoints_on_cpu(tmp_path):
    """CPU only: saves keep the newest `keep` files; if every checkpoint is unreadable,
    restore() refuses instead of silently starting again at step 0."""
    proto = JobProtocol(checkpoint_dir=tmp_path / "checkpoint")
    model, opt = _small(0)
    ckpt = TorchCheckpoint(model, opt, protocol=proto, keep=2)
    assert ckpt.restore() == 0 and ckpt.saved_step is None
    for step in (1, 2, 3):
        ckpt.save(step)
    assert [s for s, _ in ckpt.checkpoints()] == [3, 2]
    for _, path in ckpt.checkpoints():
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="none of the 2 checkpoints"):
        TorchCheckpoint(*_small(1), protocol=proto).restore()


# -- through the real daemon


@pytest.mark.daemon
def test_lenet_promoted_by_daemon_on_emulated_gpus_resumes_bit_identical(daemon_factory,
                                                                       tmp_path):
    """Real marbled, EMULATED GPUs (torch trains on the CPU): LeNet starts as a secondary
    on the 1 GPU a rigid filler leaves; cancelling the filler makes the broker suspend
    it (checkpoint) and resume it, in the process it prestarted, as primary on its optimal
    2 GPUs; the losses of all 400 steps equal an uninterrupted run's, bit for bit."""
    steps = 400
    ref_dir = tmp_path / "reference"
    ref = _launch(ref_dir, ["--steps", str(steps), "--loss-log", str(tmp_path / "ref.log")],
                  managed=False)
    # --no-learn: its moves are the subject; with learning, speeds that a loaded CPU makes
    # contradict the profile moved the job a third time to explore (a CI rehearsal, 5 workers)
    daemon = daemon_factory("--suspend-timeout", "30", "--no-learn", gpus=4)
    log = tmp_path / "job.log"
    daemon.submit({"gpus": 3, "command": ["sleep", "600"]},
                  {"model": "lenet", "steps": steps,
                   "command": [*LENET, "--loss-log", str(log), "--report-interval", "0.1"]})

    def job2_at_100() -> bool:
        job = daemon.jobs()[1]
        assert job["state"] in ("queued", "running"), job
        return job["step"] >= 100

    daemon.wait_for(job2_at_100, timeout=90, what="job 2 at step 100")
    daemon.client.post("/v1/jobs/1/cancel")
    jobs = daemon.wait_all(timeout=90)
    assert [j["state"] for j in jobs] == ["cancelled", "done"], daemon.log()

    first, second = daemon.query("SELECT * FROM runs WHERE job_id = 2 ORDER BY id")
    assert (first["role"], first["gpu_count"], first["end_reason"]) == ("secondary", 1,
                                                                        "suspended")
    assert (second["role"], second["gpu_count"], second["end_reason"]) == ("primary", 2, "done")
    at = first["end_step"]
    assert 0 < at == second["start_step"] < steps and second["end_step"] == steps
    (ack,) = daemon.query("SELECT data FROM events WHERE kind = 'acknowledged' AND job_id = 2")
    assert '"via": "marker"' in ack["data"]
    # train_torch.py calls JobProtocol.ready(): the resumed run was the process the broker
    # prestarted (torch imported, model built) and then handed its GPUs.
    (go,) = daemon.query("SELECT run_id, data FROM events WHERE kind = 'go' AND job_id = 2")
    assert go["run_id"] == second["id"] and f'"pid": {second["pid"]}' in go["data"]
    _finish(ref, ref_dir)
    _check_resumed_losses(log, tmp_path / "ref.log", steps, at)


@pytest.mark.daemon
def test_lenet_per_gpu_resumed_on_two_ranks_stays_on_the_one_process_trajectory(
        daemon_factory, tmp_path):
    """train_torch.py is a DDP script: with --per-gpu it starts as one rank, a secondary on
    the 1 GPU a rigid filler leaves; cancelling the filler makes the broker suspend it and
    resume it on 2 ranks (gloo on the CPU) with the same global batch. Every step runs once,
    and each loss stays within 1e-5 of an uninterrupted one-process run's: on 2 ranks the
    float sums run in another order (tests/frameworks/test_torch_ddp.py's TOLERANCE), while
    a wrong shard, data order or optimizer state would be off by far more."""
    steps = 200
    ref_dir = tmp_path / "reference"
    ref = _launch(ref_dir, ["--steps", str(steps), "--loss-log", str(tmp_path / "ref.log")],
                  managed=False)
    # --no-learn: its moves are the subject; with learning, speeds that a loaded CPU makes
    # contradict the profile moved the job a third time to explore (a CI rehearsal, 5 workers)
    daemon = daemon_factory("--suspend-timeout", "30", "--no-learn", gpus=4,
                            env={"OMP_NUM_THREADS": "1"})
    log = tmp_path / "job.log"
    daemon.submit({"gpus": 3, "command": ["sleep", "600"]},
                  {"model": "lenet", "steps": steps, "per_gpu": True,
                   "command": [*LENET, "--loss-log", str(log), "--report-interval", "0.1"]})
    daemon.wait_for(lambda: daemon.jobs()[1]["step"] >= 50, timeout=90,
                    what="job 2 at step 50")
    daemon.client.post("/v1/jobs/1/cancel")
    jobs = daemon.wait_all(timeout=90)
    assert [j["state"] for j in jobs] == ["cancelled", "done"], daemon.log()

    first, second = daemon.query("SELECT * FROM runs WHERE job_id = 2 ORDER BY id")
    assert (first["gpu_count"], first["end_reason"]) == (1, "suspended")
    assert (second["gpu_count"], second["end_reason"]) == (2, "done")
    at = first["end_step"]
    assert 0 < at == second["start_step"] < steps and second["end_step"] == steps
    err = (daemon.state_dir / "jobs" / "2" / f"run-{second['id']}.stderr.log").read_text()
    assert "[rank 0] train_torch: " in err and "; rank 0 of 2, global batch 64" in err, err
    _finish(ref, ref_dir)
    got, want = _losses(log), _losses(tmp_path / "ref.log")
    assert [s for s, _ in got] == list(range(1, steps + 1))  # each step once, by rank 0 alone
    worst = max(abs(float(a) - float(b)) for (_, a), (_, b) in zip(got, want, strict=True))
    assert worst <= 1e-5, worst
    assert float(got[-1][1]) < 0.5 * float(got[0][1])  # it trained on
