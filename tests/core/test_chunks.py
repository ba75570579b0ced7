"""How `marble submit --file` cuts a large job set into requests (marbled/cli/chunks.py)."""

from __future__ import annotations

import json

from marbled.cli.chunks import HEADROOM, _cross_links, _shifted, split
from marbled.cli.client import ApiError


def jobs(n: int, **extra) -> list[dict]:
    return [{"name": f"j{i}", "gpus": 1, "command": ["python", "t.py", str(i)], **extra}
            for i in range(n)]


def test_each_chunk_fits_the_limit_with_headroom_and_the_job_count():
    body = {"jobs": jobs(3000), "export": "NONE"}
    bounds = split(body, 65536, 10_000)
    assert bounds[0][0] == 0 and bounds[-1][1] == 3000
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    for start, end in bounds:
        sent = json.dumps({"export": "NONE", "jobs": body["jobs"][start:end]})
        assert len(sent) <= 65536 * HEADROOM
    assert split({"jobs": jobs(25)}, 65536, 10) == [(0, 10), (10, 20), (20, 25)]
    assert split({"jobs": jobs(5)}, 65536, 10) == [(0, 5)]


def test_a_name_defined_in_an_earlier_chunk_is_linked_by_id_the_latest_definition():
    js = [{"name": "a"}, {"name": "b"}, {"name": "a"}, {"after": ["a", "b", 7]},
          {"name": "b", "after": ["b"]}, {"after": ["b", "zzz"]}]
    # chunks [0, 2) [2, 4) [4, 6): job 3's 'a' is job 2 (its own chunk: left as a name),
    # its 'b' job 1 (an earlier chunk); job 4's 'b' job 1; job 5's 'b' is job 4 (its own)
    assert _cross_links(js, [(0, 2), (2, 4), (4, 6)]) == {3: [(1, 1)], 4: [(0, 1)]}


def test_a_refusal_is_counted_in_the_whole_file():
    exc = _shifted(ApiError(404, "job 3: after: no job is named 'x'", "jobs[2].after"), 1000)
    assert str(exc) == "job 1003: after: no job is named 'x'" and exc.field == "jobs[1002].after"
