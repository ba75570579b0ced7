"""`marble submit`'s and `status`'s quick path (`marbled/cli/quick.py`) reads an argument
list as click's command does, or leaves it to click: never a job, or a listing, that click
would have read otherwise or refused. Argument lists are drawn from the options of both,
values that click converts or refuses, words, `--` and options neither knows."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.cli.client_cmd import main
from marbled.cli.quick import COMMANDS, GLOBAL, NotHere, parse

pytestmark = pytest.mark.core

VALUES = ["1", "2", "0", "auto", "-1", " 3", "1_0", "0x1", "5.0", "", "=", "x", "--", "-",
          "--gpus", "--emulate", "-h", "1-2", "101", "100", "resnet-50", "a=b", "ALL",
          "NONE", "\u0663"]  # an Arabic-Indic three: int() takes it, as click does
WORDS = ["python", "train.py", "-", "true", "submit", "status", "logs", "cancel", "--", "--lr",
         "-x", "3", "job-a"]
OTHERS = ["--file", "--chdir", "--wait", "--help", "-h", "--gpu", "--json=1", "--emulate=1",
          "--all=1", "--steps=4", "--limit=2", "--after=a", "--model=", "--state-dir", "-f",
          "--follow", "--interval", "-n3", "-n=3", "--tail=2", "--run=0", "--rank=1", "--state",
          "--state=queued"]
# the click command's parameters that the quick path leaves to it, at their defaults
LEFT = {"submit": {"job_file": None, "chdir": None, "wait": False}, "status": {},
        "logs": {"following": False, "interval": 0.5}, "cancel": {"every": False, "states": ()}}
REQUIRED = {"submit": {"command": ("x",)}, "status": {}, "logs": {"ref": "x"},  # as "x" gives
            "cancel": {"jobs": ("x",)}}


def tokens(command: str):
    table = COMMANDS[command][0]
    return st.one_of(
        st.sampled_from(sorted(table)).flatmap(
            lambda o: st.just([o]) if table[o][1] == "flag" else
            st.tuples(st.just(o), st.sampled_from(VALUES)).map(list)),
        st.sampled_from(WORDS).map(lambda w: [w]),
        st.sampled_from(OTHERS).map(lambda w: [w]),
        st.sampled_from(VALUES).map(lambda v: [v]))


top = st.lists(st.sampled_from([["--json"], ["--state-dir", "s"], ["--url", "http://h:1"],
                                ["--state-dir=t"], ["--help"], ["--state-dir", ""],
                                ["--url="]]), max_size=2)
argvs = st.sampled_from(sorted(COMMANDS)).flatmap(
    lambda name: st.tuples(top, st.just(name), st.lists(tokens(name), max_size=6))).map(
    lambda t: [x for ts in t[0] for x in ts] + [t[1]] + [x for ts in t[2] for x in ts])


def by_click(argv: list[str]) -> tuple[str, dict, dict] | None:
    """What click's `marble` makes of ARGV, run as `marble` runs it with each command's
    callback recording its parameters instead of running: the command, `marble`'s own
    parameters and the command's; None if click refuses it or prints help."""
    seen: list = []
    saved = {}
    for name in COMMANDS:
        command = main.get_command(None, name)
        saved[name] = command.callback
        command.callback = lambda n=name, **params: seen.append((n, params))
    try:
        main.main(list(argv), prog_name="marble", standalone_mode=False)
    except (click.exceptions.ClickException, click.exceptions.Exit):
        return None
    finally:
        for name, callback in saved.items():
            main.get_command(None, name).callback = callback
    return (seen[0][0], main.seen_top, seen[0][1]) if seen else None


def by_quick(argv: list[str]) -> tuple[str, dict, dict] | None:
    try:
        return parse(list(argv))
    except NotHere:
        return None


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    for name in ("MARBLE_STATE_DIR", "MARBLE_URL", "MARBLE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # the group's parameters as its callback gets them
    group = main.callback
    monkeypatch.setattr(main, "callback", lambda **top: (setattr(main, "seen_top", top),
                                                          group(**top)))


@settings(max_examples=1500, deadline=None)  # a loaded CI machine: no per-example limit
@given(argvs)
def test_the_quick_path_reads_what_click_reads_or_leaves_it(argv):
    quick, clicks = by_quick(argv), by_click(argv)
    if quick is None:
        return  # click's command handles it, as it did before the quick path
    assert clicks is not None, f"click refuses {argv}, the quick path took it as {quick}"
    (q_name, q_top, q_params), (c_name, c_top, c_params) = quick, clicks
    assert q_name == c_name, argv
    given = q_top["state_dir"]
    assert {**q_top, "state_dir": None if given is None else Path(given)} == c_top, argv
    assert q_params == {k: c_params[k] for k in q_params}, argv
    assert {k: c_params[k] for k in c_params.keys() - q_params.keys()} == LEFT[q_name], argv


@pytest.mark.parametrize("argv", [
    ["submit", "--gpus", "1", "--", "true"],
    ["submit", "--model", "resnet-50", "--steps", "800", "--", "python", "train.py",
     "--lr", "0.1"],
    ["--json", "submit", "--gpus=2", "--nodes", "1-2", "--per-gpu", "--retries", "3",
     "--after", "a", "--after", "7", "--name", "b", "--export", "NONE,X=1", "--json",
     "python", "t.py"],
    ["--state-dir", "here", "submit", "--emulate", "--model", "resnet-50", "--new-model"],
    ["status"], ["status", "--all", "--limit", "0", "--json"], ["--json", "status", "--limit=3"],
    ["logs", "5"], ["logs", "--stderr", "-n", "20", "job-a"], ["--json", "logs", "--run=2", "3"],
    ["logs", "--all-runs", "--tail", "3", "--rank", "0", "--json", "4"],
    ["cancel", "3"], ["cancel", "--json", "3", "job-a", "7"],
])
def test_the_everyday_forms_take_the_quick_path(argv):
    """Each option the quick path declares is read there, not left to click."""
    quick = by_quick(argv)
    assert quick is not None
    assert quick[2] == {k: v for k, v in by_click(argv)[2].items() if k in quick[2]}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_tables_follow_the_click_commands(name):
    """Every option the quick path reads is the click command's, with its parameter, kind,
    default and bounds: an option changed in one and not the other fails here."""
    table, defaults, bounds, _ = COMMANDS[name]
    options = {o: p for p in main.get_command(None, name).params for o in p.opts}
    for option, (param_name, kind) in table.items():
        param = options[option]
        assert param.name == param_name
        assert (kind == "flag") == param.is_flag and (kind == "multiple") == param.multiple
        if kind is int:
            assert isinstance(param.type, click.types.IntParamType)
            low, high = bounds.get(param_name, (None, None))
            assert (getattr(param.type, "min", None), getattr(param.type, "max", None)) == \
                (low, high)
    assert by_click([name] + (["x"] if REQUIRED[name] else []))[2] == \
        {**defaults, **LEFT[name], **REQUIRED[name]}
    group = {o: p for p in main.params for o in p.opts}
    for option, (param_name, _) in GLOBAL.items():
        assert group[option].name == param_name


@pytest.mark.parametrize("state_dir", [None, "", "here"])
@pytest.mark.parametrize("url", [None, "", "http://h:7"])
@pytest.mark.parametrize("environ", [{}, {"MARBLE_STATE_DIR": "", "MARBLE_URL": ""},
                                     {"MARBLE_STATE_DIR": "env", "MARBLE_URL": "http://e:8"}])
def test_the_broker_is_found_where_click_finds_it(monkeypatch, state_dir, url, environ):
    """The options and MARBLE_STATE_DIR / MARBLE_URL, given, empty or absent: the quick
    path talks to the broker that click's command talks to (common.client)."""
    from marbled.cli.common import client
    from marbled.cli.quick import _broker

    monkeypatch.setenv("MARBLE_TOKEN", "t")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    argv = [*(["--state-dir", state_dir] if state_dir is not None else []),
            *(["--url", url] if url is not None else []), "status"]
    with main.make_context("marble", list(argv)) as ctx:
        ctx.invoke(main.callback, **ctx.params)
        clicks = client(ctx)
    quick = _broker(parse(argv)[1])
    assert (quick.where, quick.token if quick.url else None) == \
        (clicks.where, clicks.token if clicks.url else None)
