"""The registry of batch systems: which one `marbled --launcher auto|local|slurm|jsrun [--gpus N]`
runs under, decided from a given environment and PATH (no Slurm or LSF needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from marbled.batch import ALLOCATION_VARS, LAUNCHERS, SYSTEMS, choose, detect, system_class
from marbled.batch.base import Allocation, AllocationError, BatchSystem
from marbled.batch.jsrun import JsrunLauncher
from marbled.batch.local import LocalLauncher, LocalSystem, host_name
from marbled.batch.lsf import LsfSystem
from marbled.batch.slurm import SlurmLauncher, SlurmSystem
from marbled.paths import allocation_id


@pytest.fixture
def path(tmp_path):
    """A PATH with fake srun and jsrun commands, each in its own directory."""
    dirs = {}
    for command in ("srun", "jsrun"):
        (tmp_path / command).mkdir()
        exe = tmp_path / command / command
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        dirs[command] = str(tmp_path / command)
    return dirs


def test_auto_is_slurm_inside_an_allocation_with_srun_on_path(path):
    env = {"SLURM_JOB_ID": "12", "PATH": path["srun"]}
    assert detect(env) is SlurmSystem
    assert type(choose("auto", env=env)) is SlurmSystem


def test_auto_is_jsrun_inside_an_lsf_job_with_jsrun_on_path(path):
    env = {"LSB_JOBID": "4242", "PATH": path["jsrun"]}
    assert detect(env) is LsfSystem
    assert type(choose("auto", env=env)) is LsfSystem


def test_auto_is_local_without_the_step_command_or_the_allocation(path):
    assert detect({"SLURM_JOB_ID": "12", "PATH": path["jsrun"]}) is LocalSystem
    assert detect({"LSB_JOBID": "4242", "PATH": path["srun"]}) is LocalSystem
    assert detect({"LSB_JOBID": "4242"}) is LocalSystem  # no PATH: no jsrun
    assert detect({"SLURM_JOB_ID": "", "PATH": path["srun"]}) is LocalSystem
    assert detect({"PATH": os.pathsep.join(path.values())}) is LocalSystem
    assert detect({}) is LocalSystem


def test_auto_prefers_slurm_when_both_would_do(path):
    env = {"SLURM_JOB_ID": "12", "LSB_JOBID": "4242", "PATH": os.pathsep.join(path.values())}
    assert detect(env) is SlurmSystem


def test_emulated_gpus_are_always_local_and_only_local(path):
    env = {"SLURM_JOB_ID": "12", "PATH": path["srun"]}
    system = choose("auto", 4, env=env)
    assert type(system) is LocalSystem and system.emulated_gpus == 4
    assert choose("local", 4).emulated_gpus == 4
    for name in ("slurm", "jsrun"):
        with pytest.raises(AllocationError, match=r"--gpus \(emulated GPUs\) needs --launcher "
                                                  "local"):
            choose(name, 4, env=env)


def test_explicit_launchers_are_taken_whatever_the_environment():
    assert type(choose("slurm", env={})) is SlurmSystem
    assert type(choose("jsrun", env={})) is LsfSystem
    assert type(choose("local", env={"SLURM_JOB_ID": "12"})) is LocalSystem


def test_registry_lists_every_launcher_once_and_the_variables_systems_declare():
    assert LAUNCHERS == ("auto", "local", "slurm", "jsrun")
    for name in SYSTEMS:
        cls = system_class(name)
        assert issubclass(cls, BatchSystem) and cls.launcher_name == name
        assert cls.allocation_var == ALLOCATION_VARS.get(name)
    assert ALLOCATION_VARS == {"slurm": "SLURM_JOB_ID", "jsrun": "LSB_JOBID"}
    assert (SlurmSystem.name, LsfSystem.name) == ("Slurm", "LSF")
    assert not SlurmSystem.prestart and not LsfSystem.prestart and LocalSystem.prestart


def test_state_directory_is_named_by_the_allocation(monkeypatch):
    for var in ALLOCATION_VARS.values():
        monkeypatch.delenv(var, raising=False)
    assert allocation_id() == "local"
    monkeypatch.setenv("LSB_JOBID", "4242")
    assert allocation_id() == "4242"
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert allocation_id() == "12"


def test_broker_node_per_system():
    alloc = Allocation("7", {"n1": ("0",), "n2": ("0",)}, {"n1": 2, "n2": 2}, None, "n1")
    assert SlurmSystem().broker_node(alloc, {"SLURMD_NODENAME": "n2"}) == "n2"
    assert SlurmSystem().broker_node(alloc, {}) is None  # salloc: on no node of the job
    assert LsfSystem().broker_node(alloc, {}) == "n1"  # the first host (launch node)
    local = LocalSystem(2)
    here = local.allocation()
    assert local.broker_node(here, {}) == host_name()
    assert here.nodes == {host_name(): ("0", "1")} and here.end_time is None
    assert local.gpu_source(here) == "emulated (2)"
    assert SlurmSystem().gpu_source(alloc) == "Slurm job 7"


def test_launchers_per_system():
    alloc = Allocation("7", {"n1": ("0", "1")}, {"n1": 8}, None, "n1")
    slurm = SlurmSystem().launcher(alloc, ("--mem-per-gpu=1G",))
    assert isinstance(slurm, SlurmLauncher) and slurm.extra_args == ("--mem-per-gpu=1G",)
    assert isinstance(LsfSystem().launcher(alloc), JsrunLauncher)
    assert isinstance(LocalSystem().launcher(alloc), LocalLauncher)
    # the CPU rule both step launchers share: the node's CPUs in proportion to GPUs, >= 1
    assert slurm.cpus_for("n1", 1) == 4 and LsfSystem().launcher(alloc).cpus_for("n1", 2) == 8
    starved = Allocation("7", {"n1": ("0", "1")}, {"n1": 1}, None)
    assert SlurmSystem().launcher(starved).cpus_for("n1", 2) == 1


def test_a_batch_allocation_without_gpus_or_cpus_enough():
    class Fake(SlurmSystem):
        def __init__(self, allocation):
            self.read = allocation

        def read_allocation(self):
            return self.read

    with pytest.raises(AllocationError, match="Slurm job 7 has no GPUs; ask for GPUs"):
        Fake(Allocation("7", {"n1": ()}, {"n1": 4}, None)).allocation()
    alloc = Allocation("7", {"n1": ("0", "1", "2"), "n2": ()}, {"n1": 2, "n2": 1}, None)
    assert Fake(alloc).allocation().gpu_nodes == {"n1": ("0", "1", "2")}
    assert Fake(alloc).warnings(alloc) == [
        "node n1: 2 CPUs for 3 GPUs; steps need one CPU per GPU to run side by side "
        "(ask for more with --cpus-per-task)"]
    assert LocalSystem().warnings(alloc) == []  # local runs are not confined to CPUs


def test_local_without_gpus_says_how_to_emulate(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML either
    with pytest.raises(AllocationError, match="pass --gpus N"):
        LocalSystem().allocation()


def test_paths_and_the_step_shim_import_no_batch_system():
    """Every `marble` command imports marbled.paths and every step starts with the shim:
    neither may pull in the system modules (asyncio)."""
    code = ("import sys, marbled.paths, marbled.batch.step; "
            "print(sorted(m for m in sys.modules if m.startswith('marbled.batch')), "
            "'asyncio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['marbled.batch', 'marbled.batch.step'] False"
