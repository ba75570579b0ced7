"""GPU samples through NVML, with a STAND-IN pynvml (no NVIDIA GPU here): the broker finds
the GPUs through NVML and records every GPU's reading with the job holding it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemon

STANDIN = Path(__file__).with_name("standin_nvml")


ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])),
       "CUDA_VISIBLE_DEVICES": ""}


def test_nvml_standin_samples_are_recorded_with_the_job_on_each_gpu(daemon_factory):
    d = daemon_factory("--sample-interval", "0.2", gpus=None, env=ENV)
    assert [len(v["gpus"]) for v in d.client.get("/v1/status")["nodes"].values()] == [4]
    (job,) = d.submit({"gpus": 2, "command": ["sleep", "1.5"]})
    d.wait_all(timeout=30)
    d.stop()
    rows = d.query("SELECT * FROM gpu_samples ORDER BY id")
    assert {r["device"] for r in rows} == {"0", "1", "2", "3"}
    for r in rows:  # exactly what the stand-in reported for that GPU
        i = int(r["device"])
        assert (r["util_gpu"], r["util_mem"], r["mem_used"], r["mem_total"]) == (
            10 * (i + 1), 5 * (i + 1), (i + 1) << 30, 16 << 30)
    busy = {r["device"] for r in rows if r["job_id"] == job["id"]}
    (run,) = d.runs()
    assert busy == set(run["devices"].split(","))  # the job's two GPUs, while it ran
    assert {r["job_id"] for r in rows} == {job["id"], None}


def test_emulated_gpus_are_never_sampled_even_where_nvml_answers(daemon_factory):
    d = daemon_factory("--sample-interval", "0.1", gpus=4, env=ENV)  # 4 emulated GPUs
    d.submit({"gpus": 1, "command": ["sleep", "0.5"]})
    d.wait_all(timeout=30)
    assert d.query("SELECT count(*) AS n FROM gpu_samples")[0]["n"] == 0
