"""Many replicas behind a router (``cluster:``): routers on their own, then whole runs.

Expected values come from elsewhere than the code under test: queueing theory (random routing
thins a Poisson stream into N Poisson streams, each an M/D/1 queue here), a plain one-engine
run, brute-force reconstruction from the requests table, or the routers' definitions.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from test_queueing_theory import FIXED_PROMPT, ONE_TOKEN, poisson, queue_delays_s, single_server

from batchsim import cli
from batchsim.cluster.config import ClusterConfig
from batchsim.cluster.router import ROUTERS, make_router, router_rng
from batchsim.config import validate_experiment
from batchsim.engine.kv_cache import KVCacheManager
from batchsim.errors import ConfigError, RouterError
from batchsim.outputs import ALL_OUTPUT_FILES
from batchsim.simulation import Result, simulate
from conftest import assert_same_clock, assert_same_run, assert_summaries_match, tiny_experiment


def sim(data: dict[str, Any]) -> Result:
    return simulate(validate_experiment(data))


def with_cluster(data: dict[str, Any], **cluster: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    out["cluster"] = cluster
    return out


# ------------------------------------------------------------------ routers on their own


class FakeView:
    """What a router reads of a replica, set by the test."""

    def __init__(self, index: int, outstanding: int = 0, kv: float = 0.0, cached: int = 0):
        self.index = index
        self.outstanding = outstanding
        self.running = outstanding
        self.waiting = self.swapped = 0
        self.kv_cache_usage = kv
        self.num_cached_prefix_blocks = cached
        self.hardware = "a100-80gb"
        self.tensor_parallel_size = 1


def router(name: str, n: int, seed: int = 0, **cluster: Any) -> Any:
    return make_router(ClusterConfig(replicas=n, router=name, **cluster), seed)


def views(*loads: int, kv: tuple[float, ...] = (), cached: tuple[int, ...] = ()) -> list[Any]:
    return [
        FakeView(i, load, kv[i] if kv else 0.0, cached[i] if cached else 0)
        for i, load in enumerate(loads)
    ]


def test_round_robin_takes_the_replicas_in_turn():
    route = router("round_robin", 3)
    assert [route(None, views(5, 0, 0), 0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_routing_is_uniform_and_replays_from_its_seed():
    route = router("random", 4, seed=7)
    picks = np.array([route(None, views(0, 0, 0, 0), 0.0) for _ in range(8000)])
    counts = np.bincount(picks, minlength=4)
    # binomial(8000, 1/4): sd 39, so 200 is 5 sigma
    assert np.all(np.abs(counts - 2000) < 200), counts
    again = router("random", 4, seed=7)
    assert [again(None, views(0, 0, 0, 0), 0.0) for _ in range(8000)] == picks.tolist()
    other = router("random", 4, seed=8)
    assert [other(None, views(0, 0, 0, 0), 0.0) for _ in range(50)] != picks[:50].tolist()


def test_router_stream_is_apart_from_the_workload_streams():
    from batchsim.workload.generation import _child_rngs

    workload = [rng.random() for rng in _child_rngs(3).values()]
    assert router_rng(3).random() not in workload
    assert router_rng(3).random() == router_rng(3).random()


def test_least_outstanding_picks_the_fewest_in_flight_and_spreads_ties():
    route = router("least_outstanding", 4)
    assert route(None, views(3, 1, 2, 5), 0.0) == 1
    # all equal: each pick goes to the replica after the previous pick
    assert [route(None, views(0, 0, 0, 0), 0.0) for _ in range(5)] == [2, 3, 0, 1, 2]


def test_least_kv_picks_the_lowest_usage_then_the_fewest_in_flight():
    route = router("least_kv", 3)
    assert route(None, views(9, 0, 0, kv=(0.1, 0.5, 0.3)), 0.0) == 0
    assert route(None, views(4, 2, 3, kv=(0.2, 0.2, 0.2)), 0.0) == 1


def test_power_of_two_never_picks_the_busiest_and_picks_the_idlest_half_the_time():
    route = router("power_of_two", 4, seed=1)
    picks = np.array([route(None, views(0, 1, 2, 3), 0.0) for _ in range(6000)])
    counts = np.bincount(picks, minlength=4) / len(picks)
    # two distinct replicas out of four: replica k wins when it is drawn with a busier one,
    # P = (2/4) x (busier ones)/(3) -> 1/2, 1/3, 1/6, 0
    np.testing.assert_allclose(counts, [1 / 2, 1 / 3, 1 / 6, 0], atol=0.025)
    assert router("power_of_two", 1)(None, views(0), 0.0) == 0


def test_prefix_aware_prefers_cached_blocks_within_the_load_bound():
    route = router("prefix_aware", 4, load_slack=0.5)
    # mean load 2: the bound is 1.5 x 2 + 1 = 4; replica 3 holds the most blocks but has 5 in
    # flight
    assert route(None, views(1, 2, 0, 5, cached=(4, 6, 0, 9)), 0.0) == 1
    # equal cached blocks: the one with fewer in flight
    assert route(None, views(2, 1, 3, 2, cached=(6, 6, 0, 6)), 0.0) == 1
    # nothing cached anywhere: least outstanding
    assert route(None, views(2, 2, 0, 3), 0.0) == 2


def test_a_view_reads_cached_prefix_blocks_from_the_kv_cache_when_it_can(monkeypatch):
    data = with_cluster(tiny_experiment(), replicas=2, router="prefix_aware")
    seen: list[int] = []

    def cached(self: KVCacheManager, request: Any) -> int:
        seen.append(request.request_id)
        return 3 if self.num_blocks == 1000 else 0

    without = sim(data)  # the KV manager has no num_cached_prefix_blocks: 0 everywhere
    assert without.replicas["num_requests"].min() > 0
    monkeypatch.setattr(KVCacheManager, "num_cached_prefix_blocks", cached, raising=False)
    data["cluster"]["replicas"] = [{"count": 1}, {"count": 1, "engine": {"num_gpu_blocks": 1000}}]
    result = sim(data)
    assert seen, "the router asked the KV cache"
    # replica 1 "holds" three blocks of every prompt: it gets every request the load bound
    # lets it take, and more than replica 0
    counts = result.replicas["num_requests"].to_numpy()
    assert counts[1] > counts[0]


ROUTER_MODULE = """
from batchsim.cluster import Router


class Raises(Router):
    def route(self, request, replicas, now):
        return {}["no such key"]


class OutOfRange(Router):
    def route(self, request, replicas, now):
        return len(replicas)


class Boolean(Router):
    def route(self, request, replicas, now):
        return True


class Exits(Router):
    def route(self, request, replicas, now):
        raise SystemExit(0)


class Interrupts(Router):
    def __init__(self, num_replicas, rng, config):
        raise KeyboardInterrupt


class Busiest(Router):
    def route(self, request, replicas, now):
        return max(range(len(replicas)), key=lambda i: (replicas[i].outstanding, -i))
"""


@pytest.fixture
def user_routers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "my_routers.py").write_text(ROUTER_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_routers"
    sys.modules.pop("my_routers", None)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("Raises", ["route() raised KeyError: 'no such key' (at ", "my_routers.py:7)"]),
        ("OutOfRange", ["route() returned 3", "a replica index from 0 to 2"]),
        ("Boolean", ["route() returned True"]),
        # user code: whatever it raises is its error (not an exit 0, not a Ctrl-C)
        ("Exits", ["route() raised SystemExit: 0"]),
        ("Interrupts", ["its constructor raised KeyboardInterrupt"]),
    ],
)
def test_a_broken_user_router_stops_the_run_naming_it(user_routers, tmp_path, capsys, name, words):
    exp = tmp_path / "exp.yaml"
    data = with_cluster(tiny_experiment(), replicas=3, router=f"{user_routers}:{name}")
    exp.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["run", str(exp), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cluster.router {user_routers}:{name}: " in err
    for word in words:
        assert word in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    with pytest.raises(RouterError):
        sim(data)


def test_a_user_router_is_followed(user_routers):
    # the busiest replica first: everything lands on one replica, which is replica 0
    result = sim(with_cluster(tiny_experiment(), replicas=3, router=f"{user_routers}:Busiest"))
    assert result.replicas["num_requests"].tolist() == [60, 0, 0]


@pytest.mark.parametrize(
    ("cluster", "words"),
    [
        ({"replicas": 0}, ["cluster.replicas must be >= 1, got 0"]),
        ({"replicas": 2, "router": "nearest"}, ["cluster.router: unknown router 'nearest'"]),
        ({"replicas": [{"count": 1, "engine": {"blok": 8}}]}, ["replicas[0].engine.blok: unknown"]),
        ({"replicas": [{"count": 2}, {"count": 1, "parallel": {"tensor_parallel_size": 0}}]},
         ["cluster.replicas[1].parallel.tensor_parallel_size must be >= 1, got 0"]),
        ({"replicas": 2, "router_overhead_ms": -1}, ["cluster.router_overhead_ms must be >= 0"]),
        ({"replicas": 2, "router": "my_missing_module:R"}, ["cannot import module"]),
    ],
)  # fmt: skip
def test_bad_cluster_blocks_are_one_line_errors_naming_the_key(cluster, words):
    with pytest.raises(ConfigError) as info:
        validate_experiment(with_cluster(tiny_experiment(), **cluster))
    for word in words:
        assert word in str(info.value)


def test_recording_slots_is_refused_for_a_cluster():
    data = with_cluster(tiny_experiment(metrics={"record_slots": True}), replicas=2)
    with pytest.raises(ConfigError, match=r"metrics\.record_slots is not supported with cluster"):
        validate_experiment(data)


# ------------------------------------------------------------------- one replica = one engine


CLOSED = {
    "num_requests": 40,
    "concurrency": 4,
    "think_time_ms": {"dist": "exponential", "mean": 30.0},
    "cancel_after_ms": {"dist": "exponential", "mean": 3000.0},
    "prompt_tokens": {"dist": "uniform", "min": 16, "max": 300},
    "output_tokens": {"dist": "uniform", "min": 2, "max": 60},
}


@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous", "chunked_prefill"])
@pytest.mark.parametrize("loop", ["open", "closed"])
def test_one_replica_reproduces_the_plain_run(policy, loop):
    data = tiny_experiment(scheduler={"policy": policy, "max_num_seqs": 6, "max_wait_ms": 20})
    if loop == "closed":
        data["workload"] = CLOSED
    plain = sim(data)
    one = sim(with_cluster(data, replicas=1, router="random"))
    # a cluster's summary adds its GPUs and the goodput per GPU (NaN: no slo here)
    assert one.summary.pop("num_gpus") == 1
    assert math.isnan(one.summary.pop("request_goodput_per_gpu"))
    assert_same_run(plain, one)
    assert one.requests.drop(columns="replica").columns.tolist() == plain.requests.columns.tolist()
    for column in ("request_id", "status", "num_preemptions", "prompt_tokens"):
        assert one.requests[column].tolist() == plain.requests[column].tolist()
    assert (one.requests["replica"] == 0).all() and (one.iterations["replica"] == 0).all()


def test_router_overhead_delays_each_request_by_exactly_that_much_on_an_idle_replica():
    data = tiny_experiment()
    data["workload"]["arrival"] = {"process": "constant", "rate": 0.5}  # 2 s apart: all idle
    plain = sim(data)
    late = sim(with_cluster(data, replicas=1, router_overhead_ms=3.0))
    np.testing.assert_allclose(late.requests["queue_delay_ms"], 3.0, rtol=1e-9)
    np.testing.assert_allclose(late.requests["ttft_ms"], plain.requests["ttft_ms"] + 3.0, rtol=1e-9)


# ------------------------------------------------------------------- queueing theory


RHO = 0.5
N = 4
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def service_s() -> float:
    """D: one request (32-token prompt, one output token) alone on one replica."""
    isolated = sim(single_server(poisson(1.0, 1, FIXED_PROMPT, ONE_TOKEN)))
    return float(isolated.requests["e2el_ms"].iloc[0]) / 1e3


def md1_cluster(router: str, seed: int, service_s: float) -> Result:
    workload = poisson(N * RHO / service_s, 20_000, FIXED_PROMPT, ONE_TOKEN)
    return sim(with_cluster(single_server(workload, seed=seed), replicas=N, router=router))


@pytest.fixture(scope="module")
def random_runs(service_s) -> list[Result]:
    return [md1_cluster("random", seed, service_s) for seed in SEEDS]


def test_random_routing_makes_each_replica_an_md1_queue(random_runs, service_s):
    # Random routing thins the Poisson stream: replica k sees Poisson at its own rate, with a
    # deterministic service time D (max_num_seqs 1): M/D/1, Wq = rho D / (2 (1 - rho)).
    ratios = []
    for result in random_runs:
        req = result.requests
        np.testing.assert_allclose(
            req["finish_time_s"] - req["first_scheduled_time_s"], service_s, rtol=1e-9
        )
        horizon = float(req["arrival_time_s"].max())
        expected = 0.0
        for k in range(N):
            mine = int((req["replica"] == k).sum())
            rho = mine / horizon * service_s  # the replica's own arrival rate
            expected += mine * rho * service_s / (2 * (1 - rho))
        ratios.append(queue_delays_s(result).mean() / (expected / len(req)))
    # Each run is four 5,000-request queues; the relative standard deviation of one run's
    # ratio is ~1.3 % (measured over 6 seeds); three runs: standard error ~0.8 %, so 5 % is a
    # six-sigma band.
    assert np.mean(ratios) == pytest.approx(1.0, rel=0.05)


def test_random_routing_over_n_replicas_queues_like_one_replica_at_a_nth_of_the_load(
    random_runs, service_s
):
    cluster = np.mean([r.summary["mean_queue_delay_ms"] for r in random_runs])
    single = np.mean(
        [
            sim(
                single_server(
                    poisson(RHO / service_s, 5_000, FIXED_PROMPT, ONE_TOKEN), seed=seed + 10
                )
            ).summary["mean_queue_delay_ms"]
            for seed in SEEDS
        ]
    )
    # both estimate the same M/D/1 wait; the single replica's three 5k-request runs have a
    # standard error of ~2 %, the cluster's ~0.8 %: 8 % is over three sigma of the difference
    assert cluster == pytest.approx(single, rel=0.08)


def test_round_robin_cuts_the_tail_of_queueing_delay_against_random(random_runs, service_s):
    # Round robin gives each replica every N-th arrival: Erlang-N gaps instead of
    # exponential ones (E_N/D/1 instead of M/D/1) and a much shorter tail (about 8 ms against
    # 39 ms of p99 here, over six seeds).
    for seed, random_run in zip(SEEDS, random_runs):
        rr = md1_cluster("round_robin", seed, service_s)
        assert rr.summary["p99_queue_delay_ms"] < 0.5 * random_run.summary["p99_queue_delay_ms"]
        assert rr.replicas["num_requests"].max() - rr.replicas["num_requests"].min() <= 1


def test_least_outstanding_gives_a_faster_replica_load_in_proportion_to_its_speed():
    prompt, output = {"dist": "fixed", "value": 512}, {"dist": "fixed", "value": 16}

    def service(hardware: str) -> float:
        data = single_server(poisson(1.0, 1, prompt, output))
        data["hardware"] = hardware
        return float(sim(data).requests["e2el_ms"].iloc[0]) / 1e3

    fast, slow = service("h100-sxm"), service("a100-80gb")
    assert slow / fast > 1.4  # a real difference to split the load by
    data = single_server(poisson(0.95 * (1 / fast + 1 / slow), 4000, prompt, output), seed=0)
    groups = [{"count": 1, "hardware": "h100-sxm"}, {"count": 1}]
    shares = {}
    for name in ("least_outstanding", "round_robin"):
        result = sim(with_cluster(data, replicas=groups, router=name))
        counts = result.replicas["num_requests"].to_numpy()
        shares[name] = counts[0] / counts[1]
    # Joining the shortest queue near saturation splits arrivals as the service rates: the
    # H100 gets slow/fast = 1.55 times the A100's share (1.46-1.50 over five seeds).
    assert shares["least_outstanding"] == pytest.approx(slow / fast, rel=0.1)
    assert shares["round_robin"] == pytest.approx(1.0, abs=0.01)


# ------------------------------------------------------------------- whole runs


def test_closed_loop_users_send_their_next_request_after_the_last_one_left_any_replica():
    data = tiny_experiment()
    data["workload"] = {
        "num_requests": 60,
        "concurrency": 5,
        "think_time_ms": {"dist": "fixed", "value": 40},
        "prompt_tokens": {"dist": "uniform", "min": 16, "max": 300},
        "output_tokens": {"dist": "uniform", "min": 2, "max": 60},
    }
    result = sim(with_cluster(data, replicas=3, router="random"))
    req = result.requests.sort_values("request_id")
    assert req["replica"].nunique() == 3
    arrival, finish = req["arrival_time_s"].to_numpy(), req["finish_time_s"].to_numpy()
    # the first five arrive at 0; each next one 40 ms after a request left (on any replica),
    # in the order they left
    assert (arrival[:5] == 0).all()
    np.testing.assert_allclose(np.sort(arrival[5:]), np.sort(finish)[: 60 - 5] + 0.040, rtol=1e-12)
    # never more than five requests in flight across the cluster
    events = sorted([(a, 1) for a in arrival] + [(f, -1) for f in finish])
    assert max(np.cumsum([e for _, e in events])) <= 5


def test_a_request_routed_to_an_idle_replica_starts_at_its_arrival():
    # one user, no think time, two replicas taking turns: each request arrives the moment the
    # previous one left the other replica, and the idle replica schedules it at that instant
    data = tiny_experiment()
    data["workload"] = {
        "num_requests": 12,
        "concurrency": 1,
        "think_time_ms": {"dist": "fixed", "value": 0},
        "prompt_tokens": {"dist": "fixed", "value": 100},
        "output_tokens": {"dist": "fixed", "value": 5},
    }
    req = sim(with_cluster(data, replicas=2)).requests.sort_values("request_id")
    assert req["replica"].tolist() == [0, 1] * 6
    assert (req["arrival_time_s"].to_numpy()[1:] == req["finish_time_s"].to_numpy()[:-1]).all()
    assert (req["queue_delay_ms"] == 0).all()


def test_same_seed_gives_identical_outputs_and_the_router_seed_changes_random_routes():
    data = with_cluster(tiny_experiment(), replicas=3, router="random")
    a, b = sim(data), sim(data)
    assert a.requests.equals(b.requests) and a.iterations.equals(b.iterations)
    assert a.replicas.equals(b.replicas)
    reseeded = sim(with_cluster(tiny_experiment(), replicas=3, router="random", seed=99))
    assert reseeded.requests["replica"].tolist() != a.requests["replica"].tolist()
    assert reseeded.requests["arrival_time_s"].equals(a.requests["arrival_time_s"])


def test_replica_table_adds_up_to_the_cluster_summary():
    data = tiny_experiment(metrics={"warmup_s": 0.3, "cooldown_s": 0.3})
    data["workload"]["num_requests"] = 150
    data["workload"]["arrival"]["rate"] = 60.0  # enough for batches of more than four
    groups = [{"count": 2, "hardware": "h100-sxm"}, {"count": 1, "scheduler": {"max_num_seqs": 4}}]
    result = sim(with_cluster(data, replicas=groups, router="least_outstanding"))
    summary, table = result.summary, result.replicas
    assert table["hardware"].tolist() == ["h100-sxm", "h100-sxm", "a100-80gb"]
    assert table["completed"].sum() == summary["completed"] < 150  # warm-up and cool-down
    assert table["output_throughput"].sum() == pytest.approx(summary["output_throughput"])
    assert table["busy_fraction"].mean() == pytest.approx(summary["busy_fraction"])
    assert table["num_gpu_blocks"].sum() == summary["num_gpu_blocks"]
    assert table["num_preemptions"].sum() == summary["num_preemptions"]
    assert (table["prefix_cache_hit_rate"] == 0.0).all()  # prefix caching is off
    # each replica's own batch cap
    it = result.iterations
    assert it.loc[it["replica"] == 2, "num_seqs"].max() <= 4
    assert it.loc[it["replica"] < 2, "num_seqs"].max() > 4
    # the iterations of replica 0, then 1, then 2; each replica's in time order
    assert it["replica"].is_monotonic_increasing
    assert (it["iteration"] == np.arange(len(it))).all()
    for _, rows in it.groupby("replica"):
        assert rows["start_time_s"].is_monotonic_increasing


def test_cluster_run_writes_replicas_csv_and_a_replica_column(tmp_path):
    data = with_cluster(tiny_experiment(), replicas=2)
    result = sim(data)
    out = result.write(tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == sorted(result.files)
    assert "replicas.csv" in result.files and "replicas.csv" in ALL_OUTPUT_FILES
    assert pd.read_csv(out / "requests.csv").columns[1] == "replica"
    assert pd.read_csv(out / "iterations.csv").columns[1] == "replica"
    replicas = pd.read_csv(out / "replicas.csv")
    assert replicas["replica"].tolist() == [0, 1]
    # the same folder rewritten by a run without replicas: no replicas.csv left behind
    plain = sim(tiny_experiment())
    plain.write(out)
    assert not (out / "replicas.csv").exists()
    assert "replica" not in pd.read_csv(out / "requests.csv").columns
    assert "cluster" not in (out / "config.yaml").read_text(encoding="utf-8")
    parquet = sim(with_cluster(tiny_experiment(output={"format": "parquet"}), replicas=2))
    written = parquet.write(tmp_path / "pq")
    assert pd.read_parquet(written / "replicas.parquet").equals(parquet.replicas)


def test_plot_and_report_draw_a_cluster_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    exp = tmp_path / "exp.json"
    groups = [{"count": 1, "hardware": "h100-sxm"}, {"count": 2}]
    exp.write_text(json.dumps(with_cluster(tiny_experiment(), replicas=groups)), encoding="utf-8")
    run = tmp_path / "run"
    assert cli.main(["run", str(exp), "-o", str(run)]) == 0
    out = capsys.readouterr().out
    assert "3 replicas (1 x h100-sxm, 2 x a100-80gb)" in out
    for kind in ("kv", "roofline", "cdf"):
        assert cli.main(["plot", kind, str(run), "-o", str(tmp_path / f"{kind}.png")]) == 0
        assert (tmp_path / f"{kind}.png").stat().st_size > 0
    assert cli.main(["report", str(run), "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert 'id="table-replicas"' in page and page.count("h100-sxm</td>") == 1


def test_a_sweep_over_routers_runs_every_router(tmp_path):
    import batchsim

    data = with_cluster(tiny_experiment(), replicas=3)
    table = batchsim.sweep(data, {"cluster.router": list(ROUTERS)}, out_dir=tmp_path / "s")
    assert table["error"].fillna("").eq("").all()
    assert table["cluster.router"].tolist() == list(ROUTERS)
    assert (table["completed"] == 60).all()
    point = next((tmp_path / "s" / "points").iterdir())
    assert (point / "replicas.csv").is_file()


def test_config_yaml_of_a_cluster_run_reruns_it_identically(tmp_path):
    groups = [{"count": 1, "hardware": "h100-sxm", "engine": {"block_size": 32}}, {"count": 2}]
    data = with_cluster(tiny_experiment(), replicas=groups, router="power_of_two", seed=5)
    first = sim(data)
    first.write(tmp_path / "a")
    again = simulate(
        validate_experiment(yaml.safe_load((tmp_path / "a" / "config.yaml").read_text("utf-8")))
    )
    assert_summaries_match(first.summary, again.summary)
    assert again.requests.equals(first.requests)


def test_a_request_routed_during_a_stretch_cuts_it_at_the_next_iteration_end(
    user_routers, tmp_path, monkeypatch
):
    from batchsim.cluster.plan import StretchPlan

    # request 0 decodes 300 tokens alone on replica 0 (one fast-forwarded stretch); requests
    # 1 and 2 arrive during it and are routed to the busy replica 0 by the Busiest router
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_time,prompt_tokens,output_tokens\n0.0,100,300\n0.517,50,5\n1.2345,50,5\n",
        encoding="utf-8",
    )
    data = with_cluster(tiny_experiment(), replicas=2, router=f"{user_routers}:Busiest")
    data["workload"] = {"trace": {"path": str(trace), "format": "csv"}}
    cuts: list[float] = []
    cut = StretchPlan.cut

    def counted(self: StretchPlan, time: float, *, passed: bool = False) -> float:
        cuts.append(time)
        return cut(self, time, passed=passed)

    monkeypatch.setattr(StretchPlan, "cut", counted)
    result = sim(data)
    assert cuts == [0.517, 1.2345]
    req, it = result.requests.set_index("request_id"), result.iterations
    assert (req["replica"] == 0).all()
    ends = (it["start_time_s"] + it["duration_ms"] / 1e3).to_numpy()
    for rid in (1, 2):
        arrival = req.loc[rid, "arrival_time_s"]
        # brute force: the first iteration of replica 0 to end at or after the arrival
        boundary = ends[ends >= arrival].min()
        assert req.loc[rid, "first_scheduled_time_s"] == pytest.approx(boundary, abs=1e-12)
    slow = sim({**data, "engine": {"fast_forward": False}})
    assert_same_run(result, slow)
    assert_same_clock(result, slow)


def test_prefix_aware_routing_raises_the_hit_rate_over_round_robin():
    # Eight tenants, each with its own 1,024-token system prompt, over four replicas with
    # prefix caching. Round robin sends every tenant to every replica, so each replica computes
    # every prompt once; prefix_aware sends a tenant back where its prompt is cached.
    data = tiny_experiment(
        workload={
            "num_requests": 240,
            "arrival": {"process": "poisson", "rate": 20.0},
            "prompt_tokens": {"dist": "uniform", "min": 16, "max": 64},
            "output_tokens": {"dist": "uniform", "min": 4, "max": 16},
            "shared_prefix": {"count": 8, "tokens": {"dist": "fixed", "value": 1024}},
        }
    )
    data["engine"] = {"enable_prefix_caching": True}
    rates = {}
    for name in ("round_robin", "prefix_aware"):
        result = sim(with_cluster(data, replicas=4, router=name))
        req = result.requests
        done = req["status"] == "finished"
        # the summary's rate is the cached share of the finished requests' prompt tokens
        expected = req.loc[done, "num_cached_tokens"].sum() / req.loc[done, "prompt_tokens"].sum()
        assert result.summary["prefix_cache_hit_rate"] == pytest.approx(expected)
        rates[name] = expected
        assert req["replica"].nunique() == 4  # every replica serves
    # round robin: 8 tenants x 4 replicas = 32 prompts computed of 240 requests (a rate near
    # 0.83); prefix_aware computes each tenant's prompt about once (near 0.93)
    assert rates["round_robin"] < 0.85 and rates["prefix_aware"] > 0.9, rates
