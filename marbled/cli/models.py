"""`marble` commands about models: the curves a broker believes."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from marbled.batch import LAUNCHERS
from marbled.cli.common import call, client, json_option, output
from marbled.core.learning import Learning
from marbled.core.profiles import ProfileError
from marbled.core.target import gpus_text
from marbled.resources import learned_book


@click.command()
@click.argument("model", required=False)
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False),
              help="Read a broker's state database (STATE_DIR/marble.db) instead of asking "
                   "a running broker.")
@click.option("--yaml", "as_yaml", is_flag=True,
              help="Print the curves as a profile (for marbled --profile or marble simulate "
                   "--profile) instead of the table.")
@click.option("--threshold", type=click.FloatRange(min=0), default=Learning().tolerance,
              show_default=True,
              help="With --db: flag a model whose measured throughput differs from its "
                   "profile by more than this share (0.15 = 15%).")
@json_option
@click.pass_context
def curves(ctx, model, db, as_yaml, threshold, as_json):
    """Each model's curve: the profile's, what runs measured, what the broker believes.

    Per GPU count: steps/s in the profile, measured (median of the runs' samples,
    with their number), and the estimate decisions use (measured, the profile
    scaled to the measurements, or fitted to them). A model whose measurements
    contradict its profile (another optimum, or throughput off by more than the
    threshold) is flagged: fix the profile, or let the broker keep learning.

    \b
    Examples:
      marble curves                       # every model of the running broker
      marble curves resnet-50 --json
      marble curves --db STATE_DIR/marble.db --yaml > learned.yaml
    """
    if db is not None or as_yaml:
        path = db or ctx.find_root().obj["state_dir"] / "marble.db"
        try:
            book = learned_book(Path(path), Learning(tolerance=threshold))
        except ProfileError as exc:
            raise click.ClickException(str(exc)) from None
        if as_yaml:
            click.echo(yaml.safe_dump(book.as_profile(), sort_keys=False), nl=False)
            return
        doc = {"profile": book.system, "learning": True, "models": book.report(model)}
    else:
        path = "/v1/curves" + (f"?model={model}" if model else "")
        doc = call(client(ctx).get, path)
    output(ctx, as_json, doc, lambda: click.echo(format_curves(doc)))


def format_curves(doc: dict) -> str:
    def num(v) -> str:
        return "-" if v is None else f"{v:.3g}"

    lines = [f"profile {doc['profile']}" + ("" if doc["learning"] else " (not learning)")]
    for m in doc["models"]:
        flag = f"  ** {m['disagrees']}" if m["disagrees"] else ""
        best = "not known yet" if m["optimum"] is None else gpus_text(m["optimum"])
        said = "no profile" if m["profile_optimum"] is None else \
            f"profile: {gpus_text(m['profile_optimum'])}"
        aim = m.get("next_reason") or {"text": m["next_count"]}  # a broker before it had one
        lines.append(f"\n{m['model']}: optimum {best} ({said}), next run on {aim['text']}"
                     + flag)
        lines.append(f"  {'GPUs':>4} {'profile':>9} {'measured':>9} {'runs':>5} "
                     f"{'estimate':>9}  source")
        for c in m["counts"]:
            lines.append(f"  {c['gpus']:>4} {num(c['profile']):>9} {num(c['measured']):>9} "
                         f"{c['samples']:>5} {num(c['estimate']):>9}  {c['source']}")
        costs = [f"{k} {m[k]:.3g} s" for k in ("startup_s", "suspend_s") if m[k] is not None]
        if costs:
            lines.append("  costs: " + ", ".join(costs))
    return "\n".join(lines)


def _counts(text: str | None, most: int) -> list[int]:
    """'1-6' or '1,2,4' -> the counts; None -> 1..most."""
    if text is None:
        return list(range(1, most + 1))
    try:
        if "-" in text:
            low, high = (int(x) for x in text.split("-", 1))
            counts = list(range(low, high + 1))
        else:
            counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise click.BadParameter(f"'{text}' is not a range such as 1-6 or a list such as "
                                 "1,2,4 of GPU counts >= 1", param_hint="--gpus")
    if counts[-1] > most:
        raise click.BadParameter(f"{counts[-1]} GPUs asked for, the node has {most}",
                                 param_hint="--gpus")
    return counts


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--model", required=True, help="The model's name in the profile (e.g. my-net).")
@click.option("--gpus", "counts", metavar="1-6|1,2,4",
              help="The GPU counts to measure. [default: 1 to every GPU of the node]")
@click.option("--steps", type=click.IntRange(2), default=100, show_default=True,
              help="Steps timed at each count, after the warm-up.")
@click.option("--warmup", type=click.IntRange(0), default=10, show_default=True,
              help="Steps at the start of each run left out of the timing.")
@click.option("--output", "out_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The profile file to write, or to merge the model into if it exists. "
                   "[default: ./profile-<host>.yaml]")
@click.option("--system", help="The system's name in a new profile. [default: the host name]")
@click.option("--batch-size", type=click.IntRange(1), help="Recorded with the figures.")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default="auto", show_default=True,
              help="How the runs start: as processes here, or inside an allocation as job "
                   "steps (slurm, jsrun), as marbled would start them.")
@click.option("--emulated-gpus", type=click.IntRange(1, 1024),
              help="On a machine without GPUs: a node of this many EMULATED GPUs.")
@click.option("--time-scale", type=click.FloatRange(min=1e-4), default=1.0, show_default=True,
              help="For an emulated job: its real seconds per profiled second (the figures "
                   "are given back in profiled seconds).")
@click.option("--workdir", type=click.Path(path_type=Path, file_okay=False),
              help="Where the runs keep their logs and checkpoints. [default: a temporary "
                   "directory]")
@json_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def profile(ctx, model, counts, steps, warmup, out_path, system, batch_size, launcher,
            emulated_gpus, time_scale, workdir, as_json, command):
    """Measure a model's throughput at each GPU count, and its start-up and suspend costs.

    marble profile --model NAME [--gpus 1-6] -- COMMAND [ARGS]...

    COMMAND is the training script, as you would submit it: it must speak the
    worker protocol (marbled.worker). Each count runs on its own, one after
    another; the figures, with where they came from, go into a profile YAML
    that marbled --profile and marble simulate --profile load.

    \b
    Examples:
      marble profile --model my-net -- python train.py --data ...
      marble profile --model my-net --gpus 1,2,4 --steps 200 --output site.yaml -- ./train.sh
    """
    import asyncio
    import socket
    import tempfile

    from marbled.batch import choose
    from marbled.batch.base import AllocationError
    from marbled.profiler import (
        Profiler,
        ProfileRunError,
        Profiling,
        gpu_name,
        merge_into,
        profile_entry,
    )
    from marbled.resources import load_yaml

    try:
        batch = choose(launcher, emulated_gpus)
        allocation = batch.allocation()
    except AllocationError as exc:
        raise click.ClickException(str(exc)) from None
    node, devices = next(iter(allocation.gpu_nodes.items()))
    job = Profiling(model, tuple(command), _counts(counts, len(devices)), steps, warmup,
                    time_scale)
    out_path = out_path or Path(f"profile-{socket.gethostname().split('.')[0]}.yaml")
    tty = sys.stderr.isatty()

    def progress(line: str) -> None:
        if tty:
            click.echo(f"\r{line}\033[K", err=True, nl=False)

    with tempfile.TemporaryDirectory(prefix="marble-profile-") as tmp:
        profiler = Profiler(batch.launcher(allocation), node, devices, workdir or Path(tmp),
                            progress)
        try:
            asyncio.run(profiler.run(job))
        except ProfileRunError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            if tty:
                click.echo(err=True)
    system = system or socket.gethostname().split(".")[0]
    entry = profile_entry(job, system, gpu_name(devices, emulated_gpus is not None), batch_size)
    try:
        existing = load_yaml(out_path.read_text()) if out_path.exists() else None
    except OSError as exc:
        raise click.ClickException(f"{out_path}: cannot read: {exc.strerror}") from None
    doc = merge_into(existing, model, entry, system, len(devices))
    out_path.write_text("# throughput curves; `marble profile` wrote or merged the models it "
                        "measured\n" + yaml.safe_dump(doc, sort_keys=False))
    result = {"model": model, "output": str(out_path), "entry": entry,
              "counts": [r.as_dict() for r in job.results], "resume_s": job.resume_s}

    def text() -> None:
        click.echo(f"{model}: {'GPUs':>4} {'steps/s':>10} {'spread':>7} {'start-up s':>10} "
                   f"{'suspend s':>9} {'took s':>7}")
        for r in job.results:
            click.echo(f"{'':{len(model) + 1}} {r.gpus:>4} {r.steps_per_second:>10.4g} "
                       f"{r.spread:>7.1%} {_num(r.startup_s):>10} {_num(r.suspend_s):>9} "
                       f"{r.wall_s:>7.1f}")
        speeds = entry["steps_per_second"]
        click.echo(f"resumed from a checkpoint: first step after {_num(job.resume_s)} s; "
                   f"wrote {out_path} (model {model}, optimum "
                   f"{gpus_text(speeds.index(max(speeds)) + 1)})")

    output(ctx, as_json, result, text)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


COMMANDS = (curves, profile)
