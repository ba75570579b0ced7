"""Why the broker does not carry out a request: "never" and "not now" are different answers.

A client that gets `Never` must change the request (another field value, another
job); one that gets `NotNow` may send the same request later. `api/` maps them to
HTTP; the core and the daemon raise them without knowing HTTP.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request understood but not carried out; `field` names what to change, if one does."""

    retry = False  # would the same request succeed later?

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class Invalid(Refusal):
    """Bad input: a field's value can never be accepted."""


class SpecError(Invalid, ValueError):
    """Bad input in a job's fields; `field` names what to fix."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}", field)
        self.message = message


class NotFound(Refusal):
    """No such job."""


class Never(Refusal):
    """The request is well formed but can never be carried out for this job (a job that has
    ended cannot be cancelled)."""


class NotNow(Refusal):
    """Not in the job's current state; the same request may succeed later."""

    retry = True


class Unavailable(NotNow):
    """The broker as a whole cannot take it now (it drains; it has no GPUs)."""
