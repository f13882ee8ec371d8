"""Factories shared by the tests: schedulers without an engine, requests, tiny experiments."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import weakref
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import settings

from batchsim import simulation
from batchsim.config import validate_experiment
from batchsim.deployment import engines as deployment_engines
from batchsim.engine.engine import Engine
from batchsim.engine.kv_cache import KVCacheManager
from batchsim.engine.request import Request
from batchsim.scheduler.config import SchedulerConfig
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.output import StepTimes
from batchsim.scheduler.registry import POLICIES
from batchsim.simulation import Result
from batchsim.workload.prefix import PrefixTable

# Source of a function for a child Python process: how many of its threads are unnamed, as
# pyarrow's thread pools are (they keep the process's name; jemalloc's background thread and
# the AWS event loop name themselves). Linux only: it reads /proc/self/task.
UNNAMED_THREADS = """
import pathlib
def unnamed_threads():
    own = pathlib.Path('/proc/self/comm').read_text()
    tasks = pathlib.Path('/proc/self/task').iterdir()
    return sum((task / 'comm').read_text() == own for task in tasks)
"""


def tint_of(color: str, base: str) -> float | None:
    """How far ``color`` is ``base`` moved toward white (0 = ``base`` itself), or None when it
    is not such a tint: each channel c becomes c + (1 - c) t with one t for all channels, up
    to the rounding of 8-bit hex colours."""
    from matplotlib.colors import to_rgb

    fractions = []
    for c, b in zip(to_rgb(color), to_rgb(base)):
        if b > 0.999:
            if abs(c - 1.0) > 1 / 255:
                return None
            continue
        fractions.append((c - b) / (1.0 - b))
    t = sum(fractions) / len(fractions)
    if any(abs(f - t) > 2 / 255 / 0.3 for f in fractions) or not -1e-9 <= t <= 1.0:
        return None
    return t


# A falsifying example comes with the @reproduce_failure decorator that replays it exactly.
settings.register_profile("batchsim", print_blob=True)
settings.load_profile("batchsim")

SUMMARY_KEYS = {
    # vLLM benchmark_serving names
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    *(
        f"{stat}_{metric}_ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p90", "p99")
    ),
    # batchsim's own
    "num_iterations",
    "mean_batch_size",
    "num_preemptions",
    "num_rejected",
    "mean_queue_delay_ms",
    "p99_queue_delay_ms",
    "padding_fraction",
    "compute_bound_fraction",
    "max_kv_cache_usage",
    "bubble_fraction",
    "wall_time_s",
    "config",
}
"""The summary.json keys users' scripts rely on (architecture.md section 6)."""


def create_scheduler(
    policy: str = "continuous",
    *,
    num_blocks: int = 10_000,
    block_size: int = 16,
    window: int | None = None,
    max_model_len: int | None = None,
    num_cpu_blocks: int = 0,
    watermark_blocks: int = 0,
    **config: Any,
) -> Scheduler:
    """A policy over a KV pool of ``num_blocks`` blocks (and ``num_cpu_blocks`` of host swap
    space), driven directly by the test."""
    cfg = SchedulerConfig(policy=policy, **config)
    kv = KVCacheManager(
        num_blocks, block_size, num_cpu_blocks, window=window, watermark_blocks=watermark_blocks
    )
    return POLICIES[policy](cfg, kv, window=window, max_model_len=max_model_len)


def create_requests(
    num: int, prompt: int = 16, output: int = 4, arrival: float = 0.0, start_id: int = 0
) -> list[Request]:
    return [
        Request(
            request_id=start_id + i,
            arrival_time=arrival,
            num_prompt_tokens=prompt,
            max_tokens=output,
        )
        for i in range(num)
    ]


_ITERATIONS: weakref.WeakKeyDictionary[Scheduler, int] = weakref.WeakKeyDictionary()


def step(scheduler: Scheduler, now: float, duration: float = 1.0):
    """One iteration of ``duration`` seconds: schedule, then apply its output."""
    output = scheduler.schedule_iteration(now)
    if not output.requests:
        return output, []
    index = _ITERATIONS.get(scheduler, 0)
    _ITERATIONS[scheduler] = index + 1
    finished = scheduler.update_from_output(output, StepTimes(index, now, now + duration))
    return output, finished


@contextlib.contextmanager
def capture_engines() -> Iterator[list[Engine]]:
    """Keep the :class:`Engine` that ``simulate()`` builds (to look at its KV cache, or at
    what its fast-forward did: ``engine.stretch.num_stretches`` and the like). The engine is
    an :class:`Engine` itself, so it runs as it would have."""
    engines: list[Engine] = []

    def build(*args: Any, **kwargs: Any) -> Engine:
        engine = Engine(*args, **kwargs)
        engines.append(engine)
        return engine

    with mock.patch.object(deployment_engines, "Engine", build):
        yield engines


@contextlib.contextmanager
def without_cohort() -> Iterator[None]:
    """Run every engine that ``simulate()`` builds with its policy's decode cohort switched
    off before the engine sees it (each running request scheduled, priced and applied on
    its own): what the cohort must not change. Works on the compiled build too, whose
    engine calls the cohort's methods past any patch of them."""
    real = deployment_engines.Engine

    def build(scheduler: Any, *args: Any, **kwargs: Any) -> Engine:
        scheduler._cohort = None
        return real(scheduler, *args, **kwargs)

    with mock.patch.object(deployment_engines, "Engine", build):
        yield


Segments = list[tuple[int, int]]


@contextlib.contextmanager
def shared_prefixes(rows: list[Segments | None]) -> Iterator[None]:
    """Give the requests that ``simulate()`` draws these prefix segments (row i for request
    i, None: shares nothing), each cut to the request's prompt + output tokens."""
    real = simulation.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        table = real(*args, **kwargs)
        cut: list[Segments | None] = []
        for i in range(len(table)):
            row = rows[i] if i < len(rows) else None
            room = int(table.prompt_tokens[i] + table.output_tokens[i])
            segments: Segments = []
            for content, length in row or ():
                take = min(length, room)
                if take <= 0:
                    break
                segments.append((content, take))
                room -= take
            cut.append(segments or None)
        return dataclasses.replace(table, prefix=PrefixTable.from_lists(cut))

    with mock.patch.object(simulation, "generate", generate):
        yield


def simulate_data(data: dict[str, Any], progress: Any = None) -> Result:
    """``simulate()`` an experiment mapping; a ``_prefix`` entry (not an experiment key) gives
    its requests those prefix segments (:func:`shared_prefixes`)."""
    data = dict(data)
    rows = data.pop("_prefix", None)
    config = validate_experiment(data)
    if rows is None:
        return simulation.simulate(config, progress=progress)
    with shared_prefixes(rows):
        return simulation.simulate(config, progress=progress)


def tiny_experiment(**overrides: Any) -> dict[str, Any]:
    """A small, fast experiment mapping (Llama-2-7B on an A100-80GB)."""
    data: dict[str, Any] = {
        "name": "tiny",
        "seed": 0,
        "hardware": "a100-80gb",
        "model": "llama-2-7b",
        "scheduler": {"policy": "continuous", "max_num_seqs": 32},
        "workload": {
            "num_requests": 60,
            "arrival": {"process": "poisson", "rate": 5.0},
            "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
            "output_tokens": {"dist": "uniform", "min": 8, "max": 64},
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


@pytest.fixture
def experiment() -> dict[str, Any]:
    return tiny_experiment()


def _numeric(summary: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in summary.items()
        if k != "wall_time_s" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def assert_summaries_match(a: dict[str, Any], b: dict[str, Any], rel: float = 1e-9) -> None:
    """Equal to ``rel``. A standard deviation is compared at the scale of its mean: values
    equal up to float rounding have a std of 0 on one path and ~1e-15 x mean on another.
    ``queue_delay_growth`` (seconds per second, about 0 when the engine keeps up) is compared
    at the scale of 1: a slope of 1e-6 is a difference of queueing delays at rounding level."""
    sa, sb = _numeric(a), _numeric(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        x, y = sa[key], sb[key]
        scale = 0.0
        if key.startswith("std_"):
            mean = key.replace("std_", "mean_", 1)
            scale = max(abs(sa.get(mean, 0.0)), abs(sb.get(mean, 0.0)))
        elif key == "queue_delay_growth":
            scale = 1.0
        if math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y), (key, x, y)
            continue
        same = math.isclose(x, y, rel_tol=rel, abs_tol=rel * scale if scale == scale else 0.0)
        assert same, (key, x, y)


def assert_same_clock(fast: Result, slow: Result) -> None:
    """Fast-forward and stepping reach every iteration's start and end the same way (its
    duration added to the previous end), so their clocks agree to the bit: events at one
    instant on one path are at one instant on the other."""
    for column in ("start_time_s", "duration_ms"):
        a, b = fast.iterations[column].to_numpy(), slow.iterations[column].to_numpy()
        np.testing.assert_array_equal(a, b, err_msg=column)
    for column in ("arrival_time_s", "first_scheduled_time_s", "first_token_time_s"):
        a, b = fast.requests[column].to_numpy(), slow.requests[column].to_numpy()
        np.testing.assert_array_equal(a, b, err_msg=column)
    a, b = fast.requests["finish_time_s"].to_numpy(), slow.requests["finish_time_s"].to_numpy()
    np.testing.assert_array_equal(a, b, err_msg="finish_time_s")


def assert_fast_forward_exact(data: dict[str, Any]) -> tuple[Result, Result]:
    """Run the experiment mapping ``data`` fast-forwarded and stepped one iteration at a time;
    assert both give the same run and the same clock; return (fast, stepped)."""
    fast, slow = copy.deepcopy(data), copy.deepcopy(data)
    fast["engine"]["fast_forward"] = True
    slow["engine"]["fast_forward"] = False
    a, b = simulate_data(fast), simulate_data(slow)
    assert_same_run(a, b)
    assert_same_clock(a, b)
    return a, b


def assert_same_run(fast: Result, slow: Result, *, ignore: tuple[str, ...] = ()) -> None:
    """Two runs agree iteration by iteration and request by request (to 1e-9), but for the
    ``ignore`` iteration columns."""
    assert_summaries_match(fast.summary, slow.summary)
    assert len(fast.iterations) == len(slow.iterations)
    for column in ("ttft_ms", "e2el_ms", "finish_time_s", "output_tokens", "num_cached_tokens"):
        np.testing.assert_allclose(fast.requests[column], slow.requests[column], rtol=1e-9)
    for column in fast.iterations.columns.drop(list(ignore)):
        a, b = fast.iterations[column].to_numpy(), slow.iterations[column].to_numpy()
        if a.dtype.kind in "fc":
            rtol = 1e-6 if column == "kv_cache_usage" else 1e-9  # float32 column
            np.testing.assert_allclose(a, b, rtol=rtol, err_msg=column)
        else:
            np.testing.assert_array_equal(a, b, err_msg=column)
