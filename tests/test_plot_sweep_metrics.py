"""``batchsim plot sweep``: summary metrics against the swept key, a line per configuration."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import batchsim
from batchsim import cli
from batchsim.errors import ConfigError
from batchsim.plots import PlotOptions, figure, relevant_kinds
from batchsim.plots.data import load
from batchsim.studies.backends import InlineExecutor
from conftest import tint_of, tiny_experiment


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("plot-sweep") / "s"
    exp = tiny_experiment(scheduler={"policy": "dynamic", "max_num_seqs": 8})
    grid = {"scheduler.max_wait_ms": [0, 50, 200], "scheduler.max_num_seqs": [4, 8]}
    batchsim.sweep(exp, grid, seeds=2, executor=InlineExecutor(), out_dir=out, summary_only=True)
    return out


def test_lines_follow_the_table(sweep_dir):
    options = PlotOptions(metrics=["p99_ttft_ms", "mean_batch_size"])
    fig = figure("sweep", [sweep_dir], options)
    ttft, batch = fig.axes[:2]
    assert ttft.get_ylabel() == "p99 TTFT (ms)" and batch.get_ylabel() == "mean batch (requests)"
    assert batch.get_xlabel() == "scheduler.max_wait_ms (ms)"  # the key with the most values
    stats = pd.read_csv(sweep_dir / "sweep_stats.csv")
    lines = [container.lines[0] for container in batch.containers]  # errorbar: data line first
    assert len(lines) == 2  # one per max_num_seqs
    for line, cap in zip(lines, (4, 8)):
        rows = stats[stats["scheduler.max_num_seqs"] == cap].sort_values("scheduler.max_wait_ms")
        assert list(line.get_xdata()) == [0, 50, 200]
        assert np.allclose(line.get_ydata(), rows["mean_batch_size"])
    legend = [t.get_text() for t in ttft.get_legend().get_texts()]
    assert legend == ["max_num_seqs=4", "max_num_seqs=8"]
    assert "llama-2-7b on a100-80gb" in fig._suptitle.get_text()


def test_unknown_metric_and_wrong_folders(sweep_dir, tmp_path, capsys):
    with pytest.raises(ConfigError, match="--metric p99_ttfs_ms: not a column") as info:
        figure("sweep", [sweep_dir], PlotOptions(metrics=["p99_ttfs_ms"]))
    assert "one of completed, " in str(info.value) and "seed" not in str(info.value)
    single = tmp_path / "single"  # one seed: the table has a seed column, not a metric
    batchsim.sweep(tiny_experiment(), {"scheduler.max_num_seqs": [4, 8]}, out_dir=single,
                   executor=InlineExecutor(), summary_only=True)  # fmt: skip
    with pytest.raises(ConfigError, match="--metric seed: not a column"):
        figure("sweep", [single], PlotOptions(metrics=["seed"]))
    run = tmp_path / "run"
    batchsim.run(tiny_experiment(), run)
    assert cli.main(["plot", "sweep", str(run), "-o", str(tmp_path / "x.png")]) == 2
    assert "draws one sweep folder" in capsys.readouterr().err
    assert "sweep" in relevant_kinds(load(sweep_dir)) and "sweep" not in relevant_kinds(load(run))


def test_cli_writes_png(sweep_dir, tmp_path):
    out = tmp_path / "s.png"
    assert (
        cli.main(["plot", "sweep", str(sweep_dir), "-o", str(out), "--metric", "busy_fraction"])
        == 0
    )
    assert out.stat().st_size > 5_000


def test_lines_of_one_unvaried_policy_take_distinct_hues_and_markers(sweep_dir):
    """The sweep does not vary the policy (dynamic): its colour tells no line apart, so the
    first line keeps it and the other takes another hue of the palette (not a tint of it),
    with its own marker and line style."""
    from batchsim.plots.style import OKABE_ITO, POLICY_COLORS

    fig = figure("sweep", [sweep_dir])
    lines = [container.lines[0] for container in fig.axes[0].containers]
    assert len(lines) == 2
    assert lines[0].get_color() == POLICY_COLORS["dynamic"]
    assert lines[1].get_color() in OKABE_ITO
    assert tint_of(lines[1].get_color(), POLICY_COLORS["dynamic"]) is None
    assert len({line.get_marker() for line in lines}) == 2
    assert len({line.get_linestyle() for line in lines}) == 2
    # the first line is drawn wider: the second, drawn over it, leaves it visible
    assert lines[0].get_linewidth() > lines[1].get_linewidth()
    assert "dynamic" in fig._suptitle.get_text()


def test_large_values_on_a_linear_axis_are_plain_numbers():
    """p99 TTFT from 15 s to 1,280 s on a linear axis: ticks read 400,000 and so on, with no
    "1e6" offset written above the axis."""
    from batchsim.plots.style import new_figure
    from batchsim.plots.sweep import _scale_y

    values = np.array([1.28e6, 6.4e5, 3.2e5, 1.6e5, 8e4, 4e4, 2.6e4, 1.8e4, 1.5e4])
    fig, ax = new_figure()
    ax.plot(np.arange(len(values)), values)
    _scale_y(ax, values)
    fig.canvas.draw()
    assert ax.get_yscale() == "linear"
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "400,000" in labels and "1,200,000" in labels
    assert ax.yaxis.get_offset_text().get_text() == ""
