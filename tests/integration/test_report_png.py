"""`marble report --png` laid out for what it holds: the state files of real brokers (1 job on
one node; 30 jobs on two), and a picture of 200 jobs. The figure is measured with its own
renderer: no legend over a panel or over the other legend, whole GPUs on the GPU axis, and
a Gantt panel as tall as its rows with no empty band under it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from marbled.paths import DB_NAME
from marbled.report import draw
from marbled.report.figures import Bar, Picture, in_use, picture
from marbled.report.queries import SUMMARY, load_queries, open_state, rows_of
from marbled.sim.report import gpu_rows
from tests.conftest import start_daemon
from tests.integration.test_report import marble

MODELS = ("resnet-50", "inception-v3", "vgg-16", "alexnet", "resnet-101", "lenet")
MAX_GAP_IN = 0.6  # between the Gantt panel and the one below: tick marks, no empty band


def state_file(root: Path, jobs: int, nodes: int) -> Path:
    """A real broker's state file: `jobs` emulated jobs of mixed models and lengths on
    `nodes` emulated nodes of 6 GPUs, each job done, then SIGTERM."""
    daemon = start_daemon(root / "state", "--nodes", str(nodes))
    try:
        daemon.submit(*({"model": MODELS[i % len(MODELS)], "steps": 150 + 37 * (i % 7),
                         "emulate": True} for i in range(jobs)))
        assert {j["state"] for j in daemon.wait_all(timeout=180)} == {"done"}
    finally:
        assert daemon.stop() == 0
    return daemon.state_dir / DB_NAME


@pytest.fixture(scope="module", params=[(1, 1), (30, 2)], ids=["1-job-1-node", "30-jobs-2-nodes"])
def drawn(request, tmp_path_factory):
    """(the state file, its picture, the laid-out figure)."""
    jobs, nodes = request.param
    db = state_file(tmp_path_factory.mktemp(f"png{jobs}"), jobs, nodes)
    con = open_state(db)
    try:
        rows = rows_of(con, load_queries(), "timeline", "suspensions", SUMMARY, "gpu_hours",
                       "allocations")
    finally:
        con.close()
    pic = picture(db.name, **rows)
    assert len(pic.models) == jobs
    assert len({b.node for b in pic.bars}) == nodes
    fig = draw.figure(pic)
    yield db, pic, fig
    import matplotlib.pyplot as plt

    plt.close(fig)


def check_layout(pic: Picture, fig) -> None:
    """What a reader needs of the figure, measured as the renderer placed it."""
    renderer = fig.canvas.get_renderer()
    gantt, use = fig.axes
    box = {"figure": fig.bbox}
    box.update(gantt=gantt.get_window_extent(renderer), use=use.get_window_extent(renderer))
    legends = {"jobs": gantt.get_legend().get_window_extent(renderer),
               "use": use.get_legend().get_window_extent(renderer)}
    for name, legend in legends.items():
        for panel in ("gantt", "use"):
            assert not legend.overlaps(box[panel]), (name, panel, legend, box[panel])
        # within the figure (a legend cut off at its edge would be lost)
        assert box["figure"].x0 <= legend.x0 and legend.x1 <= box["figure"].x1 + 0.5, name
        assert box["figure"].y0 <= legend.y0 and legend.y1 <= box["figure"].y1 + 0.5, name
    assert not legends["jobs"].overlaps(legends["use"])
    assert legends["jobs"].y0 >= box["gantt"].y0 - 0.5  # beside its own panel, not below

    # every job is in the legend, with its model
    labels = [t.get_text() for t in gantt.get_legend().get_texts()]
    for job, model in pic.models.items():
        assert f"{job}: {model}" in labels

    # GPUs come whole: integer ticks, and more than one of them
    ticks = [t for t in use.get_yticks() if use.get_ylim()[0] <= t <= use.get_ylim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks

    # one row per GPU the runs used, each tall enough to read; the panel fills its share
    rows = len(gpu_rows(pic.bars))
    assert len(gantt.get_yticks()) == rows
    dpi = fig.dpi
    gantt_in = box["gantt"].height / dpi
    assert gantt_in >= max(0.8 * draw.ROW_IN * rows, draw.MIN_GANTT_IN * 0.8), gantt_in
    assert gantt_in / (box["figure"].height / dpi) >= (0.55 if rows >= 12 else 0.25)
    gap_in = (box["gantt"].y0 - box["use"].y1) / dpi
    assert 0 < gap_in <= MAX_GAP_IN, gap_in  # no large empty area between the panels


@pytest.mark.daemon
def test_the_png_is_laid_out_for_its_jobs_and_nodes(drawn, tmp_path):
    db, pic, fig = drawn
    check_layout(pic, fig)
    # `marble report --png` draws that same figure: its size in pixels is the figure's
    png = tmp_path / "gpus.png"
    doc = json.loads(marble("--db", str(db), "--json", "--png", str(png)).stdout)
    assert doc["png"] == str(png)
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    w_in, h_in = fig.get_size_inches()
    assert abs(width - w_in * draw.DPI) <= 1 and abs(height - h_in * draw.DPI) <= 1


@pytest.mark.daemon
def test_the_x_axis_is_wall_clock_seconds(drawn):
    _, pic, fig = drawn
    gantt, use = fig.axes
    assert "wall clock" in use.get_xlabel()
    assert use.get_xlim() == (0, max(b.end for b in pic.bars))


def test_two_hundred_jobs_on_one_node_still_fit_their_legend():
    """More jobs than the legend's columns hold beside six rows: the Gantt panel grows to
    hold the legend, and the legend names the first LEGEND_JOBS and how many more."""
    bars = [Bar(j, j, "node0", (j % 6,), "primary", float(j), j + 1.0) for j in range(1, 201)]
    pic = Picture("many", bars, {j: MODELS[j % 6] for j in range(1, 201)}, [], in_use(bars),
                  6, [(50.0, 60.0)])
    fig = draw.figure(pic)
    try:
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert f"+{200 - draw.LEGEND_JOBS} more jobs" in labels
        assert "between allocations" in labels
        pic = Picture(pic.title, bars, {j: pic.models[j] for j in range(1, draw.LEGEND_JOBS + 1)},
                      [], pic.levels, 6, pic.gaps)  # what check_layout expects to be listed
        check_layout(pic, fig)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_report_command_imports_no_matplotlib_until_a_png_is_asked():
    code = ("import sys, marbled.cli.report, marbled.report.figures, marbled.report.draw; "
            "print(sorted(m for m in ('matplotlib', 'sqlalchemy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
