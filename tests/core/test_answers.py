"""The API's JSON encoder (api/answers.py, orjson): every document the standard library's
encoder wrote reads back to the same values, and what orjson will not write is still
written; a NaN or infinity becomes null, which a strict parser (a browser's) reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.api.answers import answer, dumps
from marbled.core.model import JobState, Role

pytestmark = pytest.mark.core


def strict(data: bytes) -> object:
    """JSON as RFC 8259 has it: no NaN, Infinity or -Infinity."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


def finite(value: object) -> object:
    """`value` with each NaN or infinity as None: what the encoder writes for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


documents = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(documents)
def test_every_document_reads_back_as_json_wrote_it(doc):
    assert strict(dumps(doc)) == json.loads(json.dumps(finite(doc)))


def test_what_orjson_cannot_write_is_written_as_before():
    assert strict(dumps({"big": 2**70, 1: "a key that is a number", "tuple": (1, 2)})) == \
        {"big": 2**70, "1": "a key that is a number", "tuple": [1, 2]}
    # numpy's scalars, which json wrote only for its floats
    assert strict(dumps({"at": np.float64(1.5), "count": np.int64(3)})) == \
        {"at": 1.5, "count": 3}


def test_enums_as_their_values_and_text_as_utf8():
    assert dumps({"state": JobState.QUEUED, "role": Role.PRIMARY, "name": "café"}) == \
        '{"state":"queued","role":"primary","name":"café"}'.encode()


def test_a_nan_is_null_not_a_bare_word():
    assert strict(dumps({"rate": float("nan"), "eta": float("inf")})) == \
        {"rate": None, "eta": None}


def test_what_neither_writes_is_refused_as_before():
    with pytest.raises(TypeError):
        dumps({"s": {1, 2}})


def test_the_response_is_json_with_its_status_and_headers():
    response = answer({"id": 3}, status=202, headers={"Idempotent-Replayed": "true"})
    assert (response.status, response.content_type, response.charset) == \
        (202, "application/json", "utf-8")
    assert response.headers["Idempotent-Replayed"] == "true"
    assert strict(response.body) == {"id": 3}
