"""The cohort of running decodes with a sliding window (a window on every layer, or a hybrid
model's sliding-window groups): its block counts against a brute force over tokens and
groups, and whole runs against the same runs stepped and without a cohort.

Expected block counts come from :func:`_brute_force_blocks` (token by token, group by
group), and the stepwise allocation of each request in turn; expected runs from stepping
one iteration at a time with the cohort switched off.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim.engine.cohort import Cohort
from batchsim.engine.kv_cache import KVCacheManager
from batchsim.engine.request import Request
from conftest import (
    assert_same_clock,
    assert_same_run,
    capture_engines,
    simulate_data,
    without_cohort,
)


def _brute_force_blocks(full: int, slide: int, bs: int, window: int, tokens: int) -> int:
    """Blocks a decode with ``tokens`` tokens held (``tokens - 1`` computed, as after the
    allocation of its next token) keeps: every block in a full group, in a sliding group the
    blocks of the keys its next query can see."""
    computed = tokens - 1
    every = {t // bs for t in range(tokens)}
    kept = {t // bs for t in range(max(0, computed - window + 1), tokens)}
    return full * len(every) + slide * len(kept)


members_st = st.lists(st.integers(0, 400), min_size=1, max_size=12)
COHORTS = {
    "full": st.integers(0, 2),
    "slide": st.integers(1, 3),
    "bs": st.sampled_from([1, 4, 16]),
    "window": st.integers(2, 120),
    "extra": members_st,
}
"""A windowed cohort: full and sliding layer groups, block size, window, members' tokens past
the window."""


def _window_cohort(
    full: int, slide: int, bs: int, window: int, extra: list[int], ahead: int
) -> tuple[KVCacheManager, Cohort, list[int]]:
    """A pool and a cohort of decodes at ``window + e`` computed tokens for each e of
    ``extra``, each joined holding the brute-force blocks of its tokens; ``ahead`` as the
    cohort's (the stretch's counts read only the members' offsets)."""
    kv = KVCacheManager(10**6, bs, window=window, full_groups=full, window_groups=slide)
    cohort = Cohort(bs, window, full + slide, slide)
    computed = [window + e for e in extra]
    for c in computed:
        r = Request(0, 0.0, c, c + 1000)
        r._computed, r._outputs, r._last = c, 1, 0
        r.num_prompt_tokens = c
        r._blocks = _brute_force_blocks(full, slide, bs, window, c)  # after its last step
        assert cohort.can_join(r)
        cohort.join(r)
    cohort.ahead = ahead  # 1: as after a schedule() that took the next token's blocks
    return kv, cohort, computed


@settings(max_examples=150, deadline=None)
@given(**COHORTS, steps=st.integers(1, 70))
def test_cohort_window_growth_matches_a_brute_force_over_tokens_and_groups(
    full: int, slide: int, bs: int, window: int, extra: list[int], steps: int
) -> None:
    # Members at computed = window + e, their next token's blocks taken (ahead): after k
    # steps each holds the brute-force blocks of computed + k + 1 tokens.
    kv, cohort, computed = _window_cohort(full, slide, bs, window, extra, ahead=0)
    need = cohort.crossing() - cohort.freed()
    first = sum(_brute_force_blocks(full, slide, bs, window, c + 1) for c in computed)
    held = sum(_brute_force_blocks(full, slide, bs, window, c) for c in computed)
    assert need == first - held  # the next token's blocks, less what the window frees
    grows = [
        _brute_force_blocks(full, slide, bs, window, c + 1)
        - _brute_force_blocks(full, slide, bs, window, c)
        for c in computed
    ]
    assert cohort.growing() == sum(g for g in grows if g > 0)  # what the pool must have
    cohort.ahead = 1
    later = sum(_brute_force_blocks(full, slide, bs, window, c + steps) for c in computed)
    grown = kv.growth_from_offsets(cohort.offsets(), steps, cohort.window_offsets())
    assert grown == later - first
    ramp = kv.usage_ramp(cohort.offsets(), cohort.window_offsets())
    used = kv.num_blocks - kv.num_free_blocks
    assert ramp.at(steps - 1) * kv.num_blocks == pytest.approx(used + later - first)


@settings(max_examples=150, deadline=None)
@given(**COHORTS, free=st.integers(0, 60))
def test_cohort_window_stretch_never_outgrows_what_stepping_allocates(
    full: int, slide: int, bs: int, window: int, extra: list[int], free: int
) -> None:
    # Stepping allocates each member's next token in turn (new blocks before the blocks a
    # later member frees): the longest stretch that never runs short, by brute force, is
    # what max_growth_from_offsets allows.
    kv, cohort, computed = _window_cohort(full, slide, bs, window, extra, ahead=1)
    kv.num_free_blocks = free
    limit = 80
    stepped = grouped = 1  # steps that fit: each member in turn; new blocks before frees
    pool_stepped = pool_grouped = free
    for k in range(2, limit + 1):
        deltas = [
            _brute_force_blocks(full, slide, bs, window, c + k)
            - _brute_force_blocks(full, slide, bs, window, c + k - 1)
            for c in computed
        ]
        if stepped == k - 1:
            for delta in deltas:
                if delta > pool_stepped:
                    break
                pool_stepped -= delta
            else:
                stepped = k
        grown = sum(d for d in deltas if d > 0)
        if grouped == k - 1 and grown <= pool_grouped:
            pool_grouped -= sum(deltas)
            grouped = k
    allowed = kv.max_growth_from_offsets(cohort.offsets(), limit, cohort.window_offsets())
    assert allowed == grouped
    assert allowed <= stepped  # never a step that stepping could not allocate


def _experiment(model: str, num_requests: int, rate: float, **top: Any) -> dict[str, Any]:
    prompt = top.pop("prompt", (512, 2048))
    engine = {"framework": None, **top.pop("engine", {})}
    scheduler = {
        "policy": "continuous",
        "max_num_seqs": 128,
        "max_num_batched_tokens": 4096,
        **top.pop("scheduler", {}),
    }
    return {
        "name": "window-cohort",
        "seed": 0,
        "hardware": "h100-sxm",
        "model": model,
        "engine": engine,
        "scheduler": scheduler,
        "workload": {
            "num_requests": num_requests,
            "arrival": {"process": "poisson", "rate": rate},
            "prompt_tokens": {"dist": "uniform", "min": prompt[0], "max": prompt[1]},
            "output_tokens": {"dist": "uniform", "min": 128, "max": 512},
        },
    }


WINDOW_CASES = [
    ("gpt-oss-20b", 150, 4.0, {}),  # hybrid: a 128-token window every other layer
    ("gpt-oss-20b", 150, 20.0, {"engine": {"num_gpu_blocks": 1500}}),  # preempts
    (
        "gpt-oss-20b",
        150,
        20.0,
        {"engine": {"num_gpu_blocks": 1500}, "scheduler": {"policy": "chunked_prefill"}},
    ),
    ("gemma-3-12b", 80, 10.0, {"engine": {"num_gpu_blocks": 1200}}),  # 5 of 6 layers slide
    ("mistral-7b", 60, 10.0, {"prompt": (3800, 4090), "engine": {"num_gpu_blocks": 1500}}),
]


@pytest.mark.parametrize(("model", "num_requests", "rate", "top"), WINDOW_CASES)
def test_a_window_cohort_changes_no_result(
    model: str, num_requests: int, rate: float, top: dict[str, Any]
) -> None:
    # The same run three ways: fast-forwarded, stepped, and stepped with no request ever
    # joining the cohort (every request scheduled, priced and applied on its own).
    data = _experiment(model, num_requests, rate, **copy.deepcopy(top))
    fast, slow = copy.deepcopy(data), copy.deepcopy(data)
    fast["engine"]["fast_forward"] = True
    slow["engine"]["fast_forward"] = False
    stepped = simulate_data(slow)
    with without_cohort():
        alone = simulate_data(slow)
    for column in stepped.iterations.columns:  # the same arithmetic: to the last bit
        assert stepped.iterations[column].equals(alone.iterations[column]), column
    assert stepped.requests.equals(alone.requests)
    with capture_engines() as engines:
        fast_result = simulate_data(fast)
    stretch = engines[0].stretch
    # the windowed cohort was used: stretches priced as runs past the window (without it,
    # every stretch of a windowed model is priced step by step)
    assert stretch.num_stretches > stretch.num_stepwise_stretches
    assert_same_run(fast_result, stepped)
    assert_same_clock(fast_result, stepped)


def test_a_stretch_cut_at_the_last_step_of_a_priced_chunk_stops_there() -> None:
    # gpt-oss-20b at 4 req/s: a stretch priced step by step (its contexts cross the window)
    # reached an arrival exactly at the 32nd step, the end of its first vectorised chunk,
    # and ran one step more than stepping (which admits the arrival there).
    data = _experiment("gpt-oss-20b", 600, 4.0)
    fast, slow = copy.deepcopy(data), copy.deepcopy(data)
    fast["engine"]["fast_forward"] = True
    slow["engine"]["fast_forward"] = False
    with capture_engines() as engines, without_cohort():  # stepwise stretches
        a, b = simulate_data(fast), simulate_data(slow)
    stretch = engines[0].stretch
    assert 0 < stretch.num_stretches == stretch.num_stepwise_stretches  # no cohort indeed
    assert_same_run(a, b)
    assert_same_clock(a, b)
