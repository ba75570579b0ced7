"""The picture of `marble report --png`, drawn with matplotlib (imported only here, and only
when a PNG is asked for: `marble`'s other commands start without it).

The layout is sized from what it holds: the Gantt panel grows with its GPU rows, each
legend sits right of its own panel, in as many columns as it needs to stay within that
panel's height, and the figure widens for the legends instead of squeezing the panels.
"""

from __future__ import annotations

import math
from pathlib import Path

from marbled.report.figures import Picture

MAX_ROWS = 48  # GPU rows drawn (draw_gantt's own limit)
ROW_IN = 0.3  # a GPU row's height (inches)
MIN_GANTT_IN = 1.2
USE_IN = 1.6  # the GPUs-in-use panel
PLOT_IN = 9.5  # the figure's width but for the legends
ENTRY_IN = 0.17  # a legend line at 7 pt, with its spacing: an upper bound
MAX_COLUMNS = 4  # a job legend longer than that many columns makes the Gantt taller
LEGEND_JOBS = 80  # jobs listed in the legend; bars are labelled with their job ids anyway
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7,
          "frameon": False, "borderaxespad": 0.0}
DPI = 110


def gantt_height(rows: int, entries: int) -> float:
    """Inches for the Gantt panel: its rows, and at least a job legend of `entries` lines in
    MAX_COLUMNS columns beside it (its title counted as one more line)."""
    return max(ROW_IN * rows, MIN_GANTT_IN,
               ENTRY_IN * (math.ceil(entries / MAX_COLUMNS) + 1))


def draw_png(path: Path, pic: Picture) -> None:
    """Top: a row per GPU, a bar per run coloured by job, hatched while a secondary,
    a red mark where a suspension was asked. Below: GPUs in use over time, by role.
    Grey: between allocations (no GPUs then)."""
    fig = figure(pic)
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def figure(pic: Picture):
    """The matplotlib Figure of `pic`, laid out (tests measure it before it is saved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    from marbled.sim.report import draw_gantt, gpu_rows, job_color

    bars = pic.bars
    horizon = max((b.end for b in bars), default=1.0) or 1.0
    row_count = min(len(gpu_rows(bars)), MAX_ROWS)
    jobs = sorted(pic.models)
    handles = [Patch(facecolor=job_color(j), edgecolor="black", linewidth=0.3,
                     label=f"{j}: {pic.models[j] or '?'}") for j in jobs[:LEGEND_JOBS]]
    if len(jobs) > LEGEND_JOBS:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"+{len(jobs) - LEGEND_JOBS} more jobs"))
    handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="secondary"),
                Line2D([], [], linestyle="none", marker="v", color="red",
                       markeredgecolor="black", label="suspension asked")]
    if pic.gaps:
        handles.append(Patch(facecolor="0.92", label="between allocations"))

    gantt_in = gantt_height(row_count, len(handles))
    fig = plt.figure(figsize=(PLOT_IN + 1.5, gantt_in + USE_IN + 1.3), dpi=DPI)
    grid = fig.add_gridspec(2, 1, height_ratios=[gantt_in, USE_IN])
    gantt = fig.add_subplot(grid[0])
    use = fig.add_subplot(grid[1], sharex=gantt)
    gantt.tick_params(labelbottom=False)

    rows = draw_gantt(gantt, bars, horizon, max_gpus=MAX_ROWS, labels=len(jobs) <= 40)
    keys = list(rows)
    for i in range(1, len(keys)):  # a line between nodes
        if keys[i][0] != keys[i - 1][0]:
            gantt.axhline(i - 0.5, color="0.4", linewidth=0.8)
    asked = dict(pic.suspensions)
    for b in bars:
        if b.run in asked:
            ys = [rows[(b.node, g)] for g in b.gpus if (b.node, g) in rows]
            gantt.plot([asked[b.run]] * len(ys), ys, linestyle="none", marker="v",
                       markersize=6, color="red", markeredgecolor="black",
                       markeredgewidth=0.4)
    for ax in (gantt, use):
        for start, end in pic.gaps:
            ax.axvspan(start, end, color="0.92", zorder=0)
    gantt.set_title(pic.title, fontsize=9)
    if not bars:
        gantt.text(0.5, 0.5, "nothing ran", transform=gantt.transAxes, ha="center")

    if pic.levels:
        t = [p[0] for p in pic.levels]
        primary = [p[1] for p in pic.levels]
        both = [p[1] + p[2] for p in pic.levels]
        # greys: the job colours above stay the only colours
        use.fill_between(t, 0, primary, step="post", color="0.45", linewidth=0,
                         label="primary")
        use.fill_between(t, primary, both, step="post", facecolor="0.85", hatch="///",
                         edgecolor="0.3", linewidth=0, label="secondary")
    top = pic.total_gpus or max((p[1] + p[2] for p in pic.levels), default=1.0)
    if pic.total_gpus:
        use.axhline(pic.total_gpus, color="black", linestyle="--", linewidth=0.8,
                    label=f"{pic.total_gpus} GPUs")
    use.set_ylim(0, top * 1.15)
    use.yaxis.set_major_locator(MaxNLocator(integer=True))  # GPUs come whole: no 2.5
    use.set_xlim(0, horizon)
    use.set_ylabel("GPUs in use", fontsize=8)
    use.set_xlabel("seconds since the file's first event (wall clock)")
    use.legend(**LEGEND).set_in_layout(False)
    _fit_legend(fig, gantt, handles)
    return fig


def _fit_legend(fig, gantt, handles: list) -> None:
    """The job legend beside the Gantt panel in the fewest columns that keep it within the
    panel's height (never over the lower panel's legend), and the figure as wide as the
    panels and the widest legend; as measured by the renderer, so that no font or label
    length can break it. The legends stay out of tight_layout: it lays out the panels in
    the figure's first PLOT_IN inches, and the legends take the rest."""
    renderer = fig.canvas.get_renderer()
    grid = gantt.get_gridspec()

    def lay_out() -> None:
        fig.tight_layout(rect=(0, 0, PLOT_IN / fig.get_size_inches()[0], 1))

    lay_out()  # the panels' heights do not depend on the legends: one layout serves
    for _ in range(8):
        for columns in range(1, MAX_COLUMNS + 1):
            legend = gantt.legend(handles=handles, ncols=columns, title="job: model",
                                  title_fontsize=7, **LEGEND)
            legend.set_in_layout(False)
            over = (legend.get_window_extent(renderer).height
                    - gantt.get_window_extent(renderer).height) / fig.dpi
            if over <= 0:
                break
        if over <= 0:
            break
        # gantt_height's estimate was short: the panel grows by what the legend lacks
        gantt_in, use_in = grid.get_height_ratios()
        grid.set_height_ratios([gantt_in + over + 0.05, use_in])
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, height + over + 0.05)
        lay_out()
    widest = max(ax.get_legend().get_window_extent(renderer).x1 for ax in fig.axes) / fig.dpi
    width, height = fig.get_size_inches()
    scale = width / (widest + 0.15)  # the same margins in inches, on a wider figure
    fig.set_size_inches(widest + 0.15, height)
    fig.subplots_adjust(left=fig.subplotpars.left * scale, right=fig.subplotpars.right * scale)
