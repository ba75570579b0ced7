"""The state database's tables as SQLAlchemy 2 models (`Store.tx()` gives a session), for
staff who read a state file with SQLAlchemy and for the tests.

The broker itself reads and writes with plain SQL (`db.py`) and never imports this: SQLAlchemy's
imports were 40 % of a broker's start. The tables are made by `marbled/sql/schema.sql`;
tests/core/test_sql_files.py checks that these models describe them, column by column and
index by index."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import (
    JSON,
    Boolean,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    create_engine,
    event,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.pool import StaticPool


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


def engine_for(path: Path | None, con) -> Engine:
    """An engine on the database at `path`, its connections with the writer's pragmas; for
    `path` None (a database in memory, or a connection opened read-only), on `con` itself."""
    if path is None:
        return create_engine("sqlite://", creator=lambda: con, poolclass=StaticPool,
                             json_serializer=json.dumps)
    from marbled.store.db import pragmas

    engine = create_engine(f"sqlite:///{path}", json_serializer=json.dumps)
    event.listen(engine, "connect", lambda dbapi_con, _record: pragmas(dbapi_con))
    return engine
