"""Which request sits in which batch slot, iteration by iteration (``slots.csv``).

Recorded only when asked (``metrics.record_slots: true``): the engine calls
:meth:`SlotLog.record` once per scheduled batch, and runs that do not ask pay nothing.

A request takes the lowest free slot when it first appears in the batch (scheduled, or running
but not scheduled) and keeps it until it leaves the batch (finished, preempted, cancelled).
A slot a request left stays part of the batch while the iteration is wider than its requests
(``num_slots`` > ``num_seqs``: static batching keeps the slots of finished requests until the
whole batch ends), most recently left first; it is then ``padding`` when the policy computes
it (a padded rectangular batch) and ``empty`` when it does not.

Each row is a run of iterations in which one slot held one request in one state:

- ``prefill``: the iteration computes the rest of its prompt (or recomputes a preempted
  request) and samples a token at its end;
- ``chunked_prefill``: a prompt chunk, no token;
- ``decode``: one token computed and one sampled per iteration;
- ``stalled``: running, holding its KV cache, but not scheduled in this iteration (a decode
  waiting out a prefill-only iteration);
- ``padding`` / ``empty``: the slot of a request that left, kept in the batch.

So in every iteration, the slots in ``prefill``, ``chunked_prefill`` or ``decode`` number
``num_seqs`` and, with ``padding`` and ``empty``, ``num_slots`` (``iterations.csv``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from batchsim.engine.request import Request
    from batchsim.scheduler.output import SchedulerOutput

SLOT_STATES = ("prefill", "chunked_prefill", "decode", "stalled", "padding", "empty")
SLOT_COLUMNS = ("slot", "request_id", "state", "first_iteration", "last_iteration")
_PREFILL, _CHUNK, _DECODE, _STALLED, _PADDING, _EMPTY = range(len(SLOT_STATES))


class SlotLog:
    """Run-length record of the batch slots (one row per slot, request and state run)."""

    def __init__(self) -> None:
        self._slot_of: dict[int, int] = {}
        self._free: list[int] = []
        self._width = 0
        self._kept: deque[tuple[int, int]] = deque()  # (slot, request id) left but in the batch
        self._open: dict[int, list[int]] = {}  # slot -> [request id, state, first, last]
        self._rows: list[tuple[int, int, int, int, int]] = []

    def record(
        self,
        output: SchedulerOutput,
        running: Iterable[Request],
        first_iteration: int,
        num_steps: int = 1,
    ) -> None:
        """One scheduled batch (``num_steps`` identical iterations from ``first_iteration``),
        before the scheduler applies it."""
        scheduled = {
            r.request_id: (r, q) for r, q in zip(output.requests, output.num_scheduled_tokens)
        }
        present = list(scheduled)
        present += [r.request_id for r in running if r.request_id not in scheduled]
        here = set(present)
        for rid in [rid for rid in self._slot_of if rid not in here]:  # left the batch
            self._kept.appendleft((self._slot_of.pop(rid), rid))
        keep = max(0, output.num_slots - output.num_seqs)
        while len(self._kept) > keep:
            slot, _ = self._kept.pop()
            heapq.heappush(self._free, slot)
        for rid in present:
            if rid not in self._slot_of:
                if self._free:
                    slot = heapq.heappop(self._free)
                else:
                    slot = self._width
                    self._width += 1
                self._slot_of[rid] = slot
        last = first_iteration + num_steps - 1
        states: dict[int, tuple[int, int]] = {}
        for rid in present:
            slot = self._slot_of[rid]
            if rid in scheduled:
                request, q = scheduled[rid]
                states[slot] = (rid, _state(request, q))
            else:
                states[slot] = (rid, _STALLED)
        empty_state = _PADDING if output.shape.num_padding_seqs else _EMPTY
        for slot, rid in self._kept:
            if slot not in states:
                states[slot] = (rid, empty_state)
        for slot in [s for s in self._open if s not in states]:
            self._close(slot)
        for slot, (rid, state) in states.items():
            run = self._open.get(slot)
            if (
                run is not None
                and run[0] == rid
                and run[1] == state
                and run[3] == first_iteration - 1
            ):
                run[3] = last
                continue
            if run is not None:
                self._close(slot)
            self._open[slot] = [rid, state, first_iteration, last]

    def _close(self, slot: int) -> None:
        rid, state, first, last = self._open.pop(slot)
        self._rows.append((slot, rid, state, first, last))

    def rows(self) -> list[tuple[int, int, int, int, int]]:
        """The closed runs and the open ones, sorted by slot then first iteration."""
        rows = self._rows + [(slot, r[0], r[1], r[2], r[3]) for slot, r in self._open.items()]
        rows.sort(key=lambda r: (r[0], r[3]))
        return rows

    def to_columns(self) -> dict[str, np.ndarray]:
        """``slots.csv`` as numpy columns (``state`` as text)."""
        rows = self.rows()
        data = np.array(rows, dtype=np.int64).reshape(len(rows), 5)
        names = np.array(SLOT_STATES, dtype=object)
        return {
            "slot": data[:, 0],
            "request_id": data[:, 1],
            "state": names[data[:, 2]],
            "first_iteration": data[:, 3],
            "last_iteration": data[:, 4],
        }


def _state(request: Request, num_tokens: int) -> int:
    """The state of a scheduled request computing ``num_tokens`` tokens this iteration."""
    if num_tokens < request.num_remaining_tokens:
        return _CHUNK
    if request.num_remaining_tokens == 1 and request.num_output_tokens > 0:
        return _DECODE  # one token, or a speculative verification of several
    return _PREFILL


def occupancy(columns: dict[str, np.ndarray], num_iterations: int) -> dict[str, np.ndarray]:
    """Per iteration, how many slots are in each state (for checks and the timeline)."""
    out = {state: np.zeros(num_iterations, dtype=np.int64) for state in SLOT_STATES}
    for state in SLOT_STATES:
        mask = columns["state"] == state
        first = columns["first_iteration"][mask]
        last = columns["last_iteration"][mask]
        delta = np.zeros(num_iterations + 1, dtype=np.int64)
        np.add.at(delta, first, 1)
        np.add.at(delta, last + 1, -1)
        out[state] = np.cumsum(delta)[:num_iterations]
    return out


__all__: Sequence[str] = ("SLOT_COLUMNS", "SLOT_STATES", "SlotLog", "occupancy")
