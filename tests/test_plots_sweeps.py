"""The figures of sweeps and capacity studies (``batchsim plot knee | latency-throughput |
capacity``): what each draws from small studies run here, the knee rule on curves whose knee is
known, one-line errors for folders a kind cannot draw, and the command line."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import batchsim
from batchsim import cli
from batchsim.errors import ConfigError
from batchsim.plots import PlotOptions, figure
from batchsim.plots import capacity as capacity_kind
from batchsim.plots import knee as knee_kind
from batchsim.plots import latency_throughput as lt_kind
from batchsim.plots.data import load
from batchsim.plots.knee import knee_cap
from batchsim.plots.style import POLICY_COLORS, save
from batchsim.studies.backends import InlineExecutor
from conftest import tint_of

INLINE = InlineExecutor()
PROMPT, OUTPUT = 32, 16
"""Fixed lengths of the knee sweeps: the mean decode context is 32 + 16 / 2 = 40 tokens."""
CAPS = [1, 2, 4, 8, 16]
POLICIES = ["static", "continuous"]
RATES = [1.0, 4.0, 16.0, 64.0]
SLO = {"ttft_ms": 400.0, "tpot_ms": 30.0}


def suptitle(fig: Any) -> str:
    """The figure's title (``Figure.get_suptitle`` is matplotlib >= 3.8)."""
    return fig._suptitle.get_text() if fig._suptitle is not None else ""


def experiment(**overrides: Any) -> dict[str, Any]:
    exp: dict[str, Any] = {
        "name": "plots",
        "seed": 0,
        "hardware": "a100-80gb",
        "model": "llama-2-7b",
        "scheduler": {"policy": "continuous", "max_num_seqs": 8},
        "workload": {
            "num_requests": 48,
            "arrival": {"process": "all_at_once"},
            "prompt_tokens": {"dist": "fixed", "value": PROMPT},
            "output_tokens": {"dist": "fixed", "value": OUTPUT},
        },
    }
    exp.update(overrides)
    return exp


def poisson(rate: float = 4.0, num_requests: int = 40) -> dict[str, Any]:
    return {
        "num_requests": num_requests,
        "arrival": {"process": "poisson", "rate": rate},
        "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
        "output_tokens": {"dist": "uniform", "min": 8, "max": 48},
    }


@pytest.fixture(scope="module")
def knee_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plots") / "knee"
    grid = {"scheduler.max_num_seqs": CAPS, "scheduler.policy": POLICIES}
    batchsim.sweep(experiment(), grid, executor=INLINE, out_dir=out)
    return out


@pytest.fixture(scope="module")
def load_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plots") / "load"
    exp = experiment(workload=poisson(), slo=SLO)
    grid = {"workload.arrival.rate": RATES, "scheduler.policy": POLICIES}
    batchsim.sweep(exp, grid, executor=INLINE, out_dir=out)
    return out


CONFIGS = [("continuous", 1), ("dynamic", 2), ("continuous", 3)]
"""Capacity configurations: tensor parallelism 3 does not divide Llama-2-7B's 32 heads."""


@pytest.fixture(scope="module")
def capacity_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plots") / "capacity"
    exp = experiment(workload=poisson(4.0, 30))
    grid = {("scheduler.policy", "parallel.tensor_parallel_size"): CONFIGS}
    batchsim.capacity(exp, {"p99_ttft_ms": 1000}, grid, rtol=0.3, executor=INLINE, out_dir=out)
    return out


def gid_lines(ax: Any, gid: str) -> list[Any]:
    return [line for line in ax.get_lines() if line.get_gid() == gid]


def axes_by_ylabel(fig: Any, label: str) -> Any:
    found = [ax for ax in fig.axes if ax.get_ylabel() == label]
    assert len(found) == 1, [ax.get_ylabel() for ax in fig.axes]
    return found[0]


def legend_texts(fig: Any) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def assert_saves(fig: Any, tmp_path: Path) -> None:
    png, svg = save(fig, tmp_path / "f.png"), save(fig, tmp_path / "f.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert b"<svg" in svg.read_bytes()[:2000] and svg.stat().st_size > 5000


def roofline_json(context: int) -> dict[str, Any]:
    """What ``batchsim roofline`` prints for the experiments' model and GPU."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = ["roofline", "--model", "llama-2-7b", "--hardware", "a100-80gb"]
        code = cli.main([*args, "--batch", "1", "--context", str(context), "--format", "json"])
    assert code == 0
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


# ---- the knee rule ---------------------------------------------------------------------------


POW2 = [2**i for i in range(10)]


@pytest.mark.parametrize(
    ("caps", "throughputs", "expected"),
    [
        (POW2, [min(b, 64) for b in POW2], 64),  # flat after 64: the step 64 -> 128 gains 0
        (POW2, [float(b) for b in POW2], None),  # doubles forever
        ([1, 2, 4, 8], [100, 200, 300, 324], 4),  # gains 100 %, 50 %, 8 %
        ([1, 2, 4, 8], [100, 200, 300, 330.1], None),  # the last gain is 10.03 %
        ([1, 2, 4, 8], [100, 200, 300, 329.9], 4),  # 9.97 %
        ([1, 2, 4, 8, 16], [100, 150, 160, 400, 800], 2),  # the first flat step counts
        ([1, 4, 16, 64, 256], [1, 4, 16, 64, 64], 64),  # gaps: the gain is per doubling
        ([1, 4], [100, 118], 1),  # +18 % over two doublings = 8.6 % per doubling
        ([1, 4], [100, 125], None),  # +25 % over two doublings = 11.8 % per doubling
        ([8], [100], None),
        ([], [], None),
    ],
)
def test_knee_cap_on_curves_with_known_knees(caps, throughputs, expected):
    assert knee_cap(caps, throughputs) == expected


def test_knee_cap_takes_unsorted_and_missing_caps():
    pairs = [(b, min(b, 64)) for b in POW2]
    random.Random(3).shuffle(pairs)
    caps = [b for b, _ in pairs] + [None, math.nan, 1024]
    throughputs = [t for _, t in pairs] + [500, 500, math.nan]
    assert knee_cap(caps, throughputs) == 64
    assert knee_cap(pd.Series(caps, dtype=float), pd.Series(throughputs, dtype=float)) == 64


def test_knee_cap_threshold_is_a_parameter():
    assert knee_cap([1, 2, 4, 8], [100, 200, 300, 324], min_gain=0.6) == 2  # 50 % < 60 %
    assert knee_cap([1, 2, 4, 8], [100, 200, 300, 324], min_gain=0.05) is None


# ---- knee ------------------------------------------------------------------------------------


def test_knee_figure_of_a_sweep_over_cap_and_policy(knee_dir, tmp_path):
    fig = figure("knee", [knee_dir])
    ax = axes_by_ylabel(fig, "output throughput (tok/s)")
    latency = axes_by_ylabel(fig, "p99 ITL (ms)")
    batch = axes_by_ylabel(fig, "mean batch\n(requests)")
    assert "max_num_seqs" in batch.get_xlabel() and "(requests" in batch.get_xlabel()
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    # one throughput line, one dashed latency line and one mean-batch line per policy
    throughput = gid_lines(ax, "throughput")
    assert len(throughput) == len(POLICIES)
    assert [list(line.get_xdata()) for line in throughput] == [CAPS, CAPS]
    assert len(gid_lines(latency, "latency")) == len(POLICIES)
    assert all(line.get_linestyle() == "--" for line in gid_lines(latency, "latency"))
    assert len(gid_lines(batch, "mean-batch")) == len(POLICIES)
    # the same colour for the same policy as everywhere, and for its latency line
    assert {line.get_color() for line in throughput} == {POLICY_COLORS[p] for p in POLICIES}
    assert [ln.get_color() for ln in gid_lines(latency, "latency")] == [
        ln.get_color() for ln in throughput
    ]
    # values from sweep.csv
    table = pd.read_csv(knee_dir / "sweep.csv")
    static = table[table["scheduler.policy"] == "static"].sort_values("scheduler.max_num_seqs")
    line = next(ln for ln in throughput if ln.get_color() == POLICY_COLORS["static"])
    assert list(line.get_ydata()) == pytest.approx(list(static["output_throughput"]))
    texts = legend_texts(fig)
    assert any(t.startswith("static: ") for t in texts)
    assert any(t.startswith("continuous: ") for t in texts)
    assert any("doubling" in t and "10 %" in t for t in texts)
    # the roofline knee at the mean decode context of 32-token prompts and 16 outputs
    expected = roofline_json(PROMPT + OUTPUT // 2)
    roof = next(t for t in texts if t.startswith("roofline"))
    assert f"B = {expected['knee_batch_size']}" in roof
    assert f"ridge {expected['ridge_point']:.0f} FLOP/B" in roof
    assert f"{PROMPT + OUTPUT // 2} tokens (requests.csv)" in roof
    title = suptitle(fig)
    assert "llama-2-7b" in title and "a100-80gb" in title and "policy varied" in title
    assert_saves(fig, tmp_path)


def test_knee_marks_the_knee_where_the_batch_stops_growing(tmp_path):
    # 4 requests queued at once: caps 4, 8 and 16 run the same single batch of 4, so the
    # doubling 4 -> 8 adds nothing and the knee is at 4
    out = tmp_path / "k"
    exp = experiment()
    exp["workload"]["num_requests"] = 4
    batchsim.sweep(exp, {"scheduler.max_num_seqs": CAPS}, executor=INLINE, out_dir=out)
    table = pd.read_csv(out / "sweep.csv").set_index("scheduler.max_num_seqs")
    fig = figure("knee", [out])
    ax = axes_by_ylabel(fig, "output throughput (tok/s)")
    (ring,) = gid_lines(ax, "knee")
    assert list(ring.get_xdata()) == [4]
    assert list(ring.get_ydata()) == pytest.approx([table.loc[4, "output_throughput"]])
    assert "continuous: knee at B = 4" in legend_texts(fig)  # a single line: its policy
    batch = axes_by_ylabel(fig, "mean batch\n(requests)")
    (reached,) = gid_lines(batch, "mean-batch")
    assert list(reached.get_ydata()) == pytest.approx([1, 2, 4, 4, 4])
    title = suptitle(fig)
    assert "llama-2-7b" in title and "a100-80gb" in title and "continuous" in title


def test_knee_with_seeds_draws_confidence_intervals(tmp_path):
    out = tmp_path / "seeds"
    exp = experiment(workload=poisson(8.0, 30))
    batchsim.sweep(
        exp, {"scheduler.max_num_seqs": [2, 4, 8]}, seeds=3, executor=INLINE, out_dir=out
    )
    fig = figure("knee", [out])
    ax = axes_by_ylabel(fig, "output throughput (tok/s)")
    (line,) = gid_lines(ax, "throughput")
    stats = pd.read_csv(out / "sweep_stats.csv")
    assert list(line.get_ydata()) == pytest.approx(list(stats["output_throughput"]))
    bars = [c for c in ax.collections if len(c.get_segments()) == 3]
    assert bars, "no error bars"
    lengths = sorted(abs(s[1][1] - s[0][1]) / 2 for s in bars[0].get_segments())
    assert lengths == pytest.approx(sorted(stats["output_throughput_ci95"]))
    assert any("95 % CI" in t for t in legend_texts(fig))


def test_knee_zip_partners_of_the_cap_do_not_split_lines(tmp_path):
    out = tmp_path / "zip"
    grid = {
        ("scheduler.max_num_seqs", "scheduler.max_num_batched_tokens"): [
            (2, 512),
            (4, 1024),
            (8, 2048),
        ]
    }
    batchsim.sweep(experiment(), grid, executor=INLINE, out_dir=out)
    ax = axes_by_ylabel(figure("knee", [out]), "output throughput (tok/s)")
    assert len(gid_lines(ax, "throughput")) == 1


def test_knee_roofline_context_from_the_workload_without_csvs(tmp_path):
    out = tmp_path / "summary-only"
    batchsim.sweep(
        experiment(),
        {"scheduler.max_num_seqs": [2, 8]},
        executor=INLINE,
        out_dir=out,
        summary_only=True,
    )
    assert not list(out.glob("points/*/requests.csv"))
    texts = legend_texts(figure("knee", [out]))
    expected = roofline_json(PROMPT + OUTPUT // 2)["knee_batch_size"]
    roof = next(t for t in texts if t.startswith("roofline"))
    assert f"B = {expected}" in roof and "40 tokens (workload lengths)" in roof


def test_knee_latency_metric_is_selectable(knee_dir):
    fig = figure("knee", [knee_dir], PlotOptions(metrics=["p99_tpot_ms"]))
    latency = axes_by_ylabel(fig, "p99 TPOT (ms)")
    table = pd.read_csv(knee_dir / "sweep.csv")
    cont = table[table["scheduler.policy"] == "continuous"].sort_values("scheduler.max_num_seqs")
    line = next(
        ln for ln in gid_lines(latency, "latency") if ln.get_color() == POLICY_COLORS["continuous"]
    )
    assert list(line.get_ydata()) == pytest.approx(list(cont["p99_tpot_ms"]))
    assert "p99 TPOT" in suptitle(fig)


@pytest.mark.parametrize("metrics", [["p99_throughput"], ["output_throughput"], ["a", "b"]])
def test_knee_refuses_unknown_metrics_naming_the_allowed(knee_dir, metrics):
    with pytest.raises(ConfigError) as info:
        figure("knee", [knee_dir], PlotOptions(metrics=metrics))
    message = str(info.value)
    assert "\n" not in message and "p99_itl_ms" in message and "p99_tpot_ms" in message


# ---- latency-throughput ----------------------------------------------------------------------


def test_latency_throughput_figure_of_a_load_sweep(load_dir, tmp_path):
    fig = figure("latency-throughput", [load_dir])
    ttft = axes_by_ylabel(fig, "TTFT (ms)")
    tpot = axes_by_ylabel(fig, "TPOT (ms)")
    table = pd.read_csv(load_dir / "sweep.csv")
    for ax, name, slo in ((ttft, "ttft", SLO["ttft_ms"]), (tpot, "tpot", SLO["tpot_ms"])):
        assert ax.get_xlabel() == "achieved output throughput (tok/s)"
        p50, p99 = gid_lines(ax, "p50"), gid_lines(ax, "p99")
        assert len(p50) == len(p99) == len(POLICIES)
        assert all(ln.get_linestyle() == "-" for ln in p50)
        assert all(ln.get_linestyle() == "--" for ln in p99)
        # the lines run through the table's points, in order of the arrival rate
        for policy in POLICIES:
            rows = table[table["scheduler.policy"] == policy].sort_values("workload.arrival.rate")
            for lines, column in ((p50, f"median_{name}_ms"), (p99, f"p99_{name}_ms")):
                line = next(ln for ln in lines if ln.get_color() == POLICY_COLORS[policy])
                assert list(line.get_xdata()) == pytest.approx(list(rows["output_throughput"]))
                assert list(line.get_ydata()) == pytest.approx(list(rows[column]))
        (slo_line,) = gid_lines(ax, "slo")
        assert list(slo_line.get_ydata()) == [slo, slo]
        assert any(f"SLO {name.upper()} {slo:,.0f} ms" == t.get_text() for t in ax.texts)
        # log y exactly when the values drawn (and the SLO) span more than two decades
        values = [*table[f"median_{name}_ms"], *table[f"p99_{name}_ms"], slo]
        assert ax.get_yscale() == ("log" if max(values) > 100 * min(values) else "linear")
    texts = legend_texts(fig)
    assert {"static", "continuous", "p50 (median)", "p99"} <= set(texts)
    title = suptitle(fig)
    assert "llama-2-7b" in title and "a100-80gb" in title and "rate varied" in title
    assert_saves(fig, tmp_path)


def test_latency_throughput_without_slo_and_over_concurrency(tmp_path):
    out = tmp_path / "closed"
    workload = {k: v for k, v in poisson().items() if k != "arrival"}
    workload["concurrency"] = 2
    batchsim.sweep(
        experiment(workload=workload),
        {"workload.concurrency": [1, 4, 16]},
        executor=INLINE,
        out_dir=out,
    )
    assert lt_kind.applies(load(out)) and not knee_kind.applies(load(out))
    fig = figure("latency-throughput", [out])
    ttft = axes_by_ylabel(fig, "TTFT (ms)")
    assert len(gid_lines(ttft, "p50")) == 1 and gid_lines(ttft, "slo") == []
    rows = pd.read_csv(out / "sweep.csv").sort_values("workload.concurrency")
    (p50,) = gid_lines(ttft, "p50")
    assert list(p50.get_xdata()) == pytest.approx(list(rows["output_throughput"]))


# ---- capacity --------------------------------------------------------------------------------


def test_capacity_figure(capacity_dir, tmp_path):
    fig = figure("capacity", [capacity_dir])
    (ax,) = fig.axes
    assert ax.get_xlabel() == "max sustained arrival rate (req/s)"
    table = pd.read_csv(capacity_dir / "capacity.csv")
    table["error"] = table["error"].fillna("")
    assert len(table) == len(CONFIGS)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"policy={policy}, tensor_parallel_size={tp}" for policy, tp in CONFIGS]
    # a bar per configuration that ran, as long as its max_request_rate; none for the error
    ran = table[table["error"] == ""]
    assert len(ran) == 2 and table["error"].iloc[2] != ""
    bars = [p for p in ax.patches if p.get_width() == p.get_width()]  # NaN width: no bar
    assert [b.get_width() for b in bars if b.get_width() > 0] == pytest.approx(
        list(ran["max_request_rate"])
    )
    colors = [POLICY_COLORS[p] for p, _ in CONFIGS[:2]]
    from matplotlib.colors import to_hex

    assert [to_hex(b.get_facecolor()) for b in bars[:2]] == [c.lower() for c in colors]
    notes = [t.get_text() for t in ax.texts]
    assert len(notes) == len(CONFIGS)
    assert "per GPU" not in notes[0] and "per GPU" in notes[1]  # two GPUs at tp = 2
    assert f"{ran['max_request_rate_per_gpu'].iloc[1]:,.3g} req/s per GPU" in notes[1]
    assert notes[2].startswith("error:") and "tensor_parallel_size" in notes[2].replace("\n", " ")
    for note, limited in zip(notes[:2], ran["limited_by"]):
        assert "limit: " in note
        if limited.startswith("p99_ttft_ms"):
            assert "p99 TTFT" in note and "> 1,000 ms" in note
        elif limited.startswith("queue grows"):
            assert "queue grows" in note
    title = suptitle(fig)
    assert "p99 TTFT ≤ 1,000 ms" in title and "queue growth ≤ 0.05" in title
    assert "llama-2-7b" in title and "a100-80gb" in title
    assert_saves(fig, tmp_path)


@pytest.mark.parametrize(
    ("limited_by", "short"),
    [
        ("p99_ttft_ms 2017 > 2000", "p99 TTFT 2,017 > 2,000 ms"),
        ("p99_tpot_ms 20.09 > 20", "p99 TPOT 20.1 > 20 ms"),
        ("mean_e2el_ms undefined > 500", "mean E2E latency undefined > 500 ms"),
        ("queue grows (queue_delay_growth 0.0612 > 0.05)", "queue grows"),
        ("nothing up to 8192 req/s", "no limit found up to 8,192 req/s"),
        ("slo_attainment 0.85 < 0.9", "SLO attainment 0.85 < 0.9"),
        (
            "no rate from 0.0078125 to 16 req/s is sustained; at 0.0078125: "
            "p99_ttft_ms 4.713e+06 > 2000",
            "no rate sustained in [0.00781, 16] req/s; at 0.00781: p99 TTFT 4,713,000 > 2,000 ms",
        ),
        ("", ""),
    ],
)
def test_capacity_shortens_limited_by(limited_by, short):
    assert capacity_kind.short_limit(limited_by) == short


# ---- which kind draws which folder, and the errors -------------------------------------------


def test_applies(knee_dir, load_dir, capacity_dir):
    run = load(next((knee_dir / "points").iterdir()))
    knee, sweep_over_load, study = load(knee_dir), load(load_dir), load(capacity_dir)
    assert [knee_kind.applies(s) for s in (run, knee, sweep_over_load, study)] == [
        False,
        True,
        False,
        False,
    ]
    assert [lt_kind.applies(s) for s in (run, knee, sweep_over_load, study)] == [
        False,
        False,
        True,
        False,
    ]
    assert [capacity_kind.applies(s) for s in (run, knee, sweep_over_load, study)] == [
        False,
        False,
        False,
        True,
    ]


@pytest.mark.parametrize(
    ("kind", "folder", "words"),
    [
        ("knee", "run", "a run folder, not a sweep"),
        ("knee", "load", "not scheduler.max_num_seqs"),
        ("knee", "capacity", "a capacity study, not a sweep"),
        ("latency-throughput", "run", "a run folder, not a sweep"),
        ("latency-throughput", "knee", "no load key"),
        ("latency-throughput", "capacity", "a capacity study, not a sweep"),
        ("capacity", "run", "a run folder, not a capacity study"),
        ("capacity", "knee", "a sweep, not a capacity study"),
    ],
)
def test_folders_a_kind_cannot_draw_are_one_line_errors(
    kind, folder, words, knee_dir, load_dir, capacity_dir
):
    dirs = {"knee": knee_dir, "load": load_dir, "capacity": capacity_dir}
    path = next((knee_dir / "points").iterdir()) if folder == "run" else dirs[folder]
    with pytest.raises(ConfigError) as info:
        figure(kind, [path])
    message = str(info.value)
    assert "\n" not in message and words in message and str(path) in message


def test_a_sweep_whose_points_all_failed_is_a_one_line_error(knee_dir, tmp_path):
    import shutil

    copy = tmp_path / "failed"
    shutil.copytree(knee_dir, copy)
    table = pd.read_csv(copy / "sweep.csv")
    table["error"] = "boom"
    with np.errstate(invalid="ignore"):  # numpy < 1.25 warns writing NaN as text
        table.to_csv(copy / "sweep.csv", index=False)
    with pytest.raises(ConfigError, match="no point of the sweep ran") as info:
        figure("knee", [copy])
    assert "\n" not in str(info.value)


def test_cli_plot_knee(knee_dir, tmp_path, capsys):
    out = tmp_path / "knee.svg"
    assert cli.main(["plot", "knee", str(knee_dir), "-o", str(out)]) == 0
    assert out.stat().st_size > 5000
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    run = next((knee_dir / "points").iterdir())
    assert cli.main(["plot", "knee", str(run), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("batchsim: error: ") and str(run) in err
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_writes_kind_png_into_the_folder_by_default(load_dir, capacity_dir):
    assert cli.main(["plot", "latency-throughput", str(load_dir)]) == 0
    assert (load_dir / "latency-throughput.png").stat().st_size > 5000
    assert cli.main(["plot", "capacity", str(capacity_dir)]) == 0
    assert (capacity_dir / "capacity.png").stat().st_size > 5000


# ---- several configurations of one policy ----------------------------------------------------

GPUS = ["a100-80gb", "h100-sxm"]


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep over cap, policy and GPU: two lines of each policy."""
    out = tmp_path_factory.mktemp("plots") / "mixed"
    grid = {"scheduler.max_num_seqs": [1, 4], "scheduler.policy": POLICIES, "hardware": GPUS}
    exp = experiment(workload={**poisson(4.0, 24), "prompt_tokens": {"dist": "fixed", "value": 32}})
    batchsim.sweep(exp, grid, executor=INLINE, out_dir=out)
    return out


def policy_of(label: str) -> str:
    return next(p for p in POLICIES if f"policy={p}" in label)


@pytest.mark.parametrize("kind", ["knee", "sweep", "cdf"])
def test_a_policy_keeps_its_colour_when_several_lines_share_it(mixed_dir, kind):
    """Lines of one policy on two GPUs take the policy's colour (not two other colours) and
    differ by marker, or by line style in the CDF."""
    fig = figure(kind, [mixed_dir])
    if kind == "knee":
        lines = gid_lines(axes_by_ylabel(fig, "output throughput (tok/s)"), "throughput")
        labels = [t for t in legend_texts(fig) if "policy=" in t]
    elif kind == "sweep":
        lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
        labels = [ln.get_label() for ln in lines]
    else:
        lines = fig.axes[0].get_lines()
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(lines) == len(labels) == (4 if kind != "cdf" else 8)
    for line, label in zip(lines, labels):  # the policy's colour, or a lighter tint of it
        assert tint_of(line.get_color(), POLICY_COLORS[policy_of(label)]) is not None, label
    for policy in POLICIES:
        mine = [ln for ln, lb in zip(lines, labels) if policy_of(lb) == policy]
        assert len({ln.get_color() for ln in mine}) == len(mine)
        look = {ln.get_linestyle() if kind == "cdf" else ln.get_marker() for ln in mine}
        assert len(look) == len(mine), (policy, look)


def test_knee_names_the_gpu_of_each_roofline_knee(mixed_dir):
    fig = figure("knee", [mixed_dir])
    roofs = [t for t in legend_texts(fig) if "roofline knee B" in t or "memory-bound" in t]
    assert len(roofs) == 2
    assert any("on a100-80gb:" in t for t in roofs) and any("on h100-sxm:" in t for t in roofs)
    # drawn in greys: a colour in these figures means a policy
    handles = [h for legend in fig.legends for h in legend.legend_handles]
    marks = [h for h in handles if "roofline knee B" in h.get_label() or "bound" in h.get_label()]
    assert len(marks) == 2
    assert not {h.get_color() for h in marks} & set(POLICY_COLORS.values())
    assert "GPUs varied" in suptitle(fig) and "policy varied" in suptitle(fig)
    sweep_title = suptitle(figure("sweep", [mixed_dir]))
    assert "GPUs varied" in sweep_title and "policy varied" in sweep_title


def test_latency_throughput_keeps_policy_colours_across_gpus(tmp_path):
    out = tmp_path / "load"
    grid = {"workload.arrival.rate": [2.0, 8.0], "scheduler.policy": POLICIES, "hardware": GPUS}
    batchsim.sweep(experiment(workload=poisson(4.0, 24)), grid, executor=INLINE, out_dir=out)
    fig = figure("latency-throughput", [out])
    p50 = gid_lines(axes_by_ylabel(fig, "TTFT (ms)"), "p50")
    labels = [t for t in legend_texts(fig) if "policy=" in t]
    assert len(p50) == len(labels) == 4
    for line, label in zip(p50, labels):  # the policy's colour, or a lighter tint of it
        assert tint_of(line.get_color(), POLICY_COLORS[policy_of(label)]) is not None, label
    for policy in POLICIES:
        markers = {ln.get_marker() for ln, lb in zip(p50, labels) if policy_of(lb) == policy}
        assert len(markers) == 2
