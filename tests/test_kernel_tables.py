"""Measured GEMM corrections: the table file, the calibration from kernel tables, and
``batchsim kernel`` (the public per-kernel prediction)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from batchsim import cli
from batchsim.calibration.kernel_tables import read_gemm_measurements
from batchsim.catalog.gemm_table import parse_gemm_table
from batchsim.catalog.hardware_files import load_hardware
from batchsim.cost.gemm import Gemm, GemmPricing
from batchsim.cost.kernels import kernel
from batchsim.errors import ConfigError

TABLE = """\
# a hand-written table
dtype,n,k,2,8
bf16,128,128,0,1000
bf16,128,512,100,-100
bf16,512,128,200,200
bf16,512,512,-300,300
"""


def test_table_values_at_grid_points_and_between() -> None:
    t = parse_gemm_table(TABLE, "t.csv")
    assert t.m == (2, 8) and t.n == (128, 512) and t.k == (128, 512)
    assert t.log_factor("bf16", 2, 128, 128) == pytest.approx(0.0)
    assert t.log_factor("bf16", 8, 128, 128) == pytest.approx(1.0)
    assert t.log_factor("bf16", 8, 512, 512) == pytest.approx(0.3)
    # m = 4 is half way between 2 and 8 in ln m: the mean of the two values
    assert t.log_factor("bf16", 4, 128, 128) == pytest.approx(0.5)
    # n = 256, k = 128: half way in ln n between rows (128,128) and (512,128), at m = 2
    assert t.log_factor("bf16", 2, 256, 128) == pytest.approx(0.1)
    # the centre of the cube: the mean of all eight corners
    corners = [0, 1, 0.1, -0.1, 0.2, 0.2, -0.3, 0.3]
    assert t.log_factor("bf16", 4, 256, 256) == pytest.approx(sum(corners) / 8)
    # held at the edges, and no correction for a dtype the table lacks
    assert t.log_factor("bf16", 1, 64, 64) == pytest.approx(0.0)
    assert t.log_factor("bf16", 4096, 65536, 65536) == pytest.approx(0.3)
    assert t.log_factor("fp8", 4, 256, 256) == 0.0
    assert t.factor("bf16", 8, 128, 128) == pytest.approx(math.e)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("m,n,k,1\n", 1, "header must start with dtype,n,k"),
        ("dtype,n,k,4,2\n", 1, "strictly increasing"),
        ("dtype,n,k,1,2\nbf16,128,128,1\n", 2, "expected 5 comma-separated cells"),
        ("dtype,n,k,1\nint3,128,128,1\n", 2, "dtype 'int3' is not one of bf16, fp8"),
        ("dtype,n,k,1\nbf16,128,128,9999\n", 2, "must be in [-5000, 5000]"),
        ("dtype,n,k,1\nbf16,128,128,0.5\n", 2, "is not an integer"),
        ("dtype,n,k,1\nbf16,128,128,1\nbf16,128,128,2\n", 3, "appears twice (first on line 2)"),
        ("dtype,n,k,1\nbf16,1x,128,1\n", 2, "n and k must be integers"),
    ],
)
def test_bad_table_names_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_gemm_table(text, "bad.gemm.csv")
    assert err.value.source == "bad.gemm.csv" and err.value.line == line
    assert words in err.value.message


def test_table_missing_a_pair_is_refused() -> None:
    text = "dtype,n,k,1\nbf16,128,128,0\nbf16,256,512,0\n"
    with pytest.raises(ConfigError, match="bf16 has no row for n=128 k=512"):
        parse_gemm_table(text, "t.csv")


def _profile(tmp_path: Path, table_line: str, table_text: str | None = TABLE) -> Path:
    base = (Path(__file__).parents[1] / "hardware_profiles" / "a100-80gb.yaml").read_text()
    text = base.replace("\nsources:\n", f"\n{table_line}\nsources:\n", 1)
    text = text.replace("name: a100-80gb", "name: mine", 1)
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    if table_text is not None:
        (tmp_path / "mine.gemm.csv").write_text(table_text)
    return path


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("gemm_table: /etc/passwd", "must name a file beside the profile or a built-in table"),
        ("gemm_table: ../x.gemm.csv", "must name a file beside the profile or a built-in table"),
        ("gemm_table: missing.gemm.csv", "gemm_table: no file"),
    ],
)
def test_profile_gemm_table_key_rules(tmp_path: Path, line: str, words: str) -> None:
    path = _profile(tmp_path, line)
    with pytest.raises(ConfigError, match=words) as err:
        load_hardware(str(path))
    assert err.value.line is not None


def test_bad_table_of_a_profile_is_exit_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _profile(tmp_path, "gemm_table: mine.gemm.csv", "dtype,n,k,1\nbf16,128,128,x\n")
    code = cli.main(["kernel", "--hardware", str(path), "gemm", "--m", "1", "--n", "8", "--k", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "mine.gemm.csv:2:" in err[0] and "is not an integer" in err[0]


def test_correction_multiplies_only_the_time(tmp_path: Path) -> None:
    hw = load_hardware(str(_profile(tmp_path, "gemm_table: mine.gemm.csv")))
    assert hw.gemm_table is not None and hw.ideal().gemm_table is None
    plain = load_hardware("a100-80gb")
    with_table = kernel(hw, "gemm", m=8, n=128, k=128)
    without = kernel(plain, "gemm", m=8, n=128, k=128)
    assert with_table.time_us == pytest.approx(without.time_us * math.e)  # value 1000
    assert (with_table.flops, with_table.bytes, with_table.bound) == (
        without.flops,
        without.bytes,
        without.bound,
    )
    # grouped GEMMs (heads, experts) are not corrected
    args = dict(
        peak=1e14,
        bandwidth=1e12,
        num_sms=100,
        min_kernel_time=5e-6,
        transition_exponent=2.0,
        tile_m=128,
        tile_n=128,
        weight_bytes=2.0,
    )
    corrected = GemmPricing(**args, correction=lambda m, n, k: 1.0)
    bare = GemmPricing(**args)
    grouped = Gemm(128, 128, groups=4.0)
    assert corrected.price(grouped, 8.0).time == bare.price(grouped, 8.0).time
    assert corrected.price(Gemm(128, 128), 8.0).time == pytest.approx(
        bare.price(Gemm(128, 128), 8.0).time * math.e
    )
    # ideal pricing ignores the correction
    ideal = GemmPricing(**args, ideal=True, correction=lambda m, n, k: 1.0)
    assert (
        ideal.price(Gemm(128, 128), 8.0).time
        == GemmPricing(**args, ideal=True).price(Gemm(128, 128), 8.0).time
    )


# ---- calibration from a kernel table ----------------------------------------------------
PEAK, BW = 989.4e12, 3.35e12  # h100-sxm's datasheet bf16 peak and bandwidth
M_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
NK_GRID = (128, 512, 2048, 8192)


def synthetic_ms(m: int, n: int, k: int) -> float:
    """A GPU that is a plain roofline at 50 % of peak and 60 % of bandwidth, plus 7 us."""
    flops = 2.0 * m * n * k
    nbytes = 2.0 * n * k + 2.0 * m * (n + k)
    return (max(flops / (0.5 * PEAK), nbytes / (0.6 * BW)) + 7e-6) * 1e3


def write_table(path: Path) -> None:
    lines = ["framework,gemm_dtype,m,n,k,latency,kernel_source"]
    for m in M_GRID:
        for n in NK_GRID:
            for k in NK_GRID:
                ms = synthetic_ms(m, n, k)
                lines.append(f"VLLM,bfloat16,{m},{n},{k},{ms!r},fast")
                lines.append(f"VLLM,bfloat16,{m},{n},{k},{ms * 1.5!r},slow")  # slower: dropped
                lines.append(f"VLLM,int4_wo,{m},{n},{k},1.0,other")  # not priced: dropped
    path.write_text("\n".join(lines) + "\n")


def test_read_gemm_measurements_keeps_the_fastest_kernel(tmp_path: Path) -> None:
    path = tmp_path / "gemm_perf.csv"
    write_table(path)
    rows = read_gemm_measurements(path)
    assert len(rows) == len(M_GRID) * len(NK_GRID) ** 2
    assert set(rows["dtype"]) == {"bf16"}
    one = rows[(rows.m == 64) & (rows.n == 512) & (rows.k == 2048)]["time_s"].item()
    assert one == pytest.approx(synthetic_ms(64, 512, 2048) * 1e-3)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("gemm_dtype,m,n,k\nbfloat16,1,2,3\n", "missing latency"),
        ("gemm_dtype,m,n,k,latency\nbfloat16,1,2,3,-1\n", "latency must be a positive number"),
        ("gemm_dtype,m,n,k,latency\nbfloat16,1,2.5,3,1\n", "column n must hold positive integers"),
        ("gemm_dtype,m,n,k,latency\nmxfp8,1,2,3,1\n", "no rows of a dtype batchsim prices"),
    ],
)
def test_bad_kernel_table_is_exit_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
) -> None:
    table = tmp_path / "t.csv"
    table.write_text(text)
    out = tmp_path / "new.yaml"
    argv = ["calibrate", "--hardware", "h100-sxm", "--kernel-table", str(table), "-o", str(out)]
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0]
    assert list(tmp_path.iterdir()) == [table]


def test_calibrated_profile_reproduces_its_kernel_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "gemm_perf.csv"
    write_table(table)
    out = tmp_path / "mine.yaml"
    argv = ["calibrate", "--hardware", "h100-sxm", "--kernel-table", str(table), "-o", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "with corrections" in printed and "wrote" in printed
    assert (tmp_path / "mine.gemm.csv").is_file()
    hw = load_hardware(str(out))
    assert hw.gemm_table is not None and hw.sources["gemm_table"]
    # at every measured shape: the measurement, to the 0.05 % the file's rounding keeps
    for m in M_GRID:
        for n in NK_GRID:
            for k in NK_GRID:
                got = kernel(hw, "gemm", m=m, n=n, k=k).time_us
                assert got == pytest.approx(synthetic_ms(m, n, k) * 1e3, rel=6e-4)
    # between grid points of a memory-bound region the smooth truth is followed closely
    for m, n, k in ((3, 1024, 1024), (48, 4096, 4096), (12, 300, 5000)):
        got = kernel(hw, "gemm", m=m, n=n, k=k).time_us
        assert got == pytest.approx(synthetic_ms(m, n, k) * 1e3, rel=0.05)
    # through the command line as one JSON object
    argv = ["kernel", "--hardware", str(out), "--json", "gemm", "--m", "64"]
    assert cli.main([*argv, "--n", "2048", "--k", "512"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"time_us", "bound", "flops", "bytes"}
    assert result["time_us"] == pytest.approx(synthetic_ms(64, 2048, 512) * 1e3, rel=6e-4)


# ---- batchsim kernel: closed forms ---------------------------------------------------------
def test_kernel_flops_bytes_and_bound_closed_forms() -> None:
    g = kernel("a100-80gb", "gemm", m=64, n=4096, k=1024)
    assert g.flops == 2 * 64 * 4096 * 1024
    assert g.bytes == 2 * 4096 * 1024 + 2 * 64 * (4096 + 1024)
    assert g.bound == "memory"
    assert kernel("a100-80gb", "gemm", m=16384, n=16384, k=16384).bound == "compute"
    f8 = kernel("h100-sxm", "gemm", m=64, n=4096, k=1024, dtype="fp8")
    assert f8.bytes == 4096 * 1024 + 2 * 64 * (4096 + 1024)  # 1-byte weights
    # one decode step of 8 sequences over 1,000 cached tokens: every (query, key) pair, all
    # K and V read once, the queries and outputs in 16 bits
    a = kernel(
        "a100-80gb",
        "attention",
        phase="generation",
        batch=8,
        kv_len=1000,
        heads=32,
        kv_heads=8,
        head_dim=128,
    )
    assert a.flops == 8 * 1001 * 32 * 4 * 128
    assert a.bytes == 8 * 1001 * 2 * 8 * 128 * 2 + 8 * 2 * 32 * 128 * 2
    assert a.bound == "memory"
    c = kernel(
        "a100-80gb",
        "attention",
        phase="context",
        batch=2,
        q_len=4096,
        kv_len=0,
        heads=32,
        kv_heads=8,
        head_dim=128,
    )
    assert c.flops == 2 * (4096 * 4097 // 2) * 32 * 4 * 128  # causal pairs
    assert c.bound == "compute"


def test_allreduce_kernel_is_the_ring_formula_of_the_profile() -> None:
    # a100-80gb: NVLink3 300 GB/s per direction x 0.84 interconnect efficiency... read from
    # the YAML so that the test does not restate the profile
    import yaml

    doc = yaml.safe_load(
        (Path(__file__).parents[1] / "hardware_profiles" / "a100-80gb.yaml").read_text()
    )
    bw = doc["interconnect_bandwidth_gb_s"] * 1e9 * doc["efficiency"]["interconnect"]
    lat = doc["efficiency"]["interconnect_latency_us"] * 1e-6
    size, n = 64 * 2**20, 4
    r = kernel("a100-80gb", "allreduce", size_bytes=size, gpus=n)
    assert r.time_us == pytest.approx((lat + 2 * (n - 1) / n * size / bw) * 1e6)
    assert r.bound == "bandwidth"
    assert kernel("a100-80gb", "allreduce", size_bytes=1024, gpus=n).bound == "latency"
    assert kernel("a100-80gb", "allreduce", size_bytes=1024, gpus=1).time_us == 0.0


ATTN = ("--hardware", "h100-sxm", "attention")
HEADS_32 = ("--heads", "32", "--kv-heads", "8", "--head-dim", "128")
HEADS_30 = ("--heads", "30", "--kv-heads", "8", "--head-dim", "128")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--hardware", "tpu-v9", "gemm", "--m", "1", "--n", "1", "--k", "1"], "tpu-v9"),
        (["--hardware", "h100-sxm", "gemm", "--m", "0", "--n", "1", "--k", "1"], "--m"),
        (
            [
                "--hardware",
                "h100-sxm",
                "gemm",
                "--m",
                "1",
                "--n",
                "1",
                "--k",
                "1",
                "--dtype",
                "fp4",
            ],
            "fp4",
        ),
        (
            [*ATTN, "--phase", "context", "--batch", "1", "--kv-len", "0", *HEADS_32],
            "q_len is required in the context phase",
        ),
        (
            [*ATTN, "--phase", "generation", "--batch", "1", "--kv-len", "9", *HEADS_30],
            "heads (30) must be a multiple of kv_heads (8)",
        ),
        (["--hardware", "h100-sxm", "conv"], "invalid choice: 'conv'"),
        (["--hardware", "h100-sxm", "moe", "--tokens", "1"], "arguments are required: --hidden"),
    ],
)
def test_kernel_bad_input_is_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["kernel", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0]


def test_kernel_api_rejects_unknown_and_missing_keywords() -> None:
    with pytest.raises(ConfigError, match="unknown keyword 'rows'"):
        kernel("h100-sxm", "gemm", rows=1, n=1, k=1)
    with pytest.raises(ConfigError, match="gemm: k is required"):
        kernel("h100-sxm", "gemm", m=1, n=1)
    with pytest.raises(ConfigError, match="m must be an integer"):
        kernel("h100-sxm", "gemm", m=1.5, n=1, k=1)
    with pytest.raises(ConfigError, match="kind must be one of gemm, attention, moe, allreduce"):
        kernel("h100-sxm", "conv", m=1)


def test_moe_kernel_prices_the_touched_experts_gemms() -> None:
    # One token routed to k of E experts touches exactly k of them: FLOPs 2 x k x 3 h i (gate,
    # up and down of a gated expert), weight bytes k x 3 h i x bytes per weight (fp8: 1)
    h, i, k, e = 4096, 2048, 6, 256
    one = kernel("h100-sxm", "moe", tokens=1, hidden=h, inter=i, top_k=k, experts=e, dtype="fp8")
    assert one.flops == 2 * k * 3 * h * i
    activations = 2 * (h + 2 * i) + 2 * (i + h)  # 16-bit in and out of each GEMM, per expert
    assert one.bytes == pytest.approx(k * (3 * h * i + activations), rel=1e-12)
    assert one.bound == "memory"
    # tensor parallelism splits each expert: 1/4 of the FLOPs and weights per GPU
    tp4 = kernel(
        "h100-sxm", "moe", tokens=1, hidden=h, inter=i, top_k=k, experts=e, tp=4, dtype="fp8"
    )
    assert tp4.flops == one.flops / 4


def test_kernel_moe_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kernel", "--hardware", "b200", "--json", "moe", "--tokens", "64", "--hidden"]
    argv += ["7168", "--inter", "2048", "--top-k", "8", "--experts", "256", "--tp", "8"]
    assert cli.main([*argv, "--dtype", "nvfp4"]) == 0
    out = json.loads(capsys.readouterr().out)
    api = kernel(
        "b200", "moe", tokens=64, hidden=7168, inter=2048, top_k=8, experts=256, tp=8, dtype="nvfp4"
    )
    assert out["time_us"] == pytest.approx(api.time_us, rel=1e-12)
    bad = ["kernel", "--hardware", "b200", "moe", "--tokens", "1", "--hidden", "8", "--inter"]
    assert cli.main([*bad, "6", "--top-k", "9", "--experts", "8"]) == 2
    assert "top_k (9) must be at most experts (8)" in capsys.readouterr().err
    assert cli.main([*bad, "6", "--top-k", "1", "--experts", "8", "--tp", "4"]) == 2
    assert "inter (6) must be a multiple of tp (4)" in capsys.readouterr().err


def test_moe_compute_fit_recovers_the_value_a_table_was_made_with(tmp_path: Path) -> None:
    # a table timed by the model itself at moe_compute 0.6 (bf16, >= 5 us): the fit finds 0.6
    from batchsim.calibration.moe_tables import (
        fit_moe_compute,
        moe_model_times,
        read_moe_measurements,
    )
    from batchsim.calibration.predict import with_terms

    hw = load_hardware("h100-sxm")
    shapes = [(t, 4096, 1536, 8, 128, 1) for t in (64, 256, 1024, 4096, 16384)]
    shapes += [(t, 7168, 2048, 8, 256, 8) for t in (128, 2048, 8192)]
    frame = pd.DataFrame(shapes, columns=["tokens", "hidden", "inter", "top_k", "experts", "tp"])
    frame["dtype"] = "bf16"
    made = moe_model_times(with_terms(hw, {"moe_compute": 0.6}), frame) * 1e3  # ms
    path = tmp_path / "moe.csv"
    path.write_text(
        "moe_dtype,num_tokens,hidden_size,inter_size,topk,num_experts,moe_tp_size,moe_ep_size,"
        "distribution,latency\n"
        + "".join(
            f"bfloat16,{t},{h},{i},{k},{e},{tp},1,balanced,{float(ms)!r}\n"
            for (t, h, i, k, e, tp), ms in zip(shapes, made)
        )
        + "bfloat16,64,4096,1536,8,128,1,4,balanced,1e-6\n"  # expert parallel: left out
        + "int4_wo,64,4096,1536,8,128,1,1,balanced,1e-6\n",  # no batchsim dtype: left out
        encoding="utf-8",
    )
    rows = read_moe_measurements(path)
    assert len(rows) == len(shapes)
    assert fit_moe_compute(hw, rows) == pytest.approx(0.6)


def test_attention_fit_reproduces_a_table_the_model_made(tmp_path: Path) -> None:
    # both phases timed by the model at other attention terms: the fit, started from the
    # profile's own, prices the table's kernels within 2 % at the median
    from batchsim.calibration.attention_tables import (
        attention_errors,
        attention_model_times,
        fit_attention_terms,
        read_attention_measurements,
    )
    from batchsim.calibration.predict import with_terms

    hw = load_hardware("h100-sxm")
    truth = {"attention": 0.7, "attention_sm_bandwidth": 1.3, "attention_kernel_time_us": 9.0}
    header = "batch_size,isl,num_heads,num_key_value_heads,head_dim,kv_cache_dtype,step,"
    header += "window_size,latency\n"
    rows = []
    for phase in ("context", "generation"):
        shapes = [
            (b, n, h, kv, 128)
            for b in (1, 4, 16, 64)
            for n in (512, 2048, 8192)
            for h, kv in ((32, 8), (64, 8))
        ]
        frame = pd.DataFrame(shapes, columns=["batch", "n", "heads", "kv_heads", "head_dim"])
        frame = frame.assign(
            phase=phase,
            dtype="bf16",
            q_len=frame["n"] if phase == "context" else 1,
            kv_len=0 if phase == "context" else frame["n"],
        )
        ms = attention_model_times(with_terms(hw, truth), frame) * 1e3
        path = tmp_path / f"{phase}.csv"
        path.write_text(
            header
            + "".join(
                f"{b},{n if phase == 'context' else 1},{h},{kv},{d},bfloat16,"
                f"{0 if phase == 'context' else n},0,{float(t)!r}\n"
                for (b, n, h, kv, d), t in zip(shapes, ms)
            )
            + "1,1,30,8,128,bfloat16,0,0,1.0\n"  # 30 heads over 8 KV heads: left out
            + "1,1,32,8,128,bfloat16,0,128,1.0\n",  # a sliding window: left out
            encoding="utf-8",
        )
        rows.append(read_attention_measurements(path, phase))
    table = pd.concat(rows)
    assert len(table) == 2 * len(shapes)
    terms, _ = fit_attention_terms(hw, table)
    errors = attention_errors(with_terms(hw, terms), table)
    assert (errors["median_err_pct"] < 2.0).all()
