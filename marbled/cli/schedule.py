"""Print a schedule (the runs table) as a table and as a Gantt chart of GPUs over time.

Times are real seconds, the broker's clock. Profiled seconds (real seconds / marbled's
--time-scale) are for a set of emulated jobs only (`clock`), and are labelled.
"""

from __future__ import annotations

import string

SYMBOLS = string.ascii_uppercase  # job 1 = A; lowercase while it runs as a secondary


def job_symbol(job_id: int) -> str:
    return SYMBOLS[(job_id - 1) % len(SYMBOLS)]


def _label(job: dict) -> str:
    return job.get("name") or job.get("model") or (" ".join(job.get("command") or [])[:24])


def clock(runs: list[dict], jobs: dict[int, dict], time_scale: float,
          profiled: bool) -> tuple[float, str]:
    """The `scale` of `schedule_rows` and the unit to label times with: real seconds, or
    profiled ones (`profiled`), for which every job that ran must be emulated (a real
    command's seconds are real whatever the time scale)."""
    if not profiled:
        return 1.0, "s"
    real = sorted({r["job_id"] for r in runs if not jobs.get(r["job_id"], {}).get("emulate")})
    if real:
        raise ValueError(
            "--profiled is for emulated jobs only: job(s) "
            f"{', '.join(map(str, real[:5]))}{' ...' if len(real) > 5 else ''} ran a real "
            "command, timed in real seconds; leave out --profiled")
    return time_scale, "profiled s"


def schedule_rows(runs: list[dict], jobs: dict[int, dict], t0: float,
                  scale: float = 1.0) -> list[dict]:
    """Runs with times relative to `t0`, in real seconds, or in profiled seconds with
    `scale` (real seconds per profiled second, `clock`); a multi-node run gives
    one row per node."""
    rows = []
    for r in runs:
        end = r["ended_at"]
        for node, gpus in r.get("parts") or [(r["node"], r["gpus"])]:
            rows.append({
                "run": r["id"], "job": r["job_id"], "label": _label(jobs.get(r["job_id"], {})),
                "role": r["role"], "node": node, "gpus": gpus,
                "start": (r["started_at"] - t0) / scale,
                "end": None if end is None else (end - t0) / scale,
                "start_step": r["start_step"], "end_step": r["end_step"],
                "why": r["end_reason"] or "running",
            })
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'JOB':>6} {'NAME':<16} {'ROLE':<9} {'GPUS':<13} {'START':>8} {'END':>8} " \
           f"{'STEPS':<13} ENDED"
    lines = [head]
    for r in rows:
        gpus = f"{len(r['gpus'])}: " + ",".join(map(str, r["gpus"]))
        end = "-" if r["end"] is None else f"{r['end']:.1f}"
        steps = f"{r['start_step'] or 0}->{'' if r['end_step'] is None else r['end_step']}"
        job = f"{job_symbol(r['job'])} {r['job']}"
        lines.append(f"{job:>6} {r['label'][:16]:<16} {r['role']:<9} {gpus:<13} "
                     f"{r['start']:>8.1f} {end:>8} {steps:<13} {r['why']}")
    return "\n".join(lines)


def format_gantt(rows: list[dict], gpus_per_node: dict[str, int], width: int = 64,
                 unit: str = "s") -> str:
    """One line per GPU; each column is a time slice marked with the job running there;
    `unit`: the time axis's ("s", or "profiled s")."""
    horizon = max((r["end"] or r["start"] for r in rows), default=0.0)
    if horizon <= 0:
        return "(nothing ran)"
    per_col = horizon / width
    lines = []
    for node, count in gpus_per_node.items():
        for g in range(count):
            cells = ["."] * width
            for r in rows:
                if r["node"] != node or g not in r["gpus"]:
                    continue
                end = horizon if r["end"] is None else r["end"]
                first, last = int(r["start"] / per_col), max(int(end / per_col) - 1, 0)
                mark = job_symbol(r["job"])
                if r["role"] == "secondary":
                    mark = mark.lower()
                for c in range(first, min(last, width - 1) + 1):
                    cells[c] = mark
            name = f"{node}/gpu{g}" if len(gpus_per_node) > 1 else f"gpu{g}"
            lines.append(f"{name:>12} |{''.join(cells)}|")
    end = f"{horizon:.0f} {unit}"
    lines.append(f"{'':>12}  0{'':>{width - len(end) - 1}}{end}")
    legend = {r["job"]: r["label"] for r in rows}
    lines.append("  " + "  ".join(f"{job_symbol(j)}={j} {label}" for j, label in legend.items())
                 + "  (lowercase: secondary)")
    return "\n".join(lines)
