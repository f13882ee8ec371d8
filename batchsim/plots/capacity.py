"""``batchsim plot capacity``: the highest arrival rate each configuration of a capacity study
sustains, as horizontal bars.

One bar per row of ``capacity.csv`` (a configuration: its varied values label it), coloured by
policy when the study varies the policy. Beside each bar: the rate, the rate per GPU when the
configuration uses more than one GPU, and what stopped the search at the next rate up
(``limited_by``, shortened: ``p99 TTFT 2,017 > 2,000 ms``, ``queue grows``). A configuration
that sustains no rate tried gets an empty bar at 0 and says so; one that could not be simulated
has no bar and shows its error. The title states the criterion from ``sweep.json``: the SLO
limits (or the attainment target with per-request limits) and the queue-growth bound.
"""

from __future__ import annotations

import math
import re
import textwrap
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Study, finite_number, value_text, values_label
from batchsim.plots.style import color_for, describe_study, metric_label, new_figure, suptitle

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from batchsim.plots import PlotOptions

POLICY_KEY = "scheduler.policy"
RATE_KEY = "workload.arrival.rate"
HOW = "batchsim capacity EXP --slo p99_ttft_ms=2000"
WRAP = 48
"""Characters per line of the text beside a bar."""


def applies(source: Run | Study) -> bool:
    """A capacity study."""
    return isinstance(source, Study) and source.kind == "capacity"


def _study(sources: list[Run | Study]) -> Study:
    if len(sources) != 1:
        names = ", ".join(str(s.path) for s in sources)
        raise ConfigError(f"capacity draws one capacity study folder, got {len(sources)}: {names}")
    source = sources[0]
    if isinstance(source, Run):
        raise ConfigError(
            f"{source.path}: a run folder, not a capacity study; capacity draws the folder of {HOW}"
        )
    if source.kind != "capacity":
        raise ConfigError(
            f"{source.path}: a {source.kind}, not a capacity study (no capacity.csv); capacity "
            f"draws the folder of {HOW}"
        )
    return source


def _num(text: str) -> str:
    """A number of the table for a label: ``2,017``, ``0.00781``, ``4,713,000``."""
    try:
        value = float(text)
    except ValueError:
        return text
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _limit(metric: str, got: str, limit: str) -> str:
    return f"{metric_label(metric).replace(' (ms)', '')} {_num(got)} > {_num(limit)} ms"


def short_limit(text: str) -> str:
    """``limited_by`` in a few words: ``p99_ttft_ms 2017 > 2000`` -> ``p99 TTFT 2,017 > 2,000
    ms``; ``queue grows (queue_delay_growth 0.06 > 0.05)`` -> ``queue grows``; the sentence of a
    configuration that sustains no rate -> ``no rate sustained in [A, B] req/s`` with the
    first rate's reason."""
    text = " ".join(str(text).split())
    if not text:
        return ""
    none = re.match(r"no rate from (\S+) to (\S+) req/s is sustained; at \S+: (.*)$", text)
    if none:
        low, high, why = none.groups()
        return (
            f"no rate sustained in [{_num(low)}, {_num(high)}] req/s; at {_num(low)}: "
            f"{short_limit(why)}"
        )
    slo = re.match(r"^(\w+_ms) (\S+) > (\S+)$", text)
    if slo:
        return _limit(*slo.groups())
    if text.startswith("queue grows"):
        return "queue grows"
    nothing = re.match(r"^nothing up to (\S+) req/s$", text)
    if nothing:
        return f"no limit found up to {_num(nothing.group(1))} req/s"
    attained = re.match(r"^slo_attainment (\S+) < (\S+)$", text)
    if attained:
        return f"SLO attainment {_num(attained.group(1))} < {_num(attained.group(2))}"
    return textwrap.shorten(text, 80, placeholder=" …")


def criterion(marker: dict[str, Any], process: str = "") -> str:
    """What "sustained" meant for the study, from ``sweep.json``."""
    slo = marker.get("slo") or {}
    attainment = marker.get("attainment")
    growth = marker.get("max_queue_growth")
    if attainment is not None:
        limits = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:,.4g} ms" for k, v in slo.items())
        slos = f"≥ {100 * float(attainment):.4g} % of requests within {limits}"
    else:
        slos = ", ".join(
            f"{metric_label(k).replace(' (ms)', '')} ≤ {v:,.4g} ms" for k, v in slo.items()
        )
    queue = f"queue growth ≤ {growth:g} s/s" if isinstance(growth, (int, float)) else ""
    arrivals = f"{process.replace('_', ' ').capitalize()} arrival rate" if process else "rate"
    return f"Highest sustained {arrivals}: " + "; ".join(p for p in (slos, queue) if p)


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    """Capacity per configuration (see the module documentation)."""
    import pandas as pd

    study = _study(sources)
    table = study.table
    if "max_request_rate" not in table:
        raise ConfigError(f"{study.path}: capacity.csv has no max_request_rate column")
    if not len(table):
        raise ConfigError(f"{study.path}: capacity.csv has no configuration")
    config = study.base_config
    varied = study.varied
    base_policy = str((config.get("scheduler") or {}).get("policy", ""))
    by_policy = POLICY_KEY in varied

    labels, rates, colors, notes, failed = [], [], [], [], []
    policies: dict[str, int] = {}  # a policy's index among those seen: its colour if not built in
    for _, row in table.iterrows():
        values = {key: row[key] for key in varied if key in row}
        labels.append(values_label(values) or base_policy or "base")
        policy = value_text(row[POLICY_KEY]) if by_policy else base_policy
        colors.append(color_for(policy, policies.setdefault(policy, len(policies))))
        error = row.get("error")
        error = "" if error is None or pd.isna(error) else str(error).strip()
        rate = finite_number(row["max_request_rate"])
        if error or math.isnan(rate):
            rates.append(math.nan)
            notes.append(textwrap.fill(f"error: {error or 'not simulated'}", WRAP))
            failed.append(True)
            continue
        failed.append(False)
        rates.append(rate)
        gpus = finite_number(row.get("num_gpus", 1))
        head = f"{rate:,.3g} req/s" if rate > 0 else "none sustained"
        if not math.isnan(gpus) and gpus != 1 and rate > 0:
            per_gpu = finite_number(row.get("max_request_rate_per_gpu", rate / gpus))
            head += f" = {per_gpu:,.3g} req/s per GPU × {gpus:g} GPUs"
        limit = short_limit(str(row.get("limited_by", "") or ""))
        notes.append(head + ("\n" + textwrap.fill(f"limit: {limit}", WRAP) if limit else ""))

    height = max(3.2, 1.4 + 0.62 * len(labels) + 0.12 * sum(n.count("\n") for n in notes))
    fig, ax = new_figure(figsize=(8.0, height))
    y = list(range(len(labels)))
    ax.barh(y, rates, color=colors, height=0.6, edgecolor="0.2", linewidth=0.6)
    top = max((r for r in rates if not math.isnan(r)), default=0.0) or 1.0
    for yi, rate, note, bad in zip(y, rates, notes, failed):
        ax.annotate(
            note,
            xy=(0.0 if math.isnan(rate) else rate, yi),
            xytext=(4, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize="small",
            color="0.15",
            fontstyle="italic" if bad else "normal",
        )
    ax.set_yticks(y, labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # the first configuration on top, as in capacity.csv
    ax.set_xlim(0, top * 2.1)
    ax.set_xlabel("max sustained arrival rate (req/s)")
    if len(varied) == 1 and "=" not in labels[0]:  # bare values: say what they are
        ax.set_ylabel(varied[0])
    ax.grid(True, axis="x", alpha=0.3)
    process = str(((config.get("workload") or {}).get("arrival") or {}).get("process", ""))
    setup = describe_study(config, [*varied, RATE_KEY]).replace("rate varied", "rate searched")
    suptitle(fig, f"{criterion(study.marker, process)}\n{setup}", fontsize="medium")
    return fig
