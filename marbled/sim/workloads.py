"""Workloads for the simulator: job-set files, Poisson arrivals and CSV traces.

A workload is a list of `Arrival(at, spec)`: `at` is the submit time in seconds
from the start of the workload and `spec` is the `JobSpec` submitted then. Lists
are in order of `at` (non-decreasing).

Sources:

* `from_job_file(path)`: a job-set file (`workloads/paper-jobset*.yaml`), every
  job at t = 0;
* `poisson(...)`: a synthetic stream, Poisson arrivals of emulated jobs;
* `read_trace(path)`: a CSV trace (below); `write_trace` writes one;
* `trace_from_store(db_path)`: the jobs submitted to a broker, from its SQLite file.

CSV trace format (UTF-8, see docs/traces.md)::

    # lines whose first cell starts with '#' are comments; blank lines are skipped
    arrival,model,steps,gpus,name
    0,resnet-50,9000,,
    12.5,inception-v3,1200,auto,inc-a
    30,vgg-16,4800,2,rigid-vgg

* the first non-comment line is the header; it names the columns, in any
  order: `arrival`, `model` and `steps` are required, `gpus`, `name` and
  `nodes` may be left out; any other column is an error;
* `arrival`: seconds from the start of the trace, a number >= 0; rows must be
  in order of arrival (non-decreasing), an earlier time than the row above is
  an error rather than being sorted silently;
* `model`, `steps`: the model (a name of the profile, e.g. resnet-50) and the
  number of training steps; every row is an emulated job (`emulate: true`);
* `gpus`: empty or `auto` for the profile's optimal count (a malleable job), or
  a whole number of GPUs (a rigid job);
* `name`: optional job name (empty for none);
* `nodes`: empty for 1, a whole number of nodes, or a range `MIN-MAX` (as a job
  file's `nodes`; `gpus` is then the count on each node).

Each row is checked by `JobSpec.from_mapping`, the same rules as `marble submit`
and the API; a bad row raises `TraceError` naming file, line and column, e.g.
``trace.csv:7: steps: must be a whole number from 1 to 1000000000000``.
"""

from __future__ import annotations

import csv
import math
import random
import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, NoReturn

from marbled.core.spec import MAX_STEPS, JobSpec, SpecError
from marbled.resources import read_job_file

COLUMNS = ("arrival", "model", "steps", "gpus", "name", "nodes")
REQUIRED_COLUMNS = ("arrival", "model", "steps")
_INT = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class Arrival:
    """`spec` is submitted `at` seconds after the start of the workload; `where` says where
    it was read ('FILE:LINE'), for errors found later."""

    at: float
    spec: JobSpec
    where: str | None = field(default=None, compare=False)


class TraceError(ValueError):
    """A trace that cannot be read; the message names file, line and column."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        super().__init__(message)
        self.path = path
        self.line = line
        self.field = field


# ---------------------------------------------------------------- job-set files


def from_job_file(path: str | Path) -> list[Arrival]:
    """A job-set file (see `marbled.resources.load_job_file`) with every job arriving at t = 0."""
    return [Arrival(0.0, spec, where) for where, spec in read_job_file(Path(path))]


# ---------------------------------------------------------------- Poisson arrivals


def poisson(
    n: int,
    rate_per_hour: float,
    mix: Mapping[str, float],
    steps: tuple[int, int] | Mapping[str, tuple[int, int]],
    seed: int,
    gpus_request_share: float = 0.0,
    *,
    max_gpus: int = 6,
) -> list[Arrival]:
    """`n` emulated jobs arriving as a Poisson process of `rate_per_hour` jobs per hour.

    * arrivals: the gaps between jobs are exponential with mean 3600 / rate_per_hour
      seconds; the process starts at t = 0, so the first job arrives after one gap;
    * model: drawn from `mix`, a mapping of model name to weight (weights need not
      sum to 1; a weight of 0 never draws that model);
    * steps: drawn *uniformly* among the whole numbers of the inclusive range
      `(low, high)`; give one range for all models or a mapping of model to range
      covering every model of `mix`;
    * gpus: a share `gpus_request_share` (0..1) of the jobs are rigid, with an explicit
      GPU request drawn uniformly from 1..`max_gpus`; the others are auto (malleable).

    The result depends only on the arguments: the same seed gives the same list.
    Every job draws its gap, model, steps, rigid-or-not and GPU count in that order
    from one `random.Random(seed)`, so changing `gpus_request_share` changes which
    jobs are rigid but keeps all arrival times, models and step counts.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError("n: must be a whole number of jobs >= 0")
    if not _positive(rate_per_hour):
        raise ValueError("rate_per_hour: must be a number > 0")
    models = list(mix)
    weights = [mix[m] for m in models]
    if not models:
        raise ValueError("mix: give at least one model with a weight > 0")
    for m, w in zip(models, weights, strict=True):
        if not isinstance(m, str) or not m.strip():
            raise ValueError(f"mix: model names must be non-empty strings, not {m!r}")
        if isinstance(w, bool) or not isinstance(w, int | float) or not (0 <= w < math.inf):
            raise ValueError(f"mix: weight of '{m}' must be a number >= 0")
    if sum(weights) <= 0:
        raise ValueError("mix: give at least one model with a weight > 0")
    if isinstance(steps, Mapping):
        missing = [m for m in models if m not in steps]
        extra = sorted(set(steps) - set(models))
        if missing:
            raise ValueError(f"steps: no range for '{missing[0]}' (give one for every model)")
        if extra:
            raise ValueError(f"steps: '{extra[0]}' is not a model of the mix")
        ranges = {m: _steps_range(steps[m], m) for m in models}
    else:
        both = _steps_range(steps, None)
        ranges = dict.fromkeys(models, both)
    share = gpus_request_share
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise ValueError("gpus_request_share: must be a number from 0 to 1")
    if isinstance(max_gpus, bool) or not isinstance(max_gpus, int) or max_gpus < 1:
        raise ValueError("max_gpus: must be a whole number >= 1")

    rng = random.Random(seed)
    lam = rate_per_hour / 3600.0
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(lam)
        model = rng.choices(models, weights)[0]
        low, high = ranges[model]
        count = rng.randint(low, high)
        rigid = rng.random() < share
        gpus = rng.randint(1, max_gpus)
        out.append(Arrival(t, JobSpec(emulate=True, model=model, steps=count,
                                      gpus=gpus if rigid else None)))
    return out


def _positive(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and 0 < x < math.inf


def _steps_range(r: object, model: str | None) -> tuple[int, int]:
    where = "steps" if model is None else f"steps of '{model}'"
    if (
        not isinstance(r, tuple | list)
        or len(r) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)
        or not 1 <= r[0] <= r[1] <= MAX_STEPS
    ):
        raise ValueError(f"{where}: must be a range (low, high) of whole numbers, "
                         f"1 <= low <= high <= {MAX_STEPS}")
    return (r[0], r[1])


# ---------------------------------------------------------------- CSV traces


def read_trace(path: str | Path) -> list[Arrival]:
    """Read a CSV trace (format in the module docstring); TraceError names file:line: column."""
    src = str(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(_rows(f, src))
    except OSError as exc:
        raise TraceError(f"{src}: cannot read: {exc.strerror}", path=src) from None
    except UnicodeDecodeError:
        raise TraceError(f"{src}: not UTF-8 text", path=src) from None
    if not rows:
        raise TraceError(f"{src}: empty; the first line must be a header such as "
                         f"'{','.join(COLUMNS)}'", path=src)

    header_line, header = rows[0]
    columns = [c.strip() for c in header]
    for c in columns:
        if c not in COLUMNS:
            _fail(src, header_line, c or "header",
                  f"unknown column; known columns are {', '.join(COLUMNS)}")
        if columns.count(c) > 1:
            _fail(src, header_line, c, "column named twice")
    for c in REQUIRED_COLUMNS:
        if c not in columns:
            _fail(src, header_line, c, "missing column; the header must name at least "
                  f"{', '.join(REQUIRED_COLUMNS)}")

    arrivals: list[Arrival] = []
    previous = 0.0
    for line, row in rows[1:]:
        if len(row) != len(columns):
            _fail(src, line, "row", f"has {len(row)} values but the header names "
                  f"{len(columns)} columns ({','.join(columns)})")
        cell = {c: v.strip() for c, v in zip(columns, row, strict=True)}
        try:
            at = float(cell["arrival"])
        except ValueError:
            at = math.nan
        if not 0 <= at < math.inf:
            _fail(src, line, "arrival", f"must be a number of seconds >= 0 from the start "
                  f"of the trace, not '{cell['arrival']}'")
        if at < previous:
            _fail(src, line, "arrival", f"{at:g} is earlier than the row above ({previous:g}); "
                  "rows must be in order of arrival (non-decreasing)")
        previous = at
        gpus = cell.get("gpus", "")
        doc = {
            "emulate": True,
            "model": cell["model"] or None,
            "steps": _int_or_text(cell["steps"]) if cell["steps"] else None,
            "gpus": "auto" if gpus.lower() in ("", "auto") else _int_or_text(gpus),
            "name": cell.get("name") or None,
            # a count or 'MIN-MAX': JobSpec reads it as a job file's `nodes`, same errors
            "nodes": _int_or_text(cell.get("nodes") or "1"),
        }
        try:
            spec = JobSpec.from_mapping(doc)
        except SpecError as exc:
            _fail(src, line, exc.field, exc.message)
        arrivals.append(Arrival(at, spec, f"{src}:{line}"))
    return arrivals


def write_trace(path: str | Path, arrivals: Iterable[Arrival], *,
                comment: str | None = None) -> None:
    """Write `arrivals` as a CSV trace that `read_trace` reads back equal.

    Only emulated jobs with a model and steps and no dependencies fit the format;
    anything else is a ValueError naming the arrival (counted from 1). `comment`,
    if given, is written first as '#' lines. The `nodes` column is written only when
    a job runs on more than one node, so single-node traces read in older versions too.
    """
    lines = []
    previous = 0.0
    for i, a in enumerate(arrivals, start=1):
        s = a.spec
        if not s.emulate or s.command or s.model is None or s.steps is None:
            raise ValueError(f"arrival {i}: a trace holds emulated jobs with a model and steps")
        if s.after:
            raise ValueError(f"arrival {i}: a trace cannot hold dependencies ('after')")
        at = float(a.at)
        if not 0 <= at < math.inf or at < previous:
            raise ValueError(f"arrival {i}: time {a.at} must be >= 0 and not earlier than "
                             f"the arrival before ({previous:g})")
        previous = at
        lines.append([repr(at), s.model, str(s.steps),
                      "auto" if s.gpus is None else str(s.gpus), s.name or "", s.nodes_text])
    columns = len(COLUMNS) if any(row[-1] != "1" for row in lines) else len(COLUMNS) - 1
    with open(path, "w", newline="", encoding="utf-8") as f:
        for text in (comment or "").splitlines():
            f.write(f"# {text}\n" if text else "#\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS[:columns])
        w.writerows(row[:columns] for row in lines)


def _rows(f, src: str):
    """(line number, cells) of the non-blank, non-comment rows."""
    reader = csv.reader(f, strict=True)
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row) or row[0].lstrip().startswith("#"):
                continue
            yield reader.line_num, row
    except csv.Error as exc:
        raise TraceError(f"{src}:{reader.line_num}: not valid CSV: {exc}", path=src,
                         line=reader.line_num) from None


def _int_or_text(text: str) -> int | str:
    """A whole number if `text` is one; else the text, which JobSpec rejects with its message."""
    return int(text) if _INT.fullmatch(text) else text


def _fail(src: str, line: int, field: str, message: str) -> NoReturn:
    raise TraceError(f"{src}:{line}: {field}: {message}", path=src, line=line, field=field)


# ---------------------------------------------------------------- from a broker's store


class StoreTrace(NamedTuple):
    """What `trace_from_store` returns; unpacks as `arrivals, skipped = ...`."""

    arrivals: list[Arrival]
    skipped: int  # jobs without a model or without steps (e.g. plain commands with gpus)


def trace_from_store(db_path: str | Path) -> StoreTrace:
    """The jobs submitted to a broker, as a trace, from its SQLite file (`marble.db`).

    Opens the file read-only (safe while the broker runs). One Arrival per job
    that has both a model and steps, in order of submission (submitted_at, then
    job id): `at` is its submitted_at minus the submitted_at of the first such
    job, so the trace starts at 0; gpus is the job's request (NULL = auto) and
    the name and the nodes (a count, or a range from nodes_min) are kept. Jobs of
    every state count, as they were all submitted.
    Every job is replayed as an emulated job; commands and dependencies (after)
    are not carried over. Jobs without a model or steps cannot be replayed and
    are counted in `skipped`.
    """
    path = Path(db_path)
    src = str(db_path)
    if not path.is_file():
        raise TraceError(f"{src}: no such file (give the broker's marble.db)", path=src)
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise TraceError(f"{src}: cannot open: {exc}", path=src) from None
    try:
        # stores of older brokers lack nodes (schema 2) or nodes_min (8): one node, no range
        have = {row[1] for row in con.execute("PRAGMA table_info(jobs)")}
        node_columns = ", ".join(c if c in have else f"{default} AS {c}"
                                 for c, default in (("nodes", 1), ("nodes_min", "NULL")))
        rows = con.execute(
            f"SELECT id, name, model, steps, gpus_request, submitted_at, {node_columns} "
            "FROM jobs "
            "ORDER BY submitted_at, id"
        ).fetchall()
    except sqlite3.Error as exc:
        raise TraceError(f"{src}: not a marbled store ({exc})", path=src) from None
    finally:
        con.close()

    arrivals: list[Arrival] = []
    skipped = 0
    first: float | None = None
    for job_id, name, model, steps, gpus, submitted_at, nodes, nodes_min in rows:
        if model is None or steps is None:
            skipped += 1
            continue
        doc = {"emulate": True, "model": model, "steps": steps,
               "gpus": "auto" if gpus is None else gpus, "name": name,
               "nodes": nodes if nodes_min is None else f"{nodes_min}-{nodes}"}
        try:
            spec = JobSpec.from_mapping(doc)
        except SpecError as exc:
            raise TraceError(f"{src}: job {job_id}: {exc}", path=src, field=exc.field) from None
        if first is None:
            first = submitted_at
        arrivals.append(Arrival(submitted_at - first, spec))
    return StoreTrace(arrivals, skipped)
