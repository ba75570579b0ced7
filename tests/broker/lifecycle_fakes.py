"""A world of simulated job processes that outlive the broker, for the lifecycle tests.

tests/broker/fakes.py lets one broker run in the test's process; this module adds what a
broker's *death* needs: processes that keep running while no broker watches and are
adopted by the next one, as real processes are. A `World` holds, for every job, what
really happened to it (the steps each run trained, the checkpoints on disk, the
completions of a plain command), whichever broker was up; a `SimProc` is one run's
process, driven by the test: it trains (reports progress if it speaks the protocol),
answers a SIGTSTP with a checkpoint, crashes, completes. `SimLauncher` starts them and
adopts them (by run id: a restarted broker that lost a run's pid finds it by its
environment). What breaks the lifecycle's invariants (docs: issue 30, I1-I3) is written
down as a `Violation` with a tag, so a test can tell a known break from a new one.
"""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from marbled.worker.protocol import ACK_FILE, PROGRESS_FILE, atomic_write_json

try:  # the local launcher's supervisor records every run's exit (issue 30, I2)
    from marbled.batch.supervise import exit_file_name, exit_record
except ImportError:  # a launcher without one: an adopted run's exit is not known
    exit_file_name = exit_record = None

CHECKPOINT = "sim-checkpoint.json"  # the simulated job's checkpoint, in MARBLE_CHECKPOINT_DIR


@dataclass
class Violation:
    tag: str  # what kind of break (KNOWN_BREAKS names the known ones)
    job: int
    what: str

    def __str__(self) -> str:
        return f"[{self.tag}] job {self.job}: {self.what}"


@dataclass
class JobTruth:
    """What really happened to one job, whatever the brokers recorded."""

    job: int
    kind: str  # the test's name for the job's kind (auto, fixed, plain, per_gpu, ...)
    protocol: bool  # speaks the worker protocol (reports, checkpoints on SIGTSTP)
    steps: int  # protocol: its last step; plain: the ticks it needs to complete
    fixed: bool  # submitted with an explicit GPU count
    after: tuple[int, ...] = ()
    trained: dict[int, int] = field(default_factory=dict)  # step -> times trained
    redo: set[int] = field(default_factory=set)  # steps that may be trained again
    completions: int = 0  # plain: times its command completed; protocol: reached the end
    launches: int = 0
    saved: int = 0  # the newest step a checkpoint was ever saved at
    cancelled: bool = False  # the user cancelled it (while it was not yet final)
    procs: list[SimProc] = field(default_factory=list)


class SimProc:
    """One run's process. It lives across broker generations until it exits."""

    def __init__(self, world: World, request, pid: int):
        self.world, self.request, self.pid, self.pid_start = world, request, pid, 1
        env = request.env
        self.run_id = int(env["MARBLE_RUN_ID"])
        self.job = int(env["MARBLE_JOB_ID"])
        self.run_dir = Path(env["MARBLE_RUN_DIR"])
        self.ckpt_dir = Path(env["MARBLE_CHECKPOINT_DIR"])
        self.truth = world.jobs[self.job]
        self.gen = world.generation  # the broker that launched it
        self.kills_seen = 0  # brokers killed -9 while it lived
        self.signals: list[str] = []
        self.restored: int | None = None  # the step it restored (None: not yet started)
        self.pos = 0  # protocol: the next step to train; plain: ticks done
        self.asked = False  # got SIGTSTP
        self.acked: int | None = None
        self.exit_code: int | None = None
        self.alive = True
        self.recorded = exit_file_name is not None  # its exit is recorded where a broker reads
        self._waiters: list[tuple[asyncio.Future, bool]] = []

    def __repr__(self) -> str:
        return (f"<proc job {self.job} run {self.run_id} {self.truth.kind} pos {self.pos} "
                f"{'alive' if self.alive else f'exited {self.exit_code}'}>")

    # ------------------------------------------------------------ the broker's side

    def handle(self, adopted: bool) -> SimHandle:
        return SimHandle(self, adopted)

    def wait_future(self, adopted: bool) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if not self.alive:
            future.set_result(self._seen_code(adopted))
        else:
            self._waiters.append((future, adopted))
        return future

    def _seen_code(self, adopted: bool) -> int | None:
        """The exit code a broker sees: its child's; an adopted run's as its supervisor
        recorded it (None: no record)."""
        return self.exit_code if not adopted or self.recorded else None

    def signal(self, sig: int) -> bool:
        if not self.alive:
            return False
        if not sig:
            return True
        name = signal.Signals(sig).name
        self.signals.append(name)
        if sig == signal.SIGTSTP:
            if self.truth.protocol:
                self.asked = True  # answered when the test lets it (answer())
            # a plain command in an orphaned process group: the default SIGTSTP is discarded
        elif sig == signal.SIGTERM and self.truth.kind == "plain_stubborn":
            # It ignores SIGTERM (`trap '' TERM`): it finishes its work and exits 0, as a
            # command whose exit races the signal does.
            self._start()
            self.pos = self.truth.steps
            self.complete()
        elif sig in (signal.SIGTERM, signal.SIGKILL):
            self._forced(name)
        return True

    def _forced(self, name: str) -> None:
        """Killed by a signal: a protocol job loses what it trained since its checkpoint."""
        if self.truth.protocol and self.restored is not None:
            lost = set(range(self.world.checkpoint(self.truth), self.pos))
            self.truth.redo |= lost
            if lost and not self.asked and not self.truth.cancelled:
                # The broker stopped a job that speaks the protocol without asking it to
                # checkpoint first (I1): a shutdown, a drain, a reshape of a fixed count.
                self.world.violate(
                    "fixed-count-stopped-without-checkpoint" if self.truth.fixed
                    else "stopped-without-checkpoint", self.job,
                    f"run {self.run_id} got {name} with no SIGTSTP before it: steps "
                    f"{min(lost)}..{max(lost)} lost")
        self._exit(-getattr(signal, name))

    # ------------------------------------------------------------ the job's side

    def _start(self) -> None:
        if self.restored is None:
            self.restored = self.pos = self.world.checkpoint(self.truth) \
                if self.truth.protocol else 0
            if self.truth.protocol:
                if self.restored < self.truth.saved:
                    self.world.violate("checkpoint-lost", self.job,
                                       f"run {self.run_id} restored step {self.restored}; "
                                       f"step {self.truth.saved} had been saved")
                self._report()

    def _report(self) -> None:
        atomic_write_json(self.run_dir / PROGRESS_FILE, {
            "run_id": self.run_id, "step": self.pos, "start_step": self.restored,
            "time": self.world.now(), "phases": {}}, durable=False)

    def train(self, ticks: int) -> None:
        """Train `ticks` steps (protocol: reporting each; plain: work, no report); at the
        last one it completes and exits 0. One that acknowledged trains no more."""
        if not self.alive or self.acked is not None:
            return
        self._start()
        truth = self.truth
        for _ in range(ticks):
            if self.pos >= truth.steps:
                break
            if truth.protocol:
                step = self.pos
                seen = truth.trained.get(step, 0)
                if seen:
                    if step in truth.redo:
                        truth.redo.discard(step)
                    else:
                        self.world.violate("step-trained-twice", self.job,
                                           f"run {self.run_id} trained step {step} again")
                truth.trained[step] = seen + 1
            self.pos += 1
        if truth.protocol:
            self._report()
        if self.pos >= truth.steps:
            self.complete()

    def complete(self) -> None:
        truth = self.truth
        if truth.protocol:
            self.world.save_checkpoint(truth, self.pos)  # a worker saves its last step first
            self._report()
        truth.completions += 1
        if truth.completions > 1:
            self.world.violate(
                "plain-rerun-after-crash" if not truth.protocol and self._after_a_crash()
                else "completed-twice", self.job,
                f"completed {truth.completions} times (run {self.run_id})")
        self._exit(0)

    def _after_a_crash(self) -> bool:
        """Whether an earlier completed run of this job lived through a broker's kill -9."""
        return any(p.kills_seen for p in self.truth.procs if p is not self)

    def answer(self, exit_now: bool = True) -> None:
        """A SIGTSTP seen: checkpoint at the current step, acknowledge, exit (or linger)."""
        if not self.alive or not self.asked or self.acked is not None:
            return
        self._start()
        self.world.save_checkpoint(self.truth, self.pos)
        self.acked = self.pos
        atomic_write_json(self.run_dir / ACK_FILE, {
            "run_id": self.run_id, "step": self.pos, "time": self.world.now(),
            "signalled_at": None}, durable=False)
        if exit_now:
            self._exit(0)

    def leave(self) -> None:
        """A process that acknowledged exits."""
        if self.alive and self.acked is not None:
            self._exit(0)

    def crash(self) -> None:
        """The job's own fault: exit 1, losing what it trained since its checkpoint."""
        if not self.alive:
            return
        if self.truth.protocol and self.restored is not None:
            self.truth.redo |= set(range(self.world.checkpoint(self.truth), self.pos))
        self._exit(1)

    def _exit(self, code: int) -> None:
        self.alive, self.exit_code = False, code
        if exit_file_name is not None and code != -signal.SIGKILL:
            # as its supervisor does (SIGKILL ends the supervisor too: no record then)
            (self.run_dir / exit_file_name(self.run_id)).write_text(
                exit_record(self.run_id, code, self.world.now(), self.pid))
        else:
            self.recorded = False
        for future, adopted in self._waiters:
            if not future.done():
                future.set_result(self._seen_code(adopted))
        self._waiters.clear()


class SimHandle:
    """A broker's handle on a SimProc: its child's (launched), or an adopted one's, whose exit
    code a broker cannot know (None), as the local launcher's adopted runs."""

    def __init__(self, proc: SimProc, adopted: bool):
        self.proc, self.adopted = proc, adopted
        self.pid, self.pid_start = proc.pid, proc.pid_start

    async def wait(self) -> int | None:
        return await self.proc.wait_future(self.adopted)

    def signal(self, sig: int) -> bool:
        return self.proc.signal(sig)


class _Gone:
    """What adopt() gives for a run whose process is nowhere: it ended."""

    def __init__(self, pid: int):
        self.pid, self.pid_start = pid, None

    async def wait(self) -> None:
        return None

    def signal(self, sig: int) -> bool:
        return False


class SimLauncher:
    """Starts SimProcs; adopts the one of a run id, alive or not, for any broker generation."""

    name = "sim"

    def __init__(self, world: World):
        self.world = world

    async def launch(self, request) -> SimHandle:
        return self.world.launched(request).handle(adopted=False)

    def close(self) -> None:
        pass

    def adopt(self, pid: int, pid_start, run_dir: Path, run_id: int):
        proc = self.world.by_run.get(run_id)
        if proc is None:
            return _Gone(pid)
        return proc.handle(adopted=True)


class World:
    """Every job's truth and every process, across the brokers that come and go."""

    def __init__(self, now):
        self.now = now  # () -> the time the processes write in their files
        self.jobs: dict[int, JobTruth] = {}
        self.by_run: dict[int, SimProc] = {}
        self.procs: list[SimProc] = []
        self.violations: list[Violation] = []
        self.generation = 0
        self._pids = iter(range(4000, 10**9))

    def violate(self, tag: str, job: int, what: str) -> None:
        self.violations.append(Violation(tag, job, what))

    def alive(self) -> list[SimProc]:
        return [p for p in self.procs if p.alive]

    def launched(self, request) -> SimProc:
        proc = SimProc(self, request, next(self._pids))
        truth = proc.truth
        truth.launches += 1
        if truth.completions:
            self.violate("plain-rerun-after-crash" if not truth.protocol
                         and any(p.kills_seen for p in truth.procs) else "ran-after-completion",
                         proc.job, f"run {proc.run_id} launched after the job completed")
        if truth.cancelled:
            self.violate("ran-after-cancel", proc.job, f"run {proc.run_id} launched after "
                         "the user cancelled the job")
        for dep in truth.after:
            if not self.jobs[dep].completions:
                self.violate("dependency-not-done", proc.job,
                             f"run {proc.run_id} launched before job {dep} completed")
        late = [w for w in request.argv if "$MARBLE_" in w or "${MARBLE_" in w]
        if late:
            self.violate("run-variable-unfilled", proc.job,
                         f"run {proc.run_id} launched with {late}")
        for other in self.alive():
            if other.job == proc.job:
                self.violate("two-processes", proc.job,
                             f"run {proc.run_id} launched while run {other.run_id} lives")
        truth.procs.append(proc)
        self.procs.append(proc)
        self.by_run[proc.run_id] = proc
        return proc

    def broker_killed(self) -> None:
        for proc in self.alive():
            proc.kills_seen += 1
        self.generation += 1

    def checkpoint(self, truth: JobTruth) -> int:
        """The step of the job's checkpoint on disk (what a worker restores)."""
        path = self._ckpt_path(truth)
        if path is None or not path.exists():
            return 0
        return json.loads(path.read_text())["step"]

    def save_checkpoint(self, truth: JobTruth, step: int) -> None:
        path = self._ckpt_path(truth)
        if path is not None and truth.protocol:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {"step": step}, durable=False)
            truth.saved = max(truth.saved, step)

    def _ckpt_path(self, truth: JobTruth) -> Path | None:
        return Path(truth.procs[0].ckpt_dir) / CHECKPOINT if truth.procs else None
