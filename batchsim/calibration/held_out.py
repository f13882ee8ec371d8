"""The error of a fit per operator group, and :func:`calibrate_ops`, which fits on all points,
fits again with each fold held out (the deterministic k-fold split of :func:`assign_folds`)
and reports the error with the base profile, with the fit and held out, with the range the
points measure (:func:`measured_range`).

Must not import the engine or the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchsim.calibration.fit import ELEMENTWISE_TERMS, GEMM_TERMS, FitData, fit_terms
from batchsim.calibration.measured import LAYER_GROUPS, Measurements
from batchsim.calibration.predict import (
    predict_all_reduce,
    predict_attention,
    predict_cpu,
    with_terms,
    yaml_value,
)
from batchsim.calibration.search import abs_err_pct, stats
from batchsim.catalog.hardware import CalibratedRange, HardwareProfile

__all__ = [
    "FOLD_SEED",
    "GROUPS",
    "CalibrationResult",
    "GroupError",
    "assign_folds",
    "calibrate_ops",
    "measured_range",
]

FOLD_SEED = 0
"""Seed of the generator that deals units to folds (the split is part of the method)."""
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


# ------------------------------------------------------------------------------ errors


def _layer_values(hw: HardwareProfile) -> dict[str, float]:
    return {k: yaml_value(hw, k) for k in (*GEMM_TERMS, *ELEMENTWISE_TERMS)}


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
