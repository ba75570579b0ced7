"""`marble` commands for a batch script's session with its broker: ready, wait, shutdown."""

from __future__ import annotations

import sys
import time
from collections import Counter

import click

from marbled.cli.client import MAX_WAIT_JOBS, BrokerClient, BrokerUnreachable
from marbled.cli.common import FINAL, call, client, job_id, json_option, output
from marbled.core.shapes import UNFIT_WAIT


@click.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Give up after this many seconds.")
@json_option
@click.pass_context
def ready(ctx, timeout, as_json):
    """Wait until a broker answers on the state directory (after 'marbled &' in a script).

    Exit status: 0 once it answers, 1 if none does within --timeout.
    """
    api = client(ctx)
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = api.get("/v1/status")
            break
        except (BrokerUnreachable, OSError) as exc:
            if time.monotonic() > deadline:
                raise click.ClickException(f"no broker answered within {timeout:g} s: {exc}") \
                    from None
            time.sleep(0.1)
    from marbled.core.target import gpus_text

    nodes = ", ".join(f"{n}: {gpus_text(len(v['gpus']))}" for n, v in status["nodes"].items())
    output(ctx, as_json, status, lambda: click.echo(f"marbled {status['pid']} ready ({nodes})"))


PROGRESS_S = 10.0  # seconds between progress lines (not on a terminal)


@click.command()
@click.argument("refs", metavar="[JOB]...", nargs=-1)
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Give up after this many seconds (exit status 2).")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between updates of the progress bar on a terminal; elsewhere, "
                   f"between progress lines (at least {PROGRESS_S:g}). The wait ends as the "
                   "last job ends, whatever the interval.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@json_option
@click.pass_context
def wait(ctx, refs, timeout, interval, quiet, as_json):
    """Wait until every job has ended, or each JOB (ids or names), showing progress.

    The broker answers the moment the last one ends (a long poll, GET /v1/wait): a batch
    script goes on at once, and a wait costs the broker nothing however many jobs it has
    seen. With --json, the jobs at the end (as GET /v1/jobs shows them).

    \b
    Examples:
      marble wait                        # every job, as a batch script's last step
      marble wait prepare 17             # the job named 'prepare' and job 17

    Exit status: 0 all done, 1 some failed or were cancelled, 2 timed out, 3 the
    broker stopped before they ended (it drained, or was killed): a note says which,
    not an error; 4 the others done, some left that this allocation can never hold
    (a larger one queued them: they stay queued, and a note says why).
    """
    api = client(ctx)
    ids = list(dict.fromkeys(job_id(api, ref) for ref in refs))
    wait_for(ctx, api, ids, timeout, interval, quiet, as_json)


def wait_for(ctx: click.Context, api: BrokerClient, ids: list[int], timeout: float | None,
             interval: float, quiet: bool, as_json: bool) -> None:
    """`marble wait`'s wait for the jobs `ids` (every job: none), also `marble submit
    --wait`'s; exits with its status. The broker waits for 300 ids at most (a request
    line's), so more are waited for 300 at a time: all have ended once each part has."""
    parts = [ids[i:i + MAX_WAIT_JOBS] for i in range(0, len(ids), MAX_WAIT_JOBS)] or [[]]
    start, since = time.monotonic(), time.time()
    bar = _Bar() if sys.stderr.isatty() and not quiet else None
    every = interval if bar else max(interval, PROGRESS_S)  # between progress updates
    last_line = -every
    answered = False  # the broker has answered: if it stops now, it has stopped under us
    drain_seen = False  # an answer said it drains

    def poll(path: str) -> dict:
        nonlocal drain_seen
        try:
            answer = api.get(path)
        except (BrokerUnreachable, ConnectionError) as exc:
            if not answered:
                raise
            if bar:
                bar.stop()
            _stopped(ctx, as_json, exc, drain_seen, since)
        drain_seen |= bool(answer.get("draining"))
        return answer

    wanted = set(ids)
    settled: Counter = Counter()  # the states of the parts waited for already
    unfit: dict[str, str] = {}  # the jobs waited for that this allocation cannot hold
    try:
        for n, part in enumerate(parts):
            named = "".join(f"&job={i}" for i in part)
            last_part = n == len(parts) - 1
            hold = 0.0  # the first answer at once: the wait starts with a progress line
            while True:
                answer = call(poll, f"/v1/wait?timeout={hold:g}{named}")
                answered = True
                if answer["ended"]:
                    unfit.update(answer.get("cannot_run") or {})
                if answer["ended"] and not last_part:
                    settled.update(answer["jobs"])
                    break
                counts = settled + Counter(answer["jobs"])
                total = len(ids) or sum(counts.values())
                ended = sum(counts.get(s, 0) for s in FINAL)
                now = time.monotonic()
                states = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                if bar:  # the steps of the jobs not ended when the wait began: O(live jobs)
                    shown = call(poll, f"/v1/jobs?since={since!r}")["jobs"]
                    bar.show([j for j in shown if j["id"] in wanted] if ids else shown,
                             f"{ended}/{total} ended  {states}")
                elif not quiet and (now - last_line >= every or answer["ended"]):
                    click.echo(f"[{now - start:6.1f}s] {ended}/{total} ended  {states}",
                               err=True)
                    last_line = now
                if answer["ended"]:
                    if bar:
                        bar.stop()
                    if as_json:
                        output(ctx, as_json, {"jobs": _views(api, ids)}, lambda: None)
                    for job, why in unfit.items():
                        click.echo(f"note: job {job} cannot run in this allocation: {why}; "
                                   f"{UNFIT_WAIT}", err=True)
                    done = counts.get("done", 0)
                    ctx.exit(0 if done == total else 4 if unfit and done + len(unfit) == total
                             else 1)
                if timeout is not None and now - start >= timeout:
                    if bar:
                        bar.stop()
                    click.echo(f"timed out after {timeout:g} s with {total - ended} jobs not "
                               "ended", err=True)
                    ctx.exit(2)
                if answer["draining"]:  # answered at once until it stops: its records say
                    time.sleep(min(interval, 1.0))
                left = float("inf") if timeout is None else timeout - (time.monotonic() - start)
                # (held well within the client's own timeout for an answer)
                hold = max(min(every, left, api.timeout / 2), 0.0)
    finally:
        if bar:
            bar.stop()


def _views(api: BrokerClient, ids: list[int]) -> list[dict]:
    """The jobs `ids` as GET /v1/jobs shows them, in FIFO order (every job: none named),
    read in pages from the first named to the last."""
    if not ids:
        return call(api.get, "/v1/jobs")["jobs"]
    wanted, views, after = set(ids), [], min(ids) - 1
    while after is not None and after < max(ids):
        page = call(api.get, f"/v1/jobs?after={after}&limit=1000")
        views += [j for j in page["jobs"] if j["id"] in wanted]
        after = page["next"]
    return views


def _stopped(ctx: click.Context, as_json: bool, exc: Exception, drain_seen: bool,
             since: float) -> None:
    """The broker stopped while `marble wait` waited: what its records say, as a note, not
    an error (a drain, at the allocation's end or a shutdown, is a batch script's normal
    end); exit status 0 or 1 if every job had ended, else 3. Whether it drained: an answer
    said so, or its records hold a drain since the wait began; else it was killed or
    failed."""
    from marbled.cli.offline_api import NoRecords, OfflineApi  # only now: no broker answers

    root = ctx.find_root().obj
    try:
        records = OfflineApi(root["state_dir"])
    except NoRecords:
        click.echo(f"marble wait: the broker stopped before every job ended ({exc})", err=True)
        ctx.exit(3)
    try:
        jobs = records.get("/v1/jobs")["jobs"]
        drained = drain_seen or records.drained_since(since)
    finally:
        records.close()
    left = [j for j in jobs if j["state"] not in FINAL]
    if not left:
        output(ctx, as_json, {"jobs": jobs}, lambda: None)
        ctx.exit(0 if all(j["state"] == "done" for j in jobs) else 1)
    how = "(it drained)" if drained else \
        "without draining (killed, or it failed: its log says which)"
    click.echo(f"marble wait: the broker stopped {how} with {len(left)} of {len(jobs)} "
               "jobs not ended; a marbled started on this state directory carries on "
               "('marble status' shows them)", err=True)
    output(ctx, as_json, {"jobs": jobs, "stopped": True}, lambda: None)
    ctx.exit(3)


class _Bar:
    """On a terminal: one progress bar of the steps trained over all jobs with a step
    count (rich is imported only here: `marble` commands start faster without it)."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.percentage:>3.0f}% of the steps"),
                                 TimeElapsedColumn(), console=Console(stderr=True),
                                 transient=False)
        self.task = self.progress.add_task("", total=None)
        self.progress.start()

    def show(self, jobs: list[dict], description: str) -> None:
        total = sum(j["steps"] or 0 for j in jobs)
        done = sum(min(j["step"] or 0, j["steps"] or 0) if j["state"] != "done"
                   else j["steps"] or 0 for j in jobs)
        self.progress.update(self.task, description=description, total=total or None,
                             completed=done)

    def stop(self) -> None:
        self.progress.stop()


@click.command()
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for the stop.")
@click.option("--timeout", type=float, default=300.0, show_default=True)
@json_option
@click.pass_context
def shutdown(ctx, no_wait, timeout, as_json):
    """Suspend every running job to its checkpoint and stop the broker.

    Nothing is lost: a marbled started later on the same state directory
    resumes the suspended jobs and runs the rest of the queue.
    """
    api = client(ctx)
    pid = call(api.get, "/v1/status")["pid"]
    call(api.post, "/v1/shutdown")
    if no_wait:
        output(ctx, as_json, {"pid": pid, "stopped": False},
               lambda: click.echo("shutdown started"))
        return
    deadline = time.monotonic() + timeout
    # Over TCP the broker may be on another host: wait until it stops answering instead.
    while _answers(api) if ctx.find_root().obj["url"] else _process_exists(pid):
        if time.monotonic() > deadline:
            raise click.ClickException(f"marbled {pid} did not stop within {timeout:g} s")
        time.sleep(0.1)
    output(ctx, as_json, {"pid": pid, "stopped": True}, lambda: click.echo("marbled stopped"))


def _answers(api: BrokerClient) -> bool:
    try:
        api.get("/v1/status")
    except (BrokerUnreachable, OSError):
        return False
    return True


def _process_exists(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped by its parent) has stopped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


COMMANDS = (ready, wait, shutdown)
