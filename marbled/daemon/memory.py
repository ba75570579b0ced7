"""Memory that ended jobs held, given back to the system.

CPython frees a job's objects when it leaves the broker, but glibc keeps the freed blocks
of objects over 512 bytes (a Job's fields, its spec's, the state's index entries) for its
next allocations. malloc_trim gives the free pages back: a broker whose queue of 20,000
jobs drained held 107 MB instead of 114 (it started at 65; the rest is in CPython's own
arenas, which it keeps while any object in them lives). Elsewhere (musl, macOS) there is
nothing to call and nothing is done.

Nor do CPython's dicts and sets shrink when their items leave: a drained broker's indexes
kept tables sized for the 20,000 jobs it once held (8.5 of the 9.5 MiB tracemalloc saw
after the drain, against 1.0 MiB in a fresh broker). `compact` rebuilds them."""

from __future__ import annotations

import sys

SPARSE_BYTES = 256  # a table this large per item it holds has room for far more (dense: 40-100)
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


def compact(*holders: object) -> int:
    """Rebuild the sparse dicts and sets that `holders` keep as attributes, in place (clear,
    which frees the table, then refill), so that every other holder of the same object
    sees the rebuilt one; the number rebuilt. Sparse: over 4 KiB, and over SPARSE_BYTES
    per item. The caller holds no iterator over them (the loop's own thread, between
    decisions)."""
    rebuilt = 0
    for holder in holders:
        for value in vars(holder).values():
            if not isinstance(value, (dict, set)):
                continue
            size = sys.getsizeof(value)
            if size <= 4096 or size <= SPARSE_BYTES * len(value):
                continue
            if isinstance(value, dict):
                items = dict(value)
                dict.clear(value)
                dict.update(value, items)
            else:
                members = set(value)
                set.clear(value)
                set.update(value, members)
            rebuilt += 1
    return rebuilt
