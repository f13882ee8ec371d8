"""The frame of a ``batchsim report`` page: its sections in order under a table of contents
(:class:`_Page`), the inline CSS and the small script that sorts the study tables, and the
HTML escaping every part of the page goes through.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

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
