"""The wheel as users install it: built from the checkout, installed into fresh virtual
environments, and used from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from email.parser import Parser

import pytest

from marbled.examples import EXAMPLES
from tests import REPO
from tests.packaging import clean_env, run, venv

pytestmark = pytest.mark.packaging


def test_the_broker_installs_from_the_wheel_and_works_anywhere(broker_venv, tmp_path):
    env = clean_env(tmp_path)
    bin_ = broker_venv
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run([bin_ / "python", "-c", "import marbled; print(marbled.__file__)"],
                elsewhere, env)
    assert str(bin_.parent) in where.stdout and str(REPO) not in where.stdout
    sim = run([bin_ / "marble", "simulate", "--workload", "paper-jobset1", "--json"],
              elsewhere, env)
    assert sim.returncode == 0, sim.stderr
    assert {r["policy"] for r in json.loads(sim.stdout)["results"]} >= {"marble", "rigid"}
    state = tmp_path / "state"
    env["MARBLE_STATE_DIR"] = str(state)
    up = run([bin_ / "marbled", "--gpus", "2", "--time-scale", "0.01", "--detach"],
             elsewhere, env)
    assert up.returncode == 0 and "ready" in up.stdout, up.stderr
    try:
        sub = run([bin_ / "marble", "submit", "--emulate", "--model", "resnet-50", "--steps",
                   "50"], elsewhere, env)
        assert sub.returncode == 0 and "submitted job 1" in sub.stdout, sub.stderr
        waited = run([bin_ / "marble", "wait", "--timeout", "60", "--quiet"], elsewhere, env)
        assert waited.returncode == 0, waited.stderr
    finally:
        down = run([bin_ / "marble", "shutdown"], elsewhere, env)
    assert "marbled stopped" in down.stdout


def test_the_worker_alone_installs_without_the_brokers_dependencies(wheel, tmp_path):
    env = clean_env(tmp_path)
    bin_ = venv(tmp_path / "worker-venv", env)
    installed = run([bin_ / "pip", "install", "--quiet", wheel], tmp_path, env)
    assert installed.returncode == 0, installed.stderr
    check = run([bin_ / "python", "-c",
                 "import json, sys; before = set(sys.modules); import marbled.worker.protocol; "
                 "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
                 "- set(sys.stdlib_module_names))))"], tmp_path, env)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout) == ["marbled"]  # the standard library and marbled only
    for module in ("aiohttp", "orjson", "sqlalchemy", "click", "yaml"):
        missing = run([bin_ / "python", "-c", f"import {module}"], tmp_path, env)
        assert missing.returncode == 1 and "ModuleNotFoundError" in missing.stderr
    hint = run([bin_ / "marbled", "--help"], tmp_path, env)
    assert hint.returncode == 1 and "pip install 'marbled[broker]'" in hint.stderr
    assert "Traceback" not in hint.stderr
    # a training image has the example scripts without the broker's commands
    script = run([bin_ / "python", "-m", "marbled.examples", "torch"], tmp_path, env)
    assert script.returncode == 0, script.stderr
    assert script.stdout == (REPO / "jobscripts" / EXAMPLES["torch"].file).read_text()
    listed = run([bin_ / "python", "-m", "marbled.examples"], tmp_path, env)
    assert listed.returncode == 0 and "python -m marbled.examples torch >" in listed.stdout


def test_the_example_scripts_ship_in_the_wheel(broker_venv, tmp_path):
    """`marble example` from a directory outside the checkout: the list, each script as
    the checkout has it (the Python ones compile, the batch ones parse), and --out."""
    env = clean_env(tmp_path)
    listed = run([broker_venv / "marble", "example"], tmp_path, env)
    assert listed.returncode == 0, listed.stderr
    for name, ex in EXAMPLES.items():
        assert f"{name} " in listed.stdout and ex.file in listed.stdout
        shown = run([broker_venv / "marble", "example", name], tmp_path, env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == (REPO / "jobscripts" / ex.file).read_text()
        if ex.file.endswith(".py"):
            compile(shown.stdout, ex.file, "exec")
        else:
            parsed = subprocess.run(["bash", "-n"], input=shown.stdout, text=True,
                                    capture_output=True)
            assert parsed.returncode == 0, parsed.stderr
    keras = run([broker_venv / "marble", "example", "Keras"], tmp_path, env)
    assert keras.stdout == (REPO / "jobscripts" / EXAMPLES["tf"].file).read_text()

    wrote = run([broker_venv / "marble", "example", "sbatch", "--out", "."], tmp_path, env)
    assert wrote.returncode == 0, wrote.stderr
    assert "sbatch marble.sbatch jobs.yaml" in wrote.stdout
    assert os.access(tmp_path / "marble.sbatch", os.X_OK)
    (tmp_path / "train.py").write_text("# mine\n")
    kept = run([broker_venv / "marble", "example", "torch", "-o", "train.py"], tmp_path, env)
    assert kept.returncode == 1 and "train.py exists: --force replaces it" in kept.stderr
    assert (tmp_path / "train.py").read_text() == "# mine\n"
    forced = run([broker_venv / "marble", "example", "torch", "-o", "train.py", "--force"],
                 tmp_path, env)
    assert forced.returncode == 0 and "-- python train.py --arch lenet" in forced.stdout
    assert "Suspendable" in (tmp_path / "train.py").read_text()

    typo = run([broker_venv / "marble", "example", "torhc"], tmp_path, env)
    assert typo.returncode == 2
    assert "no example named 'torhc'; the examples are torch, tf" in typo.stderr


def test_the_torch_extra_brings_numpy(wheel):
    """torch's wheels leave numpy out; without it every torch job's stderr starts with
    "Failed to initialize NumPy"."""
    with zipfile.ZipFile(wheel) as whl:
        (meta,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(whl.read(meta).decode())
    by_extra: dict[str, set[str]] = {}
    for req in metadata.get_all("Requires-Dist"):
        spec, _, marker = req.partition(";")
        if "extra ==" in marker:
            extra = marker.split("extra ==")[1].strip().strip("'\"")
            by_extra.setdefault(extra, set()).add(re.match(r"[\w.-]+", spec)[0].lower())
    assert {"torch", "numpy"} <= by_extra["torch"]
