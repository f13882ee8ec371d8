"""The search a fit runs and the score it minimizes.

:func:`coordinate_search` is deterministic: each term in turn is tried at fixed multiples of
its value, coarse steps then fine ones, within its search bounds (:func:`search_bounds`), and
values are rounded to the written profile's precision (:func:`round_sig`). :func:`layer_score`
is 1 at the calibration targets (median and p90 absolute % error over all points, the knee and
small decode batches), built on :func:`abs_err_pct` and :func:`stats`, which also report a
fit's error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from batchsim.catalog.hardware import EFFICIENCY_KEYS

__all__ = ["coordinate_search", "layer_score"]

KNEE = (64, 512)
DECODE = (1, 32)
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
