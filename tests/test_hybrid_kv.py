"""The hybrid KV cache of models that mix sliding-window and full-attention layers (gpt-oss,
Gemma 2/3): layer groups, block counts, attention reads, and whole runs.

Expected values come from the models' config.json layouts, brute force over layers and token
positions, and hand arithmetic of K/V bytes (gpt-oss-20b: 8 KV heads of 64 dims, bf16, so
2 x 8 x 64 x 2 = 2,048 bytes per token per layer).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim import deployment, simulation
from batchsim.catalog.model_files import load_model
from batchsim.config import validate_experiment
from batchsim.cost import BatchShape
from batchsim.engine.kv_cache import KVCacheManager
from conftest import assert_same_run, simulate_data, tiny_experiment

KV_BYTES_PER_TOKEN_LAYER = 2 * 8 * 64 * 2  # gpt-oss-20b: K and V, 8 heads x 64, bf16


@pytest.mark.parametrize(
    ("name", "groups"),
    [
        ("gpt-oss-20b", (1, 1, 12)),  # 24 layers, sliding and full alternate
        ("gemma-2-9b", (1, 1, 21)),  # 42 layers, every other one slides
        ("gemma-3-12b", (1, 5, 8)),  # 48 layers, five of six slide: 40 and 8
        ("llama-3-8b", (1, 0, 32)),  # full attention only
        ("mistral-7b", (0, 1, 32)),  # a window on every layer
    ],
)
def test_kv_layer_groups_follow_the_models_layer_layouts(name: str, groups: tuple) -> None:
    assert load_model(name).kv_layer_groups() == groups


def _brute_force_blocks(
    full_groups: int, window_groups: int, bs: int, window: int, computed: int, tokens: int
) -> int:
    """Blocks held, counted token by token in each layer group: a full group keeps every
    token, a sliding group those the next query can still see (from computed - window + 1)."""
    full = {t // bs for t in range(tokens)}
    kept = {t // bs for t in range(max(0, computed - window + 1), tokens)}
    return full_groups * len(full) + window_groups * len(kept)


@settings(max_examples=200, deadline=None)
@given(
    full_groups=st.integers(0, 3),
    window_groups=st.integers(1, 5),
    bs=st.sampled_from([1, 4, 16]),
    window=st.integers(2, 200),  # (a 1-token window keeps a request's last block: one over)
    computed=st.integers(0, 600),
    extra=st.integers(0, 40),
)
def test_hybrid_blocks_held_match_a_count_over_groups_and_tokens(
    full_groups: int, window_groups: int, bs: int, window: int, computed: int, extra: int
) -> None:
    kv = KVCacheManager(
        10_000, bs, window=window, full_groups=full_groups, window_groups=window_groups
    )
    tokens = computed + extra
    expected = _brute_force_blocks(full_groups, window_groups, bs, window, computed, tokens)
    assert kv.blocks_held(computed, tokens) == expected


def test_a_hybrid_pool_holds_tokens_in_each_group() -> None:
    kv = KVCacheManager(100, 16, window=128, full_groups=1, window_groups=5, watermark_blocks=4)
    assert kv.capacity_tokens == 16 * 16  # 100 blocks shared by 6 groups: 16 per group
    assert kv.can_ever_fit(16 * 16)  # 16 blocks in each of 6 groups = 96 <= 100 - 4
    assert not kv.can_ever_fit(16 * 16 + 1)  # 17 x 6 = 102
    assert kv.hybrid_window == 128
    assert KVCacheManager(100, 16, window=128).hybrid_window is None  # every layer slides


def _gpt_oss(**overrides: Any) -> dict[str, Any]:
    return tiny_experiment(model="gpt-oss-20b", hardware="h100-sxm", **overrides)


def test_a_hybrid_model_has_twice_the_blocks_of_one_block_per_layer() -> None:
    # a block holds 16 tokens of 12 layers (one group) instead of all 24: half the bytes
    hybrid = deployment.engine_setup(validate_experiment(_gpt_oss()))
    full = deployment.engine_setup(
        validate_experiment(_gpt_oss(engine={"enable_prefix_caching": True}))
    )
    assert hybrid.hybrid_kv_groups == (1, 1, 12) and full.hybrid_kv_groups is None
    assert hybrid.cost_model.kv_bytes_per_token_per_gpu == 24 * KV_BYTES_PER_TOKEN_LAYER
    assert 2 * full.num_gpu_blocks <= hybrid.num_gpu_blocks <= 2 * full.num_gpu_blocks + 1


def test_hybrid_decode_reads_full_layers_whole_and_window_layers_their_window() -> None:
    cost_model = deployment.engine_setup(validate_experiment(_gpt_oss())).cost_model
    assert cost_model.hybrid_window == 128
    batch, context = 16, 8000
    cost = cost_model.estimate(BatchShape.decode(batch, context, None, 128))
    # 12 full layers read every cached key and the new one; 12 sliding layers the last 127
    # and the new one; all 24 write the new token
    per = KV_BYTES_PER_TOKEN_LAYER
    full_read = 12 * per * batch * (context + 1)
    window_read = 12 * per * batch * (127 + 1)
    assert cost.kv_bytes == full_read + window_read + 24 * per * batch
    # QK^T and PV: 2 x 2 x 64 heads x 64 dims FLOPs per (query, key) pair and layer
    pair_flops = 4 * 64 * 64
    expected = 12 * pair_flops * batch * (context + 1) + 12 * pair_flops * batch * 128
    assert cost.ops["attention"].flops == expected
    # without the window fields every layer reads all: the upper bound of before
    upper = cost_model.estimate(BatchShape.decode(batch, context))
    assert upper.kv_bytes == 24 * per * batch * (context + 1) + 24 * per * batch


def _pairs_by_brute_force(new: int, context: int, window: int | None) -> int:
    """(query, key) pairs of ``new`` queries after ``context`` cached tokens, key by key."""
    return sum(
        1
        for q in range(context, context + new)
        for k in range(q + 1)
        if window is None or k > q - window
    )


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 300), st.booleans()), min_size=1, max_size=5
    ),
    window=st.integers(2, 160),
)
def test_hybrid_shape_counts_each_layer_kinds_pairs_by_brute_force(
    rows: list[tuple[int, int, bool]], window: int
) -> None:
    new = [1 if is_decode else q for q, _, is_decode in rows]
    context = [c for _, c, _ in rows]
    decode = [is_decode for _, _, is_decode in rows]
    shape = BatchShape.from_requests(new, context, decode=decode, hybrid_window=window)
    assert shape.attn_pairs == sum(_pairs_by_brute_force(q, c, None) for q, c in zip(new, context))
    assert shape.window_attn_pairs == sum(
        _pairs_by_brute_force(q, c, window) for q, c in zip(new, context)
    )
    assert shape.kv_read_tokens == sum(context)
    assert shape.window_kv_read_tokens == sum(min(c, window - 1) for c in context)


def _long_gpt_oss(**engine: Any) -> dict[str, Any]:
    # eight 4,000-token prompts at once, 64 tokens each: far past the 128-token window
    return _gpt_oss(
        scheduler={"policy": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 8192},
        engine=engine,
        workload={
            "num_requests": 8,
            "arrival": {"process": "all_at_once"},
            "prompt_tokens": {"dist": "fixed", "value": 4000},
            "output_tokens": {"dist": "fixed", "value": 64},
        },
    )


def _blocks_used(result: simulation.Result, data: dict[str, Any]) -> list[int]:
    """Blocks in use at each iteration, from the logged usage and the pool's size."""
    pool = deployment.engine_setup(validate_experiment(data)).num_gpu_blocks
    return [round(u * pool) for u in result.iterations["kv_cache_usage"]]


def test_a_run_past_the_window_holds_half_the_kv_and_decodes_faster() -> None:
    hybrid_data, upper_data = _long_gpt_oss(), _long_gpt_oss(enable_prefix_caching=True)
    hybrid, upper = simulate_data(hybrid_data), simulate_data(upper_data)
    used, used_upper = _blocks_used(hybrid, hybrid_data), _blocks_used(upper, upper_data)
    # two prompts per iteration: every group holds all 4,000 prompt tokens (250 blocks of
    # 16) until they are computed, as one block per layer does
    assert used[:4] == [2 * 2 * 250 * k for k in (1, 2, 3, 4)]
    assert used_upper[:4] == [2 * 250 * k for k in (1, 2, 3, 4)]
    # the last decode: 4,062 tokens computed and a slot for the next; the full group holds
    # 254 blocks, the sliding group those of the last 128 tokens
    assert used[-1] == 8 * _brute_force_blocks(1, 1, 16, 128, 4062, 4063) == 8 * (254 + 9)
    assert used_upper[-1] == 8 * 254
    assert hybrid.summary["mean_tpot_ms"] < upper.summary["mean_tpot_ms"]
    assert not [n for n in hybrid.notes if "sliding window" in n]
    [note] = [n for n in upper.notes if "sliding window" in n]
    assert "simulated as full attention with engine.enable_prefix_caching" in note


def test_fast_forward_equals_stepping_on_a_hybrid_model_past_its_window() -> None:
    fast = _long_gpt_oss(fast_forward=True)
    slow = copy.deepcopy(fast)
    slow["engine"]["fast_forward"] = False
    assert_same_run(simulate_data(fast), simulate_data(slow))


def _long_run(model: str, prompt_max: int, **top: Any) -> simulation.Result:
    data = {
        "name": "window",
        "seed": 0,
        "hardware": "h100-sxm",
        "model": model,
        "scheduler": {"policy": "continuous", "max_num_seqs": 8},
        "workload": {
            "num_requests": 6,
            "arrival": {"process": "poisson", "rate": 2.0},
            "prompt_tokens": {"dist": "uniform", "min": prompt_max - 200, "max": prompt_max},
            "output_tokens": {"dist": "fixed", "value": 16},
        },
        **top,
    }
    return simulation.simulate(validate_experiment(data))


def test_a_hybrid_run_with_prefix_caching_says_it_is_an_upper_bound() -> None:
    # Gemma 2 9B: 42 layers, every other one with a 4096-token window (its config.json)
    caching = {"engine": {"enable_prefix_caching": True}}
    result = _long_run("gemma-2-9b", 5000, **caching)
    longest = int((result.requests["prompt_tokens"] + result.requests["output_tokens"]).max())
    assert 4096 < longest <= 5016
    [note] = [n for n in result.notes if "sliding window" in n]
    assert note.startswith("model gemma-2-9b: 21 of its 42 layers attend over a 4,096-token")
    assert f"requests reached {longest:,} tokens" in note
    # the same on a cluster of replicas
    cluster = _long_run("gemma-2-9b", 5000, cluster={"replicas": 2}, **caching)
    assert any("upper bounds past the window" in n for n in cluster.notes)


@pytest.mark.parametrize(
    ("model", "prompt_max", "top"),
    [
        ("gemma-2-9b", 5000, {}),  # per-group KV cache: exact past the window
        ("gemma-2-9b", 4000, {"engine": {"enable_prefix_caching": True}}),  # within it
        ("llama-3-8b", 5000, {}),  # no window
        ("mistral-7b", 5000, {}),  # a window on every layer: simulated exactly
    ],
)
def test_no_window_note_where_the_run_is_exact(model: str, prompt_max: int, top: dict) -> None:
    assert not [n for n in _long_run(model, prompt_max, **top).notes if "sliding window" in n]
