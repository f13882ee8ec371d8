"""``batchsim plot kv``: the KV cache and the queue of one run over time.

Top panel: KV-cache usage (the fraction of GPU KV blocks in use, ``iterations.csv``
``kv_cache_usage``, from each iteration's start to the next one's), with a marker above the
curve at each iteration that preempted requests (``num_preempted`` > 0; the count is written
beside the marker when it is more than one and there are few such markers).

With prefix caching (``engine.enable_prefix_caching``), a second line gives the blocks that
hold cached prefix content (``num_cached_blocks``: held by requests, or idle and reusable
until evicted) as a fraction of the pool, with the run's hit rate in its label: idle cached
blocks count as free, so usage alone hides them.

A cluster run (``cluster:``) draws the mean usage of its replicas and the sum of their
batches.

Bottom panel: requests over time —

* *in the batch* (shaded): ``num_seqs`` of the iteration running at that time, 0 while the
  engine is idle; it dips at every prefill-only iteration that stalls the decodes;
* *admitted, not finished*: requests between ``first_scheduled_time_s`` and
  ``finish_time_s`` (``requests.csv``), whether or not they run in the current iteration (a
  request preempted by recompute counts until it finishes);
* *waiting*: requests that arrived and were not yet scheduled for the first time
  (``arrival_time_s`` <= t < ``first_scheduled_time_s``; a request that left without being
  scheduled waits until its ``finish_time_s`` (cancelled), or not at all when that is empty
  too (rejected on arrival)).

``--from``/``--to`` (``options.start``/``end``, seconds) zoom on a window. A series with more
than :data:`MAX_EXACT_POINTS` steps in the window (a long run seen whole) would draw as a
solid band of spikes: it is drawn per time bin instead (:data:`NUM_BINS` bins), as its
time-weighted mean (line) and its range (light band), and the x label gives the bin width.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Study
from batchsim.plots.style import OKABE_ITO, finish, new_figure, run_title, suptitle

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

NUM_BINS = 600
"""Time bins of a series drawn per bin (about two pixels each at the default size)."""
MAX_EXACT_POINTS = NUM_BINS
"""Most steps of a series drawn exactly; with more, most steps are narrower than a bin."""
IDLE_TOLERANCE_S = 1e-6
"""Shorter spaces between one iteration's end and the next one's start are the rounding of
``start_time_s + duration_ms / 1e3``, not idle time."""
MAX_COUNT_LABELS = 40
"""Most preemption markers whose count is written beside them."""

USAGE_COLOR = OKABE_ITO[2]
PREEMPTION_COLOR = OKABE_ITO[1]
RUNNING_COLOR = OKABE_ITO[0]
ADMITTED_COLOR = OKABE_ITO[5]
WAITING_COLOR = OKABE_ITO[3]
CACHED_COLOR = OKABE_ITO[4]

_ABOVE: dict[str, Any] = {
    "loc": "lower left",
    "bbox_to_anchor": (0.0, 1.0),
    "ncols": 3,
    "frameon": False,
    "borderaxespad": 0.2,
}
"""A legend in a row above its panel, where it covers no data."""


def applies(source: Run | Study) -> bool:
    """A run with ``requests.csv`` and an ``iterations.csv`` of at least one iteration (or
    their ``.parquet``)."""
    return isinstance(source, Run) and source.has_csv and has_iterations(source)


def has_iterations(run: Run) -> bool:
    """Whether the run's iterations table has a row (read no further than needed)."""
    return run.has_iteration_rows()


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    """KV-cache usage with preemptions (top), requests in the batch, admitted and waiting
    (bottom), over time.

    Raises:
        ConfigError: Not exactly one run folder, a run without its CSV files, or a --from/--to
            window that holds no iteration; one line naming the folder.
    """
    run = _one_run(sources)
    iterations, requests = run.iterations, run.requests
    start_s = iterations["start_time_s"].to_numpy(dtype=float)
    end_s = start_s + iterations["duration_ms"].to_numpy(dtype=float) / 1e3
    if not start_s.size:
        raise ConfigError(f"{run.table_path('iterations')}: no iteration (nothing was scheduled)")
    # by default from the first arrival (a static batch waits to fill) to the last iteration
    arrivals = requests["arrival_time_s"].to_numpy(dtype=float)
    first = min(float(start_s[0]), float(np.nanmin(arrivals)) if arrivals.size else np.inf)
    t0 = first if options.start is None else float(options.start)
    t1 = float(end_s.max()) if options.end is None else float(options.end)
    inside = (start_s < t1) & (end_s > t0)
    if not t1 > t0 or not inside.any():
        raise ConfigError(
            f"{run.path}: no iteration between --from {t0:g} s and --to {t1:g} s (its "
            f"iterations run from {start_s[0]:g} s to {end_s.max():g} s)"
        )
    bins = _Bins(t0, t1)

    fig, (top, bottom) = new_figure(
        2, 1, sharex=True, figsize=(9.0, 6.0), gridspec_kw={"height_ratios": [1, 1.2]}
    )
    usage = iterations["kv_cache_usage"].to_numpy(dtype=float)
    seqs = iterations["num_seqs"].to_numpy(dtype=float)
    replicas = _replica_rows(iterations)
    if replicas is None:
        x, y = _window(start_s, usage, t0, t1, before=0.0)
        usage_label = "KV-cache usage"
        busy = _busy_steps(start_s[inside], end_s[inside], seqs[inside])
    else:  # a cluster: the replicas' mean usage, and their batches added up
        mean = _sum_steps([(start_s[rows], usage[rows] / len(replicas)) for rows in replicas])
        x, y = _window(*mean, t0, t1, before=0.0)
        usage_label = f"KV-cache usage (mean of {len(replicas)} replicas)"
        busy = _sum_steps(
            [
                _busy_steps(start_s[r], end_s[r], seqs[r])
                for r in (rows[inside[rows]] for rows in replicas)
                if r.size
            ]
        )
    bins.step(top, x, y, color=USAGE_COLOR, label=usage_label, linewidth=1.2)
    cached = _cached_fraction(run, iterations)
    if cached is not None and replicas is None:
        x, y = _window(start_s, cached, t0, t1, before=0.0)
        rate = run.summary.get("prefix_cache_hit_rate")
        label = "cached prefix blocks (held or idle)"
        if isinstance(rate, (int, float)):
            label += f"; hit rate {rate:.0%}"
        bins.step(top, x, y, color=CACHED_COLOR, label=label, linewidth=1.2, linestyle="--")
    top.axhline(1.0, color="0.5", linewidth=0.8, linestyle="--")
    _draw_preemptions(top, iterations["num_preempted"].to_numpy(dtype=np.int64), start_s, t0, t1)
    top.set_ylabel("KV-cache usage\n(fraction of blocks)")
    top.set_ylim(0.0, 1.12)
    finish(top, **_ABOVE)

    x, y = _window(*busy, t0, t1)
    label = "in the batch (num_seqs)" if replicas is None else "in the batches (num_seqs, summed)"
    bins.step(bottom, x, y, fill=True, color=RUNNING_COLOR, label=label)
    x, y = step_counts(*admitted_intervals(requests), t0, t1)
    bins.step(bottom, x, y, color=ADMITTED_COLOR, label="admitted, not finished", linewidth=1.4)
    x, y = step_counts(*waiting_intervals(requests), t0, t1)
    label = "waiting (arrived, not yet scheduled)"
    bins.step(bottom, x, y, color=WAITING_COLOR, label=label, linewidth=1.4)
    bottom.set_ylabel("requests")
    bottom.set_xlabel("time (s)" + bins.note())
    bottom.set_ylim(bottom=0)
    bottom.set_xlim(t0, t1)
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    finish(bottom, **_ABOVE)

    note = run.iterations_note()  # a sampled table: usage and batch drawn between its rows
    suptitle(
        fig,
        run_title("KV cache and queue", run.config)
        + (f"\n{note}; KV usage and batch size drawn from it" if note else ""),
    )
    return fig


def _cached_fraction(run: Run, iterations: pd.DataFrame) -> np.ndarray | None:
    """``num_cached_blocks`` over the pool, for a run with prefix caching (else None)."""
    if "num_cached_blocks" not in iterations.columns:
        return None
    blocks = run.summary.get("num_gpu_blocks")
    cached = iterations["num_cached_blocks"].to_numpy(dtype=float)
    if not isinstance(blocks, (int, float)) or blocks <= 0 or not cached.any():
        return None
    return cached / float(blocks)


# --------------------------------------------------------------------------- counts over time


def waiting_intervals(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(from, until) of each request's wait for its first scheduling, in s: from its arrival
    until ``first_scheduled_time_s``, or until ``finish_time_s`` for a request that left
    unscheduled (cancelled), or no wait when both are empty (rejected on arrival)."""
    arrival = requests["arrival_time_s"].to_numpy(dtype=float)
    until = requests["first_scheduled_time_s"].to_numpy(dtype=float)
    until = np.where(np.isnan(until), requests["finish_time_s"].to_numpy(dtype=float), until)
    until = np.where(np.isnan(until), arrival, until)
    return arrival, until


def admitted_intervals(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(from, until) of each scheduled request's stay in the engine, in s: from its
    ``first_scheduled_time_s`` to its ``finish_time_s``."""
    scheduled = requests["first_scheduled_time_s"].to_numpy(dtype=float)
    finish_s = requests["finish_time_s"].to_numpy(dtype=float)
    ok = ~np.isnan(scheduled)
    until = np.where(np.isnan(finish_s), scheduled, finish_s)
    return scheduled[ok], until[ok]


def step_counts(
    since: np.ndarray, until: np.ndarray, t0: float, t1: float
) -> tuple[np.ndarray, np.ndarray]:
    """How many intervals [since, until) hold each time of [t0, t1], as a step function:
    ``y[i]`` from ``x[i]`` until ``x[i + 1]``; ``x`` starts at t0 and ends at t1."""
    times = np.concatenate((since, until))
    change = np.concatenate((np.ones(since.size), -np.ones(until.size)))
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(change[order])
    last = np.r_[times[1:] != times[:-1], True]  # the level after every change at an instant
    return _window(times[last], level[last], t0, t1, before=0.0)


def _busy_steps(
    start_s: np.ndarray, end_s: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A per-iteration value as a step function of time: the value from each iteration's
    start to its end, 0 in the idle gaps between iterations and after the last."""
    gap = np.r_[start_s[1:] > end_s[:-1] + IDLE_TOLERANCE_S, True]
    n = start_s.size
    x = np.empty(n + int(gap.sum()))
    y = np.empty_like(x)
    pos = np.arange(n) + np.r_[0, np.cumsum(gap)[:-1]]
    x[pos], y[pos] = start_s, values
    idle = pos[gap] + 1
    x[idle], y[idle] = end_s[gap], 0.0
    return x, y


def _replica_rows(iterations: pd.DataFrame) -> list[np.ndarray] | None:
    """The rows of each replica of a cluster run's iterations (in time order each), or None
    for a run of one engine."""
    if "replica" not in iterations:
        return None
    replica = iterations["replica"].to_numpy()
    return [np.flatnonzero(replica == r) for r in np.unique(replica)]


def _sum_steps(series: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The sum of step functions (each ``y[i]`` from ``x[i]``, 0 before ``x[0]``, ``x``
    sorted), as one step function."""
    if not series:
        return np.zeros(1), np.zeros(1)
    x = np.concatenate([s[0] for s in series])
    change = np.concatenate([np.diff(s[1], prepend=0.0) for s in series])
    order = np.argsort(x, kind="stable")
    x, level = x[order], np.cumsum(change[order])
    last = np.r_[x[1:] != x[:-1], True]  # the level after every change at an instant
    return x[last], level[last]


def _window(
    x: np.ndarray, y: np.ndarray, t0: float, t1: float, before: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """The steps (``y[i]`` from ``x[i]``, ``x`` sorted) inside [t0, t1], starting at t0 with
    the value in force there (``before`` ahead of ``x[0]``) and closed at t1."""
    k = int(np.searchsorted(x, t0, side="right")) - 1
    at_t0 = float(y[k]) if k >= 0 else before
    keep = (x > t0) & (x < t1)
    ys = np.r_[at_t0, y[keep]]
    return np.r_[t0, x[keep], t1], np.r_[ys, ys[-1]]


# --------------------------------------------------------------------------- drawing


class _Bins:
    """Draws step series over [t0, t1]: exactly, or per time bin when they have too many
    steps (and remembers whether it did, for the x label)."""

    def __init__(self, t0: float, t1: float) -> None:
        self.edges = np.linspace(t0, t1, NUM_BINS + 1)
        self.used = False

    def note(self) -> str:
        if not self.used:
            return ""
        width = float(self.edges[1] - self.edges[0])
        return f"; long series per {width:.3g} s bin: line = time-weighted mean, band = range"

    def step(
        self, ax: Axes, x: np.ndarray, y: np.ndarray, *, fill: bool = False, **kwargs: Any
    ) -> None:
        """A steps-post line (each value holds until the next x), or the area under it."""
        if x.size <= MAX_EXACT_POINTS:
            if fill:
                ax.fill_between(x, y, step="post", alpha=0.35, linewidth=0, **kwargs)
            else:
                ax.plot(x, y, drawstyle="steps-post", **kwargs)
            return
        self.used = True
        lo, hi, mean = binned(x, y, self.edges)
        edges = self.edges
        color = kwargs.get("color")
        if fill:
            ax.fill_between(
                edges, np.r_[mean, mean[-1]], step="post", alpha=0.35, linewidth=0, **kwargs
            )
            return
        ax.fill_between(
            edges,
            np.r_[lo, lo[-1]],
            np.r_[hi, hi[-1]],
            step="post",
            color=color,
            alpha=0.2,
            linewidth=0,
        )
        ax.plot(edges, np.r_[mean, mean[-1]], drawstyle="steps-post", **kwargs)


def binned(
    x: np.ndarray, y: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(min, max, time-weighted mean) per bin of a step function (``y[i]`` from ``x[i]`` until
    ``x[i + 1]``; ``x`` sorted, from ``edges[0]`` to ``edges[-1]``)."""
    widths = np.diff(x)
    area = np.r_[0.0, np.cumsum(y[:-1] * widths)]  # integral from x[0] to x[i]
    k = np.clip(np.searchsorted(x, edges, side="right") - 1, 0, x.size - 1)
    integral = area[k] + y[k] * (edges - x[k])
    mean = np.diff(integral) / np.diff(edges)
    first = k[:-1]  # the step in force at each bin's start
    last = np.maximum(np.searchsorted(x, edges[1:], side="left") - 1, first)  # ... before its end
    # reduceat over [first[b], first[b + 1]) then the bin's last step, which may be first[b + 1]
    lo = np.minimum(np.minimum.reduceat(y, first), y[last])
    hi = np.maximum(np.maximum.reduceat(y, first), y[last])
    return lo, hi, mean


def _draw_preemptions(
    ax: Axes, count: np.ndarray, start_s: np.ndarray, t0: float, t1: float
) -> None:
    """A marker above the usage curve at each iteration that preempted, in [t0, t1]."""
    hit = (count > 0) & (start_s >= t0) & (start_s <= t1)
    total = int(count[hit].sum())
    x = start_s[hit]
    y = np.full(x.size, 1.06)
    label = f"preemption ({total:,} in {x.size:,} iterations)" if total else "no preemption"
    ax.plot(x, y, linestyle="none", marker="v", markersize=5, color=PREEMPTION_COLOR, label=label)
    counts = count[hit]
    several = np.flatnonzero(counts > 1)
    if 0 < several.size <= MAX_COUNT_LABELS:
        for i in several:
            ax.annotate(
                str(counts[i]),
                (x[i], y[i]),
                xytext=(3, 2),
                textcoords="offset points",
                fontsize="x-small",
                color=PREEMPTION_COLOR,
            )


def _one_run(sources: Sequence[Run | Study]) -> Run:
    if len(sources) != 1:
        names = ", ".join(str(s.path) for s in sources) or "none"
        raise ConfigError(f"kv draws one run per figure, got {len(sources)} folders: {names}")
    source = sources[0]
    if isinstance(source, Study):
        raise ConfigError(
            f"{source.path}: a {source.kind} study; kv draws one run (give the folder of one "
            "of its points, under points/)"
        )
    for table in ("iterations", "requests"):
        if not source.has_table(table):
            raise source.missing_table(table, "kv")
    return source
