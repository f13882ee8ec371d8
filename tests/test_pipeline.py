"""Pipeline parallelism (``parallel.pipeline_parallel_size``): the layer split, the stage
costs, the KV capacity of the stages, and the engine that keeps up to P batches in flight.

Expected values come from the catalog numbers by hand (parameter counts, the hardware's link),
from the per-stage pieces of the cost model combined by the rule under test, or from closed
forms of a pipeline (one request: no overlap; saturation: the slowest stage sets the pace).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any
from unittest import mock

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from regen_golden import comparable

from batchsim import cli
from batchsim.catalog.hardware_files import load_hardware
from batchsim.catalog.model_files import load_model
from batchsim.config import validate_experiment
from batchsim.cost import BatchShape, RooflineCostModel
from batchsim.cost.pipeline import PipelineCostModel, stage_layers
from batchsim.deployment import engine_setup
from batchsim.deployment import engines as deployment_engines
from batchsim.engine.pipeline import PipelineEngine
from batchsim.errors import ConfigError
from batchsim.simulation import simulate
from conftest import capture_engines, tiny_experiment

# a100-80gb.yaml: interconnect_bandwidth_gb_s 300, efficiency.interconnect 0.91,
# efficiency.interconnect_latency_us 31
A100_LINK = 300e9 * 0.91
A100_LATENCY = 31e-6
LLAMA2_7B_HIDDEN = 4096


def fixed(value: int) -> dict[str, Any]:
    return {"dist": "fixed", "value": value}


def pp_experiment(pp: int, **overrides: Any) -> dict[str, Any]:
    """tiny_experiment with ``pp`` stages and no CPU time (so a batch's time is its stages')."""
    data = tiny_experiment(**overrides)
    data["parallel"] = {**data.get("parallel", {}), "pipeline_parallel_size": pp}
    data["engine"] = {
        "cpu_overhead_ms": 0.0,
        "cpu_overhead_per_seq_ms": 0.0,
        **data.get("engine", {}),
    }
    return data


def one_request(pp: int, prompt: int, output: int) -> dict[str, Any]:
    return pp_experiment(
        pp,
        engine={"framework": None},  # the plain engine: stage and transfer times only
        workload={
            "num_requests": 1,
            "arrival": {"process": "constant", "rate": 1.0},
            "prompt_tokens": fixed(prompt),
            "output_tokens": fixed(output),
        },
    )


# ----------------------------------------------------------------------------- the split


def test_layers_split_as_vllm_remainder_before_the_last_stage():
    assert stage_layers(32, 2) == [16, 16]
    assert stage_layers(80, 3) == [27, 27, 26]  # 26 each, the 2 left over to stages 1 and 0
    assert stage_layers(10, 4) == [2, 3, 3, 2]  # 2 each, the 2 left over to stages 2 and 1
    assert stage_layers(5, 5) == [1, 1, 1, 1, 1]


@given(st.integers(1, 200), st.integers(1, 64))
def test_layer_split_covers_every_layer_evenly(num_layers, num_stages):
    if num_stages > num_layers:
        return
    parts = stage_layers(num_layers, num_stages)
    assert sum(parts) == num_layers and len(parts) == num_stages
    assert max(parts) - min(parts) <= 1
    assert parts[-1] == num_layers // num_stages  # the last stage (lm_head) gets no extra


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-70b", "mixtral-8x7b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("pp", [2, 3, 4])
def test_stages_partition_the_model_flops_weights_and_kv(model, pp):
    """Stage FLOPs, weights and KV bytes add up to the whole model's (split or not, every
    layer is computed and stored once; embedding on the first stage, lm_head on the last)."""
    spec, hw = load_model(model), load_hardware("a100-80gb")
    whole = RooflineCostModel(spec, hw, tp=2)
    pipe = PipelineCostModel(spec, hw, tp=2, pp=pp)
    for shape in (BatchShape.prefill(300), BatchShape.decode(24, 700)):
        parts = pipe.step_costs(shape)
        full = whole.step_cost(shape)
        assert math.fsum(p.flops for p in parts) == pytest.approx(full.flops, rel=1e-12)
        assert math.fsum(p.weight_bytes for p in parts) == pytest.approx(
            full.weight_bytes, rel=1e-12
        )
    assert math.fsum(s.weight_bytes_per_gpu for s in pipe.stages) == pytest.approx(
        whole.weight_bytes_per_gpu, rel=1e-12
    )
    assert math.fsum(s.kv_bytes_per_token_per_gpu for s in pipe.stages) == pytest.approx(
        whole.kv_bytes_per_token_per_gpu, rel=1e-12
    )


def test_only_the_last_stage_runs_the_lm_head():
    spec, hw = load_model("llama-2-7b"), load_hardware("a100-80gb")
    pipe = PipelineCostModel(spec, hw, pp=2)
    first, last = (s.estimate(BatchShape.decode(8, 100)).ops["lm_head"] for s in pipe.stages)
    assert first.flops == 0 and first.time == 0
    assert last.flops == pytest.approx(2 * 8 * 32000 * 4096)  # rows x vocab x hidden, x2


def test_activation_transfer_is_latency_plus_bytes_over_the_link():
    pipe = PipelineCostModel(load_model("llama-2-7b"), load_hardware("a100-80gb"), pp=2)
    # hidden states and residual, 2 bytes each, per row
    assert pipe.transfer_time(1000) == pytest.approx(
        A100_LATENCY + 1000 * 2 * LLAMA2_7B_HIDDEN * 2 / A100_LINK, rel=1e-12
    )


# ----------------------------------------------------------------------------- memory


def test_kv_capacity_is_the_stage_with_least_room_by_hand():
    """Llama-2-7B, 2 stages of 16 layers on A100-80GB: stage 1 holds the lm_head and final
    norm, a little more than stage 0's embedding, so it sets the pool."""
    data = pp_experiment(2, engine={"activation_reserve_gb": 2.0, "gpu_memory_utilization": 0.9})
    setup = engine_setup(validate_experiment(data))
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096  # attention, MLP, two norms
    stage0 = 16 * layer + 32000 * 4096
    stage1 = 16 * layer + 32000 * 4096 + 4096
    kv_per_token = 16 * 2 * 4096 * 2  # 16 layers, K and V, 4096 wide, 2 bytes
    free = 80e9 * 0.9 - 2e9
    expected = min(int((free - 2 * w) // (kv_per_token * 16)) for w in (stage0, stage1))
    assert setup.num_gpu_blocks == expected
    assert expected == int((free - 2 * stage1) // (kv_per_token * 16))
    # twice the blocks of one GPU holding the whole model, a bit more (half the weights)
    whole = engine_setup(validate_experiment(pp_experiment(1, engine=data["engine"])))
    assert setup.num_gpu_blocks > 2 * whole.num_gpu_blocks


# ----------------------------------------------------------------------------- timing


def stage_times(pp: int, shape: BatchShape) -> list[float]:
    pipe = PipelineCostModel(load_model("llama-2-7b"), load_hardware("a100-80gb"), pp=pp)
    return [c.time for c in pipe.step_costs(shape)]


def transfer(tokens: int) -> float:
    return A100_LATENCY + tokens * 2 * LLAMA2_7B_HIDDEN * 2 / A100_LINK


@pytest.mark.parametrize("pp", [2, 4])
def test_idle_request_iteration_is_sum_of_stages_and_transfers(pp):
    result = simulate(validate_experiment(one_request(pp, prompt=200, output=4)))
    it = result.iterations
    assert len(it) == 4
    prefill = sum(stage_times(pp, BatchShape.prefill(200))) + (pp - 1) * transfer(200)
    assert it["duration_ms"][0] == pytest.approx(prefill * 1e3, rel=1e-12)
    for k in range(1, 4):  # decode k reads the prompt and the k-1 tokens before
        decode = sum(stage_times(pp, BatchShape.decode(1, 200 + k - 1))) + (pp - 1) * transfer(1)
        assert it["duration_ms"][k] == pytest.approx(decode * 1e3, rel=1e-12)
    # one batch at a time: each starts when the previous one left the last stage
    start = it["start_time_s"].to_numpy()
    end = start + it["duration_ms"].to_numpy() / 1e3
    np.testing.assert_allclose(start[1:], end[:-1], rtol=1e-12)
    request = result.requests.iloc[0]
    assert request["ttft_ms"] == pytest.approx(prefill * 1e3, rel=1e-9)
    # the bubble: P stages, each busy for its own part of every iteration
    busy = sum(sum(stage_times(pp, BatchShape.prefill(200))) for _ in [0]) + sum(
        sum(stage_times(pp, BatchShape.decode(1, 200 + k - 1))) for k in range(1, 4)
    )
    e2e = request["e2el_ms"] / 1e3
    bubble = result.summary["bubble_fraction"]
    assert bubble == pytest.approx(1 - busy / (pp * e2e), rel=1e-9)
    assert bubble == pytest.approx((pp - 1) / pp, abs=0.01)


def saturated(pp: int, batch: int) -> dict[str, Any]:
    """Many requests at once, short prompts, long outputs, ``batch`` requests per batch."""
    return pp_experiment(
        pp,
        scheduler={"policy": "continuous", "max_num_seqs": batch},
        workload={
            "num_requests": pp * batch,
            "arrival": {"process": "all_at_once"},
            "prompt_tokens": fixed(16),
            "output_tokens": fixed(400),
        },
    )


@pytest.mark.parametrize("pp", [2, 4])
def test_saturated_pipeline_runs_p_batches_at_the_slowest_stage_pace(pp):
    """P batches of B decodes in flight: a batch leaves every max-stage time, so the token
    rate is about P times that of one batch going through all the stages alone."""
    batch = 16
    result = simulate(validate_experiment(saturated(pp, batch)))
    it = result.iterations
    # each virtual engine keeps its own B requests: batches never merge nor split
    assert set(it.loc[it["num_prefill_seqs"] == 0, "num_seqs"]) == {batch}
    decodes = it[(it["num_decode_seqs"] == batch) & (it["num_prefill_seqs"] == 0)]
    start = decodes["start_time_s"].to_numpy()
    end = start + decodes["duration_ms"].to_numpy() / 1e3
    mid = slice(len(end) // 4, 3 * len(end) // 4)  # away from the ramp up and down
    rate = (len(end[mid]) - 1) / (end[mid][-1] - end[mid][0])  # batches leaving per second
    context = 16 + 200  # the middle of the decodes
    times = stage_times(pp, BatchShape.decode(batch, context))
    assert rate == pytest.approx(1 / max(times), rel=0.03)
    alone = 1 / (sum(times) + (pp - 1) * transfer(batch))  # one batch in flight
    assert rate == pytest.approx(pp * alone, rel=0.06)
    assert result.summary["bubble_fraction"] < 0.1
    # a request is in one batch at a time: pp batches, each of its own requests
    assert result.summary["completed"] == pp * batch


def test_more_stages_help_a_saturated_engine_and_not_a_lone_request():
    lone = [simulate(validate_experiment(one_request(pp, 200, 32))).summary for pp in (1, 2)]
    assert lone[1]["mean_tpot_ms"] > lone[0]["mean_tpot_ms"]  # transfers add to every token
    busy = [simulate(validate_experiment(saturated(pp, 16))).summary for pp in (1, 2)]
    assert busy[1]["output_throughput"] > 1.7 * busy[0]["output_throughput"]


# ----------------------------------------------------------------------------- invariants


@settings(max_examples=30, deadline=None)
@given(
    pp=st.integers(2, 4),
    policy=st.sampled_from(["continuous", "chunked_prefill"]),
    blocks=st.sampled_from([None, 24, 40, 80]),
    rate=st.sampled_from([2.0, 50.0]),
    swap=st.booleans(),
    cancel=st.booleans(),
    seed=st.integers(0, 3),
)
def test_pipeline_never_runs_a_request_in_two_batches_at_once(
    pp, policy, blocks, rate, swap, cancel, seed
):
    """Every request leaves (finished with its tokens, or cancelled); the batches a request
    is in never overlap in time (it waits for its batch to leave the last stage); KV is all
    freed at the end — with preemption by recompute or swap, and cancellations in flight."""
    workload: dict[str, Any] = {
        "num_requests": 30,
        "arrival": {"process": "poisson", "rate": rate},
        "prompt_tokens": {"dist": "uniform", "min": 16, "max": 300},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 40},
    }
    if cancel:
        workload["cancel_after_ms"] = {"dist": "uniform", "min": 10, "max": 2000}
    engine: dict[str, Any] = {"num_gpu_blocks": blocks}
    if swap:
        engine["swap_space_gib"] = 0.05
    data = pp_experiment(
        pp,
        seed=seed,
        scheduler={
            "policy": policy,
            "max_num_seqs": 8,
            "max_num_batched_tokens": 512,
            "preemption_mode": "swap" if swap else "recompute",
        },
        engine=engine,
        workload=workload,
    )
    # Every batch is in flight at the pass where it leaves the last stage: the engine's
    # on_step hook, called before every pass, sees each one (the loop itself is compiled).
    batches: dict[int, tuple[float, float, list[int]]] = {}
    engines: list[PipelineEngine] = []

    def watch(engine: Any) -> None:
        for batch in engine._in_flight:
            times = batch.times
            ids = [r.request_id for r in batch.output.requests]
            batches.setdefault(times.first_iteration, (times.start, times.end, ids))

    def build(*args: Any, **kwargs: Any) -> PipelineEngine:
        kwargs["on_step"] = watch
        engines.append(PipelineEngine(*args, **kwargs))
        return engines[-1]

    with mock.patch.object(deployment_engines, "PipelineEngine", build):
        result = simulate(validate_experiment(data))
    assert len(batches) == len(result.iterations)  # every batch seen
    spans: dict[int, list[tuple[float, float]]] = {}
    for _, (start, end, ids) in sorted(batches.items()):
        for request_id in ids:
            spans.setdefault(request_id, []).append((start, end))
    engine = engines[0]
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.num_blocks
    requests = result.requests
    done = requests[requests["status"] == "finished"]
    assert (done["output_tokens"] == done["max_tokens"]).all()
    assert set(requests["status"]) <= ({"finished", "cancelled"} if cancel else {"finished"})
    assert len(requests) == 30
    for request_id, intervals in spans.items():
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, request_id
    assert 0.0 <= result.summary["bubble_fraction"] < 1.0


def test_one_stage_runs_the_plain_engine_unchanged():
    """P = 1 is the engine without a pipeline (the golden runs pin its numbers)."""
    with capture_engines() as engines:
        a = simulate(validate_experiment(pp_experiment(1)))
    assert not isinstance(engines[0], PipelineEngine)
    unset = pp_experiment(1)
    del unset["parallel"]
    b = simulate(validate_experiment(unset))
    assert a.summary["bubble_fraction"] == 0.0
    assert comparable(a.summary) == comparable(b.summary)
    assert a.iterations.equals(b.iterations)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"parallel": {"pipeline_parallel_size": 0}}, "parallel.pipeline_parallel_size"),
        (
            {"parallel": {"pipeline_parallel_size": 33}},
            "parallel.pipeline_parallel_size must be <= num_hidden_layers=32",
        ),
        ({"parallel": {"pipeline_parallel_size": 1.5}}, "parallel.pipeline_parallel_size"),
        (
            {"parallel": {"pipeline_parallel_size": 2}, "scheduler": {"policy": "static"}},
            "scheduler.policy must be one of continuous, chunked_prefill",
        ),
        (
            {"parallel": {"pipeline_parallel_size": 2}, "cluster": {"replicas": 2}},
            "parallel.pipeline_parallel_size must be 1 with cluster",
        ),
    ],
)
def test_bad_pipeline_settings_are_one_clear_line(change, message):
    data = tiny_experiment(**change)
    with pytest.raises(ConfigError) as info:
        simulate(validate_experiment(data))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cli_run_reports_the_bubble_and_rejects_a_pipeline_with_static_batching(tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(pp_experiment(2)), encoding="utf-8")
    assert cli.main(["run", str(path), "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert f"pipeline     2 stages, bubble {summary['bubble_fraction']:.1%}" in out
    assert 0 < summary["bubble_fraction"] < 1
    assert summary["config"]["parallel"]["pipeline_parallel_size"] == 2
    code = cli.main(
        ["run", str(path), "--set", "scheduler.policy=static", "-o", str(tmp_path / "x")]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "scheduler.policy must be one of continuous, chunked_prefill" in err
    assert len(err.splitlines()) == 1


def test_an_engine_occupies_tp_times_pp_gpus():
    data = pp_experiment(4, parallel={"tensor_parallel_size": 2})
    assert validate_experiment(data).num_gpus == 8


def test_prompts_that_evict_one_another_across_stages_stop_with_one_clear_line(tmp_path, capsys):
    # 24 blocks of 16 tokens hold 384 tokens: one 292-token prompt (19 blocks) fits, but with
    # 3 batches in flight each virtual engine holds a partial prompt and can preempt only its
    # own, so the prompts evict one another by turns and no token is ever sampled. Stepping
    # on would never end; the run stops with exit 2 and writes nothing.
    data = pp_experiment(
        3,
        scheduler={"policy": "chunked_prefill", "max_num_seqs": 5, "max_num_batched_tokens": 137},
        workload={
            "num_requests": 19,
            "arrival": {"process": "constant", "rate": 475.0},
            "prompt_tokens": fixed(292),
            "output_tokens": fixed(1),
        },
        engine={"num_gpu_blocks": 24, "block_size": 16},
    )
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["run", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "KV cache (24 blocks of 16 tokens) is too small for 3 pipeline batches" in err
    assert not out.exists()
    data["parallel"]["pipeline_parallel_size"] = 1  # one batch at a time: the oldest goes on
    assert simulate(validate_experiment(data)).summary["completed"] == 19
