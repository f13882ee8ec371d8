"""Token-length and time distributions of a workload, with their analytic moments.

Owns the ``dist:`` models of ``prompt_tokens``/``output_tokens`` (fixed, uniform, normal,
lognormal, exponential, zipf, empirical; integer token counts >= 1, rounded and clipped to
``[min, max]``) and of ``think_time_ms``/``cancel_after_ms`` (fixed, uniform, exponential,
lognormal, normal; milliseconds >= 0), the number shorthands (``output_tokens: 128``), the
discriminated unions ``LengthDist``/``TimeDist`` and the ``LENGTH_DISTRIBUTIONS`` and
``TIME_DISTRIBUTIONS`` registries. Each model samples from a given numpy stream and knows the
exact mean and variance of what it samples.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field, model_validator

from batchsim.validation import MAX_MS, MAX_TOKENS, ConfigModel, FieldError, StrictFloat
from batchsim.workload.common import (
    Millis,
    PositiveMillis,
    Sigma,
    TokenCount,
    TokenMean,
    _describe_model,
)
from batchsim.workload.files import _mtime, _read_int_column, resolve_data_path
from batchsim.workload.moments import (
    _LogNormal,
    _Normal,
    _round_clip,
    _rounded_clipped_moments,
    _TruncExp,
    _variance,
)

#: Largest support of a ``zipf`` distribution (its CDF table is held in memory).
MAX_ZIPF_SUPPORT = 10_000_000


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


def _list_as_tuple(value: Any) -> Any:
    """A YAML list for a tuple field (strict mode takes tuples only)."""
    return tuple(value) if isinstance(value, list) else value


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
    mean: StrictFloat = Field(
        ge=-MAX_TOKENS, le=MAX_TOKENS, description="mean before rounding/clipping, tokens"
    )
    std: TokenMean = Field(description="standard deviation, tokens (> 0)")
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
    mean: TokenMean = Field(description="mean of the (unclipped) token counts, tokens")
    sigma: Sigma = Field(description="standard deviation of ln(tokens) (> 0, <= 10)")
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
    mean: TokenMean = Field(description="mean of the exponential before truncation, tokens")
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
    theta: StrictFloat = Field(ge=0, le=100, description="exponent (>= 0; 0 = uniform)")
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
    values: Annotated[tuple[TokenCount, ...] | None, BeforeValidator(_list_as_tuple)] = Field(
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
    value: Millis = Field(description="ms (>= 0)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))

    def analytic_moments(self) -> tuple[float, float]:
        return float(self.value), 0.0


class UniformTime(_TimeBase):
    """Uniform on ``[min, max]`` milliseconds."""

    dist: Literal["uniform"] = "uniform"
    min: Millis = Field(description="ms (>= 0)")
    max: Millis = Field(description="ms (>= min)")

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
    mean: PositiveMillis = Field(description="ms (> 0)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, size=n)

    def analytic_moments(self) -> tuple[float, float]:
        return float(self.mean), float(self.mean) ** 2


class LognormalTime(_TimeBase):
    """Log-normal with the given mean of the durations (ms) and ``sigma`` of their log."""

    dist: Literal["lognormal"] = "lognormal"
    mean: PositiveMillis = Field(description="mean duration, ms")
    sigma: Sigma = Field(description="standard deviation of ln(duration) (<= 10)")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - 0.5 * self.sigma**2
        return rng.lognormal(mu, self.sigma, size=n)

    def analytic_moments(self) -> tuple[float, float]:
        return float(self.mean), float(self.mean) ** 2 * math.expm1(self.sigma**2)


class NormalTime(_TimeBase):
    """Normal(mean, std) in ms, negative draws clipped to 0."""

    dist: Literal["normal"] = "normal"
    mean: StrictFloat = Field(ge=-MAX_MS, le=MAX_MS, description="ms before clipping at 0")
    std: PositiveMillis = Field(description="ms (> 0)")

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
