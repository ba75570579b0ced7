"""SQLite state of one broker: jobs, runs (launch segments) and an append-only event journal.

One SQLite file in WAL mode under the state directory. Every state change is
written in one transaction together with its event row, so the journal and the
derived tables never disagree, and a `kill -9` between two changes loses
neither. `sql/schema.sql` mirrors these tables for staff.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import namedtuple
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    create_engine,
    event,
    func,
    select,
    text,
    union_all,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import StaticPool

from marbled.core.environment import Environment
from marbled.core.model import Job, JobState
from marbled.core.spec import JobSpec
from marbled.store.schema import SCHEMA_VERSION

# How to bring a database of version N-1 to N: run at start-up, in one transaction, so a
# newer marbled opens the state directory of an older one.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE runs ADD COLUMN devices VARCHAR",
        "ALTER TABLE jobs ADD COLUMN nodes INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN not_before FLOAT"),
    3: (),  # the gpu_samples table: a new table, made by create_all
    4: ("ALTER TABLE jobs ADD COLUMN max_share INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE runs ADD COLUMN share INTEGER NOT NULL DEFAULT 1"),
    5: (),  # the samples table (what runs measured of their models): made by create_all
    # the directory a job runs in; NULL for the jobs of older brokers, which ran in their
    # own directory under the state directory (and still do)
    6: ("ALTER TABLE jobs ADD COLUMN chdir VARCHAR",),
    # one process per GPU (ranks started by the launcher); the jobs of older brokers: one
    7: ("ALTER TABLE jobs ADD COLUMN per_gpu BOOLEAN NOT NULL DEFAULT 0",),
    # the fewest nodes of a node range (NULL: exactly `nodes`, as every job of older brokers)
    8: ("ALTER TABLE jobs ADD COLUMN nodes_min INTEGER",),
    # the environment a job runs in (a row of the environments table, made by create_all);
    # NULL: the broker's, as every job of older brokers
    9: ("ALTER TABLE jobs ADD COLUMN env VARCHAR(32)",),
}


# Indexes added to existing tables after their version (create_all makes them only with a new
# table): made at every start if missing.
INDEXES = ("CREATE INDEX IF NOT EXISTS ix_runs_open ON runs (job_id) WHERE ended_at IS NULL",
           # `after:` a name the broker no longer holds (an ended job) is read from the store
           "CREATE INDEX IF NOT EXISTS ix_jobs_name ON jobs (name)",
           # what ended since T (the dashboard's window: GET /v1/jobs?since, /v1/runs?since)
           "CREATE INDEX IF NOT EXISTS ix_jobs_finished_at ON jobs (finished_at)",
           "CREATE INDEX IF NOT EXISTS ix_runs_ended_at ON runs (ended_at) "
           "WHERE ended_at IS NOT NULL")


class SchemaError(RuntimeError):
    pass


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str | None] = mapped_column(String(128), index=True)
    model: Mapped[str | None] = mapped_column(String(128))
    steps: Mapped[int | None] = mapped_column(Integer)
    gpus_request: Mapped[int | None] = mapped_column(Integer)  # NULL = auto
    demand: Mapped[int] = mapped_column(Integer)  # optimal or requested GPU count (per node)
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    not_before: Mapped[float | None] = mapped_column(Float)  # retry back-off ends
    malleable: Mapped[bool] = mapped_column(Boolean)
    max_share: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    command: Mapped[list] = mapped_column(JSON)
    emulate: Mapped[bool] = mapped_column(Boolean, default=False)
    after: Mapped[list] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), index=True)
    step: Mapped[int] = mapped_column(Integer, default=0)  # last step known (checkpoint/progress)
    suspensions: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, index=True)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(String)
    chdir: Mapped[str | None] = mapped_column(String)  # where it runs; NULL: its job directory
    per_gpu: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    nodes_min: Mapped[int | None] = mapped_column(Integer)  # a node range's fewest; NULL: nodes
    env: Mapped[str | None] = mapped_column(String(32))  # environments.digest; NULL: the broker's


class RunRow(Base):
    __tablename__ = "runs"
    # the open runs (a broker's start adopts them) without a scan of every run ever
    # and those that ended since a time (partial: the open ones keep to ix_runs_open)
    __table_args__ = (Index("ix_runs_open", "job_id", sqlite_where=text("ended_at IS NULL")),
                      Index("ix_runs_ended_at", "ended_at",
                            sqlite_where=text("ended_at IS NOT NULL")))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    node: Mapped[str] = mapped_column(String(128))
    # A multi-node run lists its nodes "n1,n2" and their slots "0,1,2;3,4,5" in that order.
    gpu_ids: Mapped[str] = mapped_column(String)  # comma list of GPU slots, e.g. "0,1,2"
    devices: Mapped[str | None] = mapped_column(String)  # the GPUs the run saw, if reported
    gpu_count: Mapped[int] = mapped_column(Integer)  # on all its nodes
    share: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # n: 1/n of it
    role: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    start_step: Mapped[int | None] = mapped_column(Integer)
    end_step: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(String)  # done, suspended, failed, ...
    pid: Mapped[int | None] = mapped_column(Integer)
    pid_start: Mapped[int | None] = mapped_column(Integer)  # /proc start time, against pid reuse


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    run_id: Mapped[int | None] = mapped_column(Integer)
    data: Mapped[dict | None] = mapped_column(JSON)


class GpuSampleRow(Base):
    """NVML readings of the broker's GPUs every --sample-interval, with the job on each."""

    __tablename__ = "gpu_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    node: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(String(64))  # as in CUDA_VISIBLE_DEVICES
    job_id: Mapped[int | None] = mapped_column(Integer, index=True)  # NULL: idle
    util_gpu: Mapped[int] = mapped_column(Integer)  # percent
    util_mem: Mapped[int] = mapped_column(Integer)  # percent
    mem_used: Mapped[int] = mapped_column(Integer)  # bytes
    mem_total: Mapped[int] = mapped_column(Integer)


class SampleRow(Base):
    """What a run measured of its model: throughput at its GPU count, start-up, suspension.
    The broker learns its curves from these (marbled.core.learning)."""

    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    model: Mapped[str] = mapped_column(String(128), index=True)  # as the job named it
    kind: Mapped[str] = mapped_column(String(16))  # throughput | startup | suspend
    gpus: Mapped[int] = mapped_column(Integer)  # the run's GPU count (throughput)
    share: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    value: Mapped[float] = mapped_column(Float)  # steps/s or seconds (profiled)
    job_id: Mapped[int | None] = mapped_column(Integer)
    run_id: Mapped[int | None] = mapped_column(Integer)


class RequestRow(Base):
    """A submission sent with an idempotency key (POST /v1/jobs' Idempotency-Key): a retry
    with the key is answered with these jobs, not submitted again."""

    __tablename__ = "requests"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))  # request_digest() of what was submitted
    first_job: Mapped[int] = mapped_column(Integer)  # its jobs: first_job, first_job + 1, ...
    jobs: Mapped[int] = mapped_column(Integer)  # ... how many
    at: Mapped[float] = mapped_column(Float)


class EnvironmentRow(Base):
    """An environment jobs run in (core/environment.py), stored once for all the jobs that
    share it: a sweep of 50,000 jobs submitted from one shell has one."""

    __tablename__ = "environments"
    digest: Mapped[str] = mapped_column(String(32), primary_key=True)
    whole: Mapped[bool] = mapped_column(Boolean)  # ALL: `vars` are all of it; else added
    vars: Mapped[dict] = mapped_column(JSON)  # name -> value


class MetaRow(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String)


JOB_RECORD_COLUMNS = (
    "id", "name", "model", "steps", "gpus_request", "demand", "nodes", "retries", "failures",
    "not_before", "malleable", "max_share", "command", "emulate", "after", "state", "step",
    "suspensions", "submitted_at", "started_at", "finished_at", "exit_code", "reason", "chdir",
    "per_gpu", "nodes_min", "env")
JobRecord = namedtuple("JobRecord", JOB_RECORD_COLUMNS)  # one `jobs` row, read fast


class Store:
    """The broker's SQLite database. Writes happen only on the broker's event loop thread.

    `path` None: a database in memory (for tests of the broker in process)."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        if self.path is None:
            self.engine = create_engine("sqlite://", poolclass=StaticPool,
                                        json_serializer=json.dumps)
        else:
            self.engine = create_engine(f"sqlite:///{self.path}", json_serializer=json.dumps)
        event.listen(self.engine, "connect", _sqlite_pragmas)
        if self.path is not None:
            migrate(self.path)
        Base.metadata.create_all(self.engine)
        # Indexes added since their table (no new version: an older marbled reads and writes
        # the same rows, and an index it does not know of is kept up to date by SQLite)
        with self.engine.begin() as con:
            for statement in INDEXES:
                con.exec_driver_sql(statement)
        self._writer = None  # the pooled connection the broker's ledger writes through
        with self.tx() as s:
            if s.get(MetaRow, "schema_version") is None:
                s.add(MetaRow(key="schema_version", value=str(SCHEMA_VERSION)))
        # key -> [digest, first job id, job count, this broker's answer or None]; read at the
        # first keyed submission (`requested`)
        self.requests: dict[str, list] | None = None

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on error."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    def writer(self) -> sqlite3.Connection:
        """The DBAPI connection the broker's writes go through (`daemon/ledger.py`: plain
        SQL, no statement building): one, held for the store's life, from the engine's pool
        (so with its pragmas; in memory, the one connection). Only the loop thread uses it."""
        if self._writer is None:
            self._writer = self.engine.raw_connection()
        return self._writer.driver_connection

    def set_meta(self, **values: str) -> None:
        with self.tx() as s:
            for key, value in values.items():
                s.merge(MetaRow(key=key, value=str(value)))

    def meta(self) -> dict[str, str]:
        with self.tx() as s:
            return {m.key: m.value for m in s.scalars(select(MetaRow))}

    def environments(self) -> dict[str, Environment]:
        """Every stored environment, by digest (few: one per submitting shell)."""
        with self.tx() as s:
            return {r.digest: Environment(tuple(sorted(r.vars.items())), bool(r.whole))
                    for r in s.scalars(select(EnvironmentRow))}

    def jobs(self, ids: list[int] | None = None) -> list[JobRow]:
        with self.tx() as s:
            q = select(JobRow).order_by(JobRow.id)
            if ids is not None:
                q = q.where(JobRow.id.in_(ids))
            return list(s.scalars(q))

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
        loads = json.loads
        return [JobRecord(*r[:10], bool(r[10]), r[11],
                          loads(r[12]) if r[12] is not None else None, bool(r[13]),
                          loads(r[14]) if r[14] is not None else None, *r[15:])
                for r in self.writer().execute(sql, args)]

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
        ids, out = list(job_ids), {}
        for i in range(0, len(ids), 500):  # (a page of every job: within SQLite's variables)
            part = ids[i:i + 500]
            out.update((r[0], (r[1], r[2])) for r in self.writer().execute(
                "SELECT job_id, role, end_reason FROM runs WHERE id IN (SELECT max(id) FROM "
                f"runs WHERE job_id IN ({', '.join('?' * len(part))}) GROUP BY job_id)", part))
        return out

    def runs(self, job_id: int | None = None) -> list[RunRow]:
        return self._of_job(RunRow, job_id, RunRow.started_at, RunRow.id)

    def runs_since(self, since: float) -> list[RunRow]:
        """The runs open, or ended at `since` or later, in start order (ix_runs_open and
        ix_runs_ended_at: no scan of every run ever)."""
        # a subquery of the two: with an OR, SQLite scanned every run
        ids = union_all(select(RunRow.id).where(RunRow.ended_at.is_(None)),
                        select(RunRow.id).where(RunRow.ended_at >= since))
        with self.tx() as s:
            return list(s.scalars(select(RunRow).where(RunRow.id.in_(ids))
                                  .order_by(RunRow.started_at, RunRow.id)))

    def open_runs(self) -> list[RunRow]:
        """The runs not recorded as ended (ix_runs_open: no scan of every run ever)."""
        with self.tx() as s:
            return list(s.scalars(select(RunRow).where(RunRow.ended_at.is_(None))
                                  .order_by(RunRow.started_at, RunRow.id)))

    def events(self, job_id: int | None = None) -> list[EventRow]:
        return self._of_job(EventRow, job_id, EventRow.id)

    def gpu_samples(self, job_id: int | None = None) -> list[GpuSampleRow]:
        return self._of_job(GpuSampleRow, job_id, GpuSampleRow.id)

    def samples(self) -> list[SampleRow]:
        """Every measurement of a model, oldest first."""
        return self._of_job(SampleRow, None, SampleRow.id)

    def _of_job(self, row_type, job_id: int | None, *order) -> list:
        """Every row of `row_type` in `order`, or those of one job."""
        with self.tx() as s:
            q = select(row_type).order_by(*order)
            if job_id is not None:
                q = q.where(row_type.job_id == job_id)
            return list(s.scalars(q))

    def requested(self, key: str) -> list | None:
        """The submission made with idempotency key `key`: [digest, first job id, job count,
        the answer given if this store's broker gave it], or None. The first call reads the
        keys stored by earlier brokers (only a broker asks: offline readers never do)."""
        if self.requests is None:
            with self.tx() as s:
                # A key is stored before its jobs commit: one whose jobs never did (a crash,
                # a failed commit) is forgotten, so that its retry submits them
                s.execute(RequestRow.__table__.delete().where(
                    RequestRow.first_job + RequestRow.jobs - 1
                    > select(func.coalesce(func.max(JobRow.id), 0)).scalar_subquery()))
                self.requests = {r.key: [r.digest, r.first_job, r.jobs, None]
                                 for r in s.scalars(select(RequestRow))}
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
        with self.tx() as s:
            return (s.scalar(select(func.max(JobRow.id))) or 0) + 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.engine.dispose()


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
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                con.execute(statement)
        con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),))
        con.execute("COMMIT")
        return found
    finally:
        con.close()


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode survives a crash of the process (kill -9) with every
    # committed transaction; only an OS crash may lose the last few.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.close()
