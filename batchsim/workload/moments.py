"""Continuous base distributions: survival function and closed-form partial moments.

They let ``analytic_mean()``/``analytic_variance()`` of the token-length and time distributions
(:mod:`batchsim.workload.distributions`) account for rounding and clipping exactly. Owns the
normal, log-normal and truncated-exponential bases, the exact moments of
``clip(rint(X), lo, hi)`` and the vectorised round-and-clip used when sampling. Pure numerics:
imports nothing from batchsim.
"""

from __future__ import annotations

import math

import numpy as np

#: Integer points summed exactly by ``analytic_mean``; beyond, a closed-form integral is used.
_EXACT_SUM_POINTS = 200_000
_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


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
    """``clip(rint(x), lo, hi)`` as int64. Without ``hi``, values above ``2**62`` become
    ``2**62`` so the cast cannot overflow; the caller rejects counts above its limit."""
    out = np.rint(x)
    np.clip(out, lo, hi if hi is not None else _NO_OVERFLOW, out=out)
    return out.astype(np.int64)


_NO_OVERFLOW = float(2**62)
