"""Policy behaviour, driving schedule() / update_from_output() directly (no SimPy)."""

from __future__ import annotations

import math

import pytest

from batchsim.engine.repeat import repeat_limit
from batchsim.engine.request import RequestStatus
from batchsim.scheduler.output import StepTimes
from conftest import create_requests, create_scheduler, step


def test_chunked_prefill_splits_1200_token_prompt_as_512_512_176_then_decodes():
    s = create_scheduler("chunked_prefill", max_num_batched_tokens=512)
    (r,) = create_requests(1, prompt=1200, output=3)
    s.add_request(r)
    scheduled = []
    for t in range(6):
        out, _ = step(s, float(t))
        if out.requests:
            scheduled.append(out.num_scheduled_tokens[0])
    assert scheduled == [512, 512, 176, 1, 1]
    assert r.status == RequestStatus.FINISHED
    assert r.first_token_time == 3.0  # the third chunk completes the prompt and samples


def test_chunked_prefill_non_final_chunks_emit_no_token():
    s = create_scheduler("chunked_prefill", max_num_batched_tokens=512)
    (r,) = create_requests(1, prompt=1200, output=2)
    s.add_request(r)
    out, _ = step(s, 0.0)
    assert out.shape.num_sampled_tokens == 0 and r.num_output_tokens == 0
    assert math.isnan(r.first_token_time)


def test_chunked_prefill_runs_decodes_first_then_fills_budget_with_prompt_chunk():
    s = create_scheduler("chunked_prefill", max_num_batched_tokens=100)
    for r in create_requests(3, prompt=10, output=50):
        s.add_request(r)
    step(s, 0.0)  # three 10-token prompts
    (late,) = create_requests(1, prompt=400, output=5, arrival=1.0, start_id=3)
    s.add_request(late)
    out, _ = step(s, 1.0)
    assert out.num_scheduled_tokens == [1, 1, 1, 97]
    assert out.num_decode_seqs == 3 and out.num_prefill_seqs == 1


def test_continuous_without_mixing_stalls_running_decodes_during_prefill():
    s = create_scheduler("continuous", mix_prefill_decode=False)
    for r in create_requests(2, prompt=32, output=10):
        s.add_request(r)
    step(s, 0.0)
    (late,) = create_requests(1, prompt=500, output=10, arrival=1.0, start_id=2)
    s.add_request(late)
    out, _ = step(s, 1.0)
    assert [r.request_id for r in out.requests] == [2]
    assert out.num_decode_seqs == 0
    out, _ = step(s, 2.0)
    assert out.num_decode_seqs == 3


def test_continuous_with_mixing_runs_prefill_and_decodes_together():
    s = create_scheduler("continuous", mix_prefill_decode=True)
    for r in create_requests(2, prompt=32, output=10):
        s.add_request(r)
    step(s, 0.0)
    (late,) = create_requests(1, prompt=500, output=10, arrival=1.0, start_id=2)
    s.add_request(late)
    out, _ = step(s, 1.0)
    assert out.num_decode_seqs == 2 and out.num_prefill_seqs == 1
    assert out.shape.num_prefill_tokens == 500 and out.shape.num_decode_tokens == 2


def test_continuous_refills_a_finished_slot_at_the_next_iteration():
    s = create_scheduler("continuous", max_num_seqs=2)
    short, long_ = create_requests(2, prompt=8, output=2)
    long_.max_tokens = 20
    s.add_request(short)
    s.add_request(long_)
    (third,) = create_requests(1, prompt=8, output=5, start_id=2)
    s.add_request(third)
    step(s, 0.0)  # prefill of the first two (cap 2)
    out, finished = step(s, 1.0)  # decode: short finishes
    assert finished == [short]
    out, _ = step(s, 2.0)
    assert out.requests == [third]  # joins right away (prefill, no mixing)


def test_continuous_rejects_prompt_longer_than_token_budget():
    s = create_scheduler("continuous", max_num_batched_tokens=1024)
    (r,) = create_requests(1, prompt=2000)
    assert not s.add_request(r)
    assert r.status == RequestStatus.REJECTED
    assert "max_num_batched_tokens" in r.reject_reason


def test_request_that_can_never_fit_the_kv_cache_is_rejected_with_reason():
    s = create_scheduler("chunked_prefill", num_blocks=10, block_size=16)
    (r,) = create_requests(1, prompt=200, output=10)
    assert not s.add_request(r)
    assert "KV cache capacity" in r.reject_reason
    assert not s.has_unfinished_requests()


def test_static_batch_keeps_finished_slot_empty_until_batch_ends():
    s = create_scheduler("static", max_num_seqs=2)
    a, b = create_requests(2, prompt=8, output=2)
    b.max_tokens = 5
    s.add_request(a)
    s.add_request(b)
    (c,) = create_requests(1, prompt=8, output=2, start_id=2)
    s.add_request(c)
    step(s, 0.0)  # prefill a, b
    _, finished = step(s, 1.0)
    assert finished == [a]
    for t in range(2, 5):
        out, _ = step(s, float(t))
        assert out.requests == [b]  # c waits: membership is fixed
        assert out.num_slots == 2 and out.num_empty_slots == 1
        assert out.shape.num_padding_tokens == 1  # the empty row is still computed
    s.set_end_of_input(True)
    out, _ = step(s, 5.0)
    assert out.requests == [c]  # a new batch only after the whole batch ended


def test_static_pads_prefill_to_longest_prompt():
    s = create_scheduler("static", max_num_seqs=3)
    for p in (100, 300, 200):
        s.add_request(create_requests(1, prompt=p, start_id=p)[0])
    out, _ = step(s, 0.0)
    assert out.shape.num_prefill_tokens == 600
    assert out.shape.num_padding_tokens == 3 * 300 - 600


def test_static_without_padding_packs_tokens():
    s = create_scheduler("static", max_num_seqs=3, padding=False)
    for p in (100, 300, 200):
        s.add_request(create_requests(1, prompt=p, start_id=p)[0])
    out, _ = step(s, 0.0)
    assert out.shape.num_padding_tokens == 0


def test_static_waits_for_a_full_batch_unless_arrivals_are_over():
    s = create_scheduler("static", max_num_seqs=4)
    for r in create_requests(3):
        s.add_request(r)
    assert s.schedule_iteration(0.0).is_empty
    s.set_end_of_input(True)
    assert s.schedule_iteration(0.0).num_seqs == 3


def test_dynamic_launches_when_oldest_request_waited_max_wait():
    s = create_scheduler("dynamic", max_num_seqs=8, max_wait_ms=100)
    (r,) = create_requests(1, arrival=1.0)
    s.add_request(r)
    assert s.schedule_iteration(1.05).is_empty
    assert s.next_timer(1.05) == 1.0 + 0.1
    assert s.schedule_iteration(1.1).num_seqs == 1


def test_dynamic_launches_early_when_batch_is_full():
    s = create_scheduler("dynamic", max_num_seqs=2, max_wait_ms=1000)
    for r in create_requests(2, arrival=0.0):
        s.add_request(r)
    assert s.schedule_iteration(0.0).num_seqs == 2


def test_kv_exhaustion_preempts_latest_request_by_recompute():
    # 2 requests of 16-token prompts, block 16: each needs a 2nd block at its first decode.
    s = create_scheduler("continuous", num_blocks=3, block_size=16)
    a, b = create_requests(2, prompt=16, output=4)
    s.add_request(a)
    s.add_request(b)
    step(s, 0.0)  # prefill both: 2 blocks used
    out, _ = step(s, 1.0)  # decode: a takes the 3rd block, b cannot grow -> b preempted
    assert out.requests == [a] and out.preempted == [b]
    assert b.status == RequestStatus.WAITING and b.num_computed_tokens == 0
    assert b.num_preemptions == 1
    assert b.num_output_tokens == 1  # the sampled token is kept; its KV is recomputed


def test_recomputed_request_resumes_with_prompt_plus_outputs():
    s = create_scheduler("chunked_prefill", num_blocks=3, block_size=16)
    a, b = create_requests(2, prompt=16, output=3)
    s.add_request(a)
    s.add_request(b)
    t = 0.0
    while s.has_unfinished_requests() and t < 50:
        step(s, t)
        t += 1.0
    assert a.status == b.status == RequestStatus.FINISHED
    assert b.num_preemptions >= 1
    assert s.kv_cache.num_free_blocks == s.kv_cache.num_blocks


def two_requests_one_preempted(
    policy: str = "continuous", output: int = 4, num_cpu_blocks: int = 4
):
    """3 KV blocks of 16 tokens, swap mode: two 16-token prompts fill 2 blocks; at the first
    decode ``a`` takes the last block and ``b`` (admitted last) is preempted."""
    s = create_scheduler(
        policy,
        num_blocks=3,
        block_size=16,
        num_cpu_blocks=num_cpu_blocks,
        preemption_mode="swap",
    )
    a, b = create_requests(2, prompt=16, output=output)
    s.add_request(a)
    s.add_request(b)
    step(s, 0.0)  # prefill both
    out, _ = step(s, 1.0)  # decode: b is preempted
    return s, a, b, out


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_swap_mode_moves_the_victims_blocks_to_host_and_resumes_it_without_recompute(policy):
    s, a, b, out = two_requests_one_preempted(policy)  # b is swapped out, progress kept
    assert out.requests == [a] and out.preempted == [b]
    assert out.num_swap_out_blocks == 1 and out.num_swap_in_blocks == 0
    assert b.status == RequestStatus.SWAPPED and b.num_computed_tokens == 16
    assert b.num_cpu_blocks == 1 and s.kv_cache.num_free_cpu_blocks == 3
    assert b.num_preemptions == b.num_swaps == 1 and out.num_swapped_out == 1
    prefill_tokens = {a.request_id: 0, b.request_id: 0}
    swapped_in = []
    t = 2.0
    while s.has_unfinished_requests() and t < 50:
        out, _ = step(s, t)
        for r, q in zip(out.requests, out.num_scheduled_tokens):
            if q > 1:
                prefill_tokens[r.request_id] += q
        if out.num_swap_in_blocks:
            swapped_in.append((out.num_swap_in_blocks, b in out.requests))
        t += 1.0
    assert a.status == b.status == RequestStatus.FINISHED
    assert b.num_output_tokens == 4
    assert prefill_tokens == {a.request_id: 0, b.request_id: 0}  # nothing recomputed
    assert swapped_in == [(1, True)]  # b's block came back once, and b ran in that iteration
    kv = s.kv_cache
    assert kv.num_free_blocks == kv.num_blocks and kv.num_free_cpu_blocks == kv.num_cpu_blocks


def test_swap_mode_recomputes_when_the_host_swap_space_is_full():
    _, _, b, out = two_requests_one_preempted(num_cpu_blocks=0)
    assert out.preempted == [b] and out.num_swap_out_blocks == 0
    assert b.status == RequestStatus.WAITING and b.num_computed_tokens == 0
    assert b.num_preemptions == 1 and b.num_swaps == 0 and out.num_swapped_out == 0


def test_no_new_prompt_is_admitted_while_a_request_is_swapped_out():
    s, a, b, _ = two_requests_one_preempted(output=20)
    assert b.status == RequestStatus.SWAPPED
    (c,) = create_requests(1, prompt=8, output=2, start_id=2)
    s.add_request(c)
    for t in range(2, 12):
        # a decodes within its 2 blocks; the free block would hold c's prompt but not b's
        # 2 blocks: c must not overtake b
        out, _ = step(s, float(t))
        assert out.requests == [a] and s.kv_cache.num_free_blocks == 1
    assert b.status == RequestStatus.SWAPPED and c.status == RequestStatus.WAITING


def test_cancel_of_a_swapped_request_frees_its_host_blocks():
    s, _, b, _ = two_requests_one_preempted()
    assert b.status == RequestStatus.SWAPPED
    s.cancel(b, 2.0)
    assert b.status == RequestStatus.CANCELLED and not s.swapped
    assert s.kv_cache.num_free_cpu_blocks == 4 and b.num_cpu_blocks == 0


def test_cancel_removes_running_request_and_frees_its_blocks():
    s = create_scheduler("continuous")
    (r,) = create_requests(1, prompt=64, output=100)
    s.add_request(r)
    step(s, 0.0)
    assert s.kv_cache.num_used_blocks > 0
    s.cancel(r, 1.0)
    assert r.status == RequestStatus.CANCELLED and r.finish_time == 1.0
    assert s.kv_cache.num_used_blocks == 0 and not s.has_unfinished_requests()


def test_decode_stretch_is_bounded_by_first_completion():
    s = create_scheduler("continuous")
    a, b = create_requests(2, prompt=8, output=10)
    b.max_tokens = 4
    s.add_request(a)
    s.add_request(b)
    step(s, 0.0)
    out = s.schedule_iteration(1.0)
    assert out.is_decode_only
    assert repeat_limit(s, out) == 3  # b has 3 tokens left


def test_admission_leaves_the_watermark_free_and_running_requests_grow_into_it():
    s = create_scheduler("continuous", num_blocks=10, watermark_blocks=1)
    (big,) = create_requests(1, prompt=150, output=4, start_id=9)  # 10 blocks: over the mark
    assert not s.add_request(big) and "above the admission watermark" in big.reject_reason
    a, b = create_requests(2, prompt=64, output=8)  # 4 blocks each to start
    s.add_request(a)
    s.add_request(b)
    out, _ = step(s, 0.0)
    assert out.requests == [a, b] and s.kv_cache.num_free_blocks == 2
    (c,) = create_requests(1, prompt=32, output=2, start_id=2)  # 2 blocks: would leave none
    s.add_request(c)
    out, _ = step(s, 1.0)  # token 65 of a and b needs a fifth block each: the last is the mark's
    assert out.requests == [a, b] and not out.preempted
    assert a.num_blocks == b.num_blocks == 5 and s.kv_cache.num_free_blocks == 0
    assert c.status == RequestStatus.WAITING  # admission would have left the mark free


@pytest.mark.parametrize(
    ("policy", "config"),
    [
        ("continuous", {}),
        ("continuous", {"mix_prefill_decode": True}),
        ("continuous", {"preemption_mode": "swap"}),
        ("chunked_prefill", {"max_num_batched_tokens": 48}),
    ],
)
def test_an_iteration_keeps_its_requests_whatever_the_scheduler_does_next(policy, config):
    # Requests arrive, finish, are preempted (a small KV pool), swapped and cancelled while
    # earlier iterations' outputs are kept: each output's requests must stay what schedule()
    # returned, however the running set changes afterwards.
    s = create_scheduler(policy, num_blocks=14, block_size=4, num_cpu_blocks=8, **config)
    requests = create_requests(12, prompt=10, output=14)
    held = []
    index = 0
    for t in range(1000):
        if t < len(requests):
            s.add_request(requests[t])
        if t == 20:
            for r in requests[:6]:
                if r.status == RequestStatus.RUNNING:
                    s.cancel(r, float(t))  # the first one running
                    break
        out = s.schedule_iteration(float(t))
        held.append((out, list(out.requests)))
        if out.requests:
            s.update_from_output(out, StepTimes(index, float(t), t + 1.0))
            index += 1
        if not s.has_unfinished_requests() and t >= len(requests):
            break
    assert not s.has_unfinished_requests()
    assert any(out.preempted for out, _ in held), "no preemption: the pool is too large"
    assert any(out.batch is not None and out.batch.pure for out, _ in held)
    assert sum(r.status == RequestStatus.CANCELLED for r in requests) == 1
    for out, requests_then in held:
        assert out.requests == requests_then


def test_chunked_prefill_first_prefills_a_burst_before_any_decode():
    # SGLang's default (no mixed chunk): four 3,000-token prompts under a 2,048-token budget
    # are prefilled in ceil(12,000 / 2,048) = 6 prompt-only iterations; request i samples its
    # first token in iteration ceil(3,000 (i + 1) / 2,048): 2, 3, 5, 6 (1-based).
    s = create_scheduler("chunked_prefill", max_num_batched_tokens=2048, mix_prefill_decode=False)
    burst = create_requests(4, prompt=3000, output=4)
    for r in burst:
        s.add_request(r)
    for t in range(6):  # iteration t + 1 ends at t + 1
        out, _ = step(s, float(t))
        assert out.num_decode_seqs == 0
        assert sum(out.num_scheduled_tokens) == min(2048, 12000 - 2048 * t)
    assert [r.first_token_time for r in burst] == [2.0, 3.0, 5.0, 6.0]
    out, _ = step(s, 6.0)
    assert out.num_decode_seqs == 4 and out.num_prefill_seqs == 0


def test_chunked_prefill_first_stalls_decodes_while_a_prompt_arrives_and_mixes_by_default():
    stalled = create_scheduler(
        "chunked_prefill", max_num_batched_tokens=100, mix_prefill_decode=False
    )
    mixed = create_scheduler("chunked_prefill", max_num_batched_tokens=100)
    shapes = []
    for s in (stalled, mixed):
        for r in create_requests(3, prompt=10, output=50):
            s.add_request(r)
        step(s, 0.0)
        (late,) = create_requests(1, prompt=150, output=5, arrival=1.0, start_id=3)
        s.add_request(late)
        shapes.append([step(s, float(t))[0].num_scheduled_tokens for t in (1, 2, 3)])
    # prefill first: 100 + 50 prompt tokens alone (the decodes wait), then the four decode
    assert shapes[0] == [[100], [50], [1, 1, 1, 1]]
    # mixed (vLLM v1): the three decodes first, the prompt in chunks of what they leave
    assert shapes[1] == [[1, 1, 1, 97], [1, 1, 1, 53], [1, 1, 1, 1]]


def test_chunked_prefill_first_admits_a_prompt_only_with_blocks_for_all_of_it():
    # 60 blocks of 16 tokens, a 700-token budget: the first 600-token prompt takes 38 blocks;
    # the 100 tokens left of the budget would be the second prompt's first chunk (7 of the 22
    # free blocks) but it waits for all of its 38, so a prompt's later chunks never wait for
    # blocks that decodes, stalled by prefill, would never free.
    s = create_scheduler(
        "chunked_prefill", max_num_batched_tokens=700, mix_prefill_decode=False, num_blocks=60
    )
    first, second = create_requests(2, prompt=600, output=2)
    s.add_request(first)
    s.add_request(second)
    out, _ = step(s, 0.0)
    assert [r.request_id for r in out.requests] == [first.request_id]
    assert s.kv_cache.num_free_blocks == 60 - 38
