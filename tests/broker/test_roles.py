"""The ROLE that `marble status`, `show`, `explain` and the dashboard show (GET /v1/jobs):
the primary is the job that holds its count or runs alone, secondaries run below their count
beside others (issue 31: under --policy adaptive every job read `secondary`, even one left
running alone)."""

from __future__ import annotations

from marbled.daemon.views import Views
from tests.broker.fakes import in_loop, pump, running_broker
from tests.broker.test_coalesced_wakes import of_job


def _view(h, job_id: int) -> dict:
    (row,) = h.store.jobs([job_id])
    return Views(h.broker).job(row)


async def _detail(h, job_id: int) -> dict:
    return await Views(h.broker).job_detail(job_id)


@in_loop
async def test_adaptive_a_job_left_alone_is_the_primary(tmp_path):
    async with running_broker(tmp_path, policy="adaptive", gpus=4) as h:
        alone = h.submit(model="inception-v3", steps=100_000, command=["./t.sh"])
        await pump()
        assert (h.job(alone).demand, len(h.job(alone).gpus)) == (4, 4)
        assert _view(h, alone)["role"] == "primary"  # on its count
        of_job(h, alone)[0].exit(0)
        await pump()
        # two jobs share the 4 GPUs, each below its count of 4: both secondaries
        first = h.submit(model="inception-v3", steps=100_000, command=["./t.sh"])
        second = h.submit(model="vgg-16", steps=100_000, command=["./t.sh"])
        await pump()
        assert [len(h.job(j).gpus) for j in (first, second)] == [2, 2]
        assert [h.job(j).demand for j in (first, second)] == [4, 4]
        assert [_view(h, j)["role"] for j in (first, second)] == ["secondary", "secondary"]
        # the first ends; the second, not moved (it has not reported a step: lifecycle I6),
        # runs alone on its 2 GPUs: the primary, though its run started as a secondary
        of_job(h, first)[0].exit(0)
        await pump()
        assert len(h.job(second).gpus) == 2 and h.store.runs(second)[-1].role == "secondary"
        view = _view(h, second)
        assert view["role"] == "primary", view
        detail = await _detail(h, second)
        assert detail["role"] == "primary"
        assert detail["why"].startswith("runs as primary on 2 GPUs"), detail["why"]
        assert not any("as a secondary" in line for line in detail["reasons"]), detail["reasons"]


@in_loop
async def test_marble_keeps_a_secondary_below_its_count_a_secondary(tmp_path):
    """Under MARBLE a secondary is what it promotes: one beside a primary stays one."""
    async with running_broker(tmp_path, policy="marble", gpus=4) as h:
        first = h.submit(model="inception-v3", steps=100_000, command=["./t.sh"], gpus=3)
        second = h.submit(model="vgg-16", steps=100_000, command=["./t.sh"])
        await pump()
        roles = {j: (_view(h, j)["role"], len(h.job(j).gpus), h.job(j).demand)
                 for j in (first, second)}
        assert roles == {first: ("primary", 3, 3), second: ("secondary", 1, 4)}, roles
