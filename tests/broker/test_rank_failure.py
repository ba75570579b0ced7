"""A failed per-GPU run's reason quotes its failing rank's own error (issue 31), from the
run's stderr as srun --label leaves it (recorded text: Slurm cannot run here); the local
launcher's format is tested on a real broker (tests/integration/test_ranks.py)."""

from __future__ import annotations

import json

from tests.broker.fakes import in_loop, pump, running_broker
from tests.broker.test_coalesced_wakes import of_job
from tests.core.test_failures import SRUN


@in_loop
async def test_a_failed_srun_step_names_its_failing_task_and_quotes_it(tmp_path):
    async with running_broker(tmp_path, gpus=4) as h:
        job = h.submit(command=["python", "train.py"], gpus=4, per_gpu=True)
        await pump()
        (run,) = of_job(h, job)
        h.broker.files.log(job, run.run_id, "stderr").write_text(SRUN)
        run.exit(1)
        await pump()
        row = h.store.jobs([job])[0]
        error = "RuntimeError: WORLD_SIZE=4, but torch.distributed is not initialised"
        assert row.state == "failed"
        assert row.reason == f"rank 1 exited with code 1: {error}", row.reason
        (event,) = [e for e in h.store.events(job) if e.kind == "failed"]
        data = event.data if isinstance(event.data, dict) else json.loads(event.data)
        assert (data["rank"], data["error"]) == (1, error)
        assert data["stderr_tail"].splitlines()[0] == "Traceback (most recent call last):"
        assert data["stderr_tail"].splitlines()[-1] == error
