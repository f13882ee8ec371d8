"""Measured fused-MoE kernel tables as calibration input: the profile's ``moe_compute`` term.

Owns reading a MoE table (:func:`read_moe_measurements`: the layout of NVIDIA AIConfigurator's
``moe_perf`` tables, Parquet or CSV, columns ``moe_dtype, num_tokens, hidden_size, inter_size,
topk, num_experts, moe_tp_size, latency`` in ms, optionally ``moe_ep_size`` and
``distribution``), the model's time of each row (:func:`moe_model_times`: what ``batchsim
kernel moe`` prices, the routed experts' grouped GEMMs), the fit of ``moe_compute`` — the
fraction of the GEMM compute rate a fused MoE kernel's grouped GEMMs reach — on the bf16
kernels (:func:`fit_moe_compute`), and the error per dtype (:func:`moe_errors`).

Only rows batchsim can price are kept: no expert parallelism (``moe_ep_size`` 1), balanced
routing (batchsim routes uniformly), and the dtypes of :data:`MOE_DTYPES`; several kernels of
one shape keep the fastest.

Must not import the engine or the scheduler.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from batchsim.calibration.kernel_tables import (
    MIN_SCORED_S,
    error_summary,
    fit_score,
    read_kernel_table,
)
from batchsim.calibration.predict import with_terms
from batchsim.catalog.hardware import HardwareProfile
from batchsim.cost.kernels import moe_kernel
from batchsim.errors import ConfigError

__all__ = [
    "MOE_DTYPES",
    "fit_moe_compute",
    "moe_errors",
    "moe_model_times",
    "read_moe_measurements",
]

MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
"""The table's ``moe_dtype`` -> ``batchsim kernel moe --dtype`` (weight-only int4 and MXFP4
experts have no batchsim dtype)."""
_COLUMNS = {
    "num_tokens": "tokens",
    "hidden_size": "hidden",
    "inter_size": "inter",
    "topk": "top_k",
    "num_experts": "experts",
    "moe_tp_size": "tp",
}
FIT_GRID = np.round(np.arange(0.20, 1.0001, 0.01), 2)
"""The ``moe_compute`` values the fit tries."""


def read_moe_measurements(path: Path) -> pd.DataFrame:
    """A MoE table as rows ``dtype, tokens, hidden, inter, top_k, experts, tp, time_s``.

    Raises:
        ConfigError: Unreadable file, missing columns, or a non-positive time.
    """
    source = str(path)
    raw = read_kernel_table(path, "MoE")
    need = ("moe_dtype", *_COLUMNS, "latency")
    missing = [c for c in need if c not in raw.columns]
    if missing:
        raise ConfigError(
            f"MoE table needs columns {', '.join(need)}; missing {missing[0]}", source
        )
    keep = raw["moe_dtype"].isin(list(MOE_DTYPES))
    if "moe_ep_size" in raw.columns:
        keep &= raw["moe_ep_size"] == 1
    if "distribution" in raw.columns:
        keep &= raw["distribution"] == "balanced"
    frame = raw.loc[keep].rename(columns=_COLUMNS)
    lat = pd.to_numeric(frame["latency"], errors="coerce").to_numpy(float)
    if not np.all(np.isfinite(lat) & (lat > 0)):
        raise ConfigError("latency must be a positive number of ms", source)
    frame = frame.assign(dtype=frame["moe_dtype"].map(MOE_DTYPES), time_s=lat * 1e-3)
    keys = ["dtype", *_COLUMNS.values()]
    out = frame.groupby(keys, as_index=False)["time_s"].min()
    return out.astype({k: np.int64 for k in _COLUMNS.values()})


def moe_model_times(hardware: HardwareProfile, rows: pd.DataFrame) -> np.ndarray:
    """The model's time (s) of each row of a :func:`read_moe_measurements` frame."""
    cols = [rows[c].to_numpy(np.int64) for c in ("tokens", "hidden", "inter", "top_k")]
    cols += [rows[c].to_numpy(np.int64) for c in ("experts", "tp")]
    dtypes = rows["dtype"].astype(str).tolist()
    out = np.empty(len(rows))
    for i, (t, h, inter, k, e, tp) in enumerate(zip(*cols)):
        est = moe_kernel(
            hardware,
            tokens=int(t),
            hidden=int(h),
            inter=int(inter),
            top_k=int(k),
            experts=int(e),
            tp=int(tp),
            dtype=dtypes[i],
        )
        out[i] = est.time_us * 1e-6
    return out


def fit_moe_compute(hardware: HardwareProfile, rows: pd.DataFrame) -> float:
    """The ``moe_compute`` of :data:`FIT_GRID` that best prices the bf16 kernels of at least
    :data:`~batchsim.calibration.kernel_tables.MIN_SCORED_S` (score: median / 5 % and p90 /
    15 % of the absolute error), the profile's other terms as they are.

    Raises:
        ConfigError: The table has no bf16 kernel that long.
    """
    scored = rows[(rows["dtype"] == "bf16") & (rows["time_s"] >= MIN_SCORED_S)]
    if scored.empty:
        raise ConfigError("MoE table has no bf16 kernel of 5 us or more to fit moe_compute on")
    meas = scored["time_s"].to_numpy()
    scores = [
        fit_score(moe_model_times(with_terms(hardware, {"moe_compute": float(v)}), scored), meas)
        for v in FIT_GRID
    ]
    return float(FIT_GRID[int(np.argmin(scores))])


def moe_errors(hardware: HardwareProfile, rows: pd.DataFrame) -> pd.DataFrame:
    """Per dtype: kernels of at least 5 us, median and p90 absolute % error and median signed
    % error of ``hardware``'s MoE price on a :func:`read_moe_measurements` frame."""
    scored = rows[rows["time_s"] >= MIN_SCORED_S].reset_index(drop=True)
    signed = (moe_model_times(hardware, scored) / scored["time_s"].to_numpy() - 1.0) * 100.0
    out = []
    for dtype in MOE_DTYPES.values():
        mask = (scored["dtype"] == dtype).to_numpy()
        if mask.any():
            out.append({"dtype": dtype, **error_summary(signed[mask])})
    return pd.DataFrame(out)
