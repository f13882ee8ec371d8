"""What a cost is: the result types of the cost model and the rule that joins compute and memory.

Owns :data:`OP_NAMES`, :class:`OpCost` (one operator group), :class:`IterationCost` (one
iteration), :class:`DecodeSlopes`, the building blocks every kernel model returns
(:class:`KernelCost`, summed into a group by :class:`CostSum`), the 16-bit activation width
:data:`ACT_BYTES`, and :func:`smoothmax`, the p-norm that turns a kernel's compute and memory
times into its time.

Operator groups (:data:`OP_NAMES`), summed over all layers, per GPU:

* ``qkv_proj`` — q/k/v projections (MLA: q_a, q_b, kv_a and the absorbed W_UK);
* ``attention`` — KV-cache write + the attention kernel (causal prefill, chunked prefill over
  a cached context, decode; FLOPs from ``attn_pairs``, KV bytes from ``kv_read_tokens``);
* ``o_proj`` — output projection (MLA: absorbed W_UV + o_proj);
* ``mlp`` — dense MLP GEMMs; MoE router, routed experts (weight bytes of the expected *union*
  of experts the batch touches) and shared experts;
* ``elementwise`` — norms, activation, residual add, rotary embedding, embedding gather;
* ``lm_head`` — logits, only for the rows that sample;
* ``all_reduce`` — two ring all-reduces per layer under tensor parallelism (0 at tp=1);
* ``overhead`` — fixed GPU-side cost per forward pass.

Must not import anything from batchsim: numpy and stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Union, overload

import numpy as np

__all__ = [
    "ACT_BYTES",
    "EMPTY_COST",
    "EMPTY_STEP",
    "OP_NAMES",
    "ZERO_OP",
    "CostSum",
    "DecodeSlopes",
    "IterationCost",
    "KernelCost",
    "Num",
    "OpCost",
    "StepCost",
    "smoothmax",
    "vmax",
]

Num = Union[int, float, np.ndarray]  # noqa: UP007 - used at runtime in annotations only

ACT_BYTES = 2.0
"""Bytes of one activation value: activations, logits inputs and all-reduce messages stay
16-bit whatever the weight dtype."""

OP_NAMES = (
    "qkv_proj",
    "attention",
    "o_proj",
    "mlp",
    "elementwise",
    "lm_head",
    "all_reduce",
    "overhead",
)
"""The operator groups of every :class:`IterationCost`, in forward-pass order."""


# --------------------------------------------------------------------------- kernel time law


def vmax(a: Num, b: Num) -> Num:
    """``max(a, b)`` for python numbers, elementwise ``np.maximum`` if either is an array."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


@overload
def smoothmax(a: float, b: float, p: float) -> float: ...
@overload
def smoothmax(a: Num, b: Num, p: float) -> Num: ...
def smoothmax(a: Num, b: Num, p: float) -> Num:
    """p-norm ``(a^p + b^p)^(1/p)`` of two non-negative times, computed without overflow.

    A kernel's time from its compute time and its memory time: a gradual transition instead of
    the roofline's corner (``p -> inf`` is the plain ``max``).
    """
    hi = vmax(a, b)
    if isinstance(hi, np.ndarray):
        lo = np.minimum(a, b)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(hi > 0, lo / np.where(hi > 0, hi, 1.0), 0.0)
        return hi * (1.0 + ratio**p) ** (1.0 / p)
    if hi <= 0.0:
        return 0.0
    lo = a if a < b else b
    return hi * (1.0 + (lo / hi) ** p) ** (1.0 / p)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class OpCost:
    """Cost of one operator group over all layers, on one GPU.

    Attributes:
        flops: Floating-point operations.
        bytes: Bytes moved from/to device memory (``all_reduce``: bytes sent on the link).
        time: Predicted time, s.
        compute_time: Compute part of the roofline (tile-quantized), s.
        memory_time: Memory part of the roofline, s.
    """

    flops: Any
    bytes: Any
    time: Any
    compute_time: Any = 0.0
    memory_time: Any = 0.0


ZERO_OP = OpCost(0.0, 0.0, 0.0)
"""A group that costs nothing (no rows, tp=1 all-reduce, no sampled rows)."""


@dataclass(frozen=True, slots=True)
class IterationCost:
    """Cost of one iteration on one GPU (scalars, or arrays for a vectorized stretch).

    Attributes:
        ops: Exactly the groups of :data:`OP_NAMES`, each an :class:`OpCost`.
        time: Sum of the op times, s.
        flops: Sum of the op FLOPs.
        bytes: Device-memory bytes: sum of op bytes except ``all_reduce`` (link traffic).
        weight_bytes: Weight bytes read (each weight once per iteration; MoE: touched experts).
        kv_bytes: KV-cache bytes read and written.
        activation_bytes: The rest of ``bytes`` (activations in and out of kernels).
        compute_time: Summed compute time of the kernels (not the link or fixed overhead), s.
        memory_time: Summed memory time of the same kernels, s.
    """

    ops: dict[str, OpCost]
    time: Any
    flops: Any
    bytes: Any
    weight_bytes: Any
    kv_bytes: Any
    activation_bytes: Any
    compute_time: Any
    memory_time: Any

    @property
    def compute_bound(self) -> Any:
        """Summed compute time exceeds summed memory time."""
        return self.compute_time > self.memory_time

    @property
    def intensity(self) -> Any:
        """Arithmetic intensity, FLOP per device-memory byte."""
        return self.flops / self.bytes if not np.isscalar(self.bytes) or self.bytes else 0.0

    @property
    def bound(self) -> Any:
        """``"compute"`` or ``"memory"`` (an array of those for a stretch)."""
        if isinstance(self.compute_bound, np.ndarray):
            return np.where(self.compute_bound, "compute", "memory")
        return "compute" if self.compute_bound else "memory"

    @classmethod
    def stack(cls, costs: Sequence[IterationCost]) -> IterationCost:
        """One cost whose totals and group fields are arrays over scalar ``costs``, in order."""
        ops = {
            name: OpCost(*(_column(getattr(c.ops[name], f) for c in costs) for f in _OP_FIELDS))
            for name in OP_NAMES
        }
        return cls(ops, *(_column(getattr(c, f) for c in costs) for f in _TOTAL_FIELDS))


def _column(values: Iterable[Any]) -> np.ndarray:
    return np.array(list(values), dtype=float)


_OP_FIELDS = tuple(f.name for f in fields(OpCost))
_TOTAL_FIELDS = tuple(f.name for f in fields(IterationCost) if f.name != "ops")


EMPTY_COST = IterationCost(
    {name: ZERO_OP for name in OP_NAMES}, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
)
"""The cost of an iteration with no rows."""


@dataclass(frozen=True, slots=True)
class DecodeSlopes:
    """Growth of an iteration's totals per extra cached token read by a decode row
    (see :attr:`~batchsim.cost.RooflineCostModel.decode_token_slopes`)."""

    flops: float
    bytes: float
    kv_bytes: float
    compute_time: float
    memory_time: float


class StepCost(NamedTuple):
    """The totals of one iteration that the engine logs: an :class:`IterationCost` without
    its groups (see :meth:`~batchsim.cost.RooflineCostModel.step_cost`).

    Attributes:
        time: s.
        flops: FLOPs.
        bytes: Device-memory bytes.
        weight_bytes: Weight bytes read.
        kv_bytes: KV-cache bytes read and written.
        margin: Compute time minus memory time, s (> 0: compute-bound).
    """

    time: float
    flops: float
    bytes: float
    weight_bytes: float
    kv_bytes: float
    margin: float


EMPTY_STEP = StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""The totals of an iteration with no rows."""


# --------------------------------------------------------------------------- building blocks


class KernelCost(NamedTuple):
    """One kernel launch (per layer) as a kernel model prices it (a tuple: cheap to build).

    Attributes:
        flops: Floating-point operations.
        bytes: Device-memory bytes moved.
        weight_bytes: The part of ``bytes`` that is weights.
        time: Predicted time, s.
        compute_time: Compute part of the roofline, s.
        memory_time: Memory part of the roofline, s.
    """

    flops: float
    bytes: float
    weight_bytes: float
    time: float
    compute_time: float
    memory_time: float


class CostSum:
    """Running sum of the kernels of one operator group (FLOPs, bytes, weight bytes, times)."""

    __slots__ = ("bytes", "compute_time", "flops", "memory_time", "time", "weight_bytes")

    def __init__(self) -> None:
        self.flops = self.bytes = self.weight_bytes = 0.0
        self.time = self.compute_time = self.memory_time = 0.0

    def add(self, kernel: KernelCost, times: float = 1.0) -> None:
        """Add ``times`` (e.g. layers) x ``kernel``."""
        flops, nbytes, weight, time, tc, tm = kernel
        self.flops += flops * times
        self.bytes += nbytes * times
        self.weight_bytes += weight * times
        self.time += time * times
        self.compute_time += tc * times
        self.memory_time += tm * times

    def op(self) -> OpCost:
        """The sum as an operator group."""
        return OpCost(self.flops, self.bytes, self.time, self.compute_time, self.memory_time)
