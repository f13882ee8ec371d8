"""Open-loop arrival processes: when requests arrive.

Owns the ``arrival:`` models (poisson, gamma, constant, burst (on-off), all_at_once), the string
shorthand (``arrival: all_at_once``), the discriminated union ``ArrivalProcess`` and the
``ARRIVAL_PROCESSES`` registry. Times are in seconds; a process starts at t = 0 and its first
request arrives one inter-arrival time later (all_at_once: every request at t = 0). Closed-loop
workloads (``concurrency`` users with a ``think_time_ms``) have no arrival process: they are
fields of :class:`~batchsim.workload.config.WorkloadConfig` and the engine decides the times.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field

from batchsim.errors import ConfigError
from batchsim.validation import MAX_REQUESTS, MAX_SECONDS, ConfigModel, StrictFloat
from batchsim.workload.common import PositiveSeconds, Rate, Seconds, _describe_model

#: Backstop while drawing arrivals up to ``duration_s`` alone: the config already bounds the
#: expected count (rate x duration_s) by MAX_REQUESTS; a draw this far above it stops.
MAX_GENERATED_REQUESTS = 2 * MAX_REQUESTS


class _ArrivalBase(ConfigModel):
    """Common interface of the arrival processes."""

    def mean_rate(self) -> float:
        """Long-run arrival rate, requests/s (inf for ``all_at_once``)."""
        raise NotImplementedError

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` inter-arrival gaps in process time (s)."""
        raise NotImplementedError

    def _to_wall(self, tau: np.ndarray) -> np.ndarray:
        """Map process time to simulated time (identity except for on-off processes)."""
        return tau

    def sample(
        self, rng: np.random.Generator, n: int | None, duration_s: float | None
    ) -> np.ndarray:
        """Arrival times (s, float64, non-decreasing).

        Args:
            rng: The arrival stream.
            n: Maximum number of arrivals (None: as many as fit in ``duration_s``).
            duration_s: Keep only arrivals before this time (None: no limit).
        """
        assert n is not None or duration_s is not None, "need num_requests or duration_s"
        if duration_s is None:
            assert n is not None
            times = self._to_wall(np.cumsum(self._gaps(rng, n)))
            if len(times) and not times[-1] <= MAX_SECONDS:
                raise ConfigError(
                    f"workload.arrival: {self.describe()} puts arrival {len(times)} of "
                    f"num_requests={n} at {float(times[-1]):.3g} s, more than the limit of "
                    f"{MAX_SECONDS:g} s; set a higher rate, fewer num_requests or a duration_s"
                )
            return times
        expected = self.mean_rate() * duration_s
        if n is None and expected > MAX_GENERATED_REQUESTS:
            raise ConfigError(
                f"workload.duration_s={duration_s:g} at {self.mean_rate():g} req/s would "
                f"generate about {expected:.3g} requests (limit {MAX_GENERATED_REQUESTS:,}); "
                "set workload.num_requests"
            )
        # Draw in chunks until past duration_s (or n arrivals): the streams are sequential, so
        # the result does not depend on the chunk size.
        chunk = int(min(expected, MAX_GENERATED_REQUESTS) + 8.0 * math.sqrt(expected) + 64)
        if n is not None:
            chunk = min(chunk, n)
        pieces: list[np.ndarray] = []
        last_tau = 0.0
        total = 0
        while True:
            tau = last_tau + np.cumsum(self._gaps(rng, chunk))
            wall = self._to_wall(tau)
            pieces.append(wall)
            total += chunk
            last_tau = float(tau[-1])
            if wall[-1] >= duration_s or (n is not None and total >= n):
                break
            if n is None and total > MAX_GENERATED_REQUESTS:
                raise ConfigError("workload: too many arrivals before duration_s")
            if n is not None:
                chunk = min(chunk, n - total)
        times = np.concatenate(pieces)
        if n is not None:
            times = times[:n]
        return times[times < duration_s]

    def describe(self) -> str:
        """Short one-line form, e.g. ``poisson(rate=4)``."""
        return _describe_model(self, "process")


class PoissonArrival(_ArrivalBase):
    """Poisson process: exponential inter-arrival times with mean 1/rate (CV 1)."""

    process: Literal["poisson"] = "poisson"
    rate: Rate = Field(description="requests/s (> 0)")

    def mean_rate(self) -> float:
        return float(self.rate)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size=n)


class GammaArrival(_ArrivalBase):
    """Gamma inter-arrival times with mean 1/rate and coefficient of variation ``cv``.

    shape = 1/cv^2, scale = 1/(rate * shape), as in Vidur's gamma interval generator. cv > 1 is
    burstier than Poisson, cv < 1 more regular, cv = 1 is Poisson.
    """

    process: Literal["gamma"] = "gamma"
    rate: Rate = Field(description="requests/s (> 0)")
    cv: StrictFloat = Field(
        ge=1e-3, le=1e3, description="coefficient of variation of inter-arrival times"
    )

    def mean_rate(self) -> float:
        return float(self.rate)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, 1.0 / (self.rate * shape), size=n)


class ConstantArrival(_ArrivalBase):
    """One request every 1/rate seconds exactly."""

    process: Literal["constant"] = "constant"
    rate: Rate = Field(description="requests/s (> 0)")

    def mean_rate(self) -> float:
        return float(self.rate)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 1.0 / self.rate)


class BurstArrival(_ArrivalBase):
    """On-off traffic: Poisson at ``rate`` for ``on_s`` seconds, then silence for ``off_s``.

    The cycle starts with an on period at t = 0. Long-run rate = rate * on_s / (on_s + off_s).
    """

    process: Literal["burst"] = "burst"
    rate: Rate = Field(description="requests/s during on periods (> 0)")
    on_s: PositiveSeconds = Field(description="length of an on period, s (> 0)")
    off_s: Seconds = Field(description="length of an off period, s (>= 0)")

    def mean_rate(self) -> float:
        return self.rate * self.on_s / (self.on_s + self.off_s)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, size=n)

    def _to_wall(self, tau: np.ndarray) -> np.ndarray:
        # tau counts on-time only; each completed on period adds one off period.
        return tau + np.floor(tau / self.on_s) * self.off_s


class AllAtOnceArrival(_ArrivalBase):
    """Every request arrives at t = 0, like an offline throughput benchmark."""

    process: Literal["all_at_once"] = "all_at_once"

    def mean_rate(self) -> float:
        return math.inf

    def sample(
        self, rng: np.random.Generator, n: int | None, duration_s: float | None
    ) -> np.ndarray:
        assert n is not None, "all_at_once needs num_requests"
        return np.zeros(n)


def _arrival_shorthand(value: Any) -> Any:
    """``arrival: all_at_once`` means ``{process: all_at_once}``."""
    return {"process": value} if isinstance(value, str) else value


ArrivalProcess = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | BurstArrival | AllAtOnceArrival,
    Field(discriminator="process"),
    BeforeValidator(_arrival_shorthand),
]

ARRIVAL_PROCESSES: dict[str, type[_ArrivalBase]] = {
    "poisson": PoissonArrival,
    "gamma": GammaArrival,
    "constant": ConstantArrival,
    "burst": BurstArrival,
    "all_at_once": AllAtOnceArrival,
}
