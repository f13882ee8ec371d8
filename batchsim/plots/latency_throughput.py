"""``batchsim plot latency-throughput``: TTFT and TPOT against the output throughput achieved,
from a sweep over load.

A sweep over load varies one of :data:`LOAD_KEYS` (the arrival rate or the whole arrival
block, closed-loop users, a trace's time scale, closed-loop think time). Two panels, TTFT and
TPOT, each with the median (p50, solid) and p99 (dashed) against ``output_throughput``: one
line per configuration (a combination of the sweep's other varied keys; keys zipped with the
load move along the line), points joined in order of load — the offered ``request_rate`` when
every point has one, else the load key's value. Past saturation the achieved throughput stops
growing, so a line turns upward (or back) there. The experiment's ``slo:`` targets (``ttft_ms``,
``tpot_ms``) are drawn as labelled horizontal lines; a panel whose values span more than two
decades has a logarithmic y axis. With ``sweep_stats.csv`` (several seeds) the points are the
means and carry 95 % confidence intervals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Series, Study, finite_number, value_text
from batchsim.plots.style import (
    describe_study,
    legend_columns,
    new_figure,
    series_styles,
    suptitle,
    tick_text,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

LOAD_KEYS = (
    "workload.arrival.rate",
    "workload.arrival",
    "workload.concurrency",
    "workload.trace.time_scale",
    "workload.think_time_ms",
)
"""Varied keys that set the load."""
PANELS = (
    ("TTFT", "ttft_ms", "median_ttft_ms", "p99_ttft_ms"),
    ("TPOT", "tpot_ms", "median_tpot_ms", "p99_tpot_ms"),
)
"""(name, ``slo:`` key, p50 column, p99 column) of each panel."""
LOG_SPAN = 100.0
"""A panel whose largest value is more than this times its smallest gets a log y axis."""
HOW = "batchsim sweep EXP --grid workload.arrival.rate=2,4,8,16"
BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5}


def load_keys(varied: list[str]) -> list[str]:
    """The varied keys that set the load."""
    return [key for key in varied if key in LOAD_KEYS]


def applies(source: Run | Study) -> bool:
    """A sweep that varies the load."""
    return isinstance(source, Study) and source.kind == "sweep" and bool(load_keys(source.varied))


def _study(sources: list[Run | Study]) -> Study:
    if len(sources) != 1:
        names = ", ".join(str(s.path) for s in sources)
        raise ConfigError(f"latency-throughput draws one sweep folder, got {len(sources)}: {names}")
    source = sources[0]
    wanted = f"latency-throughput draws a sweep over load ({HOW})"
    if isinstance(source, Run):
        raise ConfigError(f"{source.path}: a run folder, not a sweep; {wanted}")
    if source.kind != "sweep":
        raise ConfigError(f"{source.path}: a {source.kind} study, not a sweep; {wanted}")
    if not load_keys(source.varied):
        varied = ", ".join(source.varied) or "nothing"
        raise ConfigError(
            f"{source.path}: the sweep varies {varied} but no load key "
            f"({', '.join(LOAD_KEYS)}); {wanted}"
        )
    return source


def _column(rows: pd.DataFrame, name: str) -> list[float]:
    return [finite_number(v) for v in rows[name]] if name in rows else [math.nan] * len(rows)


def _errors(rows: pd.DataFrame, name: str) -> list[float] | None:
    if f"{name}_ci95" not in rows:
        return None
    return [0.0 if math.isnan(v) else v for v in _column(rows, f"{name}_ci95")]


def _in_load_order(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows ordered by offered load: ``request_rate`` where every row has one, else the
    first numeric load key, else as the grid ran them."""
    for column in ("request_rate", *keys):
        values = _column(rows, column)
        if values and not any(math.isnan(v) for v in values):
            return rows.assign(_load=values).sort_values("_load", kind="stable")
    return rows


def _load_texts(rows: pd.DataFrame, keys: list[str]) -> list[str]:
    """Each point's load as its label says it: the first load key's value (a block's rate)."""
    import json

    texts = []
    for value in rows[keys[0]] if keys[0] in rows else [""] * len(rows):
        if isinstance(value, str) and value.lstrip().startswith("{"):
            try:
                value = json.loads(value).get("rate", "")
            except (ValueError, AttributeError):
                value = ""
        texts.append(value_text(value) if value == value and value != "" else "")
    return texts


def _label_loads(ax: Axes, labels: list[tuple[float, float, str, str]]) -> None:
    """Write each point's load beside it, leaving out a label that would overlap one already
    written (points closer than about two characters)."""
    ax.get_xlim(), ax.get_ylim()  # settle the view limits before measuring
    box = ax.get_window_extent()
    scale = ax.figure.dpi / 72  # points to pixels
    placed: list[tuple[float, float]] = []
    for x, y, text, color in labels:
        px, py = ax.transData.transform((x, y))
        if any(abs(px - qx) < 14 and abs(py - qy) < 10 for qx, qy in placed):
            continue
        placed.append((px, py))
        # below right of the point; above near the bottom edge, left near the right edge
        up = py - 14 * scale < box.y0
        left = px + 16 * scale > box.x1
        ax.annotate(
            text,
            xy=(x, y),
            xytext=(-4 if left else 4, 4 if up else -4),
            textcoords="offset points",
            ha="right" if left else "left",
            va="bottom" if up else "top",
            fontsize="x-small",
            color=color,
        )


def _load_unit(key: str) -> str:
    if key in ("workload.arrival.rate", "workload.arrival"):
        return "arrival rate (req/s)"
    if key == "workload.concurrency":
        return "users (closed loop)"
    return key.rsplit(".", 1)[-1].replace("_", " ")


def _policy(study: Study, series: Series) -> str:
    return study.point(series.points[0]).policy or "?"


def _slo(config: dict[str, Any]) -> dict[str, float]:
    slo = config.get("slo") or {}
    if not isinstance(slo, dict):
        return {}
    return {k: float(v) for k, v in slo.items() if not math.isnan(finite_number(v))}


def _y_scale(ax: Axes, values: list[float]) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [v for v in values if v > 0 and not math.isnan(v)]
    if positive and max(positive) > LOG_SPAN * min(positive):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(0, max(positive, default=1.0) * 1.08)


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    """p50/p99 TTFT and TPOT vs achieved output throughput (see the module documentation)."""
    from matplotlib.lines import Line2D

    study = _study(sources)
    keys = load_keys(study.varied)
    moving = {k for key in keys for k in study.zipped_with(key)}
    others = [
        key
        for key in study.varied
        if key not in moving and not (key == "seed" and study.stats is not None)
    ]
    for column in ("output_throughput", *(c for p in PANELS for c in p[2:])):
        if column not in study.table:
            raise ConfigError(f"{study.path}: sweep.csv has no {column} column")
    series = [s for s in study.series(others) if len(s.rows)]
    if not series:
        raise ConfigError(
            f"{study.path}: no point of the sweep ran (every row of sweep.csv has an error)"
        )
    policies = [_policy(study, s) for s in series]
    labels = [s.label or p for s, p in zip(series, policies)]
    styles = series_styles(labels, dict(zip(labels, policies)))
    config = study.base_config
    slo = _slo(config)

    fig, axes = new_figure(1, 2, figsize=(9.0, 5.2))
    for ax, (name, slo_key, p50, p99) in zip(axes, PANELS):
        values: list[float] = []
        pending: list[tuple[float, float, str, str]] = []
        for s, label, line_style in zip(series, labels, styles):
            color = line_style.color
            rows = _in_load_order(s.rows, keys)
            x = _column(rows, "output_throughput")
            for column, style, face in ((p50, "-", color), (p99, "--", "white")):
                y = _column(rows, column)
                values += y
                ax.errorbar(
                    x,
                    y,
                    yerr=_errors(rows, column),
                    color=color,
                    linestyle=style,
                    marker=line_style.marker,
                    markersize=4,
                    markerfacecolor=face,
                    linewidth=1.6 if style == "-" else 1.3,
                    capsize=0,
                    elinewidth=0.9,
                    label=f"{label} {'p50' if column == p50 else 'p99'}",
                )[0].set_gid("p50" if column == p50 else "p99")
            for xi, yi, load in zip(x, _column(rows, p50), _load_texts(rows, keys)):
                if load and not (math.isnan(xi) or math.isnan(yi)):
                    pending.append((xi, yi, load, color))
        if slo_key in slo:
            limit = slo[slo_key]
            values.append(limit)
            ax.axhline(limit, color="0.3", linestyle=":", linewidth=1.3, label="_slo", gid="slo")
            ax.annotate(
                f"SLO {name} {limit:,.0f} ms",
                xy=(0.01, limit),
                xycoords=("axes fraction", "data"),
                xytext=(0, 2),
                textcoords="offset points",
                ha="left",
                va="bottom",
                fontsize="small",
                color="0.3",
                bbox=BOX,
            )
        _y_scale(ax, values)
        ax.set_xlim(0, ax.get_xlim()[1] * 1.04)  # the last points off the right edge
        _label_loads(ax, pending)
        ax.set_xlabel("achieved output throughput (tok/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name}: p50 (median) and p99", fontsize="medium")
        ax.grid(True, which="major", alpha=0.3)

    shared = any(st.variant for st in styles)  # a policy's lines differ by marker: show it
    handles: list[Any] = [
        Line2D(
            [],
            [],
            color=st.color,
            marker=st.marker if shared else None,
            markersize=4,
            linewidth=1.6,
            label=lb,
        )
        for lb, st in zip(labels, styles)
    ]
    handles += [
        Line2D([], [], color="0.2", marker="o", markersize=4, label="p50 (median)"),
        Line2D(
            [],
            [],
            color="0.2",
            linestyle="--",
            marker="o",
            markersize=4,
            markerfacecolor="white",
            label="p99",
        ),
    ]
    handles.append(Line2D([], [], linestyle="none", label=f"numbers: {_load_unit(keys[0])}"))
    if any(panel[1] in slo for panel in PANELS):
        handles.append(Line2D([], [], color="0.3", linestyle=":", label="SLO (experiment's slo:)"))
    if study.stats is not None:
        handles.append(Line2D([], [], color="0.2", marker="|", label="bars: 95 % CI over seeds"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=legend_columns([str(h.get_label()) for h in handles], fig.get_figwidth(), 4),
        fontsize="small",
        frameon=False,
    )
    load = ", ".join(keys)
    suptitle(
        fig,
        f"Latency vs achieved throughput as {load} varies\n{describe_study(config, study.varied)}",
    )
    return fig
