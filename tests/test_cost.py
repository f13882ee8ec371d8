"""Claims about the roofline cost model (batchsim.cost), with real catalog numbers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim.catalog.hardware_files import load_hardware
from batchsim.catalog.model_files import load_model
from batchsim.cost import OP_NAMES, BatchShape, RooflineCostModel
from batchsim.cost.attention import split_context
from batchsim.cost.costs import vmax
from batchsim.errors import ConfigError

A100_BW = 2.039e12
A100_PEAK = 312e12


@pytest.fixture(scope="module")
def a100():
    return load_hardware("a100-80gb")


@pytest.fixture(scope="module")
def llama7b():
    return load_model("llama-2-7b")


@pytest.fixture(scope="module")
def cm7b(llama7b, a100):
    return RooflineCostModel(llama7b, a100)


@pytest.fixture(scope="module")
def ideal7b(llama7b, a100):
    return RooflineCostModel(llama7b, a100, ideal=True)


# --------------------------------------------------------------------------- helpers


def test_vmax_keeps_python_floats_and_dispatches_on_arrays():
    assert type(vmax(1.0, 2.0)) is float and vmax(1.0, 2.0) == 2.0
    np.testing.assert_array_equal(vmax(np.array([1.0, 3.0]), 2.0), [2.0, 3.0])


# --------------------------------------------------------------------------- batch shapes


def test_from_requests_aggregates_prefill_decode_context_and_pairs():
    shape = BatchShape.from_requests([512, 1, 1], [0, 100, 200])
    assert shape.num_seqs == 3
    assert shape.num_prefill_tokens == 512
    assert shape.num_decode_tokens == 2
    assert shape.num_sampled_tokens == 3
    assert shape.kv_read_tokens == 300
    assert shape.attn_pairs == 512 * 513 // 2 + 101 + 201
    assert shape.num_tokens == 514


def test_from_requests_pads_prefills_to_the_longest_and_padding_does_not_sample():
    shape = BatchShape.from_requests([100, 300], [0, 0], pad_to=300)
    assert shape.num_prefill_tokens == 400
    assert shape.num_padding_tokens == 200
    assert shape.num_sampled_tokens == 2
    assert shape.attn_pairs == 2 * (300 * 301 // 2)


def test_from_requests_caps_cached_keys_at_the_sliding_window():
    shape = BatchShape.from_requests([1, 10], [10_000, 4090], window=4096)
    # A query attends to the last 4096 positions, itself included: the decode reads 4095
    # cached tokens; the chunk's first query still reaches back to position 0.
    assert shape.kv_read_tokens == 4095 + 4090
    # decode sees 4096 keys; the chunk's queries see 4091..4096 then 4096 for the rest
    chunk = sum(min(4090 + j + 1, 4096) for j in range(10))
    assert shape.attn_pairs == 4096 + chunk


def test_mistral_8000_token_prefill_counts_pairs_inside_the_window():
    # Brute force over the causal mask with a 4096-key window: query i sees keys
    # max(0, i - 4095) .. i.
    expected = sum(i - max(0, i - 4095) + 1 for i in range(8000))
    assert expected == 24_381_440
    assert BatchShape.prefill(8000, window=4096).attn_pairs == expected


def test_decode_and_prefill_constructors_match_from_requests():
    assert BatchShape.decode(8, 1000) == BatchShape.from_requests([1] * 8, [1000] * 8)
    assert BatchShape.prefill(512, 2048) == BatchShape.from_requests([512], [2048])


# --------------------------------------------------------------------------- ideal roofline


def test_ideal_b1_decode_of_llama2_7b_reads_every_weight_once_at_datasheet_bandwidth(
    llama7b, ideal7b
):
    cost = ideal7b.estimate(BatchShape.decode(1, 1024))
    weights_read = (llama7b.num_params - llama7b.embedding_params) * 2.0  # table is gathered
    assert cost.weight_bytes == pytest.approx(weights_read, rel=1e-3)
    kv = llama7b.kv_bytes_per_token("bf16") * 1025
    expected = (weights_read + kv) / A100_BW
    assert cost.time == pytest.approx(expected, rel=0.01)
    assert cost.bound == "memory"
    assert cost.ops["overhead"].time == 0.0


def test_ideal_4096_token_prefill_is_compute_bound_at_datasheet_peak(ideal7b):
    cost = ideal7b.estimate(BatchShape.prefill(4096))
    assert cost.bound == "compute"
    for name in ("qkv_proj", "o_proj", "mlp"):
        assert cost.ops[name].time == pytest.approx(cost.ops[name].flops / A100_PEAK)
    # + the memory-bound elementwise kernels and KV-cache writes: a few % on top
    assert cost.flops / A100_PEAK <= cost.time < 1.08 * cost.flops / A100_PEAK


def test_ideal_bound_flips_exactly_where_intensity_crosses_the_ridge_point(a100):
    cm = RooflineCostModel(load_model("llama-3-8b"), a100, ideal=True)
    assert cm.ridge_point == pytest.approx(312e12 / 2.039e12)
    knee = cm.knee_batch_size(1)
    below = cm.estimate(BatchShape.decode(knee - 1, 1))
    at = cm.estimate(BatchShape.decode(knee, 1))
    assert below.intensity <= cm.ridge_point < at.intensity
    # weights dominate at a 1-token context: B FLOP per 2 bytes per param -> knee ~ ridge point
    assert cm.ridge_point <= knee <= 1.3 * cm.ridge_point


def test_long_context_mha_decode_never_turns_compute_bound(ideal7b):
    # each request reads its own 512 KiB/token KV cache: intensity stays ~1 FLOP/B per token
    assert ideal7b.knee_batch_size(4096) is None


# --------------------------------------------------------------------------- calibrated model


def test_calibrated_decode_is_slower_than_ideal_but_within_the_achievable_fraction(cm7b, ideal7b):
    real = cm7b.estimate(BatchShape.decode(1, 1024)).time
    ideal = ideal7b.estimate(BatchShape.decode(1, 1024)).time
    assert 1.15 * ideal < real < 1.6 * ideal


def test_knee_batch_size_is_the_first_compute_bound_decode_batch(cm7b):
    knee = cm7b.knee_batch_size(1)
    assert knee is not None
    assert cm7b.estimate(BatchShape.decode(knee, 1)).compute_bound
    assert not cm7b.estimate(BatchShape.decode(knee - 1, 1)).compute_bound


def test_every_iteration_reports_exactly_the_eight_operator_groups(cm7b):
    cost = cm7b.estimate(BatchShape.from_requests([300, 1, 1], [0, 50, 70]))
    assert tuple(cost.ops) == OP_NAMES
    assert cost.time == pytest.approx(sum(op.time for op in cost.ops.values()))
    assert cost.flops == pytest.approx(sum(op.flops for op in cost.ops.values()))
    hbm = sum(op.bytes for name, op in cost.ops.items() if name != "all_reduce")
    assert cost.bytes == pytest.approx(hbm)
    assert cost.activation_bytes == pytest.approx(cost.bytes - cost.weight_bytes - cost.kv_bytes)
    assert cost.ops["all_reduce"].time == 0.0


def test_empty_iteration_costs_nothing(cm7b):
    cost = cm7b.estimate(BatchShape(num_seqs=0))
    assert cost.time == 0.0 and cost.flops == 0.0 and not cost.compute_bound


def test_tensor_parallel_halves_weight_bytes_per_gpu_and_adds_all_reduce_time(llama7b, a100):
    tp1 = RooflineCostModel(llama7b, a100, tp=1)
    tp2 = RooflineCostModel(llama7b, a100, tp=2)
    assert tp2.weight_bytes_per_gpu == pytest.approx(tp1.weight_bytes_per_gpu / 2)
    shape = BatchShape.decode(16, 512)
    c1, c2 = tp1.estimate(shape), tp2.estimate(shape)
    assert c2.weight_bytes == pytest.approx(c1.weight_bytes / 2, rel=1e-6)
    assert c2.flops < 0.51 * c1.flops
    assert c1.ops["all_reduce"].time == 0.0
    # 2 ring all-reduces per layer of 16 tokens x 4096 x 2 bytes
    msg = 16 * 4096 * 2.0
    per = 2 * (2 - 1) / 2 * msg / (a100.interconnect_bandwidth * a100.interconnect_efficiency)
    expected = 2 * 32 * (per + a100.interconnect_latency)
    assert c2.ops["all_reduce"].time == pytest.approx(expected)


def test_gqa_kv_bytes_enter_attention_bytes_per_gpu(a100):
    model = load_model("llama-3-8b")  # 8 KV heads
    for tp in (1, 2, 8):
        cm = RooflineCostModel(model, a100, tp=tp)
        assert cm.kv_bytes_per_token_per_gpu == model.kv_bytes_per_token("bf16") / tp
        a = cm.estimate(BatchShape.decode(4, 1000)).ops["attention"].bytes
        b = cm.estimate(BatchShape.decode(4, 2000)).ops["attention"].bytes
        assert b - a == pytest.approx(4 * 1000 * cm.kv_bytes_per_token_per_gpu)


def test_gqa_kv_heads_are_replicated_when_tp_exceeds_them(a100):
    model = load_model("llama-2-70b")  # 8 KV heads
    cm = RooflineCostModel(model, a100, tp=16 if model.num_attention_heads % 16 == 0 else 8)
    per_head = 2 * model.num_hidden_layers * model.head_dim * 2
    assert cm.kv_bytes_per_token_per_gpu >= per_head


def test_mla_latent_kv_bytes_enter_attention_bytes_replicated_on_every_rank(a100):
    model = load_model("deepseek-v3")
    cm = RooflineCostModel(model, a100, tp=8)
    assert cm.kv_bytes_per_token_per_gpu == model.kv_bytes_per_token("bf16") == 61 * 576 * 2
    a = cm.estimate(BatchShape.decode(4, 1000)).ops["attention"].bytes
    b = cm.estimate(BatchShape.decode(4, 2000)).ops["attention"].bytes
    assert b - a == pytest.approx(4 * 1000 * 61 * 576 * 2)


def test_mla_attention_flops_use_the_absorbed_latent_formulation(a100):
    model = load_model("deepseek-v3")
    cm = RooflineCostModel(model, a100, tp=8, ideal=True)
    shape = BatchShape.decode(1, 4095)
    flops = cm.estimate(shape).ops["attention"].flops
    per_pair = (128 / 8) * (2 * (512 + 64) + 2 * 512)  # heads per GPU x (QK over latent+rope, PV)
    assert flops == pytest.approx(61 * per_pair * 4096)


def test_mixtral_expert_union_bytes_grow_with_batch_and_saturate_at_all_experts(a100):
    model = load_model("mixtral-8x7b")
    cm = RooflineCostModel(model, a100, ideal=True)
    weights = [cm.estimate(BatchShape.decode(b, 128)).weight_bytes for b in (1, 2, 4, 8, 64, 4096)]
    assert all(x < y for x, y in itertools.pairwise(weights[:-1]))
    assert weights[-2] <= weights[-1]
    expert = model.num_moe_layers * model.expert_params * 2.0
    # batch 1 touches top-2 of 8 experts; a large batch touches all 8
    assert weights[-1] - weights[0] == pytest.approx(6 * expert, rel=1e-3)
    assert weights[1] - weights[0] == pytest.approx(expert * (8 * (1 - 0.75**2) - 2), rel=1e-6)


def test_moe_flops_use_top_k_experts_not_the_union(a100):
    model = load_model("mixtral-8x7b")
    cm = RooflineCostModel(model, a100)
    cost = cm.estimate(BatchShape.prefill(1024))
    per_token_experts = 2 * model.num_experts_per_tok * model.expert_params
    router = 2 * model.router_params
    expected = model.num_moe_layers * 1024 * (per_token_experts + router)
    assert cost.ops["mlp"].flops == pytest.approx(expected, rel=1e-6)


def test_padding_tokens_add_flops_but_not_sampled_tokens(cm7b):
    packed = BatchShape.from_requests([100, 300], [0, 0])
    padded = BatchShape.from_requests([100, 300], [0, 0], pad_to=300)
    a, b = cm7b.estimate(packed), cm7b.estimate(padded)
    assert b.flops > a.flops and b.time > a.time
    assert b.ops["mlp"].flops == pytest.approx(a.ops["mlp"].flops * 600 / 400)
    assert b.ops["lm_head"] == a.ops["lm_head"]


def test_lm_head_flops_scale_with_sampled_rows_only(cm7b, llama7b):
    one = cm7b.estimate(BatchShape(num_seqs=4, num_prefill_tokens=2048, num_sampled_tokens=1))
    four = cm7b.estimate(BatchShape(num_seqs=4, num_prefill_tokens=2048, num_sampled_tokens=4))
    none = cm7b.estimate(BatchShape(num_seqs=4, num_prefill_tokens=2048, num_sampled_tokens=0))
    vocab_flops = 2 * llama7b.hidden_size * llama7b.vocab_size
    assert one.ops["lm_head"].flops == pytest.approx(vocab_flops)
    assert four.ops["lm_head"].flops == pytest.approx(4 * vocab_flops)
    assert none.ops["lm_head"].time == 0.0
    assert four.ops["mlp"] == one.ops["mlp"]


def test_chunked_prefill_over_a_context_costs_more_attention_than_without(cm7b):
    fresh = cm7b.estimate(BatchShape.prefill(512, 0)).ops["attention"]
    over = cm7b.estimate(BatchShape.prefill(512, 2048)).ops["attention"]
    assert over.flops > 4 * fresh.flops
    assert over.time > 2 * fresh.time
    assert over.bytes > fresh.bytes


def test_sliding_window_caps_decode_kv_reads(a100):
    model = load_model("mistral-7b")  # window 4096
    cm = RooflineCostModel(model, a100)
    w = model.sliding_window
    at_window = cm.estimate(BatchShape.decode(8, 4096, window=w))
    beyond = cm.estimate(BatchShape.decode(8, 20_000, window=w))
    assert beyond.kv_bytes == at_window.kv_bytes
    assert beyond.time == at_window.time


def test_int4_weights_quarter_the_weight_bytes_and_run_on_16_bit_tensor_cores(llama7b, a100):
    bf16 = RooflineCostModel(llama7b, a100, dtype="bf16")
    int4 = RooflineCostModel(llama7b, a100, dtype="int4")
    shape = BatchShape.decode(1, 128)
    assert int4.estimate(shape).weight_bytes == pytest.approx(bf16.estimate(shape).weight_bytes / 4)
    assert int4.compute_dtype == "bf16"
    assert int4.kv_dtype == "fp16"  # weight-only quantization keeps a 16-bit KV cache
    assert int4.estimate(shape).time < 0.5 * bf16.estimate(shape).time


def test_fp8_uses_the_fp8_peak_only_where_the_gpu_has_one(llama7b, a100):
    h100 = load_hardware("h100-sxm")
    assert RooflineCostModel(llama7b, h100, dtype="fp8").compute_dtype == "fp8"
    assert RooflineCostModel(llama7b, a100, dtype="fp8").compute_dtype == "bf16"
    big = BatchShape.prefill(8192)
    fp8 = RooflineCostModel(llama7b, h100, dtype="fp8", ideal=True).estimate(big)
    bf16 = RooflineCostModel(llama7b, h100, dtype="bf16", ideal=True).estimate(big)
    ratio = h100.peak_flops_for("fp8") / h100.peak_flops_for("bf16")  # 1978.9 / 989.4
    assert fp8.ops["mlp"].time == pytest.approx(bf16.ops["mlp"].time / ratio, rel=1e-9)


def test_bad_dtype_and_tp_raise_config_error_naming_the_key(llama7b, a100):
    with pytest.raises(ConfigError, match=r"engine\.dtype.*allowed: bf16, fp16, fp8, int8, int4"):
        RooflineCostModel(llama7b, a100, dtype="fp4")
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        RooflineCostModel(llama7b, a100, tp=3)
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        RooflineCostModel(llama7b, a100, tp=0)
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        RooflineCostModel(llama7b, a100, kv_dtype="int2")


def test_deepseek_v3_prices_dense_and_moe_layers(a100):
    model = load_model("deepseek-v3")
    cm = RooflineCostModel(model, a100, tp=8, dtype="fp8")
    small = cm.estimate(BatchShape.decode(1, 2048))
    large = cm.estimate(BatchShape.decode(256, 2048))
    assert 0 < small.time < large.time
    assert small.weight_bytes < large.weight_bytes < cm.weight_bytes_per_gpu


def test_every_builtin_gpu_prices_a_mixed_iteration(llama7b):
    from batchsim.catalog.hardware_files import list_hardware

    shape = BatchShape.from_requests([256, 1, 1, 1], [512, 100, 2000, 30])
    for hw in list_hardware():
        cost = RooflineCostModel(llama7b, hw, dtype="fp16").estimate(shape)
        assert math.isfinite(cost.time) and cost.time > 0, hw.name


# --------------------------------------------------------------------------- array path


def test_array_path_equals_scalar_path_elementwise(cm7b):
    steps = np.arange(50)
    kv = 32 * 700 + 32 * steps
    stretch = BatchShape(
        num_seqs=32,
        num_decode_tokens=32,
        num_sampled_tokens=32,
        kv_read_tokens=kv,
        attn_pairs=kv + 32,
    )
    vec = cm7b.estimate(stretch)
    assert vec.time.shape == (50,)
    for i in (0, 17, 49):
        one = cm7b.estimate(
            BatchShape(
                num_seqs=32,
                num_decode_tokens=32,
                num_sampled_tokens=32,
                kv_read_tokens=int(kv[i]),
                attn_pairs=int(kv[i]) + 32,
            )
        )
        assert vec.time[i] == pytest.approx(one.time, rel=1e-12)
        assert vec.flops[i] == pytest.approx(one.flops, rel=1e-12)
        assert vec.bytes[i] == pytest.approx(one.bytes, rel=1e-12)
        assert vec.kv_bytes[i] == pytest.approx(one.kv_bytes, rel=1e-12)
        assert bool(np.broadcast_to(vec.compute_bound, (50,))[i]) == one.compute_bound
        for name in OP_NAMES:
            t = np.broadcast_to(vec.ops[name].time, (50,))[i]
            assert t == pytest.approx(one.ops[name].time, rel=1e-12)


def test_array_path_with_varying_token_counts_equals_scalar_path(cm7b):
    tokens = np.array([1, 64, 512])
    shape = BatchShape(
        num_seqs=1,
        num_prefill_tokens=tokens,
        num_sampled_tokens=1,
        attn_pairs=tokens * (tokens + 1) // 2,
    )
    vec = cm7b.estimate(shape)
    for i, n in enumerate(tokens):
        one = cm7b.estimate(BatchShape.prefill(int(n)))
        assert vec.time[i] == pytest.approx(one.time)
        assert vec.bound[i] == one.bound


# --------------------------------------------------------------------------- invariants


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8192), extra=st.integers(1, 512), context=st.integers(0, 8192))
def test_prefill_time_is_non_decreasing_in_tokens_and_context(cm7b, n, extra, context):
    base = cm7b.estimate(BatchShape.prefill(n, context)).time
    assert cm7b.estimate(BatchShape.prefill(n + extra, context)).time >= base
    assert cm7b.estimate(BatchShape.prefill(n, context + extra)).time >= base


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 1024), extra=st.integers(1, 256), context=st.integers(1, 16384))
def test_decode_time_is_non_decreasing_in_batch_and_context(cm7b, b, extra, context):
    # up to a 2 % dip: a batch that turns split-KV off saves the combine kernel (measured:
    # Llama-2-70B TP2 decode attention drops from 17 to 9 us between batch 21 and 22)
    base = cm7b.estimate(BatchShape.decode(b, context)).time * 0.98
    assert cm7b.estimate(BatchShape.decode(b + extra, context)).time >= base
    assert cm7b.estimate(BatchShape.decode(b, context + extra)).time >= base


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 512), context=st.integers(1, 8192))
def test_calibrated_time_is_never_below_the_ideal_roofline(cm7b, ideal7b, b, context):
    shape = BatchShape.decode(b, context)
    assert cm7b.estimate(shape).time >= ideal7b.estimate(shape).time


def test_mixed_batch_context_is_split_exactly_between_decodes_and_one_chunk(cm7b):
    shape = BatchShape.from_requests([1, 1, 1, 300], [500, 700, 900, 1200])
    ctx_d, ctx_p, pairs_p = split_context(
        shape.num_seqs, shape.num_decode_tokens, 300, shape.kv_read_tokens, shape.attn_pairs
    )
    assert ctx_d == pytest.approx(2100)
    assert ctx_p == pytest.approx(1200)
    assert pairs_p == pytest.approx(300 * 1200 + 300 * 301 // 2)


def test_small_decode_batches_split_the_kv_cache_over_the_sms(cm7b):
    # 1 request x 32 KV heads = 32 CTAs on 108 SMs: split-KV spreads a long context
    assert cm7b.attention.num_splits(32, 32) > 1
    assert cm7b.attention.num_splits(32 * 32, 32) == 1  # 32 requests fill the SMs: no split
    one = cm7b.attention_kernel(1, 1, 4000, 4001).time
    unsplit_stream = 4000 * 2 * 128 * 2 / (cm7b.hardware.memory_bandwidth / 108 * 1.19)
    assert one < unsplit_stream  # far faster than one CTA per head streaming 4000 tokens


def test_decode_attention_grows_with_context_and_batch_beyond_the_fixed_costs(cm7b):
    base = cm7b.attention_kernel(64, 64, 64 * 128, 64 * 129).time
    longer = cm7b.attention_kernel(64, 64, 64 * 4096, 64 * 4097).time
    bigger = cm7b.attention_kernel(128, 128, 128 * 4096, 128 * 4097).time
    assert base < longer < bigger
    # long contexts stream at close to the achievable memory bandwidth
    kv = 128 * 4096 * 32 * 128 * 2 * 2
    assert kv / bigger == pytest.approx(cm7b.hardware.memory_bandwidth * 0.8, rel=0.25)


@pytest.mark.parametrize(
    ("model", "hardware", "tp", "padding", "seqs", "context"),
    [
        ("llama-2-7b", "a100-80gb", 1, 0, 128, 700),
        ("llama-2-7b", "a100-80gb", 1, 0, 1, 0),
        ("llama-3-70b", "h100-sxm", 4, 0, 37, 2049),
        ("mixtral-8x7b", "h100-sxm", 2, 3, 5, 126),
        ("deepseek-v3", "h200", 8, 0, 64, 300),
    ],
)
def test_decode_run_time_is_flat_until_the_next_kv_block_and_totals_grow_by_the_slopes(
    model, hardware, tp, padding, seqs, context
):
    # decode_run says how many consecutive decode steps take the same time; every other
    # total grows by decode_token_slopes per extra cached token read.
    cm = RooflineCostModel(load_model(model), load_hardware(hardware), tp=tp)
    slopes = cm.decode_token_slopes

    def shape(kv: int) -> BatchShape:
        return BatchShape(
            num_seqs=seqs,
            num_decode_tokens=seqs,
            num_padding_tokens=padding,
            num_sampled_tokens=seqs + padding,
            kv_read_tokens=kv,
            attn_pairs=kv + seqs,
        )

    kv = seqs * context
    checked_runs = 0
    while checked_runs < 4:
        first, same = cm.decode_run(shape(kv))
        assert 1 <= same <= 128
        # the run ends exactly where the mean context (plus the new token) enters one more
        # 128-token block of the attention kernel
        blocks = [-(-(kv + k * seqs + seqs) // (128 * seqs)) for k in range(same + 1)]
        assert blocks[:-1] == [blocks[0]] * same and blocks[-1] == blocks[0] + 1
        for k in range(same):
            one = cm.estimate(shape(kv + k * seqs))
            assert one.time == first.time
            grown = k * seqs
            for field in ("flops", "bytes", "kv_bytes", "compute_time", "memory_time"):
                expect = getattr(first, field) + grown * getattr(slopes, field)
                assert getattr(one, field) == pytest.approx(expect, rel=1e-12), field
            assert one.weight_bytes == first.weight_bytes
        kv += same * seqs
        checked_runs += 1


@pytest.mark.parametrize(
    ("model", "hardware", "tp", "padding"),
    [
        ("llama-2-7b", "a100-80gb", 1, 0),
        ("llama-3-70b", "h100-sxm", 4, 0),
        ("mixtral-8x7b", "h100-sxm", 2, 3),
        ("deepseek-v3", "h200", 8, 0),
        ("mistral-7b", "l40s", 1, 2),
    ],
)
@pytest.mark.parametrize("steps", [300, 20])  # crossing several KV blocks / within one
def test_decode_stretch_equals_pricing_each_iteration(model, hardware, tp, padding, steps):
    cm = RooflineCostModel(load_model(model), load_hardware(hardware), tp=tp)
    seqs, context = 24, 900
    kv_read = seqs * context + seqs * np.arange(steps)
    first = BatchShape(
        num_seqs=seqs,
        num_decode_tokens=seqs,
        num_padding_tokens=padding,
        num_sampled_tokens=seqs + padding,
        kv_read_tokens=int(kv_read[0]),
        attn_pairs=int(kv_read[0]) + seqs,
    )
    stretch = cm.estimate_decode_stretch(first, kv_read)
    for k in sorted({0, 1, steps // 3, steps // 2, steps - 1}):
        one = cm.estimate(
            BatchShape(
                num_seqs=seqs,
                num_decode_tokens=seqs,
                num_padding_tokens=padding,
                num_sampled_tokens=seqs + padding,
                kv_read_tokens=int(kv_read[k]),
                attn_pairs=int(kv_read[k]) + seqs,
            )
        )
        for field in ("time", "flops", "bytes", "weight_bytes", "kv_bytes", "activation_bytes"):
            got = np.broadcast_to(getattr(stretch, field), kv_read.shape)[k]
            assert got == pytest.approx(getattr(one, field), rel=1e-12), field
        assert bool(np.broadcast_to(stretch.compute_bound, kv_read.shape)[k]) == bool(
            one.compute_bound
        )


@pytest.mark.parametrize(
    ("model", "hardware", "tp", "ideal"),
    [
        ("llama-2-7b", "a100-80gb", 1, False),
        ("llama-2-7b", "a100-80gb", 1, True),
        ("llama-3-70b", "h100-sxm", 4, False),
        ("mixtral-8x7b", "h100-sxm", 2, False),
        ("deepseek-v3", "h200", 8, False),
        ("mistral-7b", "l40s", 1, False),
    ],
)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_step_cost_is_estimate_to_the_last_bit(model, hardware, tp, ideal, data):
    # The engine logs step_cost(), which caches the attention kernel's nonlinear parts and
    # builds no operator groups: the totals must be estimate()'s exactly (same arithmetic in
    # the same order), for decodes, prefills (padded or not), chunks over a cached context,
    # their mixtures and padding sequences, priced twice (the second time from the caches).
    cm = _cost_models(model, hardware, tp, ideal)
    window = load_model(model).sliding_window
    decodes = data.draw(st.lists(st.integers(1, 9000), max_size=40))
    prefills = data.draw(
        st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 6000)), max_size=4)
    )
    if not decodes and not prefills:
        decodes = [100]
    new = [q for q, _ in prefills] + [1] * len(decodes)
    contexts = [c for _, c in prefills] + decodes
    pad = data.draw(st.booleans()) and bool(prefills)
    padding_seqs = data.draw(st.integers(0, 3))
    shape = BatchShape.from_requests(
        new,
        contexts,
        decode=[False] * len(prefills) + [True] * len(decodes),
        sampled=data.draw(st.lists(st.booleans(), min_size=len(new), max_size=len(new))),
        pad_to=max(new) if pad else None,
        num_padding_seqs=padding_seqs,
        padding_context=data.draw(st.integers(0, 4000)) if padding_seqs else 0,
        window=window,
    )
    for _ in range(2):
        full = cm.estimate(shape)
        want = (
            full.time,
            full.flops,
            full.bytes,
            full.weight_bytes,
            full.kv_bytes,
            full.compute_time - full.memory_time,
        )
        assert tuple(cm.step_cost(shape)) == want


_COST_MODELS: dict[tuple, RooflineCostModel] = {}


def _cost_models(model: str, hardware: str, tp: int, ideal: bool) -> RooflineCostModel:
    key = (model, hardware, tp, ideal)
    if key not in _COST_MODELS:
        _COST_MODELS[key] = RooflineCostModel(
            load_model(model), load_hardware(hardware), tp=tp, ideal=ideal
        )
    return _COST_MODELS[key]


def test_runs_with_the_same_model_gpu_and_terms_share_one_cost_model_with_the_same_results():
    # A sweep's points that share model, GPU and engine terms reuse one cost model (its
    # per-shape prices carry over); a run priced by a fresh cost model and one priced by a
    # cost model warmed by another run give identical tables.
    from batchsim import deployment, simulation
    from batchsim.config import validate_experiment
    from batchsim.deployment import setup as setup_module
    from conftest import tiny_experiment

    def config(**engine):
        data = tiny_experiment()
        data["engine"] = {**data.get("engine", {}), **engine}
        return validate_experiment(data)

    setup_module._COST_MODELS.clear()
    fresh = simulation.simulate(config())
    first = deployment.engine_setup(config()).cost_model
    assert deployment.engine_setup(config()).cost_model is first
    other = simulation.simulate(config(num_gpu_blocks=64))  # warms the same cost model more
    assert deployment.engine_setup(config(num_gpu_blocks=64)).cost_model is first
    warm = simulation.simulate(config())
    assert warm.iterations.equals(fresh.iterations) and warm.requests.equals(fresh.requests)
    assert other.summary["completed"] == fresh.summary["completed"]
    # other terms, other cost models
    assert deployment.engine_setup(config(all_reduce_latency_us=5.0)).cost_model is not first
    assert deployment.engine_setup(config(dtype="fp16")).cost_model is not first
    assert deployment.engine_setup(config(dtype="fp16")).cost_model.dtype == "fp16"
    # a bounded number of them is kept
    for latency in range(20):
        deployment.engine_setup(config(all_reduce_latency_us=float(latency)))
    assert len(setup_module._COST_MODELS) <= setup_module._COST_MODELS_KEPT
