"""The console scripts. `marbled` and `marble` need the broker's dependencies (`pip install
'marbled[broker]'`); a training image with the worker library alone (`pip install marbled`,
standard library only) gets one line that says so, not a traceback."""

from __future__ import annotations

import importlib
import sys

BROKER_NEEDS = ("aiohttp", "sqlalchemy", "click", "yaml")


def _run(module: str) -> None:
    try:
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
    _run("marbled.cli.client_cmd")
