"""Routers: which replica serves a request, decided at its arrival.

A router is a :class:`Router` subclass with one method,
``route(request, replicas, now) -> index``. It sees each replica through a read-only
:class:`~batchsim.cluster.dispatch.ReplicaView` of that instant: ``outstanding`` (requests in
flight: waiting, running or swapped, on their way included), ``waiting``, ``running``,
``swapped``, ``kv_cache_usage``, ``num_cached_prefix_blocks`` (of this request, 0 without
prefix caching), ``hardware``, ``tensor_parallel_size`` and ``index``. ``request`` is the
engine's :class:`~batchsim.engine.request.Request` (read it, do not change it):
``num_prompt_tokens``, ``max_tokens``, ``arrival_time``, ``user_id``, ``prefix_segments``.

Built-in routers (``cluster.router``), one class each:

- ``round_robin``: replicas in turn.
- ``random``: uniformly at random.
- ``least_outstanding``: the fewest requests in flight.
- ``least_kv``: the lowest KV-cache usage (ties: fewest in flight).
- ``power_of_two``: two distinct replicas at random, the one with fewer in flight (Mitzenmacher's
  power of two choices).
- ``prefix_aware``: the most cached blocks of the request's prefix, among the replicas whose
  load stays within ``(1 + cluster.load_slack) x`` the mean requests in flight plus one (ties:
  fewest in flight).

Remaining ties go to the first replica after the one chosen last (in index order), so equal
replicas share the load instead of the first one taking it all. Randomness comes from the
run's own stream (``numpy.random.Generator``, seeded from ``cluster.seed`` or the
experiment's seed), never from global state.

``package.module:Class`` loads a router written elsewhere; the run checks each of its
answers and stops with a :class:`~batchsim.errors.RouterError` naming it when it raises or
returns something that is not a replica index.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from batchsim.errors import BatchsimError, Interrupted, RouterError, describe_exception
from batchsim.scheduler.registry import load_class

if TYPE_CHECKING:
    from batchsim.cluster.config import ClusterConfig
    from batchsim.cluster.dispatch import ReplicaView
    from batchsim.engine.request import Request

ROUTER_STREAM = 0x726F75746572
"""Spawn key of the router's random stream under the run's seed (``b"router"``), apart from the
workload's streams."""


DECODE_ROUTER_STREAM = 0x6465636F6465
"""Spawn key of a disaggregated cluster's decode router (``b"decode"``), apart from the
router's."""


def router_rng(seed: int, stream: int = ROUTER_STREAM) -> np.random.Generator:
    """The router's random stream for a run seeded with ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


class Router:
    """Base class of routers.

    Args:
        num_replicas: Replicas of the cluster (indices 0 .. num_replicas - 1).
        rng: The run's random stream for routing.
        config: The ``cluster:`` block (``load_slack``, ``router_options``...).
    """

    name: ClassVar[str] = ""

    def __init__(self, num_replicas: int, rng: np.random.Generator, config: ClusterConfig):
        self.num_replicas = num_replicas
        self.rng = rng
        self.config = config
        self._last = num_replicas - 1  # so that the first tie goes to replica 0

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        """The index of the replica that serves ``request``, which arrives at ``now`` (s)."""
        raise NotImplementedError

    def least(self, replicas: Sequence[ReplicaView], key: Any) -> int:
        """The replica with the smallest ``key(view)``; ties go to the first one after the
        last choice, in index order."""
        n = len(replicas)
        start = self._last + 1
        best, best_key = -1, None
        for offset in range(n):
            i = (start + offset) % n
            k = key(replicas[i])
            if best_key is None or k < best_key:
                best, best_key = i, k
        self._last = best
        return best


class RoundRobin(Router):
    name = "round_robin"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        self._last = (self._last + 1) % self.num_replicas
        return self._last


class RandomRouter(Router):
    name = "random"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return int(self.rng.integers(self.num_replicas))


class LeastOutstanding(Router):
    name = "least_outstanding"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return self.least(replicas, lambda r: r.outstanding)


class LeastKV(Router):
    name = "least_kv"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return self.least(replicas, lambda r: (r.kv_cache_usage, r.outstanding))


class PowerOfTwo(Router):
    name = "power_of_two"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        n = self.num_replicas
        if n == 1:
            return 0
        first = int(self.rng.integers(n))
        second = int(self.rng.integers(n - 1))
        second += second >= first  # two distinct replicas, uniformly
        if replicas[second].outstanding < replicas[first].outstanding:
            return second
        return first


class PrefixAware(Router):
    name = "prefix_aware"

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        loads = [r.outstanding for r in replicas]
        # one request over the relative bound is always allowed: at light load (a mean of
        # about one in flight) the relative bound alone would scatter every prefix
        bound = (1.0 + self.config.load_slack) * sum(loads) / len(loads) + 1.0
        inf = float("inf")

        def key(r: ReplicaView) -> tuple[float, float]:
            load = loads[r.index]
            if load > bound:
                return (inf, inf)  # too busy: only if all are (never: the least is <= mean)
            return (-r.num_cached_prefix_blocks, load)

        return self.least(replicas, key)


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (RoundRobin, RandomRouter, LeastOutstanding, LeastKV, PowerOfTwo, PrefixAware)
}


def load_router(name: str, key: str = "cluster.router") -> type[Router]:
    """The router class of a built-in name or ``package.module:Class``."""
    return load_class(name, ROUTERS, Router, key, "router", "batchsim.cluster.Router")


def make_router(
    config: ClusterConfig,
    seed: int,
    *,
    name: str | None = None,
    key: str = "cluster.router",
    num_replicas: int | None = None,
    stream: int = ROUTER_STREAM,
) -> Any:
    """``route(request, replicas, now) -> index`` for the cluster: the configured router,
    checked at every call when it was written outside batchsim.

    ``name``, ``key``, ``num_replicas`` and ``stream`` choose another router of the cluster
    (a disaggregated cluster's decode router, over its decode pool, with its own stream)."""
    cls = load_router(config.router if name is None else name, key)
    n = config.num_replicas if num_replicas is None else num_replicas
    rng = router_rng(config.seed if config.seed is not None else seed, stream)
    if cls in ROUTERS.values():
        return cls(n, rng, config).route
    label = f"{key} {cls.__module__}:{cls.__qualname__}"
    try:
        router = cls(n, rng, config)
    except (BatchsimError, Interrupted):  # batchsim's own errors; the user's Ctrl-C
        raise
    except BaseException as exc:  # SystemExit(0), KeyboardInterrupt, ...: the router's
        raise RouterError(f"{label}: its constructor raised {describe_exception(exc)}") from None

    def route(request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        try:
            index = router.route(request, replicas, now)
        except (BatchsimError, Interrupted):
            raise
        except BaseException as exc:
            raise RouterError(f"{label}: route() raised {describe_exception(exc)}") from None
        if (
            isinstance(index, bool)
            or not isinstance(index, numbers.Integral)
            or not (0 <= index < n)
        ):
            raise RouterError(
                f"{label}: route() returned {index!r} for request {request.request_id} at "
                f"t={now!r} s; a route is a replica index from 0 to {n - 1}"
            )
        return int(index)

    return route
