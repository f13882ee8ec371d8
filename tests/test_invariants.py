"""Properties every run must have, over small random experiments (hypothesis).

Each example is a tiny experiment (<= 30 requests) with a random policy, batch cap, token
budget, KV cache size, lengths, arrival process, cancellations, sometimes a closed loop and
sometimes shared prefix segments, with or without prefix caching.
Whatever the draw, the run ends, every request ends exactly once, timestamps are ordered, the
limits hold and the KV cache is empty at the end.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from batchsim.engine.engine import Engine
from batchsim.engine.request import RequestStatus
from batchsim.errors import ConfigError
from batchsim.simulation import Result
from conftest import (
    assert_fast_forward_exact,
    assert_same_clock,
    assert_same_run,
    capture_engines,
    simulate_data,
    tiny_experiment,
)

POLICIES = ("static", "dynamic", "continuous", "chunked_prefill")
FRAMEWORKS = ("vllm-v0", "vllm-v1", "sglang", "tensorrt-llm", "lmdeploy")
FINAL = {"finished", "rejected", "cancelled"}
TIME_TOL_S = 1e-9  # iteration ends are start + duration_ms / 1e3: equal up to rounding


def run(data: dict[str, Any]) -> tuple[Result, Engine]:
    with capture_engines() as engines:
        result = simulate_data(data)
    (engine,) = engines
    return result, engine


def prefix_rows(draw: st.DrawFn, num_requests: int) -> list[Any]:
    """Prefix segments for each request: up to three from four contents (so that requests
    share some), of lengths that cover a prompt, part of it, or run into the output."""
    rows: list[Any] = []
    for _ in range(num_requests):
        count = draw(st.integers(0, 3))
        rows.append(
            [(draw(st.integers(0, 3)), draw(st.integers(1, 160))) for _ in range(count)] or None
        )
    return rows


def _length(draw: st.DrawFn, largest: int) -> dict[str, Any]:
    hi = draw(st.integers(1, largest))
    lo = draw(st.integers(1, hi))
    return {"dist": "uniform", "min": lo, "max": hi}


@st.composite
def experiments(draw: st.DrawFn) -> dict[str, Any]:
    policy = draw(st.sampled_from(POLICIES))
    scheduler: dict[str, Any] = {
        "policy": policy,
        "max_num_seqs": draw(st.integers(1, 8)),
        "max_num_batched_tokens": draw(st.integers(8, 512)),
        "max_wait_ms": draw(st.floats(0, 200)),
    }
    if policy in ("continuous", "chunked_prefill"):
        scheduler["mix_prefill_decode"] = draw(st.booleans())
    if policy in ("static", "dynamic"):
        scheduler["padding"] = draw(st.booleans())
    engine = {
        "num_gpu_blocks": draw(st.integers(2, 64)),
        "block_size": draw(st.sampled_from([1, 4, 16])),
        "async_scheduling": draw(st.booleans()),
        "fast_forward": draw(st.booleans()),
    }
    if draw(st.integers(0, 3)) == 0:  # a serving-engine preset (CPU overhead, CUDA graphs)
        engine["framework"] = draw(st.sampled_from(FRAMEWORKS))
        if draw(st.booleans()):  # small CUDA-graph sizes: batches above them run unpadded
            engine["cuda_graph_max_batch_size"] = draw(st.sampled_from([0, 2, 4]))
    if policy in ("continuous", "chunked_prefill") and draw(st.booleans()):
        scheduler["preemption_mode"] = "swap"
        # none, a few blocks (Llama-2-7B: 0.5 MiB of KV per token), or plenty of host space
        engine["swap_space_gib"] = draw(st.sampled_from([0.0, 0.02, 4.0]))
    workload: dict[str, Any] = {
        "num_requests": draw(st.integers(1, 30)),
        "prompt_tokens": _length(draw, 300),
        "output_tokens": _length(draw, 60),
    }
    if draw(st.integers(0, 3)) == 0:  # closed loop, a quarter of the time
        workload["concurrency"] = draw(st.integers(1, 6))
        workload["think_time_ms"] = draw(
            st.sampled_from([{"dist": "fixed", "value": 0}, {"dist": "exponential", "mean": 100.0}])
        )
    else:
        # Build every block from drawn scalars (never mutate a drawn object), so that the
        # falsifying example hypothesis prints is the experiment that ran.
        process = draw(st.sampled_from(["poisson", "constant", "all_at_once", "gamma"]))
        arrival: dict[str, Any] = {"process": process}
        if process != "all_at_once":
            arrival["rate"] = draw(st.floats(0.5, 500))
        if process == "gamma":
            arrival["cv"] = draw(st.floats(0.2, 4))
        workload["arrival"] = arrival
    if draw(st.booleans()):
        hi = draw(st.floats(1, 3000))
        workload["cancel_after_ms"] = {"dist": "uniform", "min": draw(st.floats(0, hi)), "max": hi}
    if draw(st.booleans()):  # shared prefixes, with automatic prefix caching or without
        engine["enable_prefix_caching"] = draw(st.booleans())
        workload_prefix = prefix_rows(draw, workload["num_requests"])
    else:
        workload_prefix = None
    data = tiny_experiment(seed=draw(st.integers(0, 2**16)))
    data.update(scheduler=scheduler, engine=engine, workload=workload)
    if draw(st.integers(0, 4)) == 0:  # a hybrid KV cache: gpt-oss-20b slides 128 tokens
        data.update(model="gpt-oss-20b", hardware="h100-sxm")  # on every other layer
    if workload_prefix is not None:
        data["_prefix"] = workload_prefix  # see conftest.simulate_data
    return data


def over_budget_is_a_lone_recompute(it_row: Any, budget: int) -> bool:
    """continuous.py: a preempted request whose recompute exceeds the budget may still run as
    the only prefill of an iteration (a new prompt longer than the budget is rejected)."""
    return it_row.num_prefill_seqs == 1 and it_row.num_prefill_tokens > budget


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The invariants of docs/invariants.md, one test each, over the same random experiments.


@given(experiments())
def test_invariant_request_conservation(data):
    # Every request that arrives leaves exactly once, in one final state.
    result, engine = run(data)
    req, summary = result.requests, result.summary
    num = data["workload"]["num_requests"]
    assert sorted(req["request_id"]) == list(range(num))
    assert engine.num_arrived == engine.request_log.num_rows == num  # each left exactly once
    assert set(req["status"]) <= FINAL
    assert summary["completed"] + summary["num_rejected"] + summary["num_cancelled"] == num
    assert not engine.scheduler.has_unfinished_requests()
    done = req[req["status"] == "finished"]
    assert (done["output_tokens"] == done["max_tokens"]).all()
    cancelled = req[req["status"] == "cancelled"]
    assert (cancelled["output_tokens"] < cancelled["max_tokens"]).all()
    rejected = req[req["status"] == "rejected"]
    assert (rejected["reject_reason"].str.len() > 0).all()
    assert rejected["first_scheduled_time_s"].isna().all()
    assert (req["output_tokens"] <= req["max_tokens"]).all()


@given(experiments())
def test_invariant_kv_conservation(data):
    # KV blocks stay within the cache, every block taken is given back, every block swapped
    # out comes back (unless its client left), and the cache is empty at the end.
    result, engine = run(data)
    req, it, summary = result.requests, result.iterations, result.summary
    usage = it["kv_cache_usage"].to_numpy()
    assert ((usage >= 0) & (usage <= 1)).all()
    assert 0 <= summary["max_kv_cache_usage"] <= 1
    kv = engine.scheduler.kv_cache
    assert kv.num_used_blocks == 0 and kv.num_free_cpu_blocks == kv.num_cpu_blocks
    # Prefix caching: no block is referenced at the end; what was found cached is whole
    # blocks and leaves at least one prompt token to compute.
    cached = req["num_cached_tokens"]
    done = req[req["status"] == "finished"]
    if data["engine"].get("enable_prefix_caching"):
        assert set(kv.num_references().values()) <= {0}
        assert kv.num_cached_blocks == len(kv.num_references()) == kv.num_idle_blocks
        assert (cached % data["engine"]["block_size"] == 0).all()
        assert (cached < req["prompt_tokens"]).all()
        assert 0 <= summary["prefix_cache_hit_rate"] < 1 or not len(done)
    else:
        assert (cached == 0).all() and (it["num_cached_blocks"] == 0).all()
        assert summary["prefix_cache_hit_rate"] == 0 or not len(done)
    # cached blocks only leave by eviction: each iteration's count is at least the previous
    # one's less what its schedule() evicted
    cached_blocks = it["num_cached_blocks"].to_numpy()
    assert (cached_blocks[1:] + it["num_evicted_blocks"].to_numpy()[1:] >= cached_blocks[:-1]).all()
    assert 0 <= summary["num_swaps"] <= summary["num_preemptions"]
    swapped_out, swapped_in = it["num_swap_out_blocks"].sum(), it["num_swap_in_blocks"].sum()
    assert swapped_in <= swapped_out  # every block copied back was copied out
    if not (req["status"] == "cancelled").any():
        assert swapped_in == swapped_out  # ... and all come back unless their client left
    copies = it["num_swap_in_blocks"] + it["num_swap_out_blocks"]
    assert ((it["swap_time_ms"] > 0) == (copies > 0)).all()


@given(experiments())
def test_invariant_causality(data):
    # A request is scheduled after it arrives, samples its first token after that and
    # finishes after that; iterations run one at a time, within the batch limits.
    result, _ = run(data)
    req, it = result.requests, result.iterations
    scheduler_cfg = data["scheduler"]
    arrival = req["arrival_time_s"]
    done = req[req["status"] == "finished"]
    assert (done["arrival_time_s"] <= done["first_scheduled_time_s"]).all()
    assert (done["first_scheduled_time_s"] <= done["first_token_time_s"]).all()
    assert (done["first_token_time_s"] <= done["finish_time_s"]).all()
    assert (done["ttft_ms"] <= done["e2el_ms"]).all()
    cancelled = req[req["status"] == "cancelled"]
    assert (cancelled["finish_time_s"] >= cancelled["arrival_time_s"]).all()
    assert (arrival >= 0).all()
    # Batch limits.
    assert (it["num_seqs"] >= 1).all()
    assert (it["num_seqs"] <= scheduler_cfg["max_num_seqs"]).all()
    assert (it["num_slots"] <= scheduler_cfg["max_num_seqs"]).all()
    assert (it["num_prefill_seqs"] + it["num_decode_seqs"] == it["num_seqs"]).all()
    if scheduler_cfg["policy"] in ("continuous", "chunked_prefill"):
        budget = scheduler_cfg["max_num_batched_tokens"]
        tokens = it["num_prefill_tokens"] + it["num_decode_tokens"]
        for row in it[tokens > budget].itertuples():
            assert over_budget_is_a_lone_recompute(row, budget), (
                f"iteration {row.iteration}: {row.num_prefill_tokens} prefill + "
                f"{row.num_decode_tokens} decode tokens > budget {budget}"
            )
        if scheduler_cfg["policy"] == "chunked_prefill":
            assert (tokens <= budget).all()
    # Iterations run one at a time: starts never decrease and never overlap.
    starts = it["start_time_s"].to_numpy()
    ends = starts + it["duration_ms"].to_numpy() / 1e3
    assert (np.diff(starts) >= 0).all()
    assert (starts[1:] >= ends[:-1] - TIME_TOL_S).all()
    assert (it["duration_ms"] > 0).all()
    if len(done):
        assert done["finish_time_s"].max() <= ends.max() + TIME_TOL_S


def _without_wall_time(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "wall_time_s"}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiments())
def test_invariant_determinism(data):
    # The same experiment and seed give identical outputs.
    first = simulate_data(data)
    second = simulate_data(data)
    a, b = _without_wall_time(first.summary), _without_wall_time(second.summary)
    assert a.keys() == b.keys()
    assert all(_same(a[k], b[k]) for k in a), [k for k in a if not _same(a[k], b[k])]
    assert first.requests.equals(second.requests)
    assert first.iterations.equals(second.iterations)


# A preempted request recomputes its prompt and outputs in 8-token chunks; its last chunk is
# one token, which make_output() counts as a decode (one token left, outputs so far).
_RECOMPUTE_TAIL = {
    "name": "tiny",
    "seed": 65536,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {"policy": "chunked_prefill", "max_num_seqs": 3, "max_num_batched_tokens": 9},
    "workload": {
        "num_requests": 3,
        "prompt_tokens": {"dist": "uniform", "min": 25, "max": 30},
        "output_tokens": {"dist": "uniform", "min": 6, "max": 37},
        "arrival": {"process": "poisson", "rate": 7.0},
    },
    "engine": {"num_gpu_blocks": 28, "block_size": 4, "async_scheduling": False},
}

# The last request finishes at 0.294842 s, when the next iteration starts: whether that
# iteration counts in the summary must not depend on the rounding of either path's times.
_ENDS_AT_A_START = {
    "name": "tiny",
    "seed": 346,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {"policy": "chunked_prefill", "max_num_seqs": 2, "max_num_batched_tokens": 248},
    "workload": {
        "num_requests": 2,
        "prompt_tokens": {"dist": "uniform", "min": 247, "max": 248},
        "output_tokens": {"dist": "uniform", "min": 26, "max": 29},
        "concurrency": 2,
        "think_time_ms": {"dist": "fixed", "value": 0},
        "cancel_after_ms": {"dist": "uniform", "min": 295.0, "max": 295.0},
    },
    "engine": {"num_gpu_blocks": 35, "block_size": 16, "async_scheduling": True},
}

# Both requests arrive when the engine is idle: each starts the moment it arrives (a queue
# delay of exactly 0), whichever path the clock took to get there.
_IDLE_ARRIVALS = {
    "name": "tiny",
    "seed": 76,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {"policy": "static", "max_num_seqs": 1, "max_num_batched_tokens": 8},
    "workload": {
        "num_requests": 2,
        "prompt_tokens": {"dist": "uniform", "min": 1, "max": 1},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 35},
        "arrival": {"process": "gamma", "rate": 0.609375, "cv": 0.5625},
    },
    "engine": {"num_gpu_blocks": 3, "block_size": 16, "async_scheduling": False},
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiments())
@example(_RECOMPUTE_TAIL)
@example(_IDLE_ARRIVALS)
@example(_ENDS_AT_A_START)
def test_invariant_fast_forward_equals_stepping(data):
    # Decode stretches, priced and logged as runs, expand to exactly the iterations that
    # stepping one by one produces: every column, every request, the whole summary.
    assert_fast_forward_exact(data)


@st.composite
def pipeline_experiments(draw: st.DrawFn) -> dict[str, Any]:
    """A random small experiment on a pipeline of 2 to 4 stages, on a policy that runs one."""
    data = draw(experiments())
    policy = draw(st.sampled_from(["continuous", "chunked_prefill"]))
    scheduler = {k: v for k, v in data["scheduler"].items() if k != "padding"}
    scheduler["policy"] = policy
    if "mix_prefill_decode" not in scheduler:
        scheduler["mix_prefill_decode"] = draw(st.booleans())
    out = dict(data)
    out.update(scheduler=scheduler, parallel={"pipeline_parallel_size": draw(st.integers(2, 4))})
    return out


# Prefill first on two virtual engines: each one's prompt cut at the budget is its own, never
# the other's prompt still in flight (scheduling that one twice freed its blocks twice).
_PREFILL_FIRST_PIPELINE = {
    "name": "tiny",
    "seed": 0,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {
        "policy": "chunked_prefill",
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8,
        "max_wait_ms": 0.0,
        "mix_prefill_decode": False,
    },
    "workload": {
        "num_requests": 2,
        "prompt_tokens": {"dist": "uniform", "min": 1, "max": 59},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 2},
        "concurrency": 2,
        "think_time_ms": {"dist": "fixed", "value": 0},
    },
    "engine": {"num_gpu_blocks": 3, "block_size": 16, "async_scheduling": False},
    "parallel": {"pipeline_parallel_size": 2},
}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_experiments())
@example(_PREFILL_FIRST_PIPELINE)
def test_invariant_fast_forward_equals_stepping_in_pipelines(data):
    # A pipeline's virtual engines build their cohort-alone batches without the scheduler and
    # its loop skips SimPy's sleeps: bit for bit the iterations and requests of the general
    # path (engine.fast_forward: false), every column.
    fast_data, slow_data = copy.deepcopy(data), copy.deepcopy(data)
    slow_data["engine"]["fast_forward"] = False
    fast_data["engine"]["fast_forward"] = True
    try:
        slow = simulate_data(slow_data)
    except ConfigError as exc:  # a KV cache too small for the batches in flight: both stop
        with pytest.raises(ConfigError, match=re.escape(str(exc))):
            simulate_data(fast_data)
        return
    fast = simulate_data(fast_data)
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)
    for a, b in ((fast.iterations, slow.iterations), (fast.requests, slow.requests)):
        assert list(a.columns) == list(b.columns)
        for column in a.columns:
            x, y = a[column].to_numpy(), b[column].to_numpy()
            assert x.tobytes() == y.tobytes() if x.dtype != object else list(x) == list(y), column

    def figures(result: Result) -> str:  # (the run's settings and its wall time differ)
        return repr(
            sorted(
                (k, v)
                for k, v in result.summary.items()
                if not isinstance(v, dict) and k != "wall_time_s"
            )
        )

    assert figures(fast) == figures(slow)


@st.composite
def speculative_experiments(draw: st.DrawFn) -> dict[str, Any]:
    """A random small experiment with speculative decoding (a draft model or n-gram
    proposals, fixed or drawn acceptance), on a policy that runs it."""
    data = draw(experiments())
    policy = draw(st.sampled_from(["continuous", "chunked_prefill"]))
    scheduler = {k: v for k, v in data["scheduler"].items() if k != "padding"}
    scheduler["policy"] = policy
    if "mix_prefill_decode" not in scheduler:
        scheduler["mix_prefill_decode"] = draw(st.booleans())
    method = draw(st.sampled_from(["ngram", "draft"]))
    alpha: Any = draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    if draw(st.booleans()):
        alpha = {"dist": "beta", "a": 2.0, "b": 1.0}
    speculative: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": draw(st.integers(1, 5)),
        "acceptance_rate": alpha,
    }
    if method == "draft":
        speculative["draft_model"] = "llama-3.2-1b"
    else:
        speculative["proposer_ms_per_token"] = draw(st.sampled_from([0.0, 0.3]))
    engine = {k: v for k, v in data["engine"].items() if k != "framework"}
    engine["speculative"] = speculative
    engine["num_gpu_blocks"] = draw(st.integers(8, 64))
    out = {k: v for k, v in data.items() if k != "_prefix"}
    out.update(scheduler=scheduler, engine=engine)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(speculative_experiments())
def test_invariant_fast_forward_equals_stepping_with_speculative_decoding(data):
    # A speculative run's verification iterations, run back to back without a pass each,
    # are the passes' iterations exactly.
    assert_fast_forward_exact(data)


@st.composite
def chunked_arrivals(draw: st.DrawFn) -> dict[str, Any]:
    """Chunked prefill with prompts of several chunks and requests arriving while they run:
    some cancelled, some too long for the engine (rejected on arrival), some from a closed
    loop, sometimes with shared prefixes and prefix caching."""
    budget = draw(st.integers(16, 128))
    scheduler = {
        "policy": "chunked_prefill",
        "max_num_seqs": draw(st.integers(2, 8)),
        "max_num_batched_tokens": budget,
    }
    longest = budget * draw(st.integers(2, 8))
    block_size = draw(st.sampled_from([1, 4, 16]))
    engine: dict[str, Any] = {  # room for one to a dozen of the longest prompts
        "num_gpu_blocks": draw(st.integers(longest // block_size + 2, 12 * longest // block_size)),
        "block_size": block_size,
        "async_scheduling": draw(st.booleans()),
    }
    workload: dict[str, Any] = {
        "num_requests": draw(st.integers(2, 30)),
        "prompt_tokens": {"dist": "uniform", "min": draw(st.integers(1, budget)), "max": longest},
        "output_tokens": _length(draw, 200),  # decodes beside the chunks
    }
    if draw(st.integers(0, 3)) == 0:
        workload["concurrency"] = draw(st.integers(1, 6))
        workload["think_time_ms"] = {"dist": "exponential", "mean": draw(st.floats(1, 200))}
    else:
        workload["arrival"] = {"process": "poisson", "rate": draw(st.floats(20, 400))}
    if draw(st.booleans()):
        hi = draw(st.floats(1, 500))
        workload["cancel_after_ms"] = {"dist": "uniform", "min": draw(st.floats(0, hi)), "max": hi}
    if draw(st.booleans()):  # the longest prompts are rejected when they arrive
        engine["max_model_len"] = draw(st.integers(longest // 2, longest + 40))
    data = tiny_experiment(seed=draw(st.integers(0, 2**16)))
    data.update(scheduler=scheduler, engine=engine, workload=workload)
    if draw(st.integers(0, 4)) == 0:  # a hybrid KV cache: gpt-oss-20b slides 128 tokens
        data.update(model="gpt-oss-20b", hardware="h100-sxm")  # on every other layer
    if draw(st.integers(0, 2)) == 0:  # shared prefixes, cached or not
        engine["enable_prefix_caching"] = draw(st.booleans())
        data["_prefix"] = prefix_rows(draw, workload["num_requests"])  # see conftest
    return data


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunked_arrivals())
def test_arrivals_during_prompt_chunks_change_nothing_fast_forward_skips(data):
    # A stretch of prompt chunks takes the arrivals (and rejections, cancellations of the
    # requests just arrived) at the iteration starts where stepping's passes take them, and
    # goes on: the same iterations and requests as stepping one iteration at a time.
    assert_fast_forward_exact(data)


def test_continuous_mixed_iteration_stays_within_token_budget(tmp_path: Path):
    # Ten 9-token prompts (90 tokens) fill the first iteration of a 100-token budget; a 95-token
    # prompt arriving next fits the budget on its own, but not next to the ten running decodes
    # (10 + 95 = 105 > 100). It is a new request, not an over-budget recompute, so it must wait.
    rows = ["0.0,9,50" for _ in range(10)] + ["0.001,95,5"]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    data = tiny_experiment(
        scheduler={
            "policy": "continuous",
            "max_num_seqs": 32,
            "max_num_batched_tokens": 100,
            "mix_prefill_decode": True,
        }
    )
    data["workload"] = {"trace": {"path": str(trace), "format": "csv"}}
    result, _ = run(data)
    it = result.iterations
    tokens = it["num_prefill_tokens"] + it["num_decode_tokens"]
    assert result.summary["num_preemptions"] == 0 == it["num_preempted"].sum()
    assert tokens.max() <= 100, it.loc[tokens > 100, ["num_prefill_tokens", "num_decode_tokens"]]
    assert (result.requests["status"] == RequestStatus.FINISHED.name.lower()).all()


# ----------------------------------------------------------------- replicas behind a router

ROUTER_NAMES = (
    "round_robin",
    "random",
    "least_outstanding",
    "least_kv",
    "power_of_two",
    "prefix_aware",
)


@st.composite
def cluster_experiments(draw: st.DrawFn) -> dict[str, Any]:
    """:func:`experiments` behind a router: 1-4 equal replicas, or groups whose KV caches and
    batch caps differ."""
    data = draw(experiments())
    if draw(st.booleans()):
        replicas: Any = draw(st.integers(1, 4))
    else:
        replicas = [
            {
                "count": draw(st.integers(1, 2)),
                "engine": {"num_gpu_blocks": draw(st.integers(2, 64))},
                "scheduler": {"max_num_seqs": draw(st.integers(1, 8))},
            }
            for _ in range(draw(st.integers(1, 3)))
        ]
    cluster: dict[str, Any] = {"replicas": replicas, "router": draw(st.sampled_from(ROUTER_NAMES))}
    if draw(st.booleans()):
        cluster["router_overhead_ms"] = draw(st.sampled_from([0.0, 0.5, 7.0]))
    data["cluster"] = cluster
    return data


LINKS = ("nvlink-4", "infiniband-ndr-400", "pcie-gen4-x16", {"bandwidth_gb_s": 0.5})


@st.composite
def disaggregated_experiments(draw: st.DrawFn) -> dict[str, Any]:
    """:func:`experiments` on a prefill pool and a decode pool, each with its
    own (small) KV cache; the decode pool runs continuous batching or chunked prefill."""
    data = draw(experiments())
    data["engine"].pop("enable_prefix_caching", None)  # not modelled with disaggregation
    policy = draw(st.sampled_from(["continuous", "chunked_prefill"]))
    decode_scheduler: dict[str, Any] = {"policy": policy}
    if policy == "continuous":
        decode_scheduler["mix_prefill_decode"] = draw(st.booleans())
    data["cluster"] = {
        "router": draw(st.sampled_from(ROUTER_NAMES)),
        "disaggregation": {
            "prefill": {
                "replicas": draw(st.integers(1, 3)),
                "engine": {"num_gpu_blocks": draw(st.integers(2, 200))},
            },
            "decode": {
                "replicas": draw(st.integers(1, 3)),
                "engine": {"num_gpu_blocks": draw(st.integers(2, 400))},
                "scheduler": decode_scheduler,
            },
            "kv_transfer": {
                "link": draw(st.sampled_from(LINKS)),
                "mode": draw(st.sampled_from(["after_prefill", "layerwise"])),
            },
            "decode_router": draw(st.sampled_from(ROUTER_NAMES)),
        },
    }
    if draw(st.booleans()):
        data["cluster"]["router_overhead_ms"] = draw(st.sampled_from([0.5, 7.0]))
    return data


def run_cluster(data: dict[str, Any]) -> tuple[Result, list[Engine]]:
    from unittest import mock

    from batchsim.deployment import engines as deployment_engines

    engines: list[Engine] = []

    class RecordingEngine(Engine):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            engines.append(self)

    with mock.patch.object(deployment_engines, "Engine", RecordingEngine):
        result = simulate_data(data)
    return result, engines


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_experiments())
def test_random_cluster_experiments_keep_every_invariant(data):
    result, engines = run_cluster(data)
    req, it, summary = result.requests, result.iterations, result.summary
    num = data["workload"]["num_requests"]
    # Every request ends exactly once, on the replica it was routed to.
    assert sorted(req["request_id"]) == list(range(num))
    assert set(req["status"]) <= FINAL
    assert sum(e.request_log.num_rows for e in engines) == num
    for index, engine in enumerate(engines):
        assert engine.request_log.num_rows == engine.num_arrived == (req["replica"] == index).sum()
        assert not engine.scheduler.has_unfinished_requests()
        kv = engine.scheduler.kv_cache
        assert kv.num_used_blocks == 0 and kv.num_free_cpu_blocks == kv.num_cpu_blocks
        # each replica runs one iteration at a time, within its own batch cap
        mine = it[it["replica"] == index]
        starts = mine["start_time_s"].to_numpy()
        ends = starts + mine["duration_ms"].to_numpy() / 1e3
        assert (np.diff(starts) >= 0).all() and (starts[1:] >= ends[:-1] - TIME_TOL_S).all()
        assert (mine["num_seqs"] <= engine.scheduler.max_num_seqs).all()
    done = req[req["status"] == "finished"]
    assert (done["arrival_time_s"] <= done["first_scheduled_time_s"]).all()
    overhead_s = data["cluster"].get("router_overhead_ms", 0.0) / 1e3
    queue = done["first_scheduled_time_s"] - done["arrival_time_s"]
    assert (queue >= overhead_s - TIME_TOL_S).all()  # no replica sees a request before it
    assert result.replicas["num_requests"].sum() == summary["num_requests"] == num
    assert summary["completed"] + summary["num_rejected"] + summary["num_cancelled"] == num


# A KV transfer starts 8.7e-9 s after its prompt's last iteration: the wait is a difference
# of two clock values, whose rounding differs between the paths by 3e-17 s.
NEAR_ZERO_KV_WAIT = {
    "name": "tiny",
    "seed": 123,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {
        "policy": "static",
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8,
        "max_wait_ms": 0.0,
        "padding": False,
    },
    "workload": {
        "num_requests": 9,
        "prompt_tokens": {"dist": "uniform", "min": 30, "max": 38},
        "output_tokens": {"dist": "uniform", "min": 5, "max": 6},
        "arrival": {"process": "gamma", "rate": 43.171190744758654, "cv": 0.2},
    },
    "engine": {"num_gpu_blocks": 2, "block_size": 16, "async_scheduling": False},
    "cluster": {
        "router": "round_robin",
        "disaggregation": {
            "prefill": {"replicas": 1, "engine": {"num_gpu_blocks": 3}},
            "decode": {
                "replicas": 2,
                "engine": {"num_gpu_blocks": 6},
                "scheduler": {"policy": "chunked_prefill"},
            },
            "kv_transfer": {"link": "nvlink-4", "mode": "layerwise"},
            "decode_router": "round_robin",
        },
    },
}

# Closed loop, identical replicas: a cancellation in replica 1's pass at t makes a user send a
# request at t, routed to replica 0, whose pass at t came first (passes go by index). Stepping,
# it waits for replica 0's next iteration end (and its rejection for the next user's request);
# replica 0 inside a stretch at t must not take it at t either.
ROUTED_AFTER_ITS_PASS = {
    "name": "tiny",
    "seed": 8596,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {"policy": "static", "max_num_seqs": 1, "max_num_batched_tokens": 8},
    "workload": {
        "num_requests": 7,
        "prompt_tokens": {"dist": "fixed", "value": 1},
        "output_tokens": {"dist": "uniform", "min": 2, "max": 10},
        "concurrency": 4,
        "think_time_ms": {"dist": "fixed", "value": 0},
        "cancel_after_ms": {"dist": "uniform", "min": 21.0, "max": 23.0},
    },
    "engine": {"num_gpu_blocks": 2, "block_size": 4, "fast_forward": False},
    "cluster": {"replicas": 2, "router": "least_outstanding"},
}

# Identical replicas whose iterations end at one instant: fast-forward and stepping must
# compute those ends as one float (the duration added once per iteration on both paths), or
# the same-instant order (routes, cancellations, a decode instance's KV blocks) differs.
SAME_INSTANT_ON_FIVE_REPLICAS = {
    "name": "tiny",
    "seed": 8596,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {
        "policy": "dynamic",
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8,
        "max_wait_ms": 176.0,
    },
    "workload": {
        "num_requests": 21,
        "prompt_tokens": {"dist": "uniform", "min": 92, "max": 101},
        "output_tokens": {"dist": "uniform", "min": 7, "max": 44},
        "concurrency": 5,
        "think_time_ms": {"dist": "fixed", "value": 0},
        "cancel_after_ms": {"dist": "uniform", "min": 235.0, "max": 467.0},
    },
    "engine": {"num_gpu_blocks": 2, "block_size": 4, "fast_forward": False},
    "cluster": {
        "replicas": [
            {"count": 2, "engine": {"num_gpu_blocks": 2}, "scheduler": {"max_num_seqs": 1}},
            {"count": 2, "engine": {"num_gpu_blocks": 35}, "scheduler": {"max_num_seqs": 3}},
            {"count": 1, "engine": {"num_gpu_blocks": 33}, "scheduler": {"max_num_seqs": 2}},
        ],
        "router": "least_outstanding",
    },
}
KV_HANDOFF_AT_A_DECODE_END = {
    "name": "tiny",
    "seed": 2,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {"policy": "static", "max_num_seqs": 1, "max_num_batched_tokens": 8},
    "workload": {
        "num_requests": 4,
        "prompt_tokens": {"dist": "fixed", "value": 81},
        "output_tokens": {"dist": "fixed", "value": 5},
        "arrival": {"process": "poisson", "rate": 63.0},
    },
    "engine": {"num_gpu_blocks": 2, "block_size": 16, "fast_forward": False},
    "cluster": {
        "router": "round_robin",
        "disaggregation": {
            "prefill": {"replicas": 1, "engine": {"num_gpu_blocks": 6}},
            "decode": {
                "replicas": 2,
                "engine": {"num_gpu_blocks": 12},
                "scheduler": {"policy": "chunked_prefill"},
            },
            "kv_transfer": {"link": "nvlink-4", "mode": "after_prefill"},
            "decode_router": "round_robin",
        },
    },
}

# Closed loop: a request that one replica's last token releases reaches another replica at
# the end of that replica's own iteration; the two clock values are an ulp apart on one path.
# Async scheduling must take the new iteration as back to back on both paths.
ARRIVES_AT_ANOTHER_REPLICAS_END = {
    "name": "tiny",
    "seed": 0,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {
        "policy": "static",
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8,
        "max_wait_ms": 0.0,
        "padding": False,
    },
    "workload": {
        "num_requests": 6,
        "prompt_tokens": {"dist": "uniform", "min": 1, "max": 1},
        "output_tokens": {"dist": "uniform", "min": 22, "max": 24},
        "concurrency": 2,
        "think_time_ms": {"dist": "fixed", "value": 0},
    },
    "engine": {"num_gpu_blocks": 2, "block_size": 16, "async_scheduling": True},
    "cluster": {"replicas": 3, "router": "round_robin"},
}

# On a decode instance, request 9 waits for KV blocks behind request 15, which does not fit
# until in-flight transfers land; request 9's client leaves meanwhile. The pass at its cancel
# time must take it out of the queue, else the engine wakes at that instant forever.
CANCELLED_BEHIND_A_WAITER = {
    "name": "tiny",
    "seed": 19429,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {
        "policy": "static",
        "max_num_seqs": 6,
        "max_num_batched_tokens": 353,
        "max_wait_ms": 43.65516355908882,
        "padding": True,
    },
    "workload": {
        "num_requests": 25,
        "prompt_tokens": {"dist": "uniform", "min": 127, "max": 128},
        "output_tokens": {"dist": "uniform", "min": 5, "max": 27},
        "arrival": {"process": "constant", "rate": 414.2694045100909},
        "cancel_after_ms": {
            "dist": "uniform",
            "min": 493.30662372236367,
            "max": 1419.6074063829965,
        },
    },
    "engine": {
        "num_gpu_blocks": 57,
        "block_size": 4,
        "async_scheduling": True,
        "fast_forward": True,
    },
    "cluster": {
        "router": "random",
        "disaggregation": {
            "prefill": {"replicas": 2, "engine": {"num_gpu_blocks": 124}},
            "decode": {
                "replicas": 2,
                "engine": {"num_gpu_blocks": 94},
                "scheduler": {"policy": "continuous", "mix_prefill_decode": False},
            },
            "kv_transfer": {"link": {"bandwidth_gb_s": 0.5}, "mode": "after_prefill"},
            "decode_router": "random",
        },
        "router_overhead_ms": 7.0,
    },
}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cluster_experiments(), disaggregated_experiments()))
@example(CANCELLED_BEHIND_A_WAITER)
@example(NEAR_ZERO_KV_WAIT)
@example(ARRIVES_AT_ANOTHER_REPLICAS_END)
@example(ROUTED_AFTER_ITS_PASS)
@example(SAME_INSTANT_ON_FIVE_REPLICAS)
@example(KV_HANDOFF_AT_A_DECODE_END)
def test_invariant_fast_forward_equals_stepping_on_clusters(data):
    # A stretch that a request routed to its replica cuts short, and what routers see of a
    # replica inside a stretch, must match stepping: the same routes, the same run. In a
    # disaggregated cluster also the hand-offs, the KV blocks taken for transfers and given
    # back, and the transfers' times.
    a, b = assert_fast_forward_exact(data)
    assert a.requests["replica"].tolist() == b.requests["replica"].tolist()
    if "disaggregation" in data["cluster"]:
        for column in ("prefill_replica", "decode_replica", "kv_transfer_bytes"):
            assert a.requests[column].tolist() == b.requests[column].tolist(), column
        # differences of clock values of either path, equal up to their rounding: a relative
        # tolerance, and an absolute one (1e-9 ms) for waits near zero, where a few 1e-17 s
        # of rounding are a large fraction of the value
        for column in ("kv_wait_ms", "kv_transfer_ms"):
            np.testing.assert_allclose(a.requests[column], b.requests[column], rtol=1e-9, atol=1e-9)
