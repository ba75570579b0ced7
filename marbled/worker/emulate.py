"""EMULATED training job: no model, no GPU work, only the timing of one.

It "trains" `--model` for `--steps` steps at the rate the profile gives for the
number of GPUs in CUDA_VISIBLE_DEVICES, sleeping through each step, with
`--time-scale` (real seconds per profiled second) so that a 900 s job set runs in
seconds. It speaks the real worker protocol: SIGTSTP -> checkpoint at the next
step boundary -> ack -> exit, and resumes from its checkpoint. The broker uses
it for demos and tests on machines without GPUs; nothing about it is real
training.
"""

from __future__ import annotations

import sys

from marbled.worker.protocol import JobProtocol, atomic_write_json, read_json

# First, before any other import: a SIGTSTP that comes before the handler is lost.
if __name__ == "__main__":
    _PROTOCOL = JobProtocol.from_env().install()

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

CHECKPOINT = "emulated-checkpoint.json"


def _parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="marble-emulate",
        description="EMULATED training job: sleeps through each step at the profiled rate.",
    )
    p.add_argument("--model", default=env.get("MARBLE_MODEL"), help="model name in the profile")
    p.add_argument("--steps", type=int, default=env.get("MARBLE_TARGET_STEPS"),
                   help="steps to train in all (across suspensions)")
    p.add_argument("--profile", default=env.get("MARBLE_PROFILE", "summit-v100"),
                   help="profile name or YAML path")
    p.add_argument("--time-scale", type=float, default=float(env.get("MARBLE_TIME_SCALE", "1")),
                   help="real seconds per profiled second (0.01 runs 100x faster)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="also checkpoint every N steps (0: only when suspended)")
    p.add_argument("--ignore-suspend", action="store_true",
                   help="testing: ignore SIGTSTP, to exercise the broker's escalation")
    p.add_argument("--step-log", type=Path, default=env.get("MARBLE_EMULATE_STEP_LOG"),
                   help="testing: append every completed step number to this file")
    return p


def run(proto: JobProtocol, argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.model or not args.steps or args.steps < 1:
        print("marble-emulate: --model and --steps (>= 1) are required", file=sys.stderr)
        return 2
    from marbled.resources import load_profile

    curve = load_profile(args.profile).lookup(args.model)
    if curve is None:
        print(f"marble-emulate: model '{args.model}' is not in the profile", file=sys.stderr)
        return 2
    proto.ready()
    gpus = max(proto.gpus, 1)
    proto.report_interval = min(proto.report_interval, 0.25)
    step_seconds = args.time_scale / curve.throughput(gpus, proto.share)
    ckpt_path = proto.checkpoint_dir / CHECKPOINT
    saved = int((read_json(ckpt_path) or {}).get("step", 0))
    step = start = saved
    proto.restored(step)
    # In a multi-node job every rank trains in step; rank 0 keeps the checkpoint and the log.
    leader = proto.rank == 0
    log = open(args.step_log, "a") if args.step_log and leader else None  # noqa: SIM115

    def save(at: int) -> None:
        nonlocal saved
        if not leader:
            return
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(ckpt_path, {"model": args.model, "step": at, "time": time.time()})
        saved = at

    if proto.suspend_requested and not args.ignore_suspend:  # asked while starting up
        proto.checkpoint_and_exit(step, save, saved)
    t0 = time.monotonic()
    while step < args.steps:
        # Sleep to the end of this step on an absolute schedule, so no drift builds up.
        delay = t0 + (step - start + 1) * step_seconds - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        step += 1
        if log:
            log.write(f"{step}\n")
            log.flush()
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save(step)
        if args.ignore_suspend:
            proto.report(step)
        else:
            proto.step_finished(step, save, saved)
    save(step)
    proto.report(step, force=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    proto = _PROTOCOL if __name__ == "__main__" else JobProtocol.from_env().install()
    code = run(proto, argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: the GPUs are free the moment we are gone


if __name__ == "__main__":
    main()
