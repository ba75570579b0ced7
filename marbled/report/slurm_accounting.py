"""`marble report --slurm`: a broker's runs beside Slurm's accounting of the same job steps.

Every run under the Slurm launcher is one job step, and its `placed` event names the step
(`slurm_job`, `step`). Slurm's accounting (slurmdbd) keeps its own record of each step:
state, exit code, elapsed, CPU time, MaxRSS. This joins the two and flags where they
disagree (the broker says done, Slurm says OUT_OF_MEMORY). It reads the accounting through
pyslurm's slurmdb API when a pyslurm of the running Slurm's version imports (the rule of
marbled.batch.slurm_api), else `sacct --parsable2`. A cluster without accounting storage
(AccountingStorageType=accounting_storage/none) keeps no such record: the report says so.

The parsing and the comparison are pure functions; `read_accounting` asks Slurm.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import asdict, dataclass

from marbled.batch.base import AllocationError

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Elapsed", "TotalCPU", "MaxRSS")
NO_ACCOUNTING = "accounting_storage/none"
# states in which Slurm ended the step itself, which the broker should have recorded
SLURM_ENDED = ("OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
STILL_ON = ("PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING", "COMPLETING")
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40, "P": 2 ** 50}
_MEM_TRES = re.compile(r"(?:^|,)2=(\d+)")  # TRES id 2 is memory, in bytes

COLUMNS = ["run_id", "job_id", "model", "outcome", "exit_code", "slurm_step", "slurm_state",
           "slurm_exit", "elapsed_s", "cpu_s", "max_rss_mib", "disagrees"]

# Each run placed as a Slurm step (its last `placed` event), and Slurm's reason for its
# end when the broker learnt one (marbled.batch.slurm_api.step_end)
STEP_RUNS = """
WITH placed AS (SELECT run_id, max(id) AS id FROM events WHERE kind = 'placed'
                GROUP BY run_id),
said AS (SELECT run_id, json_extract(data, '$.ended_by.state') AS state, max(id)
         FROM events WHERE json_extract(data, '$.ended_by.state') IS NOT NULL
         GROUP BY run_id)
SELECT r.id AS run_id, r.job_id, j.model, coalesce(r.end_reason, 'running') AS outcome,
       r.exit_code, json_extract(e.data, '$.slurm_job') AS slurm_job,
       json_extract(e.data, '$.step') AS step, said.state AS ended_by
FROM runs r JOIN jobs j ON j.id = r.job_id
JOIN placed p ON p.run_id = r.id JOIN events e ON e.id = p.id
LEFT JOIN said ON said.run_id = r.id
WHERE json_extract(e.data, '$.step') IS NOT NULL
ORDER BY r.id
"""


@dataclass(frozen=True)
class StepRecord:
    """Slurm's accounting of one step."""
    step: str  # 'JOB.STEP'
    state: str  # COMPLETED, FAILED, CANCELLED, OUT_OF_MEMORY, TIMEOUT, ...
    exit_code: int | None
    signal: int | None  # the signal that ended it; 0: none
    elapsed_s: float | None
    cpu_s: float | None  # TotalCPU: user + system CPU time of its tasks
    max_rss: int | None  # bytes, its largest task's; None when not gathered


@dataclass(frozen=True)
class Accounting:
    enabled: bool  # False: no record to join, `note` says why
    source: str  # what was asked: pyslurm slurmdb, sacct, scontrol
    note: str
    records: dict[str, StepRecord]


# ------------------------------------------------------------------ pure: Slurm's formats

def slurm_seconds(text: str) -> float | None:
    """Slurm's [DD-[HH:]]MM:SS[.mmm] (Elapsed, TotalCPU) in seconds; None if empty/invalid."""
    days, _, clock = text.strip().rpartition("-")
    try:
        parts = [float(p) for p in clock.split(":")]
        return sum(v * 60 ** i for i, v in enumerate(reversed(parts))) + int(days or 0) * 86400
    except ValueError:  # "", "INVALID", "UNLIMITED"
        return None


def slurm_bytes(text: str) -> int | None:
    """Slurm's memory figure ('1234K', '2.50M', '0') in bytes; None if empty."""
    found = re.fullmatch(r"([\d.]+)([KMGTP]?)", text.strip().upper())
    return round(float(found.group(1)) * _UNITS[found.group(2)]) if found else None


def parse_sacct(text: str) -> dict[str, StepRecord]:
    """`sacct --parsable2 --format=...` output (with its header line, so in any field order)
    by JobID ('12', '12.batch', '12.0'); a later line for the same id wins (a requeue)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    head = lines[0].split("|")
    missing = [f for f in SACCT_FIELDS if f not in head]
    if missing:
        raise ValueError(f"sacct output lacks the field(s) {', '.join(missing)}: {lines[0]!r}")
    records = {}
    for line in lines[1:]:
        row = dict(zip(head, line.split("|"), strict=False))
        code, _, sig = row["ExitCode"].partition(":")
        records[row["JobID"]] = StepRecord(
            row["JobID"], row["State"].split()[0].rstrip("+") if row["State"] else "",
            int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else None,
            slurm_seconds(row["Elapsed"]), slurm_seconds(row["TotalCPU"]),
            slurm_bytes(row["MaxRSS"]))
    return records


def from_slurmdb(jobs: dict) -> dict[str, StepRecord]:
    """pyslurm's `slurmdb_jobs().get(...)` ({job id: {..., 'steps': {step id: {...}}}}) as
    the same records. Its exit code is a wait status, as sacct reads it."""
    records = {}
    for job_id, job in jobs.items():
        for step_id, step in (job.get("steps") or {}).items():
            status = step.get("exitcode")
            rss = _MEM_TRES.search((step.get("stats") or {}).get("tres_usage_in_max") or "")
            key = f"{job_id}.{step_id}"
            records[key] = StepRecord(
                key, step.get("state_str") or "",
                None if status is None else (status >> 8) & 0xFF,
                None if status is None else status & 0x7F,
                step.get("elapsed"),
                (step.get("tot_cpu_sec") or 0) + (step.get("tot_cpu_usec") or 0) / 1e6,
                int(rss.group(1)) if rss else None)
    return records


def accounting_type(config: str) -> str | None:
    """AccountingStorageType from `scontrol show config` output."""
    found = re.search(r"^AccountingStorageType\s*=\s*(\S+)", config, flags=re.M)
    return found.group(1) if found else None


# ------------------------------------------------------------------ pure: the join

def disagreement(outcome: str, exit_code: int | None, ended_by: str | None,
                 slurm: StepRecord) -> str | None:
    """Where Slurm's record of a run's step contradicts the broker's, in words; None if it
    does not. `outcome` is the run's end_reason ('running' while open), `exit_code` the
    broker's (negative: the signal), `ended_by` the Slurm state the broker learnt."""
    state = slurm.state
    if outcome == "running":
        return None if state in STILL_ON else f"the broker's run is open, Slurm says {state}"
    if state in STILL_ON:
        return f"the broker's run ended ({outcome}), Slurm says {state}"
    if state in SLURM_ENDED and ended_by != state:
        return f"broker: {outcome}, Slurm: {state}"
    if (outcome == "done") != (state == "COMPLETED") and outcome in ("done", "failed"):
        return f"broker: {outcome}, Slurm: {state}"
    if state in SLURM_ENDED or ended_by:  # Slurm's code there is its own (OOM: 0:125)
        return None
    if exit_code is not None and exit_code >= 0 and slurm.signal == 0 \
            and slurm.exit_code is not None and slurm.exit_code != exit_code:
        return f"exit code: broker {exit_code}, Slurm {slurm.exit_code}"
    if exit_code is not None and exit_code < 0 and slurm.signal and slurm.signal != -exit_code:
        return f"signal: broker {-exit_code}, Slurm {slurm.signal}"
    return None


def joined(runs: list[dict], records: dict[str, StepRecord] | None) -> list[dict]:
    """A row per run (COLUMNS): the broker's side, then Slurm's record of its step (None
    without accounting; a run whose step Slurm has no record of says so)."""
    rows = []
    for run in runs:
        step = f"{run['slurm_job']}.{run['step']}" if run["slurm_job"] else None
        row = {"run_id": run["run_id"], "job_id": run["job_id"], "model": run["model"],
               "outcome": run["outcome"], "exit_code": run["exit_code"],
               "slurm_step": step or f"?.{run['step']}", "slurm_state": None,
               "slurm_exit": None, "elapsed_s": None, "cpu_s": None, "max_rss_mib": None,
               "disagrees": None}
        found = records.get(step) if records is not None and step else None
        if found is not None:
            row.update(slurm_state=found.state,
                       slurm_exit=None if found.exit_code is None
                       else f"{found.exit_code}:{found.signal or 0}",
                       elapsed_s=found.elapsed_s,
                       cpu_s=None if found.cpu_s is None else round(found.cpu_s, 3),
                       max_rss_mib=None if found.max_rss is None
                       else round(found.max_rss / 2 ** 20, 1),
                       disagrees=disagreement(run["outcome"], run["exit_code"],
                                              run["ended_by"], found))
        elif records is not None:
            row["disagrees"] = ("no Slurm job recorded for this run (a broker before "
                                "the placed event named it)" if not step
                                else "Slurm's accounting has no record of this step")
        rows.append(row)
    return rows


# ------------------------------------------------------------------ effects: asking Slurm

def read_accounting(jobs: list[str]) -> Accounting:
    """Slurm's accounting of the steps of `jobs` (Slurm job ids), or why there is none."""
    from marbled.batch.slurm import _run
    from marbled.batch.slurm_api import pyslurm_problem

    module, _why = pyslurm_problem()
    source = "pyslurm" if module is not None else "scontrol show config"
    try:
        kind = (module.config().get().get("accounting_storage_type") if module is not None
                else accounting_type(_run(["scontrol", "show", "config"])))
    except (AllocationError, ValueError) as exc:
        return Accounting(False, source, f"Slurm cannot be asked from here ({exc}): run "
                          "marble report --slurm on a node of the cluster", {})
    if kind in (None, NO_ACCOUNTING):
        return Accounting(False, source, "Slurm accounting is not enabled on this cluster "
                          f"(AccountingStorageType={kind or 'unset'}): Slurm kept no record "
                          "of the steps to join", {})
    if module is not None:
        source = "pyslurm slurmdb"
        try:
            records = from_slurmdb(module.slurmdb_jobs().get(jobids=jobs))
        except ValueError as exc:  # pyslurm: (message, errno)
            return Accounting(False, source, f"Slurm accounting ({kind}) could not be read "
                              f"through pyslurm's slurmdb API: {exc}", {})
    else:
        source = "sacct"
        try:
            records = parse_sacct(_run(["sacct", "--parsable2", "--noconvert",
                                        "--format=" + ",".join(SACCT_FIELDS),
                                        "-j", ",".join(jobs)]))
        except (AllocationError, ValueError) as exc:
            return Accounting(False, source, f"Slurm accounting ({kind}) could not be read: "
                              f"{exc}", {})
    return Accounting(True, source, f"Slurm's accounting ({kind}) read through {source}",
                      records)


def slurm_report(con: sqlite3.Connection) -> tuple[dict, str]:
    """The report's JSON document (columns, rows, accounting) and its head line(s)."""
    con.row_factory = sqlite3.Row
    try:
        runs = [dict(r) for r in con.execute(STEP_RUNS)]
    finally:
        con.row_factory = None
    about = "each run launched as a Slurm job step, beside Slurm's accounting of the step"
    if not runs:
        accounting = Accounting(False, "", "no run in this file ran as a Slurm job step "
                                "(marbled --launcher slurm): nothing to join", {})
    elif not any(r["slurm_job"] for r in runs):
        accounting = Accounting(False, "", "the broker named no Slurm job for its steps (a "
                                "state file from before marbled recorded it): nothing to "
                                "ask Slurm about", {})
    else:
        accounting = read_accounting(sorted({r["slurm_job"] for r in runs if r["slurm_job"]}))
    rows = joined(runs, accounting.records if accounting.enabled else None)
    doc = {"report": "slurm", "about": about, "columns": COLUMNS, "rows": rows,
           "accounting": {k: v for k, v in asdict(accounting).items() if k != "records"}}
    head = [f"slurm: {about}", accounting.note]
    flagged = sum(1 for r in rows if r["disagrees"])
    if flagged:
        head.append(f"{flagged} run(s) where Slurm's record disagrees with the broker's "
                    "(DISAGREES)")
    return doc, "\n".join(head)
