"""`marble`: the client of a running broker, and the commands that need none.

Commands by area: `jobs.py` (submit, status, show, explain, cancel, suspend, schedule),
`models.py` (curves), `session.py` (ready, wait, shutdown), `offline.py` (simulate,
trace, demo), `watch.py` (watch), `report.py` (report), `dashboard.py` (dashboard).
"""

from __future__ import annotations

from pathlib import Path

import click

from marbled.cli import dashboard, jobs, models, offline, report, session, watch
from marbled.paths import default_state_dir


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", type=click.Path(path_type=Path), envvar="MARBLE_STATE_DIR",
              help="State directory of the broker to talk to. "
                   "[default: $MARBLE_STATE_DIR, else the allocation's default]")
@click.option("--url", envvar="MARBLE_URL", metavar="URL",
              help="Talk to a broker's TCP listener (marbled --listen; its URL is in "
                   "STATE_DIR/endpoint) instead of its socket, e.g. from another node. "
                   "The token comes from MARBLE_TOKEN or STATE_DIR/token.")
@click.option("--json", "as_json", is_flag=True,
              help="Print every command's result as JSON (as each command's --json does).")
@click.pass_context
def main(ctx: click.Context, state_dir: Path | None, url: str | None, as_json: bool) -> None:
    """Client of the marbled broker.

    \b
    A typical batch script (jobscripts/marble.sbatch is a complete one):
      marbled --detach
      marble submit --model resnet-50 --steps 800 -- python train.py
      marble submit --file jobs.yaml
      marble wait
      marble shutdown
    """
    ctx.obj = {"state_dir": (state_dir or default_state_dir()).absolute(), "url": url,
               "json": as_json}


for _command in (*jobs.COMMANDS, *models.COMMANDS, *session.COMMANDS, *offline.COMMANDS,
                 *watch.COMMANDS, *report.COMMANDS, *dashboard.COMMANDS):
    main.add_command(_command)


if __name__ == "__main__":
    main()
