"""Moldable Equipartition: the three cases and the D'Hondt distribution of spare GPUs."""

from __future__ import annotations

from marbled.core.model import Job, Role, Start, State
from marbled.core.policy import get_policy
from marbled.core.policy.equipartition import dhondt


def decide(gpus: int, *jobs: Job) -> list:
    state = State.single_node(gpus)
    for job in jobs:
        state.submit(job)
    return get_policy("moldable").decide(state)


def counts(actions) -> dict[int, int]:
    return {a.job: len(a.gpus) for a in actions if isinstance(a, Start)}


def test_dhondt_gives_spare_gpus_by_largest_quotient_ties_to_the_older():
    assert dhondt([1, 1], [4, 3], 4) == [4, 2]
    assert dhondt([1, 1, 1], [4, 4, 4], 3) == [2, 2, 2]  # equal votes: round robin
    assert dhondt([1, 1], [2, 2], 10) == [2, 2]  # never beyond p_max


def test_light_load_gives_everyone_its_optimal_count():
    assert counts(decide(6, Job(1, 3, True), Job(2, 2, True))) == {1: 3, 2: 2}


def test_middle_load_shares_out_by_dhondt():
    actions = decide(6, Job(1, 4, True), Job(2, 3, True))
    assert counts(actions) == {1: 4, 2: 2}
    assert [a.role for a in actions] == [Role.PRIMARY, Role.SECONDARY]


def test_congestion_gives_p_min_and_rigid_jobs_their_count():
    # 1 + 1 + 3 + 1 = 6 >= 6 vacant: everyone at p_min; the rigid job needs its 3.
    jobs = (Job(1, 4, True), Job(2, 5, True), Job(3, 3, False), Job(4, 2, True))
    assert counts(decide(6, *jobs)) == {1: 1, 2: 1, 3: 3, 4: 1}
    # One GPU too few: strict FIFO, the fourth waits.
    assert counts(decide(5, *jobs)) == {1: 1, 2: 1, 3: 3}


def test_moldable_beats_rigid_and_never_suspends_in_the_simulator():
    from marbled.resources import load_profile, workload_path
    from marbled.sim.engine import Simulator
    from marbled.sim.workloads import from_job_file

    arrivals = from_job_file(workload_path("paper-jobset1"))
    book = load_profile()
    moldable = Simulator(book, get_policy("moldable"), 6).run(arrivals)
    rigid = Simulator(book, get_policy("rigid"), 6).run(arrivals)
    assert moldable.suspensions == 0
    assert moldable.makespan < rigid.makespan
