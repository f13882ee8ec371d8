"""The figures of a ``batchsim report`` page: every figure kind that can draw the folder,
embedded as inline SVG with its element ids prefixed (one id namespace per page), or as a
base64 PNG when its SVG is too large for a browser to show quickly.
"""

from __future__ import annotations

import base64
import io
import re
from typing import TYPE_CHECKING

import batchsim.plots as plots
from batchsim.errors import ConfigError, DamagedFileError
from batchsim.plots.report_page import _esc, _Page
from batchsim.plots.style import DPI

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from batchsim.plots.data import Run, Study

SVG_MAX_CHARS = 2_000_000
"""A figure's SVG above this size is embedded as a PNG instead."""


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
        except DamagedFileError:
            raise  # a table cut short is an error of the report, not a note of one figure
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

    svg = ""
    if svg_chars_estimate(fig) <= SVG_MAX_CHARS:  # else writing the SVG would be wasted
        buffer = io.StringIO()
        with matplotlib.rc_context({"svg.hashsalt": "batchsim", "svg.fonttype": "path"}):
            fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": "batchsim"})
        svg = buffer.getvalue()
    if not svg or len(svg) > SVG_MAX_CHARS:
        data = io.BytesIO()
        fig.savefig(data, format="png", dpi=DPI * 1.5, metadata={"Software": "batchsim"})
        encoded = base64.b64encode(data.getvalue()).decode("ascii")
        return f'<img alt="{_esc(label)} figure" src="data:image/png;base64,{encoded}">'
    return _inline_svg(svg, prefix, label)


SVG_CHARS_PER_PATH = 150
"""About what matplotlib's SVG spends on one path of a collection (a bar, a box, a polygon)."""
SVG_CHARS_PER_POINT = 12
"""About what it spends on one vertex of a line or one marker of a scatter."""


def svg_chars_estimate(fig: Figure) -> int:
    """About how many characters ``fig``'s SVG takes, counting its paths and points alone
    (text and axes add more): a figure of tens of thousands of boxes (a long run's timeline)
    is known to be too large before a second or more goes into writing an SVG only to drop
    it. The SVG written is still measured, so an estimate too low costs time, not size."""
    import numpy as np

    chars = 0
    for ax in fig.axes:
        for collection in ax.collections:
            offsets = np.asarray(collection.get_offsets())
            chars += SVG_CHARS_PER_PATH * len(collection.get_paths())
            chars += SVG_CHARS_PER_POINT * (len(offsets) if offsets.ndim == 2 else 0)
        for line in ax.lines:
            chars += SVG_CHARS_PER_POINT * np.size(line.get_xdata(orig=False))
        chars += SVG_CHARS_PER_PATH * len(ax.patches)
    return chars


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
