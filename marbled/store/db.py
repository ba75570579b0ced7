"""SQLite state of one broker: jobs, runs (launch segments) and an append-only event journal.

One SQLite file in WAL mode under the state directory. Every state change is
written in one transaction together with its event row, so the journal and the
derived tables never disagree, and a `kill -9` between two changes loses
neither. `sql/schema.sql` makes the tables (and is what staff read).

The broker's reads and writes are plain SQL on sqlite3, its rows read as named tuples: a
broker runs without SQLAlchemy's imports (40 % of its start's CPU) and statement building
(more than the writes themselves cost). `orm.py` describes the same tables to SQLAlchemy
(`Store.tx()`), for staff's scripts and the tests.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import namedtuple
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from marbled.core.environment import Environment
from marbled.core.model import Job, JobState
from marbled.core.spec import JobSpec
from marbled.store.damage import DamagedValue, damaged, is_damage, quick_check
from marbled.store.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session

# How to bring a database of version N-1 to N: run at start-up, in one transaction, so a
# newer marbled opens the state directory of an older one.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE runs ADD COLUMN devices VARCHAR",
        "ALTER TABLE jobs ADD COLUMN nodes INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN not_before FLOAT"),
    3: (),  # the gpu_samples table: a new table, made by schema.sql at any start
    4: ("ALTER TABLE jobs ADD COLUMN max_share INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE runs ADD COLUMN share INTEGER NOT NULL DEFAULT 1"),
    5: (),  # the samples table (what runs measured of their models): made so too
    # the directory a job runs in; NULL for the jobs of older brokers, which ran in their
    # own directory under the state directory (and still do)
    6: ("ALTER TABLE jobs ADD COLUMN chdir VARCHAR",),
    # one process per GPU (ranks started by the launcher); the jobs of older brokers: one
    7: ("ALTER TABLE jobs ADD COLUMN per_gpu BOOLEAN NOT NULL DEFAULT 0",),
    # the fewest nodes of a node range (NULL: exactly `nodes`, as every job of older brokers)
    8: ("ALTER TABLE jobs ADD COLUMN nodes_min INTEGER",),
    # the environment a job runs in (a row of the environments table, made so too);
    # NULL: the broker's, as every job of older brokers
    9: ("ALTER TABLE jobs ADD COLUMN env VARCHAR(32)",),
}


class SchemaError(RuntimeError):
    pass


class StoreDamaged(SchemaError):
    """The database file is damaged (a bad byte, a write the disk lost): named, with what to
    do, before anything reads or writes it."""


JOB_RECORD_COLUMNS = (
    "id", "name", "model", "steps", "gpus_request", "demand", "nodes", "retries", "failures",
    "not_before", "malleable", "max_share", "command", "emulate", "after", "state", "step",
    "suspensions", "submitted_at", "started_at", "finished_at", "exit_code", "reason", "chdir",
    "per_gpu", "nodes_min", "env")
JobRecord = namedtuple("JobRecord", JOB_RECORD_COLUMNS)  # one `jobs` row, read fast


RUN_COLUMNS = ("id", "job_id", "node", "gpu_ids", "devices", "gpu_count", "share", "role",
               "started_at", "ended_at", "start_step", "end_step", "exit_code", "end_reason",
               "pid", "pid_start")
RunRecord = namedtuple("RunRecord", RUN_COLUMNS)  # one `runs` row
SAMPLE_COLUMNS = ("id", "at", "model", "kind", "gpus", "share", "value", "job_id", "run_id")
SampleRecord = namedtuple("SampleRecord", SAMPLE_COLUMNS)  # one `samples` row
EVENT_COLUMNS = ("id", "at", "kind", "job_id", "run_id", "data")
EventRecord = namedtuple("EventRecord", EVENT_COLUMNS)  # one `events` row, its data decoded
GPU_SAMPLE_COLUMNS = ("id", "at", "node", "device", "job_id", "util_gpu", "util_mem",
                      "mem_used", "mem_total")
GpuSampleRecord = namedtuple("GpuSampleRecord", GPU_SAMPLE_COLUMNS)  # one `gpu_samples` row


def _job_record(r: tuple) -> JobRecord:
    """A `jobs` row's values as its record: flags as bools, the JSON columns decoded."""
    loads = json.loads
    try:
        return JobRecord(*r[:10], bool(r[10]), r[11],
                         loads(r[12]) if r[12] is not None else None, bool(r[13]),
                         loads(r[14]) if r[14] is not None else None, *r[15:24], bool(r[24]),
                         *r[25:])
    except ValueError:
        for column, i in (("command", 12), ("after", 14)):
            _json_of("jobs", r[0], column, r[i])
        raise


def _json_of(table: str, row_id: int, column: str, text: str | None) -> object:
    """A JSON column's value; DamagedValue, naming it, if it cannot be read."""
    try:
        return json.loads(text) if text is not None else None
    except ValueError as exc:
        raise DamagedValue(table, row_id, column, text, exc) from None


PAGE = 500  # ids a statement names at most (within SQLite's limit of variables)


def _pages(values: Collection[int]) -> Iterator[list[int]]:
    values = list(values)
    for i in range(0, len(values), PAGE):
        yield values[i:i + PAGE]


def _event_record(r: tuple) -> EventRecord:
    return EventRecord(*r[:5], _json_of("events", r[0], "data", r[5]))


SCHEMA_SQL = Path(__file__).resolve().parent.parent / "sql" / "schema.sql"  # staff read it too


@cache
def _schema() -> str:
    return SCHEMA_SQL.read_text()


def pragmas(con: sqlite3.Connection) -> None:
    """Every connection's settings (the writer's, and SQLAlchemy's: `orm.engine_for`)."""
    con.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode survives a crash of the process (kill -9) with every
    # committed transaction; only an OS crash may lose the last few.
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("PRAGMA foreign_keys=ON")
    con.execute("PRAGMA busy_timeout=5000")


class Store:
    """The broker's SQLite database. Writes happen only on the broker's event loop thread.

    `path` None: a database in memory (for tests of the broker in process)."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            if self.path is None or not is_damage(exc):
                raise
            raise StoreDamaged(damaged(self.path, exc)) from None

    def _open(self) -> None:
        if self.path is not None:
            migrate(self.path)
        # check_same_thread off, as SQLAlchemy's pool had it: only the loop thread writes
        self._con = sqlite3.connect(self.path or ":memory:", check_same_thread=False)
        pragmas(self._con)
        # Every table and index, made where missing: a new database's, a table or index added
        # since an older marbled made this one (no new version: an older marbled reads and
        # writes the same rows, and an index it does not know of is kept up to date by SQLite)
        self._con.executescript(_schema())
        if self._con.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone() \
                is None:
            with self._con:
                self._con.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                                  (str(SCHEMA_VERSION),))
        self._engine: Engine | None = None  # SQLAlchemy's (`tx`), made at its first use
        # key -> [digest, first job id, job count, this broker's answer or None]; read at the
        # first keyed submission (`requested`)
        self.requests: dict[str, list] | None = None

    def check_whole(self) -> None:
        """Raise StoreDamaged if SQLite's `quick_check` finds the file damaged (every page's
        structure, not the values: 30-40 ms for 20,000 jobs). A broker's start, before it
        reads the jobs: a damaged page found later would stop it part-way."""
        if self.path is None:
            return
        problem = quick_check(self._con)
        if problem:
            raise StoreDamaged(damaged(self.path, problem))

    @property
    def engine(self) -> Engine:
        """SQLAlchemy's engine on this database (`orm.py`), made at its first use."""
        if self._engine is None:
            from marbled.store.orm import engine_for

            self._engine = engine_for(self.path, self._con)
        return self._engine

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """One transaction through SQLAlchemy: committed on success, rolled back on error."""
        from sqlalchemy.orm import Session

        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    def writer(self) -> sqlite3.Connection:
        """The connection the broker's writes go through (`daemon/ledger.py`: plain SQL, no
        statement building), held for the store's life (in memory, the one connection).
        Only the loop thread uses it."""
        return self._con

    def set_meta(self, **values: str) -> None:
        """At a broker's start (the writer holds no transaction yet)."""
        with self._con:
            self._con.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                  [(k, str(v)) for k, v in values.items()])

    def meta(self) -> dict[str, str]:
        return dict(self.writer().execute("SELECT key, value FROM meta"))

    def environments(self) -> dict[str, Environment]:
        """Every stored environment, by digest (few: one per submitting shell)."""
        return {digest: Environment(tuple(sorted(json.loads(names).items())), bool(whole))
                for digest, whole, names in self.writer().execute(
                    "SELECT digest, whole, vars FROM environments")}

    def jobs(self, ids: Collection[int] | None = None) -> list[JobRecord]:
        """The `jobs` rows (of `ids` if given) in id order."""
        return self._read(_job_record, JOB_RECORD_COLUMNS, "jobs", "id", "id", ids)

    def job_page(self, *, states: Collection[str] = (), also: Collection[int] = (),
                 after: int = 0, limit: int | None = None, name: str | None = None,
                 since: float | None = None) -> list:
        """`jobs` rows in id (FIFO) order as light records (attributes as JobRow's): those
        with an id above `after`, in one of `states` (all if none) or with an id in `also`,
        named `name` if given, unfinished or finished at `since` or later if given, at most
        `limit`. Plain SQL on the writer's connection (the loop thread's): 10,000 rows in
        tens of milliseconds, where ORM objects take ten times that."""
        where, args = ["id > ?"], [after]
        if name is not None:
            where.append("name = ?")
            args.append(name)
        if since is not None:  # through ix_jobs_state and ix_jobs_finished_at, as a subquery:
            # with an OR, SQLite scanned every job in id order (20,000 jobs: 1.7 -> 0.01 ms)
            live = [s.value for s in JobState if not s.finished]
            where.append(f"id IN (SELECT id FROM jobs WHERE state IN ({', '.join('?' * len(live))})"
                         " UNION ALL SELECT id FROM jobs WHERE finished_at >= ?)")
            args += [*live, since]
        if states:
            either = [f"state IN ({', '.join('?' * len(states))})"]
            args += list(states)
            if also:
                either.append(f"id IN ({', '.join('?' * len(also))})")
                args += list(also)
            where.append(f"({' OR '.join(either)})")
        sql = f"SELECT {', '.join(JOB_RECORD_COLUMNS)} FROM jobs WHERE {' AND '.join(where)} " \
              "ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_job_record(r) for r in self.writer().execute(sql, args)]

    # What a broker asks of the jobs it no longer holds (it keeps the unfinished ones only):
    # plain SQL on the writer's connection, which sees its own writes not yet committed.

    def job_state(self, job_id: int) -> str | None:
        """The state recorded of job `job_id`; None if there is no such job."""
        row = self.writer().execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row[0] if row else None

    def job_named(self, name: str) -> int | None:
        """The id of the latest job named `name` (ix_jobs_name); None if none is."""
        return self.writer().execute("SELECT max(id) FROM jobs WHERE name = ?",
                                     (name,)).fetchone()[0]

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each recorded state (ix_jobs_state: no row is read)."""
        return dict(self.writer().execute("SELECT state, count(*) FROM jobs GROUP BY state"))

    def cancels_requested(self) -> set[int]:
        """The jobs a user asked to cancel (`cancel-requested` events, ix_events_kind): ended
        ones among them too, which the caller ignores."""
        return {r[0] for r in self.writer().execute(
            "SELECT job_id FROM events WHERE kind = 'cancel-requested'")}

    def job_ids(self, states: Collection[str], after: int) -> list[int]:
        """The ids above `after` of the jobs in one of `states`, ascending."""
        return [r[0] for r in self.writer().execute(
            f"SELECT id FROM jobs WHERE state IN ({', '.join('?' * len(states))}) AND id > ? "
            "ORDER BY id", (*states, after))]

    def last_runs(self, job_ids: Collection[int]) -> dict[int, tuple[str, str | None]]:
        """(role, end reason) of the last run of each of `job_ids` that has one."""
        out = {}
        for part in _pages(job_ids):
            out.update((r[0], (r[1], r[2])) for r in self.writer().execute(
                "SELECT job_id, role, end_reason FROM runs WHERE id IN (SELECT max(id) FROM "
                f"runs WHERE job_id IN ({', '.join('?' * len(part))}) GROUP BY job_id)", part))
        return out

    def runs(self, job_id: int | None = None) -> list[RunRecord]:
        return self._read(RunRecord._make, RUN_COLUMNS, "runs", "started_at, id", "job_id",
                          None if job_id is None else (job_id,))

    def runs_since(self, since: float) -> list[RunRecord]:
        """The runs open, or ended at `since` or later, in start order (ix_runs_open and
        ix_runs_ended_at: no scan of every run ever)."""
        # a subquery of the two: with an OR, SQLite scanned every run
        return [RunRecord._make(r) for r in self.writer().execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE id IN (SELECT id FROM runs "
            "WHERE ended_at IS NULL UNION ALL SELECT id FROM runs WHERE ended_at >= ?) "
            "ORDER BY started_at, id", (since,))]

    def open_runs(self) -> list[RunRecord]:
        """The runs not recorded as ended (ix_runs_open: no scan of every run ever)."""
        return [RunRecord._make(r) for r in self.writer().execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE ended_at IS NULL "
            "ORDER BY started_at, id")]

    def events(self, job_id: int | None = None) -> list[EventRecord]:
        return self._read(_event_record, EVENT_COLUMNS, "events", "id", "job_id",
                          None if job_id is None else (job_id,))

    def gpu_samples(self, job_id: int | None = None) -> list[GpuSampleRecord]:
        return self._read(GpuSampleRecord._make, GPU_SAMPLE_COLUMNS, "gpu_samples", "id",
                          "job_id", None if job_id is None else (job_id,))

    def samples(self) -> list[SampleRecord]:
        """Every measurement of a model, oldest first."""
        return self._read(SampleRecord._make, SAMPLE_COLUMNS, "samples", "id")

    def _read(self, make: Callable[[tuple], tuple], columns: tuple[str, ...], table: str,
              order: str, key: str | None = None,
              values: Collection[int] | None = None) -> list:
        """Every row of `table` made a record by `make`, in `order`, or those whose `key` is
        one of `values`."""
        sql = f"SELECT {', '.join(columns)} FROM {table}"
        if values is None:
            return [make(r) for r in self.writer().execute(f"{sql} ORDER BY {order}")]
        rows = []
        for part in _pages(values):
            rows += self.writer().execute(
                f"{sql} WHERE {key} IN ({', '.join('?' * len(part))}) ORDER BY {order}", part)
        if len(rows) > 1 and len(values) > PAGE:  # the pages' rows in one order
            at = [columns.index(c.strip()) for c in order.split(",")]
            rows.sort(key=lambda r: [r[i] for i in at])
        return [make(r) for r in rows]

    def requested(self, key: str) -> list | None:
        """The submission made with idempotency key `key`: [digest, first job id, job count,
        the answer given if this store's broker gave it], or None. The first call reads the
        keys stored by earlier brokers (only a broker asks: offline readers never do)."""
        if self.requests is None:
            # in a transaction of its own, on a connection of its own (in memory, the one):
            # the writer's may hold the loop's
            own = self.path is not None
            con = sqlite3.connect(self.path, timeout=5.0) if own else self._con
            try:
                with con:
                    # A key is stored before its jobs commit: one whose jobs never did (a
                    # crash, a failed commit) is forgotten, so that its retry submits them
                    con.execute("DELETE FROM requests WHERE first_job + jobs - 1 > "
                                "(SELECT coalesce(max(id), 0) FROM jobs)")
                    self.requests = {k: [digest, first, jobs, None] for k, digest, first, jobs
                                     in con.execute("SELECT key, digest, first_job, jobs "
                                                    "FROM requests")}
            finally:
                if own:
                    con.close()
        return self.requests.get(key)

    def request_made(self, key: str, digest: str, first_job: int, jobs: int,
                     at: float) -> Callable[[sqlite3.Connection], None]:
        """Remember that `key` submitted jobs first_job...; the write that stores it, to go
        into the jobs' own transaction (the ledger's `also`): the key and its jobs commit,
        or are refused, together."""
        if self.requests is None:
            self.requested(key)
        self.requests[key] = [digest, first_job, jobs, None]

        def write(con: sqlite3.Connection) -> None:
            con.execute("INSERT OR REPLACE INTO requests (key, digest, first_job, jobs, at) "
                        "VALUES (?, ?, ?, ?, ?)", (key, digest, first_job, jobs, at))

        return write

    def request_answered(self, key: str, answer: tuple) -> None:
        """The answer to the request made with `key`: (rows, a future done once they are
        committed). Kept for its retries until then; after, they read the rows stored. If
        the commit fails, the key is forgotten (its retry submits the jobs again)."""
        self.requests[key][3] = answer

        def done(future) -> None:
            if future.cancelled() or future.exception() is not None:
                self.requests.pop(key, None)
            elif key in self.requests:
                self.requests[key][3] = None

        answer[1].add_done_callback(done)

    def next_job_id(self) -> int:
        return (self.writer().execute("SELECT max(id) FROM jobs").fetchone()[0] or 0) + 1

    def close(self) -> None:
        self._con.close()
        if self._engine is not None:
            self._engine.dispose()


def job_spec(row, environments: Mapping[str, Environment] | None = None) -> JobSpec:
    """The submission a `jobs` row records (any object with the columns as attributes), in
    its environment from `environments` (Store.environments)."""
    env = getattr(row, "env", None)
    return JobSpec(command=tuple(row.command or ()), emulate=bool(row.emulate), model=row.model,
                   steps=row.steps, gpus=row.gpus_request, after=tuple(row.after or ()),
                   name=row.name, nodes=row.nodes, retries=row.retries, chdir=row.chdir,
                   per_gpu=bool(row.per_gpu), nodes_min=row.nodes_min,
                   environment=(environments or {}).get(env, Environment()) if env
                   else Environment())


def recorded_job(row) -> Job:
    """The job a `jobs` row records, queued (the caller puts it in its state): what a broker's
    start rebuilds, and what the views show of an ended job the broker no longer holds."""
    return Job(row.id, row.demand, row.malleable, tuple(row.after), row.nodes,
               suspensions=row.suspensions, not_before=row.not_before, max_share=row.max_share,
               submitted=row.submitted_at, nodes_min=row.nodes_min)


def request_digest(specs: list[JobSpec]) -> str:
    """What identifies a submission's content, to tell a retry (same key, same jobs) from
    a different request that reuses a key."""
    text = json.dumps([{**s.to_mapping(environment=False), "env": s.environment.digest}
                       for s in specs], sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def placement_columns(parts) -> tuple[str, str]:
    """The runs.node and runs.gpu_ids values of a run on `parts`: (node, GPU slots) pairs."""
    return (",".join(node for node, _ in parts),
            ";".join(",".join(map(str, gpus)) for _, gpus in parts))


def migrate(path: Path) -> int | None:
    """Bring an existing database to SCHEMA_VERSION; the version it had (None if new)."""
    con = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN: DDL in the transaction
    try:
        con.execute("BEGIN IMMEDIATE")
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            con.execute("ROLLBACK")
            return None
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        found = int(row[0]) if row else 1
        if found > SCHEMA_VERSION:
            con.execute("ROLLBACK")
            raise SchemaError(f"{path} has schema version {found}, newer than this marbled's "
                              f"({SCHEMA_VERSION}); use the newer marbled that wrote it")
        if found == SCHEMA_VERSION:  # nothing to write (a commit: an fsync at every start)
            con.execute("ROLLBACK")
            return found
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                con.execute(statement)
        con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),))
        con.execute("COMMIT")
        return found
    finally:
        con.close()
