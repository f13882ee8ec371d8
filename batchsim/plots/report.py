"""``batchsim report DIR``: one self-contained HTML page of a run, a sweep or a capacity study.

The page holds everything inline — CSS, a small script that sorts the study tables, and the
figures — so it can be mailed, archived or opened offline: it references no font, stylesheet,
script or image outside itself and makes no network request.

**Figures are inline SVG.** Line and bar figures stay sharp at any zoom and on print, their
text is drawn as paths (``svg.fonttype: path``, so no font has to be available), and a few
figures of a run or a study are tens of kilobytes each, smaller than the same figures as PNG at
a comparable resolution. Every figure's element ids get a per-figure prefix, as a page is one
id namespace. One exception: a figure whose SVG exceeds :data:`SVG_MAX_CHARS` (a scatter of
every iteration of a long run draws one element per point) is embedded as a base64 PNG, which
a browser shows at once where hundreds of thousands of SVG elements would make it crawl.

The page is deterministic: the same folder gives the same bytes (no dates; SVG ids are salted
with a fixed string).
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import math
import numbers
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import batchsim.plots as plots
from batchsim.errors import ConfigError, write_error
from batchsim.plots.data import Run, Study, load
from batchsim.plots.style import DPI, describe_run
from batchsim.version import __version__

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

SVG_MAX_CHARS = 2_000_000
"""A figure's SVG above this size is embedded as a PNG instead."""
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


def write_report(path: str | Path, out: str | Path) -> Path:
    """Write the report of the result folder ``path`` to ``out``, whole or not at all.

    Returns:
        The path written.

    Raises:
        ConfigError: ``path`` is not a result folder (from :func:`batchsim.plots.data.load`),
            one of its files cannot be read, or ``out`` cannot be written (with the OS reason).
    """
    page = render(load(path))
    target = Path(out)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        if not target.parent.exists():  # a file in the way fails below, as ENOTDIR
            target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(page.encode("utf-8"))
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(target, exc) from exc
    return target


def render(source: Run | Study) -> str:
    """The HTML page of a loaded run or study."""
    page = _Page()
    if isinstance(source, Run):
        title, header = _run_header(source)
        page.add("summary", "Summary", _summary(source.summary))
        if source.has_table("replicas"):  # a cluster run
            intro = "One row per replica of the cluster, over the summary's counting window."
            replicas = _data_table(source.replicas, "table-replicas", "replicas.csv", intro)
            page.add("replicas", "Replicas", replicas)
        _add_figures(page, source)
        config_text, config_note = _run_config(source)
    else:
        title, header = _study_header(source)
        table, table_error = _study_table(source)
        _add_figures(page, source)
        _add_study_tables(page, source, table, table_error)
        config_text, config_note = _study_config(source, table)
    page.add("config", "Config", _config(config_text, config_note))
    return page.html(title, header, __version__)


# ---- page -----------------------------------------------------------------------------------


class _Page:
    """Sections in order; each is listed in the table of contents."""

    def __init__(self) -> None:
        self.sections: list[tuple[str, str, str, int]] = []

    def add(self, anchor: str, title: str, body: str, level: int = 2) -> None:
        self.sections.append((anchor, title, body, level))

    def html(self, title: str, header: str, version: str) -> str:
        toc = ["<nav class=toc aria-label=Contents><h2>Contents</h2><ul>"]
        depth = 2
        for i, (anchor, name, _, level) in enumerate(self.sections):
            if level > depth:
                toc.append("<ul>")
            elif level < depth:
                toc.append("</li></ul></li>")
            elif i:
                toc.append("</li>")
            depth = level
            toc.append(f'<li><a href="#{anchor}">{_esc(name)}</a>')
        toc.append("</li>" + "</ul></li>" * (depth - 2) + "</ul></nav>")
        body = [
            f"<h{level} id={anchor}>{_esc(name)}</h{level}>\n{content}"
            for anchor, name, content, level in self.sections
        ]
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="batchsim {_esc(version)}">\n'
            f"<title>{_esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
            f"<header>\n{header}\n</header>\n"
            + "".join(toc)
            + "\n"
            + "\n".join(body)
            + f"\n<footer>Written by batchsim {_esc(version)} (<code>batchsim report</code>)."
            "</footer>\n</main>\n"
            f"<script>{SCRIPT}</script>\n</body>\n</html>\n"
        )


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _meta(items: Iterable[tuple[str, str]]) -> str:
    """A definition list of (label, HTML) pairs; the values must already be escaped."""
    rows = "".join(f"<dt>{_esc(k)}</dt><dd>{v}</dd>" for k, v in items if v)
    return f"<dl class=meta>{rows}</dl>"


def _code_list(values: Iterable[Any]) -> str:
    return ", ".join(f"<code>{_esc(v)}</code>" for v in values)


# ---- headers --------------------------------------------------------------------------------


def _run_header(run: Run) -> tuple[str, str]:
    config = run.config
    name = str(config.get("name") or run.path.name)
    items = [
        ("simulated", _esc(describe_run(config)) if config else ""),
        ("folder", f"<code>{_esc(run.path.resolve())}</code>"),
        ("batchsim", _esc(__version__)),
    ]
    return f"{name} — batchsim run", _header_html(f"Run {name}", config, items)


def _study_header(study: Study) -> tuple[str, str]:
    marker = study.marker
    config = _safe_base_config(study)
    name = str(config.get("name") or study.path.name)
    what = "Sweep" if study.kind == "sweep" else "Capacity study"
    axes = []
    for axis in marker.get("axes") or []:
        keys = list(axis.get("keys") or [])
        rows = list(axis.get("values") or [])
        values = ", ".join(_esc(_axis_value(row)) for row in rows[:12])
        more = f", … ({len(rows)} values)" if len(rows) > 12 else ""
        names = _code_list(keys) if len(keys) == 1 else f"({_code_list(keys)})"
        axes.append(f"{names} = {values}{more}")
    described = config
    if study.kind == "capacity" and isinstance(config.get("workload"), dict):
        # the rate is what the search varies: describe the load without the first point's
        workload = config["workload"]
        arrival = {k: v for k, v in (workload.get("arrival") or {}).items() if k != "rate"}
        described = {**config, "workload": {**workload, "arrival": arrival}}
    items = [
        (
            f"first {'point' if study.kind == 'sweep' else 'configuration'}",
            _esc(describe_run(described)) if config else "",
        ),
        ("varied", "<br>".join(axes) or _code_list(study.varied) or "nothing (the base only)"),
    ]
    num = marker.get("num_points")
    if study.kind == "sweep":
        seeds = marker.get("seeds") or 1
        items.append(("points", _esc(f"{num:,}" if isinstance(num, int) else num or "?")))
        if seeds > 1:
            items.append(("seeds", _esc(f"{seeds} per configuration")))
    else:
        items.append(("configurations", _esc(f"{num:,}" if isinstance(num, int) else num or "?")))
        items.append(("searched", f"<code>{_esc(marker.get('rate_key', 'rate'))}</code>"))
        items.append(("SLO", _slo_text(marker)))
    if marker.get("experiment"):
        items.append(("experiment", f"<code>{_esc(marker['experiment'])}</code>"))
    items.append(("folder", f"<code>{_esc(study.path.resolve())}</code>"))
    written_by = marker.get("batchsim_version")
    version = __version__
    if written_by and written_by != __version__:
        version += f" (the study was written by batchsim {written_by})"
    items.append(("batchsim", _esc(version)))
    title = f"{what} {name}"
    return f"{name} — batchsim {what.lower()}", _header_html(title, config, items)


def _axis_value(row: Any) -> str:
    """One value of an axis; a zip group's values in parentheses."""
    if isinstance(row, (list, tuple)) and len(row) == 1:
        return _cell_text(row[0])
    if isinstance(row, (list, tuple)):
        return f"({', '.join(_cell_text(v) for v in row)})"
    return _cell_text(row)


def _header_html(title: str, config: Mapping[str, Any], items: list[tuple[str, str]]) -> str:
    description = str(config.get("description") or "").strip()
    parts = [f"<h1>{_esc(title)}</h1>"]
    if description:
        parts.append(f"<p class=description>{_esc(description)}</p>")
    parts.append(_meta(items))
    return "\n".join(parts)


def _slo_text(marker: Mapping[str, Any]) -> str:
    slo = marker.get("slo") or {}
    limits = [f"<code>{_esc(k)}</code> ≤ {_esc(_number(v))} ms" for k, v in slo.items()]
    text = ", ".join(limits) or "none"
    attainment = marker.get("attainment")
    if attainment is not None:
        text += _esc(f" for at least {_number(attainment * 100)} % of the requests")
    growth = marker.get("max_queue_growth")
    if growth is not None:
        text += f"; <code>queue_delay_growth</code> ≤ {_esc(_number(growth))} s/s"
    return text


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


# ---- figures --------------------------------------------------------------------------------


def _add_figures(page: _Page, source: Run | Study) -> None:
    kinds = [(kind, plots.module(kind)) for kind in plots.relevant_kinds(source)]
    if not kinds:
        page.add("figures", "Figures", "<p class=muted>No figure kind draws this folder.</p>")
        return
    page.add("figures", "Figures", "")
    for index, (kind, draw) in enumerate(kinds):
        caption = f"<p class=caption>{_esc(plots.KINDS[kind][1])}</p>"
        try:
            fig = draw.plot([source], plots.PlotOptions())
        except ConfigError as exc:
            body = f"{caption}\n<p class=note>Not drawn: {_esc(exc)}</p>"
        else:
            body = f"{caption}\n<figure>{_embed(fig, f'f{index}-', kind)}</figure>"
        page.add(f"figure-{_slug(kind)}", kind, body, level=3)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text)


def _embed(fig: Figure, prefix: str, label: str) -> str:
    """The figure as inline SVG (ids prefixed), or as a PNG data URI when the SVG is large."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "batchsim", "svg.fonttype": "path"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "batchsim"})
    svg = buffer.getvalue()
    if len(svg) > SVG_MAX_CHARS:
        data = io.BytesIO()
        fig.savefig(data, format="png", dpi=DPI * 1.5, metadata={"Software": "batchsim"})
        encoded = base64.b64encode(data.getvalue()).decode("ascii")
        return f'<img alt="{_esc(label)} figure" src="data:image/png;base64,{encoded}">'
    return _inline_svg(svg, prefix, label)


_ID = re.compile(r'\bid="([^"]+)"')


def _inline_svg(svg: str, prefix: str, label: str) -> str:
    """An SVG document made fit for inlining in HTML: no XML prolog, doctype or metadata,
    every id (and every reference to one) prefixed and unique, sized by CSS from its
    viewBox."""
    start = svg.find("<svg")
    if start < 0:
        raise ValueError("matplotlib wrote no <svg> element")
    svg = svg[start:]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, count=1, flags=re.S)
    ids = set(_ID.findall(svg))

    def ref(match: re.Match[str]) -> str:
        name = match.group(2)
        return f"{match.group(1)}{prefix}{name}" if name in ids else match.group(0)

    seen: dict[str, int] = {}

    def unique(match: re.Match[str]) -> str:
        # a repeated id (an artist's gid given to several lines) gets a counter: ids must be
        # unique in the page; references point at the first
        name = match.group(1)
        seen[name] = seen.get(name, 0) + 1
        suffix = f"-{seen[name]}" if seen[name] > 1 else ""
        return f'id="{prefix}{name}{suffix}"'

    svg = _ID.sub(unique, svg)
    svg = re.sub(r"(url\(#)([^)\"']+)", ref, svg)
    svg = re.sub(r'((?:xlink:)?href="#)([^"]+)', ref, svg)
    end = svg.index(">")
    root = re.sub(r'\s(?:width|height)="[^"]*"', "", svg[:end])
    root += f' role="img" aria-label="{_esc(label)} figure"'
    return root + svg[end:].rstrip()


# ---- study tables ---------------------------------------------------------------------------


def _study_table(study: Study) -> tuple[pd.DataFrame | None, str]:
    try:
        return study.table, ""
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


# ---- config ---------------------------------------------------------------------------------


def _run_config(run: Run) -> tuple[str, str]:
    from batchsim.yamlio import dump, read_text

    path = run.path / "config.yaml"
    if path.is_file():
        return read_text(path), "config.yaml of the run: rerun it with batchsim run."
    if run.config:
        return dump(run.config), "The config in summary.json (the run has no config.yaml)."
    return "", "The run has no config.yaml and its summary.json no config."


def _safe_base_config(study: Study) -> dict[str, Any]:
    try:
        return study.base_config
    except ConfigError:
        return {}


def _study_config(study: Study, table: pd.DataFrame | None) -> tuple[str, str]:
    from batchsim.yamlio import read_text

    if table is not None and "point" in table:
        for name in table["point"]:
            if not isinstance(name, str) or not name:
                continue
            path = study.path / "points" / name / "config.yaml"
            if path.is_file():
                varied = "varied keys" if study.kind == "sweep" else "varied keys and the rate"
                return read_text(path), (
                    f"The resolved config of the first point ({name}); the {varied} differ "
                    "from point to point."
                )
    return "", "No point of the study has a config.yaml."


def _config(text: str, note: str) -> str:
    parts = [f"<p class=caption>{_esc(note)}</p>"]
    if text:
        parts.append(f"<pre class=config>{_esc(text.rstrip())}</pre>")
    return "\n".join(parts)


# ---- inline CSS and script ------------------------------------------------------------------

CSS = """
:root { --fg: #1d1d1f; --muted: #5f6368; --line: #dadce0; --head: #f1f3f4; --accent: #0072B2; }
* { box-sizing: border-box; }
html { color-scheme: light; }
body { margin: 0; background: #fff; color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 1.7rem; margin: 0 0 .4rem; }
h2 { font-size: 1.3rem; margin: 2.2rem 0 .6rem; padding-bottom: .25rem;
  border-bottom: 1px solid var(--line); }
h3 { font-size: 1.08rem; margin: 1.6rem 0 .2rem; }
code, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono",
  monospace; font-size: .88em; }
a { color: var(--accent); }
.muted, .unit { color: var(--muted); }
.description { font-size: 1.05rem; margin: 0 0 .6rem; white-space: pre-line; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1.2rem;
  margin: .6rem 0; }
dl.meta dt { color: var(--muted); }
dl.meta dd { margin: 0; overflow-wrap: anywhere; }
nav.toc { background: var(--head); border-radius: 6px; padding: .6rem 1.2rem; margin: 1.2rem 0; }
nav.toc h2 { font-size: 1rem; margin: 0 0 .2rem; border: 0; padding: 0; }
nav.toc ul { margin: 0; padding-left: 1.2rem; }
.caption { color: var(--muted); margin: .1rem 0 .6rem; }
.note { background: #fff5e6; border-left: 4px solid #E69F00; padding: .4rem .8rem;
  margin: .4rem 0; overflow-wrap: anywhere; }
figure { margin: .4rem 0 1.2rem; }
figure svg, figure img { display: block; width: 100%; max-width: 960px; height: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 0 0 .3rem; }
th, td { padding: .22rem .6rem; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: top; }
th { font-weight: 600; }
.n { text-align: right; white-space: nowrap; }
.groups { display: grid; grid-template-columns: repeat(auto-fit, minmax(330px, 1fr));
  gap: 1.2rem 2.4rem; align-items: start; margin: 0 0 1.2rem; }
table.kv { width: 100%; }
table.kv th { font-weight: normal; }
table.kv td.unit { width: 3.5rem; padding-left: .2rem; }
table.latency { margin: 0 0 1.2rem; }
table.latency th[scope=row] { font-weight: normal; }
.scroll-x { overflow-x: auto; }
.scroll { overflow: auto; max-height: 75vh; border: 1px solid var(--line); margin: 0 0 1rem; }
table.data { font-size: .85rem; }
table.data th { position: sticky; top: 0; z-index: 1; background: var(--head);
  vertical-align: bottom;
  box-shadow: inset 0 -1px 0 var(--line); }
table.data { width: max-content; }
table.data td { white-space: nowrap; }
table.data td .wrap { white-space: normal; min-width: 14rem; max-width: 24rem;
  overflow-wrap: anywhere; }
table.data tbody tr:nth-child(even) { background: #fafafa; }
table.data tbody tr:hover { background: #eef5fb; }
th button { all: unset; cursor: pointer; display: block; max-width: 9rem; }
th.n button { margin-left: auto; }
th button:focus-visible { outline: 2px solid var(--accent); outline-offset: 2px; }
th[aria-sort=ascending] button::after { content: " \\25B2"; color: var(--accent); }
th[aria-sort=descending] button::after { content: " \\25BC"; color: var(--accent); }
pre.config { background: #f7f7f8; border: 1px solid var(--line); border-radius: 4px;
  padding: .8rem 1rem; overflow: auto; max-height: 75vh; font-size: .82rem; line-height: 1.4; }
footer { margin-top: 2.4rem; color: var(--muted); font-size: .85rem; }
"""

SCRIPT = """
(function () {
  "use strict";
  // Sort a study table by the clicked column: numbers by value, text in natural order,
  // missing values last in either direction; a second click reverses.
  function sortKey(cell) {
    var v = cell.getAttribute("data-v");
    if (v === null) {
      var text = cell.textContent;
      return text === "" ? null : text;
    }
    if (v === "") return null;
    var n = Number(v);
    return isNaN(n) ? null : n;
  }
  function compare(a, b) {
    var an = typeof a === "number", bn = typeof b === "number";
    if (an && bn) return a - b;
    if (an !== bn) return an ? -1 : 1;
    return a.localeCompare(b, undefined, {numeric: true});
  }
  function sortBy(th) {
    var table = th.closest("table"), column = th.cellIndex;
    var descending = th.getAttribute("aria-sort") === "ascending";
    var headers = table.tHead.rows[0].cells;
    for (var i = 0; i < headers.length; i++) headers[i].removeAttribute("aria-sort");
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    var body = table.tBodies[0];
    var rows = Array.prototype.map.call(body.rows, function (row, index) {
      return {row: row, key: sortKey(row.cells[column]), index: index};
    });
    rows.sort(function (x, y) {
      if (x.key === null || y.key === null) {
        if (x.key === y.key) return x.index - y.index;
        return x.key === null ? 1 : -1;
      }
      var c = compare(x.key, y.key);
      return (descending ? -c : c) || x.index - y.index;
    });
    var fragment = document.createDocumentFragment();
    rows.forEach(function (r) { fragment.appendChild(r.row); });
    body.appendChild(fragment);
  }
  var buttons = document.querySelectorAll("table.sortable thead th button");
  Array.prototype.forEach.call(buttons, function (button) {
    button.addEventListener("click", function () { sortBy(button.parentNode); });
  });
  // report.html?sort=COLUMN clicks that column's header (in every table that has it) once
  // per occurrence: a link to a sorted view, and a hook for tests in headless browsers.
  var names = new URLSearchParams(window.location.search).getAll("sort");
  names.forEach(function (name) {
    Array.prototype.forEach.call(buttons, function (button) {
      if (button.parentNode.getAttribute("data-col") === name) button.click();
    });
  });
  document.documentElement.setAttribute("data-report-ready", "");
})();
"""
