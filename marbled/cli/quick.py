"""`marble submit`, `status`, `logs` and `cancel` without importing click: the everyday
forms that batch scripts and shell loops run thousands of times, where click's import alone
is half of the call (40-57 of 80 ms on a 2-core machine; issue "a broker that is never the
bottleneck").

Only the common options are handled here (`COMMANDS`, and the group's `GLOBAL`), and only
an outcome to print. Anything else goes to the click command (`jobs.submit`, `jobs.status`,
`logs.logs`, `jobs.cancel`), which handles every form, prints the help, and says every
error as it always did: an option or form not handled here (`logs -f`, `cancel --all`), a
value click would refuse or convert otherwise, an `--export` that needs saying why, a
broker that does not answer (`status` and `logs` then read a stopped broker's records), a
job name no job has, and a refusal of a submission, which the click command sends again
with the same Idempotency-Key, so that it can never make a second job. Once `logs` has
printed, an error is said here, as click's command says it; so is `cancel`'s, whose
refusals are its output. `tests/core/test_quick.py` checks that this parser reads every
argument list as click does."""

from __future__ import annotations

import os
import sys

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable
from marbled.cli.common import NoToken, broker_at, named_id, print_json, say_error
from marbled.cli.status_view import STATUS_LIMIT, status_doc, status_lines

FLAG, MULTIPLE = "flag", "multiple"  # kinds of option besides a value's type (int, str)

# Each command's options handled here: option -> (its parameter, its kind); the parameters'
# defaults; the bounds of its whole numbers (click.IntRange's, None: unbounded); the
# parameter its words (arguments) go to, with their fewest and most (None: no limit; a
# parameter of at most one word takes the word itself)
COMMANDS = {
    "submit": ({"--model": ("model", str), "--steps": ("steps", int), "--gpus": ("gpus", str),
                "--nodes": ("nodes", str), "--per-gpu": ("per_gpu", FLAG),
                "--retries": ("retries", int), "--after": ("after", MULTIPLE),
                "--name": ("name", str), "--emulate": ("emulate", FLAG),
                "--new-model": ("new_model", FLAG), "--export": ("export", str),
                "--json": ("as_json", FLAG)},
               {"model": None, "steps": None, "gpus": "auto", "nodes": None, "per_gpu": False,
                "retries": None, "after": (), "name": None, "emulate": False,
                "new_model": False, "export": "ALL", "as_json": False, "command": ()},
               {"retries": (0, 100)}, ("command", 0, None)),
    "status": ({"--all": ("show_all", FLAG), "--limit": ("limit", int),
                "--json": ("as_json", FLAG)},
               {"show_all": False, "limit": STATUS_LIMIT, "as_json": False},
               {"limit": (0, None)}, (None, 0, 0)),
    "logs": ({"--stderr": ("stderr", FLAG), "--run": ("run_id", int),
              "--all-runs": ("all_runs", FLAG), "--rank": ("rank", int), "-n": ("lines", int),
              "--tail": ("lines", int), "--json": ("as_json", FLAG)},
             {"stderr": False, "run_id": None, "all_runs": False, "rank": None, "lines": None,
              "as_json": False, "ref": None},
             {"run_id": (1, None), "rank": (0, None), "lines": (1, None)}, ("ref", 1, 1)),
    "cancel": ({"--json": ("as_json", FLAG)}, {"as_json": False, "jobs": ()}, {},
               ("jobs", 1, None)),
}
# `marble`'s own options (before the command's name)
GLOBAL = {"--state-dir": ("state_dir", str), "--url": ("url", str), "--json": ("as_json", FLAG)}

# The Idempotency-Key of the submission this process sent already, which the broker
# refused: the click command sends it again with this key, and says the refusal
SENT_KEY: str | None = None


class NotHere(Exception):
    """This argument list, or this outcome, is for the click command."""


def run(argv: list[str]) -> int:
    """Run `marble ARGV` as the click command would, print what it prints, and give its
    exit status; or NotHere (with SENT_KEY set if a submission was refused)."""
    name, top, params = parse(argv)
    return {"submit": _submit, "status": _status, "logs": _logs, "cancel": _cancel}[name](
        top, params)


def parse(argv: list[str]) -> tuple[str, dict, dict]:
    """`marble ARGV`'s command, its own options and the command's parameters (click's
    names, defaults filled in), or NotHere."""
    top: dict = {"state_dir": None, "url": None, "as_json": False}
    rest = _options(argv, GLOBAL, top, stop_at_word=True)
    if not rest or rest[0] not in COMMANDS:
        raise NotHere("another command")
    table, defaults, bounds, (argument, fewest, most) = COMMANDS[rest[0]]
    params = dict(defaults)
    words = tuple(_options(rest[1:], table, params, stop_at_word=False))
    if len(words) < fewest or most is not None and len(words) > most:
        raise NotHere("arguments")  # click: "Got unexpected extra argument", or "Missing"
    if argument:
        params[argument] = words[0] if most == 1 else words
    for name, (low, high) in bounds.items():
        value = params[name]
        if value is not None and (value < low or high is not None and value > high):
            raise NotHere(name)
    return rest[0], top, params


def _options(args: list[str], table: dict, params: dict, stop_at_word: bool) -> list[str]:
    """Read `args` into `params` by `table`, as click's parser does: `--opt value` and
    `--opt=value`, words between options (`stop_at_word`: the first word ends the options,
    as a group's command name does), everything after `--` a word. The words, in order."""
    words: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            return words + args[i:]
        if not arg.startswith("-") or arg == "-":
            words.append(arg)
            if stop_at_word:
                return words + args[i:]
            continue
        # `--opt=value`; a short option's `=` is its value's, as click reads `-n=3`
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in table:
            raise NotHere(arg)  # -h, --help, an option not handled here, or an unknown one
        param, kind = table[name]
        if kind == FLAG:
            if eq:
                raise NotHere(arg)  # click refuses a value given to a flag
            params[param] = True
            continue
        if not eq:
            if i == len(args):
                raise NotHere(arg)  # click: "requires an argument"
            value = args[i]
            i += 1
        if kind == MULTIPLE:
            params[param] = (*params.get(param, ()), value)
        else:
            params[param] = _typed(value, kind)
    return words


def _typed(value: str, kind) -> object:
    if kind is int:
        try:
            return int(value)  # as click.INT, which is int() too
        except ValueError:
            raise NotHere(value) from None
    return value


def _broker(top: dict) -> BrokerClient:
    """common.client's broker, from `marble`'s options read as click reads them with their
    variables: an option given (even empty) wins, an empty variable is unset."""
    from pathlib import Path

    from marbled.paths import default_state_dir

    state_dir, url = (top[k] if top[k] is not None else os.environ.get(var) or None
                      for k, var in (("state_dir", "MARBLE_STATE_DIR"), ("url", "MARBLE_URL")))
    try:
        return broker_at((Path(state_dir) if state_dir is not None
                          else default_state_dir()).absolute(), url)
    except NoToken:
        raise NotHere("no token") from None  # click's command says what to do


# ------------------------------------------------------------ marble status


def _status(top: dict, params: dict) -> int:
    """Read-only: any failure (no broker answers, a refusal) goes to the click command,
    which asks again, reads a stopped broker's records, or says the error."""
    try:
        doc = status_doc(_broker(top), params["show_all"], params["limit"])
    except (ApiError, BrokerUnreachable, OSError):
        raise NotHere("status") from None
    if params["as_json"] or top["as_json"]:
        return print_json(doc)
    print("\n".join(status_lines(doc, params["show_all"])), flush=True)
    return 0


# ------------------------------------------------------------ marble cancel


def _cancel(top: dict, params: dict) -> int:
    """Each job asked in turn (asks.py): what each refusal says is printed as click's
    command prints it; a broker that stops answering is said as click says it."""
    from marbled.cli.asks import ask, ask_lines

    try:
        doc = ask(_broker(top), list(params["jobs"]), "cancel")
    except BrokerUnreachable as exc:
        return say_error(exc)
    if params["as_json"] or top["as_json"]:
        print_json(doc)
    else:
        for line, to_stderr in ask_lines(doc, "cancel", summary_only=False):
            print(line, file=sys.stderr if to_stderr else sys.stdout, flush=True)
    return 1 if doc["failed"] else 0


# ------------------------------------------------------------ marble logs


def _logs(top: dict, params: dict) -> int:
    """Read-only: a failure before anything is printed goes to the click command (a
    stopped broker's records, a name no job has, a refusal said as it says it); after, it
    is said here as click's command says it."""
    from marbled.cli.log_pages import Printer, quiet_pipe, show

    p = params
    if p["run_id"] is not None and p["all_runs"]:
        raise NotHere("--run and --all-runs")
    as_json = p["as_json"] or top["as_json"]
    printer = None if as_json else Printer(headers=p["all_runs"])
    api = _broker(top)
    try:
        job = named_id(api, p["ref"])
        if job is None:
            raise NotHere("no such name")
        doc = show(api, job, "stderr" if p["stderr"] else "stdout", p["run_id"],
                   p["all_runs"], p["rank"], p["lines"], printer)
        return print_json(doc) if as_json else 0
    except BrokenPipeError:  # `marble logs 5 | head`, as click's command takes it
        quiet_pipe()
        return 0
    except (ApiError, BrokerUnreachable, OSError) as exc:
        if printer is None or not printer.printed:
            raise NotHere("logs") from None
        if isinstance(exc, OSError):
            raise  # as out of click's command
        return say_error(exc)


# ------------------------------------------------------------ marble submit


def _submit(top: dict, params: dict) -> int:
    global SENT_KEY
    from marbled.core.environment import Environment
    from marbled.core.errors import SpecError

    if not params["command"] and not params["emulate"]:
        raise NotHere("no command")
    try:
        shared = Environment.from_mapping(params["export"], environ=os.environ)
    except SpecError:
        raise NotHere("--export") from None
    api = _broker(top)
    key = os.urandom(16).hex()
    try:
        result = api.submit({"jobs": [job_doc(params)], **shared.to_mapping()}, key=key,
                            on_retry=lambda said: print(f"marble submit: {said}",
                                                        file=sys.stderr, flush=True))
    except ApiError:
        SENT_KEY = key  # the click command sends it again and says the refusal as always
        raise NotHere("refused") from None
    except BrokerUnreachable as exc:  # as click says a ClickException (common.call)
        return say_error(exc)
    if params["as_json"] or top["as_json"]:
        return print_json(result)
    for job in result["jobs"]:
        print(submitted_line(job), flush=True)
        for line in note_lines(job, from_file=False):
            print(line, file=sys.stderr, flush=True)
    return 0


def job_doc(params: dict, chdir: str | None = None) -> dict:
    """The one job's document, as typed (an option not given left out): the broker checks
    it, as any job's (JobSpec.from_mapping)."""
    p = params
    doc = {"command": list(p["command"]), "emulate": p["emulate"], "model": p["model"],
           "steps": p["steps"], "gpus": _number(p["gpus"]),
           "after": [_number(a) for a in p["after"]], "name": p["name"],
           "nodes": _number(p["nodes"]), "retries": p["retries"],
           "chdir": os.path.normpath(chdir or os.getcwd()), "new_model": p["new_model"],
           "per_gpu": p["per_gpu"]}
    return {k: v for k, v in doc.items() if v is not None and v is not False and v != []}


def _number(text: str | None) -> int | str | None:
    """An option's value as the API takes it: a whole number as one ('2'), else as typed
    ('auto', '1-2'), for the broker to take or refuse."""
    return int(text) if text and text.isascii() and text.isdigit() else text


def note_lines(job: dict, from_file: bool) -> list[str]:
    """The broker's notes on a submitted job (did you mean ...?), for stderr."""
    say = "'new_model: true'" if from_file else "--new-model"
    return [f"note: job {job['id']}: {note} (say {say} if you mean it)"
            for note in job.get("notes", ())]


def submitted_line(job: dict) -> str:
    from marbled.core.shapes import shape_text

    how = "auto" if job["malleable"] else "fixed"
    shape = shape_text(job["demand"], job.get("nodes") or 1, job.get("nodes_min"),
                       bool(job.get("per_gpu")))
    return (f"submitted job {job['id']}" + (f" ({job['name']})" if job["name"] else "")
            + f": {shape} ({how}" + (", one process per GPU)" if job.get("per_gpu") else ")"))
