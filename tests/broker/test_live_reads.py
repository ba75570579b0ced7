"""What the API reads costs the live jobs, not every job ever (benchmarks/soak.py measures it):
`status`, the unfinished page, the metrics and the forecast read no ended job, and a
broker's start reads only the open runs. A real Broker in this process (tests/broker/fakes.py)
on a real SQLite file; the state's job table counts who iterates it."""

from __future__ import annotations

from collections import Counter

import pytest

from marbled.core.model import Cancel, Job, JobState, Role, Start, State, Suspend
from marbled.daemon.views import Views
from marbled.store.db import Store
from tests.broker.fakes import FakeLauncher, in_loop, pump, running_broker

TRUE = {"gpus": 1, "command": ["true"]}
UNFINISHED = ("queued", "running", "suspending", "suspended")


class CountingJobs(dict):
    """The state's jobs, counting the reads that go through every job (`walks`)."""

    walks = 0


def _counted(name: str):
    def walk(self, *args):
        self.walks += 1
        return getattr(dict, name)(self, *args)

    return walk


for _name in ("values", "items", "keys", "__iter__"):
    setattr(CountingJobs, _name, _counted(_name))


def _brute(state: State) -> tuple[dict, list[int], list[int]]:
    counts = Counter(j.state for j in dict.values(state.jobs))
    return ({s: counts[s] for s in JobState},
            [j.id for j in dict.values(state.jobs) if not j.state.finished],
            sorted(j.id for j in dict.values(state.jobs) if j.state.holds_gpus))


def test_the_state_keeps_its_tallies_through_every_transition():
    state = State.single_node(4)
    for i in range(1, 9):
        state.submit(Job(i, 1, i != 5, after=(1,) if i == 8 else ()))  # 5 is rigid
    assert state.movable == 7
    state.apply(Start(1, "node0", (0,), Role.PRIMARY))
    state.apply(Start(2, "node0", (1,), Role.PRIMARY))
    state.apply(Suspend(2, None, "test"))
    state.apply(Start(3, "node0", (2,), Role.PRIMARY))
    assert _brute(state) == (state.counts(), [j.id for j in state.active()], state.holding())
    state.suspended(2)
    state.finished(1, JobState.DONE)
    state.finished(3, JobState.FAILED)
    state.apply(Cancel(4, "test"))
    state.withdraw(7)
    assert _brute(state) == (state.counts(), [j.id for j in state.active()], state.holding())
    assert state.counts()[JobState.CANCELLED] == 1 and state.unfinished == len(state.active())
    assert state.movable == sum(j.malleable for j in state.active()) == 3  # 2, 6, 8; 5 rigid


async def _finish_all(h, jobs: int) -> None:
    """Every run the fake launcher starts exits 0, until `jobs` jobs are done."""
    ended = 0
    while ended < jobs:
        await pump()
        for run in h.launcher.runs:
            if not run._exit.done():
                run.exit(0)
                ended += 1
        await pump()
    await pump()


@in_loop
async def test_status_pages_metrics_and_forecast_read_no_ended_job(tmp_path):
    async with running_broker(tmp_path, store=Store(tmp_path / "marble.db")) as h:
        ids = [h.submit(**TRUE) for _ in range(30)]
        await _finish_all(h, 30)
        queued = [h.submit(**{**TRUE, "gpus": 6}) for _ in range(3)]  # nothing else fits
        await pump()
        for job_id in ids[-5:]:
            assert h.job(job_id).state is JobState.DONE
        jobs = h.broker.state.jobs = CountingJobs(h.broker.state.jobs)
        views = Views(h.broker)
        paged = []
        real_page = h.store.job_page
        h.store.job_page = lambda **kw: paged.append(real_page(**kw)) or paged[-1]

        status = views.status()
        page, more = views.jobs(UNFINISHED, 0, 500)
        failed, _ = views.jobs(("failed",), 0, 5)
        metrics = h.broker.metrics.exposition()[0].decode()
        forecast = await views.forecast()

        assert jobs.walks == 0
        assert status["jobs"] == {"done": 30, "running": 1, "queued": 2}
        assert [j["id"] for j in page] == queued and more is None and failed == []
        assert 'marbled_jobs{state="done"} 30.0' in metrics
        assert {f["id"] for f in forecast["jobs"] + forecast.get("left_out", [])} == set(queued)
        # no ended row was fetched: the unfinished, and the running one again for the page of
        # failed jobs (a job holding GPUs is read whatever its row says, then filtered)
        assert sum(len(rows) for rows in paged) == len(queued) + 1


@in_loop
async def test_a_start_reads_only_the_open_runs_and_ended_jobs_still_count(tmp_path):
    store = Store(tmp_path / "marble.db")
    async with running_broker(tmp_path, store=store) as h:
        first = h.submit(**TRUE, name="first")
        for _ in range(11):
            h.submit(**TRUE)
        await _finish_all(h, 12)
        holder = h.submit(**{**TRUE, "gpus": 6})
        await pump()
    statements: list[str] = []
    store.writer().set_trace_callback(lambda sql: statements.append(" ".join(sql.split())))
    async with running_broker(tmp_path, store=store, launcher=FakeLauncher()) as h:
        # (the ledger's next run id, `max(id)`, is the rowid index's last entry: no scan)
        runs = [s for s in statements if " FROM runs" in s and "max(id) FROM runs" not in s]
        assert runs and all("ended_at IS NULL" in s for s in runs), runs
        assert h.job(holder).state is JobState.RUNNING  # its open run adopted
        assert h.broker.state.counts()[JobState.DONE] == 12
        # an ended job is still one to depend on, by id and by name
        after = h.submit(**TRUE, after=[first])
        named = h.submit(**TRUE, after=["first"])
        assert h.broker.state.ready_count == 2 and {after, named} <= {
            j.id for j in h.broker.state.ready()}


@pytest.mark.parametrize("index, query", [
    ("ix_runs_open", "SELECT * FROM runs WHERE ended_at IS NULL"),
    # `after:` a name the broker no longer holds (an ended job's): Store.job_named
    ("ix_jobs_name", "SELECT max(id) FROM jobs WHERE name = 'a'"),
    # the dashboard's window (?since=): Store.runs_since, Store.job_page(since=)
    ("ix_runs_ended_at", "SELECT * FROM runs WHERE id IN (SELECT id FROM runs WHERE "
                         "ended_at IS NULL UNION ALL SELECT id FROM runs WHERE ended_at >= 5)"),
    ("ix_jobs_finished_at", "SELECT id FROM jobs WHERE id IN (SELECT id FROM jobs WHERE "
                            "state IN ('queued') UNION ALL SELECT id FROM jobs WHERE "
                            "finished_at >= 5)")])
def test_an_index_added_since_its_table_is_made_on_an_older_store_and_used(tmp_path, index,
                                                                             query):
    Store(tmp_path / "marble.db").close()
    store = Store(tmp_path / "marble.db")
    con = store.writer()
    con.execute(f"DROP INDEX {index}")
    con.commit()
    store.close()
    store = Store(tmp_path / "marble.db")  # an older marbled's file: made again at the start
    plan = " ".join(r[3] for r in store.writer().execute(f"EXPLAIN QUERY PLAN {query}"))
    store.close()
    assert index in plan, plan
