"""A job waiting out a retry back-off is passed over, without holding up the FIFO."""

from __future__ import annotations

import pytest

from marbled.core.model import Job, State
from marbled.core.policy import POLICIES, get_policy


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_back_off_is_skipped_until_it_ends(policy):
    state = State.single_node(6)
    state.submit(Job(1, 6, False, not_before=100.0))
    state.submit(Job(2, 6, False))
    # learned may reorder the queue by design: held to FIFO here (max_overtaken 0)
    chosen = get_policy(policy, max_overtaken=0)
    assert [a.job for a in chosen.decide(state, now=99.0)] == [2]
    assert [a.job for a in chosen.decide(state, now=100.0)][:1] == [1]
