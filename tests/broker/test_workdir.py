"""Where a run's process starts: the job's directory (`chdir`), while its own files (logs,
checkpoints, protocol files) stay in its directory under the state directory."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from marbled.core.errors import Invalid, NotFound
from marbled.store.db import Store
from tests.broker.fakes import pump, running_broker

JOB = {"command": ["python", "train.py"], "model": "resnet-50", "steps": 1000}


def test_a_run_starts_in_its_jobs_directory_and_keeps_its_files_in_the_state_dir(tmp_path):
    project = tmp_path / "project"
    project.mkdir()

    async def scenario():
        async with running_broker(tmp_path / "state", workdir=tmp_path) as h:
            named = h.submit(**JOB, chdir=str(project))
            unnamed = h.submit(command=["sleep", "1"], gpus=1)
            await pump()
            by_job = {int(r.request.env["MARBLE_JOB_ID"]): r.request for r in h.launcher.runs}
            run_dir = h.broker.files.dir(named)
            assert by_job[named].workdir == project
            assert by_job[named].run_dir == run_dir
            assert by_job[named].env["MARBLE_CHECKPOINT_DIR"] == str(run_dir / "checkpoint")
            assert by_job[named].stdout.parent == run_dir
            # an API client that names no directory: the broker's own, recorded
            assert by_job[unnamed].workdir == tmp_path
            assert [j.chdir for j in h.store.jobs()] == [str(project), str(tmp_path)]

    asyncio.run(scenario())


@pytest.mark.parametrize("chdir, kind, says", [
    ("relative/dir", Invalid, "is not an absolute path"),  # 400
    ("/no/such/dir", NotFound, "'/no/such/dir' does not exist"),  # 404: not there
    (__file__, NotFound, "is not a directory")])
def test_a_directory_the_job_cannot_run_in_is_refused_at_submit(tmp_path, chdir, kind, says):
    async def scenario():
        async with running_broker(tmp_path / "state") as h:
            with pytest.raises(kind, match=says) as info:
                h.submit(**JOB, chdir=chdir)
            assert info.value.field == "chdir"
            assert h.store.jobs() == []

    asyncio.run(scenario())


def test_a_job_of_an_older_broker_still_runs_in_its_own_directory(tmp_path):
    """A v5 job has no recorded directory (NULL): it resumes where it ran before."""
    db = tmp_path / "marble.db"

    async def first():
        async with running_broker(tmp_path / "state", store=Store(db)) as h:
            job = h.submit(**JOB, chdir=str(tmp_path))
            await pump()
            return job

    job = asyncio.run(first())
    con = sqlite3.connect(db)
    con.execute("UPDATE jobs SET chdir = NULL, state = 'suspended'")
    con.execute("UPDATE runs SET ended_at = 1, end_reason = 'suspended'")
    con.commit()
    con.close()

    async def second():
        async with running_broker(tmp_path / "state", store=Store(db)) as h:
            await pump()
            (run,) = [r for r in h.launcher.runs if r.request.env.get("MARBLE_JOB_ID")]
            assert run.request.cwd is None
            assert run.request.workdir == h.broker.files.dir(job)

    asyncio.run(second())


def test_each_standby_waits_on_a_go_file_of_its_own_and_old_ones_go_at_the_next_run(tmp_path):
    """A standby a broker killed -9 left waiting (a node where it cannot see its broker die)
    watched the job's one `go.json`: the next broker's go for its own standby of the same
    job would have started it as that run too. Each standby's go file is its own now, and
    the next run's preparation removes those read (not a per-GPU standby's ranks')."""
    from marbled.batch.ranks import rank_go_file
    from marbled.daemon.workfiles import JobFiles

    files = JobFiles(tmp_path)
    files.prepare_run(7)
    first, second = files.go_file(7), files.go_file(7)
    assert first != second and first.parent == second.parent == files.dir(7)
    first.write_text('{"MARBLE_RUN_ID": "3"}')
    rank = rank_go_file(second, 0, 4242)
    rank.write_text("{}")
    files.prepare_run(7)  # the job's next run
    assert not first.exists() and rank.exists()
