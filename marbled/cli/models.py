"""`marble` commands about models: the curves a broker believes."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from marbled.cli.common import call, client, json_option, output
from marbled.core.learning import Learning
from marbled.core.profiles import ProfileError
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
        lines.append(f"\n{m['model']}: optimum {m['optimum']} GPUs (profile: "
                     f"{m['profile_optimum']}), next run on {m['next_count']}{flag}")
        lines.append(f"  {'GPUs':>4} {'profile':>9} {'measured':>9} {'runs':>5} "
                     f"{'estimate':>9}  source")
        for c in m["counts"]:
            lines.append(f"  {c['gpus']:>4} {num(c['profile']):>9} {num(c['measured']):>9} "
                         f"{c['samples']:>5} {num(c['estimate']):>9}  {c['source']}")
        costs = [f"{k} {m[k]:.3g} s" for k in ("startup_s", "suspend_s") if m[k] is not None]
        if costs:
            lines.append("  costs: " + ", ".join(costs))
    return "\n".join(lines)


COMMANDS = (curves,)
