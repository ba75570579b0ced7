"""A damaged state database (a bad byte in one of its pages, its header overwritten) is
named by a real marbled before it reads a job, with what to do, and by the commands that
read a stopped broker's records; not a traceback part-way through a start, after runs were
adopted. tests/broker/test_storage_faults.py: a store found damaged while the broker runs
holds its writes, as a full disk does."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

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
