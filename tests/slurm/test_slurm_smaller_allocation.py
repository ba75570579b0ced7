"""A state directory carried from one Slurm allocation to a smaller one, and back to a
larger one (tests/integration/test_smaller_allocation.py with emulated nodes): the jobs the
smaller can never hold stay queued while the others run as job steps, and the larger runs
them once each. A plain command's run on two nodes is one task a node, so it marks twice."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.integration.test_crash_plain_commands import (
    completions,
    plain,
    running_pids,
    runs_of,
)
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


@pytest.mark.parametrize("slurm_api", ["cli"])
def test_a_step_left_alive_in_an_allocation_the_next_broker_lacks_is_killed_not_run_beside(
        daemon_factory, allocate, tmp_path):
    """A broker killed -9 while a plain command runs as a step of its allocation, which
    lives on; the next broker, in another allocation without that step's node, runs the job
    again. The step is cancelled first (scancel of the earlier allocation's step: of this
    allocation's step id, as before, it reached nothing and the command completed twice),
    so the command completes once, in the rerun."""
    marks, state = tmp_path / "marks", tmp_path / "state"
    marks.mkdir()
    first_alloc = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4",
                           "--gres=gpu:2")
    first = _broker(daemon_factory, first_alloc, state_dir=state)
    first.submit(plain("p", marks, "sleep 6"))
    first.wait_for(lambda: running_pids(first).get("p"), what="its pid recorded")
    (old,) = runs_of(first, "p")
    first.stop(signal.SIGKILL)  # its allocation, and the step in it, live on

    other = ({"n1", "n2"} - {old["node"]}).pop()
    second_alloc = allocate("--nodes=1", f"--nodelist={other}", "--ntasks-per-node=1",
                            "--cpus-per-task=4", "--gres=gpu:2")
    second = _broker(daemon_factory, second_alloc, state_dir=state)
    assert [j["state"] for j in second.wait_all(timeout=60)] == ["done"]
    time.sleep(6.5)  # as long as the first run's command would have taken
    assert completions(marks, "p") == 1
    ended, rerun = runs_of(second, "p")
    assert (ended["node"], rerun["node"]) == (old["node"], other)
    stops = second.query("SELECT data FROM events WHERE kind = 'stop' AND run_id = ?", old["id"])
    assert len(stops) == 1 and "is not in this allocation" in stops[0]["data"]
