"""sql/schema.sql is what staff read: it must match the tables the broker creates."""

from __future__ import annotations

import sqlite3

import pytest

from marbled.resources import sql_path
from marbled.store.db import SCHEMA_VERSION, SchemaError, Store, job_spec, migrate
from tests.scenarios import as_schema_version_1


def _columns(con: sqlite3.Connection) -> dict[str, list[tuple]]:
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: [(c[1], c[2].upper(), c[3], c[5]) for c in con.execute(f"PRAGMA table_info({t})")]
            for t in sorted(tables)}


def test_schema_sql_mirrors_the_store(tmp_path):
    store = Store(tmp_path / "orm.db")
    store.close()
    orm = sqlite3.connect(tmp_path / "orm.db")
    doc = sqlite3.connect(":memory:")
    doc.executescript(sql_path("schema.sql").read_text())
    assert _columns(doc) == _columns(orm)


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
