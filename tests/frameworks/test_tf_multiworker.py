"""TensorFlow's MultiWorkerMirroredStrategy on two EMULATED nodes of a real broker: a per-GPU
job's ranks get TF_CONFIG (every rank a worker, its own index) and meet through it on the
CPU; a real all-reduce across the two workers."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="TensorFlow is not installed (make test installs it)"),
]

# A rank leaves only once every rank has its result: TensorFlow's collectives pull a peer's
# tensor from it, so a rank that exits as soon as it has its own sum can leave the other
# without its last pull (an UnavailableError in a loaded CI run).
WORKER = '''
import json, os, time
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()   # reads TF_CONFIG
@tf.function
def step():
    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce("sum", tf.constant(float(os.environ["RANK"]) + 1))
total = strategy.experimental_local_results(strategy.run(step))[0]
with open(f"tf-{os.environ['RANK']}.json", "w") as f:
    json.dump({"sum": float(total), "replicas": strategy.num_replicas_in_sync}, f)
deadline = time.monotonic() + 120
while not all(os.path.exists(f"tf-{r}.json") for r in range(int(os.environ["WORLD_SIZE"]))):
    if time.monotonic() > deadline:
        os._exit(3)
    time.sleep(0.05)
os._exit(0)
'''


def test_two_emulated_nodes_train_as_one_tensorflow_cluster(daemon_factory, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    d = daemon_factory("--nodes", "2", gpus=1,
                       env={"OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    d.submit({"command": [sys.executable, "worker.py"], "gpus": 1, "nodes": 2,
              "per_gpu": True, "chdir": str(tmp_path)})
    (done,) = d.wait_all(timeout=180)
    assert done["state"] == "done", done["reason"]
    results = [json.loads((tmp_path / f"tf-{r}.json").read_text()) for r in (0, 1)]
    assert results == [{"sum": 3.0, "replicas": 2}] * 2
