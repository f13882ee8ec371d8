"""What a policy promises so that the engine may fast-forward it: declared here, not in the
policy contract, and off unless declared.

The engine normally asks the policy at every iteration (``schedule()``, price the batch,
``update_from_output()``). A policy may promise more with :func:`fast_forward`, and the engine
then runs many iterations at once with identical results (tested row by row against
``engine.fast_forward: false``):

- ``decode_stretches``: when :meth:`~batchsim.scheduler.Scheduler.schedule` returns a
  decode-only batch (no preemption, no swap), it would return the same batch again, each
  request one token further along, at every following iteration until a request finishes,
  the KV cache runs short, or an arrival, cancellation or timer happens — and for at most
  ``policy_max_repeat(output)`` iterations, a method the policy may define (unbounded if it
  does not). The engine then runs those iterations as one stretch
  (:mod:`batchsim.engine.stretch`).
- ``drains_cohort`` (built-in policies): its ``schedule()`` runs the running requests first
  with the base class's cohort helpers and fills the budget from the waiting queue, FCFS,
  with no timer and ``policy_max_repeat`` unbounded while the head of the queue would not be
  admitted (``admits_head``): the engine runs its decode stretches on through their members'
  last tokens without a pass per stretch.
- ``lends_running`` (built-in policies): its ``schedule()`` adds to what the cohort helpers
  return only requests put into ``running`` through the base class's methods, so an
  iteration of the cohort alone may hold the running list itself instead of a copy (work
  per iteration independent of the batch size).

A promise is about ``schedule()``, so a declaration counts for the class that declares it
and for subclasses that do not define ``schedule()`` again: a subclass of a built-in policy
that overrides ``schedule()`` is stepped unless it declares its own promise. The last two are
about the declaring class itself and are not inherited at all. A policy that declares nothing
is stepped, which is always correct::

    from batchsim.scheduler import Scheduler
    from batchsim.scheduler.fast_forward import fast_forward

    @fast_forward(decode_stretches=True)
    class MyPolicy(Scheduler):
        def schedule(self, now): ...
        def policy_max_repeat(self, output): ...  # optional bound on a stretch

This module imports nothing of batchsim.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class FastForward:
    """A policy's fast-forward promises (see the module docstring); all off by default."""

    decode_stretches: bool = False
    drains_cohort: bool = False
    lends_running: bool = False


STEPPED = FastForward()
"""No promise: every iteration is scheduled, priced and applied on its own."""

_DECLARED: weakref.WeakKeyDictionary[type, FastForward] = weakref.WeakKeyDictionary()


def fast_forward(
    *, decode_stretches: bool = False, drains_cohort: bool = False, lends_running: bool = False
) -> Callable[[T], T]:
    """A class decorator: the policy makes these promises (see the module docstring)."""
    promise = FastForward(decode_stretches, drains_cohort, lends_running)

    def declare(policy: T) -> T:
        _DECLARED[policy] = promise
        return policy

    return declare


def declaration(policy: type) -> FastForward:
    """What the engine may fast-forward of ``policy``: the promise of the class that defines
    its ``schedule()``, or of a subclass of it that declares one; ``drains_cohort`` and
    ``lends_running`` only as ``policy``'s own declaration. :data:`STEPPED` if there is none."""
    for klass in policy.__mro__:
        promise = _DECLARED.get(klass)
        if promise is not None:
            if klass is policy:
                return promise
            return FastForward(decode_stretches=promise.decode_stretches)
        if "schedule" in klass.__dict__:
            return STEPPED
    return STEPPED
