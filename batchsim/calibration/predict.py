"""What the cost model predicts for measured operator points, for any values of a profile's terms.

Owns :func:`with_terms` and :func:`yaml_value` (a profile with some terms replaced, in YAML
units), :func:`layer_breakdown` (the per-layer kernels of a dense layer priced by the cost
model's own pieces, one point at a time) and the fast paths the fit evaluates thousands of
times:

* :class:`LayerOpModel` prices every layer-op point once at unit efficiencies and keeps each
  kernel's compute and memory time; the time for other GEMM and elementwise terms is then
  ``n x fixed time + smoothmax(t_c / compute, t_m / memory, p)`` (GEMMs) and ``n x fixed
  time + t_m / efficiency`` (elementwise), in numpy. The tile choice does not depend on those
  terms (every tile's time scales alike), so this equals pricing each point again;
  ``tests/test_calibrate.py`` checks it against :func:`layer_breakdown`.
* :func:`predict_attention` prices attention points with the cost model's attention kernel.

Must not import the engine or the scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.catalog.model import ModelSpec
from batchsim.cost import OpCost, RooflineCostModel
from batchsim.cost.comm import ring_all_reduce_time
from batchsim.cost.costs import CostSum, smoothmax
from batchsim.cost.gemm import Gemm
from batchsim.cost.layers import ElementwiseKernel, activation_flops

__all__ = [
    "CPU_TERMS",
    "LayerOpModel",
    "layer_breakdown",
    "predict_all_reduce",
    "predict_attention",
    "predict_cpu",
    "with_terms",
    "yaml_value",
]

CPU_TERMS = ("cpu_overhead.base_ms", "cpu_overhead.per_seq_ms")
"""The ``cpu_overhead:`` terms, named by their key path."""
_FIELDS = frozenset(f.name for f in dataclasses.fields(HardwareProfile))


def _by_config(points: pd.DataFrame) -> list[tuple[str, int, np.ndarray]]:
    """(model, tp, row positions) of each configuration of ``points``, sorted."""
    keys = list(zip(points["model"].tolist(), points["tp"].tolist(), strict=True))
    out: dict[tuple[str, int], list[int]] = {}
    for i, (name, tp) in enumerate(keys):
        out.setdefault((str(name), int(tp)), []).append(i)
    return [(name, tp, np.asarray(rows, np.int64)) for (name, tp), rows in sorted(out.items())]


def with_terms(hw: HardwareProfile, values: Mapping[str, float]) -> HardwareProfile:
    """Copy of ``hw`` with some terms replaced: ``efficiency:`` keys and ``cpu_overhead.base_ms``
    / ``cpu_overhead.per_seq_ms``, in YAML units."""
    eff = dict(hw.efficiency)
    attrs: dict[str, float] = {}
    for key, value in values.items():
        if key == "cpu_overhead.base_ms":
            attrs["cpu_overhead_base"] = value / 1e3
            continue
        if key == "cpu_overhead.per_seq_ms":
            attrs["cpu_overhead_per_seq"] = value / 1e3
            continue
        spec = EFFICIENCY_KEYS[key]
        eff[spec.si_name] = value / spec.per_si
        if spec.si_name in _FIELDS:
            attrs[spec.si_name] = value / spec.per_si
    return dataclasses.replace(hw, efficiency=eff, **attrs)  # type: ignore[arg-type]


def yaml_value(hw: HardwareProfile, key: str) -> float:
    """A term of ``hw`` in its YAML unit (``efficiency:`` key or ``cpu_overhead.*``)."""
    if key == "cpu_overhead.base_ms":
        return hw.cpu_overhead_base * 1e3
    if key == "cpu_overhead.per_seq_ms":
        return hw.cpu_overhead_per_seq * 1e3
    spec = EFFICIENCY_KEYS[key]
    return hw.efficiency[spec.si_name] * spec.per_si


def layer_breakdown(cm: RooflineCostModel, num_tokens: int) -> dict[str, OpCost]:
    """Per-layer costs of the token-wise kernels of one dense layer for ``num_tokens`` rows, on
    one GPU, priced by the cost model's own GEMM and elementwise models.

    Keys: ``qkv_proj``, ``o_proj``, ``mlp_up``, ``mlp_down``, ``mlp_act``, ``norms`` (both
    norms), ``rope``, ``add`` (the measured ops are per kernel; the simulator sums them).
    """
    t, layers = float(num_tokens), cm.layers

    def gemms(shapes: Iterable[Gemm]) -> OpCost:
        acc = CostSum()
        cm.gemm.add(acc, shapes, t, 1.0)
        return acc.op()

    def elementwise(elems: float, flops: float, launches: int) -> OpCost:
        acc = CostSum()
        acc.add(cm.elementwise.price(elems, flops, launches))
        return acc.op()

    def kernel(k: ElementwiseKernel) -> OpCost:
        return elementwise(t * k.elems, t * k.flops, k.launches)

    act = t * layers.activation_width * layers.gate_factor
    return {
        "qkv_proj": gemms(layers.qkv),
        "o_proj": gemms(layers.o),
        "mlp_up": gemms(layers.dense_mlp[:1]),
        "mlp_down": gemms(layers.dense_mlp[1:]),
        "mlp_act": elementwise(act, activation_flops(act), 1),
        "norms": kernel(layers.norms),
        "rope": kernel(layers.rope),
        "add": kernel(layers.residual_add),
    }


_UNIT = {
    "compute": 1.0,
    "memory": 1.0,
    "elementwise": 1.0,
    "min_kernel_time_us": 0.0,
    "elementwise_kernel_time_us": 0.0,
}
_GEMM_GROUPS = {"qkv_proj": ("qkv_proj",), "o_proj": ("o_proj",), "mlp": ("mlp_up", "mlp_down")}
_ELEMENTWISE_GROUPS = {"mlp": ("mlp_act",), "elementwise": ("norms", "rope", "add")}


class LayerOpModel:
    """Times of the layer-op groups (``qkv_proj``, ``o_proj``, ``mlp`` = up + act + down,
    ``elementwise`` = norms + rotary + add, and ``act`` alone) of every point, for any GEMM and
    elementwise terms.

    Args:
        points: ``model, tp, num_tokens`` per point.
        models: The models by name.
        hw: The profile whose other terms (tiles, SMs, peaks) price the kernels.
        dtype: Weight dtype.
    """

    def __init__(
        self,
        points: pd.DataFrame,
        models: Mapping[str, ModelSpec],
        hw: HardwareProfile,
        dtype: str = "bf16",
    ) -> None:
        self.num_points = n = len(points)
        unit = with_terms(hw, _UNIT)
        gemm: dict[str, list[tuple[int, float, float]]] = {g: [] for g in _GEMM_GROUPS}
        elem: dict[str, list[tuple[int, float, float]]] = {
            g: [] for g in (*_ELEMENTWISE_GROUPS, "act")
        }
        if n:
            for name, tp, index in _by_config(points):
                cm = RooflineCostModel(models[name], unit, tp=tp, dtype=dtype)
                layers = cm.layers
                shapes = {
                    "qkv_proj": layers.qkv,
                    "o_proj": layers.o,
                    "mlp_up": layers.dense_mlp[:1],
                    "mlp_down": layers.dense_mlp[1:],
                }
                tokens = points["num_tokens"].to_numpy()[index]
                for i, t in zip(index.tolist(), tokens.tolist(), strict=True):
                    rows = float(t)
                    for group, parts in _GEMM_GROUPS.items():
                        for part in parts:
                            for g in shapes[part]:
                                k = cm.gemm.price(g, rows)
                                gemm[group].append((i, k.compute_time, k.memory_time))
                    act = rows * layers.activation_width * layers.gate_factor
                    k = cm.elementwise.price(act, activation_flops(act), 1)
                    elem["mlp"].append((i, 1.0, k.memory_time))
                    elem["act"].append((i, 1.0, k.memory_time))
                    for kern in (layers.norms, layers.rope, layers.residual_add):
                        if kern.launches == 0 and kern.elems == 0:
                            continue
                        k = cm.elementwise.price(
                            rows * kern.elems, rows * kern.flops, kern.launches
                        )
                        elem["elementwise"].append((i, float(kern.launches), k.memory_time))

        def arrays(rows: list[tuple[int, float, float]]) -> tuple[np.ndarray, ...]:
            if not rows:
                return (np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
            idx, a, b = zip(*rows, strict=True)
            return (np.asarray(idx, np.int64), np.asarray(a, float), np.asarray(b, float))

        self._gemm = {g: arrays(rows) for g, rows in gemm.items()}
        self._elem = {g: arrays(rows) for g, rows in elem.items()}

    def elementwise_times(self, values: Mapping[str, float], group: str) -> np.ndarray:
        """Per-point time of the elementwise kernels of ``group`` (``mlp``: the activation,
        ``elementwise``, ``act``), s."""
        idx, launches, tm = self._elem[group]
        fixed = values["elementwise_kernel_time_us"] * 1e-6
        t = launches * fixed + tm / values["elementwise"]
        return np.bincount(idx, weights=t, minlength=self.num_points)

    def gemm_times(self, values: Mapping[str, float], group: str) -> np.ndarray:
        """Per-point time of the GEMMs of ``group`` (``qkv_proj``, ``o_proj``, ``mlp``), s."""
        idx, tc, tm = self._gemm[group]
        fixed = values["min_kernel_time_us"] * 1e-6
        t = fixed + smoothmax(
            tc / values["compute"], tm / values["memory"], values["transition_exponent"]
        )
        return np.bincount(idx, weights=t, minlength=self.num_points)

    def group_times(self, values: Mapping[str, float]) -> dict[str, np.ndarray]:
        """Per-point time of every group, s (``values``: the six GEMM and elementwise terms,
        YAML units)."""
        out = {g: self.gemm_times(values, g) for g in _GEMM_GROUPS}
        out["mlp"] = out["mlp"] + self.elementwise_times(values, "mlp")
        out["elementwise"] = self.elementwise_times(values, "elementwise")
        out["act"] = self.elementwise_times(values, "act")
        return out


def predict_attention(
    points: pd.DataFrame, models: Mapping[str, ModelSpec], hw: HardwareProfile, dtype: str = "bf16"
) -> np.ndarray:
    """The attention kernel's time of each point (one layer, s): decode rows of ``batch_size``
    requests with ``kv_cache_size`` cached tokens each, or one prefill chunk of ``chunk`` rows
    after ``kv_cache_size`` cached tokens; ``split_tokens`` (NaN: none) is the key length the
    split-KV heuristic saw."""
    out = np.zeros(len(points))
    if not len(points):
        return out
    for name, tp, index in _by_config(points):
        cm = RooflineCostModel(models[name], hw, tp=tp, dtype=dtype)
        sub = points.iloc[index]
        rows = zip(
            sub["kind"].tolist(),
            sub["batch_size"].tolist(),
            sub["chunk"].tolist(),
            sub["kv_cache_size"].tolist(),
            sub["split_tokens"].tolist(),
            strict=True,
        )
        for i, (kind, b, q, c, split) in zip(index.tolist(), rows, strict=True):
            b, q, c = int(b), int(q), int(c)
            pairs = b * (q * c + q * (q + 1) // 2)
            prefill = b * q if kind == "prefill" else 0
            split_tokens = None if split != split else float(split)
            out[i] = cm.attention_kernel(b, b * q, b * c, pairs, prefill, split_tokens).time
    return out


def predict_cpu(points: pd.DataFrame, hw: HardwareProfile) -> np.ndarray:
    """Engine CPU time per iteration of ``batch_size`` requests, s."""
    batch = points["batch_size"].to_numpy(dtype=float)
    return hw.cpu_overhead_base + hw.cpu_overhead_per_seq * batch


def predict_all_reduce(points: pd.DataFrame, hw: HardwareProfile) -> np.ndarray:
    """One ring all-reduce of ``bytes`` over ``num_workers`` GPUs of one node, s."""
    link = hw.interconnect_bandwidth * hw.interconnect_efficiency
    return np.asarray(
        ring_all_reduce_time(
            points["bytes"].to_numpy(dtype=float),
            points["num_workers"].to_numpy(dtype=float),
            link,
            hw.interconnect_latency,
        ),
        dtype=float,
    )
