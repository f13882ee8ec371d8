"""``batchsim report DIR``: one self-contained HTML page of a run, a sweep or a capacity study.

The page holds everything inline — CSS, a small script that sorts the study tables, and the
figures — so it can be mailed, archived or opened offline: it references no font, stylesheet,
script or image outside itself and makes no network request.

**Figures are inline SVG.** Line and bar figures stay sharp at any zoom and on print, their
text is drawn as paths (``svg.fonttype: path``, so no font has to be available), and a few
figures of a run or a study are tens of kilobytes each, smaller than the same figures as PNG at
a comparable resolution. Every figure's element ids get a per-figure prefix, as a page is one
id namespace. One exception: a figure whose SVG exceeds
:data:`~batchsim.plots.report_figures.SVG_MAX_CHARS` (a scatter of every iteration of a long
run draws one element per point) is embedded as a base64 PNG, which a browser shows at once
where hundreds of thousands of SVG elements would make it crawl.

The page is deterministic: the same folder gives the same bytes (no dates; SVG ids are salted
with a fixed string).

This module assembles the page: its header, sections and config. The frame (table of
contents, CSS, script) is :mod:`~batchsim.plots.report_page`, the tables
:mod:`~batchsim.plots.report_tables`, the figures :mod:`~batchsim.plots.report_figures`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError, write_error
from batchsim.plots.data import Run, Study, load
from batchsim.plots.report_figures import _add_figures
from batchsim.plots.report_page import _code_list, _esc, _meta, _Page
from batchsim.plots.report_tables import (
    _add_study_tables,
    _cell_text,
    _data_table,
    _number,
    _study_table,
    _summary,
)
from batchsim.plots.style import describe_run
from batchsim.version import __version__

if TYPE_CHECKING:
    import pandas as pd


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
