"""A damaged database file (a bad byte, a write the disk lost): how SQLite says so, how it
is found before anything reads the file, and what to tell the user to do about it.
Standard library only: `marble report` and the daemon's storage faults import it."""

from __future__ import annotations

import shlex
import sqlite3
from pathlib import Path

DAMAGE_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
# What copies a damaged database's readable rows into a new one. The dump goes on past a
# damaged page and then ends in ROLLBACK, which would undo the copy: it commits instead.
# (`.recover` does more, but Debian 12's sqlite3, 3.40.1, fails it on any file.)
RECOVER = ("sqlite3 {db} .dump | sed 's/^ROLLBACK; -- due to errors$/COMMIT;/' | "
           "sqlite3 {db}.recovered")


def is_damage(exc: BaseException) -> bool:
    """Whether SQLite says the database file itself is damaged, or is no database."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in DAMAGE_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def quick_check(con: sqlite3.Connection) -> str | None:
    """What SQLite's `quick_check` finds wrong with the file (its first three findings, on
    one line), None if nothing. Every page's structure, not the values in them: 30-40 ms
    for a file of 20,000 jobs."""
    try:
        found = [row[0] for row in con.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as exc:
        return str(exc)
    if found == ["ok"]:
        return None
    lines = (line.strip() for text in found for line in text.splitlines())
    return "; ".join(line for line in lines if line and not line.startswith("***"))


def damaged(path: Path, problem: object) -> str:
    """What to say of a damaged database at `path`, and what to do about it."""
    return (f"the database {path} is damaged ({problem}). Stop what uses it, keep a copy, and "
            f"copy out what it still holds with SQLite's command-line tool (Debian: sqlite3), "
            f"whose dump reads past the damage: {RECOVER.format(db=shlex.quote(str(path)))}; "
            f"then remove {path}-wal and {path}-shm and move {path}.recovered to {path}. Or "
            f"start on a new --state-dir: the jobs' checkpoints stay in "
            f"{path.parent / 'jobs'}/<id>/checkpoint")


class DamagedValue(ValueError):
    """A value of a row that cannot be read (a bad byte in a JSON column): the structure of
    the file is whole, so `quick_check` passes, but this job cannot be known."""

    def __init__(self, table: str, row_id: int, column: str, value: object, why: object):
        super().__init__(f"{table} row {row_id}: {column} {value!r} ({why})")
        self.table, self.row_id, self.column, self.value, self.why = \
            table, row_id, column, value, why


def damaged_value(path: Path, exc: DamagedValue) -> str:
    """What to say of a value that cannot be read, and how to put it right (SQL for SQLite's
    shell: a JSON value's quotes would end a shell's quoted argument)."""
    row, table = exc.row_id, exc.table
    said = (f"the database {path} holds a value that cannot be read: {table} row {row}'s "
            f"{exc.column} is {exc.value!r} ({exc.why}). Put it right in SQLite's shell "
            f"(sqlite3 {shlex.quote(str(path))}) while no broker runs on it: ")
    if table != "jobs":  # an event's details: what happened is in its other columns
        return said + f"UPDATE {table} SET \"{exc.column}\" = NULL WHERE id = {row};"
    return said + (
        f"write the value it was submitted with, UPDATE jobs SET \"{exc.column}\" = 'VALUE' "
        f"WHERE id = {row}; or, if SELECT id FROM runs WHERE job_id = {row} AND ended_at IS "
        f"NULL; shows no run open, end the job: UPDATE jobs SET state = 'cancelled', reason = "
        f"'its record was damaged' WHERE id = {row};")
