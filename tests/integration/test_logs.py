"""`marble logs` and GET /v1/jobs/{id}/log on a real broker: real jobs that print, are
suspended and resumed (the resumed run in a prestarted process), fail; each run's output
apart, followed with -f through a suspension to the job's end."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from marbled.cli.client import ApiError

pytestmark = pytest.mark.daemon

# Inception-v3 is a secondary on 3 GPUs, suspended when ResNet-50 ends, resumed on 4;
# every step it trains is a line of its stdout, and each process says hello on stderr.
FIRST = {"model": "resnet-50", "steps": 1800, "emulate": True}  # ~4 s: -f is in time
STEPS = 4500
EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01",
           "--step-log", "/dev/stdout"]
PRINTER = {"model": "inception-v3", "steps": STEPS, "name": "printer", "command": [
    "sh", "-c", f"echo hello-stderr >&2; exec {shlex.join(EMULATE)}"]}


def marble(state_dir, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args],
                          env={**os.environ, "MARBLE_STATE_DIR": str(state_dir)},
                          capture_output=True, text=True, timeout=60, **kw)


def follow(state_dir, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "marbled.cli.client_cmd", "logs", "-f",
                             "--interval", "0.1", *args],
                            env={**os.environ, "MARBLE_STATE_DIR": str(state_dir)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def header(run, end: str, end_step=None) -> str:
    gpus = f"{run['gpu_count']} GPU" + ("s" if run["gpu_count"] != 1 else "")
    steps = f", steps {run['start_step']} -> {end_step}" if end_step is not None else \
        f", from step {run['start_step']}" if run["start_step"] else ""
    return (f"== run {run['id']} (job {run['job_id']}): {run['role']}, {gpus} on "
            f"{run['node']}{steps}, {end} ==")


def sections(text: str) -> list[tuple[str, list[str]]]:
    """Output with headers as [(header, its lines)]."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("== run "):
            out.append((line, []))
        else:
            out[-1][1].append(line)
    return out


def steps(run) -> list[str]:
    return [str(s) for s in range(run["start_step"] + 1, run["end_step"] + 1)]


def test_each_run_has_its_output_and_f_follows_through_a_suspension(daemon):
    daemon.submit(FIRST, PRINTER)
    follower = follow(daemon.state_dir, "2")  # before job 2 has run, or while it runs
    jobs = daemon.wait_all(timeout=90)
    assert [j["state"] for j in jobs] == ["done", "done"]
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err  # the job is done
    runs = daemon.query("SELECT * FROM runs WHERE job_id = 2 ORDER BY id")
    first, last = runs[0], runs[-1]
    assert first["end_reason"] == "suspended" and 0 < first["end_step"] < STEPS
    assert (first["role"], last["role"], last["end_step"]) == ("secondary", "primary", STEPS)

    # -f: each run's steps under its header, as -f first saw the run (running, mostly)
    followed = sections(out)
    assert len(followed) == len(runs)
    for (head, lines), run in zip(followed, runs, strict=True):
        assert head in (header(run, "running"),
                        header(run, run["end_reason"], run["end_step"]))
        assert lines == steps(run)
    assert followed[0][0] == header(first, "running")  # it saw the suspension come

    # the latest run's output, alone (no header: one run)
    latest = marble(daemon.state_dir, "logs", "2")
    assert latest.returncode == 0 and latest.stdout.split() == steps(last)
    by_id = marble(daemon.state_dir, "logs", "2", "--run", str(first["id"])).stdout
    assert by_id.split() == steps(first)
    # every run, with headers that now say how each ended
    every = marble(daemon.state_dir, "logs", "2", "--all-runs").stdout
    assert sections(every) == [(header(r, r["end_reason"], r["end_step"]), steps(r))
                               for r in runs]
    # --tail: the last lines (of each run shown); the job by its name
    assert marble(daemon.state_dir, "logs", "printer", "--tail", "3").stdout.split() == [
        str(s) for s in range(STEPS - 2, STEPS + 1)]
    assert sections(marble(daemon.state_dir, "logs", "2", "--all-runs", "-n", "1").stdout) \
        == [(header(r, r["end_reason"], r["end_step"]), steps(r)[-1:]) for r in runs]
    # --stderr: each process said hello once, a prestarted one's kept with its run
    stderr = sections(marble(daemon.state_dir, "logs", "2", "--stderr", "--all-runs").stdout)
    assert [h for h, _ in stderr] == [h for h, _ in sections(every)]
    assert all(lines == ["hello-stderr"] for (_, lines), run in zip(stderr, runs, strict=True)
               if run["end_step"] > run["start_step"])
    doc = json.loads(marble(daemon.state_dir, "logs", "2", "--all-runs", "--json").stdout)
    assert [(r["run"]["id"], r["text"].split()) for r in doc["runs"]] == [
        (r["id"], steps(r)) for r in runs]
    assert doc["state"] == "done" and doc["stream"] == "stdout"

    wrong = marble(daemon.state_dir, "logs", "2", "--run", "999")
    assert wrong.returncode == 1
    assert (f"job 2 has no run 999; its runs are {', '.join(str(r['id']) for r in runs)}"
            in wrong.stderr)
    both = marble(daemon.state_dir, "logs", "2", "--run", "1", "--all-runs")
    assert both.returncode == 2 and "--run RUN or --all-runs" in both.stderr


def test_f_ends_non_zero_when_the_job_fails_and_a_waiting_job_has_no_output(daemon):
    daemon.submit({"gpus": 1, "command": ["sh", "-c",
                                          "echo working; sleep 3; echo boom >&2; exit 3"]},
                  {"gpus": 1, "command": ["true"], "after": [1]})
    follower = follow(daemon.state_dir, "1", "--stderr")
    waiting = marble(daemon.state_dir, "logs", "2")
    assert waiting.returncode == 0 and waiting.stdout == ""
    assert "job 2 has not run yet (queued)" in waiting.stderr
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 1, err  # failed, as `marble wait` says it
    (run,) = daemon.query("SELECT * FROM runs WHERE job_id = 1")
    assert out.splitlines() == [header(run, "running"), "boom"]
    assert marble(daemon.state_dir, "logs", "1").stdout == "working\n"


def test_the_log_route_pages_within_its_bounds(daemon):
    """Pages of at most `limit` bytes that end at a line's end (or between characters, in a
    line longer than a page), chained by next_offset to the whole file; tail; refusals."""
    script = ("import sys\n"
              "for i in range(3000): print(f'line {i}')\n"
              "sys.stdout.write('é' * 5000)\n")
    (job,) = daemon.submit({"gpus": 1, "command": [sys.executable, "-c", script]})
    daemon.wait_all(timeout=30)
    (run,) = daemon.query("SELECT * FROM runs WHERE job_id = ?", job["id"])
    whole = (daemon.state_dir / "jobs" / str(job["id"]) /
             f"run-{run['id']}.stdout.log").read_bytes()
    path = f"/v1/jobs/{job['id']}/log"

    texts, offset = [], 0
    while True:
        doc = daemon.client.get(f"{path}?offset={offset}&limit=1001")
        assert doc["offset"] == offset and doc["size"] == len(whole)
        assert 0 < doc["next_offset"] - offset <= 1001
        assert doc["text"].endswith("\n") or doc["next_offset"] > 3000 * 8  # in the é line
        texts.append(doc["text"])
        offset = doc["next_offset"]
        if offset == doc["size"]:
            break
    assert "".join(texts) == whole.decode() and "\ufffd" not in "".join(texts)
    assert doc["run"]["id"] == run["id"] and doc["runs"] == [run["id"]]
    assert doc["state"] == "done" and doc["stream"] == "stdout"

    tail = daemon.client.get(f"{path}?tail=2")
    assert tail["text"] == "line 2999\n" + "é" * 5000
    assert tail["next_offset"] == len(whole)
    clipped = daemon.client.get(f"{path}?tail=3000&limit=50")  # fewer lines than asked
    assert clipped["text"] == "é" * 25 and clipped["offset"] == len(whole) - 50
    assert daemon.client.get(f"{path}?stream=stderr")["text"] == ""

    for query, field in (("stream=stdin", "stream"), ("limit=0", "limit"),
                         ("limit=4194305", "limit"), ("tail=0", "tail"),
                         ("tail=100001", "tail"), ("offset=-1", "offset"), ("run=x", "run")):
        with pytest.raises(ApiError) as refused:
            daemon.client.get(f"{path}?{query}")
        assert (refused.value.status, refused.value.field) == (400, field), query
    for where, message in ((f"{path}?run=999", f"job {job['id']} has no run 999"),
                           ("/v1/jobs/999/log", "no job 999")):
        with pytest.raises(ApiError) as missing:
            daemon.client.get(where)
        assert missing.value.status == 404 and message in str(missing.value)


def test_a_10_gb_log_is_read_a_page_at_a_time(tmp_path):
    """A sparse 10 GiB log: a page and a tail cost one bounded read, not the file."""
    from marbled.daemon.workfiles import JobFiles

    files = JobFiles(tmp_path)
    files.prepare_run(1)
    with open(files.log(1, 7, "stdout"), "wb") as f:
        f.truncate(10 * 2**30 - 6)
        f.seek(0, 2)
        f.write(b"\nlast\n")
    began = time.monotonic()
    head = files.read_log(1, 7, "stdout", 0, 4 * 2**20)
    tail = files.read_log(1, 7, "stdout", 0, 4 * 2**20, lines=1)
    took = time.monotonic() - began
    assert head["offset"] == 0 and head["next_offset"] == 4 * 2**20
    assert head["size"] == 10 * 2**30 and tail["text"] == "last\n"
    assert took < 5, took  # two 4 MiB reads


def test_rank_reads_srun_labels_padded_to_the_widest_rank(tmp_path):
    """Under Slurm, srun --label writes ` 1: ` (12 tasks: padded to `11: `'s width): rank 1
    is ` 1: `'s lines and `[rank 1] `'s, not `11: `'s; -n counts rank 1's lines alone."""
    from marbled.daemon.workfiles import JobFiles

    files = JobFiles(tmp_path)
    files.prepare_run(1)
    files.log(1, 7, "stdout").write_bytes(
        b" 1: a\n11: b\n 0: 1: c\n[rank 1] d\nsrun: e\n 1: f\n")
    assert files.read_log(1, 7, "stdout", 0, 2**20, rank=1)["text"] == "a\nd\nf\n"
    assert files.read_log(1, 7, "stdout", 0, 2**20, rank=11)["text"] == "b\n"
    assert files.read_log(1, 7, "stdout", 0, 2**20, rank=0)["text"] == "1: c\n"
    assert files.read_log(1, 7, "stdout", 0, 2**20, lines=1, rank=1)["text"] == "f\n"


def test_the_log_is_where_the_run_id_says_under_the_state_directory(daemon):
    (job,) = daemon.submit({"gpus": 1, "command": ["sh", "-c", "echo out; echo err >&2"]})
    daemon.wait_all(timeout=30)
    (run,) = daemon.query("SELECT id FROM runs")
    jdir = daemon.state_dir / "jobs" / str(job["id"])
    assert (jdir / f"run-{run['id']}.stdout.log").read_text() == "out\n"
    assert (jdir / f"run-{run['id']}.stderr.log").read_text() == "err\n"
    assert not re.search(r"standby", " ".join(p.name for p in jdir.iterdir()))


def test_rank_shows_one_rank_of_a_per_gpu_run_in_pages_and_refuses_a_rank_it_lacks(
        daemon_factory, tmp_path):
    """A 2-rank per-GPU job whose ranks print 300 lines each, interleaved in the run's log:
    `marble logs --rank 1` (and -n, --stderr) shows rank 1's lines alone, without their
    prefix; the API's pages of 100 bytes chain to the same lines; rank 2, or a rank of a job
    that is not per-GPU, is refused with what to change."""
    d = daemon_factory(gpus=2)
    script = ("import os, sys\nrank = os.environ['RANK']\n"
              "for i in range(300): print(f'line {i} of rank {rank}', flush=i % 7 == 0)\n"
              "print(f'done {rank}', file=sys.stderr)\n")
    ranked, plain = d.submit(
        {"gpus": 2, "per_gpu": True, "command": [sys.executable, "-c", script]},
        {"gpus": 1, "command": ["echo", "[rank 0] not a rank"]})
    assert [j["state"] for j in d.wait_all(timeout=60)] == ["done", "done"]
    mine = [f"line {i} of rank 1" for i in range(300)]

    shown = marble(d.state_dir, "logs", str(ranked["id"]), "--rank", "1")
    assert shown.returncode == 0 and shown.stdout.splitlines() == mine, shown.stderr
    last = marble(d.state_dir, "logs", str(ranked["id"]), "--rank", "1", "-n", "2")
    assert last.stdout == "line 298 of rank 1\nline 299 of rank 1\n", last.stderr
    err = marble(d.state_dir, "logs", str(ranked["id"]), "--rank", "0", "--stderr")
    assert err.stdout == "done 0\n", err.stderr

    path = f"/v1/jobs/{ranked['id']}/log?rank=1&limit=100"
    texts, offset = [], 0
    while True:
        doc = d.client.get(f"{path}&offset={offset}")
        assert offset < doc["next_offset"] <= offset + 100
        texts.append(doc["text"])
        offset = doc["next_offset"]
        if offset == doc["size"]:
            break
    assert "".join(texts).splitlines() == mine

    lacks = marble(d.state_dir, "logs", str(ranked["id"]), "--rank", "2")
    assert lacks.returncode != 0 and "has 2 rank(s), 0 to 1 (one per GPU): there is no " \
        "rank 2" in lacks.stderr, lacks.stderr
    not_ranked = marble(d.state_dir, "logs", str(plain["id"]), "--rank", "0")
    assert not_ranked.returncode != 0 and "not a per-GPU job" in not_ranked.stderr
    with pytest.raises(ApiError) as never:  # well formed, but not this run's: 409, not 400
        d.client.get(f"/v1/jobs/{ranked['id']}/log?rank=2")
    assert (never.value.status, never.value.field) == (409, "rank")
    with pytest.raises(ApiError) as refused:
        d.client.get(f"/v1/jobs/{ranked['id']}/log?rank=x")
    assert (refused.value.status, refused.value.field) == (400, "rank")
