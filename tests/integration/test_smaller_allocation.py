"""A state directory carried to a smaller allocation (a chain of batch jobs whose next one
got fewer nodes or GPUs): the queued jobs it can never hold stay queued, and the jobs
behind them run. Before, the first such job headed the FIFO until the allocation ended:
no job behind it started, and `marble wait` waited the allocation out.

Real brokers on one state directory, real processes and signals, plain commands and
emulated jobs that speak the protocol; the GPUs and the second node are emulated
(tests/slurm/test_slurm_smaller_allocation.py: the same through real Slurm allocations)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Daemon
from tests.integration.test_cancel_many import marble
from tests.integration.test_crash_plain_commands import completions, plain, runs_of

pytestmark = pytest.mark.daemon

UNFIT = ("blocker", "big", "wide", "fixed3")  # what 1 node of 2 GPUs cannot hold


def the_queue(marks: Path) -> list[dict]:
    """For 2 nodes of 4 GPUs: a plain command on every GPU of both (the blocker: the others
    queue behind it), a plain command on 4 GPUs, one on 2 nodes, an emulated job on exactly
    3 GPUs, one on `auto` (sized 3), and two plain 1-GPU commands."""
    return [{**plain("blocker", marks, "sleep 3"), "gpus": 4, "nodes": 2},
            {**plain("big", marks, "true"), "gpus": 4},
            {**plain("wide", marks, "true"), "nodes": 2},
            {"name": "fixed3", "model": "resnet-50", "steps": 300, "emulate": True, "gpus": 3},
            {"name": "auto", "model": "resnet-50", "steps": 300, "emulate": True},
            plain("small-1", marks, "true"), plain("small-2", marks, "true")]


def shut_down_while_blocked(first: Daemon, marks: Path) -> dict[str, int]:
    """Submit the queue, and shut the broker down once the blocker runs: each job's id."""
    ids = {j["name"]: j["id"] for j in first.submit(*the_queue(marks))}
    first.wait_for(lambda: runs_of(first, "blocker"), timeout=60, what="the blocker's run")
    first.client.post("/v1/shutdown", {})
    first.proc.wait(timeout=60)
    assert completions(marks, "blocker") == 0, "it ended before the shutdown: nothing tested"
    return ids


def check_the_smaller(second: Daemon, ids: dict[str, int], marks: Path) -> None:
    """On 1 node of 2 GPUs: the 1-GPU commands and the `auto` job run (on at most 2); the
    others stay queued, and `wait` (exit 4), `status` and `explain` say why."""
    state = second.state_dir
    waited = marble(state, "wait", "--timeout", "120")
    assert waited.returncode == 4, (waited.stdout, waited.stderr, second.log())
    for name in UNFIT:
        assert f"note: job {ids[name]} cannot run in this allocation" in waited.stderr
    assert {n: completions(marks, n) for n in ("small-1", "small-2", "big", "wide")} == {
        "small-1": 1, "small-2": 1, "big": 0, "wide": 0}
    assert [r["gpu_count"] <= 2 for r in runs_of(second, "auto")] == [True]
    status = json.loads(marble(state, "status", "--json").stdout)
    assert set(status["broker"]["cannot_run"]) == {str(ids[n]) for n in UNFIT}
    assert status["broker"]["cannot_run"][str(ids["blocker"])] == (
        "it asks for 4 GPUs on each of 2 nodes, and this allocation has 1 node of 2 GPUs")
    explained = marble(state, "explain", "big").stdout
    assert "cannot run in this allocation: it asks for 4 GPUs on one node" in explained
    assert f"job {ids['fixed3']} cannot run in this allocation" in second.log()


def check_the_larger_again(third: Daemon, marks: Path, tasks: int) -> None:
    """Back on 2 nodes of 4: every job done, each command completed once (`tasks`: the
    processes of a run on both nodes), the fixed count run once from its first step."""
    final = {j["name"]: j["state"] for j in third.wait_all(timeout=120)}
    assert set(final.values()) == {"done"}, final
    assert {n: completions(marks, n) for n in ("blocker", "big", "wide", "small-1")} == {
        "blocker": tasks, "big": 1, "wide": tasks, "small-1": 1}
    steps = [(r["start_step"], r["end_step"], r["gpu_count"]) for r in runs_of(third, "fixed3")]
    assert steps == [(0, 300, 3)]


def test_jobs_a_smaller_allocation_cannot_hold_wait_for_a_larger_one(daemon_factory,
                                                                     tmp_path):
    """The next broker has 1 node of 2 GPUs and `--policy rigid`, which waits for a job's
    whole demand: the `auto` job's 3 is sized again to what a node has."""
    state, marks = tmp_path / "state", tmp_path / "marks"
    marks.mkdir()
    ids = shut_down_while_blocked(daemon_factory("--nodes", "2", gpus=4, state_dir=state),
                                  marks)
    second = daemon_factory("--policy", "rigid", gpus=2, state_dir=state)
    check_the_smaller(second, ids, marks)
    second.stop()
    # (the local launcher starts a run on emulated nodes as one process; Slurm, one a node)
    check_the_larger_again(daemon_factory("--nodes", "2", gpus=4, state_dir=state), marks, 1)
