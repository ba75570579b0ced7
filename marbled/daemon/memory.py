"""Memory that ended jobs held, given back to the system.

CPython frees a job's objects when it leaves the broker, but glibc keeps the freed blocks
of objects over 512 bytes (a Job's fields, its spec's, the state's index entries) for its
next allocations. malloc_trim gives the free pages back: a broker whose queue of 20,000
jobs drained held 107 MB instead of 114 (it started at 65; the rest is in CPython's own
arenas, which it keeps while any object in them lives). Elsewhere (musl, macOS) there is
nothing to call and nothing is done."""

from __future__ import annotations

TRIM_EVERY = 1000  # jobs that left the broker between two trims, at most (a trim: ~3 ms)

_malloc_trim = None


def give_back_freed() -> bool:
    """Return the C library's free pages to the system; whether it could be asked."""
    global _malloc_trim
    if _malloc_trim is None:
        import ctypes  # here: not at every broker's start

        try:  # the process's own symbols, the C library's among them
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True
