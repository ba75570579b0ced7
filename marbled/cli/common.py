"""What every `marble` command shares: finding the broker, calling it, and printing.

click is imported where a function needs it (an error to raise, an option to declare), not
here: the everyday forms of `marble submit`, `status`, `logs` and `cancel` run without it
(`quick.py`)."""

from __future__ import annotations

import json
import os
import sys

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable
from marbled.paths import TOKEN_NAME, socket_path

TYPE_CHECKING = False  # typing's, without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import click

FINAL = {"done", "failed", "cancelled"}


def client(ctx: click.Context) -> BrokerClient:
    """The broker of the state directory (its socket), or the one at --url (with its token)."""
    root = ctx.find_root().obj
    try:
        return broker_at(root["state_dir"], root["url"])
    except NoToken as exc:
        import click

        raise click.ClickException(str(exc)) from None


class NoToken(RuntimeError):
    pass


def broker_at(state_dir: Path, url: str | None) -> BrokerClient:
    """The broker of `state_dir` (its socket), or the one at `url` with its token (from
    MARBLE_TOKEN, else the state directory's); NoToken if there is none."""
    if not url:
        return BrokerClient(socket_path(state_dir))
    token = os.environ.get("MARBLE_TOKEN")
    if token is None:
        try:
            token = (state_dir / TOKEN_NAME).read_text().strip()
        except OSError:
            raise NoToken("--url needs the broker's token: set MARBLE_TOKEN, or point "
                          f"--state-dir at its state directory (it reads {TOKEN_NAME} "
                          "there)") from None
    return BrokerClient(url=url, token=token)


class Reader:
    """The broker, for the commands that only read (status, show, explain, logs, schedule);
    when none answers (no socket, or nobody listens on it: not a broker that answers with
    an error), the records a stopped broker left in the state directory, read-only
    (`offline_api.py`, imported only then). Which one is chosen at the first request, and
    kept: a command reads one or the other, never both."""

    def __init__(self, api: BrokerClient, state_dir):
        self.api, self.state_dir = api, state_dir
        self.offline = None  # the OfflineApi, once no broker answered
        self.live = False  # a broker has answered

    def get(self, path: str) -> dict:
        if self.offline is not None:
            return self.offline.get(path)
        try:
            answer = self.api.get(path)
        except BrokerUnreachable as exc:
            if self.live:
                raise
            from marbled.cli.offline_api import NoRecords, OfflineApi

            try:
                self.offline = OfflineApi(self.state_dir)
            except NoRecords as why:
                raise BrokerUnreachable(f"{exc} ({why})") from None
            print(self.offline.note, file=sys.stderr, flush=True)
            return self.offline.get(path)
        self.live = True
        return answer

    def get_many(self, paths: list[str]) -> list[dict]:
        """`BrokerClient.get_many` while a broker answers; else each from the records."""
        if self.offline is None:
            try:
                answers = self.api.get_many(paths)
            except BrokerUnreachable:
                if self.live:
                    raise
            else:
                self.live = True
                return answers
        return [self.get(path) for path in paths]  # the first looks for the records

    def post(self, path: str, body: object | None = None) -> dict:
        return (self.offline or self.api).post(path, body)


def reader(ctx: click.Context) -> Reader:
    """`client(ctx)` for a command that only reads: the records when no broker answers."""
    return Reader(client(ctx), ctx.find_root().obj["state_dir"])


def call(fn: Callable, *args, place: Callable[[str | None], str | None] = lambda f: None):
    """A request to the broker; its refusal or absence as a one-line error. `place`: where
    the field a refusal names was read (e.g. 'jobs.yaml:3'), to say first; None if unknown."""
    import click

    try:
        return fn(*args)
    except (BrokerUnreachable, ApiError) as exc:
        raise click.ClickException(error_text(exc, place)) from None


def error_text(exc: BrokerUnreachable | ApiError,
               place: Callable[[str | None], str | None] = lambda f: None) -> str:
    """`call`'s one line for a broker that does not answer, or a refusal."""
    if isinstance(exc, BrokerUnreachable):
        return str(exc)
    where = place(exc.field)
    return f"refused ({exc.status}): " + (f"{where}: " if where else "") + str(exc)


def job_id(api: BrokerClient, ref: str) -> int:
    """The id of the job `ref` names: a job id, or a job name (the last job so named, as
    --after reads it); a name no job has is an error that says so."""
    found = call(named_id, api, ref)
    if found is None:
        import click

        raise click.ClickException(no_such_name(ref))
    return found


def named_id(api: BrokerClient, ref: str) -> int | None:
    """`job_id` without click: the id `ref` gives or names; None for a name no job has."""
    if ref.isascii() and ref.isdigit():
        return int(ref)
    from urllib.parse import quote

    named = api.get(f"/v1/jobs?name={quote(ref, safe='')}")["jobs"]
    return named[-1]["id"] if named else None


def no_such_name(ref: str) -> str:
    return f"no job is named '{ref}' (give a job id or name; 'marble status --all' lists them)"


def json_option(command: Callable) -> Callable:
    """`--json` on a command: its result is printed as JSON for scripts (so is every
    command's with `marble --json COMMAND`)."""
    import click

    return click.option("--json", "as_json", is_flag=True,
                        help="Print the result as JSON (for scripts).")(command)


def profiled_option(command: Callable) -> Callable:
    """`--profiled`: times in the emulated clock instead of real seconds."""
    import click

    return click.option(
        "--profiled", is_flag=True,
        help="Times in profiled seconds (real seconds / marbled's --time-scale), as the "
             "profile and the simulator count them; for emulated jobs only.")(command)


def duration(seconds: float | None) -> str:
    """12s, 3m05s, 2h14m, 3d04h: short, for tables; '-' when unknown."""
    if seconds is None:
        return "-"
    s = round(seconds)
    for unit, size, small, small_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                          ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // small_size:02d}{small}"
    return f"{s}s"


def eta_text(job: dict, forecast: dict, ends: dict | None = None) -> str:
    """A running job's time left at its own speed; else when the forecast (GET
    /v1/forecast) says it ends, marked '~' (simulated). `ends`: the forecast's end of each
    job by id, for a caller that formats many jobs."""
    if job.get("eta_s") is not None:
        return duration(job["eta_s"])
    end = ends.get(job["id"]) if ends is not None else \
        next((f["end_at"] for f in forecast["jobs"] if f["id"] == job["id"]), None)
    return "-" if end is None else "~" + duration(end - forecast["at"])


def forecast_text(forecast: dict) -> str:
    if forecast["finish_at"] is not None and forecast["jobs"]:
        return f"queue ends in ~{duration(forecast['finish_at'] - forecast['at'])} " \
               "(simulated from now)"
    return f"no forecast: {forecast['reason']}" if forecast["reason"] else ""


def left_out_text(forecast: dict, most: int = 3) -> str:
    """Which jobs the forecast leaves out and why (GET /v1/forecast's `left_out`), or ''."""
    out = forecast.get("left_out") or []
    if not out:
        return ""
    named = ", ".join(f"job {j['id']} ({j['why']})" for j in out[:most])
    count = forecast.get("left_out_count", len(out))  # the list names the first 50 only
    more = f" and {count - most} more" if count > most else ""
    return f"the forecast leaves out {named}{more}"


def output(ctx: click.Context, as_json: bool, doc: object, text: Callable[[], None]) -> None:
    """Print `doc` as JSON if asked (here or on `marble`), else call `text` to print it."""
    if as_json or (ctx.find_root().obj or {}).get("json"):
        print_json(doc)
    else:
        text()


def print_json(doc: object) -> int:
    """`--json`'s output of `doc`; exit status 0."""
    print(json.dumps(doc, indent=2, sort_keys=True), flush=True)
    return 0


def say_error(exc: BrokerUnreachable | ApiError) -> int:
    """A broker's absence or refusal said as click says a ClickException (`call`), without
    click; exit status 1."""
    print(f"Error: {error_text(exc)}", file=sys.stderr, flush=True)
    return 1
