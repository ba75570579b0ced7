"""`marble logs`: a job's output, run by run, and following it to the job's end.

Each run of a job (a launch segment: a job suspended and resumed has several) writes
its own STATE_DIR/jobs/<id>/run-<run>.stdout.log and .stderr.log; the broker serves them
a page at a time (GET /v1/jobs/{id}/log), and this command reads them from there, so it
works as well from another node (--url) as on the broker's. Once the broker has stopped,
the same pages come from the state directory (`offline_api.py`). The reading and
printing are `log_pages.py`'s."""

from __future__ import annotations

import click

from marbled.cli.common import call, job_id, json_option, output, reader
from marbled.cli.log_pages import Printer, follow, quiet_pipe, show


@click.command()
@click.argument("ref", metavar="JOB")
@click.option("-f", "--follow", "following", is_flag=True,
              help="Keep printing as the job writes, through its suspensions and resumes "
                   "(each new run's output under its header), until the job ends.")
@click.option("--stderr", is_flag=True, help="The job's stderr instead of its stdout.")
@click.option("--run", "run_id", type=click.IntRange(1), metavar="RUN",
              help="This run's output (a run id, as `marble show` lists them) instead of "
                   "the latest run's.")
@click.option("--all-runs", is_flag=True,
              help="Every run's output in turn, each under a header line.")
@click.option("--rank", type=click.IntRange(0), metavar="N",
              help="A per-GPU job (--per-gpu): only rank N's lines, without their "
                   "'[rank N] ' prefix (under Slurm, srun's 'N: ' label).")
@click.option("-n", "--tail", "lines", type=click.IntRange(1), metavar="N",
              help="Only the last N lines (of each run shown). [default: all]")
@click.option("--interval", type=click.FloatRange(0.05), default=0.5, show_default=True,
              help="With -f: seconds between looks for new output.")
@json_option
@click.pass_context
def logs(ctx, ref, following, stderr, run_id, all_runs, rank, lines, interval, as_json):
    """A job's output (JOB: its id or name): its latest run's stdout, or --stderr,
    --run RUN, --all-runs, --rank N.

    \b
      marble logs 5                  what job 5's latest run printed
      marble logs 5 -f               ... and on, through suspensions, until it ends
      marble logs 5 --all-runs -n 20 the last 20 lines of every run, with headers
      marble logs 5 --stderr         why it failed, often
      marble logs 5 --rank 1         rank 1's lines of a per-GPU job

    A job runs anew after each suspension (a run): each run's output is kept
    apart, under STATE_DIR/jobs/<id>/run-<run>.stdout.log and .stderr.log.
    With -f or --all-runs each run's output follows a header line such as
    '== run 17 (job 5): secondary, 2 GPUs on node0, steps 120 -> 240, suspended =='.

    Exit status: 0; with -f, once the job has ended: 0 done, 1 failed or
    cancelled (as `marble wait`).
    """
    if run_id is not None and all_runs:
        raise click.UsageError("give --run RUN or --all-runs, not both")
    as_json = as_json or (ctx.find_root().obj or {}).get("json")
    if following and as_json:
        raise click.UsageError("-f prints text as it comes; leave out --json")
    api = reader(ctx)  # a stopped broker's records when none answers
    job = job_id(api, ref)
    stream = "stderr" if stderr else "stdout"
    printer = Printer(headers=following or all_runs)
    try:
        if following:
            state = call(follow, api, job, stream, run_id, lines, interval, printer, all_runs,
                         rank)
            ctx.exit(0 if state == "done" else 1)
        doc = call(show, api, job, stream, run_id, all_runs, rank, lines,
                   None if as_json else printer)
        if as_json:
            output(ctx, True, doc, lambda: None)
    except BrokenPipeError:
        quiet_pipe()
        ctx.exit(0)


COMMANDS = (logs,)
