"""Measured attention kernel tables as calibration input: the profile's attention terms.

Owns reading the context and generation attention tables of NVIDIA AIConfigurator's layout
(:func:`read_attention_measurements`: ``{context,generation}_attention_perf``, Parquet or CSV,
columns ``batch_size, isl, num_heads, num_key_value_heads, head_dim, kv_cache_dtype, step,
window_size, latency`` in ms), the model's time of each row (:func:`attention_model_times`:
what ``batchsim kernel attention`` prices), the fit of the attention terms
(:data:`ATTENTION_FIT_TERMS`) on the bf16 kernels of both phases (:func:`fit_attention_terms`)
and the error per phase and KV dtype (:func:`attention_errors`).

A context row is ``batch_size`` prompts of ``isl`` tokens on an empty cache (causal); a
generation row is ``batch_size`` decode rows, each after ``step`` cached tokens. Only full
attention (``window_size`` 0), KV caches in bf16 or fp8, and head counts where the query heads
are a multiple of the KV heads are kept; several kernels of one shape keep the fastest.

Must not import the engine or the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from batchsim.calibration.search import coordinate_search
from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.cost.kernels import attention_kernel
from batchsim.errors import ConfigError

__all__ = [
    "ATTENTION_FIT_TERMS",
    "attention_errors",
    "attention_model_times",
    "fit_attention_terms",
    "read_attention_measurements",
]

ATTENTION_FIT_TERMS = (
    "attention",
    "attention_masked_fraction",
    "attention_kernel_time_us",
    "attention_sm_bandwidth",
    "attention_cta_time_us",
    "attention_combine_time_us",
    "attention_prefill_time_us",
)
"""The profile terms the attention tables fit."""
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
_NEED = (
    "batch_size",
    "isl",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "kv_cache_dtype",
    "step",
    "latency",
)


def read_attention_measurements(path: Path, phase: str) -> pd.DataFrame:
    """One phase's table (``context`` or ``generation``) as rows ``phase, dtype, batch,
    q_len, kv_len, heads, kv_heads, head_dim, time_s``.

    Raises:
        ConfigError: Unreadable file, missing columns, or a non-positive time.
    """
    source = str(path)
    raw = read_kernel_table(path, "attention")
    missing = [c for c in _NEED if c not in raw.columns]
    if missing:
        raise ConfigError(f"attention table needs column {missing[0]}", source)
    keep = raw["kv_cache_dtype"].isin(list(KV_DTYPES))
    if "window_size" in raw.columns:
        keep &= raw["window_size"] == 0
    keep &= raw["num_heads"] % raw["num_key_value_heads"] == 0
    d = raw.loc[keep]
    lat = pd.to_numeric(d["latency"], errors="coerce").to_numpy(float)
    if not np.all(np.isfinite(lat) & (lat > 0)):
        raise ConfigError("latency must be a positive number of ms", source)
    context = phase == "context"
    frame = pd.DataFrame(
        {
            "phase": phase,
            "dtype": d["kv_cache_dtype"].map(KV_DTYPES).to_numpy(),
            "batch": d["batch_size"].to_numpy(np.int64),
            "q_len": d["isl"].to_numpy(np.int64) if context else 1,
            "kv_len": 0 if context else d["step"].to_numpy(np.int64),
            "heads": d["num_heads"].to_numpy(np.int64),
            "kv_heads": d["num_key_value_heads"].to_numpy(np.int64),
            "head_dim": d["head_dim"].to_numpy(np.int64),
            "time_s": lat * 1e-3,
        }
    )
    keys = ["phase", "dtype", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim"]
    return frame.groupby(keys, as_index=False)["time_s"].min()


def attention_model_times(
    hardware: HardwareProfile, rows: pd.DataFrame, terms: Mapping[str, float] | None = None
) -> np.ndarray:
    """The model's time (s) of each row of :func:`read_attention_measurements` frames on
    ``hardware`` (``terms``, YAML units, overriding its own)."""
    hw = with_terms(hardware, terms) if terms else hardware
    cols = [rows[c].to_numpy(np.int64) for c in ("batch", "q_len", "kv_len", "heads")]
    cols += [rows[c].to_numpy(np.int64) for c in ("kv_heads", "head_dim")]
    phases = rows["phase"].astype(str).tolist()
    dtypes = rows["dtype"].astype(str).tolist()
    out = np.empty(len(rows))
    for i, (b, q, kv, h, kvh, d) in enumerate(zip(*cols)):
        est = attention_kernel(
            hw,
            phase=phases[i],
            batch=int(b),
            q_len=int(q),
            kv_len=int(kv),
            heads=int(h),
            kv_heads=int(kvh),
            head_dim=int(d),
            kv_dtype=dtypes[i],
        )
        out[i] = est.time_us * 1e-6
    return out


def fit_attention_terms(
    hardware: HardwareProfile, rows: pd.DataFrame, *, sample: int = 1500
) -> tuple[dict[str, float], float]:
    """Fit :data:`ATTENTION_FIT_TERMS` to the bf16 kernels of at least 5 us of both phases
    (an evenly spaced ``sample`` of each, deterministic; the score is the mean of the two
    phases' scores, 1 at median 5 % and p90 15 %). Returns the terms (YAML units) and score.

    Raises:
        ConfigError: A phase has no bf16 kernel that long.
    """
    parts = []
    for phase in ("context", "generation"):
        fit = rows[
            (rows["phase"] == phase) & (rows["dtype"] == "bf16") & (rows["time_s"] >= MIN_SCORED_S)
        ]
        if fit.empty:
            raise ConfigError(f"the attention tables have no bf16 {phase} kernel of 5 us or more")
        if len(fit) > sample:
            fit = fit.iloc[np.linspace(0, len(fit) - 1, sample).round().astype(int)]
        parts.append(fit.reset_index(drop=True))
    start = {}
    for key in ATTENTION_FIT_TERMS:
        spec = EFFICIENCY_KEYS[key]
        value = hardware.efficiency.get(spec.si_name)
        start[key] = (value if value is not None else spec.default / spec.per_si) * spec.per_si

    def score(values: dict[str, float]) -> float:
        return sum(
            fit_score(attention_model_times(hardware, p, values), p["time_s"].to_numpy())
            for p in parts
        ) / len(parts)

    return coordinate_search(score, start, ATTENTION_FIT_TERMS)


def attention_errors(hardware: HardwareProfile, rows: pd.DataFrame) -> pd.DataFrame:
    """Per phase and KV dtype: kernels of at least 5 us, median and p90 absolute % error
    and median signed % error of ``hardware``'s attention price."""
    scored = rows[rows["time_s"] >= MIN_SCORED_S].reset_index(drop=True)
    signed = (attention_model_times(hardware, scored) / scored["time_s"].to_numpy() - 1) * 100
    out = []
    for (phase, dtype), idx in scored.groupby(["phase", "dtype"]).groups.items():
        out.append({"phase": phase, "dtype": dtype, **error_summary(signed[np.asarray(idx)])})
    return pd.DataFrame(out)
