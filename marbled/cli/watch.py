"""`marble watch`: a live view of the broker in the terminal (rich), until q or Ctrl-C.

rich is imported when the view is drawn, not with the `marble` command: every `marble
submit` would pay for it."""

from __future__ import annotations

import contextlib
import select
import sys
import termios
import time
import tty

import click

from marbled.cli.common import FINAL, call, client, eta_text, forecast_text, profiled_option
from marbled.cli.schedule import clock, format_gantt, job_symbol, schedule_rows


def frame(status: dict, jobs: list[dict], runs: dict, forecast: dict, width: int,
          profiled: bool = False):
    """One screen: the broker, its jobs with progress and ETA, and the GPUs over time (in
    real seconds; `profiled`: in profiled ones, for emulated jobs)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    nodes = "  ".join(f"{n}: {len(v['free'])}/{len(v['gpus'])} free"
                      for n, v in status["nodes"].items())
    head = Text.assemble((f"marbled {status['pid']}", "bold"), f"  policy {status['policy']}",
                         f"  profile {status['profile']}  {nodes}",
                         ("  DRAINING" if status["draining"] else "", "bold red"))
    table = Table(expand=True, box=None, header_style="bold")
    right = {"justify": "right"}
    short = {"no_wrap": True, "overflow": "ellipsis", "max_width": 14}
    for name, kw in (("ID", right), ("NAME", short), ("STATE", {}), ("ROLE", {}),
                     ("GPUS", short), ("PROGRESS", {"ratio": 1, "min_width": 4}), ("STEP", right),
                     ("STEPS/S", right), ("ETA", right)):
        table.add_column(name, **kw)
    for j in jobs:
        if j["state"] in FINAL and j["finished_at"] and \
                time.time() - j["finished_at"] > 60:  # ended a while ago: out of the way
            continue
        label = f"{job_symbol(j['id'])} {j['name'] or j['model'] or ' '.join(j['command'])}"
        bar = ProgressBar(total=j["steps"] or 1, completed=j["step"] or 0, width=None) \
            if j["steps"] else Text("-")
        table.add_row(str(j["id"]), label[:20], j["state"], j["role"] or "-",
                      ",".join(map(str, j["gpus"])) or "-", bar,
                      f"{j['step'] or 0}/{j['steps'] or '?'}",
                      f"{j['rate']:.3g}" if j.get("rate") else "-", eta_text(j, forecast))
    by_id = {j["id"]: j for j in jobs}
    scale, unit = clock(runs["runs"], by_id, status["time_scale"], profiled)
    t0 = min((r["started_at"] for r in runs["runs"]), default=time.time())
    now = (time.time() - t0) / scale
    # runs still going are drawn up to now, the chart's right edge
    rows = [{**r, "end": now if r["end"] is None else r["end"]}
            for r in schedule_rows(runs["runs"], by_id, t0, scale)]
    gantt = format_gantt(rows, {n: len(v["gpus"]) for n, v in status["nodes"].items()},
                         max(width - 20, 20), unit)
    return Group(head, Panel(table, title="jobs", subtitle=forecast_text(forecast)),
                 Panel(Text(gantt), title=f"GPUs over time ({unit}; lowercase: secondary)"),
                 Text("q or Ctrl-C: quit", style="dim"))


WINDOW_S = 3600.0  # the history a view reads by default: the last hour, as the dashboard's


def _snapshot(api, window: float) -> tuple:
    """What one view shows: the live jobs and runs, and those that ended within `window`
    seconds (`?since=`, through indexes): a view costs the broker what the live jobs and
    the window hold, not every job it has seen."""
    since = f"?since={max(time.time() - window, 0.0)!r}"
    return (call(api.get, "/v1/status"), call(api.get, "/v1/jobs" + since)["jobs"],
            call(api.get, "/v1/runs" + since), call(api.get, "/v1/forecast"))


@contextlib.contextmanager
def _keys():
    """Single key presses from a terminal (cbreak mode, restored at the end); else none."""
    if not sys.stdin.isatty():
        yield lambda timeout: time.sleep(timeout)
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        def key(timeout: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], timeout)
            return sys.stdin.read(1) if ready else None

        yield key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@click.command()
@click.option("--interval", type=click.FloatRange(0.1), default=1.0, show_default=True,
              help="Seconds between updates.")
@click.option("--once", is_flag=True, help="Print one view and exit (for logs and scripts).")
@click.option("--window", type=click.FloatRange(min=1), default=WINDOW_S, show_default=True,
              help="Seconds of history shown: the jobs and runs that ended within it (the "
                   "live ones always).")
@profiled_option
@click.pass_context
def watch(ctx, interval, once, window, profiled):
    """A live view: every job's progress bar, speed and ETA, and the GPUs over time
    (as the MARBLE paper's Figure 5 draws them, in real seconds). Quit with q or Ctrl-C.

    It reads the live jobs and the last --window seconds, not every job the broker has
    seen: a view of a long allocation costs what its last hour holds."""
    from rich.console import Console
    from rich.live import Live

    api = client(ctx)
    console = Console()  # its width follows the terminal's

    def draw():
        try:
            return frame(*_snapshot(api, window), console.width, profiled)
        except ValueError as exc:  # --profiled with a real job
            raise click.UsageError(str(exc)) from None

    if once:
        console.print(draw())
        return
    with contextlib.suppress(KeyboardInterrupt), _keys() as key, \
            Live(draw(), console=console, screen=True, auto_refresh=False) as live:
        while key(interval) not in ("q", "Q"):
            live.update(draw(), refresh=True)


COMMANDS = (watch,)
