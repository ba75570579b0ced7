"""One truth in every message (issue 31), hunted over random schedules: a real Broker in
process (fake runs and clock, tests/broker/fakes.py) under every policy, through random
submissions, progress reports, ends and time, and after every step the views users read
are checked against the state and each other:

- `status`'s ROLE (GET /v1/jobs) is `show`'s and `explain`'s (GET /v1/jobs/ID): the `why`
  line says it, and no reason calls a primary a secondary;
- a waiting job's "the next run to end is job X's, in about N s" names the running job
  that ends first by the ETAs `status` shows, and N is that ETA;
- "it is being moved" is said only of a job the policy's own rule moves now;
- the job counts `status` gives are the jobs it lists.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marbled.core.policy import POLICIES
from marbled.daemon.views import Views
from tests.broker.fakes import pump, running_broker

MODELS = ("resnet-50", "inception-v3", "vgg-16", "alexnet")
NEXT_END = re.compile(r"the next run to end is job (\d+)'s, (?:in about (\d+) s|within a "
                      r"second)")

submit = st.tuples(st.just("submit"), st.sampled_from(MODELS),
                   st.sampled_from([None, 1, 2, 4]), st.integers(200, 20_000))
report = st.tuples(st.just("report"), st.integers(0, 7), st.floats(0.05, 0.9))
end = st.tuples(st.just("end"), st.integers(0, 7), st.sampled_from([0, 0, 1]))
wait = st.tuples(st.just("wait"), st.floats(0.5, 120.0))
schedules = st.lists(st.one_of(submit, report, end, wait), min_size=3, max_size=14)


async def play(h, op) -> None:
    live = [r for r in h.launcher.runs if not r._exit.done()]
    match op:
        case ("submit", model, gpus, steps):
            doc = {"model": model, "steps": steps, "command": ["./train.sh"]}
            h.submit(**(doc if gpus is None else {**doc, "gpus": gpus}))
        case ("report", i, share) if live:
            run = live[i % len(live)]
            steps = h.broker.specs[int(run.request.env["MARBLE_JOB_ID"])].steps
            run.report(int(steps * share), at=h.clock.time(), first_step_at=h.clock.time())
        case ("end", i, code) if live:
            run = live[i % len(live)]
            if run.signals[-1:] == ["SIGTSTP"]:
                run.acknowledge(1)
            run.exit(code)
        case ("wait", seconds):
            await h.clock.advance(seconds)
    await pump()


async def check(h) -> None:
    views, b = Views(h.broker), h.broker
    listed, _ = views.jobs()
    counts = {}
    for v in listed:
        counts[v["state"]] = counts.get(v["state"], 0) + 1
    assert views.status()["jobs"] == counts
    own = views._own_ends()
    for v in listed:
        if v["state"] in ("done", "failed", "cancelled"):
            continue
        detail = await views.job_detail(v["id"])
        assert detail["role"] == v["role"], (v, detail["role"])
        reasons = detail["reasons"]
        if v["state"] == "running" and v["role"]:
            assert detail["why"].startswith(f"runs as {v['role']}"), detail["why"]
            if v["role"] == "primary":
                assert not any("as a secondary" in r for r in reasons), reasons
        job = b.state.jobs[v["id"]]
        if any("it is being moved" in r for r in reasons):
            assert b.policy.shrinks_now(job, b.clock.time()), reasons
        said = [m for r in reasons if (m := NEXT_END.search(r))]
        if said and own:
            first = min(own, key=lambda i: (own[i], i))
            (m,) = said
            assert int(m.group(1)) in own and own[int(m.group(1))] == own[first], \
                (reasons, own)
            left = own[first] - b.clock.time()
            assert (m.group(2) is None and left < 1) or \
                abs(int(m.group(2) or 0) - left) <= 1, (reasons, left)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=schedules)
def test_the_views_agree_with_the_state_and_each_other(tmp_path_factory, policy, schedule):
    import asyncio

    async def go() -> None:
        async with running_broker(tmp_path_factory.mktemp("state"), policy=policy, gpus=4,
                                  time_scale=0.01) as h:
            for op in schedule:
                await play(h, op)
                await check(h)

    asyncio.run(go())
