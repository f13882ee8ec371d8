"""Figures of single runs: ``batchsim plot cdf``, ``roofline`` and ``kv``.

Figures are checked through their matplotlib objects (labels, lines, collections and their
data), never through pixels. Expected values come from elsewhere than the code under test:
numpy on requests.csv, brute-force counts, hand-computed token gaps, GPU datasheets, and the
summary the simulator computed from its own token records.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import batchsim
from batchsim import cli
from batchsim.errors import ConfigError
from batchsim.plots import PlotOptions, figure
from batchsim.plots import cdf as cdf_kind
from batchsim.plots import kv as kv_kind
from batchsim.plots import roofline as roofline_kind
from batchsim.plots.data import load
from batchsim.plots.style import POLICY_COLORS, save
from batchsim.studies.backends import InlineExecutor
from conftest import tiny_experiment

# KV cache of 30 blocks (480 tokens) against prompts of up to 256 + 64 tokens at 20 req/s:
# a queue forms and requests are preempted
PRESSURE = {
    "engine": {"num_gpu_blocks": 30},
    "workload": {
        "num_requests": 60,
        "arrival": {"process": "poisson", "rate": 20.0},
        "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
        "output_tokens": {"dist": "uniform", "min": 8, "max": 64},
    },
}
CHUNKED = {
    **PRESSURE,
    "scheduler": {"policy": "chunked_prefill", "max_num_seqs": 32, "max_num_batched_tokens": 128},
}


def run_with_slots(experiment: dict[str, Any], out: Path) -> Path:
    """Run ``experiment`` into ``out`` with ``metrics.record_slots`` (the engine's slots.csv)."""
    batchsim.run({**experiment, "metrics": {"record_slots": True}}, out)
    assert (out / "slots.csv").is_file()
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plots")
    out = {
        "pressure": root / "pressure",
        "static": root / "static",
        "slots": root / "slots",
        "summary_only": root / "summary_only",
        "sweep": root / "sweep",
        "sweep_summary_only": root / "sweep_summary_only",
        "h100_fp8": root / "h100_fp8",
    }
    batchsim.run(tiny_experiment(**PRESSURE), out["pressure"])
    batchsim.run(tiny_experiment(scheduler={"policy": "static", "max_num_seqs": 8}), out["static"])
    run_with_slots(tiny_experiment(**CHUNKED), out["slots"])
    result = batchsim.run(tiny_experiment())
    result.write_files(out["summary_only"], ["summary.json", "config.yaml"])
    grid = {"scheduler.policy": ["static", "continuous", "chunked_prefill"]}
    small = tiny_experiment(workload={"num_requests": 20})
    batchsim.sweep(small, grid, executor=InlineExecutor(), out_dir=out["sweep"])
    batchsim.sweep(
        small,
        grid,
        executor=InlineExecutor(),
        out_dir=out["sweep_summary_only"],
        summary_only=True,
    )
    batchsim.run(tiny_experiment(hardware="h100-sxm", engine={"dtype": "fp8"}), out["h100_fp8"])
    return out


def draw(kind: str, *paths: Path, **options: Any) -> Any:
    return figure(kind, list(paths), PlotOptions(**options))


def labelled(ax: Any) -> dict[str, Any]:
    """The labelled lines and collections of ``ax`` by label."""
    artists = [*ax.get_lines(), *ax.collections]
    return {a.get_label(): a for a in artists if not a.get_label().startswith("_")}


def assert_saves(fig: Any, tmp_path: Path, name: str) -> None:
    for suffix in (".png", ".svg"):
        path = save(fig, tmp_path / f"{name}{suffix}")
        assert path.stat().st_size > 1000


def title_of(fig: Any) -> str:
    return str(fig._suptitle.get_text())


# --------------------------------------------------------------------------- cdf


def test_cdf_draws_four_panels_with_one_line_per_run_in_policy_colours(folders, tmp_path):
    fig = draw("cdf", folders["static"], folders["pressure"])
    axes = fig.axes
    assert [ax.get_xlabel() for ax in axes] == [
        "TTFT (ms)",
        "TPOT (ms)",
        "ITL (ms)",
        "E2E latency (ms)",
    ]
    assert [ax.get_ylabel() for ax in axes] == [
        "fraction of requests",
        "fraction of requests",
        "fraction of token gaps",
        "fraction of requests",
    ]
    for i in (0, 1, 3):
        lines = axes[i].get_lines()
        assert len(lines) == 2
        assert [line.get_color() for line in lines] == [
            POLICY_COLORS["static"],
            POLICY_COLORS["continuous"],
        ]
    # no slots.csv: the ITL panel shows the summary's p50/p90/p99 and mean, with a note
    itl = axes[2]
    assert len(itl.get_lines()) == 4
    assert "record_slots" in itl.get_title()
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [
        "static (60 finished)",
        "pressure (60 finished)",
    ]
    assert "llama-2-7b" in title_of(fig) and "a100-80gb" in title_of(fig)
    assert_saves(fig, tmp_path, "cdf")


def test_cdf_lines_are_numpys_sorted_values_of_the_finished_requests(folders):
    fig = draw("cdf", folders["static"])
    requests = pd.read_csv(folders["static"] / "requests.csv")
    done = requests[requests["status"] == "finished"]
    ttft = np.sort(done["ttft_ms"].to_numpy())
    line = fig.axes[0].get_lines()[0]
    np.testing.assert_array_equal(line.get_xdata(), ttft)
    np.testing.assert_allclose(line.get_ydata(), np.arange(1, ttft.size + 1) / ttft.size)
    assert line.get_drawstyle() == "steps-post"
    tpot = np.sort(done.loc[done["output_tokens"] > 1, "tpot_ms"].to_numpy())
    np.testing.assert_array_equal(fig.axes[1].get_lines()[0].get_xdata(), tpot)
    e2el = np.sort(done["e2el_ms"].to_numpy())
    np.testing.assert_array_equal(fig.axes[3].get_lines()[0].get_xdata(), e2el)
    # TTFT of a static batch spans decades: log axis
    assert fig.axes[0].get_xscale() == "log"


def visible_tick_labels(fig: Any, ax: Any) -> list[Any]:
    """The x tick labels drawn inside ``ax``'s view, after layout."""
    fig.canvas.draw()
    lo, hi = sorted(ax.get_xlim())
    return [
        t
        for tick, t in zip(ax.get_xticks(), ax.get_xticklabels())
        if lo <= tick <= hi and t.get_visible() and t.get_text()
    ]


@pytest.mark.parametrize(
    ("lo", "hi"), [(13, 160), (15, 95_000), (10, 1.2e6), (0.4, 30), (38, 120_000), (1.1, 9e8)]
)
def test_cdf_log_axis_labels_never_overlap(lo, hi):
    """Tick labels of a CDF panel spanning one to nine decades stay apart (a panel of
    latencies from 15 ms to 95 s at 1-2-5 steps ran its labels into each other)."""
    from batchsim.plots.style import new_figure

    fig, axes = new_figure(2, 2, figsize=(9.0, 6.6))
    sample = np.geomspace(lo, hi, 200)
    for ax in axes.flat:
        ax.plot(np.sort(sample), np.linspace(0, 1, sample.size))
        cdf_kind._set_x_scale(ax, [sample], fig.get_figwidth())
    for ax in axes.flat:
        labels = visible_tick_labels(fig, ax)
        assert len(labels) >= 2, (lo, hi)
        boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
        for left, right in itertools.pairwise(boxes):
            assert left.x1 < right.x0, [t.get_text() for t in labels]
        for t in labels:  # plain numbers, as a reader writes them
            assert float(t.get_text().replace(",", "")) > 0 and "e" not in t.get_text()


def test_cdf_log_ticks_are_as_dense_as_fit():
    assert cdf_kind.log_ticks(13, 160, 4.0, 10) == [20, 50, 100]
    assert cdf_kind.log_ticks(15, 95_000, 4.0, 10) == [100, 1_000, 10_000]
    assert cdf_kind.log_ticks(15, 95_000, 40.0, 10)[:4] == [20, 50, 100, 200]


def assert_inside_the_figure(fig: Any) -> None:
    """Every legend of ``fig`` lies within the figure (nothing cut off at its edges)."""
    fig.canvas.draw()
    page = fig.bbox
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        if legend is None:
            continue
        box = legend.get_window_extent()
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, (box, page)
        assert page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, (box, page)


def test_cdf_legend_of_runs_with_long_names_fits_the_figure(folders, tmp_path):
    import shutil

    runs = []
    for i, name in enumerate(("static", "pressure", "static", "pressure")):
        run = tmp_path / f"max_num_seqs={2**i},policy=continuous,hardware=a100-80gb,rate={i}"
        shutil.copytree(folders[name], run)
        runs.append(run)
    fig = draw("cdf", *runs)
    assert len(fig.legends[0].get_texts()) == 4
    assert_inside_the_figure(fig)


def test_cdf_itl_markers_are_the_summary_percentiles(folders):
    import json

    summary = json.loads((folders["pressure"] / "summary.json").read_text())
    fig = draw("cdf", folders["pressure"])
    percentiles, mean = fig.axes[2].get_lines()
    np.testing.assert_allclose(
        percentiles.get_xdata(),
        [summary["median_itl_ms"], summary["p90_itl_ms"], summary["p99_itl_ms"]],
    )
    np.testing.assert_allclose(percentiles.get_ydata(), [0.5, 0.9, 0.99])
    np.testing.assert_allclose(mean.get_xdata(), [summary["mean_itl_ms"]])


def test_cdf_of_a_sweep_draws_its_points_and_caps_the_lines(folders, monkeypatch):
    fig = draw("cdf", folders["sweep"])
    assert len(fig.axes[0].get_lines()) == 3
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == [
        "policy=static (20 finished)",
        "policy=continuous (20 finished)",
        "policy=chunked_prefill (20 finished)",
    ]
    colors = [line.get_color() for line in fig.axes[0].get_lines()]
    assert colors == [POLICY_COLORS[p] for p in ("static", "continuous", "chunked_prefill")]
    assert "llama-2-7b on a100-80gb" in title_of(fig)
    monkeypatch.setattr(cdf_kind, "MAX_LINES", 2)
    fig = draw("cdf", folders["sweep"])
    assert len(fig.axes[0].get_lines()) == 2
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "2 of 3 runs shown, evenly spaced"
    assert [t.get_text() for t in legend.get_texts()] == [
        "policy=static (20 finished)",
        "policy=chunked_prefill (20 finished)",
    ]


def test_cdf_draws_the_itl_distribution_from_slots_and_its_mean_is_the_summarys(folders):
    import json

    run = load(folders["slots"])
    summary = json.loads((folders["slots"] / "summary.json").read_text())
    assert summary["num_preemptions"] > 0  # a recomputed prefill samples a token too
    fig = draw("cdf", folders["slots"])
    (line,) = fig.axes[2].get_lines()
    gaps = np.asarray(line.get_xdata())
    assert math.isclose(gaps.mean(), summary["mean_itl_ms"], rel_tol=1e-9)
    assert math.isclose(float(np.percentile(gaps, 99)), summary["p99_itl_ms"], rel_tol=1e-9)
    assert fig.axes[2].get_title() == ""
    # as many gaps as tokens after each finished request's first
    requests = run.requests  # type: ignore[union-attr]
    done = requests[requests["status"] == "finished"]
    assert gaps.size == int((done["output_tokens"] - 1).sum())


# hand-made: six iterations (an idle gap between 2 and 3 ... and between 4 and 5)
HAND_ITERATIONS = pd.DataFrame(
    {
        "iteration": [0, 1, 2, 3, 4, 5],
        "start_time_s": [0.0, 0.1, 0.2, 0.23, 0.27, 0.30],
        "duration_ms": [100.0, 50.0, 30.0, 40.0, 10.0, 20.0],
    }
)
# iteration ends: 0.10, 0.15, 0.23, 0.27, 0.28, 0.32
HAND_SLOTS = pd.DataFrame(
    [
        (0, 7, "prefill", 0, 0),
        (0, 7, "decode", 1, 2),
        (0, 7, "stalled", 3, 3),
        (0, 7, "decode", 4, 5),
        (1, 8, "chunked_prefill", 0, 1),
        (1, 8, "prefill", 2, 2),
        (1, 8, "decode", 3, 3),
        (1, 11, "prefill", 4, 4),  # 11 recomputed in another slot after its preemption
        (1, 11, "decode", 5, 5),
        (2, None, "empty", 0, 2),
        (2, 10, "prefill", 3, 3),
        (2, 10, "decode", 4, 4),
        (2, 10, "padding", 5, 5),
        (3, 11, "prefill", 0, 0),
        (3, 11, "decode", 1, 1),
        (3, None, "empty", 2, 5),
    ],
    columns=list(cdf_kind.SLOT_COLUMNS),
)
HAND_GAPS_MS = {7: [50, 80, 50, 40], 8: [40], 10: [10], 11: [50, 130, 40]}


def test_itl_reconstruction_from_a_hand_made_slots_file():
    ids, times = cdf_kind.token_times(HAND_SLOTS, HAND_ITERATIONS)
    assert ids.tolist() == [7] * 5 + [8] * 2 + [10] * 2 + [11] * 4
    np.testing.assert_allclose(
        times,
        [0.10, 0.15, 0.23, 0.28, 0.32, 0.23, 0.27, 0.27, 0.28, 0.10, 0.15, 0.28, 0.32],
    )
    gaps = cdf_kind.inter_token_gaps(ids, times) * 1e3
    expected = [g for request in (7, 8, 10, 11) for g in HAND_GAPS_MS[request]]
    np.testing.assert_allclose(gaps, expected, atol=1e-9)
    some = cdf_kind.inter_token_gaps(ids, times, keep=np.array([8, 11])) * 1e3
    np.testing.assert_allclose(some, HAND_GAPS_MS[8] + HAND_GAPS_MS[11], atol=1e-9)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.assign(state=s["state"].replace("stalled", "sleeping")), "'sleeping'"),
        (lambda s: s.drop(columns="slot"), "no column 'slot'"),
        (
            lambda s: pd.concat([s, pd.DataFrame([(4, 7, "decode", 2, 2)], columns=s.columns)]),
            "request 7 samples twice in iteration 2",
        ),
        (
            lambda s: pd.concat([s, pd.DataFrame([(4, 12, "decode", 6, 7)], columns=s.columns)]),
            "iteration 6 is not in iterations.csv",
        ),
        (
            lambda s: pd.concat([s, pd.DataFrame([(4, 12, "decode", 3, 2)], columns=s.columns)]),
            "ends (iteration 2) before it starts (iteration 3)",
        ),
    ],
)
def test_malformed_slots_are_one_line_errors(edit, message):
    with pytest.raises(ConfigError) as info:
        cdf_kind.token_times(edit(HAND_SLOTS), HAND_ITERATIONS, "run/slots.csv")
    assert message in str(info.value) and "run/slots.csv" in str(info.value)
    assert "\n" not in str(info.value)


def test_slots_that_disagree_with_requests_csv_are_refused(folders, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(folders["slots"], broken)
    slots = pd.read_csv(broken / "slots.csv")
    decode = slots.index[slots["state"] == "decode"][0]
    slots.loc[decode, "last_iteration"] -= 1
    slots.to_csv(broken / "slots.csv", index=False)
    with pytest.raises(ConfigError, match=r"broken/slots.csv: request \d+ samples \d+ tokens"):
        draw("cdf", broken)


# --------------------------------------------------------------------------- roofline

# NVIDIA A100 datasheet: A100 80GB SXM, BF16 tensor core 312 TFLOPS (dense), 2,039 GB/s HBM2e
A100_BF16_TFLOPS, A100_TB_S = 312.0, 2.039
# NVIDIA H100 datasheet: H100 SXM, FP8 tensor core 3,958 TFLOPS with sparsity (1,979 dense),
# 3.35 TB/s HBM3
H100_FP8_TFLOPS, H100_TB_S = 3958 / 2, 3.35


def roofs(ax: Any, kind: str) -> tuple[Any, Any]:
    lines = labelled(ax)
    compute = next(v for k, v in lines.items() if k.startswith(f"compute roof, {kind}"))
    memory = next(v for k, v in lines.items() if k.startswith(f"memory roof, {kind}"))
    return compute, memory


def test_roofline_roofs_are_the_datasheet_numbers(folders, tmp_path):
    fig = draw("roofline", folders["pressure"])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/B)"
    assert "TFLOP/s" in ax.get_ylabel()
    assert ax.get_xscale() == ax.get_yscale() == "log"
    compute, memory = roofs(ax, "datasheet")
    np.testing.assert_allclose(compute.get_ydata(), A100_BF16_TFLOPS, rtol=1e-3)
    x, y = np.asarray(memory.get_xdata()), np.asarray(memory.get_ydata())
    np.testing.assert_allclose(y / x, A100_TB_S, rtol=1e-3)  # TFLOP/s per FLOP/B = TB/s
    ridge = A100_BF16_TFLOPS / A100_TB_S  # 153 FLOP/B
    assert math.isclose(x[-1], ridge, rel_tol=1e-3)
    assert math.isclose(compute.get_xdata()[0], ridge, rel_tol=1e-3)
    assert any(f"ridge {ridge:.0f} FLOP/B (datasheet)" in t.get_text() for t in ax.texts)
    # the achievable roofs, from the profile's efficiencies, lie below
    compute_a, memory_a = roofs(ax, "achievable")
    assert 0 < compute_a.get_ydata()[0] < A100_BF16_TFLOPS
    assert 0 < memory_a.get_ydata()[0] < memory.get_ydata()[0]
    assert "llama-2-7b" in title_of(fig) and "a100-80gb" in title_of(fig)
    assert_saves(fig, tmp_path, "roofline")


def test_roofline_uses_the_runs_compute_dtype(folders):
    fig = draw("roofline", folders["h100_fp8"])
    compute, memory = roofs(fig.axes[0], "datasheet")
    np.testing.assert_allclose(compute.get_ydata(), H100_FP8_TFLOPS, rtol=1e-3)
    x, y = np.asarray(memory.get_xdata()), np.asarray(memory.get_ydata())
    np.testing.assert_allclose(y / x, H100_TB_S, rtol=1e-3)
    assert "h100-sxm" in title_of(fig)


def test_roofline_draws_every_iteration_by_composition(folders):
    fig = draw("roofline", folders["slots"])  # chunked prefill: all three compositions
    (ax,) = fig.axes
    it = pd.read_csv(folders["slots"] / "iterations.csv")
    prefill, decode = it["num_prefill_tokens"] > 0, it["num_decode_tokens"] > 0
    groups = {
        "prefill only": it[prefill & ~decode],
        "decode only": it[decode & ~prefill],
        "prefill + decode": it[prefill & decode],
    }
    scatters = ax.collections
    assert len(scatters) == 3
    for scatter, (name, rows) in zip(scatters, groups.items()):
        assert len(rows) > 0
        assert scatter.get_label() == f"{name} ({len(rows):,} iterations)"
        points = scatter.get_offsets()
        np.testing.assert_allclose(points[:, 0], rows["arithmetic_intensity"])
        achieved = rows["flops"] / (rows["gpu_time_ms"] / 1e3) / 1e12
        np.testing.assert_allclose(points[:, 1], achieved)


def test_roofline_samples_big_runs_deterministically_and_says_so(folders, monkeypatch):
    monkeypatch.setattr(roofline_kind, "MAX_POINTS", 100)
    first = draw("roofline", folders["slots"])
    second = draw("roofline", folders["slots"])
    counts = [len(c.get_offsets()) for c in first.axes[0].collections]
    assert sum(counts) == 100
    assert min(counts) >= 10  # the rare compositions keep a tenth of the sample
    for a, b in zip(first.axes[0].collections, second.axes[0].collections):
        np.testing.assert_array_equal(a.get_offsets(), b.get_offsets())
    total = len(pd.read_csv(folders["slots"] / "iterations.csv"))
    assert f"a sample of 100 of {total:,} iterations" in first.axes[0].get_title()


def test_roofline_under_tensor_parallelism_is_per_gpu(tmp_path):
    batchsim.run(tiny_experiment(parallel={"tensor_parallel_size": 2}), tmp_path / "tp2")
    fig = draw("roofline", tmp_path / "tp2")
    (ax,) = fig.axes
    assert "per GPU" in ax.get_ylabel()
    compute, _ = roofs(ax, "datasheet")
    np.testing.assert_allclose(compute.get_ydata(), A100_BF16_TFLOPS, rtol=1e-3)
    assert "x2" in title_of(fig)


# --------------------------------------------------------------------------- kv


def step_value(line: Any, t: float) -> float:
    """The value of a steps-post line at time t."""
    x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    return float(y[np.searchsorted(x, t, side="right") - 1])


def test_kv_waiting_count_equals_a_brute_force_count(folders, tmp_path):
    fig = draw("kv", folders["pressure"])
    top, bottom = fig.axes
    assert top.get_ylabel() == "KV-cache usage\n(fraction of blocks)"
    assert bottom.get_xlabel().startswith("time (s)")
    assert bottom.get_ylabel() == "requests"
    lines = labelled(bottom)
    waiting = lines["waiting (arrived, not yet scheduled)"]
    admitted = lines["admitted, not finished"]
    assert "in the batch (num_seqs)" in lines

    requests = pd.read_csv(folders["pressure"] / "requests.csv")
    arrival = requests["arrival_time_s"].to_numpy()
    scheduled = requests["first_scheduled_time_s"].to_numpy()
    finish = requests["finish_time_s"].to_numpy()
    chosen = np.linspace(arrival.min(), finish.max(), 23)[1:-1]
    chosen = np.r_[chosen, scheduled[5], arrival[17]]  # at an instant of change, too
    brute_waiting = [sum(a <= t < s for a, s in zip(arrival, scheduled)) for t in chosen]
    brute_admitted = [sum(s <= t < f for s, f in zip(scheduled, finish)) for t in chosen]
    assert [step_value(waiting, t) for t in chosen] == brute_waiting
    assert [step_value(admitted, t) for t in chosen] == brute_admitted
    assert max(brute_waiting) > 5

    iterations = pd.read_csv(folders["pressure"] / "iterations.csv")
    preempting = iterations[iterations["num_preempted"] > 0]
    assert len(preempting) > 0
    marks = next(v for k, v in labelled(top).items() if k.startswith("preemption"))
    np.testing.assert_allclose(marks.get_xdata(), preempting["start_time_s"])
    total = int(preempting["num_preempted"].sum())
    assert marks.get_label() == f"preemption ({total:,} in {len(preempting):,} iterations)"
    assert "KV-cache usage" in labelled(top)
    assert "llama-2-7b" in title_of(fig) and "a100-80gb" in title_of(fig)
    assert_saves(fig, tmp_path, "kv")


def test_kv_usage_is_each_iterations_value(folders):
    iterations = pd.read_csv(folders["static"] / "iterations.csv")
    assert len(iterations) <= kv_kind.MAX_EXACT_POINTS  # drawn exactly
    fig = draw("kv", folders["static"])
    usage = labelled(fig.axes[0])["KV-cache usage"]
    for _, row in iterations.iloc[:: max(1, len(iterations) // 20)].iterrows():
        middle = row["start_time_s"] + row["duration_ms"] / 2e3
        assert math.isclose(step_value(usage, middle), row["kv_cache_usage"], rel_tol=1e-6)


def test_kv_draws_the_cached_prefix_blocks_of_a_prefix_caching_run(tmp_path):
    # four tenants' 512-token system prompts: with caching the pool keeps their blocks
    data = tiny_experiment(
        workload={
            "num_requests": 40,
            "arrival": {"process": "poisson", "rate": 5.0},
            "prompt_tokens": {"dist": "uniform", "min": 16, "max": 64},
            "output_tokens": {"dist": "uniform", "min": 4, "max": 16},
            "shared_prefix": {"count": 4, "tokens": {"dist": "fixed", "value": 512}},
        },
        engine={"enable_prefix_caching": True},
    )
    result = batchsim.run(data, tmp_path / "cached")
    fig = draw("kv", tmp_path / "cached")
    lines = labelled(fig.axes[0])
    rate = result.summary["prefix_cache_hit_rate"]
    cached = lines[f"cached prefix blocks (held or idle); hit rate {rate:.0%}"]
    iterations = pd.read_csv(tmp_path / "cached" / "iterations.csv")
    blocks = result.summary["num_gpu_blocks"]
    for _, row in iterations.iloc[:: max(1, len(iterations) // 20)].iterrows():
        middle = row["start_time_s"] + row["duration_ms"] / 2e3
        expected = row["num_cached_blocks"] / blocks
        assert math.isclose(step_value(cached, middle), expected, rel_tol=1e-9)
    assert iterations["num_cached_blocks"].max() >= 4 * 512 // 16  # the four prompts


def test_kv_has_no_cached_line_without_prefix_caching(folders):
    assert not any(k.startswith("cached") for k in labelled(draw("kv", folders["static"]).axes[0]))


def test_kv_zooms_on_the_window_and_refuses_an_empty_one(folders):
    iterations = pd.read_csv(folders["pressure"] / "iterations.csv")
    t0 = float(iterations["start_time_s"].iloc[len(iterations) // 3])
    t1 = float(iterations["start_time_s"].iloc[len(iterations) // 2])
    fig = draw("kv", folders["pressure"], start=t0, end=t1)
    assert fig.axes[1].get_xlim() == (t0, t1)
    waiting = labelled(fig.axes[1])["waiting (arrived, not yet scheduled)"]
    assert waiting.get_xdata()[0] == t0 and waiting.get_xdata()[-1] == t1
    end = float(iterations["start_time_s"].iloc[-1]) + 100
    with pytest.raises(ConfigError, match="no iteration between --from") as info:
        draw("kv", folders["pressure"], start=end, end=end + 10)
    assert str(folders["pressure"]) in str(info.value)


def test_kv_long_series_are_drawn_per_time_bin(folders, monkeypatch):
    monkeypatch.setattr(kv_kind, "MAX_EXACT_POINTS", 10)
    fig = draw("kv", folders["pressure"])
    assert "time-weighted mean" in fig.axes[1].get_xlabel()
    # the binned statistics of a step function, against a fine brute-force sampling
    rng = np.random.default_rng(1)
    x = np.r_[0.0, np.sort(rng.uniform(0, 10, 200)), 10.0]
    y = rng.integers(0, 9, x.size).astype(float)
    y[-1] = y[-2]
    edges = np.linspace(0.0, 10.0, 11)
    lo, hi, mean = kv_kind.binned(x, y, edges)
    fine = np.linspace(0, 10, 2_000_001)[:-1]
    values = y[np.searchsorted(x, fine, side="right") - 1]
    which = np.minimum((fine // 1).astype(int), 9)
    for b in range(10):
        inside = values[which == b]
        assert lo[b] == inside.min() and hi[b] == inside.max()
        assert math.isclose(mean[b], inside.mean(), abs_tol=1e-3)


def test_plot_kv_on_the_command_line_writes_the_file(folders, tmp_path, capsys):
    out = tmp_path / "kv.png"
    assert cli.main(["plot", "kv", str(folders["pressure"]), "-o", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert str(out) in capsys.readouterr().out


# --------------------------------------------------------------------------- which folders


def test_applies_only_to_folders_the_kind_can_draw(folders):
    run = load(folders["pressure"])
    summary_only = load(folders["summary_only"])
    sweep = load(folders["sweep"])
    sweep_summary_only = load(folders["sweep_summary_only"])
    for kind in (cdf_kind, roofline_kind, kv_kind):
        assert kind.applies(run)
        assert not kind.applies(summary_only)
        assert not kind.applies(sweep_summary_only)
    assert cdf_kind.applies(sweep)
    assert not roofline_kind.applies(sweep) and not kv_kind.applies(sweep)


@pytest.mark.parametrize(
    "kind, which, expected",
    [
        ("cdf", ["summary_only"], "summary_only: no requests.csv (a run written with --summary"),
        ("cdf", ["sweep_summary_only"], "sweep_summary_only: no point of this sweep has"),
        ("roofline", ["summary_only"], "summary_only: no iterations.csv"),
        ("roofline", ["pressure", "static"], "roofline draws one run per figure, got 2"),
        ("roofline", ["sweep"], "sweep: a sweep study; roofline draws one run"),
        ("kv", ["summary_only"], "summary_only: no iterations.csv"),
        ("kv", ["pressure", "static"], "kv draws one run per figure, got 2 folders"),
        ("kv", ["sweep"], "sweep: a sweep study; kv draws one run"),
    ],
)
def test_wrong_folders_are_one_line_errors(folders, kind, which, expected):
    with pytest.raises(ConfigError) as info:
        draw(kind, *(folders[w] for w in which))
    message = str(info.value)
    assert expected in message and "\n" not in message


def test_wrong_folder_on_the_command_line_exits_2_with_one_line(folders, tmp_path, capsys):
    out = tmp_path / "x.png"
    assert cli.main(["plot", "kv", str(folders["summary_only"]), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no iterations.csv" in err
    assert not out.exists()
