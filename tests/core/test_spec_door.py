"""Issue 30, I7: what cannot run is refused by JobSpec (the API's and `marble submit`'s
check alike), naming the field; a name is refused, never changed."""

from __future__ import annotations

import pytest

from marbled.core.spec import JobSpec, SpecError

RUNS = {"gpus": 1, "command": ["true"]}


@pytest.mark.parametrize(("doc", "field", "says"), [
    ({"gpus": 1, "command": ["echo", "a\0b"]}, "command", "word 2"),
    ({"gpus": 1, "command": "echo 'a\0b'"}, "command", "NUL byte"),
    ({"gpus": 1, "command": ["echo", "\ud800"]}, "command", "lone surrogate"),
    ({"gpus": 1, "command": ["python", "\udcff.py"]}, "command", "UTF-8"),
    ({**RUNS, "name": "a\0b"}, "name", "NUL byte"),
    ({**RUNS, "name": "a\nb"}, "name", "control character"),
    ({**RUNS, "name": "tab\there"}, "name", "control character"),
    ({**RUNS, "name": "esc\x1b[31m"}, "name", "control character"),
    ({**RUNS, "name": "a\u2028b"}, "name", "control character"),
    ({**RUNS, "name": "\ud800"}, "name", "lone surrogate"),
    ({**RUNS, "after": ["a\nb"]}, "after", "control character"),
    ({**RUNS, "after": "x\0"}, "after", "NUL byte"),
    ({**RUNS, "chdir": "/tmp/\udc80"}, "chdir", "lone surrogate"),
])
def test_unrunnable_text_is_refused_naming_the_field(doc, field, says):
    with pytest.raises(SpecError) as caught:
        JobSpec.from_mapping(doc)
    assert caught.value.field == field
    assert says in caught.value.message
    assert "remove it" in caught.value.message or "UTF-8" in caught.value.message

