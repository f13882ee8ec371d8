"""One look for every figure: a colour-blind-safe palette (Okabe and Ito), the same colour for
the same policy everywhere (lighter tints of it for a policy's further lines), README-width
sizes, titles that say what was run, and saving by file extension.

Importing this module selects matplotlib's non-interactive Agg backend: batchsim draws into
files, never into windows.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

from batchsim.errors import ConfigError, write_error

matplotlib.use("Agg")

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

OKABE_ITO = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#E69F00",  # orange
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)
"""Okabe & Ito (2008), distinguishable under the common colour-vision deficiencies."""
SERIES_ORDER = (*OKABE_ITO[:6], OKABE_ITO[7], OKABE_ITO[6])
"""The palette for series that are not policies: yellow, hard to read on white, comes last."""

POLICY_COLORS = {
    "static": OKABE_ITO[1],
    "dynamic": OKABE_ITO[3],
    "continuous": OKABE_ITO[0],
    "chunked_prefill": OKABE_ITO[2],
}
"""The colour of each built-in policy, in every figure."""

STATE_COLORS = {
    "prefill": OKABE_ITO[1],
    "chunked_prefill": OKABE_ITO[3],
    "decode": OKABE_ITO[0],
    "stalled": OKABE_ITO[4],
    "padding": "#9A9A9A",
    "empty": "#E4E4E4",
    "idle": "#FFFFFF",
}
"""Colours of a slot's or an iteration's state (timeline, roofline scatter)."""

PHASE_COLORS = {
    "prefill": STATE_COLORS["prefill"],
    "decode": STATE_COLORS["decode"],
    "mixed": OKABE_ITO[2],
}
"""Colours of an iteration's composition: prefill only, decode only, or both."""

FIGSIZE = (8.0, 4.5)
"""Inches: 800 x 450 pixels at the default 100 dpi, readable at README width."""
DPI = 100
SAVE_DPI = 150
FORMATS = (".png", ".svg", ".pdf")


def tick_text(value: float) -> str:
    """A tick as a plain number: ``20``, ``1,000``, ``100,000``, ``0.5`` (matplotlib would
    write ``10^5`` or an offset such as ``1e6`` above the axis)."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def color_for(label: str, index: int) -> str:
    """A policy's own colour, or the index-th palette colour for any other series."""
    if label in POLICY_COLORS:
        return POLICY_COLORS[label]
    palette = [c for c in SERIES_ORDER if c not in POLICY_COLORS.values()]
    palette += [c for c in SERIES_ORDER if c not in palette]
    return palette[index % len(palette)]


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""Markers that tell apart series of one colour (several configurations of one policy)."""
DASHES: tuple[Any, ...] = (
    "-",
    "--",
    ":",
    "-.",
    (0, (5, 1, 1, 1, 1, 1)),
    (0, (8, 2)),
    (0, (1, 3)),
    (0, (3, 2, 1, 2)),
)
"""Line styles that tell apart series of one colour where a figure has no markers."""


@dataclass(frozen=True)
class SeriesStyle:
    """How one series of a figure is drawn."""

    color: str
    variant: int = 0
    """0 for the first series of its colour, 1, 2, ... for the others of that colour."""

    @property
    def marker(self) -> str:
        return MARKERS[self.variant % len(MARKERS)]

    @property
    def dashes(self) -> Any:
        return DASHES[self.variant % len(DASHES)]


TINT_RANGE = 0.55
"""How far toward white the last of two or more lines of one policy is tinted (the first
keeps the policy's colour): light enough to tell apart, dark enough to read on white."""


def tint(color: str, fraction: float) -> str:
    """``color`` moved ``fraction`` (0..1) of the way toward white; its hue stays."""
    from matplotlib.colors import to_hex, to_rgb

    r, g, b = (c + (1.0 - c) * fraction for c in to_rgb(color))
    return to_hex((r, g, b))


def series_styles(
    labels: list[str], policies: Mapping[str, str] | None = None
) -> list[SeriesStyle]:
    """Styles of several series.

    When the series have several policies, a series whose policy is a built-in one takes that
    policy's colour, so a policy has one hue in every figure; series sharing a policy are told
    apart by their variant (a marker, or a line style) and a tint: the first keeps the
    policy's colour, the next ones are lighter in order, the last :data:`TINT_RANGE` of the
    way to white (a sweep's lines go from dark to light as its values do). When every series
    has the same policy, its colour tells nothing apart: the first series keeps it and the
    others take the palette's other colours, each series its own marker and line style (two
    GPUs of one policy are two hues, not two blues). Other series take the palette's remaining
    colours in order (never a policy's colour), variant 0."""
    policies = policies or {}
    named = [policies.get(label, label) for label in labels]
    if len(named) > 1 and len(set(named)) == 1 and named[0] in POLICY_COLORS:
        first = POLICY_COLORS[named[0]]
        others = [c for c in SERIES_ORDER if c != first]
        return [
            SeriesStyle(first if i == 0 else others[(i - 1) % len(others)], i)
            for i in range(len(named))
        ]
    counts = {p: named.count(p) for p in set(named) if p in POLICY_COLORS}
    styles: list[SeriesStyle] = []
    seen: dict[str, int] = {}
    spare = 0
    for policy in named:
        if policy in POLICY_COLORS:
            variant = seen.get(policy, 0)
            seen[policy] = variant + 1
            shade = TINT_RANGE * variant / (counts[policy] - 1) if variant else 0.0
            color = tint(POLICY_COLORS[policy], shade) if shade else POLICY_COLORS[policy]
            styles.append(SeriesStyle(color, variant))
        else:
            styles.append(SeriesStyle(color_for(f"#{spare}", spare)))
            spare += 1
    return styles


def layered_widths(count: int, width: float) -> list[float]:
    """Line widths of ``count`` series drawn in order: the first widest (up to 1.6 x
    ``width``), the last ``width``, so that a line drawn over an equal one leaves it visible
    on both sides."""
    if count <= 1:
        return [width] * count
    return [width * (1 + 0.6 * (count - 1 - i) / (count - 1)) for i in range(count)]


def new_figure(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Figure, Any]:
    """A figure at README width with a grid of axes (``plt.subplots`` without pyplot state)."""
    from matplotlib.figure import Figure

    size = kwargs.pop("figsize", FIGSIZE)
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, **kwargs)
    return fig, axes


def describe_run(config: Mapping[str, Any]) -> str:
    """``llama-2-7b on a100-80gb, continuous, Poisson 8 req/s``: what a run simulated."""
    model = catalog_name(config.get("model", "?"))
    hardware = catalog_name(config.get("hardware", "?"))
    tp = (config.get("parallel") or {}).get("tensor_parallel_size", 1)
    where = f"{model} on {hardware}" + (f" x{tp}" if tp and tp > 1 else "")
    cluster = config.get("cluster")
    if isinstance(cluster, Mapping):  # many replicas behind a router
        where = f"{model} on {describe_replicas(cluster, hardware)}, {cluster.get('router', '?')}"
    policy = (config.get("scheduler") or {}).get("policy", "?")
    return ", ".join(p for p in (where, str(policy), describe_load(config)) if p)


def catalog_name(value: Any) -> str:
    """A model or GPU as a title names it: a catalog name as it is (``llama-3.1-8b``,
    ``qwen2.5-7b``: dots are part of the name), a YAML file by its stem, a Hugging Face
    ``config.json`` by its folder."""
    text = str(value)
    path = Path(text)
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        return path.stem
    return path.name or text


def run_title(prefix: str, config: Mapping[str, Any]) -> str:
    """``prefix: <describe_run>`` (:func:`suptitle` breaks it where it is too wide)."""
    return f"{prefix}: {describe_run(config)}"


TITLE_WIDTH = 0.96
"""The share of the figure's width a title's line may take."""


def text_width(text: str, font_pt: float) -> float:
    """Inches that one line of ``text`` takes at ``font_pt`` points in matplotlib's default
    font."""
    from matplotlib.textpath import TextPath

    return float(TextPath((0, 0), text, size=font_pt).get_extents().width) / 72


def suptitle(fig: Figure, text: str, **kwargs: Any) -> Any:
    """``fig.suptitle(text)`` with every line that is wider than the figure broken, at its
    phrases (after ``: ``, ``, ``, `` / `` or `` vs ``) where it can, else between words:
    a title is never cut at the figure's edges."""
    from matplotlib.font_manager import FontProperties

    size = kwargs.get("fontsize", matplotlib.rcParams["figure.titlesize"])
    font_pt = FontProperties(size=size).get_size_in_points()
    width = fig.get_figwidth() * TITLE_WIDTH
    lines = [part for line in text.split("\n") for part in wrap_line(line, font_pt, width)]
    return fig.suptitle("\n".join(lines), **kwargs)


_PHRASE_END = re.compile(r"(?<=: )|(?<=, )|(?<= / )|(?= vs )")


def wrap_line(line: str, font_pt: float, width_in: float) -> list[str]:
    """``line`` as lines of at most ``width_in`` inches: whole phrases packed greedily, a
    phrase too wide alone broken between words."""
    if text_width(line, font_pt) <= width_in:
        return [line]
    pieces = [p for p in _PHRASE_END.split(line) if p]
    if len(pieces) == 1:
        pieces = [w + " " for w in line.split(" ")]
        if len(pieces) == 1:
            return [line]
    lines: list[str] = []
    current = ""
    for piece in pieces:
        if current and text_width((current + piece).rstrip(), font_pt) > width_in:
            lines.append(current.rstrip())
            current = piece.lstrip()
        else:
            current += piece
    if current.strip():
        lines.append(current.rstrip())
    out: list[str] = []
    for part in lines:  # a phrase still too wide: between its words
        too_wide = text_width(part, font_pt) > width_in and " " in part
        out.extend(wrap_line_words(part, font_pt, width_in) if too_wide else [part])
    return out


def wrap_line_words(line: str, font_pt: float, width_in: float) -> list[str]:
    """``line`` broken between words into lines of at most ``width_in`` inches (a word wider
    than that stands alone)."""
    lines: list[str] = []
    current = ""
    for word in line.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and text_width(candidate, font_pt) > width_in:
            lines.append(current)
            current = word
        else:
            current = candidate
    return [*lines, current] if current else lines


def describe_replicas(cluster: Mapping[str, Any], hardware: str) -> str:
    """``8 x a100-80gb`` (replicas of the experiment's GPU), ``2 x h100-sxm + 4 x
    a100-80gb``, or ``2 prefill x a100-80gb + 2 decode x a100-80gb``."""
    pools = cluster.get("disaggregation")
    if isinstance(pools, Mapping):  # a prefill pool and a decode pool
        parts = []
        for pool in ("prefill", "decode"):
            group = pools.get(pool)
            group = group if isinstance(group, Mapping) else {}
            name = catalog_name(group.get("hardware") or hardware)
            parts.append(f"{group.get('replicas', '?')} {pool} x {name}")
        return " + ".join(parts)
    replicas = cluster.get("replicas")
    if not isinstance(replicas, list):
        return f"{replicas} x {hardware}"
    parts = []
    for group in replicas:
        if isinstance(group, Mapping):
            name = catalog_name(group.get("hardware") or hardware)
            parts.append(f"{group.get('count', '?')} x {name}")
    return " + ".join(parts)


def describe_load(config: Mapping[str, Any]) -> str:
    """The workload's load in a few words (``Poisson 8 req/s``, ``all at once``, ``trace``)."""
    workload = config.get("workload") or {}
    if not isinstance(workload, Mapping):
        return ""
    n = workload.get("num_requests")
    count = f"{n:,} requests" if isinstance(n, int) else ""
    if workload.get("trace"):
        return ", ".join(p for p in ("trace replay", count) if p)
    if workload.get("concurrency"):
        return ", ".join(p for p in (f"{workload['concurrency']} users (closed loop)", count) if p)
    arrival = workload.get("arrival") or {}
    process = arrival.get("process", "")
    if process == "all_at_once":
        load = "all at once"
    elif "rate" in arrival:
        load = f"{process.replace('_', ' ').capitalize()} {arrival['rate']:g} req/s"
    else:
        load = process
    return ", ".join(p for p in (load, count) if p)


def describe_study(config: Mapping[str, Any], varied: Sequence[str]) -> str:
    """:func:`describe_run` of a study's point, naming what the study varies instead of that
    point's value: ``llama-2-7b on a100-80gb, policy varied, Poisson arrivals, rate varied,
    500 requests``. The same as :func:`describe_run` when none of those keys varies."""

    def varies(key: str) -> bool:
        return _varies(key, varied)

    described = ("model", "hardware", "parallel", "scheduler.policy", "workload")
    if not any(varies(key) for key in described):
        return describe_run(config)
    model = "models varied" if varies("model") else catalog_name(config.get("model", "?"))
    hardware = "GPUs varied" if varies("hardware") else catalog_name(config.get("hardware", "?"))
    where = f"{model} on {hardware}"
    if varies("parallel.tensor_parallel_size"):
        where += ", TP varied"
    else:
        tp = (config.get("parallel") or {}).get("tensor_parallel_size", 1)
        where += f" x{tp}" if isinstance(tp, int) and tp > 1 else ""
    scheduler = config.get("scheduler") or {}
    policy = "policy varied" if varies("scheduler.policy") else str(scheduler.get("policy", "?"))
    return ", ".join(p for p in (where, policy, _study_load(config, varied)) if p)


def _varies(key: str, varied: Sequence[str]) -> bool:
    """``key`` or a key inside it or around it is among ``varied``."""
    return any(v == key or v.startswith(key + ".") or key.startswith(v + ".") for v in varied)


def _study_load(config: Mapping[str, Any], varied: Sequence[str]) -> str:
    def varies(key: str) -> bool:
        return _varies(key, varied)

    workload = config.get("workload") or {}
    if "workload" in varied or not isinstance(workload, Mapping):
        return "workload varied"
    loads = ("workload.arrival", "workload.concurrency", "workload.trace", "workload.think_time_ms")
    if not any(varies(key) for key in (*loads, "workload.num_requests")):
        return describe_load(config)
    n = workload.get("num_requests")
    if varies("workload.num_requests"):
        count = "number of requests varied"
    else:
        count = f"{n:,} requests" if isinstance(n, int) else ""
    if not any(varies(key) for key in loads):
        load = describe_load({"workload": {**workload, "num_requests": None}})
    elif varies("workload.concurrency"):
        load = "users (closed loop) varied"
    elif "workload.arrival" in varied or not varies("workload.arrival.rate"):
        load = "arrivals varied"
    else:
        process = str((workload.get("arrival") or {}).get("process", ""))
        load = f"{process.replace('_', ' ').capitalize()} arrivals, rate varied".lstrip(" ,")
    return ", ".join(p for p in (load, count) if p)


_METRIC_WORDS = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2el": "E2E latency",
}


def metric_label(metric: str) -> str:
    """A summary metric as an axis names it: ``p99_itl_ms`` -> ``p99 ITL (ms)``,
    ``mean_queue_delay_ms`` -> ``mean queue delay (ms)``."""
    ms = metric.endswith("_ms")
    stat, _, what = (metric[:-3] if ms else metric).partition("_")
    words = _METRIC_WORDS.get(what, what.replace("_", " "))
    return f"{stat} {words}".strip() + (" (ms)" if ms else "")


def legend_columns(labels: Sequence[str], width_in: float, max_columns: int = 3) -> int:
    """The most columns (up to ``max_columns``) in which a legend of ``labels`` at the
    "small" font fits ``width_in`` inches, each column as wide as the longest label."""
    from matplotlib.font_manager import FontProperties

    if not labels:
        return 1
    em = FontProperties(size="small").get_size_in_points() / 72
    longest = max(len(line) for label in labels for line in str(label).splitlines())
    # handle (2 em), its pad (0.8 em), the label, and the spacing to the next column (2 em)
    column = (2.0 + 0.8 + 2.0) * em + longest * 0.62 * em
    return max(1, min(max_columns, len(labels), int(width_in // column)))


def finish(ax: Axes, *, legend: bool = True, **legend_kwargs: Any) -> None:
    """Grid lines and, if there is anything labelled, a legend."""
    ax.grid(True, which="major", alpha=0.3)
    _, labels = ax.get_legend_handles_labels()
    if legend and labels:
        ax.legend(**{"fontsize": "small", "framealpha": 0.9, **legend_kwargs})


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (format from the extension: .png, .svg or .pdf), whole or not
    at all.

    Raises:
        ConfigError: An unknown extension, or the OS refused (with its reason).
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(
            f"-o {path}: unknown figure format {suffix or '(none)'!r}; "
            f"use one of {', '.join(FORMATS)}"
        )
    tmp = target.with_name(f".{target.name}.tmp{suffix}")
    try:
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=SAVE_DPI, format=suffix[1:], metadata=_metadata(suffix))
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(target, exc) from None
    return target


def _metadata(suffix: str) -> dict[str, Any]:
    # no dates or versions in the files: the same inputs draw byte-identical figures
    if suffix == ".svg":
        return {"Date": None, "Creator": "batchsim"}
    if suffix == ".pdf":
        return {"CreationDate": None, "Creator": "batchsim", "Producer": "batchsim"}
    return {"Software": "batchsim"}


@contextlib.contextmanager
def svg_hashsalt() -> Iterator[None]:
    """Deterministic ids in SVG output (matplotlib salts them at random otherwise)."""
    with matplotlib.rc_context({"svg.hashsalt": "batchsim"}):
        yield
