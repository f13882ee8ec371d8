"""Fitting a profile's terms to measured operator timings, family by family.

Owns what is fitted (:class:`FitData`, the points with what the fit precomputes once) and the
fit of each family of terms (:func:`fit_terms`), each searched with
:func:`~batchsim.calibration.search.coordinate_search`; the held-out error of the fit is
:mod:`~batchsim.calibration.held_out`.

Families, fitted in this order on the points that measure them (others keep the base
profile's values):

============== ======================================================== ======================
family         terms                                                    points
============== ======================================================== ======================
elementwise    ``elementwise``, ``elementwise_kernel_time_us``          norms + rotary + add
                                                                        + activation
GEMM           ``compute``, ``memory``, ``min_kernel_time_us``,         qkv_proj, o_proj, mlp
               ``transition_exponent``
attention      the seven ``attention*`` terms                           decode and prefill
CPU overhead   ``cpu_overhead.base_ms``, ``cpu_overhead.per_seq_ms``    rows of the smallest
                                                                        TP (least squares)
all-reduce     ``interconnect``, ``interconnect_latency_us``            weighted least squares
============== ======================================================== ======================

The tile sizes, ``launch_overhead_ms`` and ``host_transfer`` are not fitted (no operator
measurement shows them). Must not import the engine or the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchsim.calibration.measured import LAYER_GROUPS, Measurements
from batchsim.calibration.predict import (
    LayerOpModel,
    predict_attention,
    with_terms,
    yaml_value,
)
from batchsim.calibration.search import abs_err_pct, coordinate_search, layer_score, round_sig
from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.cost.comm import ring_all_reduce_link_bytes

__all__ = [
    "ATTENTION_TERMS",
    "ELEMENTWISE_TERMS",
    "GEMM_TERMS",
    "FitData",
    "all_reduce_fit",
    "fit_terms",
]

ELEMENTWISE_TERMS = ("elementwise", "elementwise_kernel_time_us")
GEMM_TERMS = ("compute", "memory", "min_kernel_time_us", "transition_exponent")
ATTENTION_TERMS = (
    "attention_kernel_time_us",
    "attention_sm_bandwidth",
    "attention_cta_time_us",
    "attention_combine_time_us",
    "attention_prefill_time_us",
    "attention",
    "attention_masked_fraction",
)
ALL_REDUCE_TERMS = ("interconnect", "interconnect_latency_us")
CPU_TERMS = ("cpu_overhead.base_ms", "cpu_overhead.per_seq_ms")
MIN_POINTS = {"elementwise": 4, "gemm": 8, "attention": 14}
"""Fewer points than this leave a family's terms at the base profile's values."""


def _layer_measured(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """Measured time of each layer group per point (NaN where the group was not measured)."""
    out = {}
    for group, ops in LAYER_GROUPS.items():
        if all(op in table.columns for op in ops):
            out[group] = table[list(ops)].sum(axis=1, min_count=len(ops)).to_numpy(dtype=float)
        else:
            out[group] = np.full(len(table), np.nan)
    out["act"] = (
        table["mlp_act"].to_numpy(dtype=float)
        if "mlp_act" in table.columns
        else np.full(len(table), np.nan)
    )
    return out


@dataclass
class FitData:
    """The measurements with what the fit precomputes once (unit-efficiency kernel times).

    Attributes:
        meas: The points.
        layer: Fast layer-op pricing, None without layer-op points.
        layer_measured: Measured time per layer group per point (NaN: not measured).
        cpu_rows: The CPU points of the smallest tensor-parallel degree (the fitted ones).
        dtype: Weight dtype.
    """

    meas: Measurements
    layer: LayerOpModel | None
    layer_measured: dict[str, np.ndarray]
    cpu_rows: np.ndarray
    dtype: str = "bf16"

    @classmethod
    def build(cls, meas: Measurements, hw: HardwareProfile, dtype: str = "bf16") -> FitData:
        """Precompute the layer-op kernels of ``meas`` on ``hw`` (the slow part, done once)."""
        layer = None
        if len(meas.layer_ops):
            layer = LayerOpModel(meas.layer_ops, meas.models, hw, dtype)
        cpu = meas.cpu
        cpu_rows = np.zeros(len(cpu), dtype=bool)
        if len(cpu):
            cpu_rows = (cpu["tp"] == cpu["tp"].min()).to_numpy()
        return cls(meas, layer, _layer_measured(meas.layer_ops), cpu_rows, dtype)


@dataclass
class Fit:
    """Fitted values (YAML units, every fitted term), which families were fitted, and notes."""

    values: dict[str, float] = field(default_factory=dict)
    families: dict[str, int] = field(default_factory=dict)
    """Fitted family -> points it was fitted on."""
    notes: list[str] = field(default_factory=list)


def _fit_elementwise(data: FitData, values: dict[str, float], rows: np.ndarray, fit: Fit) -> None:
    assert data.layer is not None
    meas = data.layer_measured
    target = meas["elementwise"].copy()
    with_act = ~np.isnan(meas["act"])
    target[with_act] += meas["act"][with_act]
    use = rows & ~np.isnan(target)
    if use.sum() < MIN_POINTS["elementwise"]:
        return
    tokens = data.meas.layer_ops["num_tokens"].to_numpy()[use]
    layer = data.layer

    def score(v: dict[str, float]) -> float:
        pred = layer.elementwise_times(v, "elementwise") + np.where(
            with_act, layer.elementwise_times(v, "act"), 0.0
        )
        return layer_score(abs_err_pct(pred[use], target[use]), tokens)

    base_eff, base_t = values["elementwise"], values["elementwise_kernel_time_us"]
    grid_t = [base_t * f for f in (0.5, 0.75, 1.0, 1.25, 1.5)] if base_t > 0 else [0, 1, 2, 3, 4]
    trials = (
        dict(
            values,
            elementwise=round_sig(min(1.0, base_eff * f)),
            elementwise_kernel_time_us=round_sig(t),
        )
        for f in (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4)
        for t in grid_t
    )
    start = min(trials, key=score)  # the first of the lowest-scoring trials
    found, _ = coordinate_search(score, start, ELEMENTWISE_TERMS)
    values.update({k: found[k] for k in ELEMENTWISE_TERMS})
    fit.families["elementwise"] = int(use.sum())


def _fit_gemm(data: FitData, values: dict[str, float], rows: np.ndarray, fit: Fit) -> None:
    assert data.layer is not None
    layer = data.layer
    tokens_all = data.meas.layer_ops["num_tokens"].to_numpy()
    groups = [
        g for g in ("qkv_proj", "o_proj", "mlp") if not np.isnan(data.layer_measured[g]).all()
    ]
    uses = {g: rows & ~np.isnan(data.layer_measured[g]) for g in groups}
    if sum(int(u.sum()) for u in uses.values()) < MIN_POINTS["gemm"]:
        return
    target = np.concatenate([data.layer_measured[g][uses[g]] for g in groups])
    tokens = np.concatenate([tokens_all[uses[g]] for g in groups])
    act = layer.elementwise_times(values, "mlp")  # fixed while the GEMM terms move

    def score(v: dict[str, float]) -> float:
        parts = []
        for g in groups:
            t = layer.gemm_times(v, g)
            if g == "mlp":
                t = t + act
            parts.append(t[uses[g]])
        return layer_score(abs_err_pct(np.concatenate(parts), target), tokens)

    c0, m0 = values["compute"], values["memory"]
    k0 = values["min_kernel_time_us"]
    kernel_times = [k0 * f for f in (0.5, 1.0, 1.5)] if k0 > 0 else [0.0, 2.5, 5.0]
    factors = (0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3)
    trials = (
        dict(
            values,
            compute=round_sig(min(1.0, c0 * fc)),
            memory=round_sig(min(1.0, m0 * fm)),
            transition_exponent=p,
            min_kernel_time_us=round_sig(k),
        )
        for fc in factors
        for fm in factors
        for p in (1.5, 2.0, 2.5, 3.0, 4.0)
        for k in kernel_times
    )
    start = min(trials, key=score)  # the first of the lowest-scoring trials
    found, _ = coordinate_search(score, start, GEMM_TERMS)
    values.update({k: found[k] for k in GEMM_TERMS})
    fit.families["gemm"] = len(target)


def _fit_attention(
    data: FitData, base: HardwareProfile, values: dict[str, float], rows: np.ndarray, fit: Fit
) -> None:
    points = data.meas.attention[rows].reset_index(drop=True)
    if len(points) < MIN_POINTS["attention"]:
        return
    measured = points["measured_s"].to_numpy()
    kinds = [(k, (points["kind"] == k).to_numpy()) for k in ("decode", "prefill")]
    kinds = [(k, m) for k, m in kinds if m.any()]

    def score(v: dict[str, float]) -> float:
        pred = predict_attention(points, data.meas.models, with_terms(base, v), data.dtype)
        err = abs_err_pct(pred, measured)
        return float(sum(np.median(err[m]) / 5 + np.percentile(err[m], 90) / 15 for _, m in kinds))

    start = {k: values[k] for k in ATTENTION_TERMS}
    others = {k: v for k, v in values.items() if k not in ATTENTION_TERMS}
    found, _ = coordinate_search(lambda v: score({**others, **v}), start, ATTENTION_TERMS)
    values.update(found)
    fit.families["attention"] = len(points)


def _fit_cpu(data: FitData, values: dict[str, float], rows: np.ndarray, fit: Fit) -> None:
    use = rows & data.cpu_rows
    cpu = data.meas.cpu[use]
    if cpu["batch_size"].nunique() < 2:
        return
    batch = cpu["batch_size"].to_numpy(dtype=float)
    ms = cpu["measured_s"].to_numpy() * 1e3
    slope, intercept = np.polyfit(batch, ms, 1)
    if slope < 0:
        fit.notes.append(
            f"CPU overhead falls with the batch size in the data (slope {slope:.4f} ms/seq): "
            "fitted a constant instead (per_seq_ms = 0)"
        )
        slope, intercept = 0.0, float(np.mean(ms))
    elif intercept < 0:
        fit.notes.append(
            f"CPU overhead fit has a negative base ({intercept:.3f} ms): fitted through the "
            "origin instead (base_ms = 0)"
        )
        slope, intercept = float(np.dot(batch, ms) / np.dot(batch, batch)), 0.0
    values["cpu_overhead.base_ms"] = round_sig(float(intercept))
    values["cpu_overhead.per_seq_ms"] = round_sig(float(slope))
    fit.families["cpu_overhead"] = len(cpu)


def all_reduce_fit(table: pd.DataFrame) -> tuple[float, float] | None:
    """(Latency s, achieved bus bandwidth B/s) of ``t = latency + 2 (n-1)/n x bytes /
    bandwidth`` over the all-reduce points (least squares of the relative error), or None when
    the time does not grow with the message size."""
    x = np.asarray(
        ring_all_reduce_link_bytes(table["bytes"].to_numpy(), table["num_workers"].to_numpy())
    )
    t = table["measured_s"].to_numpy()
    w = 1.0 / t  # least squares on the relative error
    a = np.vstack([np.ones(len(x)), x]).T * w[:, None]
    (latency, inv_bw), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if inv_bw <= 0:
        return None
    return float(latency), float(1.0 / inv_bw)


def _fit_all_reduce(
    data: FitData, base: HardwareProfile, values: dict[str, float], rows: np.ndarray, fit: Fit
) -> None:
    ar = data.meas.all_reduce[rows]
    if ar["bytes"].nunique() < 2:
        return
    found = all_reduce_fit(ar)
    if found is None:
        fit.notes.append("all-reduce time does not grow with the message size: not fitted")
        return
    latency, bandwidth = found
    eff = bandwidth / base.interconnect_bandwidth
    if eff > 1.0:
        fit.notes.append(
            f"all-reduce bus bandwidth {bandwidth / 1e9:.0f} GB/s exceeds the profile's "
            f"interconnect_bandwidth_gb_s {base.interconnect_bandwidth / 1e9:g}: "
            "interconnect set to 1 (check the datasheet value)"
        )
        eff = 1.0
    if latency < 0:
        fit.notes.append(f"all-reduce latency fitted negative ({latency * 1e6:.1f} us): set to 0")
        latency = 0.0
    values["interconnect"] = round_sig(eff)
    values["interconnect_latency_us"] = round_sig(latency * 1e6)
    fit.families["all_reduce"] = len(ar)


def fit_terms(
    data: FitData, base: HardwareProfile, masks: Mapping[str, np.ndarray] | None = None
) -> Fit:
    """Fit every family of terms the points of ``masks`` (by table; default all) measure.

    Returns:
        The values (YAML units) of every fitted term; the others keep ``base``'s.
    """
    masks = dict(masks or {})

    def rows(name: str) -> np.ndarray:
        table = getattr(data.meas, name)
        return masks.get(name, np.ones(len(table), dtype=bool))

    fit = Fit()
    values = {k: yaml_value(base, k) for k in (*EFFICIENCY_KEYS, *CPU_TERMS)}
    if data.layer is not None:
        _fit_elementwise(data, values, rows("layer_ops"), fit)
        _fit_gemm(data, values, rows("layer_ops"), fit)
    if len(data.meas.attention):
        _fit_attention(data, base, values, rows("attention"), fit)
    if len(data.meas.cpu):
        _fit_cpu(data, values, rows("cpu"), fit)
    if len(data.meas.all_reduce):
        _fit_all_reduce(data, base, values, rows("all_reduce"), fit)
    fitted = {
        "elementwise": ELEMENTWISE_TERMS,
        "gemm": GEMM_TERMS,
        "attention": ATTENTION_TERMS,
        "cpu_overhead": CPU_TERMS,
        "all_reduce": ALL_REDUCE_TERMS,
    }
    fit.values = {k: values[k] for fam in fit.families for k in fitted[fam]}
    return fit
