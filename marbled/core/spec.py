"""What a user submits, checked field by field with messages that say what to change."""

from __future__ import annotations

import difflib
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace

from marbled.core.environment import Environment
from marbled.core.errors import SpecError
from marbled.core.profiles import ProfileBook, model_key

MAX_STEPS = 10**12
MAX_NAME = 128
MAX_MODEL = 128  # the jobs and samples tables' model column, VARCHAR(128)
MODEL_CHARS = "A-Za-z0-9._+:/-"  # letters, digits and . _ + : / - (e.g. resnet-50, org/net)
MODEL_NAME = re.compile(f"[{MODEL_CHARS}]+")  # a whole model name (fullmatch)
MAX_COMMAND_ARGS = 4096
MAX_NODES = 10_000
MAX_RETRIES = 100
MAX_PATH = 4096  # Linux's PATH_MAX


@dataclass(frozen=True)
class JobSpec:
    command: tuple[str, ...] = ()  # empty when `emulate` is set
    emulate: bool = False  # run marbled's emulated training job for `model`
    model: str | None = None
    steps: int | None = None
    gpus: int | None = None  # None = auto: the profile's optimal count
    after: tuple[int | str, ...] = ()  # job ids or names, resolved at submit
    name: str | None = None
    nodes: int = 1  # > 1: `gpus` GPUs on each of that many nodes, one process per node
    retries: int = 0  # times a failed run is started again (from its checkpoint)
    # The directory the job runs in, as Slurm's --chdir; relative in a job file (to the
    # file's directory, see `run_from`), absolute once it reaches the broker.
    chdir: str | None = None
    new_model: bool = False  # the user means a model no profile knows: no note at submit
    # One process (rank) per GPU of its placement, started by the launcher with the
    # rendezvous variables (docs/distributed.md); False: one process (per node)
    per_gpu: bool = False
    # A node range, as Slurm's --nodes=MIN-MAX: the job's GPUs (`gpus` x `nodes`) may run on
    # any count from nodes_min to `nodes` that divides them (core/policy/spread.py); None: `nodes`
    nodes_min: int | None = None
    # Its environment (core/environment.py): the default is the broker's
    environment: Environment = Environment()

    FIELDS = ("command", "emulate", "model", "steps", "gpus", "after", "name", "nodes",
              "retries", "chdir", "new_model", "per_gpu", "export", "env")

    @classmethod
    def from_mapping(cls, doc: object, environ: Mapping[str, str] | None = None,
                     environment: Environment | None = None) -> JobSpec:
        """A job from its fields. Its `export` and `env` (if it has either) are resolved
        against `environ`, the submitter's environment (None at the broker: see
        Environment.from_mapping); a job with neither runs in `environment` (a request's
        own, or the default: the broker's)."""
        if not isinstance(doc, Mapping):
            raise SpecError("job", "must be an object with at least 'command' or 'emulate'")
        unknown = sorted(set(doc) - set(cls.FIELDS))
        if unknown:
            raise SpecError(unknown[0], f"unknown field; known fields are {', '.join(cls.FIELDS)}")

        command = doc.get("command")
        if command is None:
            command = ()
        elif isinstance(command, str):
            try:
                command = tuple(shlex.split(command))
            except ValueError as exc:
                raise SpecError("command", f"cannot be split into words: {exc}") from None
        elif isinstance(command, list) and all(isinstance(a, str) for a in command):
            command = tuple(command)
        else:
            raise SpecError("command", "must be a string or a list of strings")
        if len(command) > MAX_COMMAND_ARGS:
            raise SpecError("command", f"has more than {MAX_COMMAND_ARGS} words")
        for i, word in enumerate(command):
            _runnable("command", word, f"word {i + 1} ({_shown(word)})")

        emulate = doc.get("emulate", False)
        if not isinstance(emulate, bool):
            raise SpecError("emulate", "must be true or false")
        if emulate == bool(command):
            raise SpecError(
                "command",
                "give either a command to run or emulate: true (an emulated job for 'model')",
            )

        model = doc.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise SpecError("model", "must be a non-empty string such as 'resnet-50'")
        if isinstance(model, str):
            _runnable("model", model, "the model")
        if model is not None and (len(model) > MAX_MODEL
                                  or not MODEL_NAME.fullmatch(model)):
            raise SpecError("model", f"must be 1 to {MAX_MODEL} letters, digits and . _ + : / - "
                                     f"(such as 'resnet-50'), not {_shown(model)}")
        new_model = doc.get("new_model", False)
        if not isinstance(new_model, bool):
            raise SpecError("new_model", "must be true or false")

        steps = doc.get("steps")
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or not 0 < steps <= MAX_STEPS
        ):
            raise SpecError("steps", f"must be a whole number from 1 to {MAX_STEPS}")

        gpus = doc.get("gpus", "auto")
        if gpus == "auto" or gpus is None:
            gpus = None
        elif isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise SpecError("gpus", "must be 'auto' or a whole number of GPUs >= 1")

        after = doc.get("after", [])
        if isinstance(after, int | str) and not isinstance(after, bool):
            after = [after]
        if not isinstance(after, list) or not all(
            (isinstance(a, int) and not isinstance(a, bool) and a > 0)
            or (isinstance(a, str) and a)
            for a in after
        ):
            raise SpecError("after", "must be a job id, a job name, or a list of them")
        for a in after:
            if isinstance(a, str):
                _plain_name("after", a, f"the name {_shown(a)}")

        name = doc.get("name")
        if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME):
            raise SpecError("name", f"must be a string of 1 to {MAX_NAME} characters")
        if isinstance(name, str):
            _plain_name("name", name, "the name")
        if isinstance(name, str) and name.isdigit():
            raise SpecError("name", "must not be all digits (it would read as a job id)")

        nodes_min, nodes = node_range(doc.get("nodes", 1))

        retries = doc.get("retries", 0)
        if isinstance(retries, bool) or not isinstance(retries, int) \
                or not 0 <= retries <= MAX_RETRIES:
            raise SpecError("retries", f"must be a whole number from 0 to {MAX_RETRIES}")

        chdir = doc.get("chdir")
        if isinstance(chdir, str):
            _runnable("chdir", chdir, "the path")
        if chdir is not None and (not isinstance(chdir, str) or not 0 < len(chdir) <= MAX_PATH):
            raise SpecError("chdir", f"must be a directory path of 1 to {MAX_PATH} characters")

        per_gpu = doc.get("per_gpu", False)
        if not isinstance(per_gpu, bool):
            raise SpecError("per_gpu", "must be true or false")
        if per_gpu and is_torchrun(command):
            raise SpecError("per_gpu", "torchrun starts one process per GPU itself: drop "
                                       "per_gpu (--per-gpu) and keep torchrun, or keep per_gpu "
                                       "and run the script with python")

        if emulate and (model is None or steps is None):
            raise SpecError("model" if model is None else "steps",
                            "an emulated job needs both 'model' and 'steps'")
        if "export" in doc or "env" in doc:
            environment = Environment.of(doc, environ)
        return cls(command, emulate, model, steps, gpus, tuple(after), name, nodes, retries,
                   chdir, new_model, per_gpu, nodes_min, environment or Environment())

    def run_from(self, base: str) -> JobSpec:
        """This job with an absolute `chdir`: its own joined to the absolute directory `base`
        (a relative one reads from `base`), or `base` itself if it names none."""
        return replace(self, chdir=posixpath.normpath(posixpath.join(base, self.chdir or ".")))

    @property
    def fewest_nodes(self) -> int:
        """The fewest nodes it may run on: `nodes_min` of a range, else `nodes`."""
        return self.nodes if self.nodes_min is None else self.nodes_min

    @property
    def nodes_text(self) -> str:
        """'2', or a range '1-2' (what `marble submit --nodes` and job files take)."""
        return str(self.nodes) if self.nodes_min is None else f"{self.nodes_min}-{self.nodes}"

    def to_mapping(self, environment: bool = True) -> dict:
        """Its fields as the API takes them; its environment too (unless the default), but
        not with `environment` False (a request gives the environment its jobs share)."""
        env = self.environment.to_mapping() \
            if environment and not self.environment.is_default else {}
        return {
            "command": list(self.command),
            "emulate": self.emulate,
            "model": self.model,
            "steps": self.steps,
            "gpus": "auto" if self.gpus is None else self.gpus,
            "after": list(self.after),
            "name": self.name,
            "nodes": self.nodes_text if self.nodes_min is not None else self.nodes,
            "retries": self.retries,
            "chdir": self.chdir,
            "new_model": self.new_model,
            "per_gpu": self.per_gpu,
            **env,
        }


NODES_HELP = (f"must be a whole number of nodes from 1 to {MAX_NODES}, or a range 'MIN-MAX' "
              "such as '1-2' (as Slurm's --nodes)")
NODE_RANGE = "^([1-9][0-9]*)-([1-9][0-9]*)$"  # 'MIN-MAX'; a single count is a number


def node_range(value: object) -> tuple[int | None, int]:
    """(nodes_min, nodes) of a job's `nodes`: a whole number N (None, N), or 'MIN-MAX' as
    Slurm's --nodes (MIN, MAX; None, MAX when they are equal: the same fixed count)."""
    # fullmatch without the anchors: Python's $ also matches before a final newline
    match = re.fullmatch(NODE_RANGE[1:-1], value) if isinstance(value, str) \
        and len(value) < 16 else None
    if match:
        low, high = int(match[1]), int(match[2])
    elif isinstance(value, int) and not isinstance(value, bool):
        low = high = value
    else:
        raise SpecError("nodes", NODES_HELP)
    if not 0 < low <= MAX_NODES or not 0 < high <= MAX_NODES:
        raise SpecError("nodes", NODES_HELP)
    if low > high:
        raise SpecError("nodes", f"the range {low}-{high} runs backwards; write the fewest "
                                 f"nodes first: {high}-{low}")
    return (None if low == high else low), high


def is_torchrun(command: tuple[str, ...]) -> bool:
    """Whether `command` starts torchrun (its script, or `python -m torch.distributed.run`)."""
    if not command:
        return False
    if posixpath.basename(command[0]) == "torchrun":
        return True
    return any(a == "-m" and b in ("torch.distributed.run", "torch.distributed.launch")
               for a, b in zip(command, command[1:], strict=False))


RUN_VAR = re.compile(r"\$(?:\{(MARBLE_[A-Z0-9_]+)\}|(MARBLE_[A-Z0-9_]+))")


def expand_run_vars(argv: tuple[str, ...], env: Mapping[str, str]) -> tuple[str, ...]:
    """`argv` with $MARBLE_X and ${MARBLE_X} replaced by the run's value of MARBLE_X, as in
    `torchrun --nproc-per-node='$MARBLE_GPUS'`: a job's command is run without a shell, and
    its GPU count is known only at launch. A variable the run does not have stays as it is."""
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        return env.get(name, match.group(0))

    return tuple(RUN_VAR.sub(value, word) if "$" in word else word for word in argv)


@dataclass(frozen=True)
class Sizing:
    demand: int  # GPU count the policy aims for
    malleable: bool  # may run as a secondary and be suspended/resumed
    max_share: int = 1  # > 1: may run on 1/max_share of a GPU (the profile says it can)


def size_job(spec: JobSpec, book: ProfileBook, node_gpus: int, node_count: int = 1) -> Sizing:
    """How many GPUs `spec` wants on each of its nodes, out of `node_count` nodes of
    `node_gpus`; SpecError if it can never run."""
    if spec.fewest_nodes > node_count:
        raise SpecError("nodes", f"asks for {spec.nodes_text} nodes but there are "
                                 f"{node_count}; ask for at most {node_count}")
    if spec.nodes > node_count:
        raise SpecError("nodes", f"the range {spec.nodes_text} reaches past the {node_count} "
                                 f"nodes there are; give {spec.fewest_nodes}-{node_count}: "
                                 "the job's GPUs are its count on each of the most nodes")
    if spec.emulate and book.lookup(spec.model) is None:
        raise SpecError(
            "model",
            f"an emulated job needs a model with a curve in profile '{book.system}'"
            f"{_did_you_mean(spec.model, book, ': {}')} (known: {', '.join(book.models)})",
        )
    if spec.gpus is not None:
        if spec.gpus > node_gpus:
            raise SpecError(
                "gpus",
                f"asks for {spec.gpus} GPUs but the largest node has {node_gpus}; "
                f"ask for at most {node_gpus} or use 'auto'",
            )
        curve = book.lookup(spec.model) if spec.model else None
        if curve is not None and not curve.possible(spec.gpus):
            can = [g for g in range(1, node_gpus + 1) if curve.possible(g)]
            raise SpecError("gpus", f"'{spec.model}' cannot run on {_gpus(spec.gpus)} (its "
                                    f"profile says so); it runs on {can or 'none'}")
        return Sizing(spec.gpus, malleable=False)
    if spec.model is None:
        raise SpecError("gpus", "without a 'model', give an explicit GPU count (e.g. gpus: 2)")
    curve = book.lookup(spec.model)
    best = book.demand(spec.model, node_gpus)
    if best is None and curve is None:
        raise SpecError(
            "model",
            f"'{spec.model}' has no throughput curve in profile '{book.system}'"
            f"{_did_you_mean(spec.model, book, ': {}')} (known: {', '.join(book.models)}); "
            "else give an explicit GPU count",
        )
    if best is None:
        raise SpecError("model", f"'{spec.model}' cannot run on any count up to "
                                 f"{_gpus(node_gpus)} (its profile in '{book.system}' rules "
                                 "them all out)")
    share = curve.max_share if curve is not None and spec.nodes == 1 else 1
    return Sizing(best, malleable=True, max_share=share)


def unknown_model_note(spec: JobSpec, sizing: Sizing, book: ProfileBook) -> str | None:
    """What to tell the user of a job whose model the book has no curve for (a typo, or a
    new model to explore), unless they said they mean it (`new_model`); None otherwise."""
    if spec.model is None or spec.new_model or book.lookup(spec.model) is not None:
        return None
    then = f"it will be explored from {_gpus(sizing.demand)}" if sizing.malleable \
        else f"it runs on the {_gpus(sizing.demand)} asked for"
    return (f"model '{spec.model}' is not in profile {book.system}"
            f"{_did_you_mean(spec.model, book, ' ({})')}; {then}")


def close_models(model: str, book: ProfileBook) -> list[str]:
    """The book's models whose name or an alias (or a learned model's name) looks most like
    `model` (several only when equally close): what 'did you mean' offers."""
    names, key = book.names(), model_key(model)
    scored = [(difflib.SequenceMatcher(None, key, k).ratio(), k) for k in names]
    best = max((score for score, _ in scored), default=0.0)
    if best < 0.6:  # difflib.get_close_matches' cutoff: below it, nothing looks alike
        return []
    return sorted({names[k] for score, k in scored if score == best})


def _did_you_mean(model: str, book: ProfileBook, form: str) -> str:
    """'did you mean resnet-50?' in `form` (e.g. ' ({})'), or '' if nothing is close."""
    close = close_models(model, book)
    return form.format(f"did you mean {' or '.join(close)}?") if close else ""


def _gpus(n: int) -> str:
    """'1 GPU', '2 GPUs' (`core.target`, imported here only: it reads the learning module,
    which a client that checks a spec need not load)."""
    from marbled.core.target import gpus_text

    return gpus_text(n)


# Text exec() and the file system cannot take: a NUL byte (C strings end there), a lone
# surrogate (not Unicode: it has no UTF-8 bytes)
_UNRUNNABLE = re.compile("[\\x00\\ud800-\\udfff]")
# ... and what a name may not hold besides: the control characters (Unicode's Cc: a newline, a
# tab, an escape) and the line and paragraph separators: a name is one row of `status`
_NOT_IN_NAMES = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\ud800-\\udfff]")


def _runnable(field: str, text: str, what: str) -> None:
    """SpecError if `text` holds what no program argument, path or name can."""
    bad = _UNRUNNABLE.search(text)
    if bad is None:
        return
    at = bad.start() + 1
    if bad.group() == "\0":
        raise SpecError(field, f"{what} holds a NUL byte (\\0) at character {at}; no program "
                               "argument, path or name can hold one: remove it")
    raise SpecError(field, f"{what} holds a lone surrogate ({bad.group()!r}) at character "
                           f"{at}: that is not valid Unicode (text that was not UTF-8?); send "
                           "the text as UTF-8")


def _plain_name(field: str, text: str, what: str) -> None:
    """SpecError if `text`, a job's name, is not one line of printable characters."""
    _runnable(field, text, what)
    bad = _NOT_IN_NAMES.search(text)
    if bad is not None:
        raise SpecError(field, f"{what} holds the control character {bad.group()!r} at "
                               f"character {bad.start() + 1}; a name is one line of printable "
                               "characters: remove it (a name is refused, never changed)")


def _shown(text: str, most: int = 40) -> str:
    """`text` quoted for a message, cut short when long."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}... ({len(text)} characters)"
