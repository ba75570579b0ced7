"""`evolve`: dataclasses.replace for the frozen records of the hot paths (a Job at each of
its transitions, a planner's items in adaptive's fluid model).

replace() rebuilds the record through its __init__ (12 us for a Job); a copy of its
__dict__ does the same for a record whose __init__ only stores its fields (2 us). Only for
dataclasses without __post_init__, InitVar, init=False fields or cached properties (a
cached value would be copied with the rest): Job, JobSpec (its checks are in
from_mapping, not in __init__) and adaptive's items."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def evolve(record: T, **changes) -> T:
    assert changes.keys() <= record.__dataclass_fields__.keys(), (  # a misspelt field
        f"{type(record).__name__} has no field {set(changes) - set(record.__dataclass_fields__)}")
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__, **changes)
    return new
