"""Claims about prefix-structured workloads: the segments and prompts of shared prefixes,
multi-turn conversations and csv prefix columns match hand-computed ones, prefix popularity
follows its distribution, conversations arrive in order through a real engine run (a next
turn only after the previous one left plus think time; a rejected or cancelled turn ends its
conversation), and the same seed gives the same tables.

Statistical claims compare large samples with closed forms within several standard errors.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsim.config import validate_experiment
from batchsim.simulation import Result, simulate
from batchsim.workload import RequestTable, generate, parse_workload
from conftest import assert_same_run, tiny_experiment

Z = 5.0  # tolerance in standard errors


def fixed(value: int) -> dict[str, Any]:
    return {"dist": "fixed", "value": value}


def uniform(lo: int, hi: int) -> dict[str, Any]:
    return {"dist": "uniform", "min": lo, "max": hi}


def table(seed: int = 0, **workload: Any) -> RequestTable:
    return generate(parse_workload(workload), seed)


def segments(t: RequestTable) -> list[Any]:
    """Each request's segments (None: shares nothing)."""
    prefix = t.prefix
    return [None if prefix is None else prefix.segments(i) for i in range(len(t))]


OPEN = {"arrival": {"process": "poisson", "rate": 10.0}}


# ------------------------------------------------------------------------------------------
# Shared prefixes


def test_every_request_starts_with_the_one_prefix_its_weights_allow() -> None:
    base = table(num_requests=50, **OPEN, prompt_tokens=uniform(10, 90), output_tokens=4)
    shared = {"count": 3, "tokens": 100, "popularity": [0, 1, 0]}
    t = table(
        num_requests=50,
        **OPEN,
        prompt_tokens=uniform(10, 90),
        output_tokens=4,
        shared_prefix=shared,
    )
    assert segments(t) == [((1, 100),)] * 50
    # the prompt is the prefix, then the request's own tokens (drawn as without the prefix)
    np.testing.assert_array_equal(t.prompt_tokens, base.prompt_tokens + 100)
    np.testing.assert_array_equal(t.arrival_time, base.arrival_time)
    np.testing.assert_array_equal(t.output_tokens, base.output_tokens)


def test_prefix_lengths_are_drawn_once_per_prefix_and_fit_in_the_prompt() -> None:
    shared = {"count": 20, "tokens": uniform(1, 5000)}
    t = table(
        num_requests=2000, **OPEN, prompt_tokens=fixed(7), output_tokens=1, shared_prefix=shared
    )
    length_of: dict[int, int] = {}
    for segs, prompt in zip(segments(t), t.prompt_tokens.tolist(), strict=True):
        ((content, tokens),) = segs
        assert 0 <= content < 20
        assert length_of.setdefault(content, tokens) == tokens  # one length per prefix
        assert prompt == tokens + 7
    assert len(length_of) == 20
    assert len(set(length_of.values())) > 10  # drawn, not one value for all


def test_fraction_zero_shares_nothing_and_a_larger_fraction_only_adds_prefixes() -> None:
    def with_fraction(f: float) -> list[Any]:
        shared = {"count": 4, "tokens": 50, "fraction": f}
        t = table(
            num_requests=400, **OPEN, prompt_tokens=fixed(10), output_tokens=1, shared_prefix=shared
        )
        return segments(t)

    assert with_fraction(0.0) == [None] * 400
    low, high = with_fraction(0.3), with_fraction(0.7)
    for a, b in zip(low, high, strict=True):
        assert a is None or a == b  # a request keeps its prefix when the fraction grows
    n_low = sum(s is not None for s in low)
    n_high = sum(s is not None for s in high)
    assert n_low < n_high
    assert abs(n_low / 400 - 0.3) <= Z * math.sqrt(0.3 * 0.7 / 400)


def chi_square_limit(df: int, z: float = Z) -> float:
    """Upper ``z``-sigma quantile of chi-square(df) (Wilson-Hilferty cube-root normal form)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


@pytest.mark.parametrize(
    ("popularity", "count"),
    [("uniform", 7), ({"zipf": 1.2}, 50), ({"zipf": 0.0}, 5), ([3, 0, 1, 6], 4)],
    ids=["uniform", "zipf-1.2", "zipf-0", "weights"],
)
def test_prefix_popularity_follows_its_distribution(popularity: Any, count: int) -> None:
    n = 200_000
    shared = {"count": count, "tokens": 10, "popularity": popularity}
    t = table(
        num_requests=n,
        arrival="all_at_once",
        prompt_tokens=1,
        output_tokens=1,
        shared_prefix=shared,
    )
    assert t.prefix is not None
    observed = np.bincount(t.prefix.ids, minlength=count)
    k = np.arange(1, count + 1, dtype=float)
    if popularity == "uniform":
        weights = np.ones(count)
    elif isinstance(popularity, dict):
        weights = k ** -popularity["zipf"]  # P(prefix k - 1) proportional to k^-s
    else:
        weights = np.array(popularity, dtype=float)
    expected = n * weights / weights.sum()
    assert observed[expected == 0].sum() == 0  # a weight of 0: never picked
    used = expected > 0
    chi2 = float((((observed - expected) ** 2)[used] / expected[used]).sum())
    assert chi2 < chi_square_limit(int(used.sum()) - 1)


# ------------------------------------------------------------------------------------------
# Conversations


def test_conversation_segments_and_prompts_by_hand() -> None:
    t = table(
        num_requests=7,
        concurrency=2,
        prompt_tokens=10,
        output_tokens=5,
        conversation={"turns": 3},
        shared_prefix={"count": 1, "tokens": 100},
    )
    # conversations of 3, 3 and 1 turns (the last one cut to fit 7 requests)
    assert t.next_turn is not None and t.next_turn.tolist() == [1, 2, -1, 4, 5, -1, -1]
    # each turn: system prompt (id 0), the history, its new 10 tokens; its reply of 5 last
    assert t.prompt_tokens.tolist() == [110, 125, 140, 110, 125, 140, 110]
    assert segments(t) == [
        ((0, 100), (1, 10), (2, 5)),
        ((0, 100), (1, 10), (2, 5), (3, 10), (4, 5)),
        ((0, 100), (1, 10), (2, 5), (3, 10), (4, 5), (5, 10), (6, 5)),
        ((0, 100), (7, 10), (8, 5)),
        ((0, 100), (7, 10), (8, 5), (9, 10), (10, 5)),
        ((0, 100), (7, 10), (8, 5), (9, 10), (10, 5), (11, 10), (12, 5)),
        ((0, 100), (13, 10), (14, 5)),
    ]
    assert np.isnan(t.arrival_time).all()  # closed loop: the engine decides
    assert t.think_time is not None and np.all(t.think_time == 0)


def conversations_of(t: RequestTable) -> list[list[int]]:
    """The requests of each conversation, in turn order, followed through ``next_turn``."""
    assert t.next_turn is not None
    nxt = t.next_turn.tolist()
    named = {j for j in nxt if j >= 0}
    out = []
    for first in range(len(t)):
        if first in named:
            continue
        chain = [first]
        while nxt[chain[-1]] >= 0:
            chain.append(nxt[chain[-1]])
        out.append(chain)
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    turns=st.sampled_from(
        [fixed(1), fixed(4), uniform(1, 9), {"dist": "zipf", "theta": 1.0, "max": 30}]
    ),
    shared=st.sampled_from([None, {"count": 3, "tokens": uniform(5, 500), "fraction": 0.6}]),
)
def test_a_turns_prompt_is_the_running_sum_of_its_conversation(
    n: int, seed: int, turns: Any, shared: Any
) -> None:
    workload: dict[str, Any] = {
        "num_requests": n,
        **OPEN,
        "prompt_tokens": uniform(1, 400),
        "output_tokens": uniform(1, 300),
        "conversation": {"turns": turns},
    }
    if shared is not None:
        workload["shared_prefix"] = shared
    t = table(seed, **workload)
    convs = conversations_of(t)
    assert sorted(i for c in convs for i in c) == list(range(n))  # every request once
    segs = segments(t)
    first_ids = set()
    for chain in convs:
        assert chain == list(range(chain[0], chain[0] + len(chain)))  # listed in order
        system = segs[chain[0]][0][1] if len(segs[chain[0]]) % 2 else 0
        history = 0
        for k, i in enumerate(chain):
            own, reply = segs[i][-2], segs[i][-1]
            assert reply[1] == t.output_tokens[i]
            assert t.prompt_tokens[i] == system + history + own[1]
            assert len(segs[i]) == 2 * (k + 1) + (system > 0)
            # the segments cover the whole sequence: the prompt, then the reply
            assert sum(s[1] for s in segs[i]) == t.prompt_tokens[i] + t.output_tokens[i]
            if k:  # a turn's segments start with all of the previous turn's
                previous = segs[chain[k - 1]]
                assert segs[i][: len(previous)] == previous
            history += own[1] + reply[1]
        first_ids.add(segs[chain[0]][-2][0])
    # messages and replies have ids of their own: only system prompts repeat across
    # conversations
    owners = defaultdict(set)
    for chain in convs:
        for i in chain:
            for content, _ in segs[i][1 if len(segs[i]) % 2 else 0 :]:
                owners[content].add(chain[0])
    assert all(len(c) == 1 for c in owners.values())
    if shared is not None:
        system_ids = {s[0][0] for s in segs if len(s) % 2}
        assert system_ids <= {0, 1, 2} and not system_ids & set(owners)


def test_num_requests_counts_turns_and_turns_follow_their_distribution() -> None:
    n = 60_000
    t = table(
        num_requests=n,
        **OPEN,
        prompt_tokens=1,
        output_tokens=1,
        conversation={"turns": uniform(1, 9)},
    )
    lengths = np.array([len(c) for c in conversations_of(t)])
    assert lengths.sum() == n == len(t)
    whole = lengths[:-1]  # the last conversation may be cut short
    assert whole.min() >= 1 and whole.max() <= 9
    assert abs(whole.mean() - 5.0) <= Z * math.sqrt((9 * 9 - 1) / 12 / len(whole))
    # open loop: conversations start at the arrival process's times, later turns are NaN
    firsts = [c[0] for c in conversations_of(t)]
    assert not np.isnan(t.arrival_time[firsts]).any()
    assert np.all(np.diff(t.arrival_time[firsts]) >= 0)
    assert np.isnan(np.delete(t.arrival_time, firsts)).all()


def test_a_conversation_cut_by_num_requests_keeps_its_first_turns() -> None:
    t = table(num_requests=10, **OPEN, prompt_tokens=3, output_tokens=2, conversation={"turns": 4})
    assert [len(c) for c in conversations_of(t)] == [4, 4, 2]
    assert t.prompt_tokens.tolist() == [3, 8, 13, 18] * 2 + [3, 8]


# ------------------------------------------------------------------------------------------
# CSV trace prefix columns


def test_csv_prefix_columns_become_one_segment_per_row(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "arrival_time,prompt_tokens,output_tokens,tenant,shared\n"
        "0,100,5,sys-a,40\n1,50,5,7,50\n2,80,5,sys-a,30\n3,90,5,,0\n4,60,4,7,10\n",
        encoding="utf-8",
    )
    columns = {"prefix_group": "tenant", "prefix_tokens": "shared"}
    t = table(trace={"path": str(path), "format": "csv", "columns": columns})
    # groups numbered in order of first appearance; a shorter length shares less of the group
    assert segments(t) == [((0, 40),), ((1, 50),), ((0, 30),), None, ((1, 10),)]
    assert t.prompt_tokens.tolist() == [100, 50, 80, 90, 60]
    # reading only the first rows numbers their groups as reading the whole file does
    part = table(num_requests=3, trace={"path": str(path), "format": "csv", "columns": columns})
    assert segments(part) == segments(t)[:3]


def test_mooncake_ids_become_512_token_segments() -> None:
    t = table(num_requests=200, trace={"path": "mooncake_synthetic_sample.jsonl"})
    for segs, prompt in zip(segments(t), t.prompt_tokens.tolist(), strict=True):
        assert segs is not None
        lengths = [tokens for _, tokens in segs]
        assert all(x == 512 for x in lengths[:-1])
        assert sum(lengths) == min(prompt, 512 * len(lengths))


# ------------------------------------------------------------------------------------------
# Seeds


@pytest.mark.parametrize("loop", [OPEN, {"concurrency": 3}])
def test_same_seed_gives_identical_tables_and_another_seed_differs(loop: dict) -> None:
    workload = {
        "num_requests": 300,
        **loop,
        "prompt_tokens": uniform(1, 300),
        "output_tokens": uniform(1, 100),
        "think_time_ms": {"dist": "exponential", "mean": 100},
        "conversation": {"turns": uniform(1, 6)},
        "shared_prefix": {"count": 5, "tokens": uniform(10, 900), "popularity": {"zipf": 1}},
    }

    def arrays(t: RequestTable) -> list[bytes]:
        assert t.prefix is not None and t.next_turn is not None and t.think_time is not None
        parts = [t.arrival_time, t.prompt_tokens, t.output_tokens, t.think_time, t.next_turn]
        parts += [t.prefix.ids, t.prefix.tokens, t.prefix.offsets]
        return [np.asarray(p).tobytes() for p in parts]

    assert arrays(table(4, **workload)) == arrays(table(4, **workload))
    assert arrays(table(4, **workload)) != arrays(table(5, **workload))


# ------------------------------------------------------------------------------------------
# Conversations through the engine


def run_conversations(loop: dict[str, Any], **extra: Any) -> tuple[RequestTable, Result]:
    data = tiny_experiment()
    data["workload"] = {
        "num_requests": 120,
        **loop,
        "think_time_ms": {"dist": "exponential", "mean": 400},
        "prompt_tokens": uniform(20, 200),
        "output_tokens": uniform(4, 60),
        "conversation": {"turns": uniform(1, 6)},
        "shared_prefix": {"count": 2, "tokens": 300},
    }
    for key, value in extra.items():
        section, name = key.split("__")
        data.setdefault(section, {})[name] = value
    cfg = validate_experiment(data)
    return generate(cfg.workload, cfg.seed), simulate(cfg)


def requests_by_id(result: Result) -> pd.DataFrame:
    return result.requests.set_index("request_id").sort_index()


def check_turns_follow_their_previous_turn(t: RequestTable, req: pd.DataFrame) -> None:
    """Each next turn arrives exactly think time after its previous turn finished; a turn
    that did not finish has no next turn in the run; a conversation's turns arrive in order."""
    assert t.next_turn is not None and t.think_time is not None
    for chain in conversations_of(t):
        arrived = [i for i in chain if i in req.index]
        assert arrived == chain[: len(arrived)] and arrived  # a first part of the turns
        for a, b in itertools.pairwise(arrived):
            assert req.loc[a, "status"] == "finished"
            assert req.loc[b, "arrival_time_s"] == req.loc[a, "finish_time_s"] + t.think_time[b]
        if len(arrived) < len(chain):  # cut short: its last turn that came did not finish
            assert req.loc[arrived[-1], "status"] != "finished"


def test_closed_loop_users_run_one_conversation_after_another() -> None:
    users = 3
    t, result = run_conversations({"concurrency": users})
    req = requests_by_id(result)
    assert (req["status"] == "finished").all() and len(req) == len(t)
    check_turns_follow_their_previous_turn(t, req)
    convs = conversations_of(t)
    start = np.array([req.loc[c[0], "arrival_time_s"] for c in convs])
    end = np.array([req.loc[c[-1], "finish_time_s"] for c in convs])
    assert np.all(start[:users] == 0.0)
    # the conversation after the first `users` ones starts when a user is free: the k-th one
    # to start (in table order) follows the k-th conversation to end, by the think time
    think = t.think_time
    assert think is not None
    expected = np.sort(end)[: len(convs) - users] + think[[c[0] for c in convs[users:]]]
    np.testing.assert_array_equal(start[users:], expected)
    # never more conversations (so requests) in progress than users
    events = sorted([(s, 1) for s in start] + [(e, -1) for e in end])
    in_progress = np.cumsum([d for _, d in events])
    assert in_progress.max() == users


def test_open_loop_conversations_start_at_the_arrival_times_of_the_table() -> None:
    t, result = run_conversations({"arrival": {"process": "poisson", "rate": 3.0}})
    req = requests_by_id(result)
    assert (req["status"] == "finished").all() and len(req) == len(t)
    check_turns_follow_their_previous_turn(t, req)
    firsts = [c[0] for c in conversations_of(t)]
    np.testing.assert_array_equal(req.loc[firsts, "arrival_time_s"], t.arrival_time[firsts])
    assert np.isnan(result.summary["request_rate"])  # conversation starts are not requests


@pytest.mark.parametrize(
    "loop", [{"concurrency": 3}, {"arrival": {"process": "poisson", "rate": 3.0}}]
)
def test_a_rejected_turn_ends_its_conversation(loop: dict[str, Any]) -> None:
    # contexts grow by up to 260 tokens a turn: later turns outgrow a 1000-token model
    t, result = run_conversations(loop, engine__max_model_len=1000)
    req = requests_by_id(result)
    assert (req["status"] == "rejected").sum() >= 5
    assert len(req) < len(t)  # the turns after a rejected one never came
    check_turns_follow_their_previous_turn(t, req)
    if "concurrency" in loop:  # every conversation still started: users move on
        firsts = {c[0] for c in conversations_of(t)}
        assert firsts <= set(req.index)


@pytest.mark.parametrize(
    "loop", [{"concurrency": 3}, {"arrival": {"process": "poisson", "rate": 3.0}}]
)
def test_a_cancelled_turn_ends_its_conversation(loop: dict[str, Any]) -> None:
    t, result = run_conversations(loop, workload__cancel_after_ms=fixed(1))
    req = requests_by_id(result)
    # every first turn is cancelled before its 4+ tokens: no second turn is ever sent
    firsts = [c[0] for c in conversations_of(t)]
    assert req.index.tolist() == firsts
    assert (req["status"] == "cancelled").all()


@pytest.mark.parametrize(
    "loop", [{"concurrency": 4}, {"arrival": {"process": "poisson", "rate": 4.0}}]
)
def test_fast_forward_off_gives_the_same_conversation_run(loop: dict[str, Any]) -> None:
    _, fast = run_conversations(loop)
    _, slow = run_conversations(loop, engine__fast_forward=False)
    assert_same_run(fast, slow)


@pytest.mark.parametrize("popularity", ["uniform", {"zipf": 1.5}, [1, 0, 2.5]])
def test_the_resolved_config_reads_back_as_the_same_workload(popularity: Any) -> None:
    # config.yaml holds model_dump(mode="json"); sweep points hand model_dump() to workers
    cfg = parse_workload(
        {
            "num_requests": 5,
            "concurrency": 2,
            "prompt_tokens": 4,
            "output_tokens": 2,
            "conversation": {"turns": uniform(1, 3)},
            "shared_prefix": {"count": 3, "tokens": 8, "popularity": popularity},
        }
    )
    for dumped in (cfg.model_dump(mode="json"), cfg.model_dump()):
        assert parse_workload(dumped) == cfg
