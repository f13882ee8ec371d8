"""``batchsim plot knee``: output throughput and a latency metric against the batch cap of a
sweep over ``scheduler.max_num_seqs``, with the knee of every curve and the roofline's knee.

*Top panel.* Output throughput (tok/s, left axis, solid) and a latency metric (right axis,
dashed, the same colour; ``p99_itl_ms`` unless ``--metric`` names another summary latency
metric) against the cap on a log2 axis: one line per combination of the sweep's other varied
keys (policy, GPU, model, ...), coloured by policy through :mod:`batchsim.plots.style` (lines
of one policy differ by marker). When
throughput spans more than three doublings its axis is logarithmic too: a curve that doubles
with the cap is then a straight line and the knee is where it bends (a flat curve keeps a
linear axis from 0, so that it looks flat). With ``sweep_stats.csv`` (several seeds) every
point carries its 95 % confidence interval.

*The knee of a curve* (:func:`knee_cap`, ringed on the line and named in the legend): the
smallest cap B after which doubling the cap raises output throughput by less than 10 %.
Between caps that are not one doubling apart the gain is taken per doubling,
``(T2 / T1) ** (1 / log2(B2 / B1)) - 1``, so grids with gaps or other spacings follow the
same rule. No knee when every step gains at least 10 %.

*The roofline knee* (a dash-dotted vertical line): the smallest decode batch whose iteration
is compute-bound, from the same cost model as ``batchsim roofline``
(:meth:`~batchsim.cost.RooflineCostModel.knee_batch_size`) for the line's model, GPU, tensor
parallelism and dtypes, at the workload's mean decode context: the mean prompt plus half the
mean output of the finished requests in the point's ``requests.csv``, or, for a sweep written
with ``--summary-only``, the same from the means of the workload's length distributions. The
legend says which, and gives the ridge point (FLOP/byte).

*Bottom panel: the mean batch reached* (``mean_batch_size``) against the cap, thin lines
beside the dotted diagonal batch = cap. It gets its own panel, on the shared cap axis, rather
than a third scale on the top axes (which already carry two y axes) or throughput drawn
against it (a second meaning of x there would make every line ambiguous). Where a line leaves
the diagonal the batch no longer follows the cap — the KV cache is full, too few requests are
in flight, static batches drain — and throughput flattens for that reason, not the roofline's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Series, Study
from batchsim.plots.style import (
    catalog_name,
    describe_study,
    layered_widths,
    metric_label,
    new_figure,
    series_styles,
    suptitle,
    tick_text,
)
from batchsim.roofline import MAX_KNEE_BATCH

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

CAP_KEY = "scheduler.max_num_seqs"
DEFAULT_METRIC = "p99_itl_ms"
MIN_GAIN = 0.10
"""The knee rule's threshold: a doubling of the cap that adds less is past the knee."""
LOG_SPAN = 8.0
"""Throughput spanning more than this factor (three doublings) gets a log axis."""
RULE = f"knee: smallest cap B whose doubling\nadds < {100 * MIN_GAIN:g} % throughput"
BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5}
HOW = "batchsim sweep EXP --grid scheduler.max_num_seqs=pow2:1..512"
ROOF_GREYS = ("0.15", "0.45", "0.65")
"""Colours of the roofline knees when the lines have several (one per model and GPU)."""


def latency_metrics() -> tuple[str, ...]:
    """The summary latency metrics the right axis may show (those a capacity SLO may bound)."""
    from batchsim.studies.slo import SUMMARY_SLOS

    return SUMMARY_SLOS


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def knee_cap(
    caps: Iterable[Any], throughputs: Iterable[Any], min_gain: float = MIN_GAIN
) -> float | int | None:
    """The smallest cap B after which doubling the cap raises throughput by less than
    ``min_gain`` (a fraction), or None when the curve never flattens.

    Caps may come in any order and with gaps; a cap or throughput that is missing (None, NaN)
    drops its point, and repeated caps are averaged. Between consecutive caps B1 < B2 the gain
    is taken per doubling, ``(T2 / T1) ** (1 / log2(B2 / B1)) - 1``. A whole cap is returned
    as an int.
    """
    found: dict[float, list[float]] = {}
    for cap, throughput in zip(caps, throughputs):
        b, t = _number(cap), _number(throughput)
        if b is not None and t is not None and b > 0:
            found.setdefault(b, []).append(t)
    curve = sorted((b, sum(ts) / len(ts)) for b, ts in found.items())
    for (b1, t1), (b2, t2) in itertools.pairwise(curve):
        if t1 <= 0:
            continue
        gain = (max(t2, 0.0) / t1) ** (1 / math.log2(b2 / b1)) - 1
        if gain < min_gain:
            return int(b1) if b1.is_integer() else b1
    return None


@dataclass(frozen=True)
class RooflineKnee:
    """The roofline's knee for one configuration."""

    batch: int | None
    """Smallest compute-bound decode batch (None: memory-bound up to the search limit)."""
    ridge: float
    """Ridge point, FLOP/byte."""
    context: int
    """Mean decode context, tokens."""
    source: str
    """Where the context came from: ``requests.csv`` or ``workload lengths``."""


def decode_context(run: Run) -> tuple[int, str] | None:
    """Mean prompt + half the mean output, tokens, and where it came from: the finished
    requests of ``requests.csv``, or the workload's length distributions (None when neither
    is available: a trace replayed without its CSVs)."""
    if run.has_table("requests"):
        requests = run.requests
        if "status" in requests:
            finished = requests[requests["status"].astype(str) == "finished"]
            requests = finished if len(finished) else requests
        if len(requests) and {"prompt_tokens", "output_tokens"} <= set(requests.columns):
            mean = requests["prompt_tokens"].mean() + requests["output_tokens"].mean() / 2
            if math.isfinite(mean):
                return round(mean), "requests.csv"
    workload = run.config.get("workload") or {}
    if not isinstance(workload, dict):
        return None
    try:
        from pydantic import TypeAdapter

        from batchsim.workload.distributions import LengthDist

        adapter: TypeAdapter[Any] = TypeAdapter(LengthDist)
        prompt = adapter.validate_python(workload.get("prompt_tokens")).analytic_mean(run.path)
        output = adapter.validate_python(workload.get("output_tokens")).analytic_mean(run.path)
    except (ConfigError, ValueError, TypeError, OSError):  # a trace: no lengths to read
        return None
    return round(prompt + output / 2), "workload lengths"


def roofline_knee(run: Run) -> RooflineKnee | None:
    """The roofline knee for ``run``'s model, GPU, tensor parallelism and dtypes at its mean
    decode context (None when the context or a catalog entry cannot be found)."""
    from batchsim.catalog.hardware_files import load_hardware
    from batchsim.catalog.model_files import load_model
    from batchsim.cost import RooflineCostModel

    context = decode_context(run)
    if context is None:
        return None
    config = run.config
    engine = config.get("engine") or {}
    tp = (config.get("parallel") or {}).get("tensor_parallel_size", 1)
    try:
        cost_model = RooflineCostModel(
            load_model(str(config.get("model"))),
            load_hardware(str(config.get("hardware"))),
            tp=int(tp or 1),
            dtype=str(engine.get("dtype") or "bf16"),
            kv_dtype=str(engine.get("kv_cache_dtype") or "auto"),
        )
    except ConfigError:
        return None
    batch = cost_model.knee_batch_size(context[0], MAX_KNEE_BATCH)
    return RooflineKnee(batch, cost_model.ridge_point, context[0], context[1])


def applies(source: Run | Study) -> bool:
    """A sweep that varies ``scheduler.max_num_seqs``."""
    return isinstance(source, Study) and source.kind == "sweep" and CAP_KEY in source.varied


def _study(sources: list[Run | Study]) -> Study:
    if len(sources) != 1:
        names = ", ".join(str(s.path) for s in sources)
        raise ConfigError(f"knee draws one sweep folder, got {len(sources)}: {names}")
    source = sources[0]
    if isinstance(source, Run):
        raise ConfigError(
            f"{source.path}: a run folder, not a sweep; knee draws a sweep over {CAP_KEY} ({HOW})"
        )
    if source.kind != "sweep":
        raise ConfigError(
            f"{source.path}: a {source.kind} study, not a sweep; knee draws a sweep over "
            f"{CAP_KEY} ({HOW})"
        )
    if CAP_KEY not in source.varied:
        varied = ", ".join(source.varied) or "nothing"
        raise ConfigError(
            f"{source.path}: the sweep varies {varied}, not {CAP_KEY}; knee draws a sweep "
            f"over it ({HOW})"
        )
    return source


def _metric(options: PlotOptions) -> str:
    allowed = latency_metrics()
    if len(options.metrics) > 1:
        raise ConfigError(
            f"knee draws one latency metric, got {len(options.metrics)} "
            f"({', '.join(options.metrics)}); allowed: {', '.join(allowed)}"
        )
    metric = options.metrics[0] if options.metrics else DEFAULT_METRIC
    if metric not in allowed:
        raise ConfigError(
            f"--metric {metric!r}: knee draws a summary latency metric; allowed: "
            f"{', '.join(allowed)}"
        )
    return metric


def _column(rows: pd.DataFrame, name: str) -> list[float]:
    if name not in rows:
        return [math.nan] * len(rows)
    return [v if (v := _number(x)) is not None else math.nan for x in rows[name]]


def _errors(rows: pd.DataFrame, name: str) -> list[float] | None:
    if f"{name}_ci95" not in rows:
        return None
    return [0.0 if math.isnan(v) else v for v in _column(rows, f"{name}_ci95")]


@dataclass
class _Line:
    series: Series
    caps: list[float]
    throughput: list[float]
    latency: list[float]
    batch: list[float]
    rows: pd.DataFrame
    run: Run
    knee: float | int | None = None
    roofline: RooflineKnee | None = None


def _lines(study: Study, metric: str) -> list[_Line]:
    table = study.table
    for column in (CAP_KEY, "output_throughput", metric):
        if column not in table:
            raise ConfigError(f"{study.path}: sweep.csv has no {column} column")
    zipped = set(study.zipped_with(CAP_KEY))
    others = [
        key
        for key in study.varied
        if key not in zipped and not (key == "seed" and study.stats is not None)
    ]
    lines = []
    for series in study.series(others):
        rows = series.rows.copy()
        rows["_cap"] = _column(rows, CAP_KEY)
        rows = rows[[not math.isnan(c) for c in rows["_cap"]]].sort_values("_cap", kind="stable")
        if not len(rows):
            continue
        run = study.point(series.points[0])
        line = _Line(
            series,
            list(rows["_cap"]),
            _column(rows, "output_throughput"),
            _column(rows, metric),
            _column(rows, "mean_batch_size"),
            rows,
            run,
        )
        line.knee = knee_cap(line.caps, line.throughput)
        line.roofline = roofline_knee(run)
        lines.append(line)
    if not lines:
        raise ConfigError(
            f"{study.path}: no point of the sweep ran (every row of sweep.csv has an error)"
        )
    return lines


def _cap_axis(ax: Axes, caps: list[float]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    ax.set_xscale("log", base=2)
    distinct = sorted(set(caps))
    if len(distinct) <= 12:
        ax.xaxis.set_major_locator(FixedLocator(distinct))
    else:
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _throughput_scale(ax: Axes, values: list[float]) -> None:
    """Logarithmic y (plain numbers at 1, 2 and 5 times the powers of ten) when throughput
    spans more than :data:`LOG_SPAN`, so that doubling is a constant step and the knee a
    bend; linear from 0 otherwise (a flat curve stays flat)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [v for v in values if v > 0]
    if not positive or max(positive) <= LOG_SPAN * min(positive):
        ax.set_ylim(0, max(positive, default=1.0) * 1.1)
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _policy(run: Run) -> str:
    return run.policy or "?"


def _line_label(line: _Line, single: bool) -> str:
    name = _policy(line.run) if single or not line.series.label else line.series.label
    knee = (
        f"knee at B = {line.knee:g}"
        if line.knee is not None
        else f"no knee (every doubling adds ≥ {100 * MIN_GAIN:g} %)"
    )
    return f"{name}: {knee}"


def _where(run: Run) -> str:
    """``llama-2-7b on h100-sxm``: the model and GPU a roofline knee is for."""
    config = run.config
    tp = (config.get("parallel") or {}).get("tensor_parallel_size", 1)
    where = (
        f"{catalog_name(config.get('model', '?'))} on {catalog_name(config.get('hardware', '?'))}"
    )
    return where + (f" x{tp}" if isinstance(tp, int) and tp > 1 else "")


def _roofline_text(knee: RooflineKnee, where_for: str = "") -> str:
    where = (f"{where_for}: " if where_for else "") + (
        f"roofline knee B = {knee.batch}"
        if knee.batch is not None
        else f"roofline: decode memory-bound up to B = {MAX_KNEE_BATCH:,}"
    )
    return (
        f"{where} (ridge {knee.ridge:.0f} FLOP/B)\n"
        f"at the mean decode context, {knee.context} tokens ({knee.source})"
    )


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    """Throughput and latency vs batch cap, knees marked, mean batch below (see the module
    documentation)."""
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    study = _study(sources)
    metric = _metric(options)
    lines = _lines(study, metric)
    single = len(lines) == 1
    labels = [line.series.label or _policy(line.run) for line in lines]
    styles = series_styles(labels, {label: _policy(ln.run) for label, ln in zip(labels, lines)})
    colors = [style.color for style in styles]

    fig, (ax, ax_batch) = new_figure(2, 1, sharex=True, figsize=(8.0, 7.0), height_ratios=[3, 1.2])
    ax_lat = ax.twinx()
    handles: list[Any] = []
    layers = layered_widths(len(lines), 1.0)  # a line over an equal one leaves it visible
    for line, color, marker, layer in zip(lines, colors, (s.marker for s in styles), layers):
        ax.errorbar(
            line.caps,
            line.throughput,
            yerr=_errors(line.rows, "output_throughput"),
            color=color,
            marker=marker,
            markersize=4 * layer,
            linewidth=1.8 * layer,
            capsize=0,
            elinewidth=0.9,
            label=_line_label(line, single),
        )[0].set_gid("throughput")
        ax_lat.errorbar(
            line.caps,
            line.latency,
            yerr=_errors(line.rows, metric),
            color=color,
            marker=marker,
            markersize=3 * layer,
            linestyle="--",
            linewidth=1.2 * layer,
            capsize=0,
            elinewidth=0.9,
            label="_latency",
        )[0].set_gid("latency")
        ax_batch.errorbar(
            line.caps,
            line.batch,
            yerr=_errors(line.rows, "mean_batch_size"),
            color=color,
            marker=marker,
            markersize=2.5 * layer,
            linewidth=1.0 * layer,
            capsize=0,
            elinewidth=0.9,
            label="_mean batch",
        )[0].set_gid("mean-batch")
        if line.knee is not None:
            at = line.caps.index(float(line.knee))
            ax.plot(
                [line.knee],
                [line.throughput[at]],
                linestyle="none",
                marker="o",
                markersize=13,
                markerfacecolor="none",
                markeredgecolor=color,
                markeredgewidth=1.8,
                zorder=5,
                label="_knee",
                gid="knee",
            )
        handles.append(
            Line2D(
                [], [], color=color, marker=marker, markersize=4, label=_line_label(line, single)
            )
        )

    caps = [c for line in lines for c in line.caps]
    roofs = {line.roofline for line in lines if line.roofline is not None}
    bottom = blended_transform_factory(ax.transData, ax.transAxes)
    low, high = min(caps), max(caps)
    beyond: list[str] = []
    for index, roof in enumerate(sorted(roofs, key=lambda r: (r.batch or 0, r.context))):
        # greys, not a series' colour: a colour means a policy
        color = ROOF_GREYS[index % len(ROOF_GREYS)] if len(roofs) > 1 else "0.3"
        owner = next(line for line in lines if line.roofline == roof)
        if roof.batch is not None and low / 1.5 <= roof.batch <= high * 1.5:
            for target in (ax, ax_batch):
                target.axvline(
                    roof.batch,
                    color=color,
                    linestyle="-.",
                    linewidth=1.2,
                    label="_roofline",
                    gid="roofline",
                )
            ax.text(
                roof.batch,
                0.02,
                f"roofline knee\nB = {roof.batch} ",
                transform=bottom,
                ha="right",
                va="bottom",
                fontsize="small",
                color=color,
                bbox=BOX,
            )
        elif roof.batch is not None:  # far off the caps swept: say where, do not stretch x
            beyond.append(f"B = {roof.batch} " + ("→" if roof.batch > high else "←"))
        handles.append(
            Line2D(
                [],
                [],
                color=color,
                linestyle="-.",
                linewidth=1.2,
                label=_roofline_text(roof, _where(owner.run) if len(roofs) > 1 else ""),
            )
        )
    if beyond:
        ax.set_title(f"roofline knee {', '.join(beyond)}", loc="right", fontsize="small")
    if not roofs:
        handles.append(
            Line2D([], [], linestyle="none", label="roofline knee: no context or catalog entry")
        )

    ax_batch.plot(
        [low, high], [low, high], color="0.5", linestyle=":", linewidth=1.0, label="batch = cap"
    )
    ax_batch.plot([], [], color="0.2", linewidth=1.0, marker=".", label="mean batch reached")
    style = [
        Line2D([], [], color="0.2", linewidth=1.8, label="output throughput (left axis)"),
        Line2D(
            [],
            [],
            color="0.2",
            linestyle="--",
            label=f"{metric_label(metric).replace(' (ms)', '')} (right axis)",
        ),
        Line2D(
            [],
            [],
            linestyle="none",
            marker="o",
            markersize=10,
            markerfacecolor="none",
            markeredgecolor="0.2",
            label=RULE,
        ),
    ]
    if study.stats is not None:
        style.append(Line2D([], [], color="0.2", marker="|", label="bars: 95 % CI over seeds"))

    _cap_axis(ax_batch, caps)
    _throughput_scale(ax, [v for line in lines for v in line.throughput if not math.isnan(v)])
    ax_batch.set_yscale("log", base=2)
    ax_batch.yaxis.set_major_formatter(ax_batch.xaxis.get_major_formatter())
    ax.set_ylabel("output throughput (tok/s)")
    ax_lat.set_ylabel(metric_label(metric))
    latencies = [v for line in lines for v in line.latency if not math.isnan(v)]
    # headroom: the highest latency sits below the highest throughput, not on it
    ax_lat.set_ylim(0, max(latencies, default=1.0) * 1.3 or 1.0)
    ax_batch.set_ylabel("mean batch\n(requests)")
    ax_batch.set_xlabel(f"batch cap {CAP_KEY} (requests, log2 scale)")
    for target in (ax, ax_batch):
        target.grid(True, which="major", alpha=0.3)
    ax_batch.legend(loc="upper left", fontsize="small", framealpha=0.9)
    longest = max((len(str(h.get_label())) for h in handles), default=0)
    if longest <= 60:  # the series on the left, what the marks mean on the right
        fig.legend(handles=handles, loc="outside lower left", fontsize="small", frameon=False)
        fig.legend(handles=style, loc="outside lower right", fontsize="small", frameon=False)
    else:  # long series names (a varied block): one legend, the marks after the series
        fig.legend(
            handles=[*handles, *style], loc="outside lower left", fontsize="small", frameon=False
        )
    what = f"Output throughput and {metric_label(metric).replace(' (ms)', '')} vs batch cap"
    suptitle(fig, f"{what}\n{describe_study(study.base_config, study.varied)}")
    return fig
