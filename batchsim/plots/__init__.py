"""Figures of saved results: ``batchsim plot KIND DIR...`` and ``batchsim report``.

Every kind is a module with two functions::

    applies(source: Run | Study) -> bool            # can it draw this folder?
    plot(sources: list[Run | Study], options: PlotOptions) -> matplotlib Figure

``plot`` raises :class:`~batchsim.errors.ConfigError` (one line, naming the folder and what it
lacks) for folders it cannot draw. Figures are built on :mod:`batchsim.plots.style` (palette,
policy colours, sizes, titles) and read folders through :mod:`batchsim.plots.data`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from batchsim.plots.data import Run, Study

KINDS: dict[str, tuple[str, str]] = {
    "knee": ("knee", "throughput and latency vs batch cap (a sweep over max_num_seqs)"),
    "latency-throughput": (
        "latency_throughput",
        "p50/p99 TTFT and TPOT vs achieved throughput (a sweep over load)",
    ),
    "sweep": ("sweep", "summary metrics against a swept key, a line per other configuration"),
    "cdf": ("cdf", "TTFT, TPOT, ITL and E2E distributions of one or more runs"),
    "timeline": ("timeline", "batch slots over time, by state (a run with record_slots)"),
    "roofline": ("roofline", "every iteration on the GPU's roofline"),
    "kv": ("kv", "KV-cache usage, running and waiting requests over time, preemptions"),
    "capacity": ("capacity", "capacity per configuration (a capacity study)"),
}
"""Figure kinds: name -> (module in batchsim.plots, what it draws)."""
METRIC_KINDS = ("knee", "sweep")
"""The kinds that take ``--metric`` (knee: the latency on its right axis; sweep: its panels)."""
WINDOW_KINDS = ("timeline", "kv")
"""The kinds that take ``--from``/``--to`` (they draw a run over time)."""


@dataclass
class PlotOptions:
    """Options of ``batchsim plot``.

    Attributes:
        metrics: ``--metric`` values (each kind says which it takes; empty: its default).
        start: ``--from`` seconds (timeline, kv).
        end: ``--to`` seconds.
    """

    metrics: list[str] = field(default_factory=list)
    start: float | None = None
    end: float | None = None


def module(kind: str) -> ModuleType:
    """The module drawing ``kind``."""
    if kind not in KINDS:
        raise ConfigError(f"plot kind {kind!r}: expected one of {', '.join(KINDS)}")
    return importlib.import_module(f"batchsim.plots.{KINDS[kind][0]}")


def check_options(kind: str, options: PlotOptions) -> None:
    """Refuse options that ``kind`` would not use, and a window that is empty or negative.

    Raises:
        ConfigError: One line naming the option, its value and the kinds that take it.
    """
    if options.metrics and kind not in METRIC_KINDS:
        raise ConfigError(
            f"--metric {options.metrics[0]}: plot {kind} takes no --metric; "
            f"the kinds that do: {', '.join(METRIC_KINDS)}"
        )
    for flag, value in (("--from", options.start), ("--to", options.end)):
        if value is None:
            continue
        if kind not in WINDOW_KINDS:
            raise ConfigError(
                f"{flag} {value:g}: plot {kind} draws the whole result and takes no "
                f"--from/--to; the kinds that do: {', '.join(WINDOW_KINDS)}"
            )
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{flag} {value:g}: expected seconds >= 0")
    if options.start is not None and options.end is not None and not options.start < options.end:
        raise ConfigError(f"--from {options.start:g} must be before --to {options.end:g}")


def figure(kind: str, paths: list[str | Path], options: PlotOptions | None = None) -> Figure:
    """Draw ``kind`` from result folders (runs, sweeps or capacity studies).

    Raises:
        ConfigError: An unknown kind, an option the kind does not take
            (:func:`check_options`), or a folder it cannot draw.
    """
    from batchsim.plots.data import load

    draw = module(kind)
    options = options or PlotOptions()
    check_options(kind, options)
    sources = [load(p) for p in paths]
    return draw.plot(sources, options)  # type: ignore[no-any-return]


def relevant_kinds(source: Run | Study) -> list[str]:
    """The kinds that can draw ``source`` (the figures of its report).

    A kind whose module is missing is left out; any other import error (a module that exists
    but fails to import) is a bug and propagates."""
    kinds = []
    for kind, (module_name, _) in KINDS.items():
        try:
            draw = module(kind)
        except ModuleNotFoundError as exc:
            if exc.name != f"batchsim.plots.{module_name}":
                raise
            continue
        if draw.applies(source):
            kinds.append(kind)
    return kinds


def plot(kind: str, paths: list[str | Path], out: str | Path, **options: Any) -> Path:
    """Draw ``kind`` from result folders into ``out`` (.png, .svg or .pdf); return the path."""
    from batchsim.plots.style import save

    fig = figure(kind, paths, PlotOptions(**options))
    return save(fig, out)
