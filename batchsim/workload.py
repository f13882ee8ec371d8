"""Workloads: which requests arrive when, with how many prompt and output tokens.

This module owns the ``workload:`` block of an experiment: the config models (arrival processes,
token-length distributions, think/cancel-time distributions, trace files), the loaders of public
traces (Azure LLM inference 2023/2024 CSV, Mooncake JSONL, generic CSV) and :func:`generate`,
which turns a config and a seed into a :class:`RequestTable` of numpy arrays. It also lists the
built-in ``workloads/`` catalog (:func:`workload_table`).

Randomness: :func:`generate` splits ``numpy.random.SeedSequence(seed)`` into independent child
streams for arrivals, prompt lengths, output lengths, cancellations and think times, in that
order, so changing one part of the workload never shifts the others. There is no global random
state and all sampling is vectorised.

Token counts: continuous distributions are rounded half-to-even (``numpy.rint``) and then clipped
to ``[min, max]`` (``min`` defaults to 1, so every count is an integer >= 1). The exception is
``exponential``, whose ``max`` *truncates* (values above it are redrawn) like the
``capped_exponential`` of the Anyscale continuous-batching benchmark; its ``min`` clips.

Must not import: simpy, ``batchsim.engine``, ``batchsim.scheduler``, ``batchsim.cost``. The
workload only describes requests; it never runs them.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field, ValidationError, model_validator

from batchsim.catalog import catalog_dir, catalog_names, resolve
from batchsim.errors import ConfigError
from batchsim.validation import ConfigModel, FieldError, config_error_from_pydantic, format_value
from batchsim.yamlio import line_of, read_mapping

__all__ = [
    "ARRIVAL_PROCESSES",
    "LENGTH_DISTRIBUTIONS",
    "TIME_DISTRIBUTIONS",
    "TRACE_FORMATS",
    "AllAtOnceArrival",
    "BurstArrival",
    "ConstantArrival",
    "CsvColumns",
    "EmpiricalLength",
    "ExponentialLength",
    "ExponentialTime",
    "FixedLength",
    "FixedTime",
    "GammaArrival",
    "LognormalLength",
    "LognormalTime",
    "NormalLength",
    "NormalTime",
    "PoissonArrival",
    "RequestTable",
    "TraceConfig",
    "UniformLength",
    "UniformTime",
    "WorkloadConfig",
    "WorkloadDefinition",
    "ZipfLength",
    "generate",
    "load_trace",
    "load_workload",
    "parse_workload",
    "resolve_data_path",
    "workload_table",
]

PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
TokenCount = Annotated[int, Field(ge=1)]

#: Largest support of a ``zipf`` distribution (its CDF table is held in memory).
MAX_ZIPF_SUPPORT = 10_000_000
#: Refuse to generate more requests than this from ``duration_s`` alone (memory guard).
MAX_GENERATED_REQUESTS = 200_000_000
#: Integer points summed exactly by ``analytic_mean``; beyond, a closed-form integral is used.
_EXACT_SUM_POINTS = 200_000
_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


# ============================================================================================
# Continuous base distributions: survival function and closed-form partial moments.
# They let analytic_mean()/analytic_variance() account for rounding and clipping exactly.


def _phi_cdf(x: float) -> float:
    """Standard normal CDF (accepts +-inf)."""
    return 0.5 * math.erfc(-x / _SQRT2)


def _phi_pdf(x: float) -> float:
    return 0.0 if math.isinf(x) else math.exp(-0.5 * x * x) / _SQRT2PI


def _safe_exp(x: float) -> float:
    return math.inf if x > 709.0 else math.exp(x)


_erfc_vec = np.frompyfunc(math.erfc, 1, 1)


class _Continuous:
    """A continuous distribution on the real line with what the moment sums need."""

    q_lo: float  # P(X < q_lo) < 1e-18
    q_hi: float  # P(X > q_hi) < 1e-18

    def sf(self, x: np.ndarray) -> np.ndarray:
        """P(X > x), vectorised."""
        raise NotImplementedError

    def cdf(self, x: float) -> float:
        raise NotImplementedError

    def partial(self, a: float, b: float, order: int) -> float:
        """E[X**order; a < X <= b] for order 1 or 2."""
        raise NotImplementedError

    def clipped_moment(self, lo: float, hi: float, order: int) -> float:
        """E[clip(X, lo, hi)**order] (``hi`` may be inf)."""
        below = lo**order * self.cdf(lo) if self.cdf(lo) > 0 else 0.0
        above = 0.0 if math.isinf(hi) else hi**order * (1.0 - self.cdf(hi))
        return below + self.partial(lo, hi, order) + above


class _Normal(_Continuous):
    def __init__(self, mu: float, sigma: float):
        self.mu, self.sigma = mu, sigma
        self.q_lo, self.q_hi = mu - 9.0 * sigma, mu + 9.0 * sigma

    def sf(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, dtype=float) - self.mu) / (self.sigma * _SQRT2)
        return 0.5 * np.asarray(_erfc_vec(z), dtype=float)

    def cdf(self, x: float) -> float:
        return _phi_cdf((x - self.mu) / self.sigma)

    def partial(self, a: float, b: float, order: int) -> float:
        mu, s = self.mu, self.sigma
        al, be = (a - mu) / s, (b - mu) / s
        prob = _phi_cdf(be) - _phi_cdf(al)
        dphi = _phi_pdf(al) - _phi_pdf(be)
        if order == 1:
            return mu * prob + s * dphi
        edge_a = 0.0 if math.isinf(al) else al * _phi_pdf(al)
        edge_b = 0.0 if math.isinf(be) else be * _phi_pdf(be)
        return (mu * mu + s * s) * prob + 2 * mu * s * dphi + s * s * (edge_a - edge_b)


class _LogNormal(_Continuous):
    def __init__(self, mu: float, sigma: float):
        self.mu, self.sigma = mu, sigma
        self.q_lo = _safe_exp(mu - 9.0 * sigma)
        self.q_hi = _safe_exp(mu + 9.0 * sigma)

    def sf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        out = np.ones_like(x)
        pos = x > 0
        z = (np.log(x[pos]) - self.mu) / (self.sigma * _SQRT2)
        out[pos] = 0.5 * np.asarray(_erfc_vec(z), dtype=float)
        return out

    def cdf(self, x: float) -> float:
        if x <= 0:
            return 0.0
        if math.isinf(x):
            return 1.0
        return _phi_cdf((math.log(x) - self.mu) / self.sigma)

    def partial(self, a: float, b: float, order: int) -> float:
        mu, s = self.mu, self.sigma

        def z(x: float) -> float:
            if x <= 0:
                return -math.inf
            if math.isinf(x):
                return math.inf
            return (math.log(x) - mu - order * s * s) / s

        scale = _safe_exp(order * mu + 0.5 * order * order * s * s)
        return scale * (_phi_cdf(z(b)) - _phi_cdf(z(a)))


class _TruncExp(_Continuous):
    """Exponential with mean ``m`` conditioned on X < c (``c`` may be inf)."""

    def __init__(self, m: float, c: float):
        self.m, self.c = m, c
        self.norm = 1.0 if math.isinf(c) else -math.expm1(-c / m)
        self.q_lo = 0.0
        self.q_hi = min(c, 45.0 * m)

    def _tail(self) -> float:
        return 0.0 if math.isinf(self.c) else math.exp(-self.c / self.m)

    def sf(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        raw = (np.exp(-np.maximum(x, 0.0) / self.m) - self._tail()) / self.norm
        return np.clip(raw, 0.0, 1.0)

    def cdf(self, x: float) -> float:
        if x <= 0:
            return 0.0
        if x >= self.c:
            return 1.0
        return -math.expm1(-x / self.m) / self.norm

    def partial(self, a: float, b: float, order: int) -> float:
        m = self.m
        lo, hi = max(a, 0.0), min(b, self.c)
        if hi <= lo:
            return 0.0

        def g(x: float) -> float:
            if math.isinf(x):
                return 0.0
            poly = x + m if order == 1 else x * x + 2 * x * m + 2 * m * m
            return poly * math.exp(-x / m)

        return (g(lo) - g(hi)) / self.norm


def _rounded_clipped_moments(base: _Continuous, lo: int, hi: int | None) -> tuple[float, float]:
    """E[Y], E[Y^2] of Y = clip(rint(X), lo, hi) for integers lo >= 1, hi >= lo or None.

    Uses E[Y] = lo + sum_{k=lo+1}^{hi} P(X >= k - 1/2) and
    E[Y^2] = lo^2 + sum_{k=lo+1}^{hi} (2k - 1) P(X >= k - 1/2), summed exactly over up to
    ``_EXACT_SUM_POINTS`` integers; a remaining far tail is replaced by the integral of the same
    summand (midpoint rule, error ~ density/24, negligible there).
    """
    k0 = max(lo, math.floor(base.q_lo + 0.5)) if math.isfinite(base.q_lo) else lo
    if hi is not None and k0 >= hi:
        return float(hi), float(hi) * hi
    top = k0 + _EXACT_SUM_POINTS
    if math.isfinite(base.q_hi):
        top = min(top, math.ceil(base.q_hi) + 1)
    if hi is not None:
        top = min(top, hi)
    top = max(top, k0)
    ks = np.arange(k0 + 1, top + 1, dtype=float)
    surv = base.sf(ks - 0.5)
    m1 = float(k0) + float(surv.sum())
    m2 = float(k0) * k0 + float(((2.0 * ks - 1.0) * surv).sum())
    upper = math.inf if hi is None else float(hi)
    if upper > top:
        m1 += base.clipped_moment(top, upper, 1) - top
        m2 += base.clipped_moment(top, upper, 2) - float(top) * top
    return m1, m2


def _variance(m1: float, m2: float) -> float:
    return max(m2 - m1 * m1, 0.0)


def _round_clip(x: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    out = np.rint(x)
    np.clip(out, lo, hi if hi is not None else None, out=out)
    return out.astype(np.int64)


# ============================================================================================
# Token-length distributions


class _LengthBase(ConfigModel):
    """Common interface of the token-length distributions."""

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        """Draw ``n`` token counts (int64, >= 1).

        Args:
            rng: The stream to draw from.
            n: Number of values.
            base_dir: Directory relative file paths are resolved against (``empirical``).
        """
        raise NotImplementedError

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        """(mean, variance) in tokens of what :meth:`sample` draws, rounding/clipping included."""
        raise NotImplementedError

    def analytic_mean(self, base_dir: Path | None = None) -> float:
        """Mean (tokens) of what :meth:`sample` draws, including rounding and clipping."""
        return self.analytic_moments(base_dir)[0]

    def analytic_variance(self, base_dir: Path | None = None) -> float:
        """Variance (tokens^2) of what :meth:`sample` draws, including rounding and clipping."""
        return self.analytic_moments(base_dir)[1]

    def describe(self) -> str:
        """Short one-line form, e.g. ``lognormal(mean=512, sigma=0.8, max=4096)``."""
        return _describe_model(self, "dist")


class _BoundedLength(_LengthBase):
    """A length distribution with ``min``/``max`` fields; checks min <= max."""

    @model_validator(mode="after")
    def _check_bounds(self) -> _BoundedLength:
        lo, hi = getattr(self, "min", None), getattr(self, "max", None)
        if lo is not None and hi is not None and lo > hi:
            raise FieldError("max", f"must be >= min ({lo}), got {hi}")
        return self


class FixedLength(_LengthBase):
    """Every request has the same number of tokens."""

    dist: Literal["fixed"] = "fixed"
    value: TokenCount = Field(description="tokens (>= 1)")

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        return float(self.value), 0.0


class UniformLength(_BoundedLength):
    """Integers drawn uniformly from ``[min, max]``, both inclusive."""

    dist: Literal["uniform"] = "uniform"
    min: TokenCount = Field(description="smallest value, tokens (inclusive)")
    max: TokenCount = Field(description="largest value, tokens (inclusive)")

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        return rng.integers(self.min, self.max, size=n, endpoint=True, dtype=np.int64)

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        width = self.max - self.min + 1
        return (self.min + self.max) / 2.0, (width * width - 1) / 12.0


class NormalLength(_BoundedLength):
    """Normal(mean, std), rounded to the nearest integer and clipped to ``[min, max]``."""

    dist: Literal["normal"] = "normal"
    mean: float = Field(allow_inf_nan=False, description="mean before rounding/clipping, tokens")
    std: PositiveFinite = Field(description="standard deviation, tokens (> 0)")
    min: TokenCount = Field(default=1, description="clip below, tokens (default 1)")
    max: TokenCount | None = Field(default=None, description="clip above, tokens (default none)")

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        return _round_clip(rng.normal(self.mean, self.std, size=n), self.min, self.max)

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        m1, m2 = _rounded_clipped_moments(_Normal(self.mean, self.std), self.min, self.max)
        return m1, _variance(m1, m2)


class LognormalLength(_BoundedLength):
    """Log-normal with the given mean *of the token counts*, rounded and clipped to ``[min, max]``.

    ``mean`` is E[X] of the continuous distribution (not the mean of log X) and ``sigma`` the
    standard deviation of log X, so log X ~ Normal(ln(mean) - sigma^2/2, sigma) and the median is
    mean * exp(-sigma^2/2). A ``max`` lowers the mean of what is sampled; ``analytic_mean()``
    says by how much.
    """

    dist: Literal["lognormal"] = "lognormal"
    mean: PositiveFinite = Field(description="mean of the (unclipped) token counts, tokens")
    sigma: PositiveFinite = Field(description="standard deviation of ln(tokens) (> 0)")
    min: TokenCount = Field(default=1, description="clip below, tokens (default 1)")
    max: TokenCount | None = Field(default=None, description="clip above, tokens (default none)")

    @property
    def mu(self) -> float:
        """Mean of ln(tokens): ln(mean) - sigma^2/2."""
        return math.log(self.mean) - 0.5 * self.sigma * self.sigma

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        return _round_clip(rng.lognormal(self.mu, self.sigma, size=n), self.min, self.max)

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        m1, m2 = _rounded_clipped_moments(_LogNormal(self.mu, self.sigma), self.min, self.max)
        return m1, _variance(m1, m2)


class ExponentialLength(_BoundedLength):
    """Exponential with the given mean, rounded; values above ``max`` are redrawn.

    This is the ``capped_exponential`` of the Anyscale continuous-batching benchmark
    (github.com/anyscale/llm-continuous-batching-benchmarks, ``gen_random_response_lens``): draw
    Exp(mean), round to the nearest integer, redraw while the result exceeds ``max``. Redrawing
    (truncation) rather than clipping means no spike of requests at exactly ``max``; the
    sampled mean is below ``mean`` by about ``(max + mean) * exp(-max/mean)``. Rounding can
    give 0, which ``min`` (default 1) clips up, as the benchmark's TGI client did.
    """

    dist: Literal["exponential"] = "exponential"
    mean: PositiveFinite = Field(description="mean of the exponential before truncation, tokens")
    max: TokenCount | None = Field(default=None, description="redraw values above this, tokens")
    min: TokenCount = Field(default=1, description="clip below, tokens (default 1)")

    def _base(self) -> _TruncExp:
        cutoff = math.inf if self.max is None else self.max + 0.5
        return _TruncExp(self.mean, cutoff)

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        base = self._base()
        # Inverse CDF of Exp(mean) restricted to [0, max + 1/2): the same law as redrawing
        # until round(x) <= max, without a loop.
        x = -self.mean * np.log1p(-rng.random(n) * base.norm)
        return _round_clip(x, self.min, self.max)

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        m1, m2 = _rounded_clipped_moments(self._base(), self.min, self.max)
        return m1, _variance(m1, m2)


@functools.lru_cache(maxsize=8)
def _zipf_cdf(size: int, theta: float) -> np.ndarray:
    weights = np.arange(1, size + 1, dtype=float) ** (-theta)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    cdf.setflags(write=False)
    return cdf


class ZipfLength(_BoundedLength):
    """Bounded Zipf on the integers ``[min, max]``: P(k) proportional to (k - min + 1)^-theta.

    The shortest length is the most likely. Same law as the zipf length generator of Vidur
    (microsoft/vidur ``ZipfGenerator``, without its optional scrambling), which approximates it
    with the Gray et al. method; here it is sampled exactly by inverting the CDF. ``theta`` = 0
    is uniform; Vidur's default is 0.6.
    """

    dist: Literal["zipf"] = "zipf"
    theta: NonNegativeFinite = Field(description="exponent (>= 0; 0 = uniform)")
    min: TokenCount = Field(default=1, description="smallest (most likely) value, tokens")
    max: TokenCount = Field(description="largest value, tokens")

    @model_validator(mode="after")
    def _check_support(self) -> ZipfLength:
        size = self.max - self.min + 1
        if size > MAX_ZIPF_SUPPORT:
            raise FieldError("max", f"- min + 1 must be <= {MAX_ZIPF_SUPPORT:,}, got {size:,}")
        return self

    def _pmf(self) -> np.ndarray:
        cdf = _zipf_cdf(self.max - self.min + 1, float(self.theta))
        return np.diff(cdf, prepend=0.0)

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        cdf = _zipf_cdf(self.max - self.min + 1, float(self.theta))
        idx = np.searchsorted(cdf, rng.random(n), side="right")
        np.minimum(idx, len(cdf) - 1, out=idx)
        return idx.astype(np.int64) + self.min

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        pmf = self._pmf()
        ks = np.arange(self.min, self.max + 1, dtype=float)
        m1 = float(pmf @ ks)
        return m1, _variance(m1, float(pmf @ (ks * ks)))


class EmpiricalLength(_BoundedLength):
    """Resample (with replacement) observed token counts, then clip to ``[min, max]``.

    Give either ``values: [..]`` or ``path``: a text/CSV file with one integer per line (an
    optional header line and ``#`` comment lines are skipped), or with ``column`` the named
    column of a CSV with a header, e.g. ``{path: azure_conv_sample.csv, column: ContextTokens}``.
    A relative ``path`` is looked up next to the experiment file, then in the built-in
    ``workloads/`` catalog.
    """

    dist: Literal["empirical"] = "empirical"
    values: tuple[TokenCount, ...] | None = Field(
        default=None, description="observed counts, tokens"
    )
    path: str | None = Field(default=None, description="file with the observed counts")
    column: str | None = Field(default=None, description="CSV column to read from path")
    min: TokenCount = Field(default=1, description="clip below, tokens (default 1)")
    max: TokenCount | None = Field(default=None, description="clip above, tokens (default none)")

    @model_validator(mode="after")
    def _check_source(self) -> EmpiricalLength:
        if (self.values is None) == (self.path is None):
            raise FieldError("values", "or path is required (exactly one of them)")
        if self.values is not None and len(self.values) == 0:
            raise FieldError("values", "must not be empty")
        if self.column is not None and self.path is None:
            raise FieldError("column", "needs path")
        return self

    def data(self, base_dir: Path | None = None) -> np.ndarray:
        """The observed counts, clipped to ``[min, max]`` (read-only int64 array)."""
        if self.values is not None:
            raw = np.asarray(self.values, dtype=np.int64)
        else:
            assert self.path is not None
            resolved = resolve_data_path(self.path, base_dir, "empirical.path")
            raw = _read_int_column(str(resolved), _mtime(resolved), self.column, self.path)
        out = np.clip(raw, self.min, self.max)
        out.setflags(write=False)
        return out

    def sample(self, rng: np.random.Generator, n: int, base_dir: Path | None = None) -> np.ndarray:
        data = self.data(base_dir)
        return data[rng.integers(0, len(data), size=n)]

    def analytic_moments(self, base_dir: Path | None = None) -> tuple[float, float]:
        data = self.data(base_dir).astype(float)
        return float(data.mean()), float(data.var())


def _length_shorthand(value: Any) -> Any:
    """``output_tokens: 128`` means ``{dist: fixed, value: 128}``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


LengthDist = Annotated[
    FixedLength
    | UniformLength
    | NormalLength
    | LognormalLength
    | ExponentialLength
    | ZipfLength
    | EmpiricalLength,
    Field(discriminator="dist"),
    BeforeValidator(_length_shorthand),
]

LENGTH_DISTRIBUTIONS: dict[str, type[_LengthBase]] = {
    "fixed": FixedLength,
    "uniform": UniformLength,
    "normal": NormalLength,
    "lognormal": LognormalLength,
    "exponential": ExponentialLength,
    "zipf": ZipfLength,
    "empirical": EmpiricalLength,
}


# ============================================================================================
# Time distributions (think time, cancellation), in milliseconds, continuous


class _TimeBase(ConfigModel):
    """Common interface of the duration distributions (values in ms, >= 0)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` durations in milliseconds (float64, >= 0)."""
        raise NotImplementedError

    def analytic_moments(self) -> tuple[float, float]:
        """(mean in ms, variance in ms^2) of what :meth:`sample` draws."""
        raise NotImplementedError

    def analytic_mean(self) -> float:
        """Mean (ms) of what :meth:`sample` draws."""
        return self.analytic_moments()[0]

    def analytic_variance(self) -> float:
        """Variance (ms^2) of what :meth:`sample` draws."""
        return self.analytic_moments()[1]

    def describe(self) -> str:
        """Short one-line form, e.g. ``exponential(mean=1000)``."""
        return _describe_model(self, "dist")


class FixedTime(_TimeBase):
    """The same duration every time."""

    dist: Literal["fixed"] = "fixed"
    value: NonNegativeFinite = Field(description="ms (>= 0)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))

    def analytic_moments(self) -> tuple[float, float]:
        return float(self.value), 0.0


class UniformTime(_TimeBase):
    """Uniform on ``[min, max]`` milliseconds."""

    dist: Literal["uniform"] = "uniform"
    min: NonNegativeFinite = Field(description="ms (>= 0)")
    max: NonNegativeFinite = Field(description="ms (>= min)")

    @model_validator(mode="after")
    def _check_bounds(self) -> UniformTime:
        if self.min > self.max:
            raise FieldError("max", f"must be >= min ({self.min:g}), got {self.max:g}")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.min, self.max, size=n)

    def analytic_moments(self) -> tuple[float, float]:
        width = self.max - self.min
        return (self.min + self.max) / 2.0, width * width / 12.0


class ExponentialTime(_TimeBase):
    """Exponential with the given mean (ms): memoryless, e.g. users' think times."""

    dist: Literal["exponential"] = "exponential"
    mean: PositiveFinite = Field(description="ms (> 0)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, size=n)

    def analytic_moments(self) -> tuple[float, float]:
        return float(self.mean), float(self.mean) ** 2


class LognormalTime(_TimeBase):
    """Log-normal with the given mean of the durations (ms) and ``sigma`` of their log."""

    dist: Literal["lognormal"] = "lognormal"
    mean: PositiveFinite = Field(description="mean duration, ms")
    sigma: PositiveFinite = Field(description="standard deviation of ln(duration)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - 0.5 * self.sigma**2
        return rng.lognormal(mu, self.sigma, size=n)

    def analytic_moments(self) -> tuple[float, float]:
        return float(self.mean), float(self.mean) ** 2 * math.expm1(self.sigma**2)


class NormalTime(_TimeBase):
    """Normal(mean, std) in ms, negative draws clipped to 0."""

    dist: Literal["normal"] = "normal"
    mean: float = Field(allow_inf_nan=False, description="ms before clipping at 0")
    std: PositiveFinite = Field(description="ms (> 0)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.maximum(rng.normal(self.mean, self.std, size=n), 0.0)

    def analytic_moments(self) -> tuple[float, float]:
        base = _Normal(self.mean, self.std)
        m1 = base.clipped_moment(0.0, math.inf, 1)
        return m1, _variance(m1, base.clipped_moment(0.0, math.inf, 2))


def _time_shorthand(value: Any) -> Any:
    """``think_time_ms: 500`` means ``{dist: fixed, value: 500}``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


TimeDist = Annotated[
    FixedTime | UniformTime | ExponentialTime | LognormalTime | NormalTime,
    Field(discriminator="dist"),
    BeforeValidator(_time_shorthand),
]

TIME_DISTRIBUTIONS: dict[str, type[_TimeBase]] = {
    "fixed": FixedTime,
    "uniform": UniformTime,
    "exponential": ExponentialTime,
    "lognormal": LognormalTime,
    "normal": NormalTime,
}


# ============================================================================================
# Arrival processes (open loop). Times in seconds; the process starts at t = 0 and the first
# request arrives one inter-arrival time later (all_at_once: every request at t = 0).


class _ArrivalBase(ConfigModel):
    """Common interface of the arrival processes."""

    def mean_rate(self) -> float:
        """Long-run arrival rate, requests/s (inf for ``all_at_once``)."""
        raise NotImplementedError

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` inter-arrival gaps in process time (s)."""
        raise NotImplementedError

    def _to_wall(self, tau: np.ndarray) -> np.ndarray:
        """Map process time to simulated time (identity except for on-off processes)."""
        return tau

    def sample(
        self, rng: np.random.Generator, n: int | None, duration_s: float | None
    ) -> np.ndarray:
        """Arrival times (s, float64, non-decreasing).

        Args:
            rng: The arrival stream.
            n: Maximum number of arrivals (None: as many as fit in ``duration_s``).
            duration_s: Keep only arrivals before this time (None: no limit).
        """
        assert n is not None or duration_s is not None, "need num_requests or duration_s"
        if duration_s is None:
            assert n is not None
            return self._to_wall(np.cumsum(self._gaps(rng, n)))
        expected = self.mean_rate() * duration_s
        if n is None and expected > MAX_GENERATED_REQUESTS:
            raise ConfigError(
                f"workload.duration_s={duration_s:g} at {self.mean_rate():g} req/s would "
                f"generate about {expected:.3g} requests (limit {MAX_GENERATED_REQUESTS:.0e}); "
                "set workload.num_requests"
            )
        # Draw in chunks until past duration_s (or n arrivals): the streams are sequential, so
        # the result does not depend on the chunk size.
        chunk = int(min(expected, MAX_GENERATED_REQUESTS) + 8.0 * math.sqrt(expected) + 64)
        if n is not None:
            chunk = min(chunk, n)
        pieces: list[np.ndarray] = []
        last_tau = 0.0
        total = 0
        while True:
            tau = last_tau + np.cumsum(self._gaps(rng, chunk))
            wall = self._to_wall(tau)
            pieces.append(wall)
            total += chunk
            last_tau = float(tau[-1])
            if wall[-1] >= duration_s or (n is not None and total >= n):
                break
            if n is None and total > MAX_GENERATED_REQUESTS:
                raise ConfigError("workload: too many arrivals before duration_s")
            if n is not None:
                chunk = min(chunk, n - total)
        times = np.concatenate(pieces)
        if n is not None:
            times = times[:n]
        return times[times < duration_s]

    def describe(self) -> str:
        """Short one-line form, e.g. ``poisson(rate=4)``."""
        return _describe_model(self, "process")


class PoissonArrival(_ArrivalBase):
    """Poisson process: exponential inter-arrival times with mean 1/rate (CV 1)."""

    process: Literal["poisson"] = "poisson"
    rate: PositiveFinite = Field(description="requests/s (> 0)")

    def mean_rate(self) -> float:
        return float(self.rate)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size=n)


class GammaArrival(_ArrivalBase):
    """Gamma inter-arrival times with mean 1/rate and coefficient of variation ``cv``.

    shape = 1/cv^2, scale = 1/(rate * shape), as in Vidur's gamma interval generator. cv > 1 is
    burstier than Poisson, cv < 1 more regular, cv = 1 is Poisson.
    """

    process: Literal["gamma"] = "gamma"
    rate: PositiveFinite = Field(description="requests/s (> 0)")
    cv: PositiveFinite = Field(description="coefficient of variation of inter-arrival times")

    def mean_rate(self) -> float:
        return float(self.rate)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, 1.0 / (self.rate * shape), size=n)


class ConstantArrival(_ArrivalBase):
    """One request every 1/rate seconds exactly."""

    process: Literal["constant"] = "constant"
    rate: PositiveFinite = Field(description="requests/s (> 0)")

    def mean_rate(self) -> float:
        return float(self.rate)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 1.0 / self.rate)


class BurstArrival(_ArrivalBase):
    """On-off traffic: Poisson at ``rate`` for ``on_s`` seconds, then silence for ``off_s``.

    The cycle starts with an on period at t = 0. Long-run rate = rate * on_s / (on_s + off_s).
    """

    process: Literal["burst"] = "burst"
    rate: PositiveFinite = Field(description="requests/s during on periods (> 0)")
    on_s: PositiveFinite = Field(description="length of an on period, s (> 0)")
    off_s: NonNegativeFinite = Field(description="length of an off period, s (>= 0)")

    def mean_rate(self) -> float:
        return self.rate * self.on_s / (self.on_s + self.off_s)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size=n)

    def _to_wall(self, tau: np.ndarray) -> np.ndarray:
        # tau counts on-time only; each completed on period adds one off period.
        return tau + np.floor(tau / self.on_s) * self.off_s


class AllAtOnceArrival(_ArrivalBase):
    """Every request arrives at t = 0, like an offline throughput benchmark."""

    process: Literal["all_at_once"] = "all_at_once"

    def mean_rate(self) -> float:
        return math.inf

    def sample(
        self, rng: np.random.Generator, n: int | None, duration_s: float | None
    ) -> np.ndarray:
        assert n is not None, "all_at_once needs num_requests"
        return np.zeros(n)


def _arrival_shorthand(value: Any) -> Any:
    """``arrival: all_at_once`` means ``{process: all_at_once}``."""
    return {"process": value} if isinstance(value, str) else value


ArrivalProcess = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BurstArrival | AllAtOnceArrival,
    Field(discriminator="process"),
    BeforeValidator(_arrival_shorthand),
]

ARRIVAL_PROCESSES: dict[str, type[_ArrivalBase]] = {
    "poisson": PoissonArrival,
    "gamma": GammaArrival,
    "constant": ConstantArrival,
    "burst": BurstArrival,
    "all_at_once": AllAtOnceArrival,
}


# ============================================================================================
# Traces


class CsvColumns(ConfigModel):
    """Column names of a generic CSV trace."""

    arrival_time: str | None = Field(
        default="arrival_time", description="arrival time column (null: no timestamps in the file)"
    )
    prompt_tokens: str = Field(default="prompt_tokens", description="prompt length column")
    output_tokens: str = Field(default="output_tokens", description="output length column")


TRACE_FORMATS: dict[str, str] = {
    "azure": "Azure LLM inference trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens; "
    "arrival = seconds since the first row",
    "mooncake": "Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids "
    "(512-token prefix blocks, kept for prefix caching)",
    "csv": "generic CSV with a header; columns (default arrival_time, prompt_tokens, "
    "output_tokens) and time_unit (s or ms) configurable; arrival times used as given",
}


class TraceConfig(ConfigModel):
    """Replay a trace file: its arrival times and token counts replace the synthetic ones.

    ``time_scale`` multiplies every arrival time (so every inter-arrival gap): 0.5 replays the
    trace twice as fast (double the request rate), 2.0 half as fast. A relative ``path`` is
    looked up next to the experiment file, then in the built-in ``workloads/`` catalog.
    ``format`` may be omitted: ``.jsonl`` files are read as mooncake, CSVs whose header is the
    Azure one as azure, other CSVs as csv.
    """

    path: str = Field(min_length=1, description="trace file")
    format: Literal["azure", "mooncake", "csv"] | None = Field(
        default=None, description="azure | mooncake | csv (default: from the file)"
    )
    time_scale: PositiveFinite = Field(
        default=1.0, description="multiplies arrival times: 0.5 = twice as fast (> 0)"
    )
    columns: CsvColumns | None = Field(default=None, description="csv only: column names")
    time_unit: Literal["s", "ms"] | None = Field(
        default=None, description="csv only: s (default) or ms"
    )

    @model_validator(mode="after")
    def _check_csv_only(self) -> TraceConfig:
        if self.format in ("azure", "mooncake"):
            for key in ("columns", "time_unit"):
                if getattr(self, key) is not None:
                    raise FieldError(key, f"applies to format csv only, not {self.format}")
        return self


@dataclass(frozen=True)
class _Trace:
    arrival_time: np.ndarray | None  # seconds, unscaled, non-decreasing; None = no timestamps
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[list[int]] | None
    format: str

    def __len__(self) -> int:
        return len(self.prompt_tokens)


# ============================================================================================
# Workload config


class WorkloadConfig(ConfigModel):
    """The ``workload:`` block of an experiment.

    Open loop: ``arrival`` draws arrival times (or a ``trace`` supplies them). Closed loop:
    ``concurrency`` users each send their next request ``think_time_ms`` after the previous one
    finished; arrival times are then decided by the engine. ``num_requests`` and ``duration_s``
    both bound an open-loop workload (and may truncate a trace); whichever is hit first wins.
    With a ``trace`` plus ``arrival`` or ``concurrency``, only the trace's token counts are used
    (in file order).
    """

    num_requests: int | None = Field(default=None, ge=1, description="number of requests (>= 1)")
    duration_s: PositiveFinite | None = Field(
        default=None, description="no arrivals at or after this simulated time, s"
    )
    arrival: ArrivalProcess | None = Field(default=None, description="open-loop arrival process")
    prompt_tokens: LengthDist | None = Field(default=None, description="prompt length distribution")
    output_tokens: LengthDist | None = Field(default=None, description="output length distribution")
    trace: TraceConfig | None = Field(default=None, description="trace file to replay")
    concurrency: int | None = Field(default=None, ge=1, description="closed loop: number of users")
    think_time_ms: TimeDist | None = Field(
        default=None, description="closed loop: pause between a user's requests, ms (default 0)"
    )
    cancel_after_ms: TimeDist | None = Field(
        default=None, description="client disconnects this long after arrival, ms (default never)"
    )

    @model_validator(mode="after")
    def _check_combination(self) -> WorkloadConfig:
        if self.arrival is not None and self.concurrency is not None:
            raise FieldError(
                "concurrency", "cannot be combined with arrival: closed loop or open loop, not both"
            )
        if self.think_time_ms is not None and self.concurrency is None:
            raise FieldError("think_time_ms", "applies to closed loop only (set concurrency)")
        if self.concurrency is not None and self.duration_s is not None:
            raise FieldError(
                "duration_s", "is not supported with concurrency (closed loop); use num_requests"
            )
        if self.trace is not None:
            for key in ("prompt_tokens", "output_tokens"):
                if getattr(self, key) is not None:
                    raise FieldError(key, "cannot be combined with trace (the trace has them)")
            uses_timestamps = self.arrival is None and self.concurrency is None
            if not uses_timestamps and self.trace.time_scale != 1.0:
                raise FieldError(
                    "trace.time_scale", "has no effect when arrival or concurrency is given"
                )
            cols = self.trace.columns
            if uses_timestamps and cols is not None and cols.arrival_time is None:
                raise FieldError(
                    "arrival", "or concurrency is required: trace.columns.arrival_time is null"
                )
        else:
            for key in ("prompt_tokens", "output_tokens"):
                if getattr(self, key) is None:
                    raise FieldError(key, "is required (or give a trace)")
            if self.arrival is None and self.concurrency is None:
                raise FieldError("arrival", "or concurrency is required (or give a trace)")
            if self.num_requests is None and self.duration_s is None:
                raise FieldError("num_requests", "or duration_s is required")
        if self.concurrency is not None and self.num_requests is None and self.trace is None:
            raise FieldError("num_requests", "is required with concurrency (closed loop)")
        all_at_once = isinstance(self.arrival, AllAtOnceArrival)
        if all_at_once and self.num_requests is None and self.trace is None:
            raise FieldError("num_requests", "is required with arrival all_at_once")
        return self

    @property
    def closed_loop(self) -> bool:
        """True when ``concurrency`` users drive the arrivals."""
        return self.concurrency is not None


# ============================================================================================
# Output


@dataclass(frozen=True, eq=False)
class RequestTable:
    """All requests of one run, as parallel numpy arrays (index = request id).

    Treat the arrays as read-only; copy before modifying.
    """

    arrival_time: np.ndarray
    """float64 seconds, non-decreasing; NaN for closed loop (the engine decides)."""
    prompt_tokens: np.ndarray
    """int64 >= 1."""
    output_tokens: np.ndarray
    """int64 >= 1."""
    cancel_after: np.ndarray | None = None
    """float64 seconds after arrival when the client disconnects (inf = never), or None."""
    think_time: np.ndarray | None = None
    """Closed loop: seconds a user waits after its previous request finished, else None."""
    concurrency: int | None = None
    """Closed loop: number of users, else None."""
    prefix_hash_ids: list | None = field(default=None)
    """Mooncake ``hash_ids`` per request (512-token prefix blocks), else None."""

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        assert len(self.arrival_time) == n and len(self.output_tokens) == n, "length mismatch"
        for name in ("cancel_after", "think_time", "prefix_hash_ids"):
            value = getattr(self, name)
            assert value is None or len(value) == n, f"{name} length mismatch"

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return len(self.prompt_tokens)


# ============================================================================================
# Generation


def _child_rngs(seed: int) -> dict[str, np.random.Generator]:
    names = ("arrival", "prompt", "output", "cancel", "think")
    children = np.random.SeedSequence(seed).spawn(len(names))
    return {name: np.random.default_rng(child) for name, child in zip(names, children, strict=True)}


def generate(cfg: WorkloadConfig, seed: int, base_dir: Path | None = None) -> RequestTable:
    """Draw the requests of a workload.

    Args:
        cfg: The validated ``workload:`` block.
        seed: Non-negative integer; the same seed gives identical arrays.
        base_dir: Directory of the experiment file; relative trace/data paths are looked up
            there first (None: the current directory), then in the built-in catalog.

    Returns:
        The request table.

    Raises:
        ConfigError: Unreadable or malformed trace/data file, a trace shorter than
            ``num_requests``, or no request at all.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    rngs = _child_rngs(int(seed))
    closed = cfg.concurrency is not None
    hash_ids: list | None = None

    if cfg.trace is not None:
        trace = load_trace(cfg.trace, base_dir)
        if cfg.num_requests is not None and cfg.num_requests > len(trace):
            raise ConfigError(
                f"workload.num_requests={cfg.num_requests} exceeds the {len(trace)} requests "
                f"in trace {cfg.trace.path}"
            )
        limit = cfg.num_requests if cfg.num_requests is not None else len(trace)
        if closed:
            arrival = np.full(limit, np.nan)
        elif cfg.arrival is not None:
            arrival = cfg.arrival.sample(rngs["arrival"], limit, cfg.duration_s)
        else:
            assert trace.arrival_time is not None
            arrival = trace.arrival_time[:limit] * cfg.trace.time_scale
            if cfg.duration_s is not None:
                arrival = arrival[arrival < cfg.duration_s]
        n = len(arrival)
        prompt = trace.prompt_tokens[:n].copy()
        output = trace.output_tokens[:n].copy()
        if trace.hash_ids is not None:
            hash_ids = trace.hash_ids[:n]
    else:
        assert cfg.prompt_tokens is not None and cfg.output_tokens is not None
        if closed:
            assert cfg.num_requests is not None
            arrival = np.full(cfg.num_requests, np.nan)
        else:
            assert cfg.arrival is not None
            arrival = cfg.arrival.sample(rngs["arrival"], cfg.num_requests, cfg.duration_s)
        n = len(arrival)
        prompt = cfg.prompt_tokens.sample(rngs["prompt"], n, base_dir)
        output = cfg.output_tokens.sample(rngs["output"], n, base_dir)

    if n == 0:
        raise ConfigError(
            f"workload: no request arrives before duration_s={cfg.duration_s:g}"
            if cfg.duration_s is not None
            else "workload: no requests"
        )
    cancel = None
    if cfg.cancel_after_ms is not None:
        cancel = cfg.cancel_after_ms.sample(rngs["cancel"], n) / 1000.0
    think = None
    if closed:
        if cfg.think_time_ms is not None:
            think = cfg.think_time_ms.sample(rngs["think"], n) / 1000.0
        else:
            think = np.zeros(n)
    return RequestTable(
        arrival_time=np.ascontiguousarray(arrival, dtype=np.float64),
        prompt_tokens=np.ascontiguousarray(prompt, dtype=np.int64),
        output_tokens=np.ascontiguousarray(output, dtype=np.int64),
        cancel_after=cancel,
        think_time=think,
        concurrency=cfg.concurrency,
        prefix_hash_ids=hash_ids,
    )


# ============================================================================================
# Files: path resolution, trace and column readers


_DATA_SUFFIXES = (".csv", ".jsonl", ".txt")


def resolve_data_path(path: str, base_dir: Path | None, key: str) -> Path:
    """Find a trace or data file.

    A relative path is tried against ``base_dir`` (the experiment file's directory; the current
    directory when None), then against the built-in ``workloads/`` catalog.

    Raises:
        ConfigError: Not found; names the places looked in and the built-in files.
    """
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        if candidate.is_file():
            return candidate
        raise ConfigError(f"{key}: file not found: {path}")
    base = base_dir if base_dir is not None else Path.cwd()
    builtin_dir = catalog_dir("workloads")
    for place in (base, builtin_dir):
        if (place / candidate).is_file():
            return place / candidate
    builtins = sorted(p.name for p in builtin_dir.glob("*") if p.suffix in _DATA_SUFFIXES)
    listing = ", ".join(builtins) or "(none)"
    raise ConfigError(
        f"{key}: file not found: {path} (looked in {base} and in the built-in workloads: {listing})"
    )


def _mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


def load_trace(trace: TraceConfig, base_dir: Path | None = None) -> _Trace:
    """Read a trace file (cached per file, format and columns; do not modify the arrays).

    Raises:
        ConfigError: Missing file, malformed row (names file and line), timestamps going
            backwards, or an empty trace.
    """
    resolved = resolve_data_path(trace.path, base_dir, "workload.trace.path")
    fmt = trace.format or _infer_format(resolved, trace)
    cols = trace.columns or CsvColumns()
    return _load_trace_cached(
        str(resolved), _mtime(resolved), fmt, cols, trace.time_unit or "s", trace.path
    )


def _infer_format(path: Path, trace: TraceConfig) -> str:
    if path.suffix in (".jsonl", ".json"):
        return "mooncake"
    if trace.columns is not None or trace.time_unit is not None:
        return "csv"
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    names = {h.strip() for h in header}
    return "azure" if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= names else "csv"


@functools.lru_cache(maxsize=8)
def _load_trace_cached(
    path: str, mtime: int, fmt: str, cols: CsvColumns, time_unit: str, shown: str
) -> _Trace:
    if fmt == "mooncake":
        out = _read_mooncake(path, shown)
    elif fmt == "azure":
        out = _read_azure(path, shown)
    else:
        out = _read_csv_trace(path, shown, cols, time_unit)
    for arr in (out.arrival_time, out.prompt_tokens, out.output_tokens):
        if arr is not None:
            arr.setflags(write=False)
    return out


def _read_rows(path: str, shown: str) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank rows and their 1-based line numbers of a CSV file."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header: list[str] | None = None
            rows: list[list[str]] = []
            lines: list[int] = []
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [h.strip() for h in row]
                    continue
                rows.append(row)
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read CSV: {exc}", shown) from exc
    if header is None or not rows:
        raise ConfigError("empty trace: no data rows", shown)
    return header, rows, lines


def _column_index(header: list[str], name: str, shown: str) -> int:
    try:
        return header.index(name)
    except ValueError:
        columns = format_value(", ".join(header)).strip("'\"")
        raise ConfigError(f"missing column {name!r}; header has {columns}", shown, 1) from None


def _take(rows: list[list[str]], lines: list[int], idx: int, width: int, shown: str) -> list[str]:
    try:
        return [row[idx] for row in rows]
    except IndexError:
        for row, line in zip(rows, lines, strict=True):
            if len(row) != width:
                raise ConfigError(f"expected {width} fields, got {len(row)}", shown, line) from None
        raise  # pragma: no cover


def _positive_ints(
    values: Sequence[Any], lines: Sequence[int], name: str, shown: str
) -> np.ndarray:
    """Parse positive integers (integral floats like ``12.0`` accepted), vectorised."""
    raw = np.asarray(values)
    arr: np.ndarray | None = None
    integral_floats = raw.dtype.kind == "f" and bool(np.all(raw == np.rint(raw)))
    if raw.dtype.kind in "iu" or integral_floats:
        arr = raw.astype(np.int64)
    elif raw.dtype.kind == "U":
        try:  # strict: "12.5" and "abc" raise
            arr = raw.astype(np.int64)
        except (ValueError, OverflowError):
            arr = None
    if arr is not None and arr.size and arr.min() >= 1:
        return arr
    for value, line in zip(values, lines, strict=True):
        if _as_positive_int(value) is None:
            raise ConfigError(f"{name}: expected a positive integer, got {value!r}", shown, line)
    # Every value is a positive integer but not in a form numpy parses (e.g. "12.0").
    return np.array([_as_positive_int(v) for v in values], dtype=np.int64)


def _as_positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 1 else None
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                real = float(text)
            except ValueError:
                return None
            return int(real) if math.isfinite(real) and real.is_integer() and real >= 1 else None
        return number if number >= 1 else None
    return None


def _nonnegative_floats(
    values: Sequence[Any], lines: Sequence[int], name: str, shown: str
) -> np.ndarray:
    try:
        arr = np.asarray(values).astype(np.float64)
        if np.all(np.isfinite(arr)) and (arr.size == 0 or arr.min() >= 0):
            return arr
    except (ValueError, TypeError):
        pass
    for value, line in zip(values, lines, strict=True):
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number >= 0):
            raise ConfigError(f"{name}: expected a number >= 0, got {value!r}", shown, line)
    raise AssertionError("unreachable")  # pragma: no cover


def _check_sorted(times: np.ndarray, lines: Sequence[int], name: str, shown: str) -> None:
    back = np.flatnonzero(np.diff(times) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise ConfigError(
            f"{name} goes backwards ({times[i - 1]:g} s then {times[i]:g} s after the start); "
            "sort the rows by time",
            shown,
            lines[i],
        )


def _read_azure(path: str, shown: str) -> _Trace:
    header, rows, lines = _read_rows(path, shown)
    width = len(header)
    i_ts, i_ctx, i_gen = (
        _column_index(header, name, shown)
        for name in ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    )
    stamps = _take(rows, lines, i_ts, width, shown)
    prompt = _positive_ints(_take(rows, lines, i_ctx, width, shown), lines, "ContextTokens", shown)
    output = _positive_ints(
        _take(rows, lines, i_gen, width, shown), lines, "GeneratedTokens", shown
    )
    import pandas as pd  # local: only trace loading needs it

    parsed = pd.to_datetime(pd.Series(stamps), format="ISO8601", errors="coerce")
    bad = np.flatnonzero(parsed.isna().to_numpy())
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"TIMESTAMP: expected a date-time like 2023-11-16 18:15:46.6805900, got {stamps[i]!r}",
            shown,
            lines[i],
        )
    seconds = ((parsed - parsed.iloc[0]) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    _check_sorted(seconds, lines, "TIMESTAMP", shown)
    return _Trace(seconds, prompt, output, None, "azure")


def _read_csv_trace(path: str, shown: str, cols: CsvColumns, time_unit: str) -> _Trace:
    header, rows, lines = _read_rows(path, shown)
    width = len(header)
    i_p = _column_index(header, cols.prompt_tokens, shown)
    i_o = _column_index(header, cols.output_tokens, shown)
    prompt = _positive_ints(_take(rows, lines, i_p, width, shown), lines, cols.prompt_tokens, shown)
    output = _positive_ints(_take(rows, lines, i_o, width, shown), lines, cols.output_tokens, shown)
    arrival = None
    if cols.arrival_time is not None:
        i_t = _column_index(header, cols.arrival_time, shown)
        raw = _take(rows, lines, i_t, width, shown)
        arrival = _nonnegative_floats(raw, lines, cols.arrival_time, shown)
        if time_unit == "ms":
            arrival = arrival / 1000.0
        _check_sorted(arrival, lines, cols.arrival_time, shown)
    return _Trace(arrival, prompt, output, None, "csv")


def _read_mooncake(path: str, shown: str) -> _Trace:
    stamps: list[Any] = []
    inputs: list[Any] = []
    outputs: list[Any] = []
    hashes: list[list[int]] = []
    lines: list[int] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"invalid JSON: {exc.msg}", shown, line_no) from None
                if not isinstance(row, dict):
                    raise ConfigError("expected a JSON object per line", shown, line_no)
                for key in ("timestamp", "input_length", "output_length"):
                    if key not in row:
                        raise ConfigError(f"{key}: missing", shown, line_no)
                ids = row.get("hash_ids", [])
                if not isinstance(ids, list):
                    raise ConfigError(f"hash_ids: expected a list, got {ids!r}", shown, line_no)
                stamps.append(row["timestamp"])
                inputs.append(row["input_length"])
                outputs.append(row["output_length"])
                hashes.append(ids)
                lines.append(line_no)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read JSONL: {exc}", shown) from exc
    if not lines:
        raise ConfigError("empty trace: no data rows", shown)
    prompt = _positive_ints(inputs, lines, "input_length", shown)
    output = _positive_ints(outputs, lines, "output_length", shown)
    for value, line in zip(stamps, lines, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"timestamp: expected a number of ms, got {value!r}", shown, line)
    ms = _nonnegative_floats(stamps, lines, "timestamp", shown)
    seconds = (ms - ms[0]) / 1000.0
    _check_sorted(seconds, lines, "timestamp", shown)
    return _Trace(seconds, prompt, output, hashes, "mooncake")


@functools.lru_cache(maxsize=16)
def _read_int_column(path: str, mtime: int, column: str | None, shown: str) -> np.ndarray:
    """Positive integers from one column of a text/CSV file (see :class:`EmpiricalLength`)."""
    values: list[str] = []
    lines: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            index: int | None = None
            width = 1
            first = True
            for row in reader:
                if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                    continue
                if first:
                    first = False
                    if column is not None:
                        header = [h.strip() for h in row]
                        index = _column_index(header, column, shown)
                        width = len(header)
                        continue
                    if len(row) == 1 and _as_positive_int(row[0]) is None:
                        continue  # a header line
                if column is None and len(row) != 1:
                    raise ConfigError(
                        f"expected one value per line, got {len(row)} fields "
                        "(set column to pick one)",
                        shown,
                        reader.line_num,
                    )
                if len(row) != width and column is not None:
                    raise ConfigError(
                        f"expected {width} fields, got {len(row)}", shown, reader.line_num
                    )
                values.append(row[index if index is not None else 0])
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read file: {exc}", shown) from exc
    if not values:
        raise ConfigError("no values in file", shown)
    out = _positive_ints(values, lines, column or "value", shown)
    out.setflags(write=False)
    return out


# ============================================================================================
# Workload files (workloads/*.yaml) and the catalog listing


@dataclass(frozen=True)
class WorkloadDefinition:
    """A reusable workload file (``workloads/<name>.yaml``)."""

    name: str
    description: str
    config: WorkloadConfig
    base_dir: Path
    """Directory of the file (relative trace/data paths in it are resolved there)."""
    path: Path


def parse_workload(
    data: Any, *, prefix: str = "workload", source: str | None = None
) -> WorkloadConfig:
    """Validate a ``workload:`` mapping.

    Raises:
        ConfigError: One line naming ``prefix.key.path``, the rule and the value.
    """
    try:
        return WorkloadConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_pydantic(exc, prefix, source, model=WorkloadConfig) from None


def load_workload(name_or_path: str, key: str = "workload") -> WorkloadDefinition:
    """Load a workload file: a built-in name (``sharegpt-like``) or a YAML path.

    The file is a ``workload:`` block written at top level, plus optional ``name`` and
    ``description`` (an experiment may say ``workload: sharegpt-like``). Sources of the numbers
    go in YAML comments.

    Raises:
        ConfigError: Unknown name, unreadable YAML or an invalid block (file and line named).
    """
    path = resolve("workloads", name_or_path, key)
    data, text = read_mapping(path)
    name = str(data.pop("name", path.stem))
    description = " ".join(str(data.pop("description", "")).split())
    try:
        cfg = WorkloadConfig.model_validate(data)
    except ValidationError as exc:
        err = config_error_from_pydantic(exc, "", None, model=WorkloadConfig)
        key_path = err.message.split(" ", 1)[0].rstrip(":").split(".")
        raise ConfigError(err.message, str(path), line_of(text, key_path)) from None
    return WorkloadDefinition(name, description, cfg, path.parent, path)


def _describe_model(model: ConfigModel, tag: str) -> str:
    values = model.model_dump(exclude_defaults=True, exclude={tag})
    kind = getattr(model, tag)
    parts = []
    for name, value in values.items():
        if isinstance(value, tuple | list) and len(value) > 4:
            value = f"[{len(value)} values]"
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        parts.append(f"{name}={value}")
    return f"{kind}({', '.join(parts)})"


def _parameters(cls: type[ConfigModel], tag: str) -> str:
    parts = []
    for name, info in cls.model_fields.items():
        if name == tag:
            continue
        optional = "" if info.is_required() else " [optional]"
        parts.append(f"{name}: {info.description or ''}{optional}")
    return "; ".join(parts)


def _doc_line(cls: type) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0].replace("``", "")


_SAMPLE_DESCRIPTIONS = {
    "azure_conv_sample.csv": "First 2,000 requests of the Azure LLM inference trace 2023, "
    "conversation service (Splitwise, ISCA'24; CC-BY)",
    "azure_code_sample.csv": "First 500 requests of the Azure LLM inference trace 2023, "
    "code-completion service (Splitwise, ISCA'24; CC-BY)",
    "mooncake_synthetic_sample.jsonl": "First 200 requests of the Mooncake FAST'25 synthetic "
    "trace, with prefix hash ids (Apache-2.0)",
}

_Row = dict[str, Any]


def _row(
    name: str,
    kind: str,
    description: str,
    parameters: str = "",
    requests: int | None = None,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
) -> _Row:
    return {
        "name": name,
        "kind": kind,
        "description": description,
        "parameters": parameters,
        "requests": requests,
        "mean_prompt_tokens": None if mean_prompt is None else round(mean_prompt, 1),
        "mean_output_tokens": None if mean_output is None else round(mean_output, 1),
    }


def _definition_row(definition: WorkloadDefinition) -> _Row:
    cfg = definition.config
    parts: list[str] = []
    if cfg.trace is not None:
        trace = load_trace(cfg.trace, definition.base_dir)
        count = min(cfg.num_requests or len(trace), len(trace))
        mean_p = float(trace.prompt_tokens[:count].mean())
        mean_o = float(trace.output_tokens[:count].mean())
        parts.append(f"trace={cfg.trace.path}")
        requests: int | None = count
    else:
        assert cfg.prompt_tokens is not None and cfg.output_tokens is not None
        mean_p = cfg.prompt_tokens.analytic_mean(definition.base_dir)
        mean_o = cfg.output_tokens.analytic_mean(definition.base_dir)
        parts.append(f"prompt={cfg.prompt_tokens.describe()}")
        parts.append(f"output={cfg.output_tokens.describe()}")
        requests = cfg.num_requests
    if cfg.arrival is not None:
        parts.insert(0, f"arrival={cfg.arrival.describe()}")
    if cfg.concurrency is not None:
        parts.insert(0, f"concurrency={cfg.concurrency}")
    if cfg.duration_s is not None:
        parts.append(f"duration_s={cfg.duration_s:g}")
    return _row(
        definition.name,
        "workload",
        definition.description,
        "; ".join(parts),
        requests,
        mean_p,
        mean_o,
    )


def workload_table() -> list[dict[str, Any]]:
    """Everything ``batchsim list workloads`` shows, one dict per row.

    Rows have the keys ``name, kind, description, parameters, requests, mean_prompt_tokens,
    mean_output_tokens``. Kinds: ``workload`` (YAML files in ``workloads/``), ``trace`` (trace
    samples shipped there), ``arrival`` (arrival processes), ``length`` (token-length
    distributions), ``time`` (think/cancel-time distributions), ``trace-format``.
    """
    rows: list[_Row] = []
    for name in catalog_names("workloads"):
        rows.append(_definition_row(load_workload(name)))
    directory = catalog_dir("workloads")
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".csv", ".jsonl") or path.name.startswith("_"):
                continue
            trace = load_trace(TraceConfig(path=str(path)))
            rows.append(
                _row(
                    path.name,
                    "trace",
                    _SAMPLE_DESCRIPTIONS.get(path.name, f"{trace.format} trace"),
                    f"format={trace.format}",
                    len(trace),
                    float(trace.prompt_tokens.mean()),
                    float(trace.output_tokens.mean()),
                )
            )
    groups: list[tuple[str, dict[str, type[ConfigModel]], str]] = [
        ("arrival", dict(ARRIVAL_PROCESSES), "process"),
        ("length", dict(LENGTH_DISTRIBUTIONS), "dist"),
        ("time", dict(TIME_DISTRIBUTIONS), "dist"),
    ]
    for kind, classes, tag in groups:
        for name, cls in classes.items():
            rows.append(_row(name, kind, _doc_line(cls), _parameters(cls, tag)))
    for name, text in TRACE_FORMATS.items():
        rows.append(_row(name, "trace-format", text))
    return rows
