"""`marble`: the client of a running broker, and the commands that need none.

Commands by area: `jobs.py` (submit, status, show, explain, cancel, suspend, schedule),
`models.py` (curves), `session.py` (ready, wait, shutdown), `offline.py` (simulate,
trace, demo), `watch.py` (watch), `logs.py` (logs), `report.py` (report), `dashboard.py`
(dashboard), `example.py` (example).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

from marbled.cli.entry import without_collections
from marbled.paths import default_state_dir

# Each command's module, imported only when the command runs (or help lists them all): a
# `marble submit` in a shell loop pays for what submit needs, not for the simulator's
# imports (the `--help` listing and `main.commands` import every module).
MODULES = {
    "submit": "jobs", "status": "jobs", "show": "jobs", "explain": "jobs", "cancel": "jobs",
    "suspend": "jobs", "schedule": "jobs", "curves": "models", "profile": "models",
    "ready": "session", "wait": "session", "shutdown": "session", "simulate": "offline",
    "trace": "offline", "demo": "offline", "watch": "watch", "report": "report",
    "dashboard": "dashboard", "logs": "logs", "example": "example",
}


class LazyGroup(click.Group):
    """A group whose commands are imported from their modules (MODULES) when needed."""

    @property
    def commands(self) -> dict[str, click.Command]:
        for name in MODULES:
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value) -> None:
        self._commands = dict(value or {})

    def _load(self, name: str) -> click.Command | None:
        if name not in self._commands and name in MODULES:
            with without_collections():
                module = importlib.import_module(f"marbled.cli.{MODULES[name]}")
            self._commands[name] = next(c for c in module.COMMANDS if c.name == name)
        return self._commands.get(name)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._load(name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self._commands) | set(MODULES))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    A typical batch script (`marble example sbatch` prints a complete one):
      marbled --detach
      marble submit --model resnet-50 --steps 800 -- python train.py
      marble submit --file jobs.yaml
      marble wait
      marble shutdown

    Once the broker has stopped, status, show, explain, logs and schedule read
    the records it left in the state directory (read-only), and say so.
    """
    ctx.obj = {"state_dir": (state_dir or default_state_dir()).absolute(), "url": url,
               "json": as_json}


if __name__ == "__main__":  # python -m marbled.cli.client_cmd: as the `marble` script
    from marbled.cli.entry import quick

    quick()
    main()
