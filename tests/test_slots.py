"""``metrics.record_slots``: which request sits in which batch slot (``slots.csv``).

Checked against the iteration log (slot occupancy equals ``num_seqs`` and ``num_slots`` at
every iteration), against the request log (a request samples a token in each of its
prefill and decode iterations, and the token times rebuilt from slots give the summary's ITL),
across fast-forward on and off, and under random experiments (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from test_invariants import experiments

import batchsim
from batchsim import cli
from batchsim.metrics.slots import SLOT_STATES, occupancy
from conftest import simulate_data, tiny_experiment

COMPUTING = ("prefill", "chunked_prefill", "decode")


def recorded(exp: dict[str, Any]) -> batchsim.Result:
    exp = copy.deepcopy(exp)
    exp["metrics"] = {**exp.get("metrics", {}), "record_slots": True}
    return simulate_data(exp)


def check_occupancy(result: batchsim.Result) -> dict[str, np.ndarray]:
    it = result.iteration_columns
    n = len(it["num_seqs"])
    slots = result.slot_columns
    assert slots is not None
    occ = occupancy(slots, n)
    busy = sum(occ[s] for s in COMPUTING)
    assert (busy == it["num_seqs"]).all()
    assert (busy + occ["padding"] + occ["empty"] == it["num_slots"]).all()
    # prefill-type slots are the iteration's prefill sequences, decode slots its decodes
    assert (occ["decode"] == it["num_decode_seqs"]).all()
    # a slot holds one run at a time: runs of one slot do not overlap
    frame = pd.DataFrame(slots).sort_values(["slot", "first_iteration"])
    for _, runs in frame.groupby("slot"):
        assert (
            runs["first_iteration"].to_numpy()[1:] > runs["last_iteration"].to_numpy()[:-1]
        ).all()
    assert set(frame["state"]) <= set(SLOT_STATES)
    return occ


def token_times(result: batchsim.Result) -> dict[int, list[float]]:
    """Each request's token times rebuilt from slots.csv and iterations.csv alone."""
    it = result.iterations
    end = (it["start_time_s"] + it["duration_ms"] / 1e3).to_numpy()
    times: dict[int, list[float]] = {}
    for row in result.slots.itertuples(index=False):
        if row.state in ("prefill", "decode"):
            span = end[row.first_iteration : row.last_iteration + 1]
            times.setdefault(int(row.request_id), []).extend(span.tolist())
    return {rid: sorted(t) for rid, t in times.items()}


@pytest.mark.parametrize(
    "overrides",
    [
        {"scheduler": {"policy": "static", "max_num_seqs": 8, "padding": True}},
        {"scheduler": {"policy": "static", "max_num_seqs": 8, "padding": False}},
        {"scheduler": {"policy": "dynamic", "max_num_seqs": 8, "max_wait_ms": 30}},
        {"scheduler": {"policy": "continuous", "max_num_seqs": 16}},
        {"scheduler": {"policy": "continuous", "max_num_seqs": 16, "mix_prefill_decode": True}},
        {"scheduler": {"policy": "chunked_prefill", "max_num_seqs": 16,
                       "max_num_batched_tokens": 64}},
        {"scheduler": {"policy": "continuous", "max_num_seqs": 16},
         "engine": {"num_gpu_blocks": 40}},
        {"scheduler": {"policy": "continuous", "max_num_seqs": 16, "preemption_mode": "swap"},
         "engine": {"num_gpu_blocks": 40}},
    ],
)  # fmt: skip
def test_slots_agree_with_the_iteration_and_request_logs(overrides):
    result = recorded(tiny_experiment(seed=4, **overrides))
    occ = check_occupancy(result)
    req = result.requests
    done = req[req["status"] == "finished"]
    times = token_times(result)
    for rid, n in zip(done["request_id"], done["output_tokens"]):
        assert len(times[rid]) == n  # one token per prefill or decode iteration
        first = done[done["request_id"] == rid]["first_token_time_s"].iloc[0]
        assert times[rid][0] == pytest.approx(first, abs=1e-9)
        last = done[done["request_id"] == rid]["finish_time_s"].iloc[0]
        assert times[rid][-1] == pytest.approx(last, abs=1e-9)
    gaps = np.concatenate([np.diff(times[rid]) for rid in done["request_id"]])
    assert gaps.mean() * 1e3 == pytest.approx(result.summary["mean_itl_ms"], rel=1e-9)
    policy = overrides["scheduler"]["policy"]
    if policy == "static":
        assert occ["padding" if overrides["scheduler"]["padding"] else "empty"].sum() > 0
    if policy == "chunked_prefill":
        assert occ["chunked_prefill"].sum() > 0
    if policy == "continuous" and not overrides["scheduler"].get("mix_prefill_decode"):
        assert occ["stalled"].sum() > 0  # decodes wait out prefill-only iterations


def test_a_static_batch_keeps_its_slots_until_it_ends():
    exp = tiny_experiment(scheduler={"policy": "static", "max_num_seqs": 4, "padding": False})
    exp["workload"] = {**exp["workload"], "num_requests": 8, "arrival": {"process": "all_at_once"}}
    result = recorded(exp)
    slots = result.slots
    assert set(slots["slot"]) == {0, 1, 2, 3}
    # the first batch holds requests 0-3 in slots 0-3; slots of finished ones turn empty
    first = slots[slots["request_id"].isin([0, 1, 2, 3])]
    assert sorted(set(first["slot"])) == [0, 1, 2, 3]
    assert (first.groupby("request_id")["slot"].nunique() == 1).all()
    assert "empty" in set(first["state"])


def test_fast_forward_records_the_same_slots():
    exp = tiny_experiment(seed=2, scheduler={"policy": "continuous", "max_num_seqs": 8})
    fast = recorded(exp).slots
    slow = recorded({**exp, "engine": {"fast_forward": False}}).slots
    pd.testing.assert_frame_equal(fast, slow)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(experiments())
def test_slot_occupancy_matches_the_iteration_log_for_any_experiment(exp):
    check_occupancy(recorded(exp))


def test_slots_csv_is_written_only_when_recorded(tmp_path, capsys):
    exp = tiny_experiment()
    path = tmp_path / "e.yaml"
    import yaml

    path.write_text(yaml.safe_dump(exp), encoding="utf-8")
    out = tmp_path / "run"
    assert cli.main(["run", str(path), "-o", str(out), "--set", "metrics.record_slots=true"]) == 0
    slots = pd.read_csv(out / "slots.csv")
    assert list(slots.columns) == [
        "slot",
        "request_id",
        "state",
        "first_iteration",
        "last_iteration",
    ]
    assert (slots["last_iteration"] >= slots["first_iteration"]).all()
    # rerun into the same folder without recording: the stale slots.csv goes
    assert cli.main(["run", str(path), "-o", str(out)]) == 0
    assert not (out / "slots.csv").exists()
    assert batchsim.run(exp).slot_columns is None
