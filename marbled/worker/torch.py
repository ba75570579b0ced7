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

Standard library and torch only; the broker never imports this module.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch

from marbled.worker.loop import StepLoop
from marbled.worker.protocol import JobProtocol, atomic_write

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
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, *, protocol: JobProtocol | None = None,
                 directory: str | os.PathLike | None = None, keep: int = 2,
                 fast_exit: bool = True):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.protocol = protocol if protocol is not None else JobProtocol.current()
        self.directory = Path(directory) if directory is not None else self.protocol.checkpoint_dir
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.fast_exit = fast_exit
        self.saved_step: int | None = None  # the step whose checkpoint is on disk

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
        """Write the checkpoint of `step` atomically and durably; keep the newest `keep`."""
        state = self.state(step)
        path = self.path(step)
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
        silently starting again from step 0.
        """
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
            for path, _ in bad:  # out of the way, so it is neither retried nor counted in `keep`
                with contextlib.suppress(OSError):
                    path.rename(path.with_name(path.name + ".corrupt"))
            if bad:
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


class Suspendable(StepLoop):
    """A PyTorch training run: `run = Suspendable(model, optimizer, scheduler)`, then
    `for step in run.steps(): ...` (see the module's docstring).

    `prestart` (default: while every parameter of `model` is on the CPU): the process may
    be started before its GPUs are free and waits for them here. `steps`, `every`,
    `directory`, `keep` and `fast_exit` as for StepLoop and TorchCheckpoint."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any = None, *, steps: int | None = None, every: int = 0,
                 protocol: JobProtocol | None = None, directory: str | os.PathLike | None = None,
                 keep: int = 2, fast_exit: bool = True, prestart: bool | None = None):
        checkpoint = TorchCheckpoint(model, optimizer, scheduler, protocol=protocol,
                                     directory=directory, keep=keep, fast_exit=fast_exit)
        if prestart is None:
            prestart = all(p.device.type == "cpu" for p in model.parameters())
        super().__init__(checkpoint, steps=steps, protocol=checkpoint.protocol,
                         fast_exit=fast_exit, prestart=prestart, every=every)
