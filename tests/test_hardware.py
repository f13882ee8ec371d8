"""Claims about batchsim.catalog.hardware: profiles load, are sourced, convert to SI, reject
bad input."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim.catalog import catalog_dir, catalog_names
from batchsim.catalog.hardware import (
    CPU_OVERHEAD_DEFAULTS,
    EFFICIENCY_KEYS,
    EfficiencyKey,
    HardwareProfile,
)
from batchsim.catalog.hardware_files import hardware_table, list_hardware, load_hardware
from batchsim.errors import ConfigError
from batchsim.yamlio import read_mapping

HARDWARE_NAMES = catalog_names("hardware_profiles")
REQUIRED_PROFILES = {
    "a100-40gb",
    "a100-80gb",
    "a100-80gb-pcie",
    "a40",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "l4",
    "l40s",
    "mi300x",
    "mi325x",
}


def _raw(name: str) -> dict[str, Any]:
    return read_mapping(catalog_dir("hardware_profiles") / f"{name}.yaml")[0]


def _numeric_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        paths: list[str] = []
        for key, value in node.items():
            paths += _numeric_paths(value, f"{prefix}{key}.")
        return paths
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return [prefix.rstrip(".")]
    return []


# --------------------------------------------------------------------------- catalog


def test_catalog_has_the_required_profiles() -> None:
    assert set(HARDWARE_NAMES) >= REQUIRED_PROFILES


@pytest.mark.parametrize("name", HARDWARE_NAMES)
def test_every_profile_loads_with_positive_si_values(name: str) -> None:
    hw = load_hardware(name)
    assert hw.name == name
    assert hw.description
    assert hw.memory_bandwidth > 1e11  # > 100 GB/s
    assert hw.memory_capacity >= 16e9
    assert hw.interconnect_bandwidth > 0
    assert hw.num_compute_units > 0
    assert hw.peak_flops_for("bf16") > 1e14
    assert set(hw.peak_flops) == {"bf16", "fp16", "fp8", "int8", "int4", "fp4"}
    # Dense datasheet peaks: low-precision rates are at least the bf16 rate when supported,
    # but for Blackwell Ultra's cut-down INT8, which its source states
    for dtype in ("fp8", "int8", "int4", "fp4"):
        value = hw.peak_flops[dtype]
        stated = re.search(r"INT8 ([\d.]+) TOPS", hw.sources["peak_tflops"])
        cut = dtype == "int8" and stated is not None and value == float(stated.group(1)) * 1e12
        assert value is None or value >= hw.peak_flops_for("bf16") or cut
    assert 50 < hw.ridge_point("bf16") < 1000


@pytest.mark.parametrize("name", HARDWARE_NAMES)
def test_every_number_has_a_source(name: str) -> None:
    raw = _raw(name)
    sources = raw["sources"]
    body = {k: v for k, v in raw.items() if k != "sources"}
    for path in _numeric_paths(body):
        parts = path.split(".")
        prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
        assert prefixes & set(sources), f"{name}: {path} has no source"
    # Null peaks (unsupported dtypes) are claims too: they sit under the sourced peak_tflops.
    assert "peak_tflops" in sources
    assert all(isinstance(v, str) and v.strip() for v in sources.values())


HOST_LINK_GB_S = {
    "a100-40gb": 32,
    "a100-80gb": 32,
    "a100-80gb-pcie": 32,
    "a40": 32,
    "l4": 32,
    "l40s": 32,
    "h100-sxm": 64,
    "h100-pcie": 64,
    "h200": 64,
    "mi300x": 64,
    "mi325x": 64,
    "b200": 128,
}
"""Host<->GPU link per direction: PCIe Gen4 / Gen5 / Gen6 x16."""


@pytest.mark.parametrize("name", HARDWARE_NAMES)
def test_every_profile_has_a_sourced_host_link_in_si_units(name: str) -> None:
    raw = _raw(name)
    hw = load_hardware(name)
    assert hw.host_bandwidth is not None
    assert hw.host_bandwidth == raw["host_bandwidth_gb_s"] * 1e9
    assert "host_bandwidth_gb_s" in raw["sources"]
    assert "per direction" in raw["sources"]["host_bandwidth_gb_s"]
    # The host link never beats the GPU's own memory.
    assert hw.host_bandwidth < hw.memory_bandwidth


def test_host_link_values_per_profile() -> None:
    assert set(HOST_LINK_GB_S) == REQUIRED_PROFILES
    for name, gb_s in HOST_LINK_GB_S.items():
        assert load_hardware(name).host_bandwidth == gb_s * 1e9, name


def test_no_profile_claims_host_transfer_was_calibrated() -> None:
    for name in HARDWARE_NAMES:
        raw = _raw(name)
        assert raw["efficiency"]["host_transfer"] == EFFICIENCY_KEYS["host_transfer"].default
        assert "host_transfer is the default 0.8, not calibrated" in raw["sources"]["efficiency"]


@pytest.mark.parametrize("name", HARDWARE_NAMES)
def test_builtin_profiles_set_every_efficiency_term_with_its_calibration_source(name: str) -> None:
    raw = _raw(name)
    assert set(raw["efficiency"]) == set(EFFICIENCY_KEYS)
    assert set(raw["cpu_overhead"]) == {"base_ms", "per_seq_ms"}
    assert "docs/calibration.md" in raw["sources"]["efficiency"]
    assert "docs/calibration.md" in raw["sources"]["cpu_overhead"]


# --------------------------------------------------------------------------- SI conversion


def test_a100_80gb_in_si_units() -> None:
    hw = load_hardware("a100-80gb")
    assert hw.peak_flops["bf16"] == 312e12
    assert hw.peak_flops["fp8"] is None
    assert hw.memory_bandwidth == 2.039e12
    assert hw.memory_capacity == 80e9
    assert hw.interconnect_bandwidth == 300e9  # NVLink3 600 GB/s bidirectional / 2
    assert hw.num_compute_units == 108
    assert hw.compute_efficiency == 0.72
    assert hw.memory_efficiency == 0.80
    assert hw.interconnect_efficiency == 0.91
    assert hw.min_kernel_time == pytest.approx(5e-6)
    assert hw.launch_overhead == pytest.approx(1e-4)
    assert hw.interconnect_latency == pytest.approx(31e-6)
    assert hw.cpu_overhead_base == pytest.approx(0.81e-3)
    assert hw.cpu_overhead_per_seq == pytest.approx(0.042e-3)
    assert hw.efficiency["min_kernel_time"] == hw.min_kernel_time


def test_ridge_point_a100_80gb_bf16_is_about_153_flop_per_byte() -> None:
    assert load_hardware("a100-80gb").ridge_point("bf16") == pytest.approx(153, abs=0.5)


def test_ridge_point_h100_sxm_bf16_and_fp8() -> None:
    hw = load_hardware("h100-sxm")
    assert hw.ridge_point("bf16") == pytest.approx(295, abs=1)
    assert hw.ridge_point("fp8") == pytest.approx(2 * hw.ridge_point("bf16"), rel=1e-3)


def test_unsupported_dtype_names_the_supported_ones() -> None:
    with pytest.raises(ConfigError, match=r"'fp8' is not supported .* allowed: bf16, fp16, int8"):
        load_hardware("a100-80gb").peak_flops_for("fp8")
    with pytest.raises(ConfigError, match="'fp6' is unknown"):
        load_hardware("h100-sxm").peak_flops_for("fp6")


def test_ideal_removes_every_inefficiency_and_keeps_peaks() -> None:
    hw = load_hardware("h100-sxm")
    ideal = hw.ideal()
    assert ideal.compute_efficiency == ideal.memory_efficiency == 1.0
    assert ideal.interconnect_efficiency == 1.0
    assert ideal.min_kernel_time == ideal.launch_overhead == ideal.interconnect_latency == 0.0
    assert ideal.cpu_overhead_base == ideal.cpu_overhead_per_seq == 0.0
    assert ideal.peak_flops == hw.peak_flops
    assert ideal.memory_bandwidth == hw.memory_bandwidth
    assert set(ideal.efficiency) == {spec.si_name for spec in EFFICIENCY_KEYS.values()}
    assert ideal.host_bandwidth == hw.host_bandwidth == 64e9


def test_host_transfer_efficiency_term() -> None:
    spec = EFFICIENCY_KEYS["host_transfer"]
    assert (spec.default, spec.per_si, spec.ideal, spec.fraction) == (0.8, 1.0, 1.0, True)
    assert spec.si_name == "host_transfer_efficiency"
    hw = load_hardware("h100-pcie")
    assert hw.efficiency["host_transfer_efficiency"] == 0.8
    assert hw.ideal().efficiency["host_transfer_efficiency"] == 1.0


def test_profile_is_frozen_and_hashable() -> None:
    hw = load_hardware("a100-80gb")
    with pytest.raises(AttributeError):
        hw.memory_bandwidth = 1.0  # type: ignore[misc]
    assert {hw: 1}[load_hardware("a100-80gb")] == 1
    assert isinstance(hw, HardwareProfile)


def test_list_and_table_cover_every_builtin() -> None:
    assert [hw.name for hw in list_hardware()] == HARDWARE_NAMES
    rows = {row["name"]: row for row in hardware_table()}
    assert set(rows) == set(HARDWARE_NAMES)
    a100 = rows["a100-80gb"]
    assert a100["bf16_tflops"] == 312
    assert a100["fp8_tflops"] is None
    assert a100["memory_tb_s"] == pytest.approx(2.039)
    assert a100["memory_gb"] == 80
    assert a100["ridge_point_bf16"] == pytest.approx(153, abs=0.5)
    assert rows["h100-sxm"]["fp8_tflops"] == pytest.approx(1978.9)
    assert rows["h100-sxm"]["fp4_tflops"] is None  # Hopper has no FP4 tensor cores
    assert rows["b200"]["fp4_tflops"] == 9000  # DGX B200: FP4 72 PF dense for 8 GPUs
    assert a100["host_link_gb_s"] == 32
    assert rows["b200"]["host_link_gb_s"] == 128
    assert list(a100).index("host_link_gb_s") == list(a100).index("interconnect_gb_s") + 1


# --------------------------------------------------------------------------- user files


def _profile(tmp_path: Path, edit: Any = None, name: str = "x.yaml") -> Path:
    raw = _raw("a100-80gb")
    if edit is not None:
        edit(raw)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _error(path: Path | str) -> str:
    with pytest.raises(ConfigError) as info:
        load_hardware(str(path))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_user_profile_without_efficiency_blocks_gets_the_defaults(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        del raw["efficiency"], raw["cpu_overhead"], raw["sources"]

    hw = load_hardware(str(_profile(tmp_path, edit)))
    for key, spec in EFFICIENCY_KEYS.items():
        assert hw.efficiency[spec.si_name] == pytest.approx(spec.default / spec.per_si), key
    assert hw.cpu_overhead_base == pytest.approx(CPU_OVERHEAD_DEFAULTS["base_ms"] / 1e3)


def test_profile_without_host_link_loads_with_none(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        del raw["host_bandwidth_gb_s"], raw["sources"]["host_bandwidth_gb_s"]
        del raw["efficiency"]["host_transfer"]

    hw = load_hardware(str(_profile(tmp_path, edit)))
    assert hw.host_bandwidth is None
    assert hw.ideal().host_bandwidth is None
    assert hw.efficiency["host_transfer_efficiency"] == 0.8
    assert hw.summary()["host_link_gb_s"] is None
    assert hw.interconnect_bandwidth == 300e9  # the rest is unchanged


def test_host_link_in_si_units_from_a_user_file(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r.update(host_bandwidth_gb_s=25.6))
    assert load_hardware(str(path)).host_bandwidth == 25.6e9


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-32, "host_bandwidth_gb_s must be > 0, got -32"),
        (0, "host_bandwidth_gb_s must be > 0, got 0"),
        (float("inf"), "host_bandwidth_gb_s must be a finite number, got inf"),
        ("64 GB/s", "host_bandwidth_gb_s must be a number, got '64 GB/s'"),
    ],
)
def test_bad_host_link_names_file_and_key(tmp_path: Path, value: Any, expected: str) -> None:
    path = _profile(tmp_path, lambda r: r.update(host_bandwidth_gb_s=value))
    message = _error(path)
    assert message.startswith(f"{path}:")
    assert message.endswith(expected)


def test_host_transfer_must_be_a_fraction(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r["efficiency"].update(host_transfer=1.2))
    assert "efficiency.host_transfer must be in (0, 1], got 1.2" in _error(path)


def test_a_new_efficiency_key_only_needs_an_entry_in_efficiency_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        EFFICIENCY_KEYS,
        "attention_floor_us",
        EfficiencyKey(
            default=2.0,
            per_si=1e6,
            ideal=0.0,
            fraction=False,
            si_name="attention_floor",
            doc="test-only key",
        ),
    )
    path = _profile(tmp_path, lambda r: r["efficiency"].update(attention_floor_us=7))
    hw = load_hardware(str(path))
    assert hw.efficiency["attention_floor"] == 7e-6
    assert hw.ideal().efficiency["attention_floor"] == 0.0
    default = load_hardware(str(_profile(tmp_path, name="y.yaml")))
    assert default.efficiency["attention_floor"] == 2e-6


def test_unknown_name_lists_the_builtins() -> None:
    message = _error("a100-90gb")
    assert "a100-90gb" in message and "a100-80gb" in message and "h100-sxm" in message


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nmemory_gb: [80\nnum_compute_units: 1\n")
    message = _error(path)
    assert message.startswith(f"{path}:") and "malformed YAML" in message


def test_negative_value_names_file_and_key(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r.update(memory_bandwidth_tb_s=-1))
    assert _error(path).endswith("memory_bandwidth_tb_s must be > 0, got -1")
    assert str(path) in _error(path)


def test_zero_value_is_rejected(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r.update(memory_gb=0))
    assert "memory_gb must be > 0, got 0" in _error(path)


def test_zero_peak_in_nested_key(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r["peak_tflops"].update(int8=0))
    assert "peak_tflops.int8 must be > 0, got 0" in _error(path)


def test_unknown_key_is_rejected_with_allowed_keys(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r.update(memory_bandwith_tb_s=2.0))
    message = _error(path)
    assert str(path) in message
    assert "memory_bandwith_tb_s: unknown key" in message and "memory_bandwidth_tb_s" in message


def test_unknown_nested_keys_are_rejected(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r["peak_tflops"].update(fp6=9000))
    assert "peak_tflops.fp6: unknown key" in _error(path)
    path = _profile(tmp_path, lambda r: r["efficiency"].update(comput=0.5))
    assert "efficiency.comput: unknown key; allowed keys here: compute, memory" in _error(path)
    path = _profile(tmp_path, lambda r: r["sources"].update(memory_gbb="x"))
    assert "sources.memory_gbb: names no key of the profile" in _error(path)


def test_missing_required_key(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r.pop("num_compute_units"))
    assert _error(path) == f"{path}: num_compute_units: required key is missing"


def test_efficiency_fraction_must_be_in_0_1(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r["efficiency"].update(compute=1.5))
    assert "efficiency.compute must be in (0, 1], got 1.5" in _error(path)
    path = _profile(tmp_path, lambda r: r["efficiency"].update(launch_overhead_ms=-0.1))
    assert "efficiency.launch_overhead_ms must be >= 0, got -0.1" in _error(path)


def test_wrong_types_are_rejected(tmp_path: Path) -> None:
    path = _profile(tmp_path, lambda r: r.update(num_compute_units=108.5))
    assert "num_compute_units must be an integer, got 108.5" in _error(path)
    path = _profile(tmp_path, lambda r: r.update(memory_gb="80 GB"))
    assert "memory_gb must be a number, got '80 GB'" in _error(path)


def test_needs_a_16_bit_peak(tmp_path: Path) -> None:
    def edit(raw: dict[str, Any]) -> None:
        raw["peak_tflops"] = {"int8": 624}

    assert "peak_tflops: needs at least one of bf16, fp16" in _error(_profile(tmp_path, edit))


# --------------------------------------------------------------------------- number rules

_files = itertools.count()
_UNPHYSICAL = (
    st.sampled_from([math.nan, math.inf, -math.inf])
    | st.floats(min_value=1e7, max_value=1e308)
    | st.floats(min_value=-1e308, max_value=-1e-9)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(_numeric_paths(_raw("a100-80gb"))), value=_UNPHYSICAL)
def test_any_non_finite_negative_or_huge_number_is_rejected_naming_its_key(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: float
) -> None:
    # Every numeric key of a profile (peaks, bandwidths, memory, compute units, efficiency
    # terms, CPU overheads) is finite, >= 0 and far below 1e7 in its unit.
    def edit(raw: dict[str, Any]) -> None:
        *parents, last = key.split(".")
        node = raw
        for part in parents:
            node = node[part]
        node[last] = value

    directory = tmp_path_factory.mktemp("profiles")
    message = _error(_profile(directory, edit, name=f"p{next(_files)}.yaml"))
    assert f"{key} must be" in message or f"{key}: " in message, message


def test_exponent_numbers_are_numbers(tmp_path: Path) -> None:
    # PyYAML (YAML 1.1) reads 8e1 as a string; profiles follow YAML 1.2, where it is 80.
    text = (catalog_dir("hardware_profiles") / "a100-80gb.yaml").read_text(encoding="utf-8")
    text = text.replace("memory_gb: 80", "memory_gb: 8e1").replace(
        "memory_bandwidth_tb_s: 2.039", "memory_bandwidth_tb_s: 2039e-3"
    )
    (tmp_path / "x.yaml").write_text(text.replace("compute: 0.72", "compute: .72e0"))
    hw = load_hardware(str(tmp_path / "x.yaml"))
    builtin = load_hardware("a100-80gb")
    assert (hw.memory_capacity, hw.memory_bandwidth) == (80e9, 2.039e12)
    assert hw.efficiency == builtin.efficiency


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("efficiency.gemm_tile_m", 8, "efficiency.gemm_tile_m must be >= 16, got 8"),
        ("efficiency.transition_exponent", 0.5, "must be >= 1, got 0.5"),
        ("efficiency.attention_sm_bandwidth", 0, "must be >= 0.01, got 0"),
        ("efficiency.min_kernel_time_us", 2e6, "must be <= 1000000, got 2000000.0"),
        ("efficiency.launch_overhead_ms", 1e308, "must be <= 1000, got 1e+308"),
        ("efficiency.compute", math.nan, "must be a finite number, got nan"),
        ("efficiency.compute", True, "must be a number, got true"),
        ("cpu_overhead.per_seq_ms", 5000, "must be <= 1000, got 5000"),
        ("num_compute_units", 10**12, "must be <= 1000000, got 1000000000000"),
    ],
)
def test_efficiency_terms_and_overheads_have_physical_ranges(
    tmp_path: Path, key: str, value: Any, expected: str
) -> None:
    def edit(raw: dict[str, Any]) -> None:
        *parents, last = key.split(".")
        node = raw
        for part in parents:
            node = node[part]
        node[last] = value

    message = _error(_profile(tmp_path, edit))
    assert f"{key} " in message and message.endswith(expected), message


def test_every_built_in_efficiency_default_is_inside_its_range() -> None:
    for key, spec in EFFICIENCY_KEYS.items():
        lo, hi = (0.0, 1.0) if spec.fraction else (spec.minimum, spec.upper)
        assert lo <= spec.default <= hi, key
