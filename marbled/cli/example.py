"""`marble example`: the ready scripts that ship in the package, to start a job from."""

from __future__ import annotations

from pathlib import Path

import click

from marbled import examples
from marbled.cli.common import json_option, output


@click.command()
@click.argument("name", required=False)
@click.option("--out", "-o", type=click.Path(path_type=Path), metavar="FILE|DIR",
              help="Write the script to FILE (or into DIR under its own name) instead of "
                   "printing it; a batch script is made executable.")
@click.option("--force", is_flag=True, help="With --out: replace a file that exists.")
@json_option
@click.pass_context
def example(ctx, name, out, force, as_json):
    """Print a ready training or batch script, to start from; with no NAME, list them.

    The training scripts train on synthetic data, run alone or under the broker, and
    can be suspended and resumed on another GPU count: copy one and put your model
    and data in it (docs/training-scripts.md says what the broker needs of a script).

    \b
    Examples:
      marble example                      # the list
      marble example torch > train.py     # PyTorch (tf: TensorFlow and Keras)
      marble example sbatch -o .          # ./marble.sbatch, for: sbatch marble.sbatch jobs.yaml
    """
    if name is None:
        doc = [{"name": key, **ex._asdict(),
                "aliases": [a for a, k in examples.ALIASES.items() if k == key]}
               for key, ex in examples.EXAMPLES.items()]
        output(ctx, as_json, doc, lambda: click.echo(examples.listing()))
        return
    try:
        key, ex = examples.find(name)
    except examples.UnknownExample as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    script = examples.text(key)
    if out is None:
        output(ctx, as_json, {"name": key, **ex._asdict(), "text": script},
               lambda: click.echo(script, nl=False))
        return
    path = out / ex.file if out.is_dir() else out
    if path.exists() and not force:
        raise click.ClickException(f"{path} exists: --force replaces it, or give another "
                                   "--out")
    try:
        path.write_text(script)
        if script.startswith("#!"):
            path.chmod(path.stat().st_mode | 0o111)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from None
    click.echo(f"wrote {path}; run it: {ex.usage.replace(ex.file, str(path))}")


COMMANDS = [example]
