"""`marble dashboard`: the address of the broker's web dashboard, with its token.

A browser talks to the broker's TCP listener (`marbled --listen`), never to its Unix socket:
the address is the listener's URL (STATE_DIR/endpoint, or --url) with /dashboard/ and the
token (STATE_DIR/token, or MARBLE_TOKEN) in the fragment, which the browser keeps to itself.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import quote, urlsplit

import click

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable
from marbled.cli.common import json_option, output
from marbled.paths import ENDPOINT_NAME, TOKEN_NAME, socket_path

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _no_listener(state_dir: Path) -> str:
    start = ("start it as 'marbled --listen 127.0.0.1:0' (this node only: reach it through "
             "ssh port forwarding) or 'marbled --listen 0' (every interface); a request for "
             "data needs the broker's token either way")
    if socket_path(state_dir).exists():
        return (f"the broker of {state_dir} has no TCP listener, and a browser cannot use its "
                "Unix socket. A running broker cannot add one: 'marble shutdown' suspends its "
                f"jobs to their checkpoints, then {start}; it resumes them")
    return f"no broker runs on {state_dir}: {start}"


def _tunnel_hint(endpoint: str, address: str) -> str:
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "", parts.port or 80
    local = address.replace(f"{parts.scheme}://{parts.netloc}", f"http://localhost:{port}", 1)
    if host in LOCAL_HOSTS:
        how = f"ssh -J LOGIN_NODE -L {port}:127.0.0.1:{port} {socket.gethostname()}"
    else:
        how = f"ssh -L {port}:{host}:{port} LOGIN_NODE"
    return (f"The address holds the broker's token: keep it to yourself.\n"
            f"From a machine outside the allocation, forward the port first:\n"
            f"  {how}\nthen open {local}")


@click.command()
@json_option
@click.pass_context
def dashboard(ctx, as_json):
    """Print the address of the broker's web dashboard, with its token.

    \b
    The broker serves the dashboard on its TCP listener (marbled --listen):
    the GPU timeline, the queue, each job's progress, runs and events, updated
    every 1.5 s. Open the address in a browser, e.g. through an ssh tunnel
    (the hint on stderr says how). A new broker means a new token: ask again.
    """
    root = ctx.find_root().obj
    state_dir = root["state_dir"]
    endpoint = root["url"] or _read(state_dir / ENDPOINT_NAME)
    if endpoint is None:
        raise click.ClickException(_no_listener(state_dir))
    token = os.environ.get("MARBLE_TOKEN") or _read(state_dir / TOKEN_NAME)
    if token is None:
        raise click.ClickException(
            f"the dashboard at {endpoint} needs the broker's token: set MARBLE_TOKEN, or point "
            f"--state-dir at its state directory (it reads {TOKEN_NAME} there)")
    try:  # the listener answers, and to this token
        status = BrokerClient(url=endpoint, token=token, timeout=10).get("/v1/status")
    except ApiError as exc:
        raise click.ClickException(f"the broker at {endpoint} refused its token ({exc.status}): "
                                   f"{exc}") from None
    except (BrokerUnreachable, OSError) as exc:
        raise click.ClickException(f"no broker answers at {endpoint} ({exc}); is it still "
                                   "running? 'marble ready' says") from None
    address = f"{endpoint.rstrip('/')}/dashboard/#token={quote(token, safe='')}"

    def text() -> None:
        click.echo(address)
        click.echo(_tunnel_hint(endpoint, address), err=True)

    output(ctx, as_json, {"url": address, "endpoint": endpoint, "pid": status.get("pid")}, text)


COMMANDS = (dashboard,)
