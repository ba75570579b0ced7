"""`marble` commands on jobs: submit, status, show, explain, cancel, suspend, schedule.

Kept light: submit, status, show and cancel import what they print with and the small
client, not the job's checks (`core.spec`, the profiles): the broker makes those, and a
refusal of what was typed is said as a usage error naming the option (`typed_refusal`).
`marble submit --file` reads its YAML with them (`marbled.resources`), imported then."""

from __future__ import annotations

import os
from pathlib import Path

import click

from marbled.cli import quick
from marbled.cli.asks import ask, ask_lines
from marbled.cli.client import ApiError
from marbled.cli.common import (
    call,
    client,
    job_id,
    json_option,
    output,
    profiled_option,
    reader,
)
from marbled.cli.quick import job_doc, note_lines, submitted_line
from marbled.cli.status_view import STATUS_LIMIT, UNFINISHED, status_doc, status_lines
from marbled.core.errors import SpecError
from marbled.core.shapes import shape_text


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", help="Model name, for the profile's optimal GPU count (e.g. resnet-50).")
@click.option("--steps", type=int, help="Steps to train in all (passed as MARBLE_TARGET_STEPS).")
@click.option("--gpus", default="auto", show_default=True,
              help="'auto' (the profile's optimal count; the job may be suspended and resumed) "
                   "or a fixed count K (runs on exactly K GPUs, never resized and never "
                   "suspended by the policy; a shutdown still checkpoints it).")
@click.option("--nodes", metavar="K|MIN-MAX", default=None,
              help="Run on this many nodes, --gpus on each, one process per node (as one "
                   "multi-node step under Slurm); a range MIN-MAX keeps the GPUs of MAX nodes "
                   "and runs them on the fewest nodes in it that have them free "
                   "(docs/distributed.md). [default: 1]")
@click.option("--per-gpu", is_flag=True,
              help="Start one process (rank) per GPU, with RANK, WORLD_SIZE, LOCAL_RANK "
                   "(its GPU), MASTER_ADDR and MASTER_PORT, as torchrun does (PyTorch DDP; "
                   "docs/distributed.md).")
@click.option("--retries", type=click.IntRange(0, 100), default=None,
              help="Start the job again (from its checkpoint) after a failure, up to N times, "
                   "waiting marbled's --retry-delay, doubled after each failure. [default: 0]")
@click.option("--after", multiple=True,
              help="Start only after this job (id or name) is done. Repeatable.")
@click.option("--name", help="A name to refer to the job by (e.g. in --after).")
@click.option("--emulate", is_flag=True,
              help="Run marbled's EMULATED training job for --model instead of a command.")
@click.option("--new-model", is_flag=True,
              help="--model is meant to be one the profile does not know (it is explored from "
                   "marbled's --start-gpus): no note at submit.")
@click.option("--file", "job_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Submit every job of a YAML job-set file (a list of jobs with these fields). "
                   "Its jobs run in the file's directory, or in their own 'chdir' (relative to "
                   "the file's directory). One larger than a request may carry goes in "
                   "several; run the same command again after a failure half-way to submit "
                   "the rest (docs/api.md, 'Large job sets').")
@click.option("--export", "export", default="ALL", show_default=True,
              metavar="ALL|NONE|VAR[,VAR=value...]",
              help="The environment the job runs in, as sbatch's --export: ALL, yours (with "
                   "the modules you loaded and the venv you activated); NONE, the broker's; "
                   "or the broker's with these variables (a name alone: its value here). "
                   "The allocation's SLURM_*/LSB_* variables and the ones marbled sets "
                   "(MARBLE_*, CUDA_VISIBLE_DEVICES, RANK...) are never taken from here "
                   "(docs/environment.md). With --file: for the jobs that give no 'export'.")
@click.option("--chdir", type=click.Path(path_type=Path, file_okay=False),
              help="Run the job in this directory (relative to this one). [default: the "
                   "directory marble submit runs in; with --file, the file's]")
@click.option("--wait", "wait", is_flag=True,
              help="Then wait until the jobs submitted have ended, as 'marble wait' does "
                   "(sbatch --wait, hq submit --wait): progress on stderr; the exit status "
                   "is 0 if all are done, 1 if any failed or was cancelled, 3 if the broker "
                   "stopped first; with --json, the jobs as they ended.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx, model, steps, gpus, nodes, per_gpu, retries, after, name, emulate, new_model,
           job_file, export, chdir, wait, as_json, command):
    """Queue a training job: marble submit [OPTIONS] -- COMMAND [ARGS]...

    The job starts when the FIFO reaches it, in the directory it was submitted
    from (as sbatch's jobs do; --chdir to change it), with CUDA_VISIBLE_DEVICES
    set to its GPUs and MARBLE_* variables for the worker protocol
    (MARBLE_CHECKPOINT_DIR: where to keep its checkpoints).
    """
    from marbled.core.environment import Environment
    from marbled.paths import workdir_problem

    try:  # the environment the jobs share, sent once (a job file's may name their own)
        shared = Environment.from_mapping(export, environ=os.environ)
    except SpecError as exc:
        raise click.BadParameter(exc.message, param_hint="'--export'") from None
    if chdir is not None:
        chdir = os.path.abspath(chdir)
        problem = workdir_problem(chdir)
        if problem:
            raise click.BadParameter(problem, param_hint="'--chdir'")
    if job_file:
        from marbled.resources import JobFileError, read_job_file  # YAML: only for --file

        if command or model or steps or emulate or name or after or nodes or retries \
                or new_model or per_gpu:
            raise click.UsageError(
                "--file takes every job from the file; give no other job options")
        try:
            jobs = read_job_file(job_file, os.environ, shared)
        except JobFileError as exc:
            raise click.ClickException(str(exc)) from None
        # a job file travels with its scripts: its jobs run in its directory, or their own
        # chdir read from there (--chdir: where those that name none run)
        here = os.path.dirname(os.path.abspath(job_file))
        specs = [s.run_from(here) if s.chdir or chdir is None else s.run_from(chdir)
                 for _, s in jobs]
        # the environment the jobs share goes once, a job's own only where it differs; a
        # field at its default is left out
        docs = [{k: v for k, v in (s.to_mapping(environment=False) | (
            s.environment.to_mapping() if s.environment != shared else {})).items()
            if v not in (None, [], False)} for s in specs]
        problems: dict[str, str | None] = {}  # each directory looked at once
        for i, ((where, _), spec) in enumerate(zip(jobs, specs, strict=True), start=1):
            if spec.chdir not in problems:
                problems[spec.chdir] = workdir_problem(spec.chdir)
            problem = problems[spec.chdir]
            if problem:
                raise click.ClickException(f"{where}: job {i}: chdir: {problem}")
    else:
        if not command and not emulate:
            example = " ".join(f"--{k} {v}" for k, v in (("model", model), ("steps", steps)) if v)
            raise click.UsageError(f"give the command to run after --, e.g. 'marble submit "
                                   f"{example or '--gpus 1'} -- python train.py', or --emulate "
                                   "for marbled's emulated job of --model")
        docs = [job_doc({"command": command, "emulate": emulate, "model": model, "steps": steps,
                         "gpus": gpus, "after": after, "name": name, "nodes": nodes,
                         "retries": retries, "new_model": new_model, "per_gpu": per_gpu},
                        chdir)]
    body = {"jobs": docs, **shared.to_mapping()}
    # with a key of its own: sent again after a timeout, it cannot submit the jobs twice; a
    # refusal of a file's job (field 'jobs[1].steps') names its line, as the file's reader
    api = client(ctx)

    def place(field: str | None) -> str | None:
        return jobs[int(field[5:field.index("]")])][0] \
            if job_file and field and field.startswith("jobs[") else None

    def say(said: str) -> None:
        click.echo(f"marble submit: {said}", err=True)

    bounds = None
    if job_file:  # a job set larger than a request may carry goes in several (chunks.py)
        from marbled.cli.chunks import ChunkFailed, limits, record_path, split

        try:
            bounds = split(body, *call(limits, api))
        except ChunkFailed as exc:
            raise click.ClickException(f"{job_file}: {exc}") from None
    if bounds and len(bounds) > 1:
        from marbled.cli.chunks import submit_in_chunks

        record = record_path(ctx.find_root().obj["state_dir"], job_file, api.where)
        try:
            result = {"jobs": submit_in_chunks(api, body, bounds, record, job_file, place,
                                               say)}
        except ChunkFailed as exc:
            raise click.ClickException(str(exc)) from None
    else:
        def send() -> dict:
            try:
                # a refused quick submission (quick.py) again, with its key
                return api.submit(body, on_retry=say, key=quick.SENT_KEY)
            except ApiError as exc:
                typed = None if job_file else typed_refusal(exc)
                if typed:
                    raise typed from None
                raise

        result = call(send, place=place)

    def notes(job: dict) -> None:
        for line in note_lines(job, from_file=bool(job_file)):
            click.echo(line, err=True)

    def text() -> None:
        for job in result["jobs"]:
            click.echo(submitted_line(job))
            notes(job)

    if not wait:
        output(ctx, as_json, result, text)
        return
    from marbled.cli.session import wait_for

    if as_json:  # one document: the jobs as they ended (the notes on stderr)
        for job in result["jobs"]:
            notes(job)
    else:
        text()
    wait_for(ctx, api, [job["id"] for job in result["jobs"]], timeout=None, interval=1.0,
             quiet=False, as_json=as_json)


def typed_refusal(exc: ApiError) -> click.UsageError | None:
    """The broker's refusal of a field of plain `marble submit`'s one job as the option
    typed: '--steps: must be ...' ('COMMAND: ...'), a usage error (exit 2) as click's own.
    Such a refusal is the job's document's (400, 'jobs[0].steps': JobSpec.from_mapping);
    None for the others, which stay refusals: a lone job's admission names the bare field
    ('gpus': more than a node has; a model without a curve), a dependency is not found
    (404)."""
    prefix = "jobs[0]."
    if exc.status != 400 or not (exc.field or "").startswith(prefix):
        return None
    field = exc.field[len(prefix):]
    message = str(exc).removeprefix("job 1: ").removeprefix(f"{field}: ")
    option = "COMMAND" if field == "command" else f"--{field.replace('_', '-')}"
    return click.UsageError(f"{option}: {message}")


def per_gpu_text(job: dict) -> object:
    """`marble show`'s per_gpu line: False, or its ranks (one process per GPU) and their
    shape: those of its run while it runs, else those it asks for."""
    if not job.get("per_gpu"):
        return job.get("per_gpu")
    if job.get("gpus") and job.get("node"):  # running: its run's
        nodes, ranks = job["node"].count(",") + 1, len(job["gpus"])
        low, shape = ranks, shape_text(ranks // nodes, nodes)
    else:
        nodes, fewest = job.get("nodes") or 1, job.get("nodes_min") or job.get("nodes") or 1
        low, ranks = job["demand"] * fewest, job["demand"] * nodes
        shape = shape_text(job["demand"], nodes, job.get("nodes_min"))
    count = f"{ranks} rank{'s' if ranks != 1 else ''}" if low == ranks else f"{low}-{ranks} ranks"
    return f"True: {count}, one process per GPU ({shape})"


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also list finished jobs.")
@click.option("--limit", type=click.IntRange(0), default=STATUS_LIMIT, show_default=True,
              help="List the first N jobs in FIFO order, and how many more there are "
                   "(0: every one).")
@json_option
@click.pass_context
def status(ctx, show_all, limit, as_json):
    """The queue, like squeue: state, role, GPUs, progress, speed and ETA of every job
    that has not ended (with --all, of every job). Under it, the jobs that failed,
    each with its reason, and how many failed, were cancelled or are done.

    WANT is the GPU count a job aims for (`marble show` and `marble curves` say why).

    STEPS/S and ETA of a running job come from its own progress reports (from its
    profile until it has trained a second); a waiting job's ETA (~) and the queue's
    end come from the simulator, played from now on the jobs left (GET /v1/forecast).
    """
    doc = call(status_doc, reader(ctx), show_all, limit)  # a stopped broker's records
    output(ctx, as_json, doc, lambda: click.echo("\n".join(status_lines(doc, show_all))))


@click.command()
@click.argument("ref", metavar="JOB")
@json_option
@click.pass_context
def show(ctx, ref, as_json):
    """One job (an id or a name) with its runs (launch segments) and events, and why it is
    where it is."""
    api = reader(ctx)
    job = call(api.get, f"/v1/jobs/{job_id(api, ref)}")

    def text() -> None:
        want = (job.get("want") or {}).get("text", job["demand"])  # None once it has ended
        nodes = job["nodes"] if job.get("nodes_min") is None else \
            f"{job['nodes_min']}-{job['nodes']}"
        for key in ("id", "name", "model", "steps", "state", "role", "node", "gpus", "want",
                    "gpus_request", "nodes", "malleable", "per_gpu", "step", "suspensions",
                    "after", "command", "chdir", "exit_code", "reason", "why"):
            value = {"want": want, "nodes": nodes,
                     "per_gpu": per_gpu_text(job)}.get(key, job.get(key))
            click.echo(f"{key + ':':<14}{'-' if value is None else value}")
        click.echo("runs:")
        for r in job["runs"]:
            end = "?" if r["end_step"] is None else r["end_step"]
            click.echo(f"  run {r['id']}: {r['role']} on {r['node']} GPUs {r['gpus']} steps "
                       f"{r['start_step']}->{end} ended: "
                       f"{r['end_reason'] or 'running'}"
                       + (f" (exit {r['exit_code']})" if r["exit_code"] not in (None, 0)
                          else ""))

        click.echo("why:")
        for line in job["reasons"]:
            click.echo(f"  {line}")

    output(ctx, as_json, job, text)


@click.command()
@click.argument("ref", metavar="JOB")
@json_option
@click.pass_context
def explain(ctx, ref, as_json):
    """Why a job (an id or a name) is where it is, in words.

    Why this GPU count (its curve, its fastest count, what is free), why it waits
    (the jobs ahead, a dependency, when GPUs should free up, when it should start),
    why it was suspended or promoted, and what failed. `marble show` ends with the
    same lines.
    """
    api = reader(ctx)
    job = call(api.get, f"/v1/jobs/{job_id(api, ref)}")
    doc = {"id": job["id"], "state": job["state"], "reasons": job["reasons"]}

    def text() -> None:
        click.echo(f"job {job['id']} ({job['state']}):")
        for line in job["reasons"]:
            click.echo(f"  {line}")

    output(ctx, as_json, doc, text)


def _ask(ctx, as_json: bool, refs: list[str], what: str, ids: list[int] | None = None,
         summary_only: bool = False) -> None:
    """POST /v1/jobs/ID/`what` for each job (an id or a name; or each of `ids`): every one
    it can; each one refused (or a name no job has) is reported with the broker's reason,
    and the command then exits 1."""
    doc = call(ask, client(ctx), [str(i) for i in ids] if ids is not None else refs, what)

    def text() -> None:
        for line, to_stderr in ask_lines(doc, what, summary_only):
            click.echo(line, err=to_stderr)

    output(ctx, as_json, doc, text)
    if doc["failed"]:
        ctx.exit(1)


def _selected(ctx, refs: tuple[str, ...], every: bool, states: tuple[str, ...],
              what: str) -> list[int] | None:
    """The ids `--all` / `--state` select (None: the JOB arguments do); a usage error for a
    selection that says nothing or too much. Queued and suspended ones come first, each
    from the back of the FIFO, so that none of them starts in the GPUs a running one frees."""
    if refs and (every or states):
        given = "--all" if every else "--state"
        raise click.UsageError(f"{given} selects the jobs to {what} itself: give either job ids "
                               f"or names, or {given}, not both (drop the JOB arguments, or "
                               f"{given})")
    if every and states:
        raise click.UsageError(f"--all already takes every unfinished job: drop --all to "
                               f"{what} only those in --state {' / '.join(states)}")
    if not refs and not every and not states:
        raise click.UsageError(f"give the jobs to {what} (ids or names), or --all for every "
                               f"unfinished job, or --state STATE for those in a state")
    if not every and not states:
        return None
    api = client(ctx)
    query = "&".join(f"state={s}" for s in (states or UNFINISHED))
    jobs = call(api.get, f"/v1/jobs?{query}")["jobs"]
    waiting = [j["id"] for j in reversed(jobs) if j["state"] in ("queued", "suspended")]
    return waiting + [j["id"] for j in jobs if j["state"] not in ("queued", "suspended")]


@click.command()
@click.argument("jobs", metavar="[JOB]...", nargs=-1)
@click.option("--all", "every", is_flag=True,
              help="Cancel every job that has not ended (give no JOB then).")
@click.option("--state", "states", multiple=True, type=click.Choice(UNFINISHED),
              help="Cancel every job in this state (give no JOB then). Repeatable.")
@json_option
@click.pass_context
def cancel(ctx, jobs, every, states, as_json):
    """Cancel jobs (ids or names, or --all, or --state): queued ones are dropped, running
    ones are stopped (SIGTERM, then SIGKILL).

    Each job it can is cancelled; each one it cannot (it has ended, no job has that name)
    is named with the reason, and marble cancel then exits 1. With --all or --state it
    says how many it cancelled, and which could not be.
    """
    ids = _selected(ctx, jobs, every, states, "cancel")
    _ask(ctx, as_json, list(jobs), "cancel", ids, summary_only=ids is not None)


@click.command()
@click.argument("jobs", metavar="JOB...", nargs=-1, required=True)
@json_option
@click.pass_context
def suspend(ctx, jobs, as_json):
    """Checkpoint running jobs now; each resumes (on its optimal GPUs) when its turn comes.

    Only jobs with --gpus auto can be suspended; the job must speak the worker protocol.
    Each job it can is suspended; each one it cannot is named with the reason, and
    marble suspend then exits 1.
    """
    _ask(ctx, as_json, list(jobs), "suspend")


@click.command()
@json_option
@click.option("--width", type=click.IntRange(20, 400), default=64, show_default=True)
@profiled_option
@click.pass_context
def schedule(ctx, as_json, width, profiled):
    """Who ran on which GPUs when, as primary or secondary (seconds since the first run
    started: real ones, or with --profiled the emulated jobs' profiled ones)."""
    from marbled.cli.schedule import clock, format_gantt, format_table, schedule_rows

    api = reader(ctx)
    broker = call(api.get, "/v1/status")
    runs = call(api.get, "/v1/runs")
    jobs = {j["id"]: j for j in call(api.get, "/v1/jobs")["jobs"]}
    try:
        scale, unit = clock(runs["runs"], jobs, broker["time_scale"], profiled)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    t0 = min((r["started_at"] for r in runs["runs"]), default=runs["started_at"])
    rows = schedule_rows(runs["runs"], jobs, t0, scale)

    def text() -> None:
        click.echo(f"times in {'profiled' if profiled else 'real'} seconds since the first "
                   "run started" + (f" (real / time scale {broker['time_scale']:g})"
                                    if profiled else ""))
        click.echo(format_table(rows))
        click.echo()
        click.echo(format_gantt(rows, {n: len(v["gpus"]) for n, v in broker["nodes"].items()},
                                width, unit))

    output(ctx, as_json, {"time_scale": broker["time_scale"],
                          "clock": "profiled" if profiled else "real", "runs": rows}, text)


COMMANDS = (submit, status, show, explain, cancel, suspend, schedule)
