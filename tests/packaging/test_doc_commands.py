"""Every `marble`/`marbled` command line the docs show (docs/*.md, README.md, in fenced
```sh / ```console / ``` blocks) does what the docs say.

- Each one is parsed by click without being run (`make_context`): an option or argument
  the CLI does not have fails here, for commands that cannot run here too.
- `marble NAME --help` exits 0 for every subcommand the docs name, inline ones included.
- Those that can run here are run, in a temporary directory, against a real broker on 6
  emulated GPUs (train.py there is an emulated training job that speaks the protocol;
  jobs.yaml is paper job set 3; marble.db and marble-state are the broker's). They must
  exit 0, and where the doc shows the output, its words and column headers must be in
  the real output (the numbers, names and rows of the doc's own session aside).
- The rest are in SKIP, each with the reason; every SKIP entry must match a command.

A failure names the doc file and line. `pytest -s` prints the counts.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from marbled.cli.client_cmd import main as marble_cli
from marbled.cli.daemon_cmd import main as marbled_cli
from marbled.resources import DATA, load_job_file, load_profile, workload_path
from tests import REPO
from tests.conftest import start_daemon

pytestmark = [pytest.mark.packaging, pytest.mark.daemon]

DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
SHELL_BLOCKS = {"", "sh", "bash", "console", "shell", "text"}
COMMAND = re.compile(r"(marble\s+[a-z][\w-]*|marbled(\s+-|\s*$))")

# Commands that are not run here, with why (a regex on the command line). Each is still
# parsed by click. Keep it short: every entry must match at least one documented command.
SKIP = [
    (r"^marbled\b", "starts a long-running broker (detached, or in the foreground, on the "
                    "node's GPUs): this test starts its own, on emulated GPUs"),
    (r"^marble profile\b", "times a real training script on the node's GPUs"),
    (r"^marble report --slurm\b", "reads Slurm's accounting (sacct)"),
    (r"train_(tf|torch|ddp)\.py|torchrun",
     "real TensorFlow/PyTorch training, minutes on this machine's CPUs"),
    (r"--poisson 1000\b", "a 1000-job simulation: about 25 s here, over this test's budget"),
    (r"^marble logs 5 --(run 17|rank 1)\b",
     "the doc's own session: run 17 of job 5, job 5 a per-GPU job"),
]
# The paths of the doc's session -> the test's files.
PLACES = {"~/.local/state/marble/<allocation id>/marble.db": "marble.db"}
BROKER = ("--listen", "127.0.0.1:0")  # a TCP listener too, for `marble dashboard`
SCALE = 0.005  # 1 profiled second = 5 ms
# The order the commands run in: queue jobs, look at them while they run, wait, read
# logs, stop the broker, then what reads the records it left.
STAGES = {"submit": 1, "status": 2, "show": 2, "schedule": 2, "explain": 2, "curves": 2,
          "dashboard": 2, "wait": 3, "logs": 4, "example": 4, "cancel": 4, "shutdown": 5,
          "report": 6, "trace": 6, "simulate": 7}
TRAIN_PY = """\
import os
from marbled.resources import load_profile
from marbled.worker.emulate import main
# The docs' `python train.py ...`: an emulated job of its model (an unknown one as
# resnet-50), at the test broker's speed; without --steps, 300 steps.
if os.environ.get("MARBLE_MODEL") not in load_profile().models:
    os.environ["MARBLE_MODEL"] = "resnet-50"
os.environ["MARBLE_TIME_SCALE"] = "{scale}"
os.environ.setdefault("MARBLE_TARGET_STEPS", "300")
main([])
"""


@dataclass
class Example:
    doc: Path
    line: int
    text: str  # the command as the doc writes it (comment and continuations included)
    output: list[str] = field(default_factory=list)  # what the doc shows it print
    env: dict[str, str] = field(default_factory=dict)  # the `$ export`s before it

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    @property
    def shell(self) -> str:
        text = self.text
        for doc, here in PLACES.items():
            text = text.replace(doc, here)
        return text

    @property
    def argv(self) -> list[str]:
        """The command's words up to a shell operator (> | ;), without the doc's `...`
        for elided options (after `--` they are the training command's)."""
        text = re.sub(r"<\w[\w ]*\w>", "PLACEHOLDER", self.shell)
        lex = shlex.shlex(text, posix=True, punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        words: list[str] = []
        for word in lex:
            if word and set(word) <= set("();<>|&"):
                break
            if word == "..." and "--" not in words:
                continue
            words.append(word)
        return words

    @property
    def skip(self) -> str | None:
        return next((why for pattern, why in SKIP if re.search(pattern, self.shell)), None)

    @property
    def stage(self) -> int:
        argv = self.argv
        if argv[:3] == ["marble", "status", "--all"]:
            return 6  # the records of a broker that has stopped
        return STAGES.get(argv[1], 4) if len(argv) > 1 else 4


def examples() -> list[Example]:
    found: list[Example] = []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        fence = None
        block: list[tuple[int, str]] = []
        for number, line in enumerate(lines, 1):
            opened = re.match(r"\s*```\s*([\w-]*)", line)
            if opened and fence is None:
                fence, block = opened.group(1), []
            elif opened:
                if fence in SHELL_BLOCKS:
                    found += _block(doc, block)
                fence = None
            elif fence is not None:
                block.append((number, line))
    return found


def _block(doc: Path, block: list[tuple[int, str]]) -> list[Example]:
    """A block with `$ ` prompts: each prompt's command and the lines it prints; without:
    every line that is a marble or marbled command (log lines and the like are not)."""
    prompts = any(line.lstrip().startswith("$ ") for _, line in block)
    out: list[Example] = []
    exports: dict[str, str] = {}
    current: Example | None = None
    pending = ""
    for number, line in block:
        text = line.strip()
        if pending:
            pending = pending[:-1] + " " + text
            if not pending.endswith("\\"):
                current.text, pending = pending, ""
            continue
        if prompts and not text.startswith("$ "):
            if current is not None:
                current.output.append(line)
            continue
        text = text[2:] if prompts else text
        current = None
        export = re.fullmatch(r"export (\w+)=(\S*)", text)
        if export:
            exports[export.group(1)] = export.group(2)
        elif COMMAND.match(text):
            current = Example(doc, number, text, env=dict(exports))
            out.append(current)
            if text.endswith("\\"):
                pending = text
    return out


# ------------------------------------------------------------------ parsing

def _parse(argv: list[str]) -> str | None:
    """None where click accepts the command line (options, arguments, their types), else
    its complaint. A file the command would read need not exist here."""
    try:
        if argv[0] == "marbled":
            marbled_cli.make_context("marbled", argv[1:], resilient_parsing=False)
            return None
        command, ctx = marble_cli, marble_cli.make_context("marble", argv[1:])
        while isinstance(command, click.Group):
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            name, command, rest = command.resolve_command(ctx, rest)
            ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
    except click.exceptions.Exit:
        return None  # --help
    except click.BadParameter as exc:
        message = exc.format_message()
        return None if "does not exist" in message else message
    except click.ClickException as exc:
        return exc.format_message()
    return None


def test_every_documented_command_line_parses():
    found = examples()
    assert len(found) > 40, "the extraction found too few commands"
    failures = [f"{ex.where}: {ex.text}\n    {problem}" for ex in found
                if (problem := _parse(ex.argv))]
    assert not failures, "documented commands click refuses:\n" + "\n".join(failures)


def test_the_extraction_reads_prompts_output_and_continuations(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text("```console\n$ marble status  # the queue\n   ID NAME\nqueue ends\n"
                   "$ marble report \\\n    --db a.db > out.txt\n```\n\n```sh\n"
                   "marbled --detach   # a comment\nMARBLED_OPTS=x sbatch s.sbatch\n"
                   "marble trace ~/<allocation id>/marble.db -o w.csv\n```\n"
                   "```\nmarbled INFO Slurm read through ...\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", [doc])
    found = examples()
    assert [(e.line, e.argv) for e in found] == [
        (2, ["marble", "status"]),
        (5, ["marble", "report", "--db", "a.db"]),
        (10, ["marbled", "--detach"]),
        (12, ["marble", "trace", "~/PLACEHOLDER/marble.db", "-o", "w.csv"])]
    assert found[0].output == ["   ID NAME", "queue ends"]
    assert _parse(["marble", "status", "--no-such-option"])
    assert _parse(["marble", "report", "gpu_hours", "--db", "absent.db"]) is None


def test_every_subcommand_the_docs_name_has_help():
    named: dict[str, set] = {"marble": set()}
    for doc in DOCS:
        for match in re.finditer(r"(?:`|^\$? ?)marble ([a-z][a-z-]+)\b", doc.read_text(),
                                 re.MULTILINE):
            named["marble"].add((match.group(1), doc.name))
    known = set(marble_cli.commands)
    unknown = sorted(f"{doc}: marble {name}" for name, doc in named["marble"]
                     if name not in known)
    assert not unknown, f"the docs name subcommands marble lacks: {unknown}"
    runner = CliRunner()
    for name in sorted({n for n, _ in named["marble"]} & known) + [None]:
        argv = [name, "--help"] if name else ["--help"]
        done = runner.invoke(marble_cli, argv)
        assert done.exit_code == 0, f"marble {' '.join(argv)}: {done.output}"
    done = runner.invoke(marbled_cli, ["--help"])
    assert done.exit_code == 0, done.output


def _options(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            names |= {*param.opts, *param.secondary_opts}
    return names


def test_every_option_the_prose_names_exists():
    """`marble SUB ... --opt` in the text (usage fragments such as `marble logs JOB [-f]`
    included): each option is one of SUB's (or marble's own); `marbled --opt`: marbled's."""
    unknown, checked = [], 0
    for doc in DOCS:
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"),
                      doc.read_text(), flags=re.S)
        for span in re.finditer(r"`(marbled?(?: [^`]*)?)`", text):
            words = span.group(1).replace("\\|", " ").split()
            if words[0] == "marbled":
                known, rest = _options(marbled_cli), words[1:]
            elif len(words) > 1 and words[1] in marble_cli.commands:
                sub = marble_cli.commands[words[1]]
                known, rest = _options(sub) | _options(marble_cli), words[2:]
            else:
                continue
            for word in rest[:rest.index("--")] if "--" in rest else rest:
                option = re.fullmatch(r"(--?[A-Za-z][\w-]*)(=.*)?", word.strip("[]|(),.;"))
                if option:
                    checked += 1
                    if option.group(1) not in known:
                        line = text[:span.start()].count("\n") + 1
                        unknown.append(f"{doc.relative_to(REPO)}:{line}: `{span.group(1)}`: "
                                       f"{option.group(1)}")
    assert checked > 50, "the prose names too few options: is the extraction broken?"
    assert not unknown, "options the CLI does not have:\n" + "\n".join(unknown)


# ------------------------------------------------------------------ running

DOC_HOSTS = {"vm"}  # the host names of the docs' sessions, not this one's


def _words(lines: list[str]) -> tuple[set[str], list[str]]:
    """The doc's output as what must recur: the words of its prose lines and the column
    headers of its tables (a table's rows are the doc's own session's)."""
    words: set[str] = set()
    headers: list[str] = []
    in_table = False
    for line in lines:
        tokens = line.split()
        if not tokens or "..." in line:
            in_table = False
            continue
        if len(tokens) >= 3 and all(re.fullmatch(r"[A-Z][A-Z0-9_/]*", t) for t in tokens):
            headers += tokens
            in_table = True
            continue
        if in_table and not re.fullmatch(r"[a-z]+", tokens[0]):
            continue  # a row
        in_table = False
        for token in tokens:
            token = token.strip("()[],;:.~'\"")
            if re.fullmatch(r"[A-Za-z][a-z]+", token) and token not in DOC_HOSTS:
                words.add(token)
    return words, headers


def _known_models_only(trace: Path) -> None:
    """Drop a trace's rows of models the profile lacks (this session's `resnt-50`, which
    docs/profiling.md submits): `marble simulate` refuses them, as docs/traces.md says."""
    known = load_profile().models
    lines = trace.read_text().splitlines(keepends=True)
    trace.write_text("".join(line for line in lines if line.startswith("#") or
                             len(line.split(",")) < 2 or line.split(",")[1] in known
                             or line.split(",")[1] == "model"))


def _said(output: str) -> set[str]:
    return {t.strip("()[],;:.~'\"") for t in output.split()}


def test_the_documented_commands_run_as_documented(tmp_path):
    started = time.monotonic()
    work = tmp_path / "work"
    work.mkdir()
    state = tmp_path / "state"
    (work / "train.py").write_text(TRAIN_PY.format(scale=SCALE))
    job = work / "job.sh"
    job.write_text(f"#!/bin/sh\nexec {sys.executable} {work / 'train.py'}\n")
    job.chmod(0o755)
    # job set 3, its jobs train.py (real commands, as the docs' jobs.yaml; a queue of
    # emulated and real jobs together has no forecast: they run on different clocks)
    (work / "jobs.yaml").write_text("".join(
        f"- {{model: {spec.model}, steps: {spec.steps}, command: python train.py}}\n"
        for spec in load_job_file(workload_path("paper-jobset3"))))
    shutil.copy(DATA / "profiles" / "summit-v100.yaml", work / "site.yaml")
    env = {**os.environ, "MARBLE_STATE_DIR": str(state),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("MARBLE_URL", None)

    found = examples()
    runnable = sorted((ex for ex in found if not ex.skip), key=lambda ex: ex.stage)
    assert runnable, "nothing to run"
    failures: list[str] = []
    # the broker's PATH has the venv's python, as where the batch script activated it
    daemon = start_daemon(state, *BROKER, time_scale=SCALE, env={"PATH": env["PATH"]})
    try:
        stage = 0
        for ex in runnable:
            if ex.stage >= 6 > stage:  # the broker has stopped: its records, by their names
                daemon.proc.wait(timeout=60)
                (work / "marble.db").symlink_to(state / "marble.db")
                (work / "marble-state").symlink_to(state)
                subprocess.run(["marble", "trace", "marble.db", "-o", "history.csv"],
                               cwd=work, env=env, check=True, capture_output=True,
                               timeout=30)
            if ex.stage == 5 and daemon.proc.poll() is not None:
                daemon.proc.wait()  # the docs stop their broker twice: start another
                daemon = start_daemon(state, *BROKER, time_scale=SCALE,
                                      env={"PATH": env["PATH"]})
            if ex.stage == 7:
                for trace in work.glob("*.csv"):
                    _known_models_only(trace)
            stage = ex.stage
            try:
                done = subprocess.run(["bash", "-c", ex.shell], cwd=work, env={**env, **ex.env},
                                      capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                failures.append(f"{ex.where}: {ex.text}\n    did not end in 60 s")
                continue
            said = done.stdout + done.stderr
            if done.returncode != 0:
                failures.append(f"{ex.where}: {ex.text}\n    exit {done.returncode}: "
                                f"{said[-800:]}")
                continue
            words, headers = _words(ex.output)
            missing = sorted(words - _said(said)) + [h for h in headers if h not in said]
            if missing:
                failures.append(f"{ex.where}: {ex.text}\n    the doc's output has "
                                f"{missing}, the command's does not:\n{said[-1500:]}")
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()
    elapsed = time.monotonic() - started
    skipped = [ex for ex in found if ex.skip]
    print(f"\ndoc commands: {len(found)} found, {len(found)} parse-checked, "
          f"{len(runnable)} run, {len(skipped)} skipped; {elapsed:.1f} s")
    for pattern, why in SKIP:
        hits = [ex.where for ex in skipped if re.search(pattern, ex.shell)]
        print(f"  skipped {len(hits)} ({why}): {', '.join(hits)}")
        assert hits, f"SKIP entry {pattern!r} matches no documented command: remove it"
    assert not failures, "documented commands that do not do as documented:\n" + \
        "\n".join(failures)
