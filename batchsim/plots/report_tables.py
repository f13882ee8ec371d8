"""The tables of a ``batchsim report`` page: a run's summary (counts, throughput, a latency
grid, batchsim's own metrics), a study's sortable tables of points or configurations, and how
a value is shown in them (units, percentages, significant digits, the exact number on hover).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError, DamagedFileError
from batchsim.plots.report_page import _esc, _Page

if TYPE_CHECKING:
    import pandas as pd

    from batchsim.plots.data import Study

MAX_TABLE_ROWS = 5_000
"""Rows of a study table shown in the page; the CSV next to it holds them all."""
WRAP_CHARS = 32
"""Text cells longer than this wrap (an error message, a point label); others stay on a line."""

COUNT_KEYS = (
    "completed",
    "failed",
    "num_prompts",
    "request_rate",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
)
THROUGHPUT_KEYS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "slo_attainment",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_STATS = ("mean", "median", "std", "p90", "p99")
LATENCY_NAMES = {
    "ttft": "time to first token",
    "tpot": "time per output token",
    "itl": "inter-token latency",
    "e2el": "end-to-end latency",
}
PERCENT_KEYS = frozenset({"max_kv_cache_usage", "slo_attainment"})


# ---- summary of a run -----------------------------------------------------------------------


def _summary(summary: Mapping[str, Any]) -> str:
    values = {k: v for k, v in summary.items() if k != "config"}
    latency = {
        f"{stat}_{metric}_ms" for metric in LATENCY_METRICS for stat in LATENCY_STATS
    } & values.keys()
    used = set(COUNT_KEYS) | set(THROUGHPUT_KEYS) | latency
    groups = [
        ("Counts", [k for k in COUNT_KEYS if k in values]),
        ("Throughput", [k for k in THROUGHPUT_KEYS if k in values]),
    ]
    own = [k for k in values if k not in used]
    parts = ['<div class="groups">']
    for title, keys in groups:
        if keys:
            parts.append(_key_value_table(title, keys, values))
    parts.append("</div>")
    if latency:
        parts.append(_latency_table(values))
    if own:
        parts.append('<div class="groups">')
        half = (len(own) + 1) // 2
        parts.append(_key_value_table("batchsim's own", own[:half], values))
        parts.append(_key_value_table("batchsim's own (continued)", own[half:], values))
        parts.append("</div>")
    parts.append(
        '<p class="caption">Names as in <code>summary.json</code> (vLLM\'s '
        "<code>benchmark_serving</code> names where they exist); hover a value for its "
        "exact number.</p>"
    )
    return "\n".join(parts)


def _key_value_table(title: str, keys: Sequence[str], values: Mapping[str, Any]) -> str:
    rows = []
    for key in keys:
        text, raw = _format(key, values[key])
        unit = _unit(key) if raw is not None else ""
        rows.append(
            f"<tr><th scope=row><code>{_esc(key)}</code></th>"
            f"<td class=n{_title(raw)}>{_esc(text)}</td><td class=unit>{_esc(unit)}</td></tr>"
        )
    return f"<table class=kv><caption>{_esc(title)}</caption><tbody>{''.join(rows)}</tbody></table>"


def _latency_table(values: Mapping[str, Any]) -> str:
    head = "".join(f"<th scope=col class=n>{s}</th>" for s in LATENCY_STATS)
    rows = []
    for metric in LATENCY_METRICS:
        cells = []
        for stat in LATENCY_STATS:
            key = f"{stat}_{metric}_ms"
            if key not in values:
                cells.append("<td class=n></td>")
                continue
            text, raw = _format(key, values[key])
            cells.append(f'<td class=n title="{key}: {_esc(_raw_text(raw))}">{_esc(text)}</td>')
        rows.append(
            f"<tr><th scope=row><code>*_{metric}_ms</code> "
            f"<span class=muted>{LATENCY_NAMES[metric]}</span></th>{''.join(cells)}</tr>"
        )
    return (
        "<div class=scroll-x><table class=latency><caption>Latency (ms): each cell is "
        "<code>STAT_METRIC_ms</code>, e.g. <code>p99_ttft_ms</code></caption>"
        f"<thead><tr><th scope=col>metric</th>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _unit(key: str) -> str:
    base = key.removesuffix("_ci95")
    if _is_percent(base):
        return ""
    if base.endswith("_ms"):
        return "ms"
    if base in ("request_throughput", "request_goodput", "request_rate") or "request_rate" in base:
        return "req/s"
    if base in ("output_throughput", "total_token_throughput", "max_output_tokens_per_s"):
        return "tok/s"
    if base == "queue_delay_growth":
        return "s/s"
    if base == "duration" or base.endswith("_s"):
        return "s"
    if base.endswith("_tokens") and base.startswith(("total_", "kv_")):
        return "tokens"
    return ""


# ---- values ---------------------------------------------------------------------------------


def _is_percent(key: str) -> bool:
    return key.endswith("_fraction") or key in PERCENT_KEYS


def _format(key: str, value: Any) -> tuple[str, float | None]:
    """A value as shown (percent for fractions, thousands separators, 4 significant digits)
    and its number (None for text and missing values)."""
    if value is None:
        return "–", None
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        text = str(value).lower() if isinstance(value, bool) else _cell_text(value)
        return text, None
    number = float(value)
    if math.isnan(number):
        return "–", None
    if _is_percent(key.removesuffix("_ci95")) and math.isfinite(number):
        percent = number * 100
        if percent == 0:
            text = "0"
        elif abs(percent) >= 0.1:
            text = f"{percent:.1f}"
        else:
            text = f"{percent:.2g}"
        return f"{text} %", number
    return _number(number), number


def _number(number: Any) -> str:
    value = float(number)
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 1:
        return f"{value:.4g}"
    if size >= 1e-4:
        return f"{value:.3g}"
    return f"{value:.2e}"


def _raw_text(raw: float | None) -> str:
    return "" if raw is None else repr(raw)


def _title(raw: float | None) -> str:
    return "" if raw is None else f' title="{_esc(repr(raw))}"'


def _cell_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell_text(v) for v in value)
    if isinstance(value, float):
        return _number(value)
    return str(value)


# ---- study tables ---------------------------------------------------------------------------


def _study_table(study: Study) -> tuple[pd.DataFrame | None, str]:
    try:
        return study.table, ""
    except DamagedFileError:
        raise
    except ConfigError as exc:
        return None, str(exc)


def _add_study_tables(page: _Page, study: Study, table: pd.DataFrame | None, error: str) -> None:
    name = "capacity.csv" if study.kind == "capacity" else "sweep.csv"
    title = "Capacity" if study.kind == "capacity" else "Points"
    if table is None:
        page.add("table", title, f"<p class=note>{_esc(error)}</p>")
        return
    intro = (
        "One row per configuration: the highest arrival rate it sustains and its summary at "
        "that rate."
        if study.kind == "capacity"
        else "One row per point: the varied keys and the point's summary."
    )
    page.add("table", title, _data_table(table, "table-main", name, intro))
    if study.kind == "sweep":
        try:
            stats = study.stats
        except DamagedFileError:
            raise
        except ConfigError as exc:
            page.add("stats", "Over seeds", f"<p class=note>{_esc(exc)}</p>")
            return
        if stats is not None:
            intro = (
                "One row per configuration: each metric's mean over the seeds ± "
                "<code>METRIC_ci95</code>, the half-width of its 95 % confidence interval."
            )
            table_html = _data_table(stats, "table-stats", "sweep_stats.csv", intro, with_ci=True)
            page.add("stats", "Over seeds", table_html)


def _data_table(
    frame: pd.DataFrame, table_id: str, file_name: str, intro: str, *, with_ci: bool = False
) -> str:
    """A sortable table of a study CSV. With ``with_ci``, a column ``X`` that has an
    ``X_ci95`` beside it shows ``mean ± ci95`` in one cell (sorted by the mean)."""
    shown = frame.head(MAX_TABLE_ROWS)
    names = [str(c) for c in shown.columns]
    values = {name: shown[column].tolist() for name, column in zip(names, shown.columns)}
    paired = {n for n in names if with_ci and f"{n}_ci95" in values}
    columns = [n for n in names if not (n.endswith("_ci95") and n[: -len("_ci95")] in paired)]
    cells: list[list[str]] = []
    numeric_columns = []
    for name in columns:
        formatted = [_format(name, v) for v in values[name]]
        numeric = any(raw is not None for _, raw in formatted)
        numeric_columns.append(numeric)
        ci = [_format(name, v)[0] for v in values[f"{name}_ci95"]] if name in paired else None
        column = []
        for i, (text, raw) in enumerate(formatted):
            if ci is not None and raw is not None and ci[i] != "–":
                text = f"{text} ± {ci[i]}"
            if not numeric:
                wrap = len(text) > WRAP_CHARS
                column.append(
                    f"<td><div class=wrap>{_esc(text)}</div></td>"
                    if wrap
                    else f"<td>{_esc(text)}</td>"
                )
            elif raw is not None:
                number = _esc(repr(raw))
                column.append(f'<td class=n data-v="{number}" title="{number}">{_esc(text)}</td>')
            elif _missing(values[name][i]):
                column.append(f'<td class=n data-v="">{_esc(text)}</td>')
            else:
                column.append(f"<td class=n>{_esc(text)}</td>")
        cells.append(column)
    head = "".join(
        f'<th scope=col data-col="{_esc(c)}"{" class=n" if n else ""}>'
        f"<button type=button>{_breakable(c)}</button></th>"
        for c, n in zip(columns, numeric_columns)
    )
    rows = ["<tr>" + "".join(column[i] for column in cells) + "</tr>" for i in range(len(shown))]
    count = f"{len(frame):,} rows × {len(frame.columns)} columns"
    if len(frame) > len(shown):
        count = (
            f"the first {len(shown):,} of {len(frame):,} rows × {len(frame.columns)} columns "
            f"(sorting sorts these; <code>{_esc(file_name)}</code> holds all)"
        )
    return (
        f"<p class=caption>{intro} From <code>{_esc(file_name)}</code>: {count}. "
        "Click a column header to sort by it; click again to reverse.</p>\n"
        f'<div class="scroll"><table class="data sortable" id="{table_id}">'
        f"<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody></table></div>"
    )


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _breakable(name: str) -> str:
    """A column name that may wrap after ``_`` and ``.``."""
    return re.sub(r"([_.])", r"\1<wbr>", _esc(name))
