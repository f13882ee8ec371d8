"""``batchsim report``: one self-contained HTML page of a run, a sweep or a capacity study.

The page is checked as text (sections, escaping, no external references, unique SVG ids,
atomic writing, errors) and in a real headless Chromium: no console message from the page, a
screenshot of the expected size that shows the figures, sortable tables that sort, and no
network request. The figure kinds live in their own modules; the tests register small fake
kinds so that the figure path is exercised whichever real kinds exist.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import batchsim
import batchsim.plots as plots
from batchsim import cli
from batchsim.errors import ConfigError
from batchsim.plots import report, report_figures, report_tables
from batchsim.plots.data import Run
from batchsim.plots.report import write_report
from batchsim.plots.style import OKABE_ITO, finish, new_figure
from batchsim.studies.backends import InlineExecutor
from conftest import tiny_experiment

HOSTILE = '<script>alert("boom")</script> & <b>bold</b>'
"""User text that must appear as text, never as markup."""


def _small(**overrides: Any) -> dict[str, Any]:
    exp = tiny_experiment(**overrides)
    exp["workload"] = {**exp["workload"], "num_requests": 20}
    return exp


# ---- result folders (made once per module) -------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    batchsim.run(_small(description=HOSTILE)).write(out)
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    batchsim.sweep(
        _small(),
        {"scheduler.max_num_seqs": [4, 16], "description": [HOSTILE, "plain"]},
        seeds=2,
        executor=InlineExecutor(),
        out_dir=out,
    )
    return out


@pytest.fixture(scope="module")
def capacity_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("capacity") / "capacity"
    batchsim.capacity(
        _small(),
        {"p99_ttft_ms": 2000},
        {"scheduler.policy": ["static", "continuous"]},
        executor=InlineExecutor(),
        out_dir=out,
    )
    return out


# ---- fake figure kinds ---------------------------------------------------------------------


def _plot_line(sources: list[Any], options: plots.PlotOptions) -> Any:
    fig, ax = new_figure()
    source = sources[0]
    if isinstance(source, Run):
        frame = source.iterations
        ax.plot(frame["start_time_s"], frame["num_seqs"], color=OKABE_ITO[0], label="num_seqs")
    else:
        values = source.table["output_throughput"].to_numpy()
        ax.plot(np.arange(len(values)), values, color=OKABE_ITO[0], marker="o", label="tok/s")
    ax.fill_between([0, 1], [0, 0], [1, 1], color=OKABE_ITO[1], alpha=0.8, label="block")
    ax.set_title(HOSTILE)  # text of a figure comes from user data too
    finish(ax)
    return fig


def _plot_refuses(sources: list[Any], options: plots.PlotOptions) -> Any:
    raise ConfigError(f"{sources[0].path}: no slots.csv; rerun with <record_slots>")


def _module(name: str, plot: Any) -> types.ModuleType:
    module = types.ModuleType(f"batchsim.plots.{name}")
    module.applies = lambda source: True  # type: ignore[attr-defined]
    module.plot = plot  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_kinds(monkeypatch) -> dict[str, tuple[str, str]]:
    """Only three kinds: one that draws, one that refuses the folder (ConfigError) and one
    whose module does not exist (left out of the page)."""
    for kind in list(plots.KINDS):  # the real kinds have tests of their own below
        monkeypatch.setitem(plots.KINDS, kind, (f"test_absent_{kind.replace('-', '_')}", "x"))
    kinds = {
        "fake-line": ("test_fake_line", "a fake line figure drawn by the test"),
        "fake-refuses": ("test_fake_refuses", "a fake figure that cannot draw this folder"),
        "fake-missing": ("test_fake_missing_module", "a kind whose module is not there"),
    }
    for kind, entry in kinds.items():
        monkeypatch.setitem(plots.KINDS, kind, entry)
    monkeypatch.setitem(
        sys.modules, "batchsim.plots.test_fake_line", _module("test_fake_line", _plot_line)
    )
    monkeypatch.setitem(
        sys.modules,
        "batchsim.plots.test_fake_refuses",
        _module("test_fake_refuses", _plot_refuses),
    )
    return kinds


@pytest.fixture
def no_real_kinds(monkeypatch) -> None:
    """Every registered kind points at a module that does not exist."""
    for kind in list(plots.KINDS):
        monkeypatch.setitem(plots.KINDS, kind, (f"test_absent_{kind.replace('-', '_')}", "x"))


# ---- the page as text ------------------------------------------------------------------------


def test_run_report_has_header_summary_figures_and_config(run_dir, tmp_path, fake_kinds):
    out = write_report(run_dir, tmp_path / "report.html")
    assert out == tmp_path / "report.html"
    page = out.read_text(encoding="utf-8")
    assert page.startswith('<!DOCTYPE html>\n<html lang="en">')
    assert '<meta charset="utf-8">' in page
    # header: what was run, version, folder
    assert "llama-2-7b on a100-80gb, continuous, Poisson 5 req/s, 20 requests" in page
    assert f"<dd>{batchsim.__version__}</dd>" in page
    assert str(run_dir.resolve()) in page
    # the summary under summary.json's names, grouped, numbers formatted
    for group in ("Counts", "Throughput", "Latency (ms)", "batchsim&#x27;s own"):
        assert group in page
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("completed", "output_throughput", "compute_bound_fraction", "wall_time_s"):
        assert f"<code>{key}</code>" in page
    assert 'title="p99_ttft_ms: ' in page
    assert f"{summary['compute_bound_fraction'] * 100:.1f} %" in page
    tokens = summary["total_input_tokens"]
    assert f'<td class=n title="{float(tokens)!r}">{tokens:,}</td>' in page
    # figures: drawn inline, refused as a note, missing module left out
    assert "<h3 id=figure-fake-line>fake-line</h3>" in page
    assert "a fake line figure drawn by the test" in page
    assert page.count("<svg") == 1 and "<?xml" not in page and "<!DOCTYPE svg" not in page
    assert "<metadata>" not in page
    assert "<p class=note>Not drawn: " in page and "rerun with &lt;record_slots&gt;" in page
    assert "fake-missing" not in page
    # table of contents links every section
    for anchor in ("summary", "figures", "figure-fake-line", "figure-fake-refuses", "config"):
        assert f'<a href="#{anchor}">' in page
        assert f" id={anchor}>" in page
    # the resolved config, escaped
    assert "<pre class=config>name: tiny\n" in page
    assert "description: &lt;script&gt;alert(&quot;boom&quot;)&lt;/script&gt; &amp;" in page


def test_user_text_is_escaped_everywhere(run_dir, sweep_dir, tmp_path, fake_kinds):
    for folder in (run_dir, sweep_dir):
        page = write_report(folder, tmp_path / f"{folder.name}.html").read_text()
        assert "alert(" in page
        # the only script element is the page's own, at the end of the body
        assert page.count("<script") == 1
        assert "<b>bold" not in page
        assert "&lt;script&gt;alert(&quot;boom&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold" in page
    # a varied value in the sweep table is a cell's text
    assert "<td><div class=wrap>&lt;script&gt;alert(&quot;boom&quot;)" in page


def _attribute_values(page: str, name: str) -> list[str]:
    return re.findall(rf"\s{name}\s*=\s*[\"']?([^\"'\s>]*)", page, flags=re.I)


def _assert_self_contained(page: str) -> None:
    lowered = page.lower()
    assert "<link" not in lowered and "@import" not in lowered and "<iframe" not in lowered
    assert not re.search(r"<script[^>]*\ssrc", lowered)
    assert not re.search(r"url\((?!#)", lowered), "a CSS or SVG url() that is not a local id"
    for value in _attribute_values(page, "src"):
        assert value.startswith("data:image/png;base64,"), value
    for value in _attribute_values(page, "href") + _attribute_values(page, "xlink:href"):
        assert value.startswith("#"), value
    # the only absolute URLs are the SVG namespace names (never fetched)
    for match in re.finditer(r"https?://[^\s\"'<>]*", page):
        before = page[max(0, match.start() - 20) : match.start()]
        assert re.search(r"xmlns(:\w+)?=\"$", before), match.group(0)


def _assert_ids_unique_and_resolved(page: str) -> None:
    ids = re.findall(r'\sid="?([^"\s>]+)', page)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)[:5]
    references = re.findall(r"url\(#([^)]+)\)", page) + re.findall(r'href="#([^"]+)"', page)
    assert references
    assert set(references) <= set(ids)


def test_page_is_self_contained_with_unique_ids(run_dir, sweep_dir, tmp_path, fake_kinds):
    for folder in (run_dir, sweep_dir):
        page = write_report(folder, tmp_path / f"{folder.name}.html").read_text()
        _assert_self_contained(page)
        _assert_ids_unique_and_resolved(page)


def test_two_figures_get_distinct_ids(run_dir, tmp_path, fake_kinds, monkeypatch):
    monkeypatch.setitem(plots.KINDS, "fake-line-2", ("test_fake_line", "the same drawing again"))
    page = write_report(run_dir, tmp_path / "r.html").read_text()
    assert page.count("<svg") == 2
    _assert_ids_unique_and_resolved(page)
    assert len(set(re.findall(r'id="(f\d+-)', page))) == 2


def test_same_folder_gives_the_same_bytes(run_dir, tmp_path, fake_kinds):
    first = write_report(run_dir, tmp_path / "a.html").read_bytes()
    second = write_report(run_dir, tmp_path / "b.html").read_bytes()
    assert first == second


def test_real_kinds_missing_are_left_out(run_dir, sweep_dir, tmp_path, no_real_kinds):
    for folder in (run_dir, sweep_dir):
        page = write_report(folder, tmp_path / f"{folder.name}.html").read_text()
        assert "No figure kind draws this folder." in page
        assert "<svg" not in page
        assert "<pre class=config>" in page


def test_report_with_the_registered_kinds(run_dir, sweep_dir, capacity_dir, tmp_path):
    """Whichever real kinds this batchsim has: each draws or says why not; none fails."""
    for folder in (run_dir, sweep_dir, capacity_dir):
        page = write_report(folder, tmp_path / f"{folder.name}.html").read_text()
        _assert_self_contained(page)
        if "<svg" in page:
            _assert_ids_unique_and_resolved(page)


def test_an_import_error_that_is_not_a_missing_kind_propagates(run_dir, tmp_path, monkeypatch):
    def broken(kind: str) -> Any:
        raise ModuleNotFoundError("No module named 'scipy_x'", name="scipy_x")

    monkeypatch.setattr(plots, "module", broken)
    with pytest.raises(ModuleNotFoundError, match="scipy_x"):
        write_report(run_dir, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()

    def cannot_import(kind: str) -> Any:
        raise ImportError("cannot import name 'thing' from 'batchsim.plots.style'")

    monkeypatch.setattr(plots, "module", cannot_import)
    with pytest.raises(ImportError, match="cannot import name"):
        write_report(run_dir, tmp_path / "r.html")


def test_a_figure_that_fails_for_a_bug_propagates(run_dir, tmp_path, fake_kinds, monkeypatch):
    def buggy(sources: list[Any], options: plots.PlotOptions) -> Any:
        raise KeyError("num_seqs")

    monkeypatch.setattr(sys.modules["batchsim.plots.test_fake_line"], "plot", buggy)
    with pytest.raises(KeyError):
        write_report(run_dir, tmp_path / "r.html")
    assert list(tmp_path.iterdir()) == []


def test_large_figure_is_embedded_as_png(run_dir, tmp_path, fake_kinds, monkeypatch):
    monkeypatch.setattr(report_figures, "SVG_MAX_CHARS", 1000)
    page = write_report(run_dir, tmp_path / "r.html").read_text()
    assert "<svg" not in page
    match = re.search(r'<img alt="fake-line figure" src="data:image/png;base64,([^"]+)">', page)
    assert match
    assert base64.b64decode(match.group(1)).startswith(b"\x89PNG\r\n\x1a\n")
    _assert_self_contained(page)


def test_figure_estimated_too_large_for_svg_is_drawn_once_as_png(monkeypatch):
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    ax.bar(range(20_000), 1.0)  # 20,000 boxes: a long run's timeline
    assert report_figures.svg_chars_estimate(fig) > report_figures.SVG_MAX_CHARS
    formats = []
    original = Figure.savefig

    def spy(self: Figure, fname: Any, **kwargs: Any) -> None:
        formats.append(kwargs.get("format"))
        original(self, fname, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    html = report_figures._embed(fig, "f0-", "timeline")
    assert html.startswith('<img alt="timeline figure" src="data:image/png;base64,')
    assert formats == ["png"]


def test_svg_estimate_of_a_small_figure_is_within_a_factor_of_its_svg():
    import io

    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    ax.plot(np.random.default_rng(0).random(5000))  # a jagged line: nothing to simplify
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    estimate = report_figures.svg_chars_estimate(fig)
    assert len(buffer.getvalue()) / 3 < estimate < len(buffer.getvalue()) * 1.5


def test_sweep_report_tables(sweep_dir, tmp_path, fake_kinds):
    page = write_report(sweep_dir, tmp_path / "r.html").read_text()
    assert "Sweep tiny" in page
    assert "<code>scheduler.max_num_seqs</code> = 4, 16" in page
    assert "<dt>points</dt><dd>8</dd>" in page and "2 per configuration" in page
    table = _tables(page)
    main, stats = table["table-main"], table["table-stats"]
    assert len(main.rows) == 8 and len(stats.rows) == 4
    assert main.columns[:3] == ["scheduler.max_num_seqs", "description", "seed"]
    assert "point" in main.columns and "output_throughput" in main.columns
    # over seeds: mean ± ci95 in one cell, sorted by the mean
    assert "output_throughput" in stats.columns and "output_throughput_ci95" not in stats.columns
    cell = stats.cell(0, "output_throughput")
    assert " ± " in cell.text and cell.value is not None
    # numeric cells are right-aligned and carry their exact value
    assert 'class="data sortable"' in page and "<td class=n data-v=" in page
    assert "The resolved config of the first point (max_num_seqs=4," in page


def test_capacity_report(capacity_dir, tmp_path, fake_kinds):
    page = write_report(capacity_dir, tmp_path / "r.html").read_text()
    assert "Capacity study tiny" in page
    assert "<code>p99_ttft_ms</code> ≤ 2,000 ms" in page
    assert "<code>queue_delay_growth</code> ≤ 0.05 s/s" in page
    assert "<code>workload.arrival.rate</code>" in page
    main = _tables(page)["table-main"]
    assert [main.cell(i, "scheduler.policy").text for i in range(2)] == ["static", "continuous"]
    assert main.cell(1, "max_request_rate").value > 0
    assert "table-stats" not in page


def test_table_rows_are_capped(sweep_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(report_tables, "MAX_TABLE_ROWS", 3)
    page = write_report(sweep_dir, tmp_path / "r.html").read_text()
    assert len(_tables(page)["table-main"].rows) == 3
    assert "the first 3 of 8 rows" in page


# ---- errors and the command line ------------------------------------------------------------


def test_not_a_result_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a batchsim result folder"):
        write_report(tmp_path / "empty", tmp_path / "r.html")
    with pytest.raises(ConfigError, match="no such directory"):
        write_report(tmp_path / "absent", tmp_path / "r.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_unwritable_output_is_a_config_error(run_dir, tmp_path, no_real_kinds):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"cannot write .*r\.html: \[Errno 20\] Not a directory"):
        write_report(run_dir, blocker / "r.html")
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(ConfigError, match=r"cannot write .*dir\.html: \[Errno 21\]"):
        write_report(run_dir, tmp_path / "dir.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.html", "file"]


def test_write_is_atomic(run_dir, tmp_path, no_real_kinds, monkeypatch):
    target = tmp_path / "r.html"
    target.write_text("previous")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.os, "replace", refuse)
    with pytest.raises(ConfigError) as info:
        write_report(run_dir, target)
    assert str(info.value) == f"cannot write {target}: [Errno 28] No space left on device"
    assert isinstance(info.value.__cause__, OSError)
    assert target.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]


def test_cli_report(run_dir, tmp_path, capsys, no_real_kinds):
    out = tmp_path / "sub" / "page.html"
    assert cli.main(["report", str(run_dir), "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert capsys.readouterr().out == f"wrote {out}\n"
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    assert cli.main(["report", str(copy)]) == 0
    assert (copy / "report.html").is_file()
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty"), "-o", str(tmp_path / "x.html")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("batchsim: error: ")
    assert "not a batchsim result folder" in lines[0]
    assert captured.out == "" and not (tmp_path / "x.html").exists()


# ---- parsing the page's tables ---------------------------------------------------------------


class _Cell:
    def __init__(self, text: str, value: str | None):
        self.text = text
        self.value = float(value) if value else None
        self.has_value_attribute = value is not None


class _Table:
    def __init__(self) -> None:
        self.columns: list[str] = []
        self.sort: dict[str, str] = {}
        self.rows: list[list[_Cell]] = []

    def cell(self, row: int, column: str) -> _Cell:
        return self.rows[row][self.columns.index(column)]

    def column(self, name: str) -> list[_Cell]:
        return [row[self.columns.index(name)] for row in self.rows]


class _TableParser(HTMLParser):
    """The sortable tables of a page (or of Chromium's --dump-dom), by id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, _Table] = {}
        self.table: _Table | None = None
        self.cell: list[str] | None = None
        self.value: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and "sortable" in (a.get("class") or ""):
            self.table = self.tables.setdefault(str(a.get("id")), _Table())
        elif self.table is None:
            return
        elif tag == "th" and a.get("data-col") is not None:
            self.table.columns.append(str(a["data-col"]))
            if a.get("aria-sort"):
                self.table.sort[str(a["data-col"])] = str(a["aria-sort"])
        elif tag == "tr" and self.table.columns:
            self.table.rows.append([])
        elif tag == "td":
            self.cell, self.value = [], a.get("data-v")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.table = None
        elif tag == "td" and self.table is not None and self.cell is not None:
            self.table.rows[-1].append(_Cell("".join(self.cell), self.value))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def _tables(page: str) -> dict[str, _Table]:
    parser = _TableParser()
    parser.feed(page)
    return parser.tables


# ---- in a real browser ------------------------------------------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1200, 3000)
CONSOLE = re.compile(r":CONSOLE(?:\(|:)\d+\)?\]\s+\"(?P<message>.*)\", source: (?P<source>\S+)")
"""Chromium's --enable-logging=stderr line for a console message of a page (every level:
log, warning, error and uncaught exceptions)."""


def _chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "no Chromium installed (Debian: apt-get install -y chromium; .ci/run installs it): "
        "the report is not checked in a browser"
    )


class _Browsed:
    def __init__(self, page: Path, proc: subprocess.CompletedProcess[str], netlog: Path):
        self.dom = proc.stdout
        self.stderr = proc.stderr
        self.page = page
        self.netlog = netlog

    @property
    def console(self) -> list[str]:
        """Console messages of the page (and of nothing else)."""
        url = self.page.as_uri()
        return [
            f"{m['message']} ({m['source']})"
            for m in CONSOLE.finditer(self.stderr)
            if m["source"].split("?")[0] == url
        ]

    @property
    def page_requests(self) -> list[str]:
        """URLs the page asked the network for (Chromium's own background requests, made
        for no page, are told apart by their network isolation key)."""
        log = json.loads(self.netlog.read_text(encoding="utf-8"))
        types_ = {v: k for k, v in log["constants"]["logEventTypes"].items()}
        urls = []
        for event in log["events"]:
            params = event.get("params") or {}
            if types_.get(event["type"]) != "URL_REQUEST_START_JOB" or "url" not in params:
                continue
            if params["url"].startswith(("file:", "data:")):
                continue
            if "file://" in str(params.get("network_isolation_key", "")):
                urls.append(params["url"])
        return urls


def _browse(page: Path, work: Path, *args: str, query: str = "") -> _Browsed:
    """Load ``page`` in headless Chromium with console logging on stderr and a network log."""
    work.mkdir(parents=True, exist_ok=True)
    netlog = work / "netlog.json"
    command = [
        _chromium(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-logging=stderr",
        "--v=0",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-sync",
        f"--user-data-dir={work / 'profile'}",
        f"--log-net-log={netlog}",
        *args,
        page.as_uri() + query,
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, cwd=work
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _Browsed(page, proc, netlog)


def _screenshot(page: Path, work: Path) -> tuple[_Browsed, np.ndarray]:
    from matplotlib.image import imread

    shot = work / "shot.png"
    size = f"--window-size={WINDOW[0]},{WINDOW[1]}"
    browsed = _browse(page, work, "--hide-scrollbars", f"--screenshot={shot}", size)
    assert shot.is_file(), browsed.stderr[-3000:]
    return browsed, imread(shot)


def _has_colour(pixels: np.ndarray, hex_colour: str, tolerance: float = 0.04) -> bool:
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return bool((np.abs(pixels[:, :, :3] - rgb).max(axis=2) < tolerance).sum() > 50)


@pytest.mark.parametrize("which", ["run", "sweep"])
def test_browser_renders_the_report(which, run_dir, sweep_dir, tmp_path, fake_kinds):
    folder = run_dir if which == "run" else sweep_dir
    page = write_report(folder, tmp_path / "report.html")
    browsed, pixels = _screenshot(page, tmp_path / "chromium")
    assert browsed.console == []
    assert browsed.page_requests == []
    # the expected size, and not blank: text, tables and the figure's colours are on it
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    rgb = (pixels[:, :, :3] * 255).round().astype(np.uint32)
    colours = np.unique(rgb[:, :, 0] << 16 | rgb[:, :, 1] << 8 | rgb[:, :, 2])
    assert len(colours) > 50
    assert (pixels[:, :, :3].min(axis=2) < 0.5).mean() > 0.005  # dark pixels: text, lines
    assert _has_colour(pixels, OKABE_ITO[0])  # the figure's line (inline SVG rendered)
    assert _has_colour(pixels, "#E69F00")  # the note's border (the refused figure)


@pytest.mark.parametrize("which", ["run", "sweep", "capacity"])
def test_browser_renders_the_real_figures(which, run_dir, sweep_dir, capacity_dir, tmp_path):
    folder = {"run": run_dir, "sweep": sweep_dir, "capacity": capacity_dir}[which]
    page = write_report(folder, tmp_path / "report.html")
    text = page.read_text(encoding="utf-8")
    kinds = re.findall(r"<h3 id=figure-([a-z-]+)>", text)
    expected = {"run": {"cdf", "roofline", "kv"}, "sweep": {"cdf"}, "capacity": {"capacity"}}
    assert expected[which] <= set(kinds)
    assert text.count("<svg") + text.count('src="data:image/png') >= len(expected[which])
    _assert_ids_unique_and_resolved(text)
    browsed, pixels = _screenshot(page, tmp_path / "chromium")
    assert browsed.console == [] and browsed.page_requests == []
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    assert _has_colour(pixels, OKABE_ITO[0])  # a figure's blue series, rendered


def test_browser_reports_a_broken_page(run_dir, tmp_path, no_real_kinds):
    """The console check catches a page whose script fails (so a clean run means clean)."""
    page = write_report(run_dir, tmp_path / "report.html")
    text = page.read_text(encoding="utf-8")
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace('"use strict";', '"use strict"; noSuchFunction();', 1))
    good = _browse(page, tmp_path / "good", "--dump-dom")
    assert good.console == []
    assert "data-report-ready" in good.dom.split(">", 2)[1]  # on <html>: the script ran
    bad = _browse(broken, tmp_path / "bad", "--dump-dom")
    assert any("Uncaught ReferenceError: noSuchFunction" in m for m in bad.console), bad.console
    assert "data-report-ready" not in bad.dom.split(">", 2)[1]


def test_browser_reports_a_network_request(tmp_path):
    """The network check catches a page that fetches something (an address that is never
    routed: TEST-NET-1)."""
    page = tmp_path / "fetches.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>x</title></head>'
        '<body><img src="http://192.0.2.1/x.png" alt=""></body></html>',
        encoding="utf-8",
    )
    browsed = _browse(page, tmp_path / "chromium", "--dump-dom")
    assert browsed.page_requests == ["http://192.0.2.1/x.png"]


def _sorted_column(dom: str, table: str, column: str) -> tuple[_Table, list[_Cell]]:
    parsed = _tables(dom)[table]
    return parsed, parsed.column(column)


def test_browser_sorts_the_tables(sweep_dir, tmp_path, no_real_kinds):
    page = write_report(sweep_dir, tmp_path / "report.html")
    unsorted = [c.value for c in _tables(page.read_text())["table-main"].column("p99_e2el_ms")]
    assert unsorted != sorted(unsorted)  # so that sorting has something to do

    # one click on the header: ascending by value (not by text: 16 after 4)
    browsed = _browse(page, tmp_path / "asc", "--dump-dom", query="?sort=p99_e2el_ms")
    assert browsed.console == []
    table, cells = _sorted_column(browsed.dom, "table-main", "p99_e2el_ms")
    assert table.sort == {"p99_e2el_ms": "ascending"}
    assert [c.value for c in cells] == sorted(unsorted)
    assert len(table.rows) == 8 and all(len(r) == len(table.columns) for r in table.rows)
    # rows move whole: each row's point label still matches its values
    for row in range(8):
        label = table.cell(row, "point").text
        assert label.startswith(f"max_num_seqs={table.cell(row, 'scheduler.max_num_seqs').text},")
    # the stats table has the column too, and sorts by the mean of ``mean ± ci95``
    stats, means = _sorted_column(browsed.dom, "table-stats", "p99_e2el_ms")
    assert [c.value for c in means] == sorted(c.value for c in means)
    assert stats.sort == {"p99_e2el_ms": "ascending"}

    # a second click: descending
    browsed = _browse(
        page, tmp_path / "desc", "--dump-dom", query="?sort=p99_e2el_ms&sort=p99_e2el_ms"
    )
    table, cells = _sorted_column(browsed.dom, "table-main", "p99_e2el_ms")
    assert table.sort == {"p99_e2el_ms": "descending"}
    assert [c.value for c in cells] == sorted(unsorted, reverse=True)

    # numbers by value and text in natural order; ties keep their order
    browsed = _browse(page, tmp_path / "text", "--dump-dom", query="?sort=point")
    table, cells = _sorted_column(browsed.dom, "table-main", "point")
    caps = [int(re.match(r"max_num_seqs=(\d+)", c.text).group(1)) for c in cells]  # type: ignore[union-attr]
    assert caps == [4, 4, 4, 4, 16, 16, 16, 16]
    browsed = _browse(page, tmp_path / "num", "--dump-dom", query="?sort=scheduler.max_num_seqs")
    table, cells = _sorted_column(browsed.dom, "table-main", "scheduler.max_num_seqs")
    assert [c.value for c in cells] == [4, 4, 4, 4, 16, 16, 16, 16]


def test_browser_sorts_missing_values_last(sweep_dir, tmp_path, no_real_kinds):
    """Empty cells (a metric a point has not) stay at the bottom in both directions."""
    page = write_report(sweep_dir, tmp_path / "report.html")
    text = page.read_text(encoding="utf-8")
    # blank two cells of p99_e2el_ms, as a failed point's row has them
    table = _tables(text)["table-main"]
    blanked = text
    for row in (1, 5):
        value = table.cell(row, "p99_e2el_ms")
        pattern = rf'<td class=n data-v="{re.escape(repr(value.value))}"[^>]*>[^<]*</td>'
        blanked, count = re.subn(pattern, '<td class=n data-v="">–</td>', blanked, count=1)
        assert count == 1
    page.write_text(blanked, encoding="utf-8")
    for query, reverse in (
        ("?sort=p99_e2el_ms", False),
        ("?sort=p99_e2el_ms&sort=p99_e2el_ms", True),
    ):
        browsed = _browse(page, tmp_path / str(reverse), "--dump-dom", query=query)
        cells = _tables(browsed.dom)["table-main"].column("p99_e2el_ms")
        values = [c.value for c in cells]
        assert values[-2:] == [None, None]
        assert values[:-2] == sorted(values[:-2], reverse=reverse)  # type: ignore[type-var]


def test_chromium_console_pattern():
    line = (
        '[9316:9316:1201/004429.444158:INFO:CONSOLE:2] "Uncaught ReferenceError: x is not '
        'defined", source: file:///reports/r.html (2)'
    )
    match = CONSOLE.search(line)
    assert match and match["source"] == "file:///reports/r.html"
    older = '[1:1:0101/000000.0:INFO:CONSOLE(12)] "oops", source: file:///reports/r.html (12)'
    assert CONSOLE.search(older)
