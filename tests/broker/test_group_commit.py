"""The ledger's grouped writes, on a real Broker in this process (tests/broker/fakes.py):
submissions of one round of the loop share one transaction and are durable before their
futures are done; a run's pid waits for the next transaction; a decision's changes commit
together; a failed group commit stops the broker."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from marbled.core.spec import JobSpec
from marbled.daemon import ledger as ledger_module
from tests.broker.fakes import in_loop, pump, running_broker

ONE = JobSpec.from_mapping({"gpus": 1, "command": ["true"]})
HOLDER = JobSpec.from_mapping({"gpus": 6, "command": ["sleep", "9"]})


def _commits(con: sqlite3.Connection) -> list[str]:
    log: list[str] = []
    con.set_trace_callback(log.append)
    return log


def _stored(h) -> list[int]:
    return [r.id for r in h.store.jobs()]


@in_loop
async def test_submissions_of_one_round_share_one_commit_and_wait_for_it(tmp_path):
    async with running_broker(tmp_path) as h:
        h.broker.submit([HOLDER])  # holds every GPU: what follows only queues
        await pump()
        log = _commits(h.broker.ledger.db)
        answers = [h.broker.submit_grouped([ONE] * k) for k in (1, 2, 3)]
        assert [[r.id for r in rows] for rows, _, _ in answers] == [[2], [3, 4], [5, 6, 7]]
        assert not any(done.done() for _, done, _ in answers)
        assert _stored(h) == [1]  # nothing is durable yet, so nothing was answered
        await asyncio.gather(*(done for _, done, _ in answers))
        assert _stored(h) == [1, 2, 3, 4, 5, 6, 7]
        assert [s for s in log if s in ("BEGIN", "COMMIT")] == ["BEGIN", "COMMIT"]
        assert [e.kind for e in h.store.events()].count("submitted") == 7


@in_loop
async def test_a_later_submission_of_the_group_may_name_an_earlier_one(tmp_path):
    async with running_broker(tmp_path) as h:
        h.broker.submit([HOLDER])
        await pump()
        first, done1, _ = h.broker.submit_grouped([JobSpec.from_mapping(
            {"gpus": 1, "command": ["true"], "name": "a"})])
        second, done2, _ = h.broker.submit_grouped([JobSpec.from_mapping(
            {"gpus": 1, "command": ["true"], "after": "a"})])
        await asyncio.gather(done1, done2)
        assert second[0].after == [first[0].id]


@in_loop
async def test_any_write_commits_the_waiting_submissions_first(tmp_path):
    async with running_broker(tmp_path) as h:
        rows, done, _ = h.broker.submit_grouped([ONE])
        h.broker.decide()  # starts the job: its run row needs the job's row
        assert done.done() and done.exception() is None
        assert h.store.runs(rows[0].id)
        kinds = [e.kind for e in h.store.events(rows[0].id)]
        assert kinds == ["submitted", "started"]


@in_loop
async def test_a_decision_commits_once_and_a_pid_waits_for_company(tmp_path):
    async with running_broker(tmp_path) as h:
        h.broker.submit([ONE] * 6)
        log = _commits(h.broker.ledger.db)
        h.broker.decide()
        assert log.count("COMMIT") == 1  # six runs started in one transaction
        await pump()
        assert len(h.launcher.runs) == 6
        assert all(r.pid is None for r in h.store.runs())  # not yet: within DEFER seconds
        await asyncio.sleep(ledger_module.DEFER * 2)
        assert [r.pid for r in h.store.runs()] == [r.pid for r in h.launcher.runs]


@in_loop
async def test_a_runs_end_shares_the_commit_of_the_start_it_makes_room_for(tmp_path):
    async with running_broker(tmp_path) as h:
        holder, waiting = (row.id for row in h.broker.submit([HOLDER, ONE]))
        await pump()
        await asyncio.sleep(ledger_module.DEFER * 2)  # the holder's pid is written
        log = _commits(h.broker.ledger.db)
        h.launcher.runs[0].exit(0)
        await pump()
        assert log.count("COMMIT") == 1  # the end and the next start: one transaction
        assert [r.state for r in h.store.jobs()] == ["done", "running"]
        assert [e.kind for e in h.store.events()][-2:] == ["done", "started"]
        # an end that wakes a decision with nothing to start is committed after it, alone
        h.launcher.runs[1].exit(0)
        await pump()
        assert log.count("COMMIT") == 2
        assert [r.state for r in h.store.jobs()] == ["done", "done"]
        assert holder not in h.broker.state.jobs and waiting not in h.broker.state.jobs


@in_loop
async def test_a_failed_group_commit_answers_no_one_and_stops_the_broker(tmp_path):
    answers: list[BaseException | None] = []
    with pytest.raises(sqlite3.DatabaseError, match="no space left"):  # the broker's end
        async with running_broker(tmp_path) as h:
            h.broker.submit([HOLDER])
            await pump()
            h.broker.ledger.db.execute(  # the store refuses the next job (as a full disk would)
                "CREATE TRIGGER refuse BEFORE INSERT ON jobs WHEN NEW.name = 'boom' "
                "BEGIN SELECT RAISE(ABORT, 'no space left'); END")
            _, fine, _ = h.broker.submit_grouped([ONE])
            _, boom, _ = h.broker.submit_grouped([JobSpec.from_mapping(
                {"gpus": 1, "command": ["true"], "name": "boom"})])
            for done in (fine, boom):  # one group: neither is answered
                try:
                    await done
                    answers.append(None)
                except sqlite3.DatabaseError as exc:
                    answers.append(exc)
            await pump()
            stopped = h.task.done()
            stored = _stored(h)
    assert [str(a) for a in answers] == ["no space left"] * 2
    assert stopped and stored == [1]
