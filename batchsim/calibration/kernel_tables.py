"""Measured kernel tables as calibration input: GEMM timings over (dtype, m, n, k).

Owns reading a GEMM table (:func:`read_gemm_measurements`: the layout of NVIDIA
AIConfigurator's ``gemm_perf`` tables, Parquet or CSV, columns ``gemm_dtype, m, n, k,
latency`` in ms; several kernels measured for one shape keep the fastest, the one a tuned
engine would pick), the fit of a profile's GEMM terms to it (:func:`fit_gemm_terms`), the
correction grid the profile ships beside its YAML (:func:`gemm_table_from`,
:func:`write_gemm_table`, the format of :mod:`batchsim.catalog.gemm_table`) and the error of a
profile on a table (:func:`gemm_errors`, what ``benchmarks/heldout_kernels.py`` reports).

The fit, per GPU: ``compute``, ``memory``, ``min_kernel_time_us`` and ``transition_exponent``
by coordinate search on the 16-bit GEMMs of at least :data:`MIN_SCORED_S` (a score of median
and p90 absolute error), then ``ln(measured / modelled)`` at every measured shape with n, k >=
:data:`MIN_FEATURES`, for every dtype of the table. The tile sizes stay the profile's.

Every measured m is kept: a grid thinned to both sides of the powers of two (25 values instead
of the 74 of AIConfigurator's tables) was tried on a sibling pair that is not held out (B200's
table applied to B300's datasheet profile): p90 error 17.9 % against 15.2 % for bf16, 25.8 %
against 10.8 % for fp8 block-scaled GEMMs, for a third of the file size.

Must not import the engine or the scheduler.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from batchsim.calibration.predict import with_terms
from batchsim.calibration.search import coordinate_search
from batchsim.catalog.gemm_table import MAX_VALUE, TABLE_DTYPES, GemmTable
from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.cost.gemm import Gemm, GemmPricing
from batchsim.cost.terms import HardwareTerms
from batchsim.dtypes import DTYPE_BYTES
from batchsim.errors import ConfigError
from batchsim.yamlio import MAX_DATA_BYTES, read_text

__all__ = [
    "GEMM_FIT_TERMS",
    "MIN_SCORED_S",
    "error_summary",
    "fit_gemm_terms",
    "fit_score",
    "gemm_errors",
    "gemm_model_times",
    "gemm_table_from",
    "read_gemm_measurements",
    "read_kernel_table",
    "write_gemm_table",
]

GEMM_FIT_TERMS = ("compute", "memory", "min_kernel_time_us", "transition_exponent")
"""The profile terms a GEMM table fits."""
MIN_SCORED_S = 5e-6
"""Kernels shorter than this are not scored (launch-dominated; timer resolution)."""
MIN_FEATURES = 128
"""Smallest n and k a shipped grid keeps (no served model has narrower layers)."""

_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
}
_WEIGHT_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4"}


def read_kernel_table(path: Path, what: str) -> pd.DataFrame:
    """The raw rows of a measured kernel table (``what``: its kind, for messages): Parquet
    (at most the data-file size limit) or CSV (the size and encoding rules of every data file).

    Raises:
        ConfigError: The file cannot be read (one line with the reason).
    """
    source = str(path)
    try:
        if path.suffix == ".parquet":
            if path.stat().st_size > MAX_DATA_BYTES:
                raise ConfigError(f"file is larger than {MAX_DATA_BYTES // 2**20} MiB", source)
            return pd.read_parquet(path)
        return pd.read_csv(io.StringIO(read_text(path)), comment="#")
    except (OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"cannot read the {what} table: {reason}", source) from None


def fit_score(pred: np.ndarray, meas: np.ndarray) -> float:
    """The score every kernel-table fit minimizes: the mean of median |error| / 5 % and p90
    |error| / 15 % (1 when both meet their target)."""
    err = np.abs(pred / meas - 1.0) * 100.0
    return float(np.median(err) / 5.0 + np.percentile(err, 90) / 15.0) / 2.0


def error_summary(signed_pct: np.ndarray) -> dict[str, float | int]:
    """``kernels``, ``median_err_pct``, ``p90_err_pct`` and ``median_signed_pct`` of signed
    % errors (the columns of every ``*_errors`` table)."""
    err = np.abs(signed_pct)
    return {
        "kernels": len(signed_pct),
        "median_err_pct": float(np.median(err)),
        "p90_err_pct": float(np.percentile(err, 90)),
        "median_signed_pct": float(np.median(signed_pct)),
    }


def read_gemm_measurements(path: Path) -> pd.DataFrame:
    """A GEMM table as rows ``dtype`` (:data:`~batchsim.catalog.gemm_table.TABLE_DTYPES`),
    ``m``, ``n``, ``k``, ``time_s``: the fastest kernel per shape; dtypes batchsim does not
    price (int4, nvfp4, ...) are left out.

    Raises:
        ConfigError: Unreadable file, missing columns, or a non-positive or non-finite time.
    """
    source = str(path)
    raw = read_kernel_table(path, "GEMM")
    need = ("gemm_dtype", "m", "n", "k", "latency")
    missing = [c for c in need if c not in raw.columns]
    if missing:
        raise ConfigError(
            f"GEMM table needs columns {', '.join(need)} (latency in ms); missing "
            f"{', '.join(missing)}",
            source,
        )
    frame = raw.loc[:, list(need)].copy()
    frame["dtype"] = frame["gemm_dtype"].map(_DTYPES)
    frame = frame.dropna(subset=["dtype"])
    lat = pd.to_numeric(frame["latency"], errors="coerce").to_numpy(float)
    bad = ~np.isfinite(lat) | (lat <= 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ConfigError(
            f"latency must be a positive number of ms, got {frame['latency'].iloc[row]!r} "
            f"(row {frame.index[row] + 1})",
            source,
        )
    for col in ("m", "n", "k"):
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(float)
        if not np.all(np.isfinite(values) & (values >= 1) & (values == np.round(values))):
            raise ConfigError(f"column {col} must hold positive integers", source)
        frame[col] = values.astype(np.int64)
    frame["time_s"] = lat * 1e-3
    out = frame.groupby(["dtype", "m", "n", "k"], as_index=False)["time_s"].min()
    if out.empty:
        raise ConfigError(
            f"GEMM table has no rows of a dtype batchsim prices ({', '.join(TABLE_DTYPES)})",
            source,
        )
    return out.sort_values(["dtype", "n", "k", "m"], ignore_index=True)


def _pricing(
    hardware: HardwareProfile,
    dtype: str,
    terms: Mapping[str, float] | None = None,
    *,
    corrected: bool = False,
) -> GemmPricing:
    """The profile's GEMM model for a table dtype, ``terms`` (YAML units) overriding its
    efficiency terms; with the profile's GEMM table when ``corrected``."""
    weight = _WEIGHT_DTYPE[dtype]
    t = HardwareTerms.from_profile(with_terms(hardware, terms) if terms else hardware, weight)
    table = hardware.gemm_table if corrected else None
    return t.gemm_pricing(
        DTYPE_BYTES[weight],
        correction=(
            functools.partial(table.log_factor, dtype)
            if table is not None and dtype in table.values
            else None
        ),
    )


def gemm_model_times(
    hardware: HardwareProfile,
    rows: pd.DataFrame,
    terms: Mapping[str, float] | None = None,
    *,
    corrected: bool = False,
) -> np.ndarray:
    """The model's time (s) of each row of a :func:`read_gemm_measurements` frame on
    ``hardware`` (its terms, or ``terms`` overriding them); ``corrected`` applies the
    profile's GEMM table, as a simulation does."""
    out = np.empty(len(rows))
    dtypes = rows["dtype"].to_numpy()
    ms, ns, ks = (rows[c].to_numpy() for c in ("m", "n", "k"))
    for dtype in dict.fromkeys(dtypes.tolist()):
        pricing = _pricing(hardware, str(dtype), terms, corrected=corrected)
        price = pricing.price
        for i in np.flatnonzero(dtypes == dtype):
            out[i] = price(Gemm(int(ks[i]), int(ns[i])), float(ms[i])).time
    return out


def fit_gemm_terms(
    hardware: HardwareProfile, rows: pd.DataFrame, *, sample: int = 6000
) -> tuple[dict[str, float], float]:
    """Fit :data:`GEMM_FIT_TERMS` to the 16-bit GEMMs of at least :data:`MIN_SCORED_S` with
    n, k >= :data:`MIN_FEATURES` (an evenly spaced ``sample`` of them, deterministic);
    returns the terms (YAML units) and their score (1 at median 5 % and p90 15 %).

    Raises:
        ConfigError: The table has no 16-bit GEMM of at least :data:`MIN_SCORED_S`.
    """
    fit = rows[
        (rows["dtype"] == "bf16")
        & (rows["time_s"] >= MIN_SCORED_S)
        & (rows["n"] >= MIN_FEATURES)
        & (rows["k"] >= MIN_FEATURES)
    ]
    if fit.empty:
        raise ConfigError("the GEMM table has no 16-bit GEMM of 5 us or longer to fit")
    if len(fit) > sample:
        fit = fit.iloc[np.linspace(0, len(fit) - 1, sample).round().astype(int)]
    fit = fit.reset_index(drop=True)
    meas = fit["time_s"].to_numpy()
    start = {}
    for key in GEMM_FIT_TERMS:
        spec = EFFICIENCY_KEYS[key]
        value = hardware.efficiency.get(spec.si_name)
        start[key] = (value if value is not None else spec.default / spec.per_si) * spec.per_si

    def score(values: dict[str, float]) -> float:
        return fit_score(gemm_model_times(hardware, fit, values), meas)

    return coordinate_search(score, start, GEMM_FIT_TERMS)


def gemm_table_from(
    hardware: HardwareProfile,
    rows: pd.DataFrame,
    *,
    m_grid: Iterable[int] | None = None,
    min_features: int = MIN_FEATURES,
    source: str = "",
) -> GemmTable:
    """The correction grid of ``hardware`` (its terms as they are: fit them first) from a
    :func:`read_gemm_measurements` frame: ``ln(measured / modelled)`` at every measured
    ``(dtype, n, k)`` with n, k >= ``min_features`` and m in ``m_grid`` (default: every
    measured m), rounded as the file stores it. Shapes missing from the table get no correction (0).

    Raises:
        ConfigError: No shape of the table is on the grids.
    """
    keep = (rows["n"] >= min_features) & (rows["k"] >= min_features)
    if m_grid is not None:
        keep &= rows["m"].isin({int(m) for m in m_grid})
    sel = rows[keep].reset_index(drop=True)
    if sel.empty:
        raise ConfigError("no GEMM of the table lies on the correction grid")
    logs = np.log(sel["time_s"].to_numpy() / gemm_model_times(hardware, sel))
    codes = np.clip(np.round(logs * 1000.0), -MAX_VALUE, MAX_VALUE) / 1000.0
    m_axis = tuple(sorted(set(sel["m"].tolist())))
    n_axis = tuple(sorted(set(sel["n"].tolist())))
    k_axis = tuple(sorted(set(sel["k"].tolist())))
    im = {m: i for i, m in enumerate(m_axis)}
    index = {
        (n, k): (i * len(k_axis) + j) for i, n in enumerate(n_axis) for j, k in enumerate(k_axis)
    }
    values: dict[str, tuple[float, ...]] = {}
    for dtype in TABLE_DTYPES:
        mask = (sel["dtype"] == dtype).to_numpy()
        if not mask.any():
            continue
        flat = np.zeros(len(n_axis) * len(k_axis) * len(m_axis))
        for m, n, k, c in zip(
            sel["m"].to_numpy()[mask],
            sel["n"].to_numpy()[mask],
            sel["k"].to_numpy()[mask],
            codes[mask],
        ):
            flat[index[int(n), int(k)] * len(m_axis) + im[int(m)]] = c
        values[dtype] = tuple(float(v) for v in flat)
    return GemmTable(source=source or "(fitted)", m=m_axis, n=n_axis, k=k_axis, values=values)


def write_gemm_table(table: GemmTable, path: Path, comments: Iterable[str]) -> None:
    """Write ``table`` in the file format of :mod:`batchsim.catalog.gemm_table`, each of
    ``comments`` as a ``#`` line first (its sources).

    Raises:
        OSError: The file cannot be written.
    """
    lines = [f"# {c}" for c in comments]
    lines.append(",".join(["dtype", "n", "k", *map(str, table.m)]))
    nm = len(table.m)
    for dtype in table.dtypes:
        flat = table.values[dtype]
        for i, n in enumerate(table.n):
            for j, k in enumerate(table.k):
                base = (i * len(table.k) + j) * nm
                cells = [str(round(v * 1000)) for v in flat[base : base + nm]]
                lines.append(",".join([dtype, str(n), str(k), *cells]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def gemm_errors(
    hardware: HardwareProfile, rows: pd.DataFrame, *, corrected: bool = True
) -> pd.DataFrame:
    """Per dtype: kernels of at least :data:`MIN_SCORED_S` with n, k >= :data:`MIN_FEATURES`
    (the shapes of served models), median and p90 absolute % error and median signed % error
    of ``hardware``'s GEMM model (with its table when ``corrected``) on a
    :func:`read_gemm_measurements` frame."""
    scored = rows[
        (rows["time_s"] >= MIN_SCORED_S) & (rows["n"] >= MIN_FEATURES) & (rows["k"] >= MIN_FEATURES)
    ].reset_index(drop=True)
    pred = gemm_model_times(hardware, scored, corrected=corrected)
    signed = (pred / scored["time_s"].to_numpy() - 1.0) * 100.0
    out = []
    for dtype in TABLE_DTYPES:
        mask = (scored["dtype"] == dtype).to_numpy()
        if mask.any():
            out.append({"dtype": dtype, **error_summary(signed[mask])})
    return pd.DataFrame(out)
