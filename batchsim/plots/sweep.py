"""``batchsim plot sweep DIR [--metric M ...]``: summary metrics against a swept key.

The x axis is the sweep's numeric varied key with the most values (the first on ties; log2
when its values are powers of two, log when they span more than two decades); every other
varied key makes one line per combination of its values, in its policy's colour (lines of
one policy differ by marker and line style). One panel per metric (at most four;
default: output throughput and p99 TTFT), sharing the x axis. With several seeds, each point
is the mean over the seeds with its 95 % confidence interval as an error bar
(``sweep_stats.csv``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Study, ok_rows
from batchsim.plots.style import (
    describe_study,
    finish,
    layered_widths,
    new_figure,
    series_styles,
    suptitle,
    tick_text,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

DEFAULT_METRICS = ("output_throughput", "p99_ttft_ms")
MAX_METRICS = 4
MAX_LINES = 12
UNITS = {
    "_ms": "ms",
    "throughput": "",
    "_fraction": "fraction",
    "_usage": "fraction",
}
LABELS = {
    "output_throughput": "output throughput (tok/s)",
    "request_throughput": "request throughput (req/s)",
    "total_token_throughput": "total throughput (tok/s)",
    "request_goodput": "goodput (req/s)",
    "mean_batch_size": "mean batch (requests)",
}


def applies(source: Run | Study) -> bool:
    return isinstance(source, Study) and source.kind == "sweep" and bool(_numeric_keys(source))


def metric_label(name: str) -> str:
    """An axis label with units for a summary metric name."""
    if name in LABELS:
        return LABELS[name]
    if name.endswith("_ms"):
        words = [
            w.upper() if w in ("ttft", "tpot", "itl", "e2el") else w for w in name[:-3].split("_")
        ]
        return f"{' '.join(words)} (ms)"
    if name.endswith(("_fraction", "_usage", "_attainment")):
        return f"{name.replace('_', ' ')} (0–1)"
    return name.replace("_", " ")


def _numeric_keys(study: Study) -> list[str]:
    table = study.table
    keys = []
    for key in study.varied:
        if key == "seed" or key not in table:
            continue
        values = table[key].dropna()
        if len(values) and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            for v in values
        ):
            keys.append(key)
    return keys


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    if len(sources) != 1 or not isinstance(sources[0], Study) or sources[0].kind != "sweep":
        where = sources[0].path if sources else "no folder"
        raise ConfigError(f"{where}: plot sweep draws one sweep folder (batchsim sweep -o DIR)")
    study = sources[0]
    keys = _numeric_keys(study)
    if not keys:
        raise ConfigError(
            f"{study.path}: the sweep varies no numeric key (varied: "
            f"{', '.join(study.varied) or 'nothing'}); plot sweep draws metrics against one"
        )
    x_key = max(keys, key=lambda k: study.table[k].nunique())  # the most values; first on ties
    others = [k for k in study.varied if k not in (x_key, "seed")]
    table = study.stats if study.stats is not None else study.table
    metrics = list(options.metrics) or list(DEFAULT_METRICS)
    if len(metrics) > MAX_METRICS:
        raise ConfigError(f"plot sweep draws at most {MAX_METRICS} metrics, got {len(metrics)}")
    not_metrics = (*study.varied, "seed", "error", "point", "num_seeds")
    unknown = [m for m in metrics if m not in table.columns or m in not_metrics]
    if unknown:
        allowed = [c for c in table.columns if c not in not_metrics and not c.endswith("_ci95")]
        raise ConfigError(
            f"--metric {unknown[0]}: not a column of the sweep table; one of "
            f"{', '.join(allowed[:40])}{' ...' if len(allowed) > 40 else ''}"
        )
    ok = ok_rows(table)
    groups = [(series.label, series.rows) for series in study.series(others)]
    if len(groups) > MAX_LINES:
        raise ConfigError(
            f"{study.path}: {len(groups)} combinations of {', '.join(others)}; plot sweep "
            f"draws at most {MAX_LINES} lines"
        )
    labels = [label for label, _ in groups]
    policy = str((study.base_config.get("scheduler") or {}).get("policy", ""))
    policies = {
        label: str(rows["scheduler.policy"].iloc[0]) if "scheduler.policy" in rows else policy
        for label, rows in groups
    }
    styles = series_styles(labels, policies)
    fig, axes = new_figure(
        len(metrics), 1, sharex=True, squeeze=False, figsize=(8.0, 1.2 + 2.4 * len(metrics))
    )
    for ax, metric in zip(axes[:, 0], metrics):
        layers = layered_widths(len(groups), 1.5)  # a line over an equal one leaves it visible
        for (label, rows), style, width in zip(groups, styles, layers):
            rows = rows.sort_values(x_key)
            x = rows[x_key].to_numpy(dtype=float)
            y = rows[metric].to_numpy(dtype=float)
            ci = f"{metric}_ci95"
            if ci in rows:
                ax.errorbar(
                    x, y, yerr=rows[ci].to_numpy(dtype=float), color=style.color,
                    marker=style.marker, linestyle=style.dashes, markersize=4 * width / 1.5,
                    linewidth=width, capsize=3, label=label or None,
                )  # fmt: skip
            else:
                ax.plot(
                    x, y, color=style.color, marker=style.marker, linestyle=style.dashes,
                    markersize=4 * width / 1.5, linewidth=width, label=label or None,
                )  # fmt: skip
        ax.set_ylabel(metric_label(metric))
        _scale_y(ax, ok[metric].to_numpy(dtype=float))
        finish(ax, legend=ax is axes[0, 0] and any(labels))
    bottom = axes[-1, 0]
    _scale_x(bottom, ok[x_key].to_numpy(dtype=float))
    bottom.set_xlabel(_key_label(x_key))
    suptitle(
        fig, f"{describe_study(study.base_config, study.varied)}\nswept: {', '.join(study.varied)}"
    )
    return fig


def _key_label(key: str) -> str:
    name = key.rsplit(".", 1)[-1]
    if name.endswith("_ms"):
        return f"{key} (ms)"
    if name.endswith("_s"):
        return f"{key} (s)"
    if name == "rate":
        return f"{key} (req/s)"
    return key


LOG_SPREAD = 2.0
"""A log x axis when it spreads the values' closest pair at least this much wider (as a
fraction of the axis) than a linear one: values such as 25, 50, ..., 400 crowd the first
quarter of a linear axis and sit evenly on a log one."""


def _positions(values: np.ndarray, log: bool) -> np.ndarray:
    """Where sorted distinct values >= 0 sit on a linear or log axis; on a log one, a 0 sits
    one step below the smallest positive value (a step: its ratio to the next one)."""
    if not log:
        return values
    positive = values[values > 0]
    logs = np.log(positive)
    if len(positive) == len(values):
        return logs
    step = logs[1] - logs[0] if len(logs) > 1 else 1.0
    return np.concatenate([[logs[0] - step], logs])


def _closest(positions: np.ndarray) -> float:
    """The closest pair of ``positions`` (sorted) as a fraction of their span."""
    span = positions[-1] - positions[0]
    return float(np.diff(positions).min() / span) if span > 0 else 0.0


def x_scale(values: np.ndarray) -> str:
    """``linear``, ``log`` (values > 0) or ``symlog`` (values >= 0 with a 0) for a swept key:
    the scale that spreads its values' closest pair wider, by at least :data:`LOG_SPREAD`
    for a log one."""
    distinct = np.unique(values[np.isfinite(values)])
    if len(distinct) < 3 or distinct[0] < 0 or (distinct > 0).sum() < 2:
        return "linear"
    linear = _closest(_positions(distinct, log=False))
    log = _closest(_positions(distinct, log=True))
    if log < LOG_SPREAD * linear:
        return "linear"
    return "log" if distinct[0] > 0 else "symlog"


def _scale_x(ax: Any, values: np.ndarray) -> None:
    """The scale of :func:`x_scale`, log2 for powers of two, ticks at the values swept (up to
    12 of them) as plain numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    distinct = np.unique(values[np.isfinite(values)])
    scale = x_scale(values)
    if scale == "linear":
        return
    positive = distinct[distinct > 0]
    exponents = np.log2(positive)
    base = 2 if np.allclose(exponents, np.round(exponents)) else 10
    if scale == "log":
        ax.set_xscale("log", base=base)
    else:  # 0 one step below the smallest positive value, linear up to it
        ratio = positive[1] / positive[0]
        # matplotlib stretches the linear part by 1 / (1 - 1 / base): undone, 0 is one step
        linscale = math.log(ratio, base) * (1 - 1 / base)
        ax.set_xscale("symlog", linthresh=positive[0], base=base, linscale=linscale)
    # 5 % of the axis beyond the end values, measured on the axis as drawn
    transform = ax.xaxis.get_transform()
    low, high = transform.transform([distinct[0], distinct[-1]])
    pad = 0.05 * (high - low)
    ax.set_xlim(*transform.inverted().transform([low - pad, high + pad]))
    if len(distinct) <= 12:
        ax.xaxis.set_major_locator(FixedLocator([float(v) for v in distinct]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v) if v else "0"))


def _scale_y(ax: Any, values: np.ndarray) -> None:
    values = values[np.isfinite(values)]
    positive = values[values > 0]
    if len(positive) == len(values) and len(values) and positive.max() / positive.min() > 100:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
    elif len(values) and values.min() >= 0 and not math.isclose(values.max(), 0):
        ax.set_ylim(0, values.max() * 1.08)  # a flat line stays off the top edge
    if ax.get_yscale() == "linear" and len(values) and np.abs(values).max() >= 1_000:
        from matplotlib.ticker import FuncFormatter

        # plain numbers with separators (matplotlib would write "1e6" above the axis)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
