"""Speculative decoding (``engine.speculative``): acceptance, cost, KV and metrics."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsim import deployment, simulation
from batchsim.config import SpeculativeConfig, validate_experiment
from batchsim.cost import BatchShape
from batchsim.engine.engine import Engine
from batchsim.engine.request import Request, RequestStatus
from batchsim.errors import ConfigError
from batchsim.scheduler.speculation import Speculator
from batchsim.scheduler.speculative import SpeculativeScheduler
from conftest import (
    assert_same_clock,
    assert_same_run,
    capture_engines,
    simulate_data,
    tiny_experiment,
)

DRAFT = "llama-3.2-1b"


def spec(method: str = "draft", k: int = 4, alpha: Any = 0.7, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": k, "acceptance_rate": alpha}
    if method == "draft":
        out["draft_model"] = DRAFT
    return {**out, **extra}


def one_request(prompt: int, output: int, speculative: dict[str, Any] | None) -> dict[str, Any]:
    """One request on an idle engine, no CPU overhead: every iteration is its GPU time."""
    engine: dict[str, Any] = {"cpu_overhead_ms": 0.0, "cpu_overhead_per_seq_ms": 0.0}
    if speculative is not None:
        engine["speculative"] = speculative
    return tiny_experiment(
        model="llama-3.1-8b",
        engine=engine,
        workload={
            "num_requests": 1,
            "arrival": {"process": "constant", "rate": 1.0},
            "prompt_tokens": {"dist": "fixed", "value": prompt},
            "output_tokens": {"dist": "fixed", "value": output},
        },
    )


# ------------------------------------------------------------------ acceptance
def _acceptance_length_moments(alpha: float, k: int) -> tuple[float, float]:
    """Mean and variance of 1 + (leading accepted drafts of k), from its distribution:
    s accepted with probability alpha^s (1 - alpha) for s < k, alpha^k for s = k."""
    p = [alpha**s * (1 - alpha) for s in range(k)] + [alpha**k]
    values = np.arange(1, k + 2)
    mean = float(np.dot(p, values))
    return mean, float(np.dot(p, values**2)) - mean**2


@pytest.mark.parametrize(("alpha", "k"), [(0.3, 2), (0.6, 4), (0.8, 5), (0.95, 8)])
def test_mean_accepted_tokens_per_step_is_leviathan_closed_form(alpha, k):
    speculator = Speculator(SpeculativeConfig(**spec("ngram", k, alpha)), seed=3)
    num_requests, steps = 400, 100
    lengths = [
        speculator.accept(Request(i, 0.0, 10, 10_000), k) + 1
        for i in range(num_requests)
        for _ in range(steps)
    ]
    n = len(lengths)
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)  # Leviathan et al., eq. (1)
    mean, variance = _acceptance_length_moments(alpha, k)
    assert mean == pytest.approx(expected)
    half_width = 4.0 * math.sqrt(variance / n)  # a 4-sigma interval of the sample mean
    assert abs(np.mean(lengths) - expected) < half_width
    summary = speculator.summary()
    assert summary["mean_acceptance_length"] == pytest.approx(np.mean(lengths))
    assert summary["draft_acceptance_rate"] == pytest.approx((np.mean(lengths) - 1) / k)


def test_per_request_acceptance_rate_follows_its_beta_distribution():
    config = SpeculativeConfig(**spec("ngram", 3, {"dist": "beta", "a": 2.0, "b": 3.0}))
    speculator = Speculator(config, seed=0)
    rates = np.array([speculator.acceptance_rate(Request(i, 0.0, 1, 1)) for i in range(20_000)])
    mean, variance = 2 / 5, 2 * 3 / (5**2 * 6)  # beta(a, b): a/(a+b), ab/((a+b)^2 (a+b+1))
    assert abs(rates.mean() - mean) < 4 * math.sqrt(variance / len(rates))
    assert rates.min() >= 0 and rates.max() <= 1


def test_a_request_sees_the_same_acceptances_whatever_else_runs():
    # each request draws from its own stream: the draws do not depend on the batch
    a = Speculator(SpeculativeConfig(**spec("ngram", 4, 0.6)), seed=7)
    b = Speculator(SpeculativeConfig(**spec("ngram", 4, 0.6)), seed=7)
    r5, r9 = Request(5, 0.0, 1, 100), Request(9, 0.0, 1, 100)
    alone = [a.accept(r5, 4) for _ in range(50)]
    mixed = []
    for _ in range(50):
        b.accept(r9, 4)
        mixed.append(b.accept(r5, 4))
    assert alone == mixed


# ------------------------------------------------------------------ cost of an iteration
def _decode_durations(result: simulation.Result) -> np.ndarray:
    it = result.iterations
    return it["duration_ms"].to_numpy()[it["num_prefill_seqs"].to_numpy() == 0] / 1e3


def test_alpha_zero_is_slower_than_no_speculation_by_the_draft_and_verification_cost():
    prompt, output, k = 300, 12, 3
    plain = simulate_data(one_request(prompt, output, None))
    slow = simulate_data(one_request(prompt, output, spec("draft", k, 0.0)))
    setup = deployment.engine_setup(
        validate_experiment(one_request(prompt, output, spec("draft", k)))
    )
    target, draft = setup.cost_model, setup.draft_cost_model
    assert draft is not None
    expected_extra = []
    for i in range(1, output):  # decode i: context prompt + i - 1, i tokens out so far
        c = prompt + i - 1
        drafts = min(k, output - i - 1)
        if drafts == 0:
            expected_extra.append(0.0)
            continue
        rows = drafts + 1
        verify = BatchShape(
            num_seqs=1,
            num_prefill_tokens=rows,
            num_sampled_tokens=rows,
            kv_read_tokens=c,
            attn_pairs=rows * c + rows * (rows + 1) // 2,
        )
        drafting = sum(draft.step_cost(BatchShape.decode(1, c + j)).time for j in range(drafts))
        plain_step = target.step_cost(BatchShape.decode(1, c)).time
        expected_extra.append(drafting + target.step_cost(verify).time - plain_step)
    assert len(_decode_durations(slow)) == output - 1  # alpha = 0: one token per step
    np.testing.assert_allclose(
        _decode_durations(slow) - _decode_durations(plain), expected_extra, rtol=1e-9, atol=1e-12
    )
    assert all(e > 0 for e in expected_extra[:-1])
    # the prompt: the draft model computes it as well
    prefill_extra = draft.step_cost(BatchShape.prefill(prompt)).time
    first = slow.iterations["duration_ms"][0] - plain.iterations["duration_ms"][0]
    assert first / 1e3 == pytest.approx(prefill_extra, rel=1e-9)
    assert slow.summary["mean_acceptance_length"] == 1.0
    assert slow.summary["draft_acceptance_rate"] == 0.0


def test_alpha_one_emits_k_plus_one_tokens_per_step_and_itl_counts_chunks():
    k, steps, rest = 4, 6, 2
    output = 1 + steps * (k + 1) + rest  # the last step needs only `rest` tokens
    result = simulate_data(one_request(100, output, spec("eagle", k, 1.0)))
    it = result.iterations
    decodes = it[it["num_prefill_seqs"] == 0]
    assert decodes["num_decode_tokens"].tolist() == [k + 1] * steps + [rest]
    assert int(result.requests["output_tokens"][0]) == output
    summary = result.summary
    assert summary["draft_acceptance_rate"] == 1.0
    assert summary["mean_acceptance_length"] == pytest.approx(
        (steps * (k + 1) + rest) / (steps + 1)
    )
    gaps = decodes["duration_ms"].to_numpy()  # one inter-token gap per output chunk
    assert summary["mean_itl_ms"] == pytest.approx(gaps.mean(), rel=1e-9)
    assert summary["mean_tpot_ms"] == pytest.approx(gaps.sum() / (output - 1), rel=1e-9)


def test_proposer_cost_is_paid_once_per_draft_step_of_the_batch():
    prompt, output, k, ms = 64, 10, 3, 0.25
    plain = simulate_data(one_request(prompt, output, spec("ngram", k, 0.0)))
    eagle = simulate_data(
        one_request(prompt, output, spec("eagle", k, 0.0, proposer_ms_per_token=ms))
    )
    drafts = [min(k, output - i - 1) for i in range(1, output)]
    np.testing.assert_allclose(
        _decode_durations(eagle) - _decode_durations(plain),
        [d * ms / 1e3 for d in drafts],
        rtol=1e-9,
        atol=1e-12,
    )


# ------------------------------------------------------------------ runs
def spec_experiment(**engine: Any) -> dict[str, Any]:
    return tiny_experiment(engine={"speculative": spec("draft", 3, 0.7), **engine})


def test_same_seed_same_run_other_seed_other_acceptances():
    a, b = simulate_data(spec_experiment()), simulate_data(spec_experiment())
    assert_same_run(a, b)
    other = spec_experiment()
    other["seed"] = 1
    assert (
        simulate_data(other).summary["mean_acceptance_length"]
        != (a.summary["mean_acceptance_length"])
    )


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_fast_forward_setting_does_not_change_a_speculative_run(policy):
    data = spec_experiment()
    data["scheduler"] = {"policy": policy, "max_num_seqs": 16, "max_num_batched_tokens": 512}
    fast, slow = copy.deepcopy(data), copy.deepcopy(data)
    fast["engine"]["fast_forward"] = True
    slow["engine"]["fast_forward"] = False
    with capture_engines() as engines:
        a = simulate_data(fast)
    assert not engines[0].fast_forward  # no decode stretches: acceptance is random
    drain = engines[0].speculative_drain
    assert drain is not None and drain.num_drained > 0  # verifications run back to back
    b = simulate_data(slow)
    assert_same_run(a, b)
    assert_same_clock(a, b)


def test_token_budget_counts_verification_rows():
    data = spec_experiment()
    data["scheduler"] = {
        "policy": "chunked_prefill",
        "max_num_seqs": 32,
        "max_num_batched_tokens": 48,
    }
    result = simulate_data(data)
    it = result.iterations
    assert (it["num_prefill_tokens"] + it["num_decode_tokens"]).max() <= 48
    # some iterations verify fewer drafts than k for lack of budget, yet all finish
    assert (result.requests["status"] == "finished").all()
    assert (result.requests["output_tokens"] == result.requests["max_tokens"]).all()


def test_draft_model_kv_and_weights_shrink_the_block_pool():
    plain = deployment.engine_setup(validate_experiment(tiny_experiment()))
    setup = deployment.engine_setup(validate_experiment(spec_experiment()))
    ngram = deployment.engine_setup(
        validate_experiment(tiny_experiment(engine={"speculative": spec("ngram")}))
    )
    assert ngram.num_gpu_blocks == plain.num_gpu_blocks
    draft, target = setup.draft_cost_model, setup.cost_model
    assert draft is not None
    memory = plain.num_gpu_blocks * target.kv_bytes_per_token_per_gpu  # per token of a block
    expected = (memory - draft.weight_bytes_per_gpu / 16) / (
        target.kv_bytes_per_token_per_gpu + draft.kv_bytes_per_token_per_gpu
    )
    assert setup.num_gpu_blocks == pytest.approx(expected, abs=2)


def test_speculation_runs_on_replicas_with_prefix_caching():
    data = spec_experiment(enable_prefix_caching=True)
    data["cluster"] = {"replicas": 2}
    result = simulate_data(data)
    assert result.summary["completed"] == 60
    assert 1 < result.summary["mean_acceptance_length"] < 4


# ------------------------------------------------------------------ KV conservation
class _KVCheck:
    """``on_step``: before every schedule(), each running request holds the blocks of its
    computed tokens exactly (rejected drafts were freed), and the pool adds up."""

    def __init__(self, shared: bool):
        self.shared = shared
        self.checked = 0

    def __call__(self, engine: Engine) -> None:
        kv = engine.kv_cache
        bs = kv.block_size
        held = 0
        for r in engine.scheduler.running:
            assert r.num_blocks == -(-r.num_computed_tokens // bs), r
            held += r.num_blocks
        if not self.shared:
            assert held == kv.num_blocks - kv.num_free_blocks
        self.checked += 1

    def stage(self, name: str) -> None:
        pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    alpha=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    k=st.integers(1, 6),
    block_size=st.sampled_from([1, 4, 16]),
    policy=st.sampled_from(["continuous", "mixed", "chunked_prefill"]),
    blocks=st.sampled_from([None, 60]),
    prefix=st.booleans(),
    method=st.sampled_from(["draft", "ngram"]),
)
def test_kv_blocks_held_are_those_of_the_accepted_context(
    alpha, k, block_size, policy, blocks, prefix, method
):
    scheduler: dict[str, Any] = {"policy": policy, "max_num_seqs": 8, "max_num_batched_tokens": 300}
    if policy == "mixed":
        scheduler.update(policy="continuous", mix_prefill_decode=True)
    engine: dict[str, Any] = {
        "speculative": spec(method, k, alpha),
        "block_size": block_size,
        "enable_prefix_caching": prefix,
    }
    if blocks is not None:
        engine["num_gpu_blocks"] = -(-blocks * 16 // block_size)  # preemptions
    data = tiny_experiment(scheduler=scheduler, engine=engine)
    data["workload"] = {**data["workload"], "num_requests": 20}
    check = _KVCheck(shared=prefix)
    with capture_engines() as engines:
        result = simulate_data(data, progress=check)
    assert check.checked >= result.summary["num_iterations"]
    kv = engines[0].kv_cache
    assert kv.num_free_blocks == kv.num_blocks  # nothing left at the end
    done = result.requests[result.requests["status"] == RequestStatus.FINISHED.name.lower()]
    assert (done["output_tokens"] == done["max_tokens"]).all()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("speculative", "message"),
    [
        (
            {"method": "draft", "num_speculative_tokens": 3, "acceptance_rate": 0.5},
            "engine.speculative.draft_model is required with method: draft",
        ),
        (
            {**spec("ngram"), "draft_model": DRAFT},
            "engine.speculative.draft_model applies to method: draft only, not ngram",
        ),
        (spec("ngram", 0), "engine.speculative.num_speculative_tokens must be >= 1, got 0"),
        (spec("ngram", 65), "engine.speculative.num_speculative_tokens must be <= 64, got 65"),
        (spec("ngram", 3, 1.5), "engine.speculative.acceptance_rate must be <= 1, got 1.5"),
        (spec("ngram", 3, float("nan")), "engine.speculative.acceptance_rate must be a finite"),
        (spec("ngram", 3, {"dist": "beta", "a": 2.0}), "b is required with dist: beta"),
        (
            spec("eagle", proposer_ms_per_token=-1.0),
            "engine.speculative.proposer_ms_per_token must be >= 0, got -1",
        ),
        ({**spec("ngram"), "method": "medusa"}, "engine.speculative.method"),
        (
            spec("draft", proposer_ms_per_token=1.0),
            "engine.speculative.proposer_ms_per_token does not apply to method: draft",
        ),
    ],
)
def test_bad_speculative_settings_are_one_line_errors(speculative, message):
    with pytest.raises(ConfigError) as info:
        validate_experiment(tiny_experiment(engine={"speculative": speculative}))
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"scheduler": {"policy": "static"}},
            "engine.speculative needs scheduler.policy continuous or chunked_prefill, got static",
        ),
        ({"model": "mistral-7b"}, "engine.speculative is not supported with a sliding-window"),
        (
            {"engine": {"speculative": {**spec("draft"), "draft_model": "no-such-model"}}},
            "engine.speculative.draft_model",
        ),
    ],
)
def test_settings_speculation_does_not_run_with_are_refused(overrides, message):
    data = spec_experiment()
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(data[key], dict) else value
    with pytest.raises(ConfigError) as info:
        deployment.engine_setup(validate_experiment(data))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_speculative_scheduler_is_a_builtin_policy_for_the_engine():
    with capture_engines() as engines:
        simulate_data(spec_experiment())
    assert isinstance(engines[0].scheduler, SpeculativeScheduler)
    assert not engines[0].guarded


def test_slots_rebuild_the_itl_of_output_chunks():
    # the timeline's slots sample one chunk per decode iteration: the ITL they rebuild is the
    # summary's, chunk by chunk
    from batchsim.plots.cdf import inter_token_gaps, token_times

    data = spec_experiment()
    data["metrics"] = {"record_slots": True}
    result = simulate_data(data)
    ids, times = token_times(result.slots, result.iterations)
    gaps = inter_token_gaps(ids, times)
    assert gaps.mean() * 1e3 == pytest.approx(result.summary["mean_itl_ms"], rel=1e-9)
    assert len(gaps) < result.summary["total_output_tokens"] - result.summary["completed"]


def test_bad_speculative_setting_exits_2_with_one_line(tmp_path, capsys):
    from batchsim import cli
    from batchsim.yamlio import dump

    path = tmp_path / "exp.yaml"
    path.write_text(dump(spec_experiment()), encoding="utf-8")
    code = cli.main(
        ["run", str(path), "-o", str(tmp_path / "out"), "--set", "scheduler.policy=static"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "engine.speculative needs scheduler.policy continuous or chunked_prefill" in err
    assert len(err.splitlines()) == 1
