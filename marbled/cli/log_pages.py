"""`marble logs`' reading and printing of a job's output (GET /v1/jobs/{id}/log, a page at
a time), run by run, and following it to the job's end, without click: the command is
`logs.py`, and `quick.py` runs its everyday form without importing click."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlencode

from marbled.cli.client import BrokerClient
from marbled.cli.common import FINAL


def page(api: BrokerClient, job: int, stream: str, run: int | None = None,
         offset: int = 0, lines: int | None = None, rank: int | None = None) -> dict:
    """One page of a run's log (the latest run's when `run` is None); with `rank`, only that
    rank's lines."""
    query = {"stream": stream, "offset": offset}
    for name, value in (("run", run), ("tail", lines), ("rank", rank)):
        if value is not None:
            query[name] = value
    return api.get(f"/v1/jobs/{job}/log?{urlencode(query)}")


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
        self.printed = False  # anything yet

    def write(self, doc: dict) -> None:
        if doc["run"] is None:
            return
        if self.headers and doc["run"]["id"] != self.shown:
            self._out(("" if self.at_line_start else "\n") + header(doc["run"]) + "\n")
            self.shown = doc["run"]["id"]
        self._out(doc["text"])

    def _out(self, text: str) -> None:
        if text:
            self.printed = True
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


def show(api: BrokerClient, job: int, stream: str, run_id: int | None, all_runs: bool,
         rank: int | None, lines: int | None, printer: Printer | None) -> dict | None:
    """Print the job's output as it is now: its latest run's (or run `run_id`'s, or with
    `all_runs` every run's, each under its header), `lines` the last lines of each; or, for
    `printer` None, give it as `marble logs --json` prints it."""
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

    if printer is None:
        return _as_json(first, every(), stream)
    if first["run"] is None:
        print(f"job {job} has not run yet ({first['state']})", file=sys.stderr, flush=True)
    for doc in every():
        printer.write(doc)
    return None


def quiet_pipe() -> None:
    """`marble logs 5 | head`: the reader has what it wanted; no error at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _as_json(first: dict, shown: Iterator[dict], stream: str) -> dict:
    runs: dict[int, tuple[dict, list[str]]] = {}
    for doc in shown:
        runs.setdefault(doc["run"]["id"], (doc["run"], []))[1].append(doc["text"])
    return {"job_id": first["job_id"], "state": first["state"], "stream": stream,
            "runs": [{"run": run, "text": "".join(texts)} for run, texts in runs.values()]}
