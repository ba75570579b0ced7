"""`marble submit`'s quick path (`marbled/cli/quick_submit.py`) reads an argument list as
click's command does, or leaves it to click: never a job that click would have read
otherwise or refused. Argument lists are drawn from the options of both, values that click
converts or refuses, words, `--` and options neither knows."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.cli.client_cmd import main
from marbled.cli.quick_submit import DEFAULTS, GLOBAL, QUICK, NotHere, parse

pytestmark = pytest.mark.core

VALUES = ["1", "2", "auto", "-1", " 3", "1_0", "0x1", "5.0", "", "=", "x", "--", "-",
          "--gpus", "--emulate", "-h", "1-2", "101", "100", "resnet-50", "a=b", "ALL",
          "NONE", "\u0663"]  # an Arabic-Indic three: int() takes it, as click does
WORDS = ["python", "train.py", "-", "true", "submit", "--", "--lr", "-x", "3"]
OTHERS = ["--file", "--chdir", "--wait", "--help", "-h", "--gpu", "--json=1", "--emulate=1",
          "--steps=4", "--after=a", "--model=", "--state-dir"]

token = st.one_of(
    st.sampled_from(sorted(QUICK)).flatmap(
        lambda o: st.just([o]) if QUICK[o][1] == "flag" else
        st.tuples(st.just(o), st.sampled_from(VALUES)).map(list)),
    st.sampled_from(WORDS).map(lambda w: [w]),
    st.sampled_from(OTHERS).map(lambda w: [w]),
    st.sampled_from(VALUES).map(lambda v: [v]))
top = st.lists(st.sampled_from([["--json"], ["--state-dir", "s"], ["--url", "http://h:1"],
                                ["--state-dir=t"], ["--help"]]), max_size=2)


def by_click(argv: list[str]) -> tuple[dict, dict] | None:
    """What click's `marble` makes of ARGV, run as `marble` runs it with submit's callback
    recording its parameters instead of submitting: its own parameters and submit's; None
    if click refuses it, prints help, or runs another command."""
    submit = main.get_command(None, "submit")
    seen = []
    callback, submit.callback = submit.callback, lambda **params: seen.append(params)
    try:
        main.main(list(argv), prog_name="marble", standalone_mode=False)
    except (click.exceptions.ClickException, click.exceptions.Exit):
        return None
    finally:
        submit.callback = callback
    return (main.seen_top, seen[0]) if seen else None


def by_quick(argv: list[str]) -> tuple[dict, dict] | None:
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


@settings(max_examples=3000)
@given(top, st.lists(token, max_size=6))
def test_the_quick_path_reads_what_click_reads_or_leaves_it(before, after):
    argv = [t for ts in before for t in ts] + ["submit"] + [t for ts in after for t in ts]
    quick, clicks = by_quick(argv), by_click(argv)
    if quick is None:
        return  # click's command handles it, as it did before the quick path
    assert clicks is not None, f"click refuses {argv}, the quick path took it as {quick}"
    (q_top, q_sub), (c_top, c_sub) = quick, clicks
    assert {**q_top, "state_dir": q_top["state_dir"] and Path(q_top["state_dir"])} == \
        {k: c_top[k] for k in ("state_dir", "url", "as_json")}, argv
    assert q_sub == {k: c_sub[k] for k in q_sub}, argv
    # what the quick path does not handle is at click's default
    assert {k: c_sub[k] for k in c_sub.keys() - q_sub.keys()} == \
        {"job_file": None, "chdir": None, "wait": False}, argv


@pytest.mark.parametrize("argv", [
    ["submit", "--gpus", "1", "--", "true"],
    ["submit", "--model", "resnet-50", "--steps", "800", "--", "python", "train.py",
     "--lr", "0.1"],
    ["--json", "submit", "--gpus=2", "--nodes", "1-2", "--per-gpu", "--retries", "3",
     "--after", "a", "--after", "7", "--name", "b", "--export", "NONE,X=1", "--json",
     "python", "t.py"],
    ["--state-dir", "here", "submit", "--emulate", "--model", "resnet-50", "--new-model"],
])
def test_the_everyday_forms_take_the_quick_path(argv):
    """Each option the quick path declares is read there, not left to click."""
    quick = by_quick(argv)
    assert quick is not None and quick == by_quick(argv)
    assert {k: quick[1][k] for k in quick[1]} == {k: v for k, v in by_click(argv)[1].items()
                                                  if k in quick[1]}


def test_the_tables_follow_the_click_command():
    """Every option the quick path reads is the click command's, with its parameter, kind
    and default: an option changed in one and not the other fails here."""
    submit = main.get_command(None, "submit")
    options = {o: p for p in submit.params for o in p.opts}
    for option, (name, kind) in QUICK.items():
        param = options[option]
        assert param.name == name
        assert (kind == "flag") == param.is_flag and (kind == "multiple") == param.multiple
        if kind is int:
            assert isinstance(param.type, click.types.IntParamType)
    assert by_click(["submit"])[1] == {**DEFAULTS, "job_file": None, "chdir": None,
                                       "wait": False}
    group = {o: p for p in main.params for o in p.opts}
    for option, (name, _) in GLOBAL.items():
        assert group[option].name == name
