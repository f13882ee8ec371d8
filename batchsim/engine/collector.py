"""The garbage collector while an engine loop runs: off for the built-in policies, rare for
a policy written elsewhere (:func:`rare_collections`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLD = 100_000
"""Net new container objects between two young-generation garbage collections while the
engine runs (Python's default: 700)."""


@contextmanager
def rare_collections(trusted: bool = False) -> Iterator[None]:
    """Collect garbage rarely while the step loop runs (not at all when ``trusted``), then
    restore the interpreter's settings.

    The loop makes and drops many small tuples (rows, shapes, costs) that reference counting
    frees at once; at the default threshold the collector still scans the young generation
    every 700 net allocations, about 5 % of a run's time, to find almost no cycles. Cycles
    are still collected, every :data:`GC_THRESHOLD` net allocations. The built-in policies'
    loop (``trusted``) makes almost none (about 200 objects in cycles in a run of 10,000
    requests, measured), and scanning the objects that live on (requests, their token runs,
    the log) costs about 15 % of a run: the collector is off while it runs and collects what
    is left afterwards, at its next turn. A policy written elsewhere keeps it on, in case it
    makes cycles at every iteration. A collector that the caller turned off stays off.
    """
    old = gc.get_threshold()
    if old[0] == 0 or not gc.isenabled():
        yield
        return
    if trusted:
        gc.disable()
        try:
            yield
        finally:
            gc.enable()
        return
    if old[0] >= GC_THRESHOLD:
        yield
        return
    gc.set_threshold(GC_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
