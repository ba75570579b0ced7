"""The ranks of a per-GPU run (pure): their variables on the local launcher, the step shim's
mapping of Slurm's and JSM's task numbers, and the srun line of one task per GPU."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from marbled.batch import ranks
from marbled.batch.ranks import (
    LISTEN_PORTS,
    LOCAL_ADDR,
    free_ports,
    listen_port_range,
    rank_envs,
)
from marbled.batch.slurm import srun_argv
from marbled.batch.step import task_rank_env


def test_ranks_take_node_zeros_gpus_first_and_see_their_nodes_gpus():
    """As under torchrun: every rank sees its node's GPUs of the run; LOCAL_RANK picks one."""
    envs = rank_envs((("n1", ("4", "5")), ("n2", ("0", "1"))), "10.0.0.1", 29500)
    assert [(e["RANK"], e["NODE_RANK"], e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"])
            for e in envs] == [("0", "0", "0", "4,5"), ("1", "0", "1", "4,5"),
                               ("2", "1", "0", "0,1"), ("3", "1", "1", "0,1")]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"])
            for e in envs} == {("4", "2", "10.0.0.1", "29500")}
    assert all("TF_CONFIG" not in e for e in envs)


def test_tf_config_names_every_rank_and_its_own_index():
    envs = rank_envs((("h", ("0", "1")),), "127.0.0.1", 1, tf_ports=[7001, 7002])
    assert [json.loads(e["TF_CONFIG"]) for e in envs] == [
        {"cluster": {"worker": ["127.0.0.1:7001", "127.0.0.1:7002"]},
         "task": {"type": "worker", "index": i}} for i in (0, 1)]


@pytest.mark.parametrize(("env", "expected"), [
    # srun -N2 --ntasks-per-node=2 (as measured in Slurm 22.05): task 3, node 1
    ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
      "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"},
     ("3", "4", "1", "2", "1")),
    # uneven nodes: 3 tasks on node 0, 2 on node 1
    ({"SLURM_PROCID": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
      "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "3,2"},
     ("4", "5", "1", "2", "1")),
    # jsrun --nrs 4 --rs_per_host 2: rank 2 is the first of the second host
    ({"JSM_NAMESPACE_RANK": "2", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_LOCAL_RANK": "0",
      "JSM_NAMESPACE_LOCAL_SIZE": "2"}, ("2", "4", "0", "2", "1")),
])
def test_a_batch_systems_task_numbers_become_torchs(env, expected):
    mapped = task_rank_env(env)
    assert tuple(mapped[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                     "NODE_RANK")) == expected


def test_outside_a_task_nothing_is_mapped():
    assert task_rank_env({"PATH": "/bin"}) == {}


def test_srun_line_of_a_per_gpu_run_has_a_task_per_gpu():
    argv = srun_argv("7", ("n1", "n2"), 3, 12, "marble-1.2", Path("/r/s.json"), ("a.out",),
                     per_gpu=True)
    assert argv[:9] == ["srun", "--jobid=7", "--exact", "--nodes=2", "--ntasks=6",
                        "--ntasks-per-node=3", "--cpus-per-task=4", "--nodelist=n1,n2",
                        "--gpus-per-node=3"]
    assert "--label" in argv  # a task's lines carry its rank (marble logs --rank)
    # a failed rank ends the step: the others would wait for it at the rendezvous
    assert "--kill-on-bad-exit=1" in argv
    assert "--kill-on-bad-exit=1" in srun_argv("7", ("n1", "n2"), 1, 4, "m", Path("/i"), ("a",))
    assert not any(a.startswith("--kill-on-bad-exit")  # one task: nothing to end with it
                   for a in srun_argv("7", ("n1",), 2, 4, "m", Path("/i"), ("a",)))
    assert argv[-5:] == [sys.executable, "-m", "marbled.batch.step", "/r/s.json", "a.out"]


@pytest.mark.parametrize(("kernel", "expected"), [
    ("32768\t60999\n", (10000, 32767)),  # Linux's default: the stretch below is wider
    ("1024 40000", (40001, 65535)),  # only above is left
    ("10500 65000", LISTEN_PORTS),  # no stretch of 1,000 ports outside it
    ("garbage", LISTEN_PORTS),
])
def test_listening_ports_are_drawn_outside_the_kernels_ephemeral_range(tmp_path, kernel,
                                                                       expected):
    """A free ephemeral port may be handed to any outgoing connection before rank 0 binds it
    (seen: EADDRINUSE at the rendezvous, and the other ranks left waiting)."""
    path = tmp_path / "ip_local_port_range"
    path.write_text(kernel)
    assert listen_port_range(str(path)) == expected
    assert listen_port_range(str(tmp_path / "missing")) == LISTEN_PORTS


def test_free_ports_are_distinct_bindable_and_outside_this_hosts_ephemeral_range():
    low, high = listen_port_range()
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(low <= p <= high for p in ports)
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph_low, eph_high = (int(v) for v in f.read().split())
    except OSError:
        pytest.skip("no ephemeral range to read on this host")
    assert not any(eph_low <= p <= eph_high for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind((LOCAL_ADDR, port))


def test_a_taken_port_is_drawn_again_and_a_full_range_says_so(monkeypatch):
    with socket.socket() as held:
        held.bind((LOCAL_ADDR, 0))
        taken = held.getsockname()[1]
        held.listen()
        monkeypatch.setattr(ranks, "listen_port_range", lambda: (taken, taken + 1))
        with socket.socket() as probe:  # taken + 1 must be free for the draw to find it
            try:
                probe.bind((LOCAL_ADDR, taken + 1))
            except OSError:
                pytest.skip(f"port {taken + 1} is in use on this host")
        assert free_ports(1) == [taken + 1]
        monkeypatch.setattr(ranks, "listen_port_range", lambda: (taken, taken))
        with pytest.raises(OSError, match=f"no 1 free TCP ports in {taken}-{taken}"):
            free_ports(1)
