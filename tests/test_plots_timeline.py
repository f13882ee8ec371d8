"""``batchsim plot timeline``: batch slots over time, drawn from ``slots.csv``."""

from __future__ import annotations

import re

import numpy as np
import pytest

import batchsim
from batchsim import cli
from batchsim.errors import ConfigError
from batchsim.plots import PlotOptions, figure
from conftest import tiny_experiment

COMPUTING = ("prefill", "chunked_prefill", "decode")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("timeline")
    out = {}
    for policy in ("static", "continuous"):
        exp = tiny_experiment(seed=1, scheduler={"policy": policy, "max_num_seqs": 8})
        exp["metrics"] = {"record_slots": True}
        batchsim.run(exp, root / policy)
        out[policy] = root / policy
    batchsim.run(tiny_experiment(seed=1), root / "plain")
    out["plain"] = root / "plain"
    return out


def boxes(ax):
    """(state, x0, x1, slot) of every rectangle drawn, read back from the figure."""
    out = []
    for collection in ax.collections:
        for path in collection.get_paths():
            v = path.vertices
            out.append((collection.get_label(), v[:, 0].min(), v[:, 0].max(), v[:, 1].mean()))
    return out


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_drawn_slots_at_every_iteration_match_num_seqs_and_num_slots(runs, policy):
    fig = figure("timeline", [runs[policy]])
    ax = fig.axes[0]
    drawn = boxes(ax)
    it = batchsim.plots.data.load_run(runs[policy]).iterations
    mid = (it["start_time_s"] + it["duration_ms"] / 2e3).to_numpy()
    state = np.array([b[0] for b in drawn])
    x0 = np.array([b[1] for b in drawn])
    x1 = np.array([b[2] for b in drawn])
    covering = (x0[:, None] <= mid[None, :]) & (mid[None, :] < x1[:, None])
    computing = covering[np.isin(state, COMPUTING)].sum(axis=0)
    kept = covering[np.isin(state, ("padding", "empty"))].sum(axis=0)
    assert (computing == it["num_seqs"].to_numpy()).all()
    assert (computing + kept == it["num_slots"].to_numpy()).all()
    assert ax.get_xlabel() == "time (s)" and ax.get_ylabel() == "batch slot"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "decode" in legend and "idle (no request in the slot)" in legend
    if policy == "static":
        assert "padding (finished row computed)" in legend


def test_zoom_keeps_only_the_window_and_names_model_and_gpu(runs):
    fig = figure("timeline", [runs["static"], runs["continuous"]], PlotOptions(start=2, end=4))
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert ax.get_xlim() == (2, 4)
        for _, x0, x1, _ in boxes(ax):
            assert 2 <= x0 <= x1 <= 4
        assert "llama-2-7b on a100-80gb" in ax.get_title(loc="left")
    assert "static vs continuous" in fig._suptitle.get_text()


def test_a_run_without_slots_is_a_one_line_error(runs, tmp_path, capsys):
    with pytest.raises(ConfigError, match="record_slots=true"):
        figure("timeline", [runs["plain"]])
    code = cli.main(["plot", "timeline", str(runs["plain"]), "-o", str(tmp_path / "t.png")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "slots.csv" in err
    assert not (tmp_path / "t.png").exists()
    with pytest.raises(ConfigError, match="no iteration between"):
        figure("timeline", [runs["static"]], PlotOptions(start=1e6, end=1e6 + 1))


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_cli_writes_the_figure(runs, tmp_path, suffix):
    out = tmp_path / f"timeline{suffix}"
    assert cli.main(["plot", "timeline", str(runs["static"]), "-o", str(out)]) == 0
    assert out.stat().st_size > 5_000


def test_unknown_formats_and_kinds_are_refused(runs, tmp_path, capsys):
    out = tmp_path / "t.jpg"
    assert cli.main(["plot", "timeline", str(runs["static"]), "-o", str(out)]) == 2
    assert "unknown figure format '.jpg'; use one of .png, .svg, .pdf" in capsys.readouterr().err
    assert cli.main(["plot", "pie", str(runs["static"])]) == 2
    assert "invalid choice: 'pie'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cdf", "--metric", "p99_ttft_ms"], "--metric p99_ttft_ms: plot cdf takes no --metric; "
         "the kinds that do: knee, sweep"),
        (["timeline", "--metric", "x"], "--metric x: plot timeline takes no --metric"),
        (["roofline", "--from", "1"], "--from 1: plot roofline draws the whole result and takes "
         "no --from/--to; the kinds that do: timeline, kv"),
        (["cdf", "--to", "2.5"], "--to 2.5: plot cdf draws the whole result"),
        (["timeline", "--from", "4", "--to", "2"], "--from 4 must be before --to 2"),
        (["kv", "--from", "3", "--to", "3"], "--from 3 must be before --to 3"),
        (["timeline", "--from", "1e9"], "no iteration between --from 1e+09 s and --to the end "
         "(its iterations run from "),
    ],
)  # fmt: skip
def test_options_a_kind_does_not_take_are_refused(runs, tmp_path, capsys, argv, message):
    """An option the kind would ignore, or an empty window, is a one-line error naming it;
    nothing is written."""
    out = tmp_path / "f.png"
    code = cli.main(["plot", argv[0], str(runs["static"]), *argv[1:], "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and message in captured.err
    assert not out.exists()
    options = PlotOptions(
        metrics=argv[2:3] if argv[1] == "--metric" else [],
        start=float(argv[argv.index("--from") + 1]) if "--from" in argv else None,
        end=float(argv[argv.index("--to") + 1]) if "--to" in argv else None,
    )
    with pytest.raises(ConfigError, match=re.escape(message)):  # the API refuses them too
        figure(argv[0], [runs["static"]], options)
