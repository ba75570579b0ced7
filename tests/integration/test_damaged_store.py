"""A damaged state database (a bad byte in one of its pages, its header overwritten) is
named by a real marbled before it reads a job, with what to do, and by the commands that
read a stopped broker's records; not a traceback part-way through a start, after runs were
adopted. tests/broker/test_storage_faults.py: a store found damaged while the broker runs
holds its writes, as a full disk does."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from marbled.cli.client import ApiError
from marbled.paths import DB_NAME
from marbled.store.damage import RECOVER
from tests.conftest import require_debian

pytestmark = pytest.mark.daemon

PAGE = 4096  # SQLite's default page size: page 2 is the root of the first table, `jobs`


def _records(daemon_factory, state: Path) -> Path:
    """A stopped broker's state database with three ended jobs, its WAL folded in."""
    d = daemon_factory(state_dir=state)
    d.submit(*[{"gpus": 1, "command": ["true"]}] * 3)
    d.wait_all()
    assert d.stop() == 0
    db = state / DB_NAME
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def _damage(db: Path, where: str) -> None:
    data = bytearray(db.read_bytes())
    if where == "page":  # the b-tree page type of the `jobs` table's root: one byte
        data[PAGE] ^= 0xFF
    else:  # "SQLite format 3\0" overwritten
        data[:16] = b"\0" * 16
    db.write_bytes(data)


def _marbled(state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marbled.cli.daemon_cmd", "--state-dir", str(state), "--gpus",
         "2"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("where", ["page", "header"])
def test_a_damaged_database_is_named_with_how_to_recover_it(daemon_factory, tmp_path, where):
    state = tmp_path / "state"
    db = _records(daemon_factory, state)
    _damage(db, where)
    damaged = db.read_bytes()
    broker = _marbled(state)
    said = broker.stdout + broker.stderr
    assert broker.returncode != 0
    assert "Traceback" not in said, said
    assert f"the database {db} is damaged" in said, said
    assert RECOVER.format(db=db) in said
    assert "checkpoint" in said  # where the jobs' own work stays
    assert db.read_bytes() == damaged  # left as it was found, for its recovery
    if where == "page":  # so do the commands that read a stopped broker's records
        for args in (["--state-dir", str(state), "status"],
                     ["report", "--state-dir", str(state)]):
            read = subprocess.run([Path(sys.executable).with_name("marble"), *args],
                                  capture_output=True, text=True, timeout=60)
            assert read.returncode != 0 and "Traceback" not in read.stderr, read.stderr
            assert f"the database {db} is damaged" in read.stderr, read.stderr


def test_what_the_advice_says_recovers_a_database_damaged_in_a_page_of_events(
        daemon_factory, tmp_path):
    """The advice works: a bad byte in a page of an index of the `events` table, copied out
    with the sqlite3 tool as the message says, gives a database a new broker starts on,
    with every job it held."""
    require_debian("sqlite3")  # SQLite's command-line tool
    state = tmp_path / "state"
    db = _records(daemon_factory, state)
    with sqlite3.connect(db) as con:
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ix_events_kind'"
                           ).fetchone()[0]
    data = bytearray(db.read_bytes())
    data[(root - 1) * PAGE] ^= 0xFF
    db.write_bytes(data)
    first = _marbled(state)
    said = first.stdout + first.stderr
    assert first.returncode != 0 and "is damaged" in said
    # the command as the message gives it, run as a user would paste it
    command = said[said.index("sqlite3 " + str(db)):said.index("; then remove")]
    subprocess.run(["bash", "-o", "pipefail", "-c", command], check=True)
    for extra in ("-wal", "-shm"):
        db.with_name(db.name + extra).unlink(missing_ok=True)
    db.with_name(db.name + ".recovered").replace(db)
    d = daemon_factory(state_dir=state)
    assert [j["state"] for j in d.jobs()] == ["done"] * 3


def test_a_job_whose_command_cannot_be_read_is_named_and_runs_once_put_right(
        daemon_factory, tmp_path):
    """A bad byte in a value, which leaves the file's structure whole (`quick_check` passes):
    a queued job's command no longer JSON. The broker does not start on it, names the job,
    the column and the two ways to put it right; with the value written back as the
    message says, a new broker adopts the running job and runs the queued one."""
    require_debian("sqlite3")  # SQLite's shell
    state, marks = tmp_path / "state", tmp_path / "second.txt"
    d = daemon_factory(state_dir=state, gpus=1)
    holder, second = d.submit({"gpus": 1, "command": ["sleep", "30"]},
                              {"gpus": 1, "command": ["sh", "-c", f"echo ran >> {marks}"]})
    d.stop(signal.SIGKILL)  # the holder runs on; the second waits in the records
    db = state / DB_NAME
    with sqlite3.connect(db) as con:
        con.execute("UPDATE jobs SET command = '[\"sh\", \"-c' WHERE id = ?", (second["id"],))
    refused = _marbled(state)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "Traceback" not in said, said
    assert f"jobs row {second['id']}'s command is '[\"sh\", \"-c'" in said, said
    fix = said[said.index("UPDATE jobs SET \"command\""):said.index("; or, if") + 1]
    value = json.dumps(["sh", "-c", f"echo ran >> {marks}"])
    subprocess.run(["sqlite3", str(db)], input=fix.replace("VALUE", value), text=True,
                   check=True)  # as pasted into SQLite's shell
    again = daemon_factory(state_dir=state, gpus=1)
    again.client.post(f"/v1/jobs/{holder['id']}/cancel")
    jobs = {j["id"]: j for j in again.wait_all()}
    assert jobs[holder["id"]]["state"] == "cancelled" and jobs[second["id"]]["state"] == "done"
    assert marks.read_text() == "ran\n"


def test_a_running_broker_answers_a_value_it_cannot_read_by_naming_it(daemon_factory,
                                                                      tmp_path):
    """An ended job's row, which the broker reads from the store, damaged while it runs:
    its listing answers 500 naming the row and the column, not aiohttp's bare 500."""
    d = daemon_factory(state_dir=tmp_path / "state")
    (job,) = d.submit({"gpus": 1, "command": ["true"]})
    d.wait_all()
    with sqlite3.connect(d.state_dir / DB_NAME) as con:
        con.execute("UPDATE jobs SET \"after\" = '[' WHERE id = ?", (job["id"],))
    with pytest.raises(ApiError) as caught:
        d.jobs()
    assert caught.value.status == 500
    assert f"jobs row {job['id']}: after '['" in str(caught.value), str(caught.value)
    assert d.client.get("/v1/status")["jobs"]["done"] == 1  # the rest answers as before
