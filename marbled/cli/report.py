"""`marble report`: the staff queries of sql/reports.sql on a broker's state file, offline.

The command alone: marbled/report/ runs the queries (`queries`), computes what they show
(`figures`) and draws the GPU timeline (`draw`, with the Gantt drawing of `marble simulate
--gantt`); this module parses the options and prints the rows as a table, JSON or CSV.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import click

from marbled.cli.common import json_option, output
from marbled.paths import DB_NAME
from marbled.report.figures import total_row, with_profile
from marbled.report.queries import (
    SUMMARY,
    StateFileError,
    load_queries,
    meta_of,
    open_state,
    rows_of,
    run_query,
)


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
@click.option("--slurm", is_flag=True,
              help="Instead of NAME: each run launched as a Slurm job step beside Slurm's "
                   "accounting of the step (state, exit code, elapsed, CPU time, MaxRSS; "
                   "pyslurm's slurmdb API, else sacct), flagged where the two disagree. Run "
                   "it on a node of the cluster; it says so when Slurm keeps no accounting.")
@click.pass_context
def report(ctx, name, state_dir, db, as_json, as_csv, png, profile, slurm):
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
      marble report --slurm                  # the runs beside Slurm's accounting (sacct)
      sqlite3 -header -column marble.db < sql/reports.sql   # the same, without marble
    """
    root = ctx.find_root().obj or {}
    if db is not None and state_dir is not None:
        raise click.UsageError("give either --db FILE or --state-dir DIR, not both")
    if as_csv and (as_json or root.get("json")):
        raise click.UsageError("give either --json or --csv")
    if slurm and name is not None:
        raise click.UsageError(f"give either a report NAME ({name}) or --slurm, not both")
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
        doc, columns, rows, text = (_slurm(con, path) if slurm
                                    else _build(con, queries, name, profile, path))
        if png:
            _png(con, queries, png, path)
            doc["png"] = str(png)
    except StateFileError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        con.close()
    if as_csv:
        write_csv(columns, rows)
        if slurm:  # the rows alone do not say why Slurm's columns are empty
            click.echo(doc["accounting"]["note"], err=True)
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
        total = total_row(hours)
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


def _slurm(con, path) -> tuple[dict, list[str], list[dict], str]:
    """`--slurm`, as _build gives a report."""
    from marbled.report.slurm_accounting import slurm_report

    doc, head = slurm_report(con)
    doc = {"database": str(path), **doc}
    return doc, doc["columns"], doc["rows"], f"{head}\n{format_table(doc['columns'], doc['rows'])}"


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
    from marbled.report.draw import draw_png
    from marbled.report.figures import picture

    rows = rows_of(con, queries, "timeline", "suspensions", SUMMARY, "gpu_hours",
                   "allocations")
    try:
        draw_png(png, picture(Path(path).name, **rows))
    except OSError as exc:
        raise click.ClickException(f"{png}: cannot write: {exc.strerror}") from None


COMMANDS = (report,)
