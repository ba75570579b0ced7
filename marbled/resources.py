"""Files the broker reads: profiles (by name or path) and job-set files, with located errors."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import yaml

from marbled.core.environment import Environment
from marbled.core.learning import LearnedBook, Learning
from marbled.core.profiles import ProfileBook, ProfileError
from marbled.core.spec import JobSpec, SpecError

DATA = Path(__file__).resolve().parent  # the package: profiles/, workloads/ and sql/ ship in it
DEFAULT_PROFILE = "summit-v100"


def profile_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("MARBLE_PROFILE_PATH", "").split(":") if p]
    return [*extra, DATA / "profiles"]


def find_profile(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile file")
        return path
    for d in profile_dirs():
        for suffix in (".yaml", ".yml"):
            if (d / f"{name_or_path}{suffix}").is_file():
                return d / f"{name_or_path}{suffix}"
    known = sorted({p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.y*ml")})
    raise ProfileError(
        f"no profile named '{name_or_path}' (known: {', '.join(known) or 'none'}); "
        "give a name, a YAML path, or add a directory to MARBLE_PROFILE_PATH"
    )


class _Loader(yaml.SafeLoader):
    """YAML as people write numbers: PyYAML follows YAML 1.1, where 1e3, 1.0e3 and 5e-05 (as
    Python prints 0.00005) are strings; here they are floats, as in YAML 1.2."""


class _CLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """_Loader with libyaml's parser where PyYAML was built with it (a 50,000-job file: 14 s
    instead of 107 s, with the single parse of read_job_file); the same numbers; SafeLoader
    itself where it was not."""


for _loader in (_Loader, _CLoader):
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))


def load_yaml(text: str) -> object:
    return yaml.load(text, Loader=_CLoader)  # noqa: S506 (a SafeLoader)


def _compose_and_load(text: str) -> tuple[yaml.Node | None, object]:
    """The document's node tree (for the lines of its entries) and its value, from one
    parse (libyaml's where it is available)."""
    loader = _CLoader(text)
    try:
        root = loader.get_single_node()
        return root, (loader.construct_document(root) if root is not None else None)
    finally:
        loader.dispose()


@lru_cache(maxsize=16)
def _load_profile_file(path: Path, mtime: float) -> ProfileBook:
    try:
        text = path.read_text()
        doc = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    try:
        return ProfileBook.from_mapping(doc, source=str(path))
    except ProfileError as exc:
        line = _line_of(yaml.compose(text), exc.where)
        if line is None:
            raise
        raise ProfileError(str(exc).replace(f"{path}: ", f"{path}:{line}: ", 1),
                           exc.where) from None


def _line_of(node: yaml.Node | None, where: str | None) -> int | None:
    """The line (from 1) of the deepest mapping key or list entry on the dotted path
    `where` (a list entry by its index)."""
    line = None
    for key in (where or "").split("."):
        if isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
            line = node.start_mark.line + 1
            continue
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if k.value == key), None)
        if match is None:
            break
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> ProfileBook:
    """A profile by name or path; a broker's state database (marble.db) gives the curves
    that broker learned, its profile blended with what its runs measured."""
    if str(name_or_path).endswith(".db"):
        book = learned_book(Path(name_or_path))
        return ProfileBook.from_mapping(book.as_profile(), source=str(name_or_path))
    path = find_profile(name_or_path).resolve()
    return _load_profile_file(path, path.stat().st_mtime)


def learned_book(db: Path, learning: Learning | None = None) -> LearnedBook:
    """What the broker of `db` learned: the profile it ran with and every sample stored."""
    from marbled.store.db import SchemaError, Store  # SQLAlchemy only for a database

    if not db.is_file():
        raise ProfileError(f"{db}: no such state database (give a broker's marble.db)")
    try:
        store = Store(db)
    except SchemaError as exc:
        raise ProfileError(str(exc)) from None
    try:
        meta = store.meta()
        book = LearnedBook(load_profile(meta.get("profile_ref") or DEFAULT_PROFILE),
                           learning or Learning())
        for row in store.samples():
            book.record(row.model, row.kind, row.value, row.gpus)
    finally:
        store.close()
    return book


def workload_path(name: str) -> Path:
    """A workload file, or the name of one in workloads/ (e.g. paper-jobset3)."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml", ".csv") or path.exists():
        return path
    return DATA / "workloads" / f"{name}.yaml"


def sql_path(name: str) -> Path:
    """One of the SQL files for centre staff (schema.sql, reports.sql)."""
    return DATA / "sql" / name


class JobFileError(ValueError):
    """A job-set file that cannot be submitted; the message names file, line and field."""


def load_job_file(path: Path) -> list[JobSpec]:
    """The jobs of a job-set file (see `read_job_file`)."""
    return [spec for _, spec in read_job_file(path)]


def read_job_file(path: Path, environ: Mapping[str, str] | None = None,
                  environment: Environment | None = None) -> list[tuple[str, JobSpec]]:
    """Read a job-set file: a YAML list of jobs, or a mapping with a 'jobs' list; each job
    with where it stands ('FILE:LINE').

    Each job takes the fields of `marble submit` (command or emulate, model,
    steps, gpus, after, name, export, env).
    """
    try:
        text = Path(path).read_text()
        root, doc = _compose_and_load(text)
    except OSError as exc:
        raise JobFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: not valid YAML: {exc}") from None
    nodes = root.value if root is not None else []
    if isinstance(doc, dict) and set(doc) == {"jobs"}:
        doc = doc["jobs"]
        nodes = next(v.value for k, v in root.value if k.value == "jobs")
    if not isinstance(doc, list) or not doc:
        raise JobFileError(f"{path}: expected a non-empty list of jobs (or 'jobs:' with a list)")
    specs = []
    for i, (entry, node) in enumerate(zip(doc, nodes, strict=True), start=1):
        where = f"{path}:{node.start_mark.line + 1}"
        try:
            # a job's export resolved against its submitter's `environ`; one that gives
            # none runs in `environment` (marble submit --export)
            specs.append((where, JobSpec.from_mapping(entry, environ, environment)))
        except SpecError as exc:
            raise JobFileError(f"{where}: job {i}: {exc}") from None
    return specs
