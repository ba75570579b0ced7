"""`marble`: talk to a running broker (submit, status, show, cancel, wait, schedule, shutdown)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable
from marbled.cli.schedule import format_gantt, format_table, schedule_rows
from marbled.core.policy import POLICIES
from marbled.core.policy.elastic import STABLE_S
from marbled.core.policy.malleable import GUARD_S
from marbled.core.profiles import ProfileError
from marbled.core.spec import JobSpec, SpecError
from marbled.paths import TOKEN_NAME, default_state_dir, socket_path
from marbled.resources import (
    DEFAULT_PROFILE,
    JobFileError,
    load_job_file,
    load_profile,
    workload_path,
)

FINAL = {"done", "failed", "cancelled"}


def _client(ctx: click.Context) -> BrokerClient:
    if ctx.obj["url"]:
        token = os.environ.get("MARBLE_TOKEN")
        if token is None:
            try:
                token = (ctx.obj["state_dir"] / TOKEN_NAME).read_text().strip()
            except OSError:
                raise click.ClickException(
                    "--url needs the broker's token: set MARBLE_TOKEN, or point --state-dir "
                    f"at its state directory (it reads {TOKEN_NAME} there)") from None
        return BrokerClient(url=ctx.obj["url"], token=token)
    return BrokerClient(socket_path(ctx.obj["state_dir"]))


def _call(fn, *args):
    try:
        return fn(*args)
    except BrokerUnreachable as exc:
        raise click.ClickException(str(exc)) from None
    except ApiError as exc:
        raise click.ClickException(f"refused ({exc.status}): {exc}") from None


def _echo_json(doc: object) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", type=click.Path(path_type=Path), envvar="MARBLE_STATE_DIR",
              help="State directory of the broker to talk to. "
                   "[default: $MARBLE_STATE_DIR, else the allocation's default]")
@click.option("--url", envvar="MARBLE_URL", metavar="URL",
              help="Talk to a broker's TCP listener (marbled --listen; its URL is in "
                   "STATE_DIR/endpoint) instead of its socket, e.g. from another node. "
                   "The token comes from MARBLE_TOKEN or STATE_DIR/token.")
@click.pass_context
def main(ctx: click.Context, state_dir: Path | None, url: str | None) -> None:
    """Client of the marbled broker.

    \b
    A typical batch script (jobscripts/marble.sbatch is a complete one):
      marbled --detach
      marble submit --model resnet-50 --steps 800 -- python train.py
      marble submit --file jobs.yaml
      marble wait
      marble shutdown
    """
    ctx.obj = {"state_dir": (state_dir or default_state_dir()).absolute(), "url": url}


@main.command(context_settings={"ignore_unknown_options": False})
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
@click.option("--json", "as_json", is_flag=True, help="Print the accepted jobs as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def submit(ctx, model, steps, gpus, nodes, retries, after, name, emulate, job_file, as_json,
           command):
    """Queue a training job: marble submit [OPTIONS] -- COMMAND [ARGS]...

    The job starts when the FIFO reaches it, with CUDA_VISIBLE_DEVICES set to
    its GPUs and MARBLE_* variables for the worker protocol.
    """
    if job_file:
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
    result = _call(_client(ctx).post, "/v1/jobs", body)
    if as_json:
        _echo_json(result)
        return
    for job in result["jobs"]:
        how = "auto" if job["malleable"] else "fixed"
        click.echo(f"submitted job {job['id']}"
                   + (f" ({job['name']})" if job["name"] else "")
                   + f": {job['demand']} GPUs ({how})")


def _fmt_job(j: dict) -> str:
    steps = f"{j['step']}/{j['steps']}" if j["steps"] else str(j["step"] or "-")
    gpus = ",".join(map(str, j["gpus"])) or "-"
    label = j["name"] or j["model"] or " ".join(j["command"])[:20]
    return (f"{j['id']:>5} {label[:20]:<20} {(j['model'] or '-')[:14]:<14} {j['state']:<10} "
            f"{(j['role'] or '-'):<9} {j['demand']:>4} {gpus:<12} {steps:>12} "
            f"{j['suspensions']:>4}")


@main.command()
@click.option("--all", "show_all", is_flag=True, help="Also list finished jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print broker status and jobs as JSON.")
@click.pass_context
def status(ctx, show_all, as_json):
    """The queue, like squeue: state, role and GPUs of every job."""
    client = _client(ctx)
    broker = _call(client.get, "/v1/status")
    jobs = _call(client.get, "/v1/jobs")["jobs"]
    if as_json:
        _echo_json({"broker": broker, "jobs": jobs})
        return
    nodes = "; ".join(f"{n}: {len(v['free'])}/{len(v['gpus'])} GPUs free"
                      for n, v in broker["nodes"].items())
    click.echo(f"marbled {broker['pid']} policy={broker['policy']} profile={broker['profile']} "
               f"{nodes}" + (" DRAINING" if broker["draining"] else ""))
    click.echo(f"{'ID':>5} {'NAME':<20} {'MODEL':<14} {'STATE':<10} {'ROLE':<9} {'WANT':>4} "
               f"{'GPUS':<12} {'STEP':>12} {'SUSP':>4}")
    for j in jobs:
        if show_all or j["state"] not in FINAL:
            click.echo(_fmt_job(j))


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx, job_id, as_json):
    """One job with its runs (launch segments) and events."""
    job = _call(_client(ctx).get, f"/v1/jobs/{job_id}")
    if as_json:
        _echo_json(job)
        return
    for key in ("id", "name", "model", "steps", "state", "role", "node", "gpus", "demand",
                "gpus_request", "malleable", "step", "suspensions", "after", "command",
                "exit_code", "reason"):
        click.echo(f"{key + ':':<14}{job[key]}")
    click.echo("runs:")
    for r in job["runs"]:
        click.echo(f"  run {r['id']}: {r['role']} on {r['node']} GPUs {r['gpus']} steps "
                   f"{r['start_step']}->{r['end_step']} ended: {r['end_reason'] or 'running'}"
                   + (f" (exit {r['exit_code']})" if r["exit_code"] not in (None, 0) else ""))


@main.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@click.pass_context
def cancel(ctx, job_ids):
    """Cancel jobs: queued ones are dropped, running ones are stopped (SIGTERM, then SIGKILL)."""
    for job_id in job_ids:
        _call(_client(ctx).post, f"/v1/jobs/{job_id}/cancel")
        click.echo(f"cancel requested for job {job_id}")


@main.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@click.pass_context
def suspend(ctx, job_ids):
    """Checkpoint running jobs now; each resumes (on its optimal GPUs) when its turn comes.

    Only jobs with --gpus auto can be suspended; the job must speak the worker protocol.
    """
    for job_id in job_ids:
        _call(_client(ctx).post, f"/v1/jobs/{job_id}/suspend")
        click.echo(f"suspend requested for job {job_id}")


@main.command()
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Give up after this many seconds.")
@click.pass_context
def ready(ctx, timeout):
    """Wait until a broker answers on the state directory (after 'marbled &' in a script).

    Exit status: 0 once it answers, 1 if none does within --timeout.
    """
    client = _client(ctx)
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = client.get("/v1/status")
            break
        except (BrokerUnreachable, OSError) as exc:
            if time.monotonic() > deadline:
                raise click.ClickException(f"no broker answered within {timeout:g} s: {exc}") \
                    from None
            time.sleep(0.1)
    nodes = ", ".join(f"{n}: {len(v['gpus'])} GPUs" for n, v in status["nodes"].items())
    click.echo(f"marbled {status['pid']} ready ({nodes})")


@main.command()
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@click.option("--interval", type=float, default=1.0, show_default=True)
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the final jobs as JSON.")
@click.pass_context
def wait(ctx, timeout, interval, quiet, as_json):
    """Wait until every job has ended, showing progress.

    Exit status: 0 all jobs done, 1 some failed or were cancelled, 2 timed out.
    """
    client = _client(ctx)
    start = time.monotonic()
    tty = sys.stderr.isatty()
    last_line = 0.0
    while True:
        jobs = _call(client.get, "/v1/jobs")["jobs"]
        counts: dict[str, int] = {}
        for j in jobs:
            counts[j["state"]] = counts.get(j["state"], 0) + 1
        ended = sum(counts.get(s, 0) for s in FINAL)
        now = time.monotonic()
        if not quiet and (tty or now - last_line >= 10 or ended == len(jobs)):
            parts = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            line = f"[{now - start:6.1f}s] {ended}/{len(jobs)} ended  {parts}"
            click.echo(("\r" + line + "\033[K") if tty else line, err=True, nl=not tty)
            last_line = now
        if ended == len(jobs):
            if tty and not quiet:
                click.echo(err=True)
            if as_json:
                _echo_json({"jobs": jobs})
            ctx.exit(0 if counts.get("done", 0) == len(jobs) else 1)
        if timeout is not None and now - start > timeout:
            if tty and not quiet:
                click.echo(err=True)
            click.echo(f"timed out after {timeout:g} s with {len(jobs) - ended} jobs not ended",
                       err=True)
            ctx.exit(2)
        time.sleep(interval)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--width", type=click.IntRange(20, 400), default=64, show_default=True)
@click.pass_context
def schedule(ctx, as_json, width):
    """Who ran on which GPUs when, as primary or secondary (times in profiled seconds)."""
    client = _client(ctx)
    broker = _call(client.get, "/v1/status")
    runs = _call(client.get, "/v1/runs")
    jobs = {j["id"]: j for j in _call(client.get, "/v1/jobs")["jobs"]}
    t0 = min((r["started_at"] for r in runs["runs"]), default=runs["started_at"])
    rows = schedule_rows(runs["runs"], jobs, t0, broker["time_scale"])
    if as_json:
        _echo_json({"time_scale": broker["time_scale"], "runs": rows})
        return
    click.echo(format_table(rows))
    click.echo()
    click.echo(format_gantt(rows, {n: len(v["gpus"]) for n, v in broker["nodes"].items()}, width))


@main.command()
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for the stop.")
@click.option("--timeout", type=float, default=300.0, show_default=True)
@click.pass_context
def shutdown(ctx, no_wait, timeout):
    """Suspend every running job to its checkpoint and stop the broker.

    Nothing is lost: a marbled started later on the same state directory
    resumes the suspended jobs and runs the rest of the queue.
    """
    client = _client(ctx)
    pid = _call(client.get, "/v1/status")["pid"]
    _call(client.post, "/v1/shutdown")
    if no_wait:
        click.echo("shutdown started")
        return
    deadline = time.monotonic() + timeout
    # Over TCP the broker may be on another host: wait until it stops answering instead.
    while _answers(client) if ctx.obj["url"] else _process_exists(pid):
        if time.monotonic() > deadline:
            raise click.ClickException(f"marbled {pid} did not stop within {timeout:g} s")
        time.sleep(0.1)
    click.echo("marbled stopped")


def _answers(client: BrokerClient) -> bool:
    try:
        client.get("/v1/status")
    except (BrokerUnreachable, OSError):
        return False
    return True


def _process_exists(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped by its parent) has stopped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@main.command()
@click.option("--policy", "policies", multiple=True, type=click.Choice(sorted(POLICIES)),
              help="Policy to simulate; repeat to compare (docs/simulator.md says what "
                   "each does). [default: every policy]")
@click.option("--workload", type=click.Path(path_type=Path, dir_okay=False),
              help="A job-set YAML (all jobs at t=0), a CSV trace (see docs/traces.md), or "
                   "a name in workloads/ such as paper-jobset3.")
@click.option("--poisson", "poisson_jobs", type=click.IntRange(1), default=None,
              help="Instead of --workload: N synthetic jobs with Poisson arrivals.")
@click.option("--rate", type=click.FloatRange(min=1e-6), default=60.0, show_default=True,
              help="With --poisson: arrivals per hour.")
@click.option("--models", default="resnet-50,inception-v3,resnet-101,vgg-16", show_default=True,
              help="With --poisson: the models drawn, in equal shares (comma list).")
@click.option("--steps", "step_range", default="500-5000", show_default=True,
              help="With --poisson: each job's steps, drawn uniformly from LOW-HIGH.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --poisson: the random seed (the simulation itself is deterministic).")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help="Throughput curves: a name in profiles/ or a YAML path.")
@click.option("--nodes", type=click.IntRange(1, 100_000), default=1, show_default=True,
              help="Nodes in the simulated allocation, --gpus each.")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None,
              help="GPUs per node. [default: the profile's gpus_per_node]")
@click.option("--launch-overhead", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds from a launch to the first step (import, build, restore).")
@click.option("--suspend-overhead", type=click.FloatRange(min=0), default=0.0,
              show_default=True, help="Seconds from a suspension request to the exit.")
@click.option("--time-slice", type=click.FloatRange(min=0.01), default=600.0,
              show_default=True, help="For the timeslice policy: seconds per slice.")
@click.option("--preempt-guard", type=click.FloatRange(min=0), default=GUARD_S, show_default=True,
              help="For the malleable policy: reshape only runs with more than this many "
                   "seconds left.")
@click.option("--grow-after", type=click.FloatRange(min=0), default=STABLE_S, show_default=True,
              help="For the elastic policy: seconds a run lasts before its GPUs may double.")
@click.option("--gantt", type=click.Path(path_type=Path, dir_okay=False),
              help="Also draw the GPUs over time into this PNG (needs matplotlib).")
@click.option("--json", "as_json", is_flag=True)
def simulate(policies, workload, poisson_jobs, rate, models, step_range, seed, profile, nodes,
             gpus, launch_overhead, suspend_overhead, time_slice, preempt_guard, grow_after, gantt,
             as_json):
    """What would each policy do with a workload? A simulation on the profile's curves.

    Runs the same policy code as marbled on a virtual clock and prints, per
    policy: makespan, average job completion time and wait, GPU utilization,
    suspensions, the share of GPU-time lost to launch/suspend overheads, and the
    makespan against a lower bound no schedule can beat.

    \b
    Examples:
      marble simulate --workload paper-jobset3 --gantt jobset3.png
      marble simulate --poisson 1000 --rate 120 --nodes 4 --launch-overhead 5
      marble simulate --workload my-history.csv --nodes 8 --json
    """
    from marbled.core.policy import get_policy
    from marbled.sim.engine import Simulator
    from marbled.sim.report import comparison_table, gantt_png
    from marbled.sim.workloads import TraceError, from_job_file, poisson, read_trace

    if (workload is None) == (poisson_jobs is None):
        raise click.UsageError("give either --workload FILE or --poisson N")
    try:
        book = load_profile(profile)
        per_node = gpus or book.gpus_per_node
        if workload is not None:
            path = workload_path(str(workload))
            arrivals = read_trace(path) if path.suffix == ".csv" else from_job_file(path)
        else:
            mix = dict.fromkeys((m.strip() for m in models.split(",") if m.strip()), 1.0)
            unknown = [m for m in mix if book.lookup(m) is None]
            if not mix or unknown:
                raise click.BadParameter(f"{unknown or 'none given'}; the profile has "
                                         f"{', '.join(book.models)}", param_hint="--models")
            arrivals = poisson(poisson_jobs, rate, mix, _step_range(step_range), seed)
        results = [
            Simulator(book, get_policy(name, time_slice=time_slice, preempt_guard=preempt_guard,
                                       grow_after=grow_after), per_node, nodes, launch_overhead,
                      suspend_overhead).run(arrivals)
            for name in (policies or sorted(POLICIES))
        ]
    except (ProfileError, JobFileError, TraceError, SpecError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if gantt:
        gantt_png(results, gantt)
    if as_json:
        _echo_json({"nodes": nodes, "gpus_per_node": per_node, "profile": book.system,
                    "results": [r.summary() for r in results],
                    "gantt": str(gantt) if gantt else None})
        return
    click.echo(f"{len(arrivals)} jobs on {nodes} node(s) x {per_node} GPUs, profile "
               f"{book.system}, overheads: launch {launch_overhead:g} s, "
               f"suspend {suspend_overhead:g} s")
    click.echo(comparison_table(results))
    if gantt:
        click.echo(f"Gantt chart: {gantt}")


def _step_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        pair = int(low), int(high or low)
    except ValueError:
        pair = (0, 0)
    if not 1 <= pair[0] <= pair[1]:
        raise click.BadParameter(f"'{text}' is not LOW-HIGH with 1 <= LOW <= HIGH, e.g. "
                                 "500-5000", param_hint="--steps")
    return pair


@main.command()
@click.argument("database", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False),
              required=True, help="The CSV trace to write.")
def trace(database, output):
    """Turn a broker's marble.db into a CSV trace for `marble simulate --workload`.

    One row per job with a model and a step count, at its submission time
    relative to the first; jobs without them cannot be replayed and are counted.
    """
    from marbled.sim.workloads import TraceError, trace_from_store, write_trace

    try:
        arrivals, skipped = trace_from_store(database)
        write_trace(output, arrivals, comment=f"from {database.name}")
    except (TraceError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {len(arrivals)} jobs to {output}"
               + (f" ({skipped} without model or steps left out)" if skipped else ""))


@main.command()
@click.option("--gpus", default=6, show_default=True, help="Emulated GPUs on the node.")
@click.option("--time-scale", default=0.02, show_default=True,
              help="Real seconds per profiled second.")
@click.option("--jobset", default="paper-jobset1", show_default=True,
              help="A job-set name in workloads/ or a YAML path.")
@click.option("--json", "as_json", is_flag=True)
def demo(gpus, time_scale, jobset, as_json):
    """Run a paper job set the MARBLE way and the LSF way on emulated GPUs and compare."""
    from marbled.demo import run_demo

    sys.exit(run_demo(gpus=gpus, time_scale=time_scale, jobset=jobset, as_json=as_json))


if __name__ == "__main__":
    main()
