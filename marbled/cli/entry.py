"""The console scripts. `marbled` and `marble` need the broker's dependencies (`pip install
'marbled[broker]'`); a training image with the worker library alone (`pip install marbled`,
standard library only) gets one line that says so, not a traceback."""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

BROKER_NEEDS = ("aiohttp", "orjson", "sqlalchemy", "click", "yaml")


@contextmanager
def without_collections() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: for imports, which make next to no garbage but
    enough objects to start the collector many times over (the broker's imports: 350 -> 307
    ms; a `marble submit`'s: 3 ms of its 50)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run(module: str) -> None:
    try:
        with without_collections():
            main = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in BROKER_NEEDS:
            raise
        sys.exit(f"{sys.argv[0].rsplit('/', 1)[-1]}: needs {exc.name}, which comes with the "
                 "broker: pip install 'marbled[broker]' (the worker library alone, "
                 "marbled.worker, needs only the standard library)")
    main()


def marbled() -> None:
    _run("marbled.cli.daemon_cmd")


def marble() -> None:
    quick()
    _run("marbled.cli.client_cmd")


def quick() -> None:
    """`marble submit`'s, `status`'s, `logs`' and `cancel`'s everyday forms without click
    (quick.py): exits when done; returns otherwise (another command, or a form or outcome
    for click's command, which handles every form and says every error)."""
    with without_collections():  # its imports too (a process that makes no cycles)
        from marbled.cli.quick import NotHere, run

        with suppress(NotHere):
            sys.exit(run(sys.argv[1:]))
