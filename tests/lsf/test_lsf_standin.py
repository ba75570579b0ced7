"""LSF support (marbled.batch.jsrun, marbled.batch.lsf) against STAND-INS.

LSF and jsrun cannot run here. The command lines and parsers are tested as pure
functions; everything that runs goes through tests/lsf/standin/{jsrun,bjobs}: small
scripts that accept only the options marbled passes, run the resource set here on
fake GPUs, and print bjobs' JSON. Passing these says marbled drives *those*
correctly, not that real JSM behaves as they do: every such test is named STAND-IN.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marbled.batch.base import Allocation, AllocationError, LaunchRequest
from marbled.batch.jsrun import (
    STEP_INFO,
    JsrunLauncher,
    cpu_threads,
    erf_text,
    jsrun_argv,
)
from marbled.batch.lsf import (
    BJOBS_FIELDS,
    bjobs_argv,
    has_launch_node,
    lsf_allocation,
    parse_bjobs_json,
    parse_lsf_env,
    parse_lsf_time,
    parse_mcpu_hosts,
    parse_runtime_limit,
    parse_time_left,
)
from marbled.batch.supervise import step_exit_code as exit_code
from marbled.cli.client import BrokerClient
from marbled.paths import socket_path
from marbled.resources import workload_path
from tests import REPO
from tests.scenarios import (
    JOBS,
    JOBSET3_DONE,
    db_rows,
    jobset,
    run_figure5,
    runs_by_job,
    training,
)

STANDIN = Path(__file__).with_name("standin")
SUMMIT_ENV = {"LSB_JOBID": "4242", "LSB_MCPU_HOSTS": "batch1 1 a01n01 42 a01n02 42"}
SIX = tuple("012345")


def _bjobs_json(**record) -> str:
    return json.dumps({"COMMAND": "bjobs", "JOBS": 1, "RECORDS": [record]})


# ------------------------------------------------------------------ command lines (pure)

def test_jsrun_line_is_one_resource_set_of_one_task():
    argv = jsrun_argv(3, 21, Path("/r/jsrun-step.json"), ("python", "train.py", "--x"))
    assert argv == ["jsrun", "--nrs", "1", "--tasks_per_rs", "1", "--cpu_per_rs", "21",
                    "--gpu_per_rs", "3", "--rs_per_host", "1", "--bind", "rs",
                    sys.executable, "-m", "marbled.batch.step", "/r/jsrun-step.json",
                    "python", "train.py", "--x"]


def test_jsrun_line_of_a_run_on_two_hosts_is_one_set_on_each():
    argv = jsrun_argv(6, 42, Path("/r/i.json"), ("a.out",), hosts=2)
    assert argv[:13] == ["jsrun", "--nrs", "2", "--tasks_per_rs", "1", "--cpu_per_rs", "42",
                         "--gpu_per_rs", "6", "--rs_per_host", "1", "--bind", "rs"]


def test_jsrun_line_of_a_per_gpu_run_has_a_task_per_gpu_in_each_hosts_set():
    argv = jsrun_argv(3, 21, Path("/r/i.json"), ("a.out",), hosts=2, per_gpu=True)
    assert argv[:13] == ["jsrun", "--nrs", "2", "--tasks_per_rs", "3", "--cpu_per_rs", "21",
                         "--gpu_per_rs", "3", "--rs_per_host", "1", "--bind", "rs"]
    erf = JsrunLauncher(_allocation("a", "b")).erf_for((("b", ("4", "5")),), tasks=2)
    assert erf.splitlines()[1:] == ["rank: 0: { host: b; cpu: {112-167}; gpu: {4,5} }",
                                    "rank: 1: { host: b; cpu: {112-167}; gpu: {4,5} }"]


def test_jsrun_line_with_resource_file_and_extra_options():
    argv = jsrun_argv(2, 14, Path("/r/i.json"), ("a.out",), ("--smpiargs=off",),
                      erf_file=Path("/r/jsrun.erf"))
    assert argv == ["jsrun", "--erf_input", "/r/jsrun.erf", "--smpiargs=off",
                    sys.executable, "-m", "marbled.batch.step", "/r/i.json", "a.out"]


def test_erf_gives_each_gpu_its_share_of_the_hosts_hardware_threads():
    # Summit: 42 cores, 6 GPUs -> 7 cores a GPU, 4 threads a core (SMT4)
    assert cpu_threads([0, 1, 2], 7, 4) == [(0, 83)]
    assert cpu_threads([4, 3], 7, 4) == [(84, 139)]
    assert cpu_threads([0, 5], 7, 1) == [(0, 6), (35, 41)]
    assert erf_text([("a01n02", ("3", "4"), [(84, 139)]), ("a01n03", ("0",), [(0, 27)])]) == (
        "cpu_index_using: logical\n"
        "rank: 0: { host: a01n02; cpu: {84-139}; gpu: {3,4} }\n"
        "rank: 1: { host: a01n03; cpu: {0-27}; gpu: {0} }\n")


def _allocation(*hosts: str) -> Allocation:
    return Allocation("4242", {h: SIX for h in hosts}, {h: 42 for h in hosts}, None, "batch1",
                      source="lsf")


def test_launcher_places_with_a_resource_file_only_when_there_is_a_host_to_choose():
    one, two = JsrunLauncher(_allocation("a01n01")), JsrunLauncher(_allocation("a", "b"))
    assert (one.placement, two.placement) == ("rs", "erf")
    assert JsrunLauncher(_allocation("a", "b"), placement="rs").placement == "rs"
    assert one.name == "jsrun" and one.cpus_for("a01n01", 3) == 21
    assert two.erf_for((("b", ("5",)),)) == (
        "cpu_index_using: logical\nrank: 0: { host: b; cpu: {140-167}; gpu: {5} }\n")
    assert JsrunLauncher(_allocation("a", "b"), smt=2).erf_for((("a", ("0", "1")),)).count(
        "cpu: {0-27}") == 1
    with pytest.raises(ValueError):
        JsrunLauncher(_allocation("a"), placement="host")


def test_jsrun_exit_status_of_a_signalled_task_reads_as_minus_the_signal():
    assert exit_code(128 + signal.SIGTERM) == -signal.SIGTERM
    assert exit_code(0) == 0 and exit_code(3) == 3 and exit_code(-9) == -9


# ------------------------------------------------------------------ LSF environment (pure)

def test_mcpu_hosts_pairs_and_summit_launch_node():
    hosts = parse_mcpu_hosts("batch1 1 a01n01 42 a01n02 42")
    assert hosts == [("batch1", 1), ("a01n01", 42), ("a01n02", 42)]
    assert has_launch_node(hosts, {})
    assert not has_launch_node([("h1", 4), ("h2", 4)], {})
    assert not has_launch_node([("h1", 1)], {})
    assert has_launch_node([("h1", 4), ("h2", 4)], {"CSM_ALLOCATION_ID": "34435"})
    with pytest.raises(AllocationError):
        parse_mcpu_hosts("h1 4 h2")


def test_summit_job_gets_its_compute_hosts_with_six_gpus_each():
    alloc = parse_lsf_env({**SUMMIT_ENV, "CUDA_VISIBLE_DEVICES": "0"})  # the launch node's
    assert alloc.job_id == "4242" and alloc.batch_node == "batch1"
    assert alloc.nodes == {"a01n01": SIX, "a01n02": SIX}
    assert alloc.cpus == {"a01n01": 42, "a01n02": 42}
    assert alloc.end_time is None and alloc.source == "lsf"
    assert parse_lsf_env(SUMMIT_ENV, gpus_per_node=4).nodes["a01n01"] == tuple("0123")


def test_plain_lsf_job_runs_on_its_first_host_with_its_visible_gpus():
    env = {"LSB_JOBID": "9", "LSB_MCPU_HOSTS": "h1 8 h2 8", "CUDA_VISIBLE_DEVICES": "2,3"}
    alloc = parse_lsf_env(env)
    assert alloc.nodes == {"h1": ("2", "3"), "h2": ("2", "3")} and alloc.batch_node == "h1"
    # a launch node's CUDA_VISIBLE_DEVICES says nothing of the compute hosts
    assert parse_lsf_env(env, launch_node=True).nodes == {"h2": SIX}


def test_hosts_from_the_hostfile_or_lsb_hosts_when_lsb_mcpu_hosts_is_missing():
    alloc = parse_lsf_env({"LSB_JOBID": "9"}, hostfile="batch2\n" + "b01n01\n" * 42)
    assert alloc.nodes == {"b01n01": SIX} and alloc.cpus == {"b01n01": 42}
    alloc = parse_lsf_env({"LSB_JOBID": "9", "LSB_HOSTS": "h1 h1 h2 h2"}, gpus_per_node=2)
    assert alloc.nodes == {"h1": ("0", "1"), "h2": ("0", "1")}


def test_no_lsf_job_no_hosts():
    with pytest.raises(AllocationError, match="LSB_JOBID"):
        parse_lsf_env({})
    with pytest.raises(AllocationError, match="names its hosts"):
        parse_lsf_env({"LSB_JOBID": "9"})


# ------------------------------------------------------------------ bjobs (pure)

def test_end_time_is_start_plus_run_limit():
    start = time.mktime((2024, 11, 22, 10, 0, 7, 0, 0, -1))
    for limit in ("120.0", "120.0/a01n01", "02:00:00"):
        out = _bjobs_json(JOBID="4242", STAT="RUN", START_TIME="Nov 22 10:00:07 2024",
                          RUNTIMELIMIT=limit, TIME_LEFT="1:40 L")
        assert parse_bjobs_json(out, "4242") == start + 7200
    assert bjobs_argv("4242") == ["bjobs", "-o", BJOBS_FIELDS, "-json", "4242"]


def test_end_time_falls_back_to_time_left_and_is_none_without_limit():
    out = _bjobs_json(JOBID="1", STAT="RUN", START_TIME="", RUNTIMELIMIT="", TIME_LEFT="1:40 L")
    assert parse_bjobs_json(out, "1", now=1000.0) == 1000.0 + 6000
    out = _bjobs_json(JOBID="1", STAT="RUN", START_TIME="Nov 22 10:00", RUNTIMELIMIT="",
                      TIME_LEFT="")
    assert parse_bjobs_json(out, "1") is None


def test_bjobs_errors_are_allocation_errors():
    with pytest.raises(AllocationError, match="not found"):
        parse_bjobs_json(_bjobs_json(JOBID="1", ERROR="Job <1> is not found"), "1")
    with pytest.raises(AllocationError, match="PEND"):
        parse_bjobs_json(_bjobs_json(JOBID="1", STAT="PEND"), "1")
    with pytest.raises(AllocationError, match="did not report"):
        parse_bjobs_json(_bjobs_json(JOBID="2", STAT="RUN"), "1")
    with pytest.raises(AllocationError, match="bjobs -json"):
        parse_bjobs_json("Job <1> is not found", "1")


def test_lsf_time_stamps_and_durations():
    now = time.mktime((2025, 1, 2, 12, 0, 0, 0, 0, -1))
    assert parse_lsf_time("Dec 31 23:00", now) == time.mktime((2024, 12, 31, 23, 0, 0, 0, 0, -1))
    assert parse_lsf_time("Jan  2 11:59", now) == time.mktime((2025, 1, 2, 11, 59, 0, 0, 0, -1))
    assert parse_lsf_time("Jan 2 11:59:30 2025 L") == time.mktime(
        (2025, 1, 2, 11, 59, 30, 0, 0, -1))
    assert parse_lsf_time("-") is None and parse_lsf_time("Foo 2 11:59") is None
    assert parse_runtime_limit("30.0") == 1800 and parse_runtime_limit("-") is None
    assert parse_runtime_limit("1:30") == 5400
    assert parse_time_left("0:05 E") == 300 and parse_time_left("01:00:30") == 3630
    assert parse_time_left("-") is None


def test_lsf_allocation_asks_bjobs_for_the_end_time():
    asked = []

    def bjobs(argv):
        asked.append(argv)
        return _bjobs_json(JOBID="4242", STAT="RUN", START_TIME="Nov 22 10:00:00 2024",
                           RUNTIMELIMIT="60.0", TIME_LEFT="0:10 L")

    alloc = lsf_allocation(env=SUMMIT_ENV, run=bjobs)
    assert asked == [bjobs_argv("4242")]
    assert alloc.end_time == time.mktime((2024, 11, 22, 11, 0, 0, 0, 0, -1))
    assert sorted(alloc.nodes) == ["a01n01", "a01n02"] and alloc.batch_node == "batch1"


# ------------------------------------------------------------------ STAND-INS

def _standin_env(tmp_path: Path, *hosts: str, **extra: str) -> dict[str, str]:
    """An LSF job's environment on this machine, with the stand-ins first on PATH."""
    return {
        "PATH": os.pathsep.join([str(STANDIN), str(Path(sys.executable).parent),
                                 os.environ.get("PATH", "")]),
        "LSB_JOBID": "4242",
        "LSB_MCPU_HOSTS": " ".join(["batch1 1", *(f"{h} 42" for h in hosts)]),
        "JSRUN_STANDIN_STATE": str(tmp_path / "jsrun-state.json"),
        "JSRUN_STANDIN_LOG": str(tmp_path / "jsrun-log.jsonl"),
        **extra,
    }


def _standin_log(tmp_path: Path) -> list[dict]:
    path = tmp_path / "jsrun-log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_jsrun_standin_rejects_what_the_launcher_never_passes(tmp_path):
    """STAND-IN: the stand-in is strict, so a launcher change it does not know fails here."""
    env = {**os.environ, **_standin_env(tmp_path, "a01n01")}
    shape = ["--nrs", "1", "--tasks_per_rs", "1", "--cpu_per_rs", "7", "--gpu_per_rs", "1",
             "--rs_per_host", "1", "--bind", "rs"]
    for bad in (["-n", "1", "true"], [*shape, "--stdio_mode", "collected", "true"],
                [*shape[:-2], "true"], ["--nrs", "2", *shape[2:], "true"], shape):
        done = subprocess.run([str(STANDIN / "jsrun"), *bad], env=env, capture_output=True,
                              text=True, check=False)
        assert done.returncode == 2 and "STAND-IN" in done.stderr, (bad, done.stderr)
    done = subprocess.run([str(STANDIN / "jsrun"), *shape, sys.executable, "-c",
                           "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
                          env=env, capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, "0\n")


def test_jsrun_standin_bjobs_output_gives_the_allocation_end_time(tmp_path, monkeypatch):
    """STAND-IN: lsf_allocation() through the bjobs stand-in (the real bjobs call path)."""
    start = int(time.time()) - 600
    for key, value in _standin_env(tmp_path, "a01n01", BJOBS_STANDIN_START=str(start),
                                   BJOBS_STANDIN_RUNLIMIT="90").items():
        monkeypatch.setenv(key, value)
    alloc = lsf_allocation()
    with pytest.raises(AllocationError, match="not found"):
        lsf_allocation(job_id="99")
    assert alloc.nodes == {"a01n01": SIX} and alloc.cpus == {"a01n01": 42}
    assert alloc.end_time == start + 90 * 60


# "ready" appears whole (a rename): the tests signal the job as soon as it exists, and a
# SIGTSTP that came while open() made it and wrote to it was lost in 13 of 300 runs: its
# handler ran, but its SystemExit was dropped in that C code, and the job slept on to exit 5;
# none of 300 with the rename
_JOB = """
import os, signal, sys, time
signal.signal(signal.SIGTSTP, lambda *a: sys.exit(0))
with open("ready.part", "w") as f:
    f.write(os.environ["CUDA_VISIBLE_DEVICES"])
os.rename("ready.part", "ready")
if sys.argv[1] == "die":
    os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
sys.exit(5)
"""


def _request(run_dir: Path, run_id: int, node: str, devices: tuple[str, ...],
             how: str) -> LaunchRequest:
    run_dir.mkdir(parents=True, exist_ok=True)
    return LaunchRequest((sys.executable, "-c", _JOB, how),
                         {"MARBLE_RUN_ID": str(run_id), "MARBLE_JOB_ID": "1"}, node, devices,
                         run_dir, run_dir / "out", run_dir / "err")


async def _until(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _signal_masks(pid: int) -> dict[str, str]:
    """State and the signal masks of `pid` (/proc/PID/status), for a failure's message."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.strip() for k, _, v in (line.partition(":") for line in f)
                    if k in ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")}
    except OSError as exc:
        return {"error": str(exc)}


def test_jsrun_standin_launcher_runs_reports_signals_and_adopts(tmp_path, monkeypatch):
    """STAND-IN: a run through jsrun reports its GPUs from inside, a SIGTSTP to the handle
    reaches the job through jsrun, a run killed by SIGTERM ends with -15, and a handle
    adopted after a restart watches and signals the same jsrun."""
    for key, value in _standin_env(tmp_path, "a01n01").items():
        monkeypatch.setenv(key, value)
    launcher = JsrunLauncher(_allocation("a01n01"))

    async def scenario():
        first = await launcher.launch(_request(tmp_path / "j1", 7, "a01n01", ("0", "1"), "wait"))
        info = await first.placement(timeout=20)
        assert info["run_id"] == "7" and len(info["gpus"].split(",")) == 2
        assert (tmp_path / "j1" / STEP_INFO).exists()
        await _until((tmp_path / "j1" / "ready").exists)
        before = _signal_masks(int(info["pid"]))
        assert first.signal(signal.SIGTSTP)
        # (the masks, should the job ever sleep on to its end again: see _JOB)
        assert await first.wait() == 0, f"the job's signals before SIGTSTP: {before}"
        assert not first.signal(signal.SIGTSTP)

        dying = await launcher.launch(_request(tmp_path / "j2", 8, "a01n01", ("2",), "die"))
        assert await dying.wait() == -signal.SIGTERM

        third = await launcher.launch(_request(tmp_path / "j3", 9, "a01n01", ("3",), "wait"))
        await _until((tmp_path / "j3" / "ready").exists)
        adopted = launcher.adopt(third.pid, third.pid_start, tmp_path / "j3", 9)
        assert (await adopted.placement(timeout=5))["run_id"] == "9"
        assert adopted.signal(0) and adopted.signal(signal.SIGTSTP)
        assert await third.wait() == 0
        assert await adopted.wait() is None  # not its child: no status to read

    asyncio.run(scenario())
    log = _standin_log(tmp_path)
    assert [e["sig"] for e in log if e["event"] == "signal"] == ["SIGTSTP", "SIGTSTP"]
    starts = [e for e in log if e["event"] == "start"]
    assert [(e["mode"], [(len(s["gpus"]), len(s["cores"])) for s in e["sets"]])
            for e in starts] == [("rs", [(2, 14)]), ("rs", [(1, 7)]), ("rs", [(1, 7)])]


def test_jsrun_standin_resource_file_puts_the_run_on_the_brokers_host_and_gpus(
        tmp_path, monkeypatch):
    """STAND-IN: with two compute hosts every run carries an ERF naming the host and GPUs
    the broker chose; the stand-in places it there (and would fail on a bad file)."""
    for key, value in _standin_env(tmp_path, "a01n01", "a01n02").items():
        monkeypatch.setenv(key, value)
    launcher = JsrunLauncher(_allocation("a01n01", "a01n02"))

    async def scenario():
        run = await launcher.launch(_request(tmp_path / "j1", 3, "a01n02", ("4", "5"), "wait"))
        assert (await run.placement(timeout=20))["gpus"] == "4,5"
        await _until((tmp_path / "j1" / "ready").exists)
        run.signal(signal.SIGTSTP)
        assert await run.wait() == 0

    asyncio.run(scenario())
    (start,) = [e for e in _standin_log(tmp_path) if e["event"] == "start"]
    assert start["mode"] == "erf"
    assert start["sets"] == [{"host": "a01n02", "gpus": [4, 5], "cores": list(range(28, 42))}]
    assert (tmp_path / "j1" / "jsrun.erf").read_text() == launcher.erf_for(
        (("a01n02", ("4", "5")),))


@pytest.mark.daemon
def test_jsrun_standin_figure5_through_a_real_broker(daemon_factory, tmp_path):
    """STAND-IN: Figure 5 with a real marbled --launcher jsrun in a stood-in Summit job (a
    launch node and one compute host of 42 cores and 6 GPUs): ResNet-50 primary on 3,
    Inception-v3 secondary on 3 then primary on 4, VGG-16 to its 800 steps; every run a
    jsrun resource set whose GPUs the broker read back from inside it."""
    d = daemon_factory("--launcher", "jsrun", gpus=None,
                       env=_standin_env(tmp_path, "a01n01", BJOBS_STANDIN_RUNLIMIT="120"))
    all_runs = run_figure5(d, "a01n01")
    log = _standin_log(tmp_path)
    starts = [e for e in log if e["event"] == "start"]
    assert len(starts) == len(all_runs) and {e["mode"] for e in starts} == {"rs"}
    assert sorted(len(e["sets"][0]["gpus"]) for e in starts) == sorted(
        r["gpu_count"] for r in all_runs)
    # the suspension of Inception-v3 (promotion) went through jsrun to the job
    assert any(e["event"] == "signal" and e["sig"] == "SIGTSTP" for e in log)


@pytest.mark.daemon
def test_jsrun_standin_two_hosts_every_run_where_the_broker_put_it(daemon_factory, tmp_path):
    """STAND-IN: a stood-in Summit job with two compute hosts: every run carries an ERF, and
    the stand-in ran each on the broker's host with the broker's GPUs, which the run then
    reported from inside (devices) -- the broker's bookkeeping is the placement."""
    d = daemon_factory("--launcher", "jsrun", gpus=None,
                       env=_standin_env(tmp_path, "a01n01", "a01n02"))
    assert sorted(d.client.get("/v1/status")["nodes"]) == ["a01n01", "a01n02"]
    d.submit(*jobset(4))
    jobs = d.wait_all(timeout=180)
    assert [j["state"] for j in jobs] == ["done"] * 5
    runs = d.runs()
    assert {r["node"] for r in runs} == {"a01n01", "a01n02"}
    starts: dict[str, list[dict]] = {}
    for e in _standin_log(tmp_path):
        if e["event"] == "start":  # the job's by its ERF, in its directory of the state dir
            erf = Path(e["argv"][e["argv"].index("--erf_input") + 1])
            starts.setdefault(erf.parent.name, []).append(e)
    assert sum(map(len, starts.values())) == len(runs)
    chdir = {j["id"]: j["chdir"] for j in jobs}
    for job_id, job_runs in runs_by_job(d).items():
        for run, start in zip(job_runs, starts[str(job_id)], strict=True):
            assert start["mode"] == "erf"
            assert start["cwd"] == chdir[job_id]  # jsrun, and so its tasks, in the job's
            (placed,) = start["sets"]
            assert placed["host"] == run["node"]
            assert placed["gpus"] == [int(g) for g in run["gpu_ids"].split(",")]
            assert run["devices"] == run["gpu_ids"]  # device names are the GPU indices


# ------------------------------------------------------------------ the bsub script

BSUB_SCRIPT = REPO / "contrib" / "lsf" / "marble.bsub"


def _bsub_run(tmp_path: Path, opts: str = "") -> subprocess.Popen:
    """Run marble.bsub as LSF would on the launch node: bash, in the submit directory."""
    env = {**os.environ, **_standin_env(tmp_path, "a01n01"), "LS_SUBCWD": str(tmp_path),
           "MARBLED_OPTS": f"--time-scale 0.01 --monitor-interval 0.1 {opts}",
           "MARBLE_WAIT_INTERVAL": "0.5"}
    env.pop("MARBLE_STATE_DIR", None)
    return subprocess.Popen(
        ["bash", str(BSUB_SCRIPT), str(workload_path("paper-jobset3"))],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def _db(tmp_path: Path, sql: str) -> list[tuple]:
    return db_rows(tmp_path / "marble-state" / "marble.db", sql)

def test_jsrun_standin_bsub_script_runs_a_job_set_to_the_end(tmp_path):
    """STAND-IN: contrib/lsf/marble.bsub (run by bash as LSF would, the stand-ins on PATH)
    starts marbled --launcher jsrun, submits the job set and ends when every job is done."""
    script = _bsub_run(tmp_path)
    out, _ = script.communicate(timeout=180)
    assert script.returncode == 0, out
    assert _db(tmp_path, JOBS) == JOBSET3_DONE


@pytest.mark.daemon
def test_jsrun_standin_bsub_warning_suspends_all_and_the_next_allocation_finishes(tmp_path):
    """STAND-IN: LSF's warning action (-wa URG, here sent at once) reaches the broker through
    the script as SIGUSR2: every job is suspended, the script asks to be submitted again,
    and a second run of it on the same state directory finishes every job."""
    script = _bsub_run(tmp_path, "--time-scale 0.05")
    broker = BrokerClient(socket_path(tmp_path / "marble-state"), timeout=5)
    deadline = time.monotonic() + 60
    while not training(broker):
        assert script.poll() is None and time.monotonic() < deadline, script.communicate()[0]
        time.sleep(0.2)
    script.send_signal(signal.SIGURG)
    out, _ = script.communicate(timeout=120)
    assert script.returncode == 0 and "bsub this script again" in out, out
    suspended = _db(tmp_path, "SELECT job_id, end_step FROM runs WHERE end_reason = 'suspended'")
    assert len(suspended) >= 2 and all(step > 20 for _, step in suspended)
    again = _bsub_run(tmp_path)
    out, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out
    assert _db(tmp_path, JOBS) == JOBSET3_DONE
