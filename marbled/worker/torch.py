"""PyTorch training under MARBLE's suspend/resume protocol. Imported by jobs only.

Usage, one object and one loop::

    import torch
    from marbled.worker.torch import Suspendable
    model, opt = build_model(), torch.optim.Adam(...)  # on the CPU (see prestart below)
    run = Suspendable(model, opt)                      # restores the newest checkpoint
    for step in run.steps():                           # from the step after it
        train_one_step(step)                           # suspends between steps when asked

`Suspendable` installs the protocol (unless the job did), waits for its GPUs if the
broker started the process early (only when the model is still on the CPU: move it
to the GPU after `Suspendable(...)`), checkpoints, acknowledges and exits at a step
boundary when the broker asks, and saves and reports the last step when the loop
ends (`run.finish()`, or a `with` block, for a loop left early).

The lower-level pieces, for a loop of your own (create and install the protocol in
the FIRST lines, before `import torch`, to lose no time to a suspension during the
imports)::

    from marbled.worker.protocol import JobProtocol
    PROTO = JobProtocol.from_env().install()          # before `import torch`
    import torch
    from marbled.worker.torch import TorchCheckpoint
    model, opt = build_model(), torch.optim.Adam(...)  # on the CPU; optimizer built too
    PROTO.ready()                  # a prestarted process waits here for its run and GPUs
    ckpt = TorchCheckpoint(model, opt, protocol=PROTO)
    step = ckpt.restore()                              # newest loadable checkpoint, or 0
    while step < target:
        step += 1; train_one_step(step); ckpt.step_finished(step)  # may suspend here

Touch no GPU and read no checkpoint before `ready()`: a process the broker started
ahead of time gets its GPUs (CUDA_VISIBLE_DEVICES) only there.

A checkpoint `ckpt-{step:09d}.pt` holds the model, optimizer and (optional)
scheduler state dicts, the step, and the torch and Python `random` RNG states, so a
resumed run continues bit-for-bit where the suspended one stopped (on the same
device type and thread count). Checkpoints are written atomically and durably
(temporary file in the same directory, fsync, rename, directory fsync) and read
with `torch.load(weights_only=True)`. Data-loader state is not saved: make the
batch of a step a function of the step (or save the sampler state yourself).

Several processes, one per GPU (DistributedDataParallel, `docs/distributed.md`)::

    model, opt = build_model(), torch.optim.Adam(...)  # on the CPU, before the rendezvous
    ranks = init_distributed()  # a prestarted rank waits for its run; env://, the device
    model.to(ranks.device)                              # in place: opt keeps its parameters
    run = Suspendable(model, opt, global_batch=256)    # every rank restores the checkpoint
    ddp = DDP(model)                                    # after the restore
    for step in run.steps():                            # every rank stops at the same step
        x, y = run.batch.take(*batch_for(step))         # this rank's rows of the step's batch
        (run.batch.weight * loss_fn(ddp(x), y)).backward(); ...

Under torch.distributed with several processes the ranks agree on the stop (an
all-reduce at step boundaries, every k steps with k adaptive: `StopAgreement`),
rank 0 alone saves and acknowledges, every rank exits with os._exit(0), and only
rank 0 reports progress. A checkpoint restores on any world size.

Standard library and torch only; the broker never imports this module.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import torch
from torch import distributed as dist

from marbled.worker.loop import StepLoop
from marbled.worker.protocol import STANDBY_VAR, JobProtocol, atomic_write

FORMAT = 1
_NAME = re.compile(r"ckpt-(\d{9,})\.pt")
_TMP = re.compile(r"\.ckpt-\d{9,}\.pt\.(\d+)\.tmp")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


class CheckpointError(RuntimeError):
    """Checkpoints exist but none of them can be loaded."""


class TorchCheckpoint:
    """Save and restore a model, its optimizer and scheduler at step boundaries.

    `protocol`: the JobProtocol the job installed, if it did; else the process's own
    (`JobProtocol.current()`, installed now: a suspension asked during the imports is
    read from the broker's request file).
    `directory` defaults to the protocol's checkpoint directory (MARBLE_CHECKPOINT_DIR,
    else ./marble-checkpoint). The newest `keep` checkpoints are kept. With
    `fast_exit` a suspended job ends with os._exit(0) right after its acknowledgement.
    `rank`, `world`: this process among a job's several (DDP): rank 0 alone writes the
    files, every rank reads them. A model wrapped in DDP is saved unwrapped, so that
    its checkpoint loads on any world size, one process included.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, *, protocol: JobProtocol | None = None,
                 directory: str | os.PathLike | None = None, keep: int = 2,
                 fast_exit: bool = True, rank: int = 0, world: int = 1):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
            model = model.module  # no "module." prefix in the checkpoint
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.protocol = protocol if protocol is not None else JobProtocol.current()
        self.directory = Path(directory) if directory is not None else self.protocol.checkpoint_dir
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.fast_exit = fast_exit
        self.rank, self.world = rank, world
        self.saved_step: int | None = None  # the step whose checkpoint is on disk
        self.restored_world: int | None = None  # the world size the restored one was saved by

    # -- files

    def path(self, step: int) -> Path:
        return self.directory / checkpoint_name(step)

    def checkpoints(self) -> list[tuple[int, Path]]:
        """The checkpoint files in the directory, newest (highest step) first."""
        found = []
        for p in self.directory.iterdir():
            m = _NAME.fullmatch(p.name)
            if m:
                found.append((int(m.group(1)), p))
        return sorted(found, reverse=True)

    def _remove_stale_temporaries(self) -> None:
        """Temporary files left by a run that was killed in the middle of a save."""
        for p in self.directory.iterdir():
            m = _TMP.fullmatch(p.name)
            if not m or int(m.group(1)) == os.getpid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    p.unlink()
            except PermissionError:
                pass  # some other user's live process: not ours to touch

    # -- save

    def state(self, step: int) -> dict:
        state = {
            "format": FORMAT,
            "step": step,
            "world": self.world,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def save(self, step: int) -> Path:
        """Write the checkpoint of `step` atomically and durably; keep the newest `keep`.
        Under DDP rank 0 writes it; the other ranks hold the same state and write nothing."""
        path = self.path(step)
        if self.rank != 0:
            self.saved_step = step
            return path
        state = self.state(step)
        atomic_write(path, lambda f: torch.save(state, f), durable=True, binary=True)
        self.saved_step = step
        for _, old in self.checkpoints()[self.keep:]:
            if old != path:  # only older steps; never the file just written
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()
        return path

    # -- restore

    def _load(self, path: Path) -> dict:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= state.keys():
            raise ValueError("not a marbled torch checkpoint (no step, model or optimizer)")
        return state

    def restore(self) -> int:
        """Load the newest checkpoint that loads cleanly; return its step (0 if none).

        A checkpoint that cannot be read (truncated, corrupt) is renamed to
        `<name>.corrupt` and the previous one is used, with a warning on stderr. If
        checkpoints exist but none can be read, CheckpointError is raised rather than
        silently starting again from step 0. Under DDP every rank loads the same file;
        rank 0 alone moves files aside.
        """
        if self.rank == 0:
            self._remove_stale_temporaries()
        candidates = self.checkpoints()
        bad: list[tuple[Path, BaseException]] = []
        state = None
        for _, path in candidates:
            try:
                state = self._load(path)
                break
            except Exception as exc:  # any unreadable file: try the previous one
                print(f"marbled.worker.torch: WARNING: checkpoint {path} cannot be loaded "
                      f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}); "
                      "trying the previous one", file=sys.stderr, flush=True)
                bad.append((path, exc))
        if candidates and state is None:
            raise CheckpointError(
                f"none of the {len(candidates)} checkpoints in {self.directory} can be loaded "
                f"(newest: {candidates[0][1].name}: {bad[0][1]})")
        step = 0
        if state is not None:
            self._apply(state)
            step = int(state["step"])
            self.saved_step = step
            self.restored_world = int(state.get("world", 1))
            for path, _ in bad if self.rank == 0 else ():  # out of the way: not retried or kept
                with contextlib.suppress(OSError):
                    path.rename(path.with_name(path.name + ".corrupt"))
            if bad and self.rank == 0:
                print(f"marbled.worker.torch: restored step {step} from "
                      f"{self.path(step).name}; moved aside: "
                      f"{', '.join(p.name + '.corrupt' for p, _ in bad)}",
                      file=sys.stderr, flush=True)
        self.protocol.restored(step)
        return step

    def _apply(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        if "python_rng" in state:
            version, internal, gauss_next = state["python_rng"]
            random.setstate((version, tuple(internal), gauss_next))
        if "cuda_rng" in state and torch.cuda.is_available():
            # A run resumed on fewer devices restores the states of the ones it has.
            for i, rng in enumerate(state["cuda_rng"][: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(rng, i)

    # -- step boundaries

    def step_finished(self, step: int) -> None:
        """Call after every completed step: reports progress; suspends if the broker asked."""
        self.protocol.step_finished(step, self.save, self.saved_step, self.fast_exit)

    def checkpoint_and_exit(self, step: int) -> NoReturn:
        """Suspend now (e.g. when asked during start-up): save unless saved, ack, exit."""
        self.protocol.checkpoint_and_exit(step, self.save, self.saved_step, self.fast_exit)


# -- several processes, one per GPU (DistributedDataParallel)

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")  # what env:// reads


class DistributedError(RuntimeError):
    """The ranks of a job cannot agree as set up (the message says what to change)."""


class Ranks(NamedTuple):
    rank: int
    world: int
    local_rank: int
    device: torch.device


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise DistributedError(f"{name}={value!r}: expected a whole number >= 0")
    return int(value)


def init_distributed(backend: str | None = None, timeout: float = 300.0) -> Ranks:
    """Join the job's process group from the environment (env://); this rank's device.

    A prestarted process first waits here for its run and GPUs (`JobProtocol.ready()`),
    so that it joins with the rendezvous of the run it is given. Started alone, without
    the rendezvous variables, it is rank 0 of 1 and no process group is made.
    `backend`: nccl where CUDA is available, else gloo. `timeout` (seconds) bounds every
    collective: a rank whose peer died or hangs fails after it, instead of after torch's
    default of 30 minutes. The device: cuda:LOCAL_RANK where the process sees several
    GPUs, cuda:0 where it sees one (CUDA_VISIBLE_DEVICES bound to it), else the CPU.
    """
    JobProtocol.current().ready()
    local_rank = _env_int("LOCAL_RANK", 0)
    device = torch.device("cpu")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        index = 0 if count == 1 else local_rank
        if index >= count:
            raise DistributedError(
                f"LOCAL_RANK={local_rank}, but this process sees {count} GPUs "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): start "
                "one process per GPU it sees")
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size(), local_rank, device)
    missing = [name for name in RENDEZVOUS_VARS if not os.environ.get(name)]
    if len(missing) == len(RENDEZVOUS_VARS):
        return Ranks(0, 1, 0, device)
    if missing:
        raise DistributedError(
            f"{', '.join(missing)} not set: an env:// rendezvous needs all of "
            f"{', '.join(RENDEZVOUS_VARS)}; start the ranks with a launcher that sets them "
            "(marbled's one process per GPU, torchrun, or srun with them exported)")
    dist.init_process_group(backend or ("nccl" if device.type == "cuda" else "gloo"),
                            timeout=timedelta(seconds=timeout))
    return Ranks(dist.get_rank(), dist.get_world_size(), local_rank, device)


def job_ranks() -> tuple[int, int]:
    """(rank, world size) of this process in its job: torch.distributed's, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if os.environ.get(STANDBY_VAR):  # a prestarted rank learns its world at the go
        JobProtocol.current().ready()
    world = os.environ.get("WORLD_SIZE", "").strip()
    if world not in ("", "0", "1"):
        raise DistributedError(
            f"WORLD_SIZE={world}, but torch.distributed is not initialised: call "
            "marbled.worker.torch.init_distributed() (or torch.distributed."
            "init_process_group()) before Suspendable(...), so that the ranks agree on "
            "the step they stop at")
    return 0, 1


def _cpu_group() -> Any:
    """A group for the stop flag on the CPU: the default one under gloo; under NCCL a gloo
    group of every rank, so that a check never waits for the GPU's queue to drain."""
    backend = str(dist.get_backend())
    return None if "gloo" in backend else dist.new_group(backend="gloo")


class StopAgreement:
    """The ranks of a job decide together, at step boundaries, whether to stop there.

    A vote every k steps: an all-reduce(MAX) of [stop asked, -k proposed, step, -step] on
    the CPU, started without blocking after step s and waited for after step s + 1, so
    that the step in between hides the collective's latency and the ranks' skew. The vote
    says "stop after step s + 1": every rank stops there if any rank had been asked by s,
    and ranks at different steps raise DistributedError instead of hanging in the next
    collective. The first vote, after the restore, is waited for at once: a run asked
    while it started stops before its first step, and ranks that restored different steps
    fail before they train.

    k adapts: each rank proposes the least k for which a vote's time (starting it and
    waiting for it, a moving average; the first vote, which waits for every rank's
    start-up, is left out) is under `budget` of the training time between two votes, but
    no more than `max_wait` seconds of training for the k + 1 steps a request may wait
    (k to the next vote, one to its stop); the smallest proposal wins. `every`: a fixed k
    instead. `checks` and `seconds` count the votes and this rank's time in them.
    """

    def __init__(self, *, budget: float = 0.01, max_wait: float = 0.25,
                 every: int | None = None, group: Any = None):
        if every is not None and every < 1:
            raise ValueError(f"every must be >= 1 (a check every that many steps), not {every}")
        if not 0 < budget < 1 or max_wait <= 0:
            raise ValueError("budget must be in (0, 1) and max_wait > 0")
        self.budget, self.max_wait, self.every = budget, max_wait, every
        self.group = group if group is not None else _cpu_group()
        self.k = every or 1
        self.next_step: int | None = None  # where the next vote starts (None: the first)
        self.checks, self.seconds = 0, 0.0
        self.cost: float | None = None  # seconds a vote takes this rank: a moving average
        self.step_s: float | None = None  # seconds a step trains, between votes
        self._last: tuple[int, float] | None = None  # the step and end of the last vote's work
        self._vote: tuple[Any, torch.Tensor, float] | None = None  # started: work, tensor, s

    def _propose(self) -> int:
        if self.every:
            return self.every
        if self.cost is None or not self.step_s:
            return 1
        by_cost = math.ceil(self.cost / (self.budget * self.step_s))
        return max(1, min(by_cost, int(self.max_wait / self.step_s) - 1))

    def _timed(self, step: int, start: float) -> float:
        """The end of this boundary's work; the training time per step since the last."""
        end = time.perf_counter()
        self.seconds += end - start
        if self._last is not None and step > self._last[0]:
            self.step_s = (start - self._last[1]) / (step - self._last[0])
        self._last = (step, end)
        return end - start

    def stop(self, step: int, asked: bool) -> bool:
        """At the boundary after `step`: whether every rank stops here. Between two votes:
        False, without communicating."""
        start = time.perf_counter()
        if self._vote is None:
            if self.next_step is not None and step < self.next_step:
                return False
            vote = torch.tensor([int(asked), -self._propose(), step, -step], dtype=torch.int64)
            work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            first = self.next_step is None
            self._vote = (work, vote, 0.0 if first else self._timed(step, start))
            if not first:
                return False  # waited for after the next step
            start = time.perf_counter()
        work, vote, started = self._vote
        self._vote = None
        # A peer that died fails the wait as any collective would: at once when its
        # connection closes, else after the group's timeout. An error, never a hang.
        work.wait()
        stop, minus_k, highest, minus_lowest = vote.tolist()
        if highest != -minus_lowest:
            raise DistributedError(
                f"the ranks are at different steps ({-minus_lowest} to {highest}): every rank "
                "must restore the same checkpoint (MARBLE_CHECKPOINT_DIR on a file system "
                "all nodes see) and run the same steps (leave run.steps() on all or none)")
        took = started + self._timed(step, start)
        if self.checks:  # not the first vote: it waited for every rank's start-up
            self.cost = took if self.cost is None else 0.8 * self.cost + 0.2 * took
        self.checks += 1
        # the vote started after step `highest`; the next one starts k steps after that
        self.k = -minus_k
        self.next_step = highest + self.k
        if not stop and self.next_step <= step:
            return self.stop(step, asked)  # k = 1: the next vote starts here
        return bool(stop)

    def close(self) -> None:
        """Wait for a vote still under way (the loop has ended): every rank started it."""
        if self._vote is not None:
            start = time.perf_counter()
            work, _, _ = self._vote
            self._vote = None
            work.wait()
            self.seconds += time.perf_counter() - start


class Shard(NamedTuple):
    """This rank's rows [start, stop) of a step's global batch of `size` rows.

    Multiply the rank's mean loss by `weight` (1.0 when the batch divides evenly): DDP
    averages the ranks' gradients with equal weights, and the weight makes that average
    the gradient of the mean loss over the whole global batch."""
    start: int
    stop: int
    size: int
    weight: float

    def take(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t[self.start:self.stop] for t in tensors)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over the job's ranks (the global batch's mean loss, from each
    rank's weighted mean); a collective under DDP: every rank calls it, at the same step."""
    value = value.detach()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
        value = value / dist.get_world_size()
    return value.item()


def split_batch(global_batch: int, rank: int, world: int) -> Shard:
    """Rank `rank`'s shard of `global_batch` rows over `world` ranks: equal shares, the
    remainder one row each to the first ranks."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    if global_batch < world:
        raise ValueError(
            f"a global batch of {global_batch} cannot be split over {world} ranks (each "
            f"needs a row): raise the batch to at least {world} or run on at most "
            f"{global_batch} GPUs (marble submit --gpus)")
    base, extra = divmod(global_batch, world)
    start = rank * base + min(rank, extra)
    rows = base + (rank < extra)
    return Shard(start, start + rows, global_batch, rows * world / global_batch)


def scale_learning_rates(optimizer: torch.optim.Optimizer, scheduler: Any,
                         factor: float) -> None:
    """Multiply every learning rate by `factor`: the optimizer's, and the base rates an LR
    scheduler computes them from (else its next step would undo the change)."""
    if factor == 1:
        return
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]


class Suspendable(StepLoop):
    """A PyTorch training run: `run = Suspendable(model, optimizer, scheduler)`, then
    `for step in run.steps(): ...` (see the module's docstring).

    `prestart` (default: while every parameter of `model` is on the CPU): the process may
    be started before its GPUs are free and waits for them here. `steps`, `every`,
    `directory`, `keep` and `fast_exit` as for StepLoop and TorchCheckpoint.

    Under torch.distributed with several processes (`init_distributed()` first; wrap the
    model in DDP after this, which restores it): the ranks agree on the stop
    (`agreement`, a StopAgreement; `agree_every` fixes its k), rank 0 alone saves and
    acknowledges, and every rank exits with os._exit(0), whatever `fast_exit` says (a
    normal teardown after gloo or NCCL aborts in 10-35% of exits).

    `global_batch`: the rows of each step in all ranks together, the same on any world
    size; `run.batch` is this rank's Shard of it. `batch_per_rank` instead, opt-in (the
    linear scaling rule): the global batch is batch_per_rank x world size, and the
    learning rates are scaled with the world size: by world / `lr_world` (the world size
    the optimizer's rates are set for) on a fresh start, by new / old world on a resume.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, *, steps: int | None = None, every: int = 0,
                 protocol: JobProtocol | None = None, directory: str | os.PathLike | None = None,
                 keep: int = 2, fast_exit: bool = True, prestart: bool | None = None,
                 global_batch: int | None = None, batch_per_rank: int | None = None,
                 lr_world: int = 1, agree_every: int | None = None):
        if global_batch is not None and batch_per_rank is not None:
            raise ValueError("give global_batch (kept on any GPU count) or batch_per_rank "
                             "(the linear scaling rule), not both")
        for name, value in (("global_batch", global_batch), ("batch_per_rank", batch_per_rank),
                            ("lr_world", lr_world)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, not {value}")
        self.rank, self.world = job_ranks()
        # a bad split fails here, before anything is loaded
        self.batch: Shard | None = None
        if global_batch is not None or batch_per_rank is not None:
            rows = global_batch if global_batch is not None else batch_per_rank * self.world
            self.batch = split_batch(rows, self.rank, self.world)
        if prestart is None:
            prestart = all(p.device.type == "cpu" for p in model.parameters())
        if self.world > 1:
            fast_exit = True
        checkpoint = TorchCheckpoint(model, optimizer, scheduler, protocol=protocol,
                                     directory=directory, keep=keep, fast_exit=fast_exit,
                                     rank=self.rank, world=self.world)
        # torch's rank speaks for the job, not a launcher's (under srun running torchrun,
        # SLURM_PROCID numbers the nodes, and every process of the first node has 0)
        checkpoint.protocol.rank = self.rank
        self.agreement = StopAgreement(every=agree_every) if self.world > 1 else None
        super().__init__(checkpoint, steps=steps, protocol=checkpoint.protocol,
                         fast_exit=fast_exit, prestart=prestart, every=every)
        if batch_per_rank is not None:
            scale_learning_rates(optimizer, scheduler,
                                 self.world / (checkpoint.restored_world or lr_world))

    def suspend_agreed(self) -> bool:
        if self.agreement is None:
            return super().suspend_agreed()
        if self.agreement.stop(self.step, self.protocol.suspend_requested):
            self.protocol.suspend_requested = True  # also on a rank the broker did not reach
            return True
        return False

    def finish(self) -> None:
        if self.agreement is not None:
            self.agreement.close()  # no work left under way on the group the job goes on with
        super().finish()
