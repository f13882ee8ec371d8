"""Serving-engine presets (``engine.framework``) and CUDA-graph batch padding."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import pytest
import yaml

from batchsim import cli, deployment
from batchsim.catalog.frameworks import framework_names, load_framework
from batchsim.config import (
    FrameworkName,
    load_experiment,
    unused_scheduler_keys,
    validate_experiment,
)
from batchsim.cost.shapes import BatchShape, cuda_graph_padded, cuda_graph_size
from batchsim.errors import ConfigError
from conftest import assert_fast_forward_exact, simulate_data, tiny_experiment

NAMES = ("vllm-v0", "vllm-v1", "sglang", "tensorrt-llm", "lmdeploy")


def batch_of(n: int, prompt: int = 100, output: int = 40, **engine: object) -> dict:
    """``n`` requests arriving together, prompts of ``prompt`` tokens prefilled in one
    iteration, then ``output - 1`` decode iterations of the whole batch (no CPU time)."""
    data = tiny_experiment(
        scheduler={"policy": "continuous", "max_num_seqs": max(n, 1)},
        engine={"cpu_overhead_ms": 0.0, "cpu_overhead_per_seq_ms": 0.0, **engine},
    )
    data["workload"] = {
        "num_requests": n,
        "arrival": {"process": "all_at_once"},
        "prompt_tokens": {"dist": "fixed", "value": prompt},
        "output_tokens": {"dist": "fixed", "value": output},
    }
    return data


def decode_rows(result):
    it = result.iterations
    return it[(it["num_prefill_tokens"] == 0) & (it["num_decode_tokens"] > 0)]


# ----------------------------------------------------------------- the catalog


def test_every_built_in_preset_loads_and_every_number_has_a_source():
    assert framework_names() == sorted(NAMES)
    assert set(typing.get_args(FrameworkName)) == set(NAMES)
    for name in NAMES:
        preset = load_framework(name)
        assert preset.name == name and preset.description
        assert preset.items(), name
        for key, _ in preset.items():
            assert len(preset.sources.get(key, "")) > 20, f"{name}: {key} has no source"
            assert key.split(".")[0] in ("engine", "scheduler")
        # every value passes the experiment schema
        config = validate_experiment(tiny_experiment(engine={"framework": name}, scheduler={}))
        assert config.engine.framework == name


def test_a_preset_number_without_a_source_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "frameworks"
    folder.mkdir()
    doc = {
        "name": "bare",
        "description": "no sources",
        "engine": {"block_size": 32, "cpu_overhead_ms": 0.5},
        "sources": {"engine.block_size": "somewhere"},
    }
    (folder / "bare.yaml").write_text(yaml.safe_dump(doc))
    import batchsim.catalog.frameworks as frameworks

    monkeypatch.setattr(frameworks, "catalog_dir", lambda kind: folder)
    monkeypatch.setattr(frameworks, "catalog_names", lambda kind: ["bare"])
    load_framework.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"engine\.cpu_overhead_ms has no entry"):
            load_framework("bare")
    finally:
        load_framework.cache_clear()


# ----------------------------------------------------------------- precedence


def test_preset_fills_what_the_experiment_does_not_set():
    data = tiny_experiment(engine={"framework": "vllm-v1"})
    data["scheduler"] = {}  # no scheduler keys: the preset gives them
    config = validate_experiment(data)
    preset = dict(load_framework("vllm-v1").items())
    assert config.scheduler.policy == preset["scheduler.policy"] == "chunked_prefill"
    assert config.scheduler.max_num_batched_tokens == preset["scheduler.max_num_batched_tokens"]
    assert config.engine.async_scheduling is True
    assert config.engine.cuda_graph_max_batch_size == 512
    assert config.engine.all_reduce_latency_us == preset["engine.all_reduce_latency_us"]


def test_explicit_keys_beat_the_preset_and_the_preset_beats_the_profile(tmp_path):
    data = tiny_experiment(
        engine={"framework": "vllm-v1", "block_size": 32, "async_scheduling": False},
        scheduler={"policy": "continuous", "max_num_seqs": 7},
    )
    config = validate_experiment(data)
    assert config.engine.block_size == 32  # experiment > preset (16)
    assert config.engine.async_scheduling is False
    assert config.scheduler.policy == "continuous"  # not the preset's chunked_prefill
    assert config.scheduler.max_num_seqs == 7
    assert config.engine.cpu_overhead_ms == 0.81  # preset > hardware profile default
    # --set beats the preset too
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_experiment(path, {"engine.all_reduce_latency_us": 1.5})
    assert config.engine.all_reduce_latency_us == 1.5
    # a key no one sets comes from the hardware profile: lmdeploy has no all-reduce latency
    lm = validate_experiment(tiny_experiment(engine={"framework": "lmdeploy"}))
    assert lm.engine.all_reduce_latency_us is None
    setup = deployment.engine_setup(lm)
    assert setup.cost_model.all_reduce.latency == pytest.approx(31e-6)  # a100-80gb.yaml


def test_preset_scheduler_keys_the_policy_does_not_read_are_left_out():
    # static batching does not read the token budget: the preset must not set it (a
    # non-default key the policy ignores is reported as unused)
    data = tiny_experiment(engine={"framework": "vllm-v1"}, scheduler={"policy": "static"})
    config = validate_experiment(data)
    assert config.scheduler.max_num_batched_tokens == 8192  # the schema default
    assert unused_scheduler_keys(config, frozenset({"policy", "max_num_seqs"})) == []


@pytest.mark.parametrize("value", ["vllm-v9", 3])
def test_unknown_framework_is_one_line_listing_the_names(tmp_path, capsys, value):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(tiny_experiment(engine={"framework": value})))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "engine.framework" in err
    for name in NAMES:
        assert name in err


def test_list_frameworks_prints_every_preset_and_its_numbers(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["list", "frameworks"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        line = next(row for row in out.splitlines() if row.startswith(name + " "))
        assert load_framework(name).description in line
    assert "8.80" in out and "3.90" in out and "512" in out


# ----------------------------------------------------------------- CUDA-graph padding


def test_cuda_graph_sizes_are_the_next_captured_size():
    captured = [1, 2, 4, *range(8, 513, 8)]  # vLLM's capture sizes up to 512
    for n in range(1, 600):
        bigger = [size for size in captured if size >= n]
        assert cuda_graph_size(n, 512) == (bigger[0] if bigger else None), n
    assert cuda_graph_size(9, 8) is None  # above the largest captured size
    assert cuda_graph_size(5, 4) is None


def test_only_decode_only_batches_are_padded():
    prefill = BatchShape.from_requests([5, 1, 1], [0, 10, 10])
    assert cuda_graph_padded(prefill, 512) is prefill
    static = BatchShape.from_requests([1, 1, 1], [9, 9, 9], num_padding_seqs=2, padding_context=9)
    assert cuda_graph_padded(static, 512) is static
    decode = BatchShape.decode(3, 50)
    padded = cuda_graph_padded(decode, 512)
    assert padded.num_padding_tokens == padded.num_graph_padding_tokens == 1
    assert padded.num_tokens == 4
    assert cuda_graph_padded(padded, 512) == padded  # idempotent


def test_decode_batch_of_nine_runs_as_sixteen_rows():
    prompt = 100
    result = simulate_data(batch_of(9, prompt=prompt, framework="vllm-v1"))
    rows = decode_rows(result)
    assert len(rows) == 39 and (rows["num_decode_tokens"] == 9).all()
    assert (rows["num_padding_tokens"] == 7).all()
    assert result.summary["padding_fraction"] > 0
    # the first decode iteration, priced by hand: 9 requests with `prompt` cached tokens each
    # and 7 rows that only go through the GEMMs, elementwise kernels and all-reduces
    first = rows.iloc[0]
    shape = BatchShape(
        num_seqs=9,
        num_decode_tokens=9,
        num_padding_tokens=7,
        num_sampled_tokens=9,
        kv_read_tokens=9 * prompt,
        attn_pairs=9 * prompt + 9,
        num_graph_padding_tokens=7,
    )
    config = validate_experiment(batch_of(9, prompt=prompt, framework="vllm-v1"))
    cost_model = deployment.engine_setup(config).cost_model
    expected = cost_model.estimate(shape)
    assert first["duration_ms"] == pytest.approx(expected.time * 1e3, rel=1e-12)
    sixteen = cost_model.estimate(BatchShape.decode(16, prompt))
    nine = cost_model.estimate(BatchShape.decode(9, prompt))
    for group in ("qkv_proj", "o_proj", "mlp", "elementwise", "all_reduce"):
        assert expected.ops[group].time == sixteen.ops[group].time, group  # 16 rows
    assert expected.ops["attention"].flops == nine.ops["attention"].flops  # 9 attend
    assert expected.ops["lm_head"].time == nine.ops["lm_head"].time  # 9 sample
    assert expected.time > nine.time


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_captured_batch_sizes_run_unpadded(n):
    result = simulate_data(batch_of(n, framework="vllm-v1"))
    rows = decode_rows(result)
    assert (rows["num_decode_tokens"] == n).all()
    assert (result.iterations["num_padding_tokens"] == 0).all()
    assert result.summary["padding_fraction"] == 0


def test_batch_of_three_pads_one_row_and_above_the_largest_size_none():
    rows = decode_rows(simulate_data(batch_of(3, framework="vllm-v1")))
    assert (rows["num_padding_tokens"] == 1).all()
    above = simulate_data(batch_of(9, cuda_graph_max_batch_size=8))
    assert (above.iterations["num_padding_tokens"] == 0).all()
    none = simulate_data(batch_of(9, framework=None))  # the plain engine: no padding
    assert (none.iterations["num_padding_tokens"] == 0).all()
    default = simulate_data(batch_of(9))  # no framework key: vllm-v1's captured sizes
    assert (decode_rows(default)["num_padding_tokens"] == 7).all()  # 9 rows run as 16


@pytest.mark.parametrize("name", NAMES)
def test_fast_forward_is_exact_with_every_preset(name):
    data = tiny_experiment(engine={"framework": name}, scheduler={"max_num_seqs": 12})
    data["scheduler"] = {"max_num_seqs": 12}  # the preset's policy and budget
    a, _ = assert_fast_forward_exact(data)
    if name.startswith("vllm"):
        assert a.iterations["num_padding_tokens"].sum() > 0


# ----------------------------------------------------------------- all-reduce latency


def test_all_reduce_latency_changes_a_tp2_iteration_by_latency_times_two_per_layer():
    shape = BatchShape.decode(8, 512)
    layers = 32  # Llama-2-7B

    def time(engine: dict) -> float:
        data = tiny_experiment(engine=engine, parallel={"tensor_parallel_size": 2})
        return deployment.engine_setup(validate_experiment(data)).cost_model.estimate(shape).time

    nccl = time({"framework": None})  # the hardware profile: 31 us
    vllm = time({"framework": "vllm-v1"})  # 8.8 us
    sglang = time({"framework": "sglang"})  # 3.9 us
    assert nccl - vllm == pytest.approx((31.0 - 8.8) * 1e-6 * 2 * layers, rel=1e-9)
    assert vllm - sglang == pytest.approx((8.8 - 3.9) * 1e-6 * 2 * layers, rel=1e-9)
    # on one GPU there is no all-reduce, so the preset's latency changes nothing
    one = tiny_experiment(engine={"all_reduce_latency_us": 1.0})
    base = deployment.engine_setup(validate_experiment(tiny_experiment())).cost_model.estimate(
        shape
    )
    assert (
        deployment.engine_setup(validate_experiment(one)).cost_model.estimate(shape).time
        == base.time
    )


def test_launch_overhead_key_replaces_the_profiles():
    shape = BatchShape.decode(4, 100)
    base = deployment.engine_setup(validate_experiment(tiny_experiment())).cost_model.estimate(
        shape
    )
    data = tiny_experiment(engine={"launch_overhead_ms": 0.35})
    other = deployment.engine_setup(validate_experiment(data)).cost_model.estimate(shape)
    assert other.time - base.time == pytest.approx((0.35 - 0.1) * 1e-3, rel=1e-9)


def test_shipped_catalog_folder_exists_next_to_the_other_catalogs():
    root = Path(__file__).resolve().parent.parent
    assert sorted(p.stem for p in (root / "frameworks").glob("*.yaml")) == sorted(NAMES)


# ----------------------------------------------------------------- the validation script


def _validation_module():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "validate_published.py"
    spec = importlib.util.spec_from_file_location("validate_published", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_published_row_has_a_source_and_a_valid_experiment():
    module = _validation_module()
    assert 60 <= len(module.ROWS) <= 100
    for row in module.ROWS:
        assert row.url.startswith("https://")
        assert row.value > 0 and row.framework in NAMES
        config = validate_experiment(module.experiment(row))
        assert config.engine.framework == row.framework
        if row.rounds:  # a closed loop of `batch` users
            assert config.workload.concurrency == row.batch
            assert config.workload.num_requests == row.batch * row.rounds
        else:  # a static batch
            assert config.workload.num_requests == row.batch


def test_the_lmdeploy_rows_kept_are_exactly_those_whose_users_fit_in_the_sources_cache():
    # 128-token blocks: 1,000 (7B), 500 (13B), 4,000 (70B) in the source's benchmark scripts
    module = _validation_module()
    kept = {(r.model, r.batch, r.input_len, r.output_len) for r in module.ROWS
            if r.framework == "lmdeploy"}  # fmt: skip
    blocks = {"llama-2-7b": 1000, "llama-2-13b": 500, "llama-2-70b": 4000}
    table = module.lmdeploy_table()
    assert len(table) == 60
    for model, _, batch, isl, osl, _ in table:
        per_user = -(-(isl + osl) // 128)
        assert ((model, batch, isl, osl) in kept) == (batch * per_user <= blocks[model])
    assert len(kept) == 49
    # and a kept row never runs short of blocks in the simulation, the tightest one included
    tightest = max(
        (r for r in module.ROWS if r.framework == "lmdeploy"),
        key=lambda r: r.batch * -(-(r.input_len + r.output_len) // 128) / blocks[r.model],
    )
    summary = simulate_data(module.experiment(tightest)).summary
    assert summary["num_preemptions"] == 0
    assert summary["completed"] == tightest.batch * tightest.rounds


def test_a_closed_loop_row_of_one_user_runs_its_requests_back_to_back():
    # one LMDeploy user sends its 6 requests one after another: the run lasts exactly the sum
    # of their end-to-end latencies, and the throughput is their tokens over that
    module = _validation_module()
    row = next(r for r in module.ROWS if r.framework == "lmdeploy" and r.batch == 1)
    result = simulate_data(module.experiment(row))
    requests = result.requests.sort_values("arrival_time_s")
    assert len(requests) == row.rounds == 6
    arrivals = requests["arrival_time_s"].to_numpy()
    finishes = requests["finish_time_s"].to_numpy()
    assert arrivals[0] == 0.0 and list(arrivals[1:]) == pytest.approx(list(finishes[:-1]))
    assert result.summary["duration"] == pytest.approx(requests["e2el_ms"].sum() / 1e3)
    assert module.simulated(row) == pytest.approx(
        6 * row.output_len / (requests["e2el_ms"].sum() / 1e3)
    )


def test_a_published_latency_row_simulates_to_its_metric():
    module = _validation_module()
    row = next(r for r in module.ROWS if r.metric == "ttft_ms" and r.model == "llama-2-7b")
    result = simulate_data(module.experiment(row))
    assert module.simulated(row) == result.summary["mean_ttft_ms"] > 0


def test_a_cluster_group_cannot_change_the_preset():
    data = tiny_experiment(engine={"framework": "vllm-v1"})
    data["cluster"] = {
        "replicas": [{"count": 1}, {"count": 1, "engine": {"framework": "sglang"}}],
    }
    with pytest.raises(ConfigError, match=r"cluster\.replicas\[1\]\.engine\.framework"):
        simulate_data(data)
    data["cluster"]["replicas"][1]["engine"] = {"framework": "vllm-v1", "block_size": 32}
    assert simulate_data(data).summary["completed"] == 60
