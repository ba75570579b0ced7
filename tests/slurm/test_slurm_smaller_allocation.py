"""A state directory carried from one Slurm allocation to a smaller one, and back to a
larger one (tests/integration/test_smaller_allocation.py with emulated nodes): the jobs the
smaller can never hold stay queued while the others run as job steps, and the larger runs
them once each. A plain command's run on two nodes is one task a node, so it marks twice."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.test_smaller_allocation import (
    check_the_larger_again,
    check_the_smaller,
    shut_down_while_blocked,
)
from tests.slurm.test_slurm import _broker

pytestmark = pytest.mark.slurm

TWO_NODES_OF_4 = ("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:4")


@pytest.mark.parametrize("slurm_api", ["cli"])  # the allocation's reading is not under test
def test_a_smaller_allocation_runs_what_it_can_and_a_larger_one_the_rest(daemon_factory,
                                                                         allocate, tmp_path):
    state, marks = tmp_path / "state", tmp_path / "marks"
    marks.mkdir()
    larger = allocate(*TWO_NODES_OF_4)
    ids = shut_down_while_blocked(_broker(daemon_factory, larger, state_dir=state), marks)
    subprocess.run(["scancel", larger], check=True)

    smaller = allocate("--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=4", "--gres=gpu:2")
    second = _broker(daemon_factory, smaller, "--policy", "rigid", state_dir=state)
    check_the_smaller(second, ids, marks)
    second.stop()
    subprocess.run(["scancel", smaller], check=True)

    again = allocate(*TWO_NODES_OF_4)
    check_the_larger_again(_broker(daemon_factory, again, state_dir=state), marks, tasks=2)
