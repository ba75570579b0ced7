"""What every `marble` command shares: finding the broker, calling it, and printing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import click

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable
from marbled.paths import TOKEN_NAME, socket_path

FINAL = {"done", "failed", "cancelled"}


def client(ctx: click.Context) -> BrokerClient:
    """The broker of the state directory (its socket), or the one at --url (with its token)."""
    root = ctx.find_root().obj
    if root["url"]:
        token = os.environ.get("MARBLE_TOKEN")
        if token is None:
            try:
                token = (root["state_dir"] / TOKEN_NAME).read_text().strip()
            except OSError:
                raise click.ClickException(
                    "--url needs the broker's token: set MARBLE_TOKEN, or point --state-dir "
                    f"at its state directory (it reads {TOKEN_NAME} there)") from None
        return BrokerClient(url=root["url"], token=token)
    return BrokerClient(socket_path(root["state_dir"]))


def call(fn: Callable, *args):
    """A request to the broker; its refusal or absence as a one-line error."""
    try:
        return fn(*args)
    except BrokerUnreachable as exc:
        raise click.ClickException(str(exc)) from None
    except ApiError as exc:
        raise click.ClickException(f"refused ({exc.status}): {exc}") from None


def json_option(command: Callable) -> Callable:
    """`--json` on a command: its result is printed as JSON for scripts (so is every
    command's with `marble --json COMMAND`)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON (for scripts).")(command)


def output(ctx: click.Context, as_json: bool, doc: object, text: Callable[[], None]) -> None:
    """Print `doc` as JSON if asked (here or on `marble`), else call `text` to print it."""
    if as_json or (ctx.find_root().obj or {}).get("json"):
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        text()
