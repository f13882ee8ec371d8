"""Weight precisions as engines run them: NVFP4 on Blackwell's FP4 tensor cores, weight-only
elsewhere; what each stores and which KV cache it implies."""

from __future__ import annotations

import json

import pytest

from batchsim import cli
from batchsim.catalog.hardware_files import load_hardware
from batchsim.catalog.model_files import load_model
from batchsim.config import validate_experiment
from batchsim.cost.gemm import Gemm
from batchsim.cost.kernels import kernel
from batchsim.cost.terms import HardwareTerms
from batchsim.dtypes import DTYPE_BYTES, resolve_kv_dtype
from batchsim.errors import ConfigError
from conftest import tiny_experiment

# NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference"): a
# block of 16 E2M1 values (4 bits each) shares one E4M3 scale (8 bits)
NVFP4_BITS_PER_WEIGHT = (16 * 4 + 8) / 16


def ideal_gemm(hardware: str, m: int, n: int, k: int, dtype: str = "nvfp4"):
    """The datasheet roofline's price of one GEMM (efficiencies 1, no floors, no corrections)."""
    terms = HardwareTerms.from_profile(load_hardware(hardware), dtype, ideal=True)
    return terms.gemm_pricing(DTYPE_BYTES[dtype], ideal=True).price(Gemm(k, n), float(m))


def test_nvfp4_weights_store_four_and_a_half_bits_each() -> None:
    model = load_model("llama-3.1-8b")
    ratio = model.weight_bytes("nvfp4") / model.weight_bytes("bf16")
    assert ratio == pytest.approx(NVFP4_BITS_PER_WEIGHT / 16, rel=1e-12)


@pytest.mark.parametrize(
    ("hardware", "peak_tflops"),
    [("b200", 9000.0), ("b300", 14000.0), ("gb200", 10000.0)],  # the datasheets' dense FP4
)
def test_nvfp4_gemm_runs_at_the_fp4_tensor_core_peak_on_blackwell(hardware, peak_tflops) -> None:
    # ideal profile: a large square GEMM is compute-bound, its time 2 m n k / peak
    m = n = k = 8192
    cost = ideal_gemm(hardware, m, n, k)
    assert cost.compute_time > cost.memory_time
    assert cost.time == pytest.approx(2 * m * n * k / (peak_tflops * 1e12), rel=1e-9)


def test_nvfp4_is_weight_only_on_hopper_bf16_peak_but_four_bit_weight_reads() -> None:
    big = ideal_gemm("h100-sxm", 8192, 8192, 8192)
    assert big.time == pytest.approx(2 * 8192**3 / 989.4e12, rel=1e-9)  # BF16 dense peak
    # a decode GEMM is memory-bound: it reads 4.5-bit weights (and 16-bit activations)
    m, n, k = 1, 8192, 8192
    small = ideal_gemm("h100-sxm", m, n, k)
    weights = n * k * NVFP4_BITS_PER_WEIGHT / 8
    activations = 2 * (m * k + m * n)
    assert small.memory_time > small.compute_time
    assert small.bytes == pytest.approx(weights + activations, rel=1e-12)
    assert small.time == pytest.approx((weights + activations) / 3.35e12, rel=1e-9)


def test_measured_nvfp4_kernels_correct_the_blackwell_profiles_only() -> None:
    for name in ("b200", "b300"):
        assert "nvfp4" in load_hardware(name).gemm_table.values
    assert "nvfp4" not in load_hardware("h100-sxm").gemm_table.values  # no FP4 tensor cores


def test_kv_cache_auto_with_nvfp4_weights_is_bf16_and_nvfp4_is_no_kv_dtype() -> None:
    assert resolve_kv_dtype("auto", "nvfp4") == "bf16"
    config = validate_experiment(tiny_experiment(engine={"dtype": "nvfp4"}, hardware="b200"))
    assert config.engine.dtype == "nvfp4"
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        validate_experiment(tiny_experiment(engine={"kv_cache_dtype": "nvfp4"}))


def test_kernel_command_prices_nvfp4(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kernel", "--hardware", "b200", "--json", "gemm", "--m", "4096", "--n", "8192"]
    assert cli.main([*argv, "--k", "8192", "--dtype", "nvfp4"]) == 0
    out = json.loads(capsys.readouterr().out)
    api = kernel("b200", "gemm", m=4096, n=8192, k=8192, dtype="nvfp4")
    assert out["time_us"] == pytest.approx(api.time_us, rel=1e-12) and out["bound"] == api.bound
    assert out["bytes"] == 8192 * 8192 * 0.5625 + 2 * (4096 * 8192 * 2)  # 4.5-bit weights
