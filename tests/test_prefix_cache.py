"""Automatic prefix caching (``engine.enable_prefix_caching``): block keys, hits, eviction
order, preemption and swapping, and the invariants of the block accounting.

Expected values come from elsewhere than the code under test: the cost model priced on a
shape built here by hand, block arithmetic done by hand for small pools, a brute-force
comparison of expanded token sequences, and the same run without prefix caching.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from test_invariants import experiments

from batchsim import cli
from batchsim.config import validate_experiment
from batchsim.cost import BatchShape
from batchsim.deployment import engine_setup
from batchsim.engine.engine import Engine
from batchsim.engine.prefix_cache import PrefixCachingKVCacheManager, block_keys
from batchsim.engine.request import Request, RequestStatus
from batchsim.errors import ConfigError
from batchsim.simulation import Result
from conftest import (
    assert_same_clock,
    assert_same_run,
    capture_engines,
    simulate_data,
    tiny_experiment,
)

CPU_MS, CPU_PER_SEQ_MS = 3.0, 0.5
CACHE_COLUMNS = ("num_cached_blocks", "num_evicted_blocks")


def experiment(
    tmp_path: Path,
    rows: list[tuple[float, int, int]],
    prefix: list[Any],
    *,
    scheduler: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Llama-2-7B on an A100-80GB replaying (arrival s, prompt, output) rows whose requests
    start with the ``prefix`` segments, with prefix caching and a fixed CPU overhead."""
    trace = tmp_path / "trace.csv"
    lines = ["arrival_time,prompt_tokens,output_tokens", *(f"{t!r},{p},{o}" for t, p, o in rows)]
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = tiny_experiment()
    data["workload"] = {"trace": {"path": str(trace), "format": "csv"}}
    data["scheduler"] = scheduler or {"policy": "continuous", "max_num_seqs": 32}
    data["engine"] = {
        "enable_prefix_caching": True,
        "cpu_overhead_ms": CPU_MS,
        "cpu_overhead_per_seq_ms": CPU_PER_SEQ_MS,
        **(engine or {}),
    }
    data["_prefix"] = prefix
    return data


def run(data: dict[str, Any], progress: Any = None) -> tuple[Result, Engine]:
    with capture_engines() as engines:
        result = simulate_data(data, progress)
    (engine,) = engines
    return result, engine


def caching_off(data: dict[str, Any]) -> dict[str, Any]:
    off = copy.deepcopy(data)
    off["engine"]["enable_prefix_caching"] = False
    return off


POLICIES = {
    "static": {"policy": "static", "max_num_seqs": 1},
    "dynamic": {"policy": "dynamic", "max_num_seqs": 1},
    "continuous": {"policy": "continuous", "max_num_seqs": 8},
    "chunked_prefill": {"policy": "chunked_prefill", "max_num_seqs": 8},
}


# ------------------------------------------------------------------------ hits and their cost


@pytest.mark.parametrize("policy", POLICIES)
def test_each_request_after_the_first_reuses_the_shared_prefix_and_prefills_only_the_rest(
    tmp_path, policy
):
    # Five requests share a 64-token prefix (4 blocks of 16) and arrive 10 s apart, each to an
    # idle engine. The first computes its whole prompt; every later one finds the 64 tokens
    # cached and prefills the rest of its prompt over a 64-token context.
    shared = 64
    prompts = [shared + own for own in (37, 50, 13, 1, 100)]
    rows = [(10.0 * i, p, 3) for i, p in enumerate(prompts)]
    data = experiment(tmp_path, rows, [[(7, shared)]] * 5, scheduler=POLICIES[policy])
    result, _ = run(data)
    req = result.requests

    expected_cached = [0] + [shared] * 4
    assert req["num_cached_tokens"].tolist() == expected_cached
    assert result.summary["prefix_cache_hit_rate"] == pytest.approx(
        sum(expected_cached) / sum(prompts), rel=1e-12
    )
    cost_model = engine_setup(
        validate_experiment({k: v for k, v in data.items() if k != "_prefix"})
    )
    for prompt, cached, ttft_ms in zip(prompts, expected_cached, req["ttft_ms"]):
        q = prompt - cached  # one prefill row each, over `cached` cached tokens; it samples
        shape = BatchShape(
            num_seqs=1,
            num_prefill_tokens=q,
            num_sampled_tokens=1,
            kv_read_tokens=cached,
            attn_pairs=q * cached + q * (q + 1) // 2,
        )
        gpu_s = cost_model.cost_model.estimate(shape).time
        assert ttft_ms == pytest.approx((CPU_MS + CPU_PER_SEQ_MS) + gpu_s * 1e3, rel=1e-9)
    it = result.iterations
    prefills = it.loc[it["num_prefill_seqs"] > 0, "num_prefill_tokens"].tolist()
    assert prefills == [p - c for p, c in zip(prompts, expected_cached)]


def test_without_prefix_caching_nothing_is_reused_and_nothing_is_cached(tmp_path):
    data = experiment(tmp_path, [(0.0, 80, 3), (10.0, 80, 3)], [[(7, 64)]] * 2)
    result, engine = run(caching_off(data))
    assert result.requests["num_cached_tokens"].tolist() == [0, 0]
    assert result.summary["prefix_cache_hit_rate"] == 0.0
    assert (result.iterations[list(CACHE_COLUMNS)] == 0).all().all()
    assert not engine.scheduler.kv_cache.caches_prefixes


@pytest.mark.parametrize(
    ("block_size", "prompt", "shared", "cached"),
    [
        (16, 65, 64, 64),  # 4 blocks cached, the one own token is computed
        (16, 64, 64, 48),  # all 4 blocks cached, but the last one is computed again
        (1, 40, 40, 39),  # one-token blocks: all but the last token
    ],
)
def test_a_request_whose_prompt_is_cached_still_computes_its_last_token(
    tmp_path, block_size, prompt, shared, cached
):
    data = experiment(
        tmp_path,
        [(0.0, prompt, 2), (10.0, prompt, 2)],
        [[(3, shared)]] * 2,
        engine={"block_size": block_size},
    )
    result, _ = run(data)
    assert result.requests["num_cached_tokens"].tolist() == [0, cached]
    it = result.iterations
    second = it[it["start_time_s"] >= 10.0].iloc[0]
    assert second["num_prefill_tokens"] == prompt - cached >= 1
    assert second["num_output_tokens"] == 1  # the prefill samples the first token


def test_admission_counts_the_idle_cached_blocks_it_takes_against_the_watermark(tmp_path):
    # 10 blocks of 16 tokens. Request a (64 shared + 16 own tokens, 5 blocks) leaves its 4
    # keyed blocks idle. Request z (70 tokens + 9 decodes: 5 blocks, never a sixth) runs
    # while a2 (the same 80 tokens as a) arrives: a2 reuses a's 4 idle blocks and needs one
    # new block, so it takes 5 of the 5 free blocks (1 empty + 4 idle). With a watermark of
    # 1 block it waits for z to finish; with none it starts at once.
    rows = [(0.0, 80, 1), (10.0, 70, 10), (10.001, 80, 1)]
    prefix = [[(5, 64)], None, [(5, 64)]]
    for watermark, waits in ((0.1, True), (0.0, False)):
        data = experiment(
            tmp_path, rows, prefix, engine={"num_gpu_blocks": 10, "watermark": watermark}
        )
        req = run(data)[0].requests
        assert req["num_cached_tokens"].tolist() == [0, 0, 64]
        z_finish, a2_start = req["finish_time_s"].iloc[1], req["first_scheduled_time_s"].iloc[2]
        assert (a2_start == z_finish) if waits else (a2_start < z_finish)


# ------------------------------------------------------------------------ eviction


def test_the_least_recently_freed_prefix_is_evicted_first(tmp_path):
    # 13 blocks of 16 tokens; each request has 64 shared tokens (4 blocks) and 16 own ones
    # and samples a single token, so it holds 5 blocks for one iteration. After a, b, c
    # (prefixes A, B, C) 12 blocks hold cached content and 1 is empty; d (prefix D) needs 5:
    # the empty one and A's 4, freed longest ago. Then b2 and c2 find B and C; a2 finds
    # nothing and evicts the 4 blocks freed longest ago by then: D's.
    names = "ABCDBCA"
    rows = [(10.0 * i, 80, 1) for i in range(len(names))]
    prefix = [[(ord(name), 64)] for name in names]
    result, _ = run(
        experiment(tmp_path, rows, prefix, engine={"num_gpu_blocks": 13, "watermark": 0})
    )
    assert result.requests["num_cached_tokens"].tolist() == [0, 0, 0, 0, 64, 64, 0]
    it = result.iterations
    assert it["num_evicted_blocks"].tolist() == [0, 0, 0, 4, 0, 0, 4]
    assert it["num_cached_blocks"].tolist() == [0, 4, 8, 8, 12, 12, 8]
    assert it["kv_cache_usage"].tolist() == pytest.approx([5 / 13] * 7)  # idle blocks are free


def test_a_request_frees_its_blocks_deepest_first_so_its_first_blocks_are_evicted_last(
    tmp_path,
):
    # 11 blocks. a leaves A's 4 blocks idle (7 empty); b leaves B's (3 empty); c needs 5: the
    # 3 empty ones and 2 evicted, A's last two blocks. c2 finds C (4 blocks); a2 finds A's
    # first 2 blocks, needs 3 more: the empty one and B's last 2 blocks.
    names = "ABCCA"
    rows = [(10.0 * i, 80, 1) for i in range(len(names))]
    prefix = [[(ord(name), 64)] for name in names]
    result, _ = run(
        experiment(tmp_path, rows, prefix, engine={"num_gpu_blocks": 11, "watermark": 0})
    )
    assert result.requests["num_cached_tokens"].tolist() == [0, 0, 0, 64, 32]
    assert result.iterations["num_evicted_blocks"].tolist() == [0, 0, 2, 0, 2]


def test_eviction_under_pressure_from_decodes_that_outgrow_the_empty_blocks(tmp_path):
    # a leaves its 4 keyed blocks idle in a pool of 8. z then decodes from 16 tokens to 111
    # (7 blocks): past the 4 empty blocks every new block evicts one of a's, deepest first;
    # a2 then finds only the blocks z left.
    rows = [(0.0, 64, 1), (10.0, 16, 96), (30.0, 64, 1)]
    prefix = [[(5, 64)], None, [(5, 64)]]
    data = experiment(tmp_path, rows, prefix, engine={"num_gpu_blocks": 8, "watermark": 0})
    result, _ = run(data)
    it = result.iterations
    assert it["num_evicted_blocks"].sum() == 3  # z's blocks 5, 6 and 7 (4 empty before)
    # a2 (64 tokens) could reuse 3 blocks, but only a's first one is left
    assert result.requests["num_cached_tokens"].tolist() == [0, 0, 16]
    slow = copy.deepcopy(data)
    slow["engine"]["fast_forward"] = False
    stepped = run(slow)[0]
    assert_same_run(result, stepped)
    assert_same_clock(result, stepped)


# ------------------------------------------------------------------------ preemption and swap


def _pressure(tmp_path: Path, mode: str) -> dict[str, Any]:
    # 8 blocks of 16. x (32 tokens + 32 outputs) and y (64 shared tokens + 60 outputs) are
    # prefilled together (2 + 4 blocks); their first decodes take x's 3rd and y's 5th block,
    # filling the pool, and x's 4th block, 16 decodes later, preempts y (the last admitted).
    # y comes back when x finishes.
    return experiment(
        tmp_path,
        [(0.0, 32, 32), (0.0, 64, 60)],
        [None, [(9, 64)]],
        scheduler={"policy": "continuous", "max_num_seqs": 8, "preemption_mode": mode},
        engine={"num_gpu_blocks": 8, "watermark": 0},
    )


def _readmission(result: Result) -> Any:
    """The iteration that prefills the preempted request again."""
    it = result.iterations
    after = it[it.index > it.index[it["num_preempted"] > 0][0]]
    return after[after["num_prefill_seqs"] + after["num_swap_in_blocks"] > 0].iloc[0]


def test_a_request_preempted_by_recompute_reuses_its_own_cached_blocks(tmp_path):
    data = _pressure(tmp_path, "recompute")
    on, off = run(data)[0], run(caching_off(data))[0]
    for result in (on, off):
        assert result.summary["num_preemptions"] == 1
        assert result.requests["num_preemptions"].tolist() == [0, 1]
    # without caching y recomputes its whole sequence; with it, all but its 4 cached blocks
    assert _readmission(on)["num_prefill_tokens"] == _readmission(off)["num_prefill_tokens"] - 64
    assert on.requests["num_cached_tokens"].tolist() == [0, 0]  # found at first admission
    assert on.summary["mean_e2el_ms"] < off.summary["mean_e2el_ms"]


class StepRecorder:
    """A progress hook that keeps, before each pass of the step loop, a snapshot of the
    cache references of the requests."""

    def __init__(self) -> None:
        self.snapshots: list[dict[int, tuple[str, list[int]]]] = []

    def __call__(self, engine: Engine) -> None:
        kv = engine.scheduler.kv_cache
        assert isinstance(kv, PrefixCachingKVCacheManager)
        scheduler = engine.scheduler
        states = {}
        for status, requests in (
            ("running", scheduler.running),
            ("waiting", scheduler.waiting),
            ("swapped", scheduler.swapped),
        ):
            for r in requests:
                states[r.request_id] = (status, kv.held_keys(r))
        self.snapshots.append(states)

    def stage(self, text: str) -> None:
        pass


def test_a_swapped_request_releases_its_references_and_comes_back_with_private_blocks(
    tmp_path,
):
    data = _pressure(tmp_path, "swap")
    recorder = StepRecorder()
    on, engine = run(data, recorder)
    off = run(caching_off(data))[0]
    assert on.summary["num_swaps"] == 1 and on.requests["num_swaps"].tolist() == [0, 1]
    # no block is reused after a swap: the run is the one without caching
    assert_same_run(on, off, ignore=CACHE_COLUMNS)
    # y (request 1) at each pass of the step loop after its prefill: running with its 4
    # keyed blocks, swapped out holding none, then running again with private blocks only
    held = [snapshot[1] for snapshot in recorder.snapshots if 1 in snapshot]
    statuses = [status for status, _ in held]
    swapped_at = statuses.index("swapped")
    assert set(statuses[:swapped_at]) == {"running"} and "running" in statuses[swapped_at:]
    assert all(len(keys) == 4 for _, keys in held[:swapped_at])
    assert all(keys == [] for _, keys in held[swapped_at:])
    # its 4 cached blocks stayed cached while it was out; its private copies, growing to the
    # whole pool of 8 blocks, then evicted them
    cached = on.iterations["num_cached_blocks"]
    assert cached.max() == 4 and on.iterations["num_evicted_blocks"].sum() == 4
    assert engine.scheduler.kv_cache.num_cached_blocks == 0 == cached.iloc[-1]


# ------------------------------------------------------------------------ the lookup


def _request(rid: int, prompt: int, segments: Any) -> Request:
    return Request(rid, 0.0, prompt, 4, prefix_segments=segments)


def test_the_lookup_finds_leading_cached_blocks_and_changes_nothing():
    kv = PrefixCachingKVCacheManager(20, 4)
    first = _request(0, 14, ((5, 12),))
    assert kv.num_cached_prefix_blocks(first) == 0
    assert kv.allocate_admission(first, 14, 0)
    first.num_computed_tokens = 14
    kv.register(first)  # 3 full blocks inside the 12 shared tokens
    assert kv.num_cached_blocks == 3

    longer = _request(1, 20, ((5, 12), (6, 8)))
    whole = _request(2, 12, ((5, 12),))  # its last block must be computed: 2 of 3
    other = _request(3, 20, ((6, 12),))
    before = (kv.num_free_blocks, kv.num_references(), kv.num_cached_blocks)
    for _ in range(2):
        assert kv.num_cached_prefix_blocks(longer) == 3
        assert kv.num_cached_prefix_blocks(whole) == 2
        assert kv.num_cached_prefix_blocks(other) == 0
    assert (kv.num_free_blocks, kv.num_references(), kv.num_cached_blocks) == before
    kv.free(first)  # idle now, still found
    assert kv.num_references() == dict.fromkeys(kv.num_references(), 0)
    assert kv.num_cached_prefix_blocks(longer) == 3
    assert kv.num_free_blocks == 20 and kv.num_empty_blocks == 17


def test_a_request_looked_up_in_several_caches_gets_each_cache_s_answer():
    # What a cache-aware router does: ask every replica's cache before admitting anywhere.
    warm, cold, coarse = (
        PrefixCachingKVCacheManager(20, 4),
        PrefixCachingKVCacheManager(20, 4),
        PrefixCachingKVCacheManager(20, 8),
    )
    for kv in (warm, cold, coarse):  # the same history; cold caches other content
        done = _request(0, 20, ((6 if kv is cold else 5, 16),))
        assert kv.allocate_admission(done, 20, 0)
        done.num_computed_tokens = 20
        kv.register(done)
        kv.free(done)
    probe = _request(1, 30, ((5, 16),))
    for _ in range(2):
        assert warm.num_cached_prefix_blocks(probe) == 4
        assert cold.num_cached_prefix_blocks(probe) == 0
        assert coarse.num_cached_prefix_blocks(probe) == 2
    assert cold.num_cached_blocks == 4 == warm.num_cached_blocks


def test_a_duplicate_block_stays_the_request_s_own():
    # Two requests admitted before either computed the shared block: the first to compute it
    # caches it; the other's copy stays its own and is freed as an empty block.
    kv = PrefixCachingKVCacheManager(10, 4)
    a, b = _request(0, 6, ((1, 4),)), _request(1, 6, ((1, 4),))
    for r in (a, b):
        assert kv.allocate_admission(r, 6, 0)
        r.num_computed_tokens = 6
    kv.register(a)
    kv.register(b)
    assert kv.num_cached_blocks == 1 and list(kv.num_references().values()) == [1]
    assert kv.held_keys(a) and not kv.held_keys(b)
    kv.free(b)
    assert kv.num_idle_blocks == 0 and kv.num_free_blocks == 8
    kv.free(a)
    assert kv.num_idle_blocks == 1 and kv.num_free_blocks == 10 and kv.num_empty_blocks == 9


# ------------------------------------------------------------------------ block keys


def _tokens(segments: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The tokens of a sequence's segments, each as (content, offset)."""
    return [(content, i) for content, length in segments for i in range(length)]


segment_lists = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 20)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(a=segment_lists, b=segment_lists, block_size=st.sampled_from([1, 3, 4, 16]))
def test_block_keys_are_equal_exactly_when_the_tokens_up_to_the_block_are(a, b, block_size):
    keys_a, keys_b = block_keys(a, block_size), block_keys(b, block_size)
    tokens_a, tokens_b = _tokens(a), _tokens(b)
    assert len(keys_a) == len(tokens_a) // block_size
    for j in range(min(len(keys_a), len(keys_b))):
        end = (j + 1) * block_size
        assert (keys_a[j] == keys_b[j]) == (tokens_a[:end] == tokens_b[:end])


# ------------------------------------------------------------------------ invariants


class InvariantChecker:
    """A progress hook checking the block accounting before each pass of the step loop."""

    def __init__(self) -> None:
        self.checks = 0

    def __call__(self, engine: Engine) -> None:
        kv = engine.scheduler.kv_cache
        assert isinstance(kv, PrefixCachingKVCacheManager)
        scheduler = engine.scheduler
        refs = kv.num_references()
        holders: Counter[int] = Counter()
        private = 0
        for r in scheduler.running:
            keys = kv.held_keys(r)
            assert len(set(keys)) == len(keys) <= r.num_blocks
            holders.update(keys)
            private += r.num_blocks - len(keys)
        for r in (*scheduler.waiting, *scheduler.swapped):
            assert kv.held_keys(r) == [] and r.num_blocks == 0
        # every cached block is held by exactly the running requests that hold it
        assert all(refs[key] == holders[key] for key in refs)
        assert set(holders) <= set(refs)
        # a block is idle (free, reusable) exactly when no request holds it
        assert kv.num_idle_blocks == sum(1 for count in refs.values() if count == 0)
        # free + used == total: used = own blocks + cached blocks someone holds
        in_use = private + sum(1 for count in refs.values() if count > 0)
        assert kv.num_free_blocks + in_use == kv.num_blocks
        assert 0 <= kv.num_empty_blocks <= kv.num_free_blocks
        assert kv.num_cached_blocks == len(refs)
        self.checks += 1

    def stage(self, text: str) -> None:
        pass


@st.composite
def caching_experiments(draw: st.DrawFn) -> dict[str, Any]:
    data = draw(experiments())
    data["engine"]["enable_prefix_caching"] = True
    if "_prefix" not in data:
        data["_prefix"] = [[(draw(st.integers(0, 2)), draw(st.integers(1, 200)))]] * (
            data["workload"]["num_requests"]
        )
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caching_experiments())
def test_block_references_and_counts_hold_at_every_iteration(data):
    checker = InvariantChecker()
    result, engine = run(data, checker)
    assert checker.checks >= 1
    kv = engine.scheduler.kv_cache
    assert set(kv.num_references().values()) <= {0}  # nothing held at the end
    assert kv.num_free_blocks == kv.num_blocks
    evicted = int(result.iterations["num_evicted_blocks"].sum())
    assert evicted == kv.num_evictions  # every eviction belongs to one iteration


# Every request is cancelled, so the summary's window holds no iteration and counts no
# preemption; the run still recomputes a preempted request, which then finds its own blocks.
_ALL_CANCELLED_AFTER_A_RECOMPUTE = {
    "name": "tiny",
    "seed": 1,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "scheduler": {"policy": "chunked_prefill", "max_num_seqs": 2, "max_num_batched_tokens": 8},
    "workload": {
        "num_requests": 3,
        "prompt_tokens": {"dist": "uniform", "min": 1, "max": 1},
        "output_tokens": {"dist": "uniform", "min": 18, "max": 18},
        "arrival": {"process": "poisson", "rate": 9.0},
        "cancel_after_ms": {"dist": "uniform", "min": 41.0, "max": 214.0},
    },
    "engine": {"num_gpu_blocks": 6, "block_size": 4, "framework": "vllm-v0"},
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiments())
@example(_ALL_CANCELLED_AFTER_A_RECOMPUTE)
def test_caching_changes_nothing_when_no_request_shares_anything(data):
    # Each request's sequence is its own content: nothing is ever found cached unless a
    # request preempted by recompute finds its own blocks again.
    # (A hybrid model's KV cache is grouped by layer kind without caching and whole with it:
    # caching changes its layout; test_hybrid_kv compares the two.)
    assume(data["model"] != "gpt-oss-20b")
    data = copy.deepcopy(data)
    num = data["workload"]["num_requests"]
    data["_prefix"] = [[(1000 + i, 50 + 7 * i)] for i in range(num)]
    data["engine"]["enable_prefix_caching"] = False
    off = simulate_data(data)
    on = simulate_data({**data, "engine": {**data["engine"], "enable_prefix_caching": True}})
    it = off.iterations  # the whole run (the summary counts only its window)
    if (it["num_preempted"] - it["num_swapped_out"]).sum() > 0:
        return  # a recomputed request reuses its own blocks
    assert_same_run(on, off, ignore=CACHE_COLUMNS)
    assert (on.requests["num_cached_tokens"] == 0).all()


# ------------------------------------------------------------------------ traces and inputs


def test_a_mooncake_trace_reuses_its_shared_hash_blocks(tmp_path):
    base = tiny_experiment()
    base["model"] = "llama-3-8b"
    base["scheduler"] = {"policy": "chunked_prefill", "max_num_seqs": 64}
    base["workload"] = {
        "trace": {"path": "mooncake_synthetic_sample.jsonl", "format": "mooncake"},
        "num_requests": 120,
    }
    base["engine"] = {"enable_prefix_caching": True}
    on = simulate_data(base)
    off = simulate_data(caching_off(base))
    assert on.summary["completed"] == off.summary["completed"] > 0
    assert on.summary["prefix_cache_hit_rate"] > 0.05
    done = on.requests[on.requests["status"] == "finished"]
    assert on.summary["prefix_cache_hit_rate"] == pytest.approx(
        done["num_cached_tokens"].sum() / done["prompt_tokens"].sum()
    )
    # every cached token is a prefill token not computed
    saved = on.requests["num_cached_tokens"].sum()
    assert (
        off.iterations["num_prefill_tokens"].sum() - on.iterations["num_prefill_tokens"].sum()
        == saved
    )
    slow = copy.deepcopy(base)
    slow["engine"]["fast_forward"] = False
    stepped = simulate_data(slow)
    assert_same_run(on, stepped)
    assert_same_clock(on, stepped)


def test_batchsim_run_prints_the_hit_rate_when_prefix_caching_is_on(tmp_path, capsys):
    exp = tmp_path / "mooncake.yaml"
    exp.write_text(
        "name: mc\nmodel: llama-3-8b\nhardware: a100-80gb\n"
        "workload: {trace: {path: mooncake_synthetic_sample.jsonl, format: mooncake}, "
        "num_requests: 120}\n",
        encoding="utf-8",
    )
    for on in (True, False):
        out = tmp_path / f"run-{on}"
        flag = f"engine.enable_prefix_caching={str(on).lower()}"
        assert cli.main(["run", str(exp), "-o", str(out), "--set", flag]) == 0
        printed = capsys.readouterr().out
        rate = json.loads((out / "summary.json").read_text())["prefix_cache_hit_rate"]
        assert (f"prefix cache  {rate:.1%} of prompt tokens found cached" in printed) == on
        assert (rate > 0) == on


def test_prefix_caching_with_a_sliding_window_model_is_one_clear_error():
    data = tiny_experiment(model="mistral-7b")
    data["engine"] = {"enable_prefix_caching": True}
    with pytest.raises(ConfigError, match=r"^engine.enable_prefix_caching: true is not supported"):
        simulate_data(data)


def test_enable_prefix_caching_must_be_a_boolean():
    data = tiny_experiment()
    data["engine"] = {"enable_prefix_caching": "yes"}
    with pytest.raises(ConfigError, match=r"engine\.enable_prefix_caching"):
        validate_experiment(data)


def test_requests_and_iterations_tables_carry_the_cache_columns(tmp_path):
    data = experiment(tmp_path, [(0.0, 80, 3), (10.0, 80, 3)], [[(7, 64)]] * 2)
    result, _ = run(data)
    assert result.requests["num_cached_tokens"].dtype == np.int64
    assert {"num_cached_blocks", "num_evicted_blocks"} <= set(result.iterations.columns)
    out = result.write(tmp_path / "out")
    header = (out / "iterations.csv").read_text().splitlines()[0].replace('"', "").split(",")
    assert header[-2:] == ["num_cached_blocks", "num_evicted_blocks"]
    assert "num_cached_tokens" in (out / "requests.csv").read_text().splitlines()[0]
    assert result.requests["status"].eq(RequestStatus.FINISHED.name.lower()).all()
