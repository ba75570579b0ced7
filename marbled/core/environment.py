"""A job's environment, as sbatch's --export gives it (pure).

HPC users set up their environment before they submit (`module load`, `source
venv/bin/activate`), and sbatch and bsub carry it to the job. `marble submit` does the
same, with sbatch's --export:

- ALL (the default of `marble submit`): the submitter's whole environment is the job's;
- NONE: the job runs in the broker's environment (the batch script's), as jobs sent to
  the API without an environment do;
- VAR[,VAR=value...]: the broker's environment, with these variables added (a name alone
  takes its value from the submitter's environment); ALL,VAR=value: all, and these.

What a job never takes from its submitter (`never_exported`): the batch system's
variables (SLURM_*, LSB_*, ...: the allocation the broker runs in is the one that counts,
not the one, if any, the submitter was in), and the variables marbled sets for every run
(MARBLE_*, CUDA_VISIBLE_DEVICES, the rank variables). `marble submit` leaves them out of
ALL; named explicitly, they are refused.

"""

from __future__ import annotations

import functools
import json
import re
from collections import namedtuple
from collections.abc import Mapping

from marbled.core.errors import SpecError

MAX_ENV_BYTES = 1 << 20  # Linux allows 2 MiB for a process's arguments and environment
MAX_ENV_VARS = 4096
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ABSENT = object()  # a field not given (null is given, and refused)
FIELDS = ("export", "env")  # of a job, or of a request for its jobs
# The allocation's (Slurm, LSF and its JSM, PBS, Flux, MPI launchers' per-task ones)
BATCH_PREFIXES = ("SLURM_", "SLURMD_", "SALLOC_", "SBATCH_", "SRUN_", "LSB_", "LSF_", "JSM_",
                  "PBS_", "FLUX_", "PMI_", "PMIX_", "OMPI_")
# Set by marbled for every run (and by torchrun for its workers)
RUN_VARS = frozenset({"CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                      "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK",
                      "MASTER_ADDR", "MASTER_PORT"})
# A shell's own, which describe the submitting shell, not the job's (PWD: the job's
# directory is its chdir)
SHELL_VARS = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})


def never_exported(name: str) -> bool:
    """Whether a variable of the submitter's never reaches the job (see the module)."""
    return (name.startswith(BATCH_PREFIXES) or name.startswith(("MARBLE_", "TORCHELASTIC_"))
            or name in RUN_VARS)


# A named tuple rather than a frozen dataclass: as immutable, and `marble submit` does not
# import dataclasses (and inspect with it: 10 ms of a 40 ms call)
class Environment(namedtuple("Environment", ("vars", "whole"), defaults=((), False))):
    """`vars` the job runs with (a tuple of (name, value)): its whole environment when
    `whole` (ALL), else added to the broker's. The default, no variables and not whole, is
    the broker's environment."""

    @property
    def is_default(self) -> bool:
        return not self.vars and not self.whole

    @functools.cached_property
    def digest(self) -> str:
        """What identifies it: jobs that share an environment store it once."""
        import hashlib  # here: the broker stores digests, `marble submit` makes none (2.3 ms)

        text = json.dumps([self.whole, self.vars], separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def as_dict(self) -> dict[str, str]:
        return dict(self.vars)

    @classmethod
    def of(cls, doc: Mapping, environ: Mapping[str, str] | None = None) -> Environment:
        """From the `export` and `env` that `doc` (a job, a request) gives."""
        return cls.from_mapping(**{k: doc[k] for k in FIELDS if k in doc}, environ=environ)

    def to_mapping(self) -> dict:
        """As the API and job files take it: {"export": "ALL" | "NONE", "env": {...}}."""
        return {"export": "ALL" if self.whole else "NONE", "env": self.as_dict()}

    def overlay(self, base: Mapping[str, str]) -> dict[str, str]:
        """The variables a run of the job starts from, before marbled adds its own: these,
        or the broker's `base` with these added; the allocation's variables always come
        from `base` (the broker's allocation)."""
        if not self.whole:
            return {**base, **self.as_dict()}
        return {**self.as_dict(), **{k: v for k, v in base.items()
                                     if k.startswith(BATCH_PREFIXES)}}

    @classmethod
    def from_mapping(cls, export: object = ABSENT, env: object = ABSENT,
                     environ: Mapping[str, str] | None = None) -> Environment:
        """From a job's (or a request's) `export` and `env` fields. `environ`: the
        submitter's environment, where the client resolves `export` (ALL takes it all; a
        name alone, its value); None at the broker, which takes "ALL" or "NONE" and the
        values in `env`."""
        if env is ABSENT:
            env = {}
        if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SpecError("env", "must be an object of variable names to string values")
        given = dict(env)
        whole = False
        if export is not ABSENT:
            if not isinstance(export, str) or not export.strip():
                raise SpecError("export", "must be ALL, NONE or VAR[,VAR=value...] (as "
                                          "sbatch's --export)")
            if environ is None and export not in ("ALL", "NONE"):
                raise SpecError("export", "must be ALL or NONE here, with the values in 'env' "
                                          "(marble submit resolves VAR[,VAR=value...] from "
                                          "your environment)")
            whole, named = parse_export(export)
            for name, value in named:
                if never_exported(name):
                    raise set_by_marbled("export", name)
                if value is None:
                    if environ is None:
                        raise SpecError("export", f"names {name} without a value; the API takes "
                                        "values in 'env' (marble submit takes them from your "
                                        "environment)")
                    if name not in environ:
                        raise SpecError("export", f"names {name}, which your environment does "
                                        "not set; give it as NAME=value")
                    value = environ[name]
                given.setdefault(name, value)
            if whole and environ is not None:
                given = {**{k: v for k, v in environ.items()
                            if NAME.fullmatch(k) and not never_exported(k)
                            and k not in SHELL_VARS}, **given}
        check_vars(given)
        return cls(tuple(sorted(given.items())), whole)


def parse_export(text: str) -> tuple[bool, list[tuple[str, str | None]]]:
    """sbatch's --export: (ALL given, [(name, value or None)]). NONE alone: nothing."""
    words = [w.strip() for w in text.split(",")]
    if [w.upper() for w in words] == ["NONE"]:
        return False, []
    whole, named = False, []
    for word in words:
        if word.upper() == "ALL":
            whole = True
            continue
        if word.upper() == "NONE":
            raise SpecError("export", "NONE stands alone (the broker's environment); to add "
                                      "variables to it, name them: VAR[,VAR=value]")
        name, eq, value = word.partition("=")
        if not NAME.fullmatch(name):
            raise SpecError("export", f"{name!r} is not a variable name (letters, digits and "
                                      "_, not starting with a digit)")
        named.append((name, value if eq else None))
    return whole, named


def set_by_marbled(field: str, name: str) -> SpecError:
    return SpecError(field, f"{name} is set by marbled or the allocation for every run; leave "
                            "it out (docs/environment.md says which variables a job never "
                            "takes)")


def check_vars(env: Mapping[str, str]) -> None:
    """Refuse what no process can be given, and what marbled or the allocation sets."""
    if len(env) > MAX_ENV_VARS:
        raise SpecError("env", f"has {len(env)} variables; at most {MAX_ENV_VARS}")
    size = 0
    for name, value in env.items():
        if not NAME.fullmatch(name):
            raise SpecError("env", f"{name!r} is not a variable name (letters, digits and _, "
                                   "not starting with a digit)")
        if never_exported(name):
            raise set_by_marbled("env", name)
        if "\0" in value:
            raise SpecError("env", f"{name} holds a NUL byte, which no process can be given")
        try:
            size += len(name) + len(value.encode()) + 2
        except UnicodeEncodeError:
            raise SpecError("env", f"{name} holds a lone surrogate; give it as valid "
                                   "UTF-8") from None
    if size > MAX_ENV_BYTES:
        raise SpecError("env", f"takes {size} bytes; at most {MAX_ENV_BYTES} (trim it, or "
                               "use export: NONE and name the variables needed)")
