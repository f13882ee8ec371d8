"""``batchsim plot cdf``: the distributions of TTFT, TPOT, ITL and E2E latency of one or more
runs, as empirical CDFs (one line per run, in four panels).

The sample of each run is its finished requests (``requests.csv`` ``status == finished``)
among those the summary counts (the ``metrics.warmup_s``/``cooldown_s`` window of the run's
config; all requests by default), so a curve's mean is the summary's mean. TPOT counts the
requests with more than one output token (vLLM leaves it undefined for the others).

ITL is every gap between consecutive tokens of a request, which ``requests.csv`` does not
carry. A run recorded with ``metrics.record_slots: true`` has ``slots.csv``: which request sat
in which batch slot, in which state, over which iterations. A request samples one token at the
end of every iteration of its ``prefill`` segments (the iteration that completes its prompt
or its recomputation) and of its ``decode`` segments; ``chunked_prefill``, ``stalled``,
``padding`` and ``empty`` segments sample nothing. An iteration ends at
``start_time_s + duration_ms / 1e3`` (``iterations.csv``), so each request's token times,
and the gaps between them, are rebuilt exactly (:func:`token_times`, :func:`inter_token_gaps`).
Without ``slots.csv`` the ITL panel shows the summary's ITL statistics (p50, p90 and p99 at
their levels, the mean as a cross) and says how to get the whole distribution.

Several run folders, or a sweep folder (all of its points that ran and wrote their CSV files),
draw one line each, at most :data:`MAX_LINES` of them: beyond that, evenly spaced runs are
drawn and the legend says how many. Runs that differ by policy take the policy's colour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from batchsim.errors import ConfigError
from batchsim.metrics.slots import SLOT_COLUMNS, SLOT_STATES
from batchsim.plots.data import TABLE_FORMATS, Run, Study
from batchsim.plots.style import (
    SeriesStyle,
    catalog_name,
    describe_load,
    finish,
    legend_columns,
    new_figure,
    series_styles,
    suptitle,
    text_width,
    tick_text,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

MAX_LINES = 8
"""Most runs drawn in one figure (the Okabe-Ito palette has eight colours)."""

MAX_POINTS = 10_000
"""Most points of one CDF line; a larger sample is drawn at this many evenly spaced ranks
(each point is still one of the sorted values)."""

SAMPLING_STATES = ("prefill", "decode")
"""Segment states whose every iteration samples one token of the segment's request."""

PANELS = (
    ("ttft_ms", "TTFT (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("itl_ms", "ITL (ms)"),
    ("e2el_ms", "E2E latency (ms)"),
)
"""(metric, x-axis label) of each panel, left to right and top to bottom."""

_ITL_MARKERS = (("median", 0.5), ("p90", 0.9), ("p99", 0.99))


def applies(source: Run | Study) -> bool:
    """A run with ``requests.csv`` and finished requests, or a sweep with at least one point
    that wrote ``requests.csv``."""
    if isinstance(source, Run):
        completed = source.summary.get("completed")
        return source.has_table("requests") and bool(completed)
    if source.kind != "sweep":
        return False
    try:
        points = source.table.get("point")
    except ConfigError:
        return False
    if points is None:
        return False
    return any(
        (source.path / "points" / str(p) / f"requests.{fmt}").is_file()
        for p in points
        if p == p
        for fmt in TABLE_FORMATS
    )


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    """Four panels of empirical CDFs (TTFT, TPOT, ITL, E2E), one line per run.

    Raises:
        ConfigError: A folder without ``requests.csv`` (e.g. written with --summary-only), a
            capacity study, a sweep none of whose points wrote CSV files, or a malformed
            ``slots.csv``; one line naming the folder.
    """
    runs = _runs(sources)
    total = len(runs)
    if total > MAX_LINES:
        keep = np.unique(np.linspace(0, total - 1, MAX_LINES).round().astype(int))
        runs = [runs[i] for i in keep]
    labels = _labels(runs)
    styles = series_styles(labels, {label: run.policy for label, run in zip(labels, runs)})

    fig, axes = new_figure(2, 2, figsize=(9.0, 6.6))
    panels: dict[str, Axes] = {metric: ax for (metric, _), ax in zip(PANELS, axes.flat)}
    samples: dict[str, list[np.ndarray]] = {metric: [] for metric, _ in PANELS}
    handles, legend_labels = [], []
    missing_slots = []
    for run, label, style in zip(runs, labels, styles):
        done = _finished(run)
        values = {
            "ttft_ms": done["ttft_ms"].to_numpy(dtype=float),
            "tpot_ms": done.loc[done["output_tokens"] > 1, "tpot_ms"].to_numpy(dtype=float),
            "e2el_ms": done["e2el_ms"].to_numpy(dtype=float),
        }
        if run.has_table("slots") and run.iterations_sample is None:
            ids, times = token_times(run.slots, run.iterations, run.table_path("slots"))
            _check_token_counts(run, ids, done)
            values["itl_ms"] = inter_token_gaps(ids, times, done["request_id"].to_numpy()) * 1e3
        else:  # no slots, or iterations too few to time their tokens
            missing_slots.append(run)
        line = None
        for metric, sample in values.items():
            sample = sample[np.isfinite(sample)]
            samples[metric].append(sample)
            drawn = _draw_cdf(panels[metric], sample, style)
            line = line or drawn
        if "itl_ms" not in values:
            samples["itl_ms"].append(_draw_itl_summary(panels["itl_ms"], run.summary, style))
        if line is None:  # no finished request: a legend entry all the same
            (line,) = panels["ttft_ms"].plot([], [], color=style.color, linestyle=style.dashes)
        handles.append(line)
        legend_labels.append(f"{label} ({len(done):,} finished)")

    if not any(len(s) for metric in ("ttft_ms", "e2el_ms") for s in samples[metric]):
        names = ", ".join(str(run.path) for run in runs)
        raise ConfigError(f"{names}: no finished request to draw")

    for (metric, xlabel), ax in zip(PANELS, axes.flat):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of token gaps" if metric == "itl_ms" else "fraction of requests")
        ax.set_ylim(0.0, 1.02)
        _set_x_scale(ax, samples[metric], fig.get_figwidth())
        finish(ax, legend=False)
    if missing_slots:
        _note_itl_summary(
            panels["itl_ms"],
            all_missing=len(missing_slots) == len(runs),
            sampled=any(run.iterations_sample is not None for run in missing_slots),
        )

    shown = f"{len(runs)} of {total} runs shown, evenly spaced" if total > len(runs) else None
    fig.legend(
        handles,
        legend_labels,
        loc="outside lower center",
        ncols=legend_columns(legend_labels, fig.get_figwidth()),
        fontsize="small",
        title=shown,
        title_fontsize="small",
        frameon=False,
    )
    suptitle(fig, f"Latency distributions: {_describe(runs)}")
    return fig


# --------------------------------------------------------------------------- ITL from slots.csv


def token_times(
    slots: pd.DataFrame, iterations: pd.DataFrame, where: str | Path = "slots.csv"
) -> tuple[np.ndarray, np.ndarray]:
    """Every sampled token: (request ids, end times in s), sorted by request, then time.

    A token is sampled at the end of every iteration of a request's ``prefill`` and
    ``decode`` segments; the iteration ends at ``start_time_s + duration_ms / 1e3``.

    Raises:
        ConfigError: ``slots.csv`` lacks a column, has an unknown state, a segment that ends
            before it starts or names an iteration ``iterations.csv`` does not have, or
            samples a request twice in one iteration.
    """
    name = Path(where) if Path(where).suffix in (".csv", ".parquet") else Path(where) / "slots.csv"
    absent = [c for c in SLOT_COLUMNS if c not in slots.columns]
    if absent:
        raise ConfigError(f"{name}: no column {absent[0]!r} (expected {', '.join(SLOT_COLUMNS)})")
    states = slots["state"].astype(str)
    unknown = sorted(set(states) - set(SLOT_STATES))
    if unknown:
        allowed = ", ".join(sorted(SLOT_STATES))
        raise ConfigError(f"{name}: unknown state {unknown[0]!r}; expected one of {allowed}")
    sampling = slots[states.isin(SAMPLING_STATES).to_numpy()]
    ids = _integers(sampling["request_id"], name, "request_id")
    first = _integers(sampling["first_iteration"], name, "first_iteration")
    last = _integers(sampling["last_iteration"], name, "last_iteration")
    bad = np.flatnonzero(last < first)
    if bad.size:
        raise ConfigError(
            f"{name}: a segment of request {ids[bad[0]]} ends (iteration {last[bad[0]]}) before "
            f"it starts (iteration {first[bad[0]]})"
        )

    count = last - first + 1
    offsets = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(count) - count, count
    )
    token_ids = np.repeat(ids, count)
    token_iterations = np.repeat(first, count) + offsets
    order = np.lexsort((token_iterations, token_ids))
    token_ids, token_iterations = token_ids[order], token_iterations[order]
    twice = np.flatnonzero(
        (token_ids[1:] == token_ids[:-1]) & (token_iterations[1:] == token_iterations[:-1])
    )
    if twice.size:
        i = twice[0]
        raise ConfigError(
            f"{name}: request {token_ids[i]} samples twice in iteration {token_iterations[i]} "
            "(two prefill/decode segments cover it)"
        )
    return token_ids, iteration_end_times(iterations, token_iterations, name)


def iteration_end_times(
    iterations: pd.DataFrame, numbers: np.ndarray, where: str | Path = "slots.csv"
) -> np.ndarray:
    """End times (s) of the iterations numbered ``numbers`` (``iterations.csv``'s
    ``iteration``): ``start_time_s + duration_ms / 1e3``.

    Raises:
        ConfigError: A number that ``iterations.csv`` does not have (named after ``where``).
    """
    index = iterations["iteration"].to_numpy(dtype=np.int64)
    ends = iterations["start_time_s"].to_numpy(dtype=float) + (
        iterations["duration_ms"].to_numpy(dtype=float) / 1e3
    )
    if index.size and np.array_equal(index, np.arange(index.size)):
        pos = numbers
        unknown = (numbers < 0) | (numbers >= index.size)
    else:
        order = np.argsort(index, kind="stable")
        index, ends = index[order], ends[order]
        pos = np.clip(np.searchsorted(index, numbers), 0, max(index.size - 1, 0))
        unknown = index[pos] != numbers if index.size else np.ones(len(numbers), dtype=bool)
    if np.any(unknown):
        missing = numbers[np.flatnonzero(unknown)[0]]
        raise ConfigError(f"{where}: iteration {missing} is not in iterations.csv")
    return ends[pos]


def inter_token_gaps(
    request_ids: np.ndarray, times: np.ndarray, keep: np.ndarray | None = None
) -> np.ndarray:
    """The gaps (s) between consecutive tokens of each request, pooled over the requests
    whose id is in ``keep`` (all by default); ``request_ids`` and ``times`` as
    :func:`token_times` returns them (sorted by request, then time)."""
    ids = np.asarray(request_ids)
    gaps = np.diff(np.asarray(times, dtype=float))
    same = ids[1:] == ids[:-1]
    if keep is not None:
        same &= np.isin(ids[1:], keep)
    return gaps[same]  # type: ignore[no-any-return]


def _check_token_counts(run: Run, ids: np.ndarray, done: pd.DataFrame) -> None:
    """Each finished request sampled as many tokens in slots.csv as requests.csv says."""
    import pandas as pd

    unique, counts = np.unique(ids, return_counts=True)
    wanted = done["request_id"].to_numpy(dtype=np.int64)
    found = pd.Series(counts, index=unique).reindex(wanted, fill_value=0).to_numpy()
    expected = done["output_tokens"].to_numpy(dtype=np.int64)
    bad = np.flatnonzero(found != expected)
    if bad.size:
        i = bad[0]
        raise ConfigError(
            f"{run.table_path('slots')}: request {wanted[i]} samples {found[i]} tokens in its "
            f"prefill/decode segments, requests.csv says output_tokens {expected[i]}"
        )


def _integers(column: pd.Series, name: Path, key: str) -> np.ndarray:
    """A column of whole numbers (read as floats when other rows leave it empty)."""
    values = column.to_numpy()
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    try:
        numbers = values.astype(float)
    except (TypeError, ValueError):
        numbers = np.array([np.nan])
    if not np.all(np.isfinite(numbers) & (numbers == np.round(numbers))):
        raise ConfigError(
            f"{name}: column {key!r} must hold whole numbers in prefill and decode segments"
        )
    return numbers.astype(np.int64)


# --------------------------------------------------------------------------- runs and samples


def _runs(sources: Sequence[Run | Study]) -> list[Run]:
    if not sources:
        raise ConfigError("cdf: no folder to draw")
    runs: list[Run] = []
    for source in sources:
        if isinstance(source, Run):
            _require_requests(source)
            runs.append(source)
            continue
        if source.kind != "sweep":
            raise ConfigError(
                f"{source.path}: a {source.kind} study; cdf draws runs or sweeps (give the "
                "folders of the points to compare)"
            )
        points = [run for run in source.runs() if run.has_table("requests")]
        if not points:
            raise ConfigError(
                f"{source.path}: no point of this sweep has requests.csv (a sweep run with "
                "--summary-only writes none)"
            )
        runs.extend(points)
    return runs


def _require_requests(run: Run) -> None:
    if not run.has_table("requests"):
        raise run.missing_table("requests", "cdf")


def _labels(runs: list[Run]) -> list[str]:
    """Legend names: the run's label, prefixed by its parent folder where two collide."""
    labels = [run.label or run.path.name for run in runs]
    if len(set(labels)) < len(labels):
        labels = [
            f"{(run.path.parent.parent if run.values else run.path.parent).name}/{label}"
            for run, label in zip(runs, labels)
        ]
    return labels


def _finished(run: Run) -> pd.DataFrame:
    """The finished requests among those the summary counts (warmup/cooldown window)."""
    requests = run.requests
    metrics = run.config.get("metrics") or {}
    warmup = float(metrics.get("warmup_s") or 0.0)
    cooldown = float(metrics.get("cooldown_s") or 0.0)
    counted = np.ones(len(requests), dtype=bool)
    arrivals = requests["arrival_time_s"].to_numpy(dtype=float)
    if (warmup > 0 or cooldown > 0) and arrivals.size:
        lo, hi = arrivals.min() + warmup, arrivals.max() - cooldown
        counted = (arrivals >= lo) & (arrivals <= hi)
    finished = (requests["status"] == "finished").to_numpy()
    return requests[counted & finished]


# --------------------------------------------------------------------------- drawing


def _draw_cdf(ax: Axes, sample: np.ndarray, style: SeriesStyle) -> Any:
    """The empirical CDF of ``sample`` as a step line: x the sorted values, y = rank / n."""
    if not sample.size:
        return None
    x = np.sort(sample)
    y = np.arange(1, x.size + 1) / x.size
    if x.size > MAX_POINTS:
        keep = np.unique(np.linspace(0, x.size - 1, MAX_POINTS).round().astype(np.int64))
        x, y = x[keep], y[keep]
    (line,) = ax.plot(
        x, y, drawstyle="steps-post", color=style.color, linestyle=style.dashes, linewidth=1.5
    )
    return line


def _draw_itl_summary(ax: Axes, summary: dict[str, Any], style: SeriesStyle) -> np.ndarray:
    """The summary's ITL statistics of a run without slots.csv: p50, p90 and p99 at their
    levels (joined by a dotted line), the mean as a cross at level 0.5."""
    xs, ys = [], []
    for stat, level in _ITL_MARKERS:
        value = _number(summary.get(f"{stat}_itl_ms"))
        if value is not None:
            xs.append(value)
            ys.append(level)
    if xs:
        ax.plot(
            xs, ys, linestyle=":", marker=style.marker, color=style.color, markersize=5, linewidth=1
        )
    mean = _number(summary.get("mean_itl_ms"))
    if mean is not None:
        ax.plot([mean], [0.5], linestyle="none", marker="x", color=style.color, markersize=7)
        xs.append(mean)
    return np.array(xs, dtype=float)


def _note_itl_summary(ax: Axes, *, all_missing: bool, sampled: bool = False) -> None:
    """Say what the markers are and how to get the whole distribution (above the panel,
    where it covers no data)."""
    if sampled:  # some runs recorded slots but wrote a sample of their iterations
        who = "" if all_missing else "runs without slots or every iteration: "
        fix = "metrics.record_slots=true and output.iterations=all"
    else:
        who = "" if all_missing else "runs without slots.csv: "
        fix = "metrics.record_slots=true"
    ax.set_title(
        f"{who}● p50, p90, p99 and × mean of summary.json;\n"
        f"full ITL distribution: rerun with --set {fix}",
        fontsize="small",
        color="0.3",
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if np.isfinite(value) and value > 0 else None


def _set_x_scale(ax: Axes, samples: list[np.ndarray], fig_width: float) -> None:
    """Log x when the panel's values are positive and span at least a decade, labelled in
    plain numbers at the densest of :func:`log_ticks`' steps whose labels do not overlap."""
    values = np.concatenate([s for s in samples if s.size] or [np.empty(0)])
    if not values.size:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="0.4")
        return
    lo, hi = float(values.min()), float(values.max())
    if lo > 0 and hi / lo >= 10:
        ax.set_xscale("log")
        width = ax.get_position().width * fig_width
        size = FontProperties(size=matplotlib.rcParams["xtick.labelsize"]).get_size_in_points()
        ax.xaxis.set_major_locator(FixedLocator(log_ticks(lo, hi, width, size)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: tick_text(value)))
        ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
        ax.xaxis.set_minor_formatter(NullFormatter())


LOG_STEPS = (((1, 2, 5), 1), ((1, 3), 1), ((1,), 1), ((1,), 2), ((1,), 3), ((1,), 5))
"""Tick steps of a log axis, densest first: (multiples of each labelled decade, every how
many decades)."""
LABEL_GAP = 0.12
"""Inches of white between two tick labels."""


def log_ticks(lo: float, hi: float, width_in: float, font_pt: float) -> list[float]:
    """Ticks from ``lo`` to ``hi`` (> lo > 0) on a log axis ``width_in`` inches long: the
    densest of :data:`LOG_STEPS` whose plain-number labels (``font_pt`` points) leave
    :data:`LABEL_GAP` between neighbours, else the sparsest."""
    span = math.log10(hi / lo)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks: list[float] = []
    sparsest: list[float] = []
    for subs, every in LOG_STEPS:
        ticks = [
            m * 10.0**e
            for e in range(first, last + 1)
            if e % every == 0
            for m in subs
            if lo * (1 - 1e-9) <= m * 10.0**e <= hi * (1 + 1e-9)
        ]
        half = [text_width(tick_text(t), font_pt) / 2 for t in ticks]
        fits = all(
            width_in * math.log10(b / a) / span >= ha + hb + LABEL_GAP
            for a, b, ha, hb in zip(ticks, ticks[1:], half, half[1:])
        )
        if fits and len(ticks) >= 2:
            return ticks
        sparsest = ticks or sparsest
    return sparsest


def _describe(runs: list[Run]) -> str:
    """What the runs share: model on GPU (or each of them), and policy and load when common
    to all."""
    parts = []
    for describe in (_where, _policy, describe_load):
        values = {describe(run.config) for run in runs}
        if len(values) == 1:
            parts.append(values.pop())
        elif describe is _where:
            models = {catalog_name(run.config.get("model", "?")) for run in runs}
            if len(models) == 1:  # one model on several GPUs: name it once
                gpus = sorted({v.split(" on ", 1)[1] for v in values})
                parts.append(f"{models.pop()} on {' / '.join(gpus)}")
            else:
                parts.append(" / ".join(sorted(values)))
    return ", ".join(p for p in parts if p)


def _where(config: dict[str, Any]) -> str:
    model = catalog_name(config.get("model", "?"))
    hardware = catalog_name(config.get("hardware", "?"))
    tp = (config.get("parallel") or {}).get("tensor_parallel_size", 1)
    return f"{model} on {hardware}" + (f" x{tp}" if tp and tp > 1 else "")


def _policy(config: dict[str, Any]) -> str:
    return str((config.get("scheduler") or {}).get("policy", ""))
