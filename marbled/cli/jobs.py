"""`marble` commands on jobs: submit, status, show, explain, cancel, suspend, schedule."""

from __future__ import annotations

from pathlib import Path

import click

from marbled.cli.common import (
    call,
    client,
    eta_text,
    forecast_text,
    json_option,
    output,
)
from marbled.core.spec import JobSpec, SpecError


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", help="Model name, for the profile's optimal GPU count (e.g. resnet-50).")
@click.option("--steps", type=int, help="Steps to train in all (passed as MARBLE_TARGET_STEPS).")
@click.option("--gpus", default="auto", show_default=True,
              help="'auto' (the profile's optimal count; the job may be suspended and resumed) "
                   "or a fixed count K (runs on exactly K GPUs, never suspended).")
@click.option("--nodes", type=click.IntRange(1), default=None,
              help="Run on this many nodes, --gpus on each, one process per node (as one "
                   "multi-node step under Slurm). [default: 1]")
@click.option("--retries", type=click.IntRange(0, 100), default=None,
              help="Start the job again (from its checkpoint) after a failure, up to N times, "
                   "waiting marbled's --retry-delay, doubled after each failure. [default: 0]")
@click.option("--after", multiple=True,
              help="Start only after this job (id or name) is done. Repeatable.")
@click.option("--name", help="A name to refer to the job by (e.g. in --after).")
@click.option("--emulate", is_flag=True,
              help="Run marbled's EMULATED training job for --model instead of a command.")
@click.option("--file", "job_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Submit every job of a YAML job-set file (a list of jobs with these fields).")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx, model, steps, gpus, nodes, retries, after, name, emulate, job_file, as_json,
           command):
    """Queue a training job: marble submit [OPTIONS] -- COMMAND [ARGS]...

    The job starts when the FIFO reaches it, with CUDA_VISIBLE_DEVICES set to
    its GPUs and MARBLE_* variables for the worker protocol.
    """
    if job_file:
        from marbled.resources import JobFileError, load_job_file  # YAML: only for --file

        if command or model or steps or emulate or name or after or nodes or retries:
            raise click.UsageError(
                "--file takes every job from the file; give no other job options")
        try:
            specs = load_job_file(job_file)
        except JobFileError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        doc = {"model": model, "steps": steps, "name": name, "emulate": emulate, "nodes": nodes,
               "retries": retries,
               "after": [int(a) if a.isdigit() else a for a in after],
               "gpus": int(gpus) if gpus.isdigit() else gpus}
        if command:
            doc["command"] = list(command)
        try:
            specs = [JobSpec.from_mapping({k: v for k, v in doc.items() if v is not None})]
        except SpecError as exc:
            raise click.UsageError(f"--{exc.field}: {exc.message}") from None
    body = {"jobs": [s.to_mapping() for s in specs]}
    for job in body["jobs"]:
        for key in [k for k, v in job.items() if v in (None, [], False)]:
            del job[key]
    result = call(client(ctx).post, "/v1/jobs", body)

    def text() -> None:
        for job in result["jobs"]:
            how = "auto" if job["malleable"] else "fixed"
            click.echo(f"submitted job {job['id']}"
                       + (f" ({job['name']})" if job["name"] else "")
                       + f": {job['demand']} GPUs ({how})")

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


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also list finished jobs.")
@click.option("--limit", type=click.IntRange(0), default=STATUS_LIMIT, show_default=True,
              help="List the first N jobs in FIFO order, and how many more there are "
                   "(0: every one).")
@json_option
@click.pass_context
def status(ctx, show_all, limit, as_json):
    """The queue, like squeue: state, role, GPUs, progress, speed and ETA of every job
    that has not ended (with --all, of every job).

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
    forecast = call(api.get, "/v1/forecast")

    def text() -> None:
        nodes = "; ".join(f"{n}: {len(v['free'])}/{len(v['gpus'])} GPUs free"
                          for n, v in broker["nodes"].items())
        click.echo(f"marbled {broker['pid']} policy={broker['policy']} "
                   f"profile={broker['profile']} {nodes}"
                   + (" DRAINING" if broker["draining"] else ""))
        ends = {f["id"]: f["end_at"] for f in forecast["jobs"]}
        lines = [HEADER, *(_fmt_job(j, forecast, ends) for j in jobs)]
        if more:
            lines.append(f"... and {more} more ({', '.join(f'{n} {s}' for s, n in counted.items())}"
                         " in all; --limit 0 lists every one)")
        click.echo("\n".join(lines))
        if forecast_text(forecast):
            click.echo(forecast_text(forecast))

    output(ctx, as_json, {"broker": broker, "jobs": jobs, "more": more, "forecast": forecast},
           text)


@click.command()
@click.argument("job_id", type=int)
@json_option
@click.pass_context
def show(ctx, job_id, as_json):
    """One job with its runs (launch segments) and events, and why it is where it is."""
    job = call(client(ctx).get, f"/v1/jobs/{job_id}")

    def text() -> None:
        for key in ("id", "name", "model", "steps", "state", "role", "node", "gpus", "demand",
                    "gpus_request", "malleable", "step", "suspensions", "after", "command",
                    "exit_code", "reason", "why"):
            click.echo(f"{key + ':':<14}{job.get(key)}")
        click.echo("runs:")
        for r in job["runs"]:
            click.echo(f"  run {r['id']}: {r['role']} on {r['node']} GPUs {r['gpus']} steps "
                       f"{r['start_step']}->{r['end_step']} ended: "
                       f"{r['end_reason'] or 'running'}"
                       + (f" (exit {r['exit_code']})" if r["exit_code"] not in (None, 0)
                          else ""))

        click.echo("why:")
        for line in job["reasons"]:
            click.echo(f"  {line}")

    output(ctx, as_json, job, text)


@click.command()
@click.argument("job_id", type=int)
@json_option
@click.pass_context
def explain(ctx, job_id, as_json):
    """Why a job is where it is, in words.

    Why this GPU count (its curve, its fastest count, what is free), why it waits
    (the jobs ahead, a dependency, when GPUs should free up, when it should start),
    why it was suspended or promoted, and what failed. `marble show` ends with the
    same lines.
    """
    job = call(client(ctx).get, f"/v1/jobs/{job_id}")
    doc = {"id": job["id"], "state": job["state"], "reasons": job["reasons"]}

    def text() -> None:
        click.echo(f"job {job_id} ({job['state']}):")
        for line in job["reasons"]:
            click.echo(f"  {line}")

    output(ctx, as_json, doc, text)


def _ask(ctx, as_json: bool, job_ids: tuple[int, ...], what: str) -> None:
    """POST /v1/jobs/ID/`what` for each job, in order (stops at the first refusal)."""
    answers = [call(client(ctx).post, f"/v1/jobs/{job_id}/{what}") for job_id in job_ids]
    output(ctx, as_json, {"requested": answers}, lambda: [
        click.echo(f"{what} requested for job {a['id']}") for a in answers])


@click.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@json_option
@click.pass_context
def cancel(ctx, job_ids, as_json):
    """Cancel jobs: queued ones are dropped, running ones are stopped (SIGTERM, then SIGKILL)."""
    _ask(ctx, as_json, job_ids, "cancel")


@click.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@json_option
@click.pass_context
def suspend(ctx, job_ids, as_json):
    """Checkpoint running jobs now; each resumes (on its optimal GPUs) when its turn comes.

    Only jobs with --gpus auto can be suspended; the job must speak the worker protocol.
    """
    _ask(ctx, as_json, job_ids, "suspend")


@click.command()
@json_option
@click.option("--width", type=click.IntRange(20, 400), default=64, show_default=True)
@click.pass_context
def schedule(ctx, as_json, width):
    """Who ran on which GPUs when, as primary or secondary (times in profiled seconds)."""
    from marbled.cli.schedule import format_gantt, format_table, schedule_rows

    api = client(ctx)
    broker = call(api.get, "/v1/status")
    runs = call(api.get, "/v1/runs")
    jobs = {j["id"]: j for j in call(api.get, "/v1/jobs")["jobs"]}
    t0 = min((r["started_at"] for r in runs["runs"]), default=runs["started_at"])
    rows = schedule_rows(runs["runs"], jobs, t0, broker["time_scale"])

    def text() -> None:
        click.echo(format_table(rows))
        click.echo()
        click.echo(format_gantt(rows, {n: len(v["gpus"]) for n, v in broker["nodes"].items()},
                                width))

    output(ctx, as_json, {"time_scale": broker["time_scale"], "runs": rows}, text)


COMMANDS = (submit, status, show, explain, cancel, suspend, schedule)
