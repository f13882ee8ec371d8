"""``batchsim plot timeline RUN... [--from S --to S]``: the batch slots of a run over time.

Rows are batch slots, time runs to the right, and each slot is coloured by what it did in
each iteration (``slots.csv``): prefill, chunked prefill, decode, stalled (running but not
scheduled: a decode waiting out a prefill-only iteration), padding or empty (the slot of a
request that finished while its static batch runs on), and idle (white: no request in the
slot, whether or not an iteration runs: a continuous batch narrower than its widest).
Static batching's empty slots next to continuous batching's refilling, or decodes stalled
under prefills, are this picture. Several runs are drawn one above the other on one time
axis. Runs need ``metrics.record_slots: true``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Study
from batchsim.plots.style import STATE_COLORS, describe_run, new_figure, suptitle

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

MAX_RUNS = 4
STATE_LABELS = {
    "prefill": "prefill",
    "chunked_prefill": "chunked prefill",
    "decode": "decode",
    "stalled": "stalled (running, not scheduled)",
    "padding": "padding (finished row computed)",
    "empty": "empty slot",
}
IDLE_LABEL = "idle (no request in the slot)"


def applies(source: Run | Study) -> bool:
    """A run with its slots and every iteration (a slot names iterations by number)."""
    return (
        isinstance(source, Run)
        and source.has_table("slots")
        and source.has_table("iterations")
        and source.iterations_sample is None
    )


def rectangles(run: Run, start: float | None, end: float | None) -> dict[str, np.ndarray]:
    """Per state, the rectangles ``(x0, width, slot)`` of the slot runs inside the window."""
    it = run.iterations
    t0 = it["start_time_s"].to_numpy()
    t1 = t0 + it["duration_ms"].to_numpy() / 1e3
    slots = run.slots
    lo = -np.inf if start is None else start
    hi = np.inf if end is None else end
    out: dict[str, np.ndarray] = {}
    for state in STATE_LABELS:
        rows = slots[slots["state"] == state]
        if rows.empty:
            continue
        x0 = t0[rows["first_iteration"].to_numpy()]
        x1 = t1[rows["last_iteration"].to_numpy()]
        inside = (x1 > lo) & (x0 < hi)
        x0, x1 = np.maximum(x0[inside], lo), np.minimum(x1[inside], hi)
        y = rows["slot"].to_numpy()[inside]
        if len(y):
            out[state] = np.column_stack([x0, x1 - x0, y])
    return out


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    from batchsim.plots import PlotOptions

    runs = []
    for source in sources:
        if not isinstance(source, Run):
            raise ConfigError(f"{source.path}: timeline draws runs, not a {source.kind}")
        if not source.has_table("slots"):
            raise ConfigError(
                f"{source.path}: no slots.csv; rerun with --set metrics.record_slots=true"
            )
        source.require_all_iterations("timeline")
        runs.append(source)
    if len(runs) > MAX_RUNS:
        raise ConfigError(f"timeline draws at most {MAX_RUNS} runs, got {len(runs)}")
    heights = [max(2.0, min(4.5, 0.6 + 0.08 * _num_slots(run))) for run in runs]
    fig, axes = new_figure(
        len(runs),
        1,
        sharex=True,
        squeeze=False,
        figsize=(8.0, sum(heights) + 0.9),
        gridspec_kw={"height_ratios": heights},
    )
    seen: set[str] = set()
    any_drawn = False
    for ax, run in zip(axes[:, 0], runs):
        rects = rectangles(run, options.start, options.end)
        for state, boxes in rects.items():
            x0, width, y = boxes[:, 0], boxes[:, 1], boxes[:, 2]
            verts = np.stack(
                [
                    np.column_stack([x0, y - 0.45]),
                    np.column_stack([x0 + width, y - 0.45]),
                    np.column_stack([x0 + width, y + 0.45]),
                    np.column_stack([x0, y + 0.45]),
                ],
                axis=1,
            )
            ax.add_collection(
                PolyCollection(
                    list(verts), facecolors=STATE_COLORS[state], edgecolors="none", label=state
                )
            )
            seen.add(state)
            any_drawn = True
        n = _num_slots(run)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_ylabel("batch slot")
        ax.yaxis.set_major_locator(MaxNLocator(nbins=min(n, 6), integer=True))
        ax.set_title(_panel_title(run), fontsize="small", loc="left")
        ax.set_facecolor(STATE_COLORS["idle"])
        ax.grid(False)
    if not any_drawn:
        lo, hi = _x_range(runs, PlotOptions())
        raise ConfigError(
            f"{', '.join(str(r.path) for r in runs)}: no iteration between --from "
            f"{options.start or 0:g} s and --to {_seconds(options.end)} (its iterations run "
            f"from {lo:g} s to {hi:g} s)"
        )
    lo, hi = _x_range(runs, options)
    axes[-1, 0].set_xlim(lo, hi)
    axes[-1, 0].set_xlabel("time (s)")
    handles = [
        Patch(facecolor=STATE_COLORS[s], label=STATE_LABELS[s]) for s in STATE_LABELS if s in seen
    ]
    handles.append(Patch(facecolor=STATE_COLORS["idle"], edgecolor="#999999", label=IDLE_LABEL))
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize="small")
    if len(runs) == 1:
        suptitle(fig, "Batch slots over time")
    else:
        suptitle(fig, "Batch slots over time: " + " vs ".join(r.policy for r in runs))
    return fig


def _seconds(value: float | None) -> str:
    return "the end" if value is None else f"{value:g} s"


def _num_slots(run: Run) -> int:
    return int(run.slots["slot"].max()) + 1 if len(run.slots) else 1


def _panel_title(run: Run) -> str:
    s = run.summary
    extra = (
        f"empty slots {s.get('empty_slot_fraction', 0):.0%}, "
        f"p99 ITL {s.get('p99_itl_ms', float('nan')):.0f} ms"
    )
    return f"{describe_run(run.config)} — {extra}"


def _x_range(runs: list[Run], options: PlotOptions) -> tuple[float, float]:
    """The window: --from/--to, else from the first iteration to the last one's end."""
    starts, ends = [], []
    for run in runs:
        it = run.iterations
        if len(it):
            starts.append(float(it["start_time_s"].iloc[0]))
            ends.append(float((it["start_time_s"] + it["duration_ms"] / 1e3).iloc[-1]))
    lo = options.start if options.start is not None else min(starts, default=0.0)
    hi = options.end if options.end is not None else max(ends, default=1.0)
    return lo, hi if hi > lo else lo + 1.0
