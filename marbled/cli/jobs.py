"""`marble` commands on jobs: submit, status, show, explain, cancel, suspend, schedule."""

from __future__ import annotations

import os
from pathlib import Path

import click

from marbled.cli.common import (
    call,
    client,
    eta_text,
    forecast_text,
    job_id,
    json_option,
    left_out_text,
    output,
    profiled_option,
)
from marbled.core.spec import JobSpec, SpecError


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
                   "the file's directory).")
@click.option("--chdir", type=click.Path(path_type=Path, file_okay=False),
              help="Run the job in this directory (relative to this one). [default: the "
                   "directory marble submit runs in; with --file, the file's]")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx, model, steps, gpus, nodes, per_gpu, retries, after, name, emulate, new_model,
           job_file, chdir, as_json, command):
    """Queue a training job: marble submit [OPTIONS] -- COMMAND [ARGS]...

    The job starts when the FIFO reaches it, in the directory it was submitted
    from (as sbatch's jobs do; --chdir to change it), with CUDA_VISIBLE_DEVICES
    set to its GPUs and MARBLE_* variables for the worker protocol
    (MARBLE_CHECKPOINT_DIR: where to keep its checkpoints).
    """
    from marbled.paths import workdir_problem

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
            jobs = read_job_file(job_file)
        except JobFileError as exc:
            raise click.ClickException(str(exc)) from None
        # a job file travels with its scripts: its jobs run in its directory, or their own
        # chdir read from there (--chdir: where those that name none run)
        here = os.path.dirname(os.path.abspath(job_file))
        specs = [s.run_from(here) if s.chdir or chdir is None else s.run_from(chdir)
                 for _, s in jobs]
        for i, ((where, _), spec) in enumerate(zip(jobs, specs, strict=True), start=1):
            problem = workdir_problem(spec.chdir)
            if problem:
                raise click.ClickException(f"{where}: job {i}: chdir: {problem}")
    else:
        if not command and not emulate:
            example = " ".join(f"--{k} {v}" for k, v in (("model", model), ("steps", steps)) if v)
            raise click.UsageError(f"give the command to run after --, e.g. 'marble submit "
                                   f"{example or '--gpus 1'} -- python train.py', or --emulate "
                                   "for marbled's emulated job of --model")
        doc = {"model": model, "steps": steps, "name": name, "emulate": emulate,
               "nodes": int(nodes) if nodes and nodes.isdigit() else nodes,
               "retries": retries, "new_model": new_model, "per_gpu": per_gpu,
               "after": [int(a) if a.isdigit() else a for a in after],
               "gpus": int(gpus) if gpus.isdigit() else gpus}
        if command:
            doc["command"] = list(command)
        try:
            specs = [JobSpec.from_mapping({k: v for k, v in doc.items() if v is not None})
                     .run_from(chdir or os.getcwd())]
        except SpecError as exc:
            option = "COMMAND" if exc.field == "command" else f"--{exc.field.replace('_', '-')}"
            raise click.UsageError(f"{option}: {exc.message}") from None
    body = {"jobs": [s.to_mapping() for s in specs]}
    for job in body["jobs"]:
        for key in [k for k, v in job.items() if v in (None, [], False)]:
            del job[key]
    # with a key of its own: sent again after a timeout, it cannot submit the jobs twice; a
    # refusal of a file's job (field 'jobs[1].steps') names its line, as the file's reader
    api = client(ctx)
    result = call(lambda: api.submit(
                      body, on_retry=lambda said: click.echo(f"marble submit: {said}", err=True)),
                  place=lambda field: jobs[int(field[5:field.index("]")])][0]
                  if job_file and field and field.startswith("jobs[") else None)

    def text() -> None:
        from marbled.core.target import gpus_text

        for job in result["jobs"]:
            how = "auto" if job["malleable"] else "fixed"
            click.echo(f"submitted job {job['id']}"
                       + (f" ({job['name']})" if job["name"] else "")
                       + f": {gpus_text(job['demand'])} ({how}"
                       + (", one process per GPU)" if job.get("per_gpu") else ")"))
            for note in job.get("notes", ()):
                click.echo(f"note: job {job['id']}: {note} (say "
                           + ("'new_model: true'" if job_file else "--new-model")
                           + " if you mean it)", err=True)

    output(ctx, as_json, result, text)


HEADER = (f"{'ID':>5} {'NAME':<20} {'MODEL':<14} {'STATE':<10} {'ROLE':<9} {'WANT':>4} "
          f"{'GPUS':<12} {'STEP':>12} {'STEPS/S':>8} {'ETA':>7} {'SUSP':>4}")


def _fmt_job(j: dict, forecast: dict, ends: dict | None = None) -> str:
    steps = f"{j['step']}/{j['steps']}" if j["steps"] else str(j["step"] or "-")
    gpus = ",".join(map(str, j["gpus"])) or "-"
    label = j["name"] or j["model"] or " ".join(j["command"])[:20]
    rate = f"{j['rate']:.3g}" if j.get("rate") else "-"
    eta = eta_text(j, forecast, ends)
    return (f"{j['id']:>5} {label[:20]:<20} {(j['model'] or '-')[:14]:<14} {j['state']:<10} "
            f"{(j['role'] or '-'):<9} {j['demand']:>4} {gpus:<12} {steps:>12} {rate:>8} "
            f"{eta:>7} {j['suspensions']:>4}")


UNFINISHED = ("queued", "running", "suspending", "suspended")
STATUS_LIMIT = 500  # jobs `marble status` lists by default: a page of GET /v1/jobs
FAILED_SHOWN = 5  # failed jobs `marble status` names under its table (the rest: --all)


def ended_text(counts: dict[str, int], failed: list[dict]) -> list[str]:
    """The jobs that ended since the broker started, under `marble status`'s table: each
    failed one (up to FAILED_SHOWN) with its reason, and a count of the rest, as squeue
    users look for them (`sacct`, `hq job list --filter failed`)."""
    lines = []
    for j in failed:
        label = f" ({j['name']})" if j["name"] else ""
        lines.append(f"job {j['id']}{label} failed: {(j['reason'] or 'no reason')[:120]}")
    ended = [f"{counts[s]} {s}" for s in ("failed", "cancelled", "done") if counts.get(s)]
    if ended:
        # Worded so that no line under the table starts with a number, as a job's row does
        lines.append("ended since the broker started: " + ", ".join(ended)
                     + " (marble status --all lists them, marble explain JOB says why)")
    return lines


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
    api = client(ctx)
    broker = call(api.get, "/v1/status")
    query = [] if show_all else [f"state={s}" for s in UNFINISHED]
    if limit:
        query.append(f"limit={limit}")
    page = call(api.get, "/v1/jobs" + ("?" + "&".join(query) if query else ""))
    jobs = page["jobs"]
    counted = broker["jobs"] if show_all else \
        {s: n for s, n in broker["jobs"].items() if s in UNFINISHED}
    more = max(sum(counted.values()) - len(jobs), 0) if page.get("next") is not None else 0
    failed = [] if show_all or not broker["jobs"].get("failed") else \
        call(api.get, f"/v1/jobs?state=failed&limit={FAILED_SHOWN}")["jobs"]
    forecast = call(api.get, "/v1/forecast")

    def text() -> None:
        from marbled.core.target import gpus_text

        nodes = "; ".join(f"{n}: {len(v['free'])}/{gpus_text(len(v['gpus']))} free"
                          for n, v in broker["nodes"].items())
        click.echo(f"marbled {broker['pid']} policy={broker['policy']} "
                   f"profile={broker['profile']} {nodes}"
                   + (" DRAINING" if broker["draining"] else ""))
        ends = {f["id"]: f["end_at"] for f in forecast["jobs"]}
        lines = [HEADER, *(_fmt_job(j, forecast, ends) for j in jobs)]
        if more:
            lines.append(f"... and {more} more ({', '.join(f'{n} {s}' for s, n in counted.items())}"
                         " in all; --limit 0 lists every one)")
        if not show_all:
            lines += ended_text(broker["jobs"], failed)
        click.echo("\n".join(lines))
        if forecast_text(forecast):
            click.echo(forecast_text(forecast))
        if left_out_text(forecast):
            click.echo(left_out_text(forecast))

    ended = {s: n for s, n in broker["jobs"].items() if s not in UNFINISHED}
    output(ctx, as_json, {"broker": broker, "jobs": jobs, "more": more, "forecast": forecast,
                          "ended": ended, "failed": failed}, text)


@click.command()
@click.argument("ref", metavar="JOB")
@json_option
@click.pass_context
def show(ctx, ref, as_json):
    """One job (an id or a name) with its runs (launch segments) and events, and why it is
    where it is."""
    api = client(ctx)
    job = call(api.get, f"/v1/jobs/{job_id(api, ref)}")

    def text() -> None:
        want = (job.get("want") or {}).get("text", job["demand"])  # None once it has ended
        nodes = job["nodes"] if job.get("nodes_min") is None else \
            f"{job['nodes_min']}-{job['nodes']}"
        for key in ("id", "name", "model", "steps", "state", "role", "node", "gpus", "want",
                    "gpus_request", "nodes", "malleable", "per_gpu", "step", "suspensions",
                    "after", "command", "chdir", "exit_code", "reason", "why"):
            value = {"want": want, "nodes": nodes}.get(key, job.get(key))
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
    api = client(ctx)
    job = call(api.get, f"/v1/jobs/{job_id(api, ref)}")
    doc = {"id": job["id"], "state": job["state"], "reasons": job["reasons"]}

    def text() -> None:
        click.echo(f"job {job['id']} ({job['state']}):")
        for line in job["reasons"]:
            click.echo(f"  {line}")

    output(ctx, as_json, doc, text)


def _ask(ctx, as_json: bool, jobs: tuple[str, ...], what: str) -> None:
    """POST /v1/jobs/ID/`what` for each job (an id or a name), in order (stops at the first
    refusal)."""
    api = client(ctx)
    answers = [call(api.post, f"/v1/jobs/{job_id(api, ref)}/{what}") for ref in jobs]
    output(ctx, as_json, {"requested": answers}, lambda: [
        click.echo(f"{what} requested for job {a['id']}") for a in answers])


@click.command()
@click.argument("jobs", metavar="JOB...", nargs=-1, required=True)
@json_option
@click.pass_context
def cancel(ctx, jobs, as_json):
    """Cancel jobs (ids or names): queued ones are dropped, running ones are stopped (SIGTERM,
    then SIGKILL)."""
    _ask(ctx, as_json, jobs, "cancel")


@click.command()
@click.argument("jobs", metavar="JOB...", nargs=-1, required=True)
@json_option
@click.pass_context
def suspend(ctx, jobs, as_json):
    """Checkpoint running jobs now; each resumes (on its optimal GPUs) when its turn comes.

    Only jobs with --gpus auto can be suspended; the job must speak the worker protocol.
    """
    _ask(ctx, as_json, jobs, "suspend")


@click.command()
@json_option
@click.option("--width", type=click.IntRange(20, 400), default=64, show_default=True)
@profiled_option
@click.pass_context
def schedule(ctx, as_json, width, profiled):
    """Who ran on which GPUs when, as primary or secondary (seconds since the first run
    started: real ones, or with --profiled the emulated jobs' profiled ones)."""
    from marbled.cli.schedule import clock, format_gantt, format_table, schedule_rows

    api = client(ctx)
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
