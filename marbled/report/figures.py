"""What the reports compute from the queries' rows: pure functions, rows in, figures out.

The GPU timeline's bars and the GPUs in use over time (what `marble report --png` draws),
the GPU-seconds under them, the stretches between allocations, and the throughput rows
beside the profile's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

RUN_PHASES = ("primary", "secondary")  # the timeline's rows that are runs
PROFILE_COSTS = {"startup": "startup_s", "suspend": "suspend_s"}  # sample kind -> profile field


def total_row(hours: list[dict]) -> dict | None:
    """The gpu_hours report's row for the whole file (`allocation` 'all')."""
    return next((h for h in hours if h["allocation"] == "all"), None)


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


# -- the GPU timeline


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
    from marbled.store.schema import placement_parts

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


@dataclass(frozen=True)
class Picture:
    """What `marble report --png` draws, in wall-clock seconds since the file's first event."""

    title: str
    bars: list[Bar]
    models: dict[int, str]  # job -> model, for the jobs that ran
    suspensions: list[tuple[int, float]]  # (run, when its suspension was asked)
    levels: list[tuple[float, float, float]]  # in_use(bars)
    total_gpus: int | None
    gaps: list[tuple[float, float]]  # between allocations: no GPUs then


def picture(name: str, timeline: list[dict], suspensions: list[dict], summary: list[dict],
            gpu_hours: list[dict], allocations: list[dict]) -> Picture:
    """The picture of a state file named `name`, from the rows of those five reports."""
    (s,) = summary
    total = total_row(gpu_hours)
    util = f", utilization {total['utilization']:.1%}" if total and total["utilization"] else ""
    title = (f"{name}: policy {s['policy']}, {s['jobs']} jobs, {s['runs']} runs, "
             f"{s['suspensions']} suspensions{util}")
    if s["time_scale"] and s["time_scale"] != 1:
        title += f" (emulated at time scale {s['time_scale']:g})"
    bars = timeline_bars(timeline)
    return Picture(
        title=title, bars=bars,
        models={r["job_id"]: r["model"] for r in timeline if r["phase"] in RUN_PHASES},
        suspensions=[(x["run_id"], x["requested_s"]) for x in suspensions
                     if x["requested_s"] is not None],
        levels=in_use(bars), total_gpus=s["gpus"], gaps=between(allocations))
