"""`marble logs`: a job's output, run by run, and following it to the job's end.

Each run of a job (a launch segment: a job suspended and resumed has several) writes
its own STATE_DIR/jobs/<id>/run-<run>.stdout.log and .stderr.log; the broker serves them
a page at a time (GET /v1/jobs/{id}/log), and this command reads them from there, so it
works as well from another node (--url) as on the broker's. Once the broker has stopped,
the same pages come from the state directory (`offline_api.py`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlencode

import click

from marbled.cli.client import BrokerClient
from marbled.cli.common import FINAL, call, job_id, json_option, output, reader


def page(api: BrokerClient, job: int, stream: str, run: int | None = None,
         offset: int = 0, lines: int | None = None, rank: int | None = None) -> dict:
    """One page of a run's log (the latest run's when `run` is None); with `rank`, only that
    rank's lines."""
    query = {"stream": stream, "offset": offset}
    for name, value in (("run", run), ("tail", lines), ("rank", rank)):
        if value is not None:
            query[name] = value
    return call(api.get, f"/v1/jobs/{job}/log?{urlencode(query)}")


def pages(api: BrokerClient, job: int, stream: str, run: int | None,
          lines: int | None, rank: int | None = None) -> Iterator[dict]:
    """A run's log as it is now, page after page (a 10 GB log is never held whole)."""
    doc = page(api, job, stream, run, lines=lines, rank=rank)
    yield doc
    end = doc["size"]  # what there was when asked: a job that prints on is not chased
    while doc["run"] is not None and doc["next_offset"] < end:
        doc = page(api, job, stream, doc["run"]["id"], doc["next_offset"], rank=rank)
        yield doc


def header(run: dict) -> str:
    """'== run 17 (job 5): secondary, 2 GPUs on node0, steps 120 -> 240, suspended ==';
    while it runs, or where the steps it reached are unknown, 'from step 120' (nothing
    from step 0: a command that reports no steps)."""
    ended = run["ended_at"] is not None
    gpus = len(run["gpus"])
    if run["end_step"] is not None:
        steps = f", steps {run['start_step']} -> {run['end_step']}"
    else:
        steps = f", from step {run['start_step']}" if run["start_step"] else ""
    return (f"== run {run['id']} (job {run['job_id']}): {run['role']}, {gpus} "
            f"GPU{'s' if gpus != 1 else ''} on {run['node']}{steps}, "
            f"{(run['end_reason'] or 'ended') if ended else 'running'} ==")


class Printer:
    """The text out: a run's header before its first line (when several runs may show),
    on a line of its own even if the run before ended mid-line."""

    def __init__(self, headers: bool):
        self.headers = headers
        self.shown: int | None = None
        self.at_line_start = True

    def write(self, doc: dict) -> None:
        if doc["run"] is None:
            return
        if self.headers and doc["run"]["id"] != self.shown:
            self._out(("" if self.at_line_start else "\n") + header(doc["run"]) + "\n")
            self.shown = doc["run"]["id"]
        self._out(doc["text"])

    def _out(self, text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.at_line_start = text.endswith("\n")


def follow(api: BrokerClient, job: int, stream: str, run: int | None,
           lines: int | None, interval: float, printer: Printer, from_first: bool,
           rank: int | None = None) -> str:
    """Print the run's log (the latest run's, or with `from_first` the first's) as it grows,
    then each later run's, until the job ends; its final state. `lines` cuts what there
    was at the start (of each run then), not what comes after."""
    doc = page(api, job, stream, run, lines=lines, rank=rank)
    older = set(doc["runs"])
    if from_first and doc["runs"] and doc["runs"][0] != doc["run"]["id"]:
        doc = page(api, job, stream, doc["runs"][0], lines=lines, rank=rank)
    offset = 0
    while True:
        printer.write(doc)
        current, after = doc["run"], None  # after: what to read next without waiting
        if current is not None:
            run, offset = current["id"], doc["next_offset"]
            if offset < doc["size"]:
                after = (run, offset, None)
            elif current["ended_at"] is not None:  # its process has exited: no more output
                later = doc["runs"][doc["runs"].index(run) + 1:]
                if later:
                    after = (later[0], 0, lines if later[0] in older else None)
        if after is None:
            if doc["state"] in FINAL and (current is None or current["ended_at"] is not None) \
                    or getattr(api, "offline", None):  # a stopped broker's: nothing comes
                return doc["state"]
            time.sleep(interval)
            after = (run, offset, None)
        doc = page(api, job, stream, *after, rank=rank)


@click.command()
@click.argument("ref", metavar="JOB")
@click.option("-f", "--follow", "following", is_flag=True,
              help="Keep printing as the job writes, through its suspensions and resumes "
                   "(each new run's output under its header), until the job ends.")
@click.option("--stderr", is_flag=True, help="The job's stderr instead of its stdout.")
@click.option("--run", "run_id", type=click.IntRange(1), metavar="RUN",
              help="This run's output (a run id, as `marble show` lists them) instead of "
                   "the latest run's.")
@click.option("--all-runs", is_flag=True,
              help="Every run's output in turn, each under a header line.")
@click.option("--rank", type=click.IntRange(0), metavar="N",
              help="A per-GPU job (--per-gpu): only rank N's lines, without their "
                   "'[rank N] ' prefix (under Slurm, srun's 'N: ' label).")
@click.option("-n", "--tail", "lines", type=click.IntRange(1), metavar="N",
              help="Only the last N lines (of each run shown). [default: all]")
@click.option("--interval", type=click.FloatRange(0.05), default=0.5, show_default=True,
              help="With -f: seconds between looks for new output.")
@json_option
@click.pass_context
def logs(ctx, ref, following, stderr, run_id, all_runs, rank, lines, interval, as_json):
    """A job's output (JOB: its id or name): its latest run's stdout, or --stderr,
    --run RUN, --all-runs, --rank N.

    \b
      marble logs 5                  what job 5's latest run printed
      marble logs 5 -f               ... and on, through suspensions, until it ends
      marble logs 5 --all-runs -n 20 the last 20 lines of every run, with headers
      marble logs 5 --stderr         why it failed, often
      marble logs 5 --rank 1         rank 1's lines of a per-GPU job

    A job runs anew after each suspension (a run): each run's output is kept
    apart, under STATE_DIR/jobs/<id>/run-<run>.stdout.log and .stderr.log.
    With -f or --all-runs each run's output follows a header line such as
    '== run 17 (job 5): secondary, 2 GPUs on node0, steps 120 -> 240, suspended =='.

    Exit status: 0; with -f, once the job has ended: 0 done, 1 failed or
    cancelled (as `marble wait`).
    """
    if run_id is not None and all_runs:
        raise click.UsageError("give --run RUN or --all-runs, not both")
    as_json = as_json or (ctx.find_root().obj or {}).get("json")
    if following and as_json:
        raise click.UsageError("-f prints text as it comes; leave out --json")
    api = reader(ctx)  # a stopped broker's records when none answers
    job = job_id(api, ref)
    stream = "stderr" if stderr else "stdout"
    printer = Printer(headers=following or all_runs)
    try:
        if following:
            state = follow(api, job, stream, run_id, lines, interval, printer, all_runs, rank)
            ctx.exit(0 if state == "done" else 1)
        latest = pages(api, job, stream, run_id, lines, rank)
        first = next(latest)
        shown = first["runs"] if all_runs else [first["run"]["id"]] if first["run"] else []

        def every() -> Iterator[dict]:  # each run's pages in turn, read as they are printed
            for rid in shown:
                if rid == first["run"]["id"]:
                    yield first
                    yield from latest
                else:
                    yield from pages(api, job, stream, rid, lines, rank)

        if as_json:
            output(ctx, True, _as_json(first, every(), stream), lambda: None)
            return
        if first["run"] is None:
            click.echo(f"job {job} has not run yet ({first['state']})", err=True)
        for doc in every():
            printer.write(doc)
    except BrokenPipeError:  # `marble logs 5 | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        ctx.exit(0)


def _as_json(first: dict, shown: Iterator[dict], stream: str) -> dict:
    runs: dict[int, tuple[dict, list[str]]] = {}
    for doc in shown:
        runs.setdefault(doc["run"]["id"], (doc["run"], []))[1].append(doc["text"])
    return {"job_id": first["job_id"], "state": first["state"], "stream": stream,
            "runs": [{"run": run, "text": "".join(texts)} for run, texts in runs.values()]}


COMMANDS = (logs,)
