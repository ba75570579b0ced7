"""IBM Spectrum LSF: what a job was given (compute hosts, their GPUs and CPUs, its end time).

Its runs are jsrun resource sets (marbled.batch.jsrun).

The hosts come from the environment LSF sets in every job (no command needed):

- LSB_JOBID: the job id.
- LSB_MCPU_HOSTS: "host1 n1 host2 n2 ...", each host with its slot count; else
  LSB_DJOB_HOSTFILE (one line per slot) or LSB_HOSTS (one word per slot).
- With CSM "easy mode" (Summit's `bsub -nnodes N`), the first host is the launch
  node the batch script runs on, listed with one slot: it has no GPUs for jsrun
  and is left out. The OLCF batch-script examples count compute nodes the same
  way (unique hosts of LSB_DJOB_HOSTFILE less one).
  https://github.com/olcf-tutorials/Batch-Script-Examples
  https://docs.olcf.ornl.gov/systems/summit_user_guide.html (Node Types: login, launch, compute)

LSF's environment does not say how many GPUs a host has. They come from the
caller (`gpus_per_node`), else -- when the batch host is itself a compute host
-- from CUDA_VISIBLE_DEVICES there, else Summit's 6 per node.

The end time is the job's start plus its run limit, from
`bjobs -o "jobid stat start_time runtimelimit time_left" -json JOBID`
(`-json` needs `-o`; its output is {"COMMAND": "bjobs", "JOBS": n, "RECORDS": [{FIELD: "value"}]}
with the field names in upper case; a job bjobs does not know comes back as a record with
an "ERROR" field).
  https://www.ibm.com/docs/en/SSWRJV_10.1.0/lsf_command_ref/bjobs.o.1.html
  https://www.ibm.com/support/knowledgecenter/SSWRJV_10.1.0/lsf_command_ref/bjobs.json.1.html
runtimelimit is in minutes ("120.0", with "/host" appended under ABS_RUNLIMIT, or
hh:mm:ss with -hms), start_time a local time stamp ("Nov 22 10:00", with the year
when LSB_DISPLAY_YEAR=Y), time_left "hours:minutes L|E|X" (the fallback).
  https://www.ibm.com/support/knowledgecenter/SSWRJV_10.1.0/lsf_command_ref/bjobs.hms.1.html
  https://www.ibm.com/support/knowledgecenter/SSWRJV_10.1.0/lsf_command_ref/bjobs.__w__l.1.html

The parse functions are pure; `lsf_allocation()` adds the environment and bjobs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping

from marbled.batch import ALLOCATION_VARS
from marbled.batch.base import Allocation, AllocationError, BatchSystem
from marbled.batch.jsrun import JsrunLauncher

JOB_ID_VAR = ALLOCATION_VARS["jsrun"]
SUMMIT_GPUS_PER_NODE = 6
BJOBS_FIELDS = "jobid stat start_time runtimelimit time_left"

_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_STAMP = re.compile(r"^([A-Z][a-z]{2})\s+(\d{1,2})\s+(\d{1,2}):(\d{2})(?::(\d{2}))?"
                    r"(?:\s+(\d{4}))?(?:\s+[A-Z])?\s*$")
_HOURS_MINUTES = re.compile(r"^(\d+):(\d{2})(?::(\d{2}))?(?:\s+[A-Z])?\s*$")


# ------------------------------------------------------------------ hosts (environment)

def parse_mcpu_hosts(value: str) -> list[tuple[str, int]]:
    """'batch1 1 a01n01 42 a01n02 42' -> [('batch1', 1), ('a01n01', 42), ('a01n02', 42)]."""
    words = value.split()
    if len(words) % 2:
        raise AllocationError(f"LSB_MCPU_HOSTS is not 'host slots' pairs: {value!r}")
    hosts: dict[str, int] = {}
    for host, slots in zip(words[::2], words[1::2], strict=True):
        if not slots.isdigit():
            raise AllocationError(f"LSB_MCPU_HOSTS: {slots!r} is not a slot count")
        hosts[host] = hosts.get(host, 0) + int(slots)
    return list(hosts.items())


def count_hosts(names: list[str]) -> list[tuple[str, int]]:
    """One name per slot (LSB_DJOB_HOSTFILE lines, LSB_HOSTS words) -> (host, slots), in order."""
    hosts: dict[str, int] = {}
    for name in names:
        hosts[name] = hosts.get(name, 0) + 1
    return list(hosts.items())


def has_launch_node(hosts: list[tuple[str, int]], env: Mapping[str, str]) -> bool:
    """True for a CSM job (Summit's -nnodes): the first host is a launch node, not a compute host.

    It is known by CSM_ALLOCATION_ID in the job, or by its single slot next to
    hosts that each have more (Summit: 1 on the launch node, 42 on a compute node).
    """
    if len(hosts) < 2:
        return False
    if env.get("CSM_ALLOCATION_ID"):
        return True
    return hosts[0][1] == 1 and all(slots > 1 for _, slots in hosts[1:])


def parse_lsf_env(env: Mapping[str, str], gpus_per_node: int | None = None,
                  launch_node: bool | None = None, hostfile: str | None = None) -> Allocation:
    """An allocation (without its end time) from a job's LSF environment.

    `launch_node`: whether the first host is a launch node to leave out (None: guess,
    see has_launch_node). `hostfile`: the text of LSB_DJOB_HOSTFILE, for when
    LSB_MCPU_HOSTS is not set.
    """
    job_id = env.get(JOB_ID_VAR)
    if not job_id:
        raise AllocationError(f"not inside an LSF job (no {JOB_ID_VAR}); run marbled from a bsub "
                              "script or an interactive bsub -Is shell, or pass --launcher local")
    if env.get("LSB_MCPU_HOSTS", "").strip():
        hosts = parse_mcpu_hosts(env["LSB_MCPU_HOSTS"])
    elif hostfile is not None:
        hosts = count_hosts([line.strip() for line in hostfile.splitlines() if line.strip()])
    elif env.get("LSB_HOSTS", "").strip():
        hosts = count_hosts(env["LSB_HOSTS"].split())
    else:
        raise AllocationError(f"LSF job {job_id}: neither LSB_MCPU_HOSTS, LSB_DJOB_HOSTFILE "
                              "nor LSB_HOSTS names its hosts")
    if not hosts:
        raise AllocationError(f"LSF job {job_id} lists no hosts")
    batch = hosts[0][0]
    if launch_node is None:
        launch_node = has_launch_node(hosts, env)
    compute = hosts[1:] if launch_node else hosts
    if not compute:
        raise AllocationError(f"LSF job {job_id} has no compute host besides launch node {batch}")
    devices = _gpu_names(env, gpus_per_node, batch_is_compute=not launch_node)
    return Allocation(job_id, {h: devices for h, _ in compute}, dict(compute), None, batch,
                      source="lsf")


def _gpu_names(env: Mapping[str, str], gpus_per_node: int | None,
               batch_is_compute: bool) -> tuple[str, ...]:
    if gpus_per_node is not None:
        if gpus_per_node < 0:
            raise AllocationError(f"GPUs per node must not be negative, not {gpus_per_node}")
        return tuple(str(i) for i in range(gpus_per_node))
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    # A launch node's CUDA_VISIBLE_DEVICES says nothing about the compute hosts.
    if batch_is_compute and visible and visible not in ("-1", "NoDevFiles"):
        return tuple(d.strip() for d in visible.split(",") if d.strip())
    return tuple(str(i) for i in range(SUMMIT_GPUS_PER_NODE))


# ------------------------------------------------------------------ end time (bjobs)

def bjobs_argv(job_id: str) -> list[str]:
    return ["bjobs", "-o", BJOBS_FIELDS, "-json", job_id]


def parse_bjobs_json(text: str, job_id: str, now: float | None = None) -> float | None:
    """The end time (Unix time) of `job_id` from `bjobs -o ... -json` output; None if unlimited."""
    now = time.time() if now is None else now
    try:
        data = json.loads(text)
        records = data["RECORDS"]
    except (ValueError, KeyError, TypeError):
        raise AllocationError(f"not the output of 'bjobs -json': {text[:200]!r}") from None
    record = next((r for r in records if isinstance(r, dict) and str(r.get("JOBID")) == job_id),
                  None)
    if record is None:
        raise AllocationError(f"bjobs did not report job {job_id}")
    if record.get("ERROR"):
        raise AllocationError(f"bjobs: {record['ERROR']}")
    stat = record.get("STAT")
    if stat not in (None, "RUN"):
        raise AllocationError(f"LSF job {job_id} is {stat}, not RUN")
    limit = parse_runtime_limit(record.get("RUNTIMELIMIT", ""))
    start = parse_lsf_time(record.get("START_TIME", ""), now)
    if limit is not None and start is not None:
        return start + limit
    left = parse_time_left(record.get("TIME_LEFT", ""))
    return now + left if left is not None else None


def parse_runtime_limit(value: str) -> float | None:
    """Seconds from bjobs' runtimelimit ('120.0', '120.0/hostA' in minutes; '02:00:00'); None
    for no limit."""
    value = (value or "").split("/", 1)[0].strip()
    if value in ("", "-", "UNLIMITED"):
        return None
    if ":" in value:
        parts = [int(p) for p in value.split(":")]
        if len(parts) == 2:
            parts.append(0)
        hours, minutes, seconds = parts
        return hours * 3600.0 + minutes * 60 + seconds
    try:
        return float(value) * 60
    except ValueError:
        raise AllocationError(f"bjobs: cannot read run limit {value!r}") from None


def parse_time_left(value: str) -> float | None:
    """Seconds from bjobs' time_left ('1:55 L', hours:minutes, or hh:mm:ss with -hms)."""
    found = _HOURS_MINUTES.match((value or "").strip())
    if not found:
        return None
    hours, minutes, seconds = found.groups()
    if seconds is not None:  # hh:mm:ss
        return int(hours) * 3600.0 + int(minutes) * 60 + int(seconds)
    return int(hours) * 3600.0 + int(minutes) * 60


def parse_lsf_time(value: str, now: float | None = None) -> float | None:
    """A bjobs time stamp ('Nov 22 10:05', 'Nov 22 10:05:07 2024') in local time -> Unix time.

    Without a year: the year that puts it at most a day after `now`.
    """
    found = _STAMP.match((value or "").strip())
    if not found or found.group(1) not in _MONTHS:
        return None
    month, day, hour, minute, second, year = found.groups()
    fields = [_MONTHS[month], int(day), int(hour), int(minute), int(second or 0)]
    if year:
        return _mktime(int(year), *fields)
    now = time.time() if now is None else now
    this_year = time.localtime(now).tm_year
    stamp = _mktime(this_year, *fields)
    return stamp if stamp <= now + 86400 else _mktime(this_year - 1, *fields)


def _mktime(year: int, month: int, day: int, hour: int, minute: int, second: int) -> float:
    return time.mktime((year, month, day, hour, minute, second, 0, 0, -1))


# ------------------------------------------------------------------ the real thing

def _run_bjobs(argv: list[str]) -> str:
    env = {**os.environ, "LSB_DISPLAY_YEAR": "Y"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                              env=env)
    except FileNotFoundError:
        raise AllocationError(f"{argv[0]} not found: is LSF installed here?") from None
    except subprocess.TimeoutExpired:
        raise AllocationError(f"'{' '.join(argv)}' did not answer in 30 s") from None
    if done.returncode != 0 and not done.stdout.strip():
        raise AllocationError(f"'{' '.join(argv)}' failed: {done.stderr.strip()}")
    return done.stdout


def lsf_allocation(job_id: str | None = None, gpus_per_node: int | None = None,
                   launch_node: bool | None = None, env: Mapping[str, str] | None = None,
                   run: Callable[[list[str]], str] = _run_bjobs) -> Allocation:
    """The allocation of the LSF job this runs in (or `job_id`), its end time from bjobs."""
    env = dict(os.environ if env is None else env)
    if job_id:
        env[JOB_ID_VAR] = job_id
    hostfile = None
    if not env.get("LSB_MCPU_HOSTS") and env.get("LSB_DJOB_HOSTFILE"):
        try:
            with open(env["LSB_DJOB_HOSTFILE"]) as f:
                hostfile = f.read()
        except OSError as exc:
            raise AllocationError(f"cannot read LSB_DJOB_HOSTFILE: {exc}") from None
    allocation = parse_lsf_env(env, gpus_per_node, launch_node, hostfile)
    end = parse_bjobs_json(run(bjobs_argv(allocation.job_id)), allocation.job_id)
    return Allocation(allocation.job_id, allocation.nodes, allocation.cpus, end,
                      allocation.batch_node, source="lsf")


# ------------------------------------------------------------------ the system

class LsfSystem(BatchSystem):
    """LSF with jsrun. The broker runs with the batch script on the job's first host (the
    launch node on Summit): Allocation.batch_node, BatchSystem.broker_node's answer."""

    name = "LSF"
    launcher_name = "jsrun"
    allocation_var = JOB_ID_VAR
    command = "jsrun"

    def read_allocation(self) -> Allocation:
        return lsf_allocation()

    def launcher(self, allocation: Allocation, step_args: tuple[str, ...] = ()) -> JsrunLauncher:
        return JsrunLauncher(allocation, step_args)
