"""`marble explain` of a job retried after a crash without a checkpoint, on a real broker:
one statement of when it starts during its back-off, its retry said to start from the step
it restored (0), and no warning about an acknowledged checkpoint that never was."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.daemon

# Reports steps 1..20 and crashes (first run), then trains 1..40 (the retry); no checkpoint.
CRASH_ONCE = """
import os, sys, time
from marbled.worker.protocol import JobProtocol
proto = JobProtocol.from_env().install()
proto.ready()
proto.restored(0)
mark = os.path.join(os.environ["MARBLE_CHECKPOINT_DIR"], "..", "crashed")
first = not os.path.exists(mark)
for step in range(1, 41):
    time.sleep(0.01)
    proto.report(step, force=True)
    if first and step == 20:
        open(mark, "w").close()
        sys.exit(1)
"""


def test_explain_of_a_retry_without_a_checkpoint(daemon_factory):
    d = daemon_factory("--retry-delay", "4", gpus=2)
    (job,) = d.submit({"command": [sys.executable, "-c", CRASH_ONCE], "steps": 40,
                       "retries": 1, "model": "resnet-50"})
    path = f"/v1/jobs/{job['id']}"
    waiting = d.wait_for(lambda: (r := d.client.get(path)["reasons"])[0].startswith(
        "it waits out its retry back-off") and r, timeout=30, what="the back-off")
    assert not any("should start" in line for line in waiting), waiting
    d.wait_all(timeout=60)
    lines = d.client.get(path)["reasons"]
    assert "its runs: 2 GPUs (primary) from step 0 -> 2 GPUs (primary) from step 0" in lines
    assert not any("acknowledged:" in line for line in lines), lines
    # the failed run acknowledged no checkpoint, so the retry from step 0 is no fallback
    assert not any("older checkpoint" in line for line in lines), lines
    assert not d.query("SELECT id FROM events WHERE kind = 'checkpoint-fallback'")
