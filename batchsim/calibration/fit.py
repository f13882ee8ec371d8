"""Fitting a profile's terms to measured operator timings, and the held-out error of the fit.

Owns the search (:func:`coordinate_search`: deterministic, each term in turn tried at fixed
multiples of its value, coarse steps then fine ones), the fit score (:func:`layer_score`), the
fit of each family of terms (:func:`fit_terms`), the deterministic k-fold split
(:func:`assign_folds`) and :func:`calibrate_ops`, which fits on all points, fits again with
each fold held out, and reports the error per operator group.

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

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchsim.calibration.measured import LAYER_GROUPS, Measurements
from batchsim.calibration.predict import (
    LayerOpModel,
    predict_all_reduce,
    predict_attention,
    predict_cpu,
    with_terms,
    yaml_value,
)
from batchsim.catalog.calibrated_range import CalibratedRange
from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.cost.comm import ring_all_reduce_link_bytes

__all__ = [
    "ATTENTION_TERMS",
    "ELEMENTWISE_TERMS",
    "FOLD_SEED",
    "GEMM_TERMS",
    "GROUPS",
    "CalibrationResult",
    "FitData",
    "GroupError",
    "all_reduce_fit",
    "assign_folds",
    "calibrate_ops",
    "coordinate_search",
    "fit_terms",
    "layer_score",
    "measured_range",
]

FOLD_SEED = 0
"""Seed of the generator that deals units to folds (the split is part of the method)."""
KNEE = (64, 512)
DECODE = (1, 32)
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
GROUPS = (
    "qkv_proj",
    "o_proj",
    "mlp",
    "elementwise",
    "attention_decode",
    "attention_prefill",
    "cpu_overhead",
    "all_reduce",
)
"""Operator groups of the error table."""
MIN_POINTS = {"elementwise": 4, "gemm": 8, "attention": 14}
"""Fewer points than this leave a family's terms at the base profile's values."""
COARSE = (0.8, 0.9, 0.95, 1.05, 1.1, 1.25)
FINE = (0.98, 0.99, 1.01, 1.02)
_FROM_ZERO = (0.5, 1.0, 2.0)  # a fixed time at 0 cannot move by multiples: tried values
_CAPS = {"transition_exponent": 8.0, "attention_masked_fraction": 4.0}


def abs_err_pct(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """|pred / meas - 1| in percent."""
    return np.abs(np.asarray(pred, float) / np.asarray(meas, float) - 1.0) * 100.0


def stats(err: np.ndarray) -> tuple[float, float]:
    """(median, p90) of absolute % errors; NaN when there are none."""
    if not len(err):
        return (math.nan, math.nan)
    return float(np.median(err)), float(np.percentile(err, 90))


def layer_score(err: np.ndarray, tokens: np.ndarray) -> float:
    """Fit score, 1 at the issue's targets: mean of median/5 % and p90/15 % over all points,
    the same over the knee (64-512 tokens) and median/5 % over small decode batches (1-32
    tokens), the last two when there are such points — so that neither the many large-token
    points nor the knee can hide a bad decode regime."""
    parts = [np.median(err) / 5, np.percentile(err, 90) / 15]
    knee = (tokens >= KNEE[0]) & (tokens <= KNEE[1])
    if knee.any():
        parts += [np.median(err[knee]) / 5, np.percentile(err[knee], 90) / 15]
    small = (tokens >= DECODE[0]) & (tokens <= DECODE[1])
    if small.any():
        parts.append(np.median(err[small]) / 5)
    return float(np.mean(parts))


def round_sig(value: float, digits: int = 4) -> float:
    """``value`` rounded to ``digits`` significant digits (the written profile's precision)."""
    return float(f"{value:.{digits}g}")


def search_bounds(key: str) -> tuple[float, float]:
    """The range a term is searched in (YAML unit): fractions in [0.02, 1], others within
    their :class:`~batchsim.catalog.hardware.EfficiencyKey` bounds (some capped lower)."""
    spec = EFFICIENCY_KEYS[key]
    if spec.fraction:
        return 0.02, 1.0
    return spec.minimum, min(spec.upper, _CAPS.get(key, spec.upper))


def coordinate_search(
    score: Callable[[dict[str, float]], float],
    start: Mapping[str, float],
    keys: Sequence[str],
    passes: int = 6,
    bounds: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[dict[str, float], float]:
    """Minimize ``score`` over ``keys`` from ``start``: each pass tries every key at the
    :data:`COARSE` multiples of its value (0.5/1/2 when it is 0), in order, keeping a trial
    when it scores strictly lower; passes repeat until one changes nothing (at most
    ``passes``), then the same with the :data:`FINE` multiples. Values stay within ``bounds``
    (default :func:`search_bounds`) and are rounded to 4 significant digits. Deterministic.

    Returns:
        The values and their score.
    """
    values = {k: round_sig(v) for k, v in start.items()}
    best = score(values)
    for factors in (COARSE, FINE):
        for _ in range(passes):
            improved = False
            for key in keys:
                lo, hi = bounds[key] if bounds is not None else search_bounds(key)
                for factor in factors:
                    now = values[key]
                    tries = [now * factor] if now > 0 else list(_FROM_ZERO)
                    for raw in tries:
                        trial_value = round_sig(min(max(raw, lo), hi))
                        if trial_value == now:
                            continue
                        trial = dict(values, **{key: trial_value})
                        s = score(trial)
                        if s < best:
                            best, values, improved = s, trial, True
            if not improved:
                break
    return values, best


# ------------------------------------------------------------------------------ the data


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


def _layer_values(hw: HardwareProfile) -> dict[str, float]:
    return {k: yaml_value(hw, k) for k in (*GEMM_TERMS, *ELEMENTWISE_TERMS)}


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


# ------------------------------------------------------------------------------ errors


def predict_groups(
    data: FitData, hw: HardwareProfile, rows: Mapping[str, np.ndarray] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(Measured, predicted, index of the point in its table) per operator group, for the
    points of ``rows`` (by table; default all) that measure the group."""
    rows = dict(rows or {})
    meas = data.meas
    out: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def pick(name: str) -> np.ndarray:
        return rows.get(name, np.ones(len(getattr(meas, name)), dtype=bool))

    if data.layer is not None:
        times = data.layer.group_times(_layer_values(hw))
        sel = pick("layer_ops")
        for group in LAYER_GROUPS:
            m = data.layer_measured[group]
            use = sel & ~np.isnan(m)
            if use.any():
                out[group] = (m[use], times[group][use], np.flatnonzero(use))
    if len(meas.attention):
        sel = pick("attention")
        idx = np.flatnonzero(sel)
        pred = predict_attention(meas.attention.iloc[idx], meas.models, hw, data.dtype)
        kind = meas.attention["kind"].to_numpy()[idx]
        measured = meas.attention["measured_s"].to_numpy()[idx]
        for k in ("decode", "prefill"):
            m = kind == k
            if m.any():
                out[f"attention_{k}"] = (measured[m], pred[m], idx[m])
    if len(meas.cpu):
        use = pick("cpu") & data.cpu_rows
        if use.any():
            cpu = meas.cpu[use]
            out["cpu_overhead"] = (
                cpu["measured_s"].to_numpy(),
                predict_cpu(cpu, hw),
                np.flatnonzero(use),
            )
    if len(meas.all_reduce):
        use = pick("all_reduce")
        if use.any():
            ar = meas.all_reduce[use]
            out["all_reduce"] = (
                ar["measured_s"].to_numpy(),
                predict_all_reduce(ar, hw),
                np.flatnonzero(use),
            )
    return out


def assign_folds(units: Sequence[tuple], k: int, seed: int = FOLD_SEED) -> np.ndarray:
    """Fold (0..k-1) of each point: the distinct units, sorted, are permuted by a generator
    seeded with ``seed`` and dealt to the folds in turn; every point of a unit shares its
    fold. The same units give the same folds."""
    unique = sorted(set(units))
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = {unique[j]: i % k for i, j in enumerate(order.tolist())}
    return np.asarray([fold_of[u] for u in units], dtype=np.int64)


def _units(
    table: pd.DataFrame, config: Sequence[str], point: Sequence[str], k: int
) -> tuple[list[tuple], str]:
    """The fold unit of each point and what a unit is: its whole configuration (``config``
    columns) when there are at least ``k`` configurations, else the point itself."""
    if not len(table):
        return [], "point"
    by_config = config != point and table[list(config)].drop_duplicates().shape[0] >= k
    cols = list(config) if by_config else list(point)
    units = [tuple(row) for row in table[cols].itertuples(index=False, name=None)]
    return units, "configuration" if by_config else "point"


@dataclass(frozen=True)
class GroupError:
    """Absolute % errors of one operator group: (median, p90) with the base profile, with the
    fitted one on all points, and held out (each point predicted by the fit without its fold)."""

    group: str
    points: int
    base: tuple[float, float]
    fitted: tuple[float, float]
    held_out: tuple[float, float]


@dataclass
class CalibrationResult:
    """What :func:`calibrate_ops` found.

    Attributes:
        values: Fitted terms (YAML units).
        families: Fitted family -> points.
        notes: Things the user should know about the fit.
        errors: Per operator group.
        folds: Folds of the held-out error (0: none).
        fold_unit: What a fold holds out per table (``configuration`` or ``point``).
        calibrated_range: The measured shapes.
    """

    values: dict[str, float]
    families: dict[str, int]
    notes: list[str]
    errors: list[GroupError]
    folds: int
    fold_unit: dict[str, str]
    calibrated_range: CalibratedRange


def measured_range(meas: Measurements) -> CalibratedRange:
    """The shapes the layer-op, attention and CPU points cover."""

    def span(values: Iterable[int]) -> tuple[int, int] | None:
        vals = [int(v) for v in values]
        return (min(vals), max(vals)) if vals else None

    layer, att, cpu = meas.layer_ops, meas.attention, meas.cpu
    decode = att[att["kind"] == "decode"] if len(att) else att
    prefill = att[att["kind"] == "prefill"] if len(att) else att
    tokens = layer["num_tokens"].tolist() if len(layer) else prefill["chunk"].tolist()
    if len(decode) and not len(layer):
        tokens += decode["batch_size"].tolist()
    models = sorted({*layer["model"].tolist(), *att["model"].tolist()})
    tps = sorted({int(t) for t in (*layer["tp"].tolist(), *att["tp"].tolist())})
    return CalibratedRange(
        models=tuple(models),
        hidden_size=span(meas.models[m].hidden_size for m in models),
        tensor_parallel_size=tuple(tps) if tps else None,
        tokens=span(tokens),
        batch_size=span([*decode["batch_size"].tolist(), *cpu["batch_size"].tolist()]),
        context_tokens=span(att["kv_cache_size"].tolist()),
    )


def calibrate_ops(
    meas: Measurements, base: HardwareProfile, folds: int = 5, dtype: str = "bf16"
) -> CalibrationResult:
    """Fit ``base``'s terms to ``meas`` and measure the fit's error per operator group.

    The fit on all points gives the values; then each of ``folds`` folds is held out in turn,
    the terms fitted again on the rest (from ``base``, as the full fit), and its points
    predicted: the held-out error. A fold holds out whole (model, TP) configurations of the
    layer-op and attention tables when there are at least ``folds`` of them, else single
    points (CPU and all-reduce points: always single).
    """
    data = FitData.build(meas, base, dtype)
    full = fit_terms(data, base)
    fitted_hw = with_terms(base, full.values)
    base_pred = predict_groups(data, base)
    fit_pred = predict_groups(data, fitted_hw)
    keys = {
        "layer_ops": (("model", "tp"), ("model", "tp", "num_tokens")),
        "attention": (
            ("model", "tp"),
            ("model", "tp", "kind", "batch_size", "chunk", "kv_cache_size"),
        ),
        "cpu": (("model", "tp", "batch_size"),) * 2,  # always single points
        "all_reduce": (("num_workers", "bytes"),) * 2,
    }
    fold_of: dict[str, np.ndarray] = {}
    unit_kind: dict[str, str] = {}
    for name, (config, point) in keys.items():
        units, unit_kind[name] = _units(getattr(meas, name), config, point, folds)
        fold_of[name] = assign_folds(units, folds) if units else np.zeros(0, np.int64)
    held: dict[str, np.ndarray] = {g: np.full(len(v[0]), np.nan) for g, v in fit_pred.items()}
    position = {g: {int(i): j for j, i in enumerate(v[2].tolist())} for g, v in fit_pred.items()}
    if folds >= 2:
        for f in range(folds):
            train = {name: fold_of[name] != f for name in keys}
            test = {name: fold_of[name] == f for name in keys}
            if not any(t.any() for t in test.values()):
                continue
            sub = fit_terms(data, base, train)
            preds = predict_groups(data, with_terms(base, sub.values), test)
            for group, (_, pred, idx) in preds.items():
                for value, i in zip(pred.tolist(), idx.tolist(), strict=True):
                    held[group][position[group][i]] = value
    errors = []
    for group in GROUPS:
        if group not in fit_pred:
            continue
        measured, pred, _ = fit_pred[group]
        h = held[group]
        errors.append(
            GroupError(
                group,
                len(measured),
                stats(abs_err_pct(base_pred[group][1], measured)),
                stats(abs_err_pct(pred, measured)),
                stats(abs_err_pct(h[~np.isnan(h)], measured[~np.isnan(h)])),
            )
        )
    return CalibrationResult(
        full.values,
        full.families,
        full.notes,
        errors,
        folds if folds >= 2 else 0,
        unit_kind,
        measured_range(meas),
    )
