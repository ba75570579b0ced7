"""sql/schema.sql is what staff read: it must match the tables the broker creates."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from marbled.resources import sql_path
from marbled.store.db import SCHEMA_VERSION, SchemaError, Store, job_spec, migrate
from tests.scenarios import as_schema_version_1


def _shape(con: sqlite3.Connection) -> dict:
    """Every table's columns (name, type, not null, default, key) and every index's table,
    uniqueness, columns and condition."""
    tables = sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'"))
    shape = {t: [(c[1], c[2].upper(), c[3], c[4], c[5])
                 for c in con.execute(f"PRAGMA table_info({t})")] for t in tables}
    for table in tables:
        for _, name, unique, _origin, partial in con.execute(f"PRAGMA index_list({table})"):
            sql = con.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
            where = sql.split(" WHERE ", 1)[1] if partial else None
            shape[name] = (table, unique, where,
                           [c[2] for c in con.execute(f"PRAGMA index_info({name})")])
    return shape


def test_the_store_makes_its_tables_from_schema_sql_as_the_orm_describes_them(tmp_path):
    """The broker makes its tables with sql/schema.sql (it never imports SQLAlchemy); the
    SQLAlchemy models (`marbled.store.orm`, for staff's scripts) must describe exactly those
    tables and indexes."""
    from sqlalchemy import create_engine

    from marbled.store.orm import Base

    store = Store(tmp_path / "marble.db")
    store.close()
    engine = create_engine(f"sqlite:///{tmp_path / 'orm.db'}")
    Base.metadata.create_all(engine)
    engine.dispose()
    made = sqlite3.connect(tmp_path / "marble.db")
    assert _shape(made) == _shape(sqlite3.connect(tmp_path / "orm.db"))
    assert "ix_runs_open" in _shape(made) and "requests" in _shape(made)
    # the file staff read is the one the broker runs, and running it again changes nothing
    made.executescript(sql_path("schema.sql").read_text())
    assert _shape(made) == _shape(sqlite3.connect(tmp_path / "orm.db"))


def test_the_store_reads_and_writes_without_sqlalchemy(tmp_path):
    """Every read of the store is plain SQL: SQLAlchemy's imports, 40 % of a broker's start,
    are never paid by a broker (a start, recovery's reads, `marble show`'s and `logs`', the
    dashboard's window)."""
    code = ("import sys; from marbled.store.db import Store; s = Store(sys.argv[1]); "
            "s.set_meta(policy='marble'); s.open_runs(); s.environments(); s.samples(); "
            "s.job_page(states=('queued',)); s.next_job_id(); s.requested('k'); s.meta(); "
            "s.jobs([1]); s.jobs(); s.runs(1); s.runs_since(0.0); s.events(1); "
            "s.gpu_samples(); s.last_runs([1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))")
    for _ in range(2):  # a new state file, then the same one again
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "marble.db")],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "[]"


def test_the_store_reads_rows_as_sqlalchemy_reads_them(tmp_path):
    """The records of the plain reads hold what SQLAlchemy's models read from the same rows
    (flags as bools, JSON decoded, None for NULL), in the same order."""
    from sqlalchemy import select

    from marbled.store.orm import EventRow, JobRow, RunRow

    store = Store(tmp_path / "marble.db")
    with store.writer() as con:
        for i in range(1, 4):
            con.execute("INSERT INTO jobs (id, demand, malleable, command, emulate, after, "
                        "state, step, suspensions, submitted_at, per_gpu) VALUES "
                        "(?, 2, ?, ?, ?, ?, 'done', 5, 0, 1.5, ?)",
                        (i, i % 2, '["a", "b"]', 1 - i % 2, f"[{i - 1}]" if i > 1 else "[]",
                         i % 2))
        con.executemany("INSERT INTO runs (id, job_id, node, gpu_ids, gpu_count, role, "
                        "started_at, ended_at) VALUES (?, ?, 'n', '0,1', 2, 'primary', ?, ?)",
                        [(1, 1, 5.0, 6.0), (2, 1, 2.0, None), (3, 2, 2.0, 3.0)])
        con.executemany("INSERT INTO events (at, kind, job_id, data) VALUES (?, ?, ?, ?)",
                        [(1.0, "submitted", 1, '{"x": [1]}'), (2.0, "start", 1, None),
                         (3.0, "end", 2, "null")])
    with store.tx() as s:
        orm = {kind: [{c: getattr(r, c) for c in columns} for r in s.scalars(select(row))]
               for kind, row, columns in (
                   ("jobs", JobRow, store.jobs()[0]._fields),
                   ("runs", RunRow, store.runs()[0]._fields),
                   ("events", EventRow, store.events()[0]._fields))}
    orm["runs"].sort(key=lambda r: (r["started_at"], r["id"]))
    # (repr: a flag read as 1, not True, would be equal)
    assert repr([r._asdict() for r in store.jobs()]) == repr(orm["jobs"])
    assert repr([r._asdict() for r in store.runs()]) == repr(orm["runs"])
    assert repr([r._asdict() for r in store.events()]) == repr(orm["events"])
    assert [r.id for r in store.jobs([3, 1])] == [1, 3]
    assert [r.id for r in store.runs(1)] == [2, 1] and store.runs(3) == []
    assert [r.id for r in store.runs_since(5.5)] == [2, 1]
    store.close()


def test_a_current_state_file_is_not_written_at_a_start(tmp_path):
    """A file already of this version gets no migration's commit (an fsync, on a parallel
    file system milliseconds or more, at every broker's start)."""
    path = tmp_path / "marble.db"
    Store(path).close()
    watcher = sqlite3.connect(path)
    before = watcher.execute("PRAGMA data_version").fetchone()[0]
    assert migrate(path) == SCHEMA_VERSION
    Store(path).close()
    assert watcher.execute("PRAGMA data_version").fetchone()[0] == before
    watcher.close()


def test_staff_reports_run_on_a_store(tmp_path):
    Store(tmp_path / "marble.db").close()
    con = sqlite3.connect(tmp_path / "marble.db")
    for query in sql_path("reports.sql").read_text().split(";"):
        if query.strip() and not all(
            line.startswith("--") for line in query.strip().splitlines()
        ):
            con.execute(query).fetchall()


def _migrated(path, *statements: str) -> int | None:
    """Run `statements` on the database at `path` (what an older marbled left), then bring it
    to this version; the version it had."""
    con = sqlite3.connect(path)
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()
    return migrate(path)


def test_a_version_1_state_directory_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "marble.db"
    Store(path).close()
    as_schema_version_1(path)
    assert _migrated(path,
                     "INSERT INTO jobs (id, demand, malleable, command, emulate, after, state,"
                     " step, suspensions, submitted_at) VALUES (1, 3, 1, '[]', 1, '[]',"
                     " 'suspended', 42, 1, 0)",
                     "INSERT INTO runs (id, job_id, node, gpu_ids, gpu_count, role, started_at)"
                     " VALUES (1, 1, 'n1', '0,1,2', 3, 'primary', 0)") == 1
    store = Store(path)
    (run,) = store.runs()
    assert (run.gpu_ids, run.devices) == ("0,1,2", None)
    assert (run.share, store.jobs()[0].max_share) == (1, 1)
    assert (store.jobs()[0].step, store.jobs()[0].nodes) == (42, 1)
    assert store.meta()["schema_version"] == str(SCHEMA_VERSION) == "9"
    assert store.gpu_samples() == []  # the table of version 3 exists
    assert store.samples() == []  # ... and that of version 5
    store.close()
    assert migrate(path) == 9  # nothing left to do


def test_a_version_5_state_directory_gains_the_jobs_directory(tmp_path):
    """Version 6 records where each job runs; a job of an older broker has none (NULL) and
    keeps running in its own directory under the state directory. Version 7 records whether
    a job runs one process per GPU: an older job ran one process, and still does. Version 8
    records a node range's fewest nodes: an older job has none (NULL), it runs on exactly
    its `nodes`. Version 9 records the environment a job runs in: an older job has none
    (NULL), it runs in the broker's."""
    path = tmp_path / "marble.db"
    Store(path).close()
    assert _migrated(path, "ALTER TABLE jobs DROP COLUMN chdir",
                     "ALTER TABLE jobs DROP COLUMN per_gpu",
                     "ALTER TABLE jobs DROP COLUMN nodes_min",
                     "ALTER TABLE jobs DROP COLUMN env", "DROP TABLE environments",
                     "UPDATE meta SET value = '5' WHERE key = 'schema_version'",
                     "INSERT INTO jobs (id, demand, malleable, command, emulate, after, state,"
                     " step, suspensions, submitted_at) VALUES (1, 1, 1, '[\"python\","
                     " \"train.py\"]', 0, '[]', 'suspended', 7, 1, 0)") == 5
    store = Store(path)
    (job,) = store.jobs()
    assert (job.chdir, job.step, job_spec(job).chdir) == (None, 7, None)
    assert (job.per_gpu, job_spec(job).per_gpu) == (False, False)
    assert (job.nodes_min, job_spec(job).nodes_min, job_spec(job).fewest_nodes) == (None, None, 1)
    assert job.env is None and job_spec(job, store.environments()).environment.is_default
    (record,) = store.job_page()
    assert (record.chdir, record.reason, record.per_gpu, record.nodes_min) == (None, None, 0, None)
    store.close()


def test_a_newer_state_directory_is_refused_untouched(tmp_path):
    path = tmp_path / "marble.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(SchemaError, match="schema version 99, newer"):
        Store(path)
    assert sqlite3.connect(path).execute(
        "SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("99",)
