"""The pure parts of `marble report --slurm` (marbled.report.slurm_accounting): reading
sacct's and pyslurm slurmdb's records of job steps, and where they contradict the broker.

The samples are shaped like Slurm 22.05's output on a cluster WITH accounting storage
(slurmdbd); they are not this test cluster's, which keeps no accounting."""

from __future__ import annotations

import pytest

from marbled.report.slurm_accounting import (
    StepRecord,
    accounting_type,
    disagreement,
    from_slurmdb,
    joined,
    parse_sacct,
    slurm_bytes,
    slurm_seconds,
)

# sample output of `sacct --parsable2 --noconvert -j 4242
# --format=JobID,State,ExitCode,Elapsed,TotalCPU,MaxRSS` (not this cluster's)
SACCT_SAMPLE = """JobID|State|ExitCode|Elapsed|TotalCPU|MaxRSS
4242|RUNNING|0:0|00:12:31|00:00:00|
4242.batch|RUNNING|0:0|00:12:31|00:00.012|5632K
4242.extern|RUNNING|0:0|00:12:31|00:00:00|0
4242.0|COMPLETED|0:0|00:03:10|03:05.412|2114536K
4242.1|OUT_OF_MEMORY|0:125|00:00:41|00:39.870|8388608K
4242.2|CANCELLED by 0|0:9|00:01:02|01:01.002|1048576K
4242.3|FAILED|1:0|1-02:03:04|2-01:00:00|12.50M
"""


def test_parse_sacct_sample_output_gives_each_steps_record():
    got = parse_sacct(SACCT_SAMPLE)
    assert set(got) == {"4242", "4242.batch", "4242.extern", "4242.0", "4242.1", "4242.2",
                        "4242.3"}
    assert got["4242.0"] == StepRecord("4242.0", "COMPLETED", 0, 0, 190.0, 185.412,
                                       2114536 * 1024)
    assert got["4242.1"] == StepRecord("4242.1", "OUT_OF_MEMORY", 0, 125, 41.0, 39.87,
                                       8 * 2 ** 30)
    assert got["4242.2"].state == "CANCELLED"  # "by UID" dropped
    assert (got["4242.2"].exit_code, got["4242.2"].signal) == (0, 9)
    assert got["4242.3"].elapsed_s == 86400 + 2 * 3600 + 3 * 60 + 4
    assert got["4242.3"].cpu_s == 2 * 86400 + 3600
    assert got["4242.3"].max_rss == round(12.5 * 2 ** 20)
    assert got["4242"].max_rss is None  # not gathered for the job line


def test_parse_sacct_sample_output_in_another_field_order_and_a_requeue():
    text = ("State|JobID|MaxRSS|ExitCode|TotalCPU|Elapsed\n"
            "FAILED|77.0|100K|2:0|00:01.500|00:00:02\n"
            "COMPLETED|77.0|200K|0:0|00:03.000|00:00:04\n")
    assert parse_sacct(text) == {"77.0": StepRecord("77.0", "COMPLETED", 0, 0, 4.0, 3.0,
                                                    204800)}
    assert parse_sacct("") == {}


def test_parse_sacct_without_a_field_says_which():
    with pytest.raises(ValueError, match="lacks the field.*MaxRSS"):
        parse_sacct("JobID|State|ExitCode|Elapsed|TotalCPU\n1.0|COMPLETED|0:0|00:01|00:01\n")


@pytest.mark.parametrize("text,seconds", [
    ("00:00:07", 7.0), ("12:34", 754.0), ("01:02.500", 62.5), ("3-00:00:01", 259201.0),
    ("", None), ("INVALID", None), ("UNLIMITED", None)])
def test_slurm_seconds(text, seconds):
    assert slurm_seconds(text) == seconds


@pytest.mark.parametrize("text,size", [
    ("0", 0), ("1024", 1024), ("4K", 4096), ("1.5M", 1572864), ("2G", 2 ** 31), ("", None),
    ("n/a", None)])
def test_slurm_bytes(text, size):
    assert slurm_bytes(text) == size


def test_from_slurmdb_sample_record_reads_as_sacct_does():
    """pyslurm's slurmdb_jobs().get() shape (sample, not this cluster's): the exit code is
    a wait status (signal 9: 9; exit 1: 256), MaxRSS the memory TRES (id 2) in bytes."""
    jobs = {4242: {"jobid": 4242, "steps": {
        0: {"state_str": "COMPLETED", "exitcode": 0, "elapsed": 190, "tot_cpu_sec": 185,
            "tot_cpu_usec": 412000,
            "stats": {"tres_usage_in_max": "1=185412,2=2165284864,6=1949,7=7966720"}},
        2: {"state_str": "CANCELLED", "exitcode": 9, "elapsed": 62, "tot_cpu_sec": 61,
            "tot_cpu_usec": 2000, "stats": {"tres_usage_in_max": ""}},
        3: {"state_str": "FAILED", "exitcode": 256, "elapsed": 93784, "tot_cpu_sec": 0,
            "tot_cpu_usec": 0, "stats": {}}}}}
    got = from_slurmdb(jobs)
    assert got["4242.0"] == StepRecord("4242.0", "COMPLETED", 0, 0, 190, 185.412, 2165284864)
    assert (got["4242.2"].exit_code, got["4242.2"].signal, got["4242.2"].max_rss) == (0, 9, None)
    assert (got["4242.3"].exit_code, got["4242.3"].signal) == (1, 0)


def test_accounting_type_from_scontrol_show_config():
    config = ("AccountingStorageTRES   = cpu,mem,energy,node,billing\n"
              "AccountingStorageType   = accounting_storage/slurmdbd\n"
              "AccountingStorageUser   = root\n")
    assert accounting_type(config) == "accounting_storage/slurmdbd"
    assert accounting_type("ClusterName = lab\n") is None


def _rec(state: str, code: int = 0, sig: int = 0) -> StepRecord:
    return StepRecord("1.0", state, code, sig, 1.0, 1.0, None)


@pytest.mark.parametrize("outcome,exit_code,ended_by,slurm,flag", [
    ("done", 0, None, _rec("COMPLETED"), None),
    ("done", 0, None, _rec("OUT_OF_MEMORY", 0, 125), "broker: done, Slurm: OUT_OF_MEMORY"),
    ("done", 0, None, _rec("FAILED", 1), "broker: done, Slurm: FAILED"),
    ("failed", 1, None, _rec("COMPLETED"), "broker: failed, Slurm: COMPLETED"),
    ("failed", 1, None, _rec("FAILED", 1), None),
    ("failed", 1, None, _rec("FAILED", 2), "exit code: broker 1, Slurm 2"),
    ("failed", -9, "CANCELLED", _rec("CANCELLED", 0, 9), None),
    ("failed", -9, None, _rec("FAILED", 0, 15), "signal: broker 9, Slurm 15"),
    # the broker learnt Slurm's reason from the step's stderr: they agree
    ("failed", -9, "OUT_OF_MEMORY", _rec("OUT_OF_MEMORY", 0, 125), None),
    ("failed", -9, None, _rec("TIMEOUT", 0, 9), "broker: failed, Slurm: TIMEOUT"),
    # a suspension stopped by force (scancel --signal=KILL) is no contradiction
    ("suspended", -9, None, _rec("FAILED", 0, 9), None),
    ("suspended", 0, None, _rec("COMPLETED"), None),
    ("suspended", 0, None, _rec("NODE_FAIL"), "broker: suspended, Slurm: NODE_FAIL"),
    ("running", None, None, _rec("RUNNING"), None),
    ("running", None, None, _rec("COMPLETED"), "the broker's run is open, Slurm says COMPLETED"),
    ("done", 0, None, _rec("RUNNING"), "the broker's run ended (done), Slurm says RUNNING"),
])
def test_disagreement(outcome, exit_code, ended_by, slurm, flag):
    assert disagreement(outcome, exit_code, ended_by, slurm) == flag


def test_joined_puts_slurms_record_beside_each_run_and_says_what_is_missing():
    run = {"job_id": 1, "model": "resnet-50", "outcome": "done", "exit_code": 0,
           "ended_by": None}
    runs = [{**run, "run_id": 1, "slurm_job": "4242", "step": 1},
            {**run, "run_id": 2, "slurm_job": "4242", "step": 9},
            {**run, "run_id": 3, "slurm_job": None, "step": 0}]
    ok, unknown, unnamed = joined(runs, parse_sacct(SACCT_SAMPLE))
    assert ok["slurm_step"] == "4242.1"
    assert (ok["slurm_state"], ok["slurm_exit"], ok["elapsed_s"], ok["cpu_s"],
            ok["max_rss_mib"]) == ("OUT_OF_MEMORY", "0:125", 41.0, 39.87, 8192.0)
    assert ok["disagrees"] == "broker: done, Slurm: OUT_OF_MEMORY"
    assert unknown["disagrees"] == "Slurm's accounting has no record of this step"
    assert unnamed["slurm_step"] == "?.0" and "no Slurm job recorded" in unnamed["disagrees"]
    # without accounting: the broker's side only, nothing flagged
    assert all(r["slurm_state"] is None and r["disagrees"] is None
               for r in joined(runs, None))
