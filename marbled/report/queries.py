"""The named queries of sql/reports.sql, run on a read-only connection to a state file.

The queries live in sql/reports.sql, each after a `-- name: NAME` line, so that staff
with only `sqlite3` run the same ones.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from marbled.paths import DB_NAME
from marbled.resources import sql_path
from marbled.store.damage import damaged, quick_check

SUMMARY = "summary"
TABLES = ("jobs", "runs", "events", "meta")


class StateFileError(Exception):
    """A file `marble report` cannot read; the message says what it is and what to do."""


@dataclass(frozen=True)
class Query:
    name: str
    about: str  # the first comment line under its name
    sql: str


def parse_queries(text: str) -> dict[str, Query]:
    """The named queries of a SQL file: each runs from its `-- name: NAME` line to the next."""
    parts = re.split(r"^-- name:[ \t]*(\S+)[ \t]*$", text, flags=re.M)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        first = body.strip().splitlines()[0] if body.strip() else ""
        about = first[2:].strip() if first.startswith("--") else ""
        queries[name] = Query(name, about, body.strip())
    return queries


def load_queries() -> dict[str, Query]:
    return parse_queries(sql_path("reports.sql").read_text())


def open_state(path: Path) -> sqlite3.Connection:
    """A read-only connection to a broker's state file, after checking that it is one of
    the schema version this marbled reads."""
    from marbled.store.schema import SCHEMA_VERSION

    if path.is_dir():
        raise StateFileError(f"{path} is a directory: give a state directory with "
                             f"--state-dir, or its {DB_NAME} with --db")
    if not path.is_file():
        raise StateFileError(f"{path}: no such file (a broker's state file is "
                             f"STATE_DIR/{DB_NAME}: give it with --db, or --state-dir)")
    # A broker with the file open keeps a -wal file beside it: read as any other reader
    # (mode=ro, through SQLite's shared memory). Without one nobody is writing: read it
    # as immutable, which creates no -wal/-shm beside it (staff may not own the directory).
    live = path.with_name(path.name + "-wal").exists()
    uri = path.resolve().as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise StateFileError(f"{path}: cannot open: {exc}") from None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = [t for t in TABLES if t not in tables]
        if missing:
            raise StateFileError(f"{path}: not a marbled state database (no table "
                                 f"{', '.join(missing)})")
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        # a damaged page, said now with what to do, not as a traceback part-way through
        # (every page's structure: 30-40 ms for 20,000 jobs)
        problem = quick_check(con)
        if problem:
            raise StateFileError(damaged(path, problem))
    except sqlite3.DatabaseError as exc:  # "file is not a database", "... is malformed"
        con.close()
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF == 11:  # SQLITE_CORRUPT: it was one
            raise StateFileError(damaged(path, exc)) from None
        raise StateFileError(f"{path}: not an SQLite database ({exc})") from None
    except StateFileError:
        con.close()
        raise
    version = int(row[0]) if row and str(row[0]).isdigit() else 1  # version 1 had no row
    if version != SCHEMA_VERSION:
        con.close()
        if version < SCHEMA_VERSION:
            # Not "start marbled on it": that would also resume the jobs it left.
            raise StateFileError(
                f"{path} has schema version {version}, older than the version "
                f"{SCHEMA_VERSION} marble report reads. Bring a copy up to date as marbled "
                "does at start-up, and report on that: cp FILE COPY && python -c \"from "
                "marbled.store.db import migrate; migrate('COPY')\" && marble report --db COPY")
        raise StateFileError(f"{path} has schema version {version}, newer than this "
                             f"marbled's ({SCHEMA_VERSION}): use the newer marble that wrote it")
    return con


def run_query(con: sqlite3.Connection, query: Query) -> tuple[list[str], list[dict]]:
    """The columns and rows (as dicts) of one named query."""
    try:
        cur = con.execute(query.sql)
    except sqlite3.Error as exc:
        raise StateFileError(f"report {query.name}: {exc} (sqlite {sqlite3.sqlite_version})") \
            from None
    columns = [d[0] for d in cur.description]
    return columns, [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]


def rows_of(con: sqlite3.Connection, queries: dict[str, Query], *names: str) -> dict:
    """The rows of several named queries, by name."""
    return {name: run_query(con, queries[name])[1] for name in names}


def meta_of(con: sqlite3.Connection) -> dict[str, str]:
    return dict(con.execute("SELECT key, value FROM meta").fetchall())
