"""The example script a user prints from the package (`marble example torch`) trains as
the docs say, copied into a directory of the user's own, away from the checkout."""

import pytest

pytest.importorskip("torch")

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from tests import REPO  # noqa: E402


def test_the_printed_torch_script_trains_alone_in_the_users_directory(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MARBLE_", "PYTHONPATH")) and k != "CUDA_VISIBLE_DEVICES"}
    marble = os.path.join(os.path.dirname(sys.executable), "marble")
    printed = subprocess.run([marble, "example", "torch", "--out", "train.py"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert REPO not in tmp_path.parents
    trained = subprocess.run(
        [sys.executable, "train.py", "--arch", "lenet", "--steps", "3", "--threads", "1",
         "--loss-log", "losses.txt"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert trained.returncode == 0, trained.stderr
    assert [line.split()[0] for line in (tmp_path / "losses.txt").read_text().splitlines()] \
        == ["1", "2", "3"]
    # alone, it checkpoints where jobscripts/README.md says: ./marble-checkpoint
    assert list((tmp_path / "marble-checkpoint").glob("ckpt-*3.pt"))
