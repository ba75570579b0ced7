"""Present simulation results: a comparison table and a Gantt chart of GPUs over time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from marbled.sim.engine import SimResult, SimRun

COLUMNS = (
    ("policy", "policy", "{:<10}"),
    ("jobs", "jobs", "{:>6}"),
    ("makespan_s", "makespan s", "{:>11.0f}"),
    ("average_jct_s", "avg JCT s", "{:>10.0f}"),
    ("average_wait_s", "avg wait s", "{:>11.0f}"),
    ("utilization", "GPU util", "{:>9.1%}"),
    ("suspensions", "suspends", "{:>9}"),
    ("overhead_share", "overhead", "{:>9.1%}"),
    ("vs_bound", "makespan/LB", "{:>12.2f}"),
)


def comparison_table(results: list[SimResult]) -> str:
    rows = []
    for r in results:
        s = r.summary()
        s["vs_bound"] = r.makespan / r.lower_bound if r.lower_bound else float("nan")
        rows.append(s)
    head = "".join("{:" + _width(fmt) + "}" for _, _, fmt in COLUMNS)
    lines = [head.format(*(title for _, title, _ in COLUMNS))]
    for s in rows:
        lines.append("".join(fmt.format(s[key]) for key, _, fmt in COLUMNS))
    if results:
        lines.append(f"lower bound (no policy can beat it): {results[0].lower_bound:.0f} s")
    if any(r.policy == "moldable" for r in results):
        lines.append("moldable keeps every job on the count it started with, as published: "
                     "a long job that started on the one free GPU stays on it")
    return "\n".join(lines)


def _width(fmt: str) -> str:
    """The alignment and width of a format such as '{:>11.0f}', for the header."""
    spec = fmt[fmt.index(":") + 1:-1]
    align = spec[0] if spec[0] in "<>^" else ">"
    width = "".join(ch for ch in spec.lstrip("<>^").split(".")[0] if ch.isdigit())
    return f"{align}{width}"


def gpu_rows(runs: list) -> list[tuple[str, int]]:
    """The GPUs the runs used, as (node, GPU): nodes in the order of first use, GPUs in order."""
    first: dict[str, float] = {}
    for run in runs:
        first[run.node] = min(first.get(run.node, run.start), run.start)
    return sorted({(r.node, g) for r in runs for g in r.gpus},
                  key=lambda k: (first[k[0]], k[0], k[1]))


def per_node(runs: list[SimRun]) -> list[SimRun]:
    """The runs as bars, one per node of a run (a multi-node run has a bar on every node it
    held, as `marble report` draws one)."""
    return [replace(r, node=node, gpus=gpus, others=()) for r in runs
            for node, gpus in r.parts()]


def job_color(job: int) -> tuple:
    """The colour of a job in every Gantt chart, by job id: tab20's ten strong colours, then
    their light pairs (in tab20's own order, jobs 1 and 2 were two blues)."""
    import matplotlib

    colors = matplotlib.colormaps["tab20"].colors
    colors = colors[::2] + colors[1::2]
    return colors[(job - 1) % len(colors)]


def draw_gantt(ax, runs: list, horizon: float, max_gpus: int = 48, labels: bool = True) -> dict:
    """Draw `runs` on `ax`: a row per GPU, a bar per run coloured by job (hatched: secondary).

    A run needs job, node, gpus, role (a Role or its value), start, end and share; the
    simulator's runs and `marble report`'s share this drawing. The rows, by (node, GPU)."""
    runs = sorted(runs, key=lambda r: r.start)
    rows = {key: i for i, key in enumerate(gpu_rows(runs)[:max_gpus])}
    lanes: dict[tuple[str, int, int], list[float]] = {}  # a shared GPU's lanes: their ends
    for run in runs:
        for g in run.gpus:
            key = (run.node, g)
            if key not in rows:
                continue
            # A run on 1/n of a GPU is a bar 1/n as high, in a lane free at its start.
            ends = lanes.setdefault((*key, run.share), [0.0] * run.share)
            lane = next((i for i, e in enumerate(ends) if e <= run.start), 0)
            ends[lane] = run.end
            height = 0.8 / run.share
            y = rows[key] - 0.4 + height * (lane + 0.5)
            role = getattr(run.role, "value", run.role)
            ax.barh(y, run.end - run.start, left=run.start, height=height,
                    color=job_color(run.job), edgecolor="black",
                    linewidth=0.3, hatch="///" if role == "secondary" else None)
            if labels and run.end - run.start > horizon / 40:
                ax.text(run.start + (run.end - run.start) / 2, y, str(run.job),
                        ha="center", va="center", fontsize=7,
                        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                              "edgecolor": "none", "alpha": 0.8})
    ax.set_yticks(range(len(rows)), [f"{n}/gpu{g}" for n, g in rows], fontsize=7)
    ax.invert_yaxis()
    return rows


def gantt_png(results: list[SimResult], path: Path, max_gpus: int = 48) -> Path:
    """One panel per policy: a row per GPU, a bar per run (hatched: secondary)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizon = max(r.makespan for r in results)
    fig, axes = plt.subplots(len(results), 1, squeeze=False, sharex=True,
                             figsize=(11, 1.2 + 0.28 * min(max_gpus, results[0].total_gpus)
                                      * len(results)))
    for ax, result in zip(axes[:, 0], results, strict=True):
        draw_gantt(ax, per_node(result.runs), horizon, max_gpus, labels=len(result.jobs) <= 40)
        ax.axvline(result.lower_bound, color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(f"{result.policy}: makespan {result.makespan:.0f} s, "
                     f"{result.suspensions} suspensions (hatched: secondary; "
                     f"dashed: lower bound)", fontsize=9)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
