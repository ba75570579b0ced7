"""Plain commands across a broker's crash: a command completes at most once (lifecycle I2).

Real brokers on a real socket, killed with SIGKILL; the jobs are plain commands that
speak no worker protocol (no progress, no acknowledgement), each appending a line to
its own file when it completes. The exit status a run's supervisor records
(marbled.batch.supervise) tells the next broker how a run it did not see end did end:
done or failed with its true code, never started again. Only a run with no record
and no process left is run again, and its record says so.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from benchmarks.fault_injection import plain_chaos
from marbled.core.outcome import RECOVERED, UNKNOWN
from tests.conftest import Daemon

pytestmark = pytest.mark.daemon


def plain(name: str, marks: Path, body: str) -> dict:
    """A plain command that runs `body`, then marks its completion (exit 0 only)."""
    return {"name": name, "gpus": 1,
            "command": ["sh", "-c", f"{body} && echo done >> {marks}/{name}"]}


def completions(marks: Path, name: str) -> int:
    path = marks / name
    return len(path.read_text().split()) if path.exists() else 0


def running_pids(d: Daemon) -> dict[str, int]:
    """Each running job's name, to the pid its run was recorded with."""
    return {r["name"]: r["pid"] for r in d.query(
        "SELECT jobs.name, runs.pid FROM runs JOIN jobs ON jobs.id = runs.job_id "
        "WHERE runs.ended_at IS NULL AND runs.pid IS NOT NULL")}


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def job_rows(d: Daemon) -> dict[str, dict]:
    return {r["name"]: dict(r) for r in d.query("SELECT * FROM jobs")}


def runs_of(d: Daemon, name: str) -> list[dict]:
    return [dict(r) for r in d.query(
        "SELECT runs.* FROM runs JOIN jobs ON jobs.id = runs.job_id WHERE jobs.name = ? "
        "ORDER BY runs.id", name)]


def test_runs_that_end_or_live_through_a_crash_complete_once(daemon_factory, tmp_path):
    """Killed -9 while three plain commands run: one finishes, one fails while no broker
    watches, one still runs when the next broker adopts it. None runs again; each is
    recorded with its true exit code."""
    marks = tmp_path / "marks"
    marks.mkdir()
    d = daemon_factory()
    # `quick` and `fails` outlive the kill by a margin a loaded machine keeps (the kill
    # comes once the three pids are recorded, within DEFER of the starts)
    d.submit(plain("quick", marks, "sleep 2"),
             {"name": "fails", "gpus": 1, "command": ["sh", "-c", "sleep 2; exit 3"]},
             plain("slow", marks, "sleep 8"))
    wait_until(lambda: len(running_pids(d)) == 3, what="three runs with their pids")
    d.stop(signal.SIGKILL)
    assert not completions(marks, "quick"), "it ended before the kill: nothing was tested"
    wait_until(lambda: completions(marks, "quick"), what="the quick command's end")
    time.sleep(1.0)  # and the failing one's
    d = daemon_factory()
    jobs = {j["name"]: j for j in d.wait_all(timeout=60)}
    assert {n: j["state"] for n, j in jobs.items()} == {
        "quick": "done", "fails": "failed", "slow": "done"}
    assert completions(marks, "quick") == 1 and completions(marks, "slow") == 1
    for name in jobs:
        assert len(runs_of(d, name)) == 1, f"{name} was started again"
    rows = job_rows(d)
    assert rows["quick"]["reason"] == f"{RECOVERED}: done (exited with code 0)"
    assert rows["fails"]["reason"].startswith(f"{RECOVERED}: exited with code 3")
    assert [r["exit_code"] for r in runs_of(d, "fails")] == [3]
    assert [r["exit_code"] for r in runs_of(d, "quick")] == [0]
    # alive when adopted: watched to its end, and its exit read from its record
    adopted = {r["run_id"]: r["data"] for r in d.query(
        "SELECT run_id, data FROM events WHERE kind = 'adopted'")}
    slow = runs_of(d, "slow")[0]
    assert '"alive": true' in adopted[slow["id"]]
    assert slow["exit_code"] == 0 and rows["slow"]["reason"] == "done"


def test_a_command_that_completes_as_a_shutdown_stops_it_completes_once(daemon_factory,
                                                                         tmp_path):
    """A shutdown stops a plain command with SIGTERM; this one finishes what it does first
    (it ignores SIGTERM, as a command that must not be cut short may) and exits 0. Its exit
    is its completion, as it would be had it raced the signal: the next broker does not run
    it again (a hunt of kill -9s and shutdowns under the malleable policy found it run twice,
    its exit 0 taken for a stop without a checkpoint)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    d = daemon_factory()
    d.submit(plain("stubborn", marks, "trap '' TERM; sleep 1.5"))
    wait_until(lambda: running_pids(d).get("stubborn"), what="the run's pid")
    d.client.post("/v1/shutdown", {})
    assert d.proc.wait(timeout=30) == 0
    assert completions(marks, "stubborn") == 1, "it did not complete before the broker left"
    d = daemon_factory()
    (job,) = d.wait_all(timeout=30)
    assert (job["state"], job["reason"]) == ("done", "done as it was stopped (exit 0)")
    assert len(runs_of(d, "stubborn")) == 1 and completions(marks, "stubborn") == 1


def test_only_a_run_with_no_record_and_no_process_runs_again(daemon_factory, tmp_path):
    """The run's whole process group is killed while no broker watches, and the shared
    supervisor that started it (marbled.batch.spawner) too: nothing recorded how it
    ended, so the next broker runs it again, and the record says why."""
    marks = tmp_path / "marks"
    marks.mkdir()
    d = daemon_factory()
    d.submit(plain("lost", marks, "sleep 30"))
    pid = wait_until(lambda: running_pids(d).get("lost"), what="the run's pid")
    d.stop(signal.SIGKILL)
    os.kill(parent(pid), signal.SIGKILL)  # the supervisor, which would record the kill
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), what="the run's end")
    d = daemon_factory()
    first = wait_until(lambda: [r for r in runs_of(d, "lost") if r["ended_at"]],
                       what="the lost run's record")[0]
    assert first["exit_code"] is None
    reasons = [r["data"] for r in d.query(
        "SELECT data FROM events WHERE run_id = ? AND kind = 'suspended'", first["id"])]
    assert reasons and f"{RECOVERED}: {UNKNOWN}" in reasons[0]
    assert "resumes" not in reasons[0]
    wait_until(lambda: len(runs_of(d, "lost")) == 2, what="the run again")


def test_plain_commands_through_random_kills_complete_once(tmp_path):
    """The fault-injection benchmark's plain commands, shortened: 90 commands on 6 GPUs
    through 5 kills -9 of the broker; none begins or completes twice, every job ends done."""
    result = plain_chaos(tmp_path / "state", 90, kills=5, seed=3, gap=(0.2, 0.8))
    assert result.kills == 5, "the queue ended before 5 kills: nothing was tested"
    assert result.violations == []
    assert (result.completed_twice, result.started_twice, result.never_completed) == (0, 0, 0)
    assert result.adopted >= 5


@pytest.mark.parametrize("queued", [False, True])
def test_a_cancel_the_broker_died_before_carrying_out_is_carried_out_by_the_next(
        daemon_factory, tmp_path, queued):
    """Cancelled, then killed -9 before the job has stopped: a running command that takes
    2 s to end after SIGTERM (it dies of the signal, as a stop without a checkpoint), or a
    queued one that the broker had not yet marked (`queued`: the cancel's event alone is in
    the store, as when the broker dies between recording the cancel and acting on it). The
    next broker ends it cancelled; it is never started again (before, it read the SIGTERM
    death as a stop and ran the command again)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    d = daemon_factory()
    slow_stop = (f"echo start >> {marks}/slow; "
                 "trap 'sleep 2; trap - TERM; kill -TERM $$' TERM; sleep 600 & wait")
    jobs = d.submit({"name": "slow", "gpus": 6, "command": ["sh", "-c", slow_stop]},
                    plain("waits", marks, "true"))
    wait_until(lambda: running_pids(d).get("slow"), what="the run's pid")
    wait_until(lambda: completions(marks, "slow"), what="the command's start")
    if queued:  # the cancel recorded, the broker dead before it acted on it
        d.stop(signal.SIGKILL)
        with sqlite3.connect(d.state_dir / "marble.db") as con:
            con.execute("INSERT INTO events (at, kind, job_id) VALUES (?, ?, ?)",
                        (time.time(), "cancel-requested", jobs[1]["id"]))
    else:
        d.client.post(f"/v1/jobs/{jobs[0]['id']}/cancel", {})
        time.sleep(0.3)  # the SIGTERM is on its way; the command takes 2 s to end
        d.stop(signal.SIGKILL)
    d = daemon_factory()
    if queued:
        wait_until(lambda: {j["name"]: j["state"] for j in d.jobs()}["waits"] == "cancelled",
                   what="the queued job cancelled")
        assert not completions(marks, "waits")
        assert runs_of(d, "waits") == []
        d.client.post(f"/v1/jobs/{jobs[0]['id']}/cancel", {})
    final = {j["name"]: j["state"] for j in d.wait_all(timeout=60)}
    assert final == {"slow": "cancelled", "waits": "done" if not queued else "cancelled"}
    assert completions(marks, "slow") == 1, "the cancelled command was started again"
    assert len(runs_of(d, "slow")) == 1


@pytest.mark.parametrize("pid_recorded", [True, False])
def test_a_run_left_alive_on_a_node_the_next_broker_lacks_is_killed_not_run_beside(
        daemon_factory, tmp_path, pid_recorded):
    """A broker of two emulated nodes killed -9 while a plain command runs on node0; the next
    broker has one node (the host's), so node0 'left with its allocation', but the command
    still runs on this machine. Before, the job ran again beside it and the command completed
    twice; now the process is killed first, and the command completes once, in the rerun.
    Also where the broker died before it recorded the run's pid (the record's pid cleared,
    as that race leaves it): the process launched for the run is found, as for an adopted
    run; before, such a run was not searched for, and its command completed twice."""
    marks = tmp_path / "marks"
    marks.mkdir()
    state = tmp_path / "state"
    first = daemon_factory("--nodes", "2", gpus=4, state_dir=state)
    first.submit(plain("p", marks, "sleep 3"))
    first.wait_for(lambda: running_pids(first).get("p"), what="its pid recorded")
    (old,) = runs_of(first, "p")
    first.stop(signal.SIGKILL)
    if not pid_recorded:
        with sqlite3.connect(state / "marble.db") as con:
            con.execute("UPDATE runs SET pid = NULL, pid_start = NULL WHERE id = ?",
                        (old["id"],))
    second = daemon_factory(gpus=2, state_dir=state)
    assert [j["state"] for j in second.wait_all(timeout=30)] == ["done"]
    time.sleep(3.5)  # as long as the command of the first run would have taken
    assert completions(marks, "p") == 1
    ended, rerun = runs_of(second, "p")
    assert ended["node"] == old["node"] != rerun["node"]
    stops = second.query("SELECT data FROM events WHERE kind = 'stop' AND run_id = ?", old["id"])
    assert len(stops) == 1 and "is not in this allocation" in stops[0]["data"]
