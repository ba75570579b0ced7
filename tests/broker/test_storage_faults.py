"""Faults of storage are survived (issue 30, I4), on a real Broker in this process
(tests/broker/fakes.py) with a real SQLite file: while the store cannot be written, runs
end and are held in memory, submissions get 503 (Unavailable) with the reason, and the
broker neither stops nor starts anything; once writes work again everything held is
written by itself, the queue moves, and a new broker on the same store runs nothing twice.

The faults are injected at the ledger's connection: a full disk as SQLite reports it
('database or disk is full', raised at the commit, as a WAL append fails), and a read-only
database through SQLite's own `PRAGMA query_only` (a real SQLITE_READONLY at each write).
tests/integration/test_storage_full.py fills a real tmpfs under a real marbled."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest

from marbled.core.errors import Unavailable
from marbled.core.model import JobState
from marbled.core.spec import JobSpec
from marbled.daemon import ledger as ledger_module
from marbled.daemon.views import Views
from marbled.store.db import Store
from tests.broker.fakes import FakeLauncher, FullDisk, in_loop, pump, running_broker

PAIR = {"gpus": 2, "command": ["train"]}  # three of them fill the 6 GPUs
TRAIN = {"command": ["train"], "model": "resnet-50", "steps": 1000}  # 3 GPUs, checkpoints


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(ledger_module, "RETRY_FIRST", 0.01)
    monkeypatch.setattr(ledger_module, "RETRY_MAX", 0.02)


def _states(store: Store) -> dict[int, str]:
    return {r.id: r.state for r in store.jobs()}


def _launched(launcher: FakeLauncher) -> list[int]:
    """The jobs whose run a launcher started (not those it adopted)."""
    return [int(r.request.env["MARBLE_JOB_ID"]) for r in launcher.runs
            if "MARBLE_JOB_ID" in r.request.env]


async def _until(predicate, seconds: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not predicate():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.005)
    await pump()


async def _first_end_faulted(h, disk: FullDisk) -> None:
    """The ledger's connection swapped for `disk` (faulty from now on), then the first run
    ends: once its transaction is refused, the ledger holds its writes."""
    h.broker.ledger.db = disk
    h.launcher.runs[0].exit(0)
    await _until(lambda: h.broker.ledger.fault is not None)


@in_loop
async def test_a_full_disk_holds_the_ends_refuses_submissions_and_recovers_by_itself(tmp_path):
    store = Store(tmp_path / "marbled.db")
    async with running_broker(tmp_path, store=store) as h:
        ids = [h.submit(**PAIR) for _ in range(5)]  # 1-3 run, 4 and 5 wait
        await pump()
        assert len(h.launcher.runs) == 3
        await asyncio.sleep(ledger_module.DEFER * 2)  # the pids are written
        disk = h.broker.ledger.db = FullDisk(h.broker.ledger.db)
        disk.full = True
        first, second, third = h.launcher.runs
        first.exit(0)  # it finished while the disk was full
        await pump()
        ledger = h.broker.ledger
        assert ledger.fault and "disk is full" in ledger.fault and "free space on" in ledger.fault
        assert not h.task.done()  # the broker goes on
        second.exit(0)
        await pump()
        assert h.job(ids[0]).state is h.job(ids[1]).state is JobState.DONE  # in memory
        assert _states(store)[ids[0]] == "running"  # what was committed: the reads go on
        held = ledger.held
        assert held >= 2
        storage = Views(h.broker).status()["storage"]  # GET /v1/status
        assert storage == {"ok": False, "reason": ledger.fault, "held": held}
        scraped = h.broker.metrics.exposition()[0].decode()  # GET /metrics
        assert f"marbled_store_writes_held {float(held)}" in scraped
        # New submissions are refused with the reason, and the queue waits: starting a run
        # the store cannot record could start it twice after a crash.
        with pytest.raises(Unavailable, match="disk is full"):
            h.submit(**PAIR)
        with pytest.raises(Unavailable, match="disk is full"):
            h.broker.submit_grouped([JobSpec.from_mapping(PAIR)])
        assert len(h.launcher.runs) == 3
        # So is a cancel: its record must outlive a crash (a job cancelled and run again)
        with pytest.raises(Unavailable, match="was not cancelled.*disk is full"):
            h.broker.cancel(ids[2])
        assert not third.signals and h.job(ids[2]).state is JobState.RUNNING
        await asyncio.sleep(0.1)  # retries, refused
        assert disk.refused >= 3 and ledger.fault and not h.task.done()

        disk.full = False  # space returns: the broker recovers by itself
        await _until(lambda: ledger.fault is None)
        await asyncio.sleep(ledger_module.DEFER * 2)
        states = _states(store)
        assert states[ids[0]] == states[ids[1]] == "done"
        assert len(h.launcher.runs) == 5  # the queue moved: 4 and 5 started
        assert states[ids[3]] == states[ids[4]] == "running"
        kinds = [e.kind for e in store.events()]
        assert kinds.count("store-unwritable") == kinds.count("store-writable") == 1
        more = h.submit(**PAIR)  # accepted again
        assert _states(store)[more] == "queued"
    store.close()

    # A new broker on the same store (the first stopped as by a crash): the two that
    # finished while the disk was full are done, and nothing of theirs runs again.
    again = Store(tmp_path / "marbled.db")
    launcher = FakeLauncher()
    async with running_broker(tmp_path, store=again, launcher=launcher) as h2:
        await pump()
        assert h2.job(ids[0]).state is h2.job(ids[1]).state is JobState.DONE
        assert not set(_launched(launcher)) & {ids[0], ids[1]}
        assert [len(h2.runs(j)) for j in ids] == [1, 1, 1, 1, 1]
    again.close()


@in_loop
async def test_a_group_submit_the_full_disk_refuses_gets_503_and_the_broker_goes_on(tmp_path):
    store = Store(tmp_path / "marbled.db")
    async with running_broker(tmp_path, store=store) as h:
        h.submit(**{**PAIR, "gpus": 6})  # holds every GPU
        await pump()
        disk = h.broker.ledger.db = FullDisk(h.broker.ledger.db)
        disk.full = True
        answers = [h.broker.submit_grouped([JobSpec.from_mapping(
            {**PAIR, "name": f"g{k}"})] * 1) for k in range(2)]
        for answer in answers:
            with pytest.raises(Unavailable, match="not accepted: the state directory's disk "
                                                  "is full: free space on"):
                await answer[1]
        await pump()
        assert not h.task.done()  # not stopped
        refused = [answer[0][0].id for answer in answers]
        # forgotten: in no count, view or queue, as if never sent
        assert not any(j in h.broker.state.jobs or j in h.broker.specs for j in refused)
        assert sum(Views(h.broker).status()["jobs"].values()) == 1  # job 1 alone
        assert h.broker.state.unfinished == 1 and refused[0] not in h.broker.state._ids
        assert "g0" not in h.broker.names
        disk.full = False
        await _until(lambda: h.broker.ledger.fault is None)
        assert sorted(_states(store)) == [1]  # the refused group never was
        later = h.submit(**{**PAIR, "name": "g0"})  # its name is free again
        assert _states(store)[later] == "queued"
    store.close()


@in_loop
async def test_a_read_only_store_at_shutdown_saves_the_held_ends_for_the_next_broker(tmp_path):
    store = Store(tmp_path / "marbled.db")
    with pytest.raises(ledger_module.StorageLost, match="read-only"):
        async with running_broker(tmp_path, store=store) as h:
            job = h.submit(**TRAIN)
            done = h.submit(**PAIR)
            await pump()
            train, pair = h.launcher.runs
            await asyncio.sleep(ledger_module.DEFER * 2)
            h.broker.ledger.db.execute("PRAGMA query_only = 1")  # SQLITE_READONLY
            pair.exit(0)
            await pump()
            assert "read-only" in h.broker.ledger.fault
            train.report(400, start_step=0)
            drain = asyncio.get_running_loop().create_task(h.broker.drain("shutdown"))
            await pump()
            train.acknowledge(400)
            h.broker.runs.check_acks()
            train.exit(0)
            await pump()
            await h.task  # it stops, saying why
    assert drain.done()
    assert _states(store) == {job: "running", done: "running"}  # nothing more was written
    store.writer().execute("PRAGMA query_only = 0")
    store.close()

    again = Store(tmp_path / "marbled.db")  # writable again (or another node's view of it)
    launcher = FakeLauncher(adopt_alive=False)
    async with running_broker(tmp_path, store=again, launcher=launcher) as h2:
        await pump()
        assert h2.job(done).state is JobState.DONE  # not run twice
        assert _launched(launcher) == [job]  # the checkpointed job resumes ...
        assert h2.runs(job)[-1].start_step == 400  # ... from its checkpoint, not from 0
    assert not (tmp_path / ("marbled.db" + ledger_module.SPILL_SUFFIX)).exists()
    again.close()


@in_loop
async def test_a_statement_fault_is_not_a_storage_fault(tmp_path):
    """A constraint that fails is no full disk: no write is held for it."""
    assert ledger_module.storage_fault(sqlite3.IntegrityError("UNIQUE constraint failed")) \
        is None
    assert ledger_module.storage_fault(sqlite3.OperationalError("database or disk is full")) \
        == "full"
    assert ledger_module.storage_fault(OSError(28, "No space left on device")) == "full"
    assert ledger_module.storage_fault(sqlite3.DatabaseError("database disk image is "
                                                             "malformed")) == "damaged"
    with contextlib.closing(sqlite3.connect(":memory:")) as con:
        con.execute("CREATE TABLE t (x)")
        con.execute("PRAGMA query_only = 1")
        with pytest.raises(sqlite3.OperationalError) as caught:
            con.execute("INSERT INTO t VALUES (1)")
    assert ledger_module.storage_fault(caught.value) == "readonly"


@in_loop
async def test_a_row_that_belongs_to_a_submission_is_written_or_refused_with_it(tmp_path):
    """`also`: e.g. an idempotency key's row, in the submission's own transaction."""
    store = Store(tmp_path / "marbled.db")
    async with running_broker(tmp_path, store=store) as h:
        ledger = h.broker.ledger
        disk = ledger.db = FullDisk(ledger.db)

        def key(name: str):
            return lambda con: con.execute(
                "INSERT INTO meta (key, value) VALUES (?, 'x')", (name,))

        disk.full = True
        admitted = h.broker.intake._admit([JobSpec.from_mapping(PAIR)])
        with pytest.raises(Unavailable, match="disk is full"):
            ledger.submitted(admitted, h.clock.time(), also=key("refused"))
        disk.full = False
        await _until(lambda: ledger.fault is None)
        ledger.submitted(admitted, h.clock.time(), also=key("taken"))
        meta = store.meta()
        assert "taken" in meta and "refused" not in meta
        assert [r.id for r in store.jobs()] == [admitted[0].job.id]
    store.close()


class FullAtRunStart(FullDisk):
    """A disk that fills as a decision records a run: its transaction is the first the
    store refuses (no end or submission before it saw the fault)."""

    def __init__(self, con: sqlite3.Connection):
        super().__init__(con)
        self.fill_at_run = False

    def execute(self, sql: str, *args):
        if self.fill_at_run and sql.startswith("INSERT INTO runs"):
            self.full = True
        return self.con.execute(sql, *args)


@in_loop
async def test_a_run_whose_record_the_store_refuses_starts_only_once_it_is_recorded(tmp_path):
    """The decision that starts a run is the transaction the full disk refuses: its process
    is not started until the run's record is committed (a broker killed meanwhile would not
    know the run, and start the job a second time); once the disk has room, it starts, once."""
    store = Store(tmp_path / "marbled.db")
    async with running_broker(tmp_path, store=store) as h:
        holder = h.submit(**{**PAIR, "gpus": 6})
        await pump()
        waiting = h.submit(**PAIR)
        await pump()
        await asyncio.sleep(ledger_module.DEFER * 2)  # the pid is written
        disk = FullAtRunStart(h.broker.ledger.db)
        disk.fill_at_run = True
        await _first_end_faulted(h, disk)
        await asyncio.sleep(0.05)  # retries, refused
        assert _launched(h.launcher) == [holder]  # not started: its run is not recorded
        assert _states(store)[waiting] == "queued"
        disk.fill_at_run = disk.full = False
        await _until(lambda: h.broker.ledger.fault is None and len(h.launcher.runs) == 2)
        assert _launched(h.launcher) == [holder, waiting]
        await asyncio.sleep(ledger_module.DEFER * 2)
        assert _states(store) == {holder: "done", waiting: "running"}
        assert len(h.runs(waiting)) == 1
    store.close()


@in_loop
async def test_a_drain_while_a_run_waits_for_its_record_stops_and_the_next_broker_runs_it(
        tmp_path):
    """The broker is asked to stop while a decided run waits for the store: it stops (the
    run is never started), saves what it holds, and the next broker runs the job once."""
    store = Store(tmp_path / "marbled.db")
    with pytest.raises(ledger_module.StorageLost, match="disk is full"):
        async with running_broker(tmp_path, store=store) as h:
            holder = h.submit(**{**PAIR, "gpus": 6})
            await pump()
            waiting = h.submit(**PAIR)
            await pump()
            await asyncio.sleep(ledger_module.DEFER * 2)
            disk = FullAtRunStart(h.broker.ledger.db)
            disk.fill_at_run = True
            await _first_end_faulted(h, disk)
            assert waiting in h.broker.runs.launching  # decided, waiting for its record
            drain = asyncio.get_running_loop().create_task(h.broker.drain("shutdown"))
            await asyncio.wait_for(h.task, 2)  # it stops, saying why: not stuck on the wait
    assert drain.done() and _launched(h.launcher) == [holder]
    assert _states(store) == {holder: "running", waiting: "queued"}  # what was committed
    store.close()

    again = Store(tmp_path / "marbled.db")
    launcher = FakeLauncher(adopt_alive=False)
    async with running_broker(tmp_path, store=again, launcher=launcher) as h2:
        await pump()
        assert h2.job(holder).state is JobState.DONE  # its end was saved: not run again
        assert _launched(launcher) == [waiting]  # started once, by this broker
        assert h2.job(waiting).state is JobState.RUNNING
    again.close()


class DamagedFile(FullDisk):
    """The ledger's connection on a database file found damaged: its commits fail as
    SQLite's do on a malformed page, while `full`."""

    def commit(self) -> None:
        if self.full:
            self.refused += 1
            raise sqlite3.DatabaseError("database disk image is malformed")
        self.con.commit()


@in_loop
async def test_a_store_found_damaged_while_jobs_run_holds_its_writes_and_says_what_to_do(
        tmp_path):
    """A damaged page found at a commit is a fault of storage, not a failed statement: the
    broker does not stop (its running jobs go on, and `marble shutdown` still checkpoints
    them), starts nothing, and every refusal says how to recover the file."""
    store = Store(tmp_path / "marbled.db")
    async with running_broker(tmp_path, store=store) as h:
        ids = [h.submit(**PAIR) for _ in range(4)]  # 1-3 run, 4 waits
        await pump()
        await asyncio.sleep(ledger_module.DEFER * 2)
        disk = DamagedFile(h.broker.ledger.db)
        disk.full = True
        await _first_end_faulted(h, disk)
        fault = h.broker.ledger.fault
        db = tmp_path / "marbled.db"
        assert f"the database {db} is damaged (database disk image is malformed)" in fault
        assert f"sqlite3 {db} .dump | sed" in fault
        with pytest.raises(Unavailable, match="is damaged"):
            h.submit(**PAIR)
        await asyncio.sleep(0.05)  # retries, refused
        assert not h.task.done() and disk.refused >= 2
        assert _launched(h.launcher) == ids[:3]  # the fourth is not started on it
        assert h.job(ids[0]).state is JobState.DONE  # in memory; its end is held
    store.close()
