"""What a reader sees in the figures with 1, 2 and 4 series: every series its own hue and
marker, no line hidden under an equal one, titles inside the figure, and a log axis for swept
values spread over powers. Checked through matplotlib's objects and the renderer's extents,
never through pixels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import batchsim
from batchsim.plots import figure
from batchsim.plots.style import (
    OKABE_ITO,
    POLICY_COLORS,
    layered_widths,
    new_figure,
    series_styles,
    suptitle,
)
from batchsim.plots.sweep import x_scale
from batchsim.studies.backends import InlineExecutor
from conftest import tint_of, tiny_experiment

GPUS = ["a100-80gb", "h100-sxm", "a100-40gb", "l40s"]


def small(**overrides: Any) -> dict[str, Any]:
    return tiny_experiment(workload={"num_requests": 24}, **overrides)


@pytest.fixture(scope="module")
def gpu_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Sweeps over max_num_seqs on 1, 2 and 4 GPUs, one policy (continuous)."""
    root = tmp_path_factory.mktemp("pictures")
    out = {}
    for n in (1, 2, 4):
        grid: dict[str, list[Any]] = {"scheduler.max_num_seqs": [2, 4, 8]}
        if n > 1:
            grid["hardware"] = GPUS[:n]
        out[n] = root / f"gpus{n}"
        batchsim.sweep(small(), grid, executor=InlineExecutor(), out_dir=out[n])
    return out


def throughput_lines(fig: Any) -> list[Any]:
    return [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid() == "throughput"]


def inside_figure(fig: Any, text: Any) -> bool:
    fig.canvas.draw()
    box = text.get_window_extent()
    return bool(box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_knee_of_one_policy_on_n_gpus_gives_each_gpu_its_own_hue_and_marker(gpu_sweeps, n):
    fig = figure("knee", [gpu_sweeps[n]])
    lines = throughput_lines(fig)
    assert len(lines) == n
    colors = [ln.get_color() for ln in lines]
    assert colors[0] == POLICY_COLORS["continuous"]
    assert len(set(colors)) == n and set(colors) <= set(OKABE_ITO)
    for other in colors[1:]:  # another hue, not a lighter blue
        assert tint_of(other, colors[0]) is None
    assert len({ln.get_marker() for ln in lines}) == n
    widths = [ln.get_linewidth() for ln in lines]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == n


@pytest.mark.parametrize("n", [2, 4])
def test_sweep_and_cdf_of_one_policy_give_each_series_its_own_hue(gpu_sweeps, n):
    sweep = figure("sweep", [gpu_sweeps[n]])
    lines = [ln for ln in sweep.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert len({ln.get_color() for ln in lines}) == len(lines) == n
    assert len({ln.get_marker() for ln in lines}) == n
    points = [p for p in (gpu_sweeps[n] / "points").iterdir() if "max_num_seqs=8" in p.name]
    cdf = figure("cdf", sorted(points))
    cdf_lines = cdf.axes[0].get_lines()
    assert len({ln.get_color() for ln in cdf_lines}) == len(points)
    assert len({str(ln.get_linestyle()) for ln in cdf_lines}) == len(points)


def test_several_policies_keep_their_own_colours():
    labels = ["a", "b", "c"]
    styles = series_styles(labels, {"a": "static", "b": "continuous", "c": "static"})
    assert styles[0].color == POLICY_COLORS["static"]
    assert styles[1].color == POLICY_COLORS["continuous"]
    # the second static line: static's hue, the whole tint range lighter, another marker
    assert tint_of(styles[2].color, POLICY_COLORS["static"]) == pytest.approx(0.55, abs=0.01)
    assert styles[2].marker != styles[0].marker


def test_layered_widths_draw_the_first_series_widest():
    assert layered_widths(1, 1.5) == [1.5]
    widths = layered_widths(4, 1.0)
    assert widths[0] == pytest.approx(1.6) and widths[-1] == 1.0
    assert widths == sorted(widths, reverse=True)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_cdf_title_of_n_gpus_stays_inside_the_figure(gpu_sweeps, n, tmp_path):
    points = sorted((gpu_sweeps[n] / "points").iterdir())
    runs = [p for p in points if p.name.startswith("max_num_seqs=8")]
    fig = figure("cdf", runs)
    fig.canvas.draw()
    assert inside_figure(fig, fig._suptitle)
    if n == 4:  # one model named once, its GPUs listed
        assert fig._suptitle.get_text().count("llama-2-7b") == 1


def test_kv_title_of_a_cluster_breaks_at_its_phrases_inside_the_figure(tmp_path):
    cluster = {"replicas": [{"count": 2, "hardware": "h100-sxm"}, {"count": 2}]}
    exp = small(cluster={**cluster, "router": "least_outstanding"})
    batchsim.run(exp, tmp_path / "cluster")
    fig = figure("kv", [tmp_path / "cluster"])
    fig.canvas.draw()
    assert inside_figure(fig, fig._suptitle)
    for line in fig._suptitle.get_text().splitlines():  # whole phrases, not split words
        assert not line.endswith(("Poisson", "x", "req/s,")), line
        assert not line.startswith(("req/s", "x ")), line


def test_a_title_too_wide_for_the_figure_is_broken_after_its_commas():
    fig, _ = new_figure()
    text = "Latency distributions: " + ", ".join(f"phrase number {i}" for i in range(12))
    title = suptitle(fig, text)
    fig.canvas.draw()
    assert inside_figure(fig, title)
    lines = title.get_text().splitlines()
    assert len(lines) >= 2
    assert all(line.endswith(",") or line.endswith(":") for line in lines[:-1])
    assert " ".join(lines) == text


@pytest.mark.parametrize(
    ("values", "scale"),
    [
        ([0, 25, 50, 100, 200, 400], "symlog"),
        ([25, 50, 100, 200, 400], "log"),
        ([1, 2, 4, 8, 16, 32], "log"),
        ([0.5, 1, 2, 4, 8, 16], "log"),
        ([1, 2, 3, 4, 5], "linear"),
        ([0, 10, 20, 30, 40], "linear"),
        ([100, 200, 300], "linear"),
        ([8, 16], "linear"),
    ],
)
def test_swept_axis_is_logarithmic_when_its_values_are_spread_over_powers(values, scale):
    assert x_scale(np.array(values, dtype=float)) == scale


def test_sweep_of_max_wait_ms_from_0_to_400_spreads_its_values_evenly(tmp_path):
    values = [0, 25, 50, 100, 200, 400]
    grid = {"scheduler.max_wait_ms": values}
    exp = small(scheduler={"policy": "dynamic", "max_num_seqs": 8})
    batchsim.sweep(exp, grid, executor=InlineExecutor(), out_dir=tmp_path / "wait")
    fig = figure("sweep", [tmp_path / "wait"])
    ax = fig.axes[-1]
    assert ax.get_xscale() == "symlog"
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(v) for v in values]
    # on the axis as drawn, the values after 0 are evenly spaced (each doubles the last)
    where = ax.transData.transform([(v, 0) for v in values])[:, 0]
    gaps = np.diff(where)
    assert gaps[1:] == pytest.approx([gaps[1]] * 4, rel=1e-6)
    assert gaps[0] == pytest.approx(gaps[1], rel=1e-6)  # 0 sits one step below 25


def load_script(relative: str) -> Any:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_figures_replaces_a_png_only_when_its_pixels_change(tmp_path):
    from batchsim.plots.style import save

    figures = load_script("docs/figures.py")
    fig, ax = new_figure()
    ax.plot([0, 1], [0, 1])
    first = save(fig, tmp_path / "a.png")
    # the same pixels in other bytes (another encoder's metadata): the same picture
    fig.savefig(tmp_path / "b.png", dpi=150, metadata={"Software": "another"})
    assert first.read_bytes() != (tmp_path / "b.png").read_bytes()
    assert figures.same_picture(first, tmp_path / "b.png")
    ax.plot([0, 1], [1, 0])
    assert not figures.same_picture(first, save(fig, tmp_path / "c.png"))
    assert not figures.same_picture(first, tmp_path / "missing.png")
    # the same figure drawn twice: the same bytes (no date, no version in the file)
    assert save(fig, tmp_path / "d.png").read_bytes() == (tmp_path / "c.png").read_bytes()


def test_latency_throughput_load_labels_stay_inside_their_panels(tmp_path):
    grid = {"workload.arrival.rate": [1.0, 4.0, 16.0], "hardware": GPUS[:2]}
    exp = tiny_experiment(workload={"num_requests": 24})
    batchsim.sweep(exp, grid, executor=InlineExecutor(), out_dir=tmp_path / "load")
    fig = figure("latency-throughput", [tmp_path / "load"])
    fig.canvas.draw()
    for ax in fig.axes:
        box = ax.get_window_extent()
        labels = [t for t in ax.texts if t.get_text() in ("1", "4", "16")]
        assert labels
        for text in labels:
            extent = text.get_window_extent()
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 + 1, text.get_text()
            assert box.y0 <= extent.y0 and extent.y1 <= box.y1 + 1, text.get_text()
