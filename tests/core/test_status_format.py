"""How `marble submit`, `marble status` and `marble show` word a job's GPUs (issue 31): the
per-node shape and rank count of a multi-node per-GPU job, and node names in the GPUS column
of a multi-node run."""

from __future__ import annotations

import pytest

from marbled.cli.jobs import per_gpu_text
from marbled.cli.status_view import GPUS_WIDTH, gpus_cell, header, job_row
from marbled.core.target import shape_text


@pytest.mark.parametrize("args, text", [
    ((2,), "2 GPUs"),
    ((1, 1, None, True), "1 GPU"),
    ((4, 1, None, True), "4 GPUs"),  # one node: as before ("4 GPUs (auto, one process ...")
    ((2, 2), "2 GPUs on each of 2 nodes"),
    ((2, 2, None, True), "2 GPUs on each of 2 nodes, 4 ranks"),
    ((1, 3, None, True), "1 GPU on each of 3 nodes, 3 ranks"),
    ((2, 3, 1, True), "2 GPUs on each of 1-3 nodes, 2-6 ranks"),  # a node range
    ((2, 3, 3, True), "2 GPUs on each of 3 nodes, 6 ranks"),
])
def test_shape_text(args, text):
    assert shape_text(*args) == text


def _job(**over) -> dict:
    job = {"id": 7, "name": "ddp", "model": None, "command": ["python", "t.py"],
           "state": "running", "role": "primary", "demand": 2, "nodes": 2, "nodes_min": None,
           "gpus": [0, 1, 0, 1], "node": "n1,n2", "parts": [["n1", [0, 1]], ["n2", [0, 1]]],
           "step": 10, "steps": 100, "rate": None, "suspensions": 0, "per_gpu": True,
           "eta_s": None, "finish_at": None}
    return {**job, **over}


def test_the_gpus_column_names_the_nodes_of_a_multi_node_run():
    assert gpus_cell(_job()) == "n1:0,1 n2:0,1"
    # from a broker whose views lack "parts": its node list and GPUs, as many on each
    assert gpus_cell(_job(parts=None)) == "n1:0,1 n2:0,1"
    assert gpus_cell(_job(parts=[["n2", [2, 3]], ["n5", [0, 1]]])) == "n2:2,3 n5:0,1"
    # one node: the short form, as before
    assert gpus_cell(_job(gpus=[0, 1], node="n1", parts=[["n1", [0, 1]]])) == "0,1"
    assert gpus_cell(_job(gpus=[], node=None, parts=[])) == "-"


def test_a_wide_gpus_column_keeps_the_table_aligned():
    job = _job(parts=[["gpu-node-01", [0, 1, 2, 3]], ["gpu-node-02", [0, 1, 2, 3]]],
               node="gpu-node-01,gpu-node-02", gpus=[0, 1, 2, 3] * 2)
    width = max(GPUS_WIDTH, len(gpus_cell(job)))
    head, row = header(width), job_row(job, {"jobs": []}, {}, width)
    assert "gpu-node-01:0,1,2,3 gpu-node-02:0,1,2,3" in row
    assert head.index("STEP") + len("STEP") == row.index("10/100") + len("10/100")
    assert header() == header(GPUS_WIDTH)


def test_show_says_the_ranks_and_their_shape():
    assert per_gpu_text(_job()) == \
        "True: 4 ranks, one process per GPU (2 GPUs on each of 2 nodes)"
    queued = _job(state="queued", gpus=[], node=None, parts=[])
    assert per_gpu_text(queued) == \
        "True: 4 ranks, one process per GPU (2 GPUs on each of 2 nodes)"
    assert per_gpu_text(_job(state="queued", gpus=[], node=None, parts=[], nodes=3,
                             nodes_min=1)) == \
        "True: 2-6 ranks, one process per GPU (2 GPUs on each of 1-3 nodes)"
    assert per_gpu_text(_job(gpus=[0], node="n1", parts=[["n1", [0]]], nodes=1)) == \
        "True: 1 rank, one process per GPU (1 GPU)"
    assert per_gpu_text(_job(per_gpu=False)) is False
