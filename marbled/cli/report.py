"""`marble report`: the staff queries of sql/reports.sql on a broker's state file, offline.

The queries live in sql/reports.sql, each after a `-- name: NAME` line, so that staff
with only `sqlite3` run the same ones. This module reads that file, runs a query on a
read-only connection, prints its rows as a table, JSON or CSV, and draws the GPU
timeline with the Gantt drawing of `marble simulate --gantt` (marbled/sim/report.py).
"""

from __future__ import annotations

import csv
import re
import sqlite3
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import click

from marbled.cli.common import json_option, output
from marbled.paths import DB_NAME
from marbled.resources import sql_path

SUMMARY = "summary"
RUN_PHASES = ("primary", "secondary")  # the timeline's rows that are runs
TABLES = ("jobs", "runs", "events", "meta")
PROFILE_COSTS = {"startup": "startup_s", "suspend": "suspend_s"}  # sample kind -> profile field


class StateFileError(Exception):
    """A file `marble report` cannot read; the message says what it is and what to do."""


@dataclass(frozen=True)
class Query:
    name: str
    about: str  # the first comment line under its name
    sql: str


def parse_queries(text: str) -> dict[str, Query]:
    """The named queries of a SQL file: each runs from its `-- name: NAME` line to the next."""
    parts = re.split(r"^-- name:[ \t]*(\S+)[ \t]*$", text, flags=re.M)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        first = body.strip().splitlines()[0] if body.strip() else ""
        about = first[2:].strip() if first.startswith("--") else ""
        queries[name] = Query(name, about, body.strip())
    return queries


def load_queries() -> dict[str, Query]:
    return parse_queries(sql_path("reports.sql").read_text())


def open_state(path: Path) -> sqlite3.Connection:
    """A read-only connection to a broker's state file, after checking that it is one of
    the schema version this marbled reads."""
    from marbled.store.db import SCHEMA_VERSION  # SQLAlchemy: only once a report is asked

    if path.is_dir():
        raise StateFileError(f"{path} is a directory: give a state directory with "
                             f"--state-dir, or its {DB_NAME} with --db")
    if not path.is_file():
        raise StateFileError(f"{path}: no such file (a broker's state file is "
                             f"STATE_DIR/{DB_NAME}: give it with --db, or --state-dir)")
    # A broker with the file open keeps a -wal file beside it: read as any other reader
    # (mode=ro, through SQLite's shared memory). Without one nobody is writing: read it
    # as immutable, which creates no -wal/-shm beside it (staff may not own the directory).
    live = path.with_name(path.name + "-wal").exists()
    uri = path.resolve().as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise StateFileError(f"{path}: cannot open: {exc}") from None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = [t for t in TABLES if t not in tables]
        if missing:
            raise StateFileError(f"{path}: not a marbled state database (no table "
                                 f"{', '.join(missing)})")
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:  # "file is not a database", "... is malformed"
        con.close()
        raise StateFileError(f"{path}: not an SQLite database ({exc})") from None
    except StateFileError:
        con.close()
        raise
    version = int(row[0]) if row and str(row[0]).isdigit() else 1  # version 1 had no row
    if version != SCHEMA_VERSION:
        con.close()
        if version < SCHEMA_VERSION:
            # Not "start marbled on it": that would also resume the jobs it left.
            raise StateFileError(
                f"{path} has schema version {version}, older than the version "
                f"{SCHEMA_VERSION} marble report reads. Bring a copy up to date as marbled "
                "does at start-up, and report on that: cp FILE COPY && python -c \"from "
                "marbled.store.db import migrate; migrate('COPY')\" && marble report --db COPY")
        raise StateFileError(f"{path} has schema version {version}, newer than this "
                             f"marbled's ({SCHEMA_VERSION}): use the newer marble that wrote it")
    return con


def run_query(con: sqlite3.Connection, query: Query) -> tuple[list[str], list[dict]]:
    """The columns and rows (as dicts) of one named query."""
    try:
        cur = con.execute(query.sql)
    except sqlite3.Error as exc:
        raise StateFileError(f"report {query.name}: {exc} (sqlite {sqlite3.sqlite_version})") \
            from None
    columns = [d[0] for d in cur.description]
    return columns, [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]


def meta_of(con: sqlite3.Connection) -> dict[str, str]:
    return dict(con.execute("SELECT key, value FROM meta").fetchall())


# -- throughput against the profile


def with_profile(rows: list[dict], book) -> list[dict]:
    """The throughput report's rows with the profile's figure for each and measured/profile;
    None where the profile (or `book`, when None) does not know it."""
    out = []
    for row in rows:
        curve = book.lookup(row["model"]) if book is not None else None
        expected = None
        if curve is not None and row["kind"] == "throughput":
            try:
                expected = curve.throughput(row["gpus"], row["share"])
            except ValueError:  # a count the profile says the model cannot run on
                expected = None
        elif curve is not None and row["kind"] in PROFILE_COSTS:
            expected = getattr(curve, PROFILE_COSTS[row["kind"]])
        ratio = round(row["measured"] / expected, 3) if expected else None
        out.append({**row, "profile": expected, "ratio": ratio})
    return out


def find_book(meta: dict[str, str], override: str | None):
    """The profile the broker ran with (its path, else its name), or `override`; with a
    note saying which, or why none."""
    from marbled.core.profiles import ProfileError
    from marbled.resources import load_profile

    refs = [override] if override else [meta.get("profile_ref"), meta.get("profile")]
    errors = []
    for ref in (r for r in refs if r):
        try:
            return load_profile(ref), f"profile {ref}"
        except (ProfileError, OSError) as exc:
            errors.append(str(exc))
    if override:
        raise click.BadParameter(errors[0], param_hint="--profile")
    return None, ("no profile to compare with (" + ("; ".join(errors) or "the file names none")
                  + "): give one with --profile")


# -- the GPU timeline (pure: rows in, bars and levels out)


@dataclass(frozen=True)
class Bar:
    """A run on one node, as the Gantt drawing of marbled/sim/report.py takes it."""

    job: int
    run: int
    node: str
    gpus: tuple[int, ...]
    role: str
    start: float
    end: float
    share: int = 1


def timeline_bars(rows: list[dict]) -> list[Bar]:
    """The runs of the timeline report as bars, one per node of a run; an open run (a live
    broker) ends now."""
    from marbled.store.db import placement_parts

    bars = []
    for r in rows:
        if r["phase"] not in RUN_PHASES:
            continue
        end = r["end_s"] if r["end_s"] is not None else r["start_s"] + r["seconds"]
        for node, gpus in placement_parts(r["node"], r["gpu_ids"]):
            bars.append(Bar(r["job_id"], r["run_id"], node, gpus, r["phase"], r["start_s"], end,
                            r["share"] or 1))
    return bars


def in_use(bars: list[Bar]) -> list[tuple[float, float, float]]:
    """GPUs held over time: (t, by primaries, by secondaries) from each change on (a run on
    1/n of a GPU holds 1/n of it)."""
    changes = sorted((t, b.role, sign * len(b.gpus) / b.share)
                     for b in bars for t, sign in ((b.start, 1), (b.end, -1)))
    level = {role: 0.0 for role in RUN_PHASES}
    out: list[tuple[float, float, float]] = []
    for t, role, delta in changes:
        level[role] = round(level[role] + delta, 9)  # no -1e-16 GPUs after the last end
        point = (t, level["primary"], level["secondary"])
        if out and out[-1][0] == t:
            out[-1] = point
        else:
            out.append(point)
    return out


def gpu_seconds(levels: list[tuple[float, float, float]]) -> float:
    """The area under `in_use`: the GPU-seconds the runs held."""
    return sum((t1 - t0) * (p + s) for (t0, p, s), (t1, _, _) in pairwise(levels))


def between(allocations: list[dict]) -> list[tuple[float, float]]:
    """The stretches of time between allocations (no broker, no GPUs), from the
    allocations report."""
    spans = sorted((a["start_s"], a["end_s"]) for a in allocations)
    return [(end, start) for (_, end), (start, _) in pairwise(spans) if start > end]


def draw_png(path: Path, bars: list[Bar], models: dict[int, str], suspensions: list[dict],
             total_gpus: int | None, title: str,
             gaps: list[tuple[float, float]] = ()) -> None:
    """Top: a row per GPU, a bar per run coloured by job, hatched while a secondary,
    a red mark where a suspension was asked. Below: GPUs in use over time, by role.
    Grey: between allocations (no GPUs then)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from marbled.sim.report import draw_gantt, gpu_rows, job_color

    horizon = max((b.end for b in bars), default=1.0) or 1.0
    gpu_count = max(min(len(gpu_rows(bars)), 48), 1)
    fig, (gantt, use) = plt.subplots(
        2, 1, sharex=True, figsize=(11, 2.6 + 0.32 * gpu_count),
        gridspec_kw={"height_ratios": [max(0.32 * gpu_count, 1.0), 1.3]})
    rows = draw_gantt(gantt, bars, horizon, labels=len(models) <= 40)
    for s in suspensions:
        if s["requested_s"] is None:
            continue
        ys = [rows[(b.node, g)] for b in bars if b.run == s["run_id"] for g in b.gpus
              if (b.node, g) in rows]
        gantt.plot([s["requested_s"]] * len(ys), ys, linestyle="none", marker="v",
                   markersize=6, color="red", markeredgecolor="black", markeredgewidth=0.4)
    handles = [Patch(facecolor=job_color(j), edgecolor="black", linewidth=0.3,
                     label=f"{j}: {models.get(j) or '?'}") for j in sorted(models)[:20]]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="secondary"),
                Line2D([], [], linestyle="none", marker="v", color="red",
                       markeredgecolor="black", label="suspension asked")]
    for ax in (gantt, use):
        for start, end in gaps:
            ax.axvspan(start, end, color="0.92", zorder=0)
    if gaps:
        handles.append(Patch(facecolor="0.92", label="between allocations"))
    gantt.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
                 title="job: model", title_fontsize=7, frameon=False)
    gantt.set_title(title, fontsize=9)
    if not bars:
        gantt.text(0.5, 0.5, "nothing ran", transform=gantt.transAxes, ha="center")

    levels = in_use(bars)
    if levels:
        t = [p[0] for p in levels]
        primary = [p[1] for p in levels]
        both = [p[1] + p[2] for p in levels]
        # greys: the job colours above stay the only colours
        use.fill_between(t, 0, primary, step="post", color="0.45", linewidth=0,
                         label="primary")
        use.fill_between(t, primary, both, step="post", facecolor="0.85", hatch="///",
                         edgecolor="0.3", linewidth=0, label="secondary")
    top = total_gpus or max((p[1] + p[2] for p in levels), default=1.0)
    if total_gpus:
        use.axhline(total_gpus, color="black", linestyle="--", linewidth=0.8,
                    label=f"{total_gpus} GPUs")
    use.set_ylim(0, top * 1.15)
    use.set_xlim(0, horizon)
    use.set_ylabel("GPUs in use", fontsize=8)
    use.set_xlabel("seconds since the file's first event")
    use.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- printing


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") or "0"  # the SQL rounds already
    return str(value)


def format_table(columns: list[str], rows: list[dict]) -> str:
    """Rows as aligned columns (numbers to the right), like the other `marble` tables."""
    if not rows:
        return "(no rows)"
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    right = [all(isinstance(r[c], int | float) or r[c] is None for r in rows) for c in columns]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w)
                         for v, w, r in zip(values, widths, right, strict=True)).rstrip()

    return "\n".join([line([c.upper() for c in columns]), *(line(row) for row in cells)])


def write_csv(columns: list[str], rows: list[dict]) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(columns)
    out.writerows([["" if r[c] is None else r[c] for c in columns] for r in rows])


def _epilog() -> str:
    try:
        queries = load_queries()
    except OSError:
        return ""
    return "\b\nReports (NAME):\n" + "\n".join(f"  {q.name:<12} {q.about}"
                                               for q in queries.values())


@click.command(epilog=_epilog())
@click.argument("name", required=False)
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
              help="The broker's state directory; its marble.db is read. [default: marble's "
                   "--state-dir, $MARBLE_STATE_DIR, else the allocation's default]")
@click.option("--db", type=click.Path(path_type=Path),
              help="The state file itself (a marble.db, or a copy of one).")
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="Print the rows as CSV (for spreadsheets).")
@click.option("--png", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw the GPU timeline (a row per GPU, coloured by job, hatched: "
                   "secondary) and the GPUs in use over time into this PNG (matplotlib).")
@click.option("--profile",
              help="For the throughput report: the profile to compare with (a name or YAML "
                   "path). [default: the one the broker ran with]")
@click.pass_context
def report(ctx, name, state_dir, db, as_json, as_csv, png, profile):
    """Reports on a broker's state file, offline: no broker needed, the file is only read.

    Runs one of the named queries of sql/reports.sql (staff with only sqlite3 run
    the same ones) on STATE_DIR/marble.db or --db FILE, also while a broker
    writes it. Without NAME: a summary and the list of reports. Times are seconds
    since the file's first event; GPU-hours are real hours, emulated jobs too.
    docs/reports.md says what each figure means.

    \b
    Examples:
      marble report                          # the summary, and which reports there are
      marble report gpu_hours                # used vs idle vs lost to suspend/resume
      marble report suspensions --json       # each suspension and its cost, for scripts
      marble report timeline --db marble.db --csv > timeline.csv
      marble report throughput --profile site.yaml
      marble report --png gpus.png           # the GPUs over time, like Figure 5
      sqlite3 -header -column marble.db < sql/reports.sql   # the same, without marble
    """
    root = ctx.find_root().obj or {}
    if db is not None and state_dir is not None:
        raise click.UsageError("give either --db FILE or --state-dir DIR, not both")
    if as_csv and (as_json or root.get("json")):
        raise click.UsageError("give either --json or --csv")
    queries = load_queries()
    if name is not None and name not in queries:
        raise click.BadParameter(f"no report named '{name}'; the reports are: "
                                 f"{', '.join(queries)}", param_hint="NAME")
    path = db if db is not None else (state_dir or root["state_dir"]) / DB_NAME
    try:
        con = open_state(Path(path))
    except StateFileError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        doc, columns, rows, text = _build(con, queries, name, profile, path)
        if png:
            _png(con, queries, png, path)
            doc["png"] = str(png)
    except StateFileError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        con.close()
    if as_csv:
        write_csv(columns, rows)
        if png:
            click.echo(f"GPU timeline: {png}", err=True)
        return

    def show() -> None:
        click.echo(text)
        if png:
            click.echo(f"GPU timeline: {png}")

    output(ctx, as_json, doc, show)


def _build(con, queries, name, profile, path) -> tuple[dict, list[str], list[dict], str]:
    """The report asked for: its JSON document, columns and rows (for CSV), and its text."""
    if name is None:
        columns, (summary,) = run_query(con, queries[SUMMARY])
        _, hours = run_query(con, queries["gpu_hours"])
        total = next((h for h in hours if h["allocation"] == "all"), None)
        reports = {q.name: q.about for q in queries.values()}
        doc = {"database": str(path), "summary": summary, "gpu_hours": total,
               "reports": reports}
        return doc, columns, [summary], _summary_text(path, summary, total, reports)
    query = queries[name]
    columns, rows = run_query(con, query)
    doc = {"database": str(path), "report": name, "about": query.about}
    head = f"{name}: {query.about}"
    if name == "throughput":
        book, note = find_book(meta_of(con), profile)
        rows = with_profile(rows, book)
        columns = [*columns, "profile", "ratio"]
        doc["profile"] = note
        head += f"\n{note}; ratio = measured / profile"
    doc.update(columns=columns, rows=rows)
    return doc, columns, rows, f"{head}\n{format_table(columns, rows)}"


def _summary_text(path, s: dict, total: dict | None, reports: dict[str, str]) -> str:
    lines = [f"{path} (schema version {s['schema_version']})",
             f"policy {s['policy']}, profile {s['profile']}, {s['nodes']} node(s), "
             f"{s['gpus']} GPUs, time scale {_cell(s['time_scale'])}",
             f"from {s['first_event'] or '-'} to {s['last_event'] or '-'} (UTC), "
             f"{s['drains']} drain(s)",
             f"jobs {s['jobs']}: {s['done']} done, {s['failed']} failed, {s['cancelled']} "
             f"cancelled, {s['unfinished']} unfinished; {s['runs']} runs, "
             f"{s['suspensions']} suspensions"]
    if total:
        lines.append(f"GPU-hours: capacity {_cell(total['capacity_gpu_h'])}, used "
                     f"{_cell(total['used_gpu_h'])} (training {_cell(total['training_gpu_h'])}"
                     f", lost to suspend/resume {_cell(total['lost_gpu_h'])}), idle "
                     f"{_cell(total['idle_gpu_h'])}; utilization "
                     f"{(total['utilization'] or 0):.1%}")
    lines += ["", "Reports (marble report NAME):"]
    lines += [f"  {n:<12} {about}" for n, about in reports.items() if n != SUMMARY]
    return "\n".join(lines)


def _png(con, queries, png: Path, path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise click.ClickException("--png needs matplotlib: pip install 'marbled[plot]'") \
            from None
    _, timeline = run_query(con, queries["timeline"])
    _, suspensions = run_query(con, queries["suspensions"])
    _, (s,) = run_query(con, queries[SUMMARY])
    _, hours = run_query(con, queries["gpu_hours"])
    _, allocations = run_query(con, queries["allocations"])
    total = next((h for h in hours if h["allocation"] == "all"), None)
    models = {r["job_id"]: r["model"] for r in timeline if r["phase"] in RUN_PHASES}
    util = f", utilization {total['utilization']:.1%}" if total and total["utilization"] else ""
    title = (f"{Path(path).name}: policy {s['policy']}, {s['jobs']} jobs, {s['runs']} runs, "
             f"{s['suspensions']} suspensions{util}")
    if s["time_scale"] and s["time_scale"] != 1:
        title += f" (emulated at time scale {_cell(s['time_scale'])})"
    try:
        draw_png(png, timeline_bars(timeline), models, suspensions, s["gpus"], title,
                 between(allocations))
    except OSError as exc:
        raise click.ClickException(f"{png}: cannot write: {exc.strerror}") from None


COMMANDS = (report,)
