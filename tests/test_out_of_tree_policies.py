"""Policies written outside batchsim (``package.module:Class``): fast-forward is something a
policy opts into, and the engine guards progress and names the policy that broke a rule."""

from __future__ import annotations

import gc
import sys
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import batchsim
from batchsim import cli
from batchsim.engine import engine as engine_module
from batchsim.engine.collector import GC_THRESHOLD
from batchsim.engine.repeat import stretches_allowed
from batchsim.scheduler import POLICIES, Scheduler
from batchsim.scheduler.continuous import ContinuousScheduler
from conftest import (
    assert_same_clock,
    assert_same_run,
    capture_engines,
    simulate_data,
    tiny_experiment,
)

POLICY_MODULE = '''
import math

from batchsim.scheduler import Scheduler
from batchsim.scheduler.continuous import ContinuousScheduler
from batchsim.scheduler.fast_forward import fast_forward


def admit_all(self):
    """Admit every waiting request that fits; return them."""
    admitted = []
    while self.waiting and len(self.running) < self.max_num_seqs:
        head = self.waiting[0]
        if not self.kv_cache.allocate(head, head.num_tokens, admission=True):
            break
        self.admit(head)
        admitted.append(head)
    return admitted


class TwoFewestOutputs(Scheduler):
    """Prefill first; then decode only the two running requests with the fewest outputs."""

    def schedule(self, now):
        new = admit_all(self)
        if new:
            return self.make_output(new, [r.num_remaining_tokens for r in new])
        chosen = sorted(self.running, key=lambda r: (r.num_output_tokens, r.request_id))[:2]
        requests, tokens, preempted = [], [], []
        for r in chosen:
            if self.allocate_or_preempt(r, r.num_computed_tokens + 1, preempted):
                requests.append(r)
                tokens.append(1)
        return self.make_output(requests, tokens, preempted=preempted)


class TwoFewestOutputsContinuous(ContinuousScheduler):
    """The same choice, inheriting from a built-in policy that may be fast-forwarded."""

    schedule = TwoFewestOutputs.schedule


class NumpyTokens(Scheduler):
    """TwoFewestOutputs with token counts as numpy integers (as a policy that computes its
    budget with numpy would give them)."""

    def schedule(self, now):
        import numpy as np

        output = TwoFewestOutputs.schedule(self, now)
        tokens = [np.int64(q) for q in output.num_scheduled_tokens]
        return self.make_output(output.requests, tokens, preempted=output.preempted)


@fast_forward(decode_stretches=True)
class NumpyRepeat(ContinuousScheduler):
    """DeclaredContinuous, its promise given as a numpy integer."""

    def schedule(self, now):
        return super().schedule(now)

    def policy_max_repeat(self, output):
        import numpy as np

        return np.int64(super().policy_max_repeat(output))


class FloatRepeat(NumpyRepeat):
    def policy_max_repeat(self, output):
        return 2.5


class StartsAtOneSecond(Scheduler):
    """TwoFewestOutputs from t = 1 s on, waking itself with a numpy integer timer."""

    def schedule(self, now):
        if now < 1:
            return self.make_output([], [])
        return TwoFewestOutputs.schedule(self, now)

    def next_timer(self, now):
        import numpy as np

        return np.int64(1) if now < 1 else None


class FloatTokens(Scheduler):
    def schedule(self, now):
        new = admit_all(self)
        return self.make_output(new, [1.5 for r in new])


@fast_forward(decode_stretches=True)
class DeclaredContinuous(ContinuousScheduler):
    """A continuous policy that re-declares the promise after overriding schedule()."""

    def schedule(self, now):
        return super().schedule(now)


class Raises(Scheduler):
    def schedule(self, now):
        return 1 / 0


class ReturnsNone(Scheduler):
    def schedule(self, now):
        return None


class TooManyTokens(Scheduler):
    def schedule(self, now):
        new = admit_all(self)
        return self.make_output(new, [r.num_remaining_tokens + 5 for r in new])


class ZeroTokens(Scheduler):
    def schedule(self, now):
        new = admit_all(self)
        return self.make_output(new, [0 for r in new])


class NotAdmitted(Scheduler):
    def schedule(self, now):
        waiting = list(self.waiting)[:1]
        return self.make_output(waiting, [r.num_remaining_tokens for r in waiting])


class NoBlocks(Scheduler):
    def schedule(self, now):
        if self.waiting:
            self.admit(self.waiting[0])
        first = self.running[:1]
        return self.make_output(first, [r.num_remaining_tokens for r in first])


class FrozenTimer(Scheduler):
    def schedule(self, now):
        return self.make_output([], [])

    def next_timer(self, now):
        return now


class NanTimer(FrozenTimer):
    def next_timer(self, now):
        return math.nan


class Idle(Scheduler):
    def schedule(self, now):
        return self.make_output([], [])


class CreepingTimer(FrozenTimer):
    def next_timer(self, now):
        return now + 1e-3


class Recomputes(Scheduler):
    """Computes one prompt token, then preempts the request: no token is ever sampled."""

    def schedule(self, now):
        preempted = [r for r in list(self.running)]
        for r in preempted:
            self.preempt(r)
        new = admit_all(self)
        return self.make_output(new[:1], [1] * len(new[:1]), preempted=preempted)


class InitRaises(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        raise ValueError("no such option")

    def schedule(self, now):
        return self.make_output([], [])


class FloatCap(ContinuousScheduler):
    """Sets max_num_seqs, which Scheduler declares an int, to a float."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_num_seqs = 8.0


class RejectRaises(Scheduler):
    def policy_reject_reason(self, request):
        raise KeyError("boom")

    def schedule(self, now):
        return self.make_output([], [])
'''


@pytest.fixture
def policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "oot_policies.py").write_text(POLICY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "oot_policies"
    sys.modules.pop("oot_policies", None)


def four_at_once(policy: str, **engine: Any) -> dict[str, Any]:
    exp = tiny_experiment(scheduler={"policy": policy, "max_num_seqs": 4})
    exp["workload"] = {
        "num_requests": 4,
        "arrival": {"process": "all_at_once"},
        "prompt_tokens": {"dist": "fixed", "value": 100},
        "output_tokens": {"dist": "fixed", "value": 20},
    }
    exp["engine"] = engine
    return exp


@pytest.mark.parametrize("name", ["TwoFewestOutputs", "TwoFewestOutputsContinuous"])
def test_a_policy_that_picks_two_of_four_decodes_is_not_fast_forwarded(policies, name):
    fast = batchsim.run(four_at_once(f"{policies}:{name}"))
    slow = batchsim.run(four_at_once(f"{policies}:{name}", fast_forward=False))
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)
    # Brute force: iteration 0 prefills all four (first tokens); then pairs {0,1} and {2,3}
    # alternate, each request decoding its 19 other tokens every second iteration.
    it = fast.iterations
    assert len(it) == 1 + 4 * 19 // 2 and (it["num_seqs"].iloc[1:] == 2).all()
    ends = (it["start_time_s"] + it["duration_ms"] / 1e3).to_numpy()
    finish = fast.requests.set_index("request_id")["finish_time_s"]
    np.testing.assert_allclose(finish[[0, 1]], ends[37], rtol=1e-12)
    np.testing.assert_allclose(finish[[2, 3]], ends[38], rtol=1e-12)
    # every token after the first comes two decode iterations after the previous one
    decode = it["duration_ms"].iloc[2:].to_numpy()
    assert fast.summary["p99_itl_ms"] <= 2 * decode.max() + 1e-9
    assert fast.summary["median_itl_ms"] >= 2 * decode.min() - 1e-9


def test_a_policy_may_count_tokens_in_numpy_integers(policies):
    # The same iterations as with python ints (the engine, compiled or not, computes with
    # python ints; a policy need not know that).
    ints = batchsim.run(four_at_once(f"{policies}:TwoFewestOutputs"))
    numpy_ints = batchsim.run(four_at_once(f"{policies}:NumpyTokens"))
    assert_same_run(numpy_ints, ints)
    assert_same_clock(numpy_ints, ints)


def test_a_policy_may_promise_repeats_in_numpy_integers(policies):
    exp = tiny_experiment(scheduler={"policy": f"{policies}:NumpyRepeat"})
    with capture_engines() as engines:
        numpy_ints = batchsim.run(exp)
    assert engines[0].stretch.num_stretches > 0
    declared = {**exp["scheduler"], "policy": f"{policies}:DeclaredContinuous"}
    ints = batchsim.run({**exp, "scheduler": declared})
    assert_same_run(numpy_ints, ints)
    assert_same_clock(numpy_ints, ints)


def test_a_policy_may_set_its_timer_in_numpy_integers(policies):
    result = batchsim.run(four_at_once(f"{policies}:StartsAtOneSecond"))
    assert (result.requests["status"] == "finished").all()
    assert result.iterations["start_time_s"].iloc[0] == 1.0  # woken at its timer, exactly


def test_only_policies_that_declare_it_with_their_schedule_are_fast_forwarded(policies):
    import importlib

    module = importlib.import_module(policies)
    assert all(stretches_allowed(cls) for cls in POLICIES.values())
    assert not stretches_allowed(module.TwoFewestOutputs)  # the default
    assert not stretches_allowed(module.TwoFewestOutputsContinuous)  # overrides schedule()
    assert stretches_allowed(module.DeclaredContinuous)  # declares it again
    assert stretches_allowed(ContinuousScheduler) and not stretches_allowed(Scheduler)


def test_a_policy_that_declares_decode_stretches_is_fast_forwarded_exactly(policies):
    exp = tiny_experiment(scheduler={"policy": f"{policies}:DeclaredContinuous"})
    with capture_engines() as engines:
        fast = batchsim.run(exp)
    assert engines[0].stretch.num_stretches > 0
    slow = batchsim.run({**exp, "engine": {"fast_forward": False}})
    assert_same_run(fast, slow)
    assert_same_clock(fast, slow)


def test_a_policy_written_elsewhere_runs_with_the_collector_on_rarely(policies):
    # it might make reference cycles at every iteration: they are still collected
    seen: list[tuple[bool, int]] = []
    schedule = Scheduler.schedule_iteration

    def spy(scheduler: Scheduler, now: float) -> Any:
        seen.append((gc.isenabled(), gc.get_threshold()[0]))
        return schedule(scheduler, now)

    with mock.patch.object(Scheduler, "schedule_iteration", spy):
        simulate_data(four_at_once(f"{policies}:TwoFewestOutputs"))
    assert seen and set(seen) == {(True, GC_THRESHOLD)}


def run_cli(policy: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        textwrap.dedent(
            f"""\
            name: oot
            hardware: a100-80gb
            model: llama-2-7b
            scheduler: {{policy: "{policy}", max_num_seqs: 4}}
            workload:
              num_requests: 3
              arrival: {{process: poisson, rate: 5}}
              prompt_tokens: {{dist: fixed, value: 50}}
              output_tokens: {{dist: fixed, value: 4}}
            """
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    code = cli.main(["run", str(exp), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 0 or not out.exists(), "nothing is written for a broken policy"
    return code, err


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("Raises", "schedule() raised ZeroDivisionError: division by zero (at "),
        ("ReturnsNone", "schedule() returned NoneType, not a SchedulerOutput"),
        ("TooManyTokens", "tokens for request 0, which has only 50 to compute"),
        ("ZeroTokens", "scheduled 0 tokens for request 0"),
        ("FloatTokens", "scheduled 1.5 tokens for request 0; each scheduled request computes"),
        ("FloatRepeat", "policy_max_repeat() returned 2.5; it must return an integer"),
        ("NotAdmitted", "request 0, which is waiting, not running"),
        ("NoBlocks", "without the KV blocks to hold them"),
        ("FrozenTimer", "next_timer() returned"),
        ("NanTimer", "next_timer() returned nan"),
        ("Idle", "scheduled nothing and set no timer"),
        ("RejectRaises", "add_request() raised KeyError: 'boom'"),
        ("InitRaises", "__init__() raised ValueError: no such option (at "),
    ],
)
def test_a_policy_that_breaks_a_rule_stops_the_run_naming_it(
    policies, tmp_path, capsys, name, says
):
    thresholds = gc.get_threshold()
    code, err = run_cli(f"{policies}:{name}", tmp_path, capsys)
    assert gc.get_threshold() == thresholds  # the engine's rare collections end with it
    assert gc.isenabled()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"batchsim: error: scheduler.policy {policies}:{name}: "), err
    assert says in lines[0], err
    assert "Traceback" not in err and "internal error" not in err


def test_a_policy_that_sets_a_declared_attribute_to_another_type_runs_or_is_named(
    policies, tmp_path, capsys
):
    # Pure Python takes max_num_seqs = 8.0 as it comes; the compiled build checks the types
    # of the attributes Scheduler declares and raises. Either way: never an internal error.
    from batchsim.scheduler import interface

    compiled = not interface.__file__.endswith(".py")
    code, err = run_cli(f"{policies}:FloatCap", tmp_path, capsys)
    if code == 0:
        assert not compiled, "the compiled build took a float for an int attribute"
        return
    assert compiled, err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(
        f"batchsim: error: scheduler.policy {policies}:FloatCap: __init__() raised TypeError: "
    ), err
    assert "oot_policies.py:" in lines[0], err


@pytest.mark.parametrize(
    ("name", "constant", "says"),
    [
        ("CreepingTimer", "MAX_IDLE_WAKEUPS", "times in a row on its timer"),
        ("Recomputes", "MAX_STEPS_WITHOUT_TOKEN", "without any request sampling a token"),
    ],
)
def test_a_policy_that_stops_making_progress_is_stopped(
    policies, tmp_path, capsys, monkeypatch, name, constant, says
):
    monkeypatch.setattr(engine_module, constant, 200)
    code, err = run_cli(f"{policies}:{name}", tmp_path, capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_built_in_policy_calls_the_helpers_a_subclass_overrides():
    # The built-in policies schedule their running decodes as one cohort, without calling
    # schedule_running() and make_output() for them; a subclass that overrides either one
    # still has it called at every iteration, as before.
    calls = {"schedule_running": 0, "make_output": 0}

    class Counting(ContinuousScheduler):
        def schedule_running(self, token_budget, preempted):
            calls["schedule_running"] += 1
            return super().schedule_running(token_budget, preempted)

        def make_output(self, requests, num_tokens, **kwargs):
            calls["make_output"] += 1
            return super().make_output(requests, num_tokens, **kwargs)

    module = type(sys)("counting_policy")
    module.Counting = Counting  # type: ignore[attr-defined]
    exp = tiny_experiment(scheduler={"policy": "counting_policy:Counting", "max_num_seqs": 8})
    exp["engine"] = {"fast_forward": False}
    with mock.patch.dict(sys.modules, {"counting_policy": module}):
        result = batchsim.run(exp)
    decodes = int((result.iterations["num_decode_seqs"] > 0).sum())
    assert decodes > 0
    assert calls["make_output"] >= result.summary["num_iterations"]  # every iteration's
    assert calls["schedule_running"] >= decodes
