"""sql/schema.sql is what staff read: it must match the tables the broker creates."""

from __future__ import annotations

import sqlite3

from marbled.resources import PROJECT_ROOT
from marbled.store.db import Store


def _columns(con: sqlite3.Connection) -> dict[str, list[tuple]]:
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: [(c[1], c[2].upper(), c[3], c[5]) for c in con.execute(f"PRAGMA table_info({t})")]
            for t in sorted(tables)}


def test_schema_sql_mirrors_the_store(tmp_path):
    store = Store(tmp_path / "orm.db")
    store.close()
    orm = sqlite3.connect(tmp_path / "orm.db")
    doc = sqlite3.connect(":memory:")
    doc.executescript((PROJECT_ROOT / "sql" / "schema.sql").read_text())
    assert _columns(doc) == _columns(orm)


def test_staff_reports_run_on_a_store(tmp_path):
    Store(tmp_path / "marble.db").close()
    con = sqlite3.connect(tmp_path / "marble.db")
    for query in (PROJECT_ROOT / "sql" / "reports.sql").read_text().split(";"):
        if query.strip() and not all(
            line.startswith("--") for line in query.strip().splitlines()
        ):
            con.execute(query).fetchall()
