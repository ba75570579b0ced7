"""`marble report` on the state file of a real broker: paper job set 3 (Figure 5) on 6
emulated GPUs, then every report run as `marble` runs it (a subprocess), its figures
checked against the runs and events the broker wrote."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from marbled.paths import DB_NAME
from marbled.report.figures import between, gpu_seconds, in_use, timeline_bars
from marbled.report.queries import load_queries
from marbled.resources import load_profile
from marbled.store.schema import SCHEMA_VERSION
from tests.conftest import start_daemon
from tests.scenarios import as_schema_version_1, jobset, training

pytestmark = pytest.mark.daemon

NAMES = ("summary", "timeline", "gpu_hours", "suspensions", "throughput", "allocations")
HOUR = 3600.0
EPS_H = 2e-6  # the SQL rounds GPU-hours to 6 decimals


def marble(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARBLE_")}
    done = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "report", *args],
                          capture_output=True, text=True, timeout=60, env=env)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def report(db: Path, name: str, *args: str) -> dict:
    return json.loads(marble(name, "--db", str(db), "--json", *args).stdout)


def rows(db: Path, sql: str, *params) -> list[sqlite3.Row]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A state file from a real broker (as the `daemon` fixture starts it, once for the
    module): job set 3 to its end, then SIGTERM (a drain)."""
    daemon = start_daemon(tmp_path_factory.mktemp("report") / "state")
    try:
        daemon.submit(*jobset(3))
        assert [j["state"] for j in daemon.wait_all(timeout=120)] == ["done"] * 3
    finally:
        assert daemon.stop() == 0
    return daemon.state_dir / DB_NAME


@pytest.fixture(scope="module")
def reports(db) -> dict[str, dict]:
    """Every report of the file, as `marble report NAME --json` printed it."""
    return {name: report(db, name) for name in load_queries()}


def _runs(db: Path) -> list[sqlite3.Row]:
    return rows(db, "SELECT * FROM runs ORDER BY started_at, id")


def _asked(db: Path, run_id: int) -> float | None:
    asked = rows(db, "SELECT at FROM events WHERE kind = 'suspend-requested' AND run_id = ?",
                 run_id)
    return asked[-1]["at"] if asked else None


def _ready(db: Path, run) -> float:
    """When a run's start-up ended: its first step; if it never got to one, its own
    suspension request (or its end)."""
    (event,) = rows(db, "SELECT data FROM events WHERE run_id = ? AND kind IN "
                        "('done', 'suspended')", run["id"])
    first = json.loads(event["data"])["phases"].get("first_step")
    return min(first or _asked(db, run["id"]) or run["ended_at"], run["ended_at"])


def _lost_gpu_s(db: Path) -> float:
    """From the events: each suspended run's GPUs from the request to its exit, and the
    resumed run's from its start to the end of its start-up."""
    runs = _runs(db)
    lost = 0.0
    for r in runs:
        if r["end_reason"] != "suspended":
            continue
        lost += r["gpu_count"] * (r["ended_at"] - _asked(db, r["id"]))
        nxt = next(n for n in runs if n["job_id"] == r["job_id"] and n["started_at"]
                   > r["started_at"])
        lost += nxt["gpu_count"] * (_ready(db, nxt) - nxt["started_at"])
    return lost


def test_gpu_hours_used_is_the_runs_gpus_times_their_time_and_idle_the_rest(db, reports):
    doc = reports["gpu_hours"]
    (one, total) = doc["rows"]
    assert (one["allocation"], total["allocation"]) == (1, "all")
    runs = _runs(db)
    used_s = sum(r["gpu_count"] / r["share"] * (r["ended_at"] - r["started_at"]) for r in runs)
    assert total["used_gpu_h"] == pytest.approx(used_s / HOUR, abs=EPS_H)
    # capacity: the 6 GPUs from the first event (the submission) to the last (the drain)
    (span,) = rows(db, "SELECT min(at) AS first, max(at) AS last FROM events")
    assert total["gpus"] == 6
    assert total["capacity_gpu_h"] == pytest.approx(6 * (span["last"] - span["first"]) / HOUR,
                                                    abs=EPS_H)
    assert total["idle_gpu_h"] == pytest.approx(total["capacity_gpu_h"] - total["used_gpu_h"],
                                                abs=EPS_H)
    assert total["lost_gpu_h"] == pytest.approx(_lost_gpu_s(db) / HOUR, abs=EPS_H)
    assert total["lost_gpu_h"] > 0  # two suspensions and two resumptions cost something
    assert total["training_gpu_h"] + total["lost_gpu_h"] + total["idle_gpu_h"] == \
        pytest.approx(total["capacity_gpu_h"], abs=3 * EPS_H)
    assert total["utilization"] == pytest.approx(used_s / HOUR / total["capacity_gpu_h"],
                                                 abs=1e-3)
    # Figure 5 keeps the GPUs busy: the gaps are the launches and the broker's reaction times
    assert 0.8 < total["utilization"] < 1
    assert {k: v for k, v in one.items() if k != "allocation"} == \
        {k: v for k, v in total.items() if k != "allocation"}  # one allocation: the same
    # the GPUs the PNG's utilization panel draws add up to the same GPU-hours
    timeline = reports["timeline"]["rows"]
    assert gpu_seconds(in_use(timeline_bars(timeline))) / HOUR == \
        pytest.approx(total["used_gpu_h"], abs=1e-5)


def test_suspensions_are_the_runs_that_ended_suspended_with_their_resumption(db, reports):
    doc = reports["suspensions"]
    runs = _runs(db)
    suspended = sorted((r for r in runs if r["end_reason"] == "suspended"),
                       key=lambda r: (r["ended_at"], r["id"]))  # the report's order
    (jobs_suspensions,) = rows(db, "SELECT sum(suspensions) AS n FROM jobs")
    assert len(doc["rows"]) == len(suspended) == jobs_suspensions["n"] >= 1
    assert [s["run_id"] for s in doc["rows"]] == [r["id"] for r in suspended]
    assert [s["job_id"] for s in doc["rows"]] == [2, 3]  # Inception-v3, then VGG-16
    for s, r in zip(doc["rows"], suspended, strict=True):
        nxt = next(n for n in runs if n["job_id"] == r["job_id"] and n["id"] != r["id"]
                   and n["started_at"] > r["started_at"])
        assert (s["role"], s["gpus"], s["reason"], s["forced"]) == (
            "secondary", r["gpu_count"], "promote", 0)
        assert (s["resumed_run"], s["resumed_gpus"]) == (nxt["id"], nxt["gpu_count"])
        assert s["resumed_gpus"] > s["gpus"]  # promoted to more GPUs
        assert s["step"] == r["end_step"] == nxt["start_step"] > 0
        assert s["steps_redone"] == 0
        (ack,) = rows(db, "SELECT data FROM events WHERE kind = 'acknowledged' AND run_id = ?",
                      r["id"])
        assert s["ack_latency_s"] == pytest.approx(json.loads(ack["data"])["latency"], abs=1e-3)
        assert s["off_gpus_s"] == pytest.approx(nxt["started_at"] - r["ended_at"], abs=1e-3)
    total = reports["gpu_hours"]["rows"][-1]
    assert sum(s["cost_gpu_s"] for s in doc["rows"]) / HOUR == \
        pytest.approx(total["lost_gpu_h"], abs=EPS_H)


def test_timeline_has_every_phase_of_every_job_end_to_end(db, reports):
    doc = reports["timeline"]
    (t0,) = rows(db, "SELECT min(at) AS t0 FROM events")
    runs = _runs(db)
    by_job: dict[int, list[dict]] = {}
    for row in doc["rows"]:
        by_job.setdefault(row["job_id"], []).append(row)
    assert sorted(by_job) == [1, 2, 3]
    for job_id, phases in by_job.items():
        mine = [r for r in runs if r["job_id"] == job_id]
        expected = ["queued"]
        for i, r in enumerate(mine):
            expected += (["suspended"] if i else []) + [r["role"]]
        assert [p["phase"] for p in phases] == expected
        assert [p["run_id"] for p in phases if p["run_id"]] == [r["id"] for r in mine]
        for p, r in zip((p for p in phases if p["run_id"]), mine, strict=True):
            assert p["start_s"] == pytest.approx(r["started_at"] - t0["t0"], abs=1e-3)
            assert p["end_s"] == pytest.approx(r["ended_at"] - t0["t0"], abs=1e-3)
            assert (p["gpus"], p["gpu_ids"], p["start_step"], p["end_step"], p["outcome"]) \
                == (r["gpu_count"], r["gpu_ids"], r["start_step"], r["end_step"],
                    r["end_reason"])
        for before, after in pairwise(phases):  # no hole in a job's life
            assert after["start_s"] == pytest.approx(before["end_s"], abs=1e-3)
        assert phases[-1]["outcome"] == "done"
    # Figure 5: ResNet-50 primary on 3; the others secondaries, then primaries
    assert [p["phase"] for p in by_job[1]] == ["queued", "primary"]
    assert [p["phase"] for p in by_job[2]][1:] == ["secondary", "suspended", "primary"]


def test_throughput_is_what_the_runs_measured_against_the_profile(db, reports):
    doc = reports["throughput"]
    book = load_profile("summit-v100")
    samples = rows(db, "SELECT model, gpus, avg(value) AS mean, count(*) AS n FROM samples "
                       "WHERE kind = 'throughput' GROUP BY model, gpus")
    measured = {(r["model"], r["gpus"]): r for r in doc["rows"] if r["kind"] == "throughput"}
    assert set(measured) == {(s["model"], s["gpus"]) for s in samples}
    assert {m for m, _ in measured} == {"resnet-50", "inception-v3", "vgg-16"}
    for s in samples:
        row = measured[(s["model"], s["gpus"])]
        assert (row["samples"], row["measured"]) == (s["n"], pytest.approx(s["mean"], abs=1e-4))
        assert row["profile"] == book.lookup(s["model"]).throughput(s["gpus"])
        # the emulated job trains at its profile's speed: what the runs measured agrees
        assert row["ratio"] == pytest.approx(row["measured"] / row["profile"], abs=1e-3)
        # A window of a loaded machine can be slow (an emulated step is a few ms of sleep
        # and work: a CI run measured 0.755 for a row of one sample); a wrong time scale
        # or unit would be 100x off.
        assert 0.5 < row["ratio"] < 1.5, row
    # Taken together, the runs train at the profile's speed.
    ratios = sorted(r["ratio"] for r in measured.values())
    assert 0.85 < ratios[len(ratios) // 2] < 1.15, ratios
    assert "summit-v100" in doc["profile"]


def test_allocations_and_summary(db, reports):
    (alloc,) = reports["allocations"]["rows"]
    runs = _runs(db)
    assert (alloc["allocation"], alloc["gpus"], alloc["ended_by"]) == (1, 6, "received SIGTERM")
    assert (alloc["submitted"], alloc["runs"], alloc["done"], alloc["suspended"],
            alloc["failed"]) == (3, len(runs), 3, len(runs) - 3, 0)
    total = reports["gpu_hours"]["rows"][-1]
    assert alloc["used_gpu_h"] == total["used_gpu_h"]
    assert alloc["utilization"] == total["utilization"]

    doc = json.loads(marble("--db", str(db), "--json").stdout)
    s = doc["summary"]
    assert (s["schema_version"], s["policy"], s["profile"], s["gpus"], s["nodes"]) == (
        str(SCHEMA_VERSION), "marble", "summit-v100", 6, 1)
    assert (s["jobs"], s["done"], s["unfinished"], s["runs"], s["suspensions"], s["drains"]) \
        == (3, 3, 0, len(runs), len(runs) - 3, 1)
    assert doc["gpu_hours"] == total
    assert set(NAMES) <= set(doc["reports"]) == set(load_queries())
    text = marble("--db", str(db)).stdout
    assert "jobs 3: 3 done" in text and f"utilization {total['utilization']:.1%}" in text
    for name in NAMES[1:]:
        assert f"  {name} " in text  # the list of reports


def test_every_report_as_text_and_csv_matches_its_json(db, reports):
    for name, doc in reports.items():
        table = marble(name, "--db", str(db)).stdout.splitlines()
        assert table[0].startswith(f"{name}: ")
        got = list(csv.reader(io.StringIO(marble(name, "--db", str(db), "--csv").stdout)))
        assert got[0] == doc["columns"], name
        assert len(got) - 1 == len(doc["rows"]), name
        for line, row in zip(got[1:], doc["rows"], strict=True):
            assert line == ["" if row[c] is None else str(row[c]) for c in doc["columns"]]
        if doc["rows"]:
            assert table[-1].split()[0] == str(doc["rows"][-1][doc["columns"][0]] or "-")


def test_png_is_a_gantt_of_every_job_and_the_gpus_in_use(db, tmp_path):
    import matplotlib.image

    from marbled.sim.report import job_color

    png = tmp_path / "gpus.png"
    doc = json.loads(marble("timeline", "--db", str(db), "--json", "--png", str(png)).stdout)
    assert doc["png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)
    height, width = image.shape[:2]
    assert width >= 1000 and height >= 400
    pixels = image[..., :3].reshape(-1, 3)
    for job in (1, 2, 3):  # each job's bars are there, in its colour
        near = (abs(pixels - job_color(job)) < 0.02).all(axis=1).sum()
        assert near > 2000, (job, near)
    # a CSV on stdout stays a CSV: the note goes to stderr
    done = marble("--db", str(db), "--csv", "--png", str(tmp_path / "b.png"))
    assert "GPU timeline" in done.stderr and "GPU timeline" not in done.stdout


def test_reports_write_nothing_to_or_beside_the_state_file(db, tmp_path):
    def snapshot() -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in db.parent.iterdir() if p.is_file()}

    before = snapshot()
    assert not db.with_name(DB_NAME + "-wal").exists()  # the broker stopped cleanly
    marble("throughput", "--db", str(db))
    marble("--state-dir", str(db.parent), "--png", str(tmp_path / "x.png"))
    assert snapshot() == before  # no -wal, no -shm, the same bytes


def test_errors_say_what_is_wrong(db, reports, tmp_path):
    def error(*args: str) -> str:
        done = marble(*args, check=False)
        assert done.returncode != 0 and done.stdout == ""
        return done.stderr

    assert "no such file" in error("--db", str(tmp_path / "nope.db"))
    assert "no such file" in error("--state-dir", str(tmp_path))
    assert "is a directory" in error("--db", str(tmp_path))
    (tmp_path / "text.db").write_text("not a database at all\n" * 100)
    assert "not an SQLite database" in error("--db", str(tmp_path / "text.db"))
    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (x)").connection.close()
    assert "not a marbled state database (no table jobs, runs, events, meta)" in \
        error("--db", str(tmp_path / "other.db"))

    newer = tmp_path / "newer.db"
    shutil.copy(db, newer)
    con = sqlite3.connect(newer)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    assert f"schema version 99, newer than this marbled's ({SCHEMA_VERSION})" in \
        error("--db", str(newer))

    older = tmp_path / "older.db"  # what marbled wrote with schema version 1
    shutil.copy(db, older)
    as_schema_version_1(older)
    con = sqlite3.connect(older)
    con.execute("DELETE FROM meta WHERE key = 'schema_version'")  # version 1 wrote none
    con.commit()
    con.close()
    message = error("gpu_hours", "--db", str(older))
    assert f"schema version 1, older than the version {SCHEMA_VERSION}" in message
    # ... and what it says to do works
    subprocess.run([sys.executable, "-c", "from marbled.store.db import migrate; "
                    f"migrate({str(older)!r})"], check=True)
    assert report(older, "gpu_hours")["rows"] == reports["gpu_hours"]["rows"]

    message = error("bogus", "--db", str(db))
    assert "no report named 'bogus'" in message
    for name in NAMES:
        assert name in message
    assert "either --db FILE or --state-dir" in error("--db", str(db), "--state-dir", "x")
    assert "either --json or --csv" in error("--db", str(db), "--json", "--csv")
    assert "either a report NAME (gpu_hours) or --slurm" in \
        error("gpu_hours", "--slurm", "--db", str(db))


def test_slurm_on_a_local_brokers_file_says_there_is_nothing_to_join(db):
    """No run was a Slurm job step: nothing to ask Slurm (tests/slurm: the real join)."""
    doc = report(db, "--slurm")
    assert doc["rows"] == [] and doc["accounting"]["enabled"] is False
    assert doc["accounting"]["note"] == ("no run in this file ran as a Slurm job step "
                                         "(marbled --launcher slurm): nothing to join")
    assert doc["accounting"]["note"] in marble("--slurm", "--db", str(db)).stdout


def test_two_allocations_are_told_apart_by_the_drain(daemon_factory, tmp_path):
    """The allocation ends mid-way (SIGTERM: every job suspended to its checkpoint, exit
    75) and a new broker carries on in the same state directory, as jobscripts/
    marble-chain.sbatch does: two allocations, the time between them no GPU's."""
    state = tmp_path / "chained"
    first = daemon_factory(state_dir=state)
    first.submit(*jobset(3))
    first.wait_for(lambda: training(first.client), what="two jobs training")
    assert first.stop() == 75
    second = daemon_factory(state_dir=state)
    assert [j["state"] for j in second.wait_all(timeout=120)] == ["done"] * 3
    assert second.stop() == 0
    db = state / DB_NAME

    allocations = report(db, "allocations")["rows"]
    drains = rows(db, "SELECT at FROM events WHERE kind = 'drain' ORDER BY id")
    runs = _runs(db)
    assert [a["allocation"] for a in allocations] == [1, 2]
    assert [a["ended_by"] for a in allocations] == ["received SIGTERM"] * 2
    before = [r for r in runs if r["started_at"] < drains[0]["at"]]
    assert [a["runs"] for a in allocations] == [len(before), len(runs) - len(before)]
    assert allocations[0]["suspended"] == len(before) >= 2  # the drain suspended them all
    assert allocations[0]["submitted"] == 3 and allocations[1]["submitted"] == 0
    assert allocations[0]["end_s"] < allocations[1]["start_s"]  # a broker-less gap

    hours = report(db, "gpu_hours")["rows"]
    assert [h["allocation"] for h in hours] == [1, 2, "all"]
    total = hours[-1]
    spans = sum(a["seconds"] for a in allocations)
    assert total["capacity_gpu_h"] == pytest.approx(6 * spans / HOUR, abs=EPS_H)
    (file_span,) = rows(db, "SELECT max(at) - min(at) AS s FROM events")
    assert total["capacity_gpu_h"] < 6 * file_span["s"] / HOUR  # the gap is no capacity
    used_s = sum(r["gpu_count"] * (r["ended_at"] - r["started_at"]) for r in runs)
    assert total["used_gpu_h"] == pytest.approx(used_s / HOUR, abs=EPS_H)
    assert sum(h["used_gpu_h"] for h in hours[:2]) == pytest.approx(total["used_gpu_h"],
                                                                   abs=EPS_H)
    assert total["lost_gpu_h"] == pytest.approx(_lost_gpu_s(db) / HOUR, abs=EPS_H)
    assert total["idle_gpu_h"] == pytest.approx(total["capacity_gpu_h"] - total["used_gpu_h"],
                                                abs=EPS_H)
    suspensions = report(db, "suspensions")["rows"]
    assert [s["run_id"] for s in suspensions] == [r["id"] for r in sorted(
        (r for r in runs if r["end_reason"] == "suspended"),
        key=lambda r: (r["ended_at"], r["id"]))]  # in the order they ended
    assert {s["reason"] for s in suspensions if s["run_id"] in {r["id"] for r in before}} \
        == {"received SIGTERM"}
    assert between(allocations) == [(allocations[0]["end_s"], allocations[1]["start_s"])]
    png = tmp_path / "chained.png"
    marble("--db", str(db), "--png", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_teaches(db):
    text = marble("--help").stdout
    assert "Examples:" in text and "marble report gpu_hours" in text
    for name in NAMES:
        assert f"  {name} " in text  # the list of reports, with what each says


def test_a_live_brokers_file_is_read_while_it_runs(daemon):
    """While jobs run: the report reads the broker's file (WAL, being written), open runs
    count up to now, and the broker carries on undisturbed."""
    daemon.submit(*jobset(3))
    daemon.wait_for(lambda: training(daemon.client), what="two jobs training")
    total = report(daemon.state_dir / DB_NAME, "gpu_hours")["rows"][-1]
    assert total["used_gpu_h"] > 0
    timeline = report(daemon.state_dir / DB_NAME, "timeline")["rows"]
    assert any(r["outcome"] == "running" and r["end_s"] is None for r in timeline)
    assert [j["state"] for j in daemon.wait_all(timeout=120)] == ["done"] * 3
    assert daemon.stop() == 0
