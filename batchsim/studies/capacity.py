"""``batchsim capacity``: the highest arrival rate each configuration sustains within an SLO.

For every configuration of the grid (the base experiment alone without one), a search on
``workload.arrival.rate``:

1. *Bracket.* Simulate the experiment's own rate; double it while it is sustained, halve it
   while it is not, until one sustained rate and one unsustained rate twice as high are known.
   A rate that misses a latency SLO with a stable queue may lie below the policy's sweet
   spot (static batching waits longer to fill its batch at lower rates), so while the miss
   shrinks as the rate rises the search doubles instead; when a doubling overloads the
   engine, it bisects between the last stable rate and the overloaded one, towards smaller
   misses, to find the band of sustained rates in between (:class:`Search`).
2. *Bisect* geometrically between them (rates rounded to 6 significant digits) until the
   unsustained rate is within ``rtol`` of the sustained one. ``max_request_rate`` is the
   highest sustained rate found: the true capacity lies in [max_request_rate,
   max_request_rate x (1 + rtol)) when the criterion is monotone in the rate.

A rate is *sustained* when every SLO holds at it and the engine keeps up with it:

- ``--slo METRIC=LIMIT``: a summary metric (``p90_ttft_ms``, ``p99_tpot_ms``,
  ``mean_e2el_ms``, ...) must be <= LIMIT; with ``--attainment A``, the SLOs are per-request
  limits (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) and at least a fraction A of the requests must
  finish within all of them (``slo_attainment``, DistServe's definition);
- *stability*: the queue must not grow through the run: ``queue_delay_growth`` (the
  least-squares slope of queueing delay over arrival time, seconds per second) must be at
  most ``max_queue_growth`` (0.05 by default: arrivals outpacing service by more than about
  5 % fail). Latency SLOs alone would pass an overloaded engine whose run is too short for
  its queue to hurt yet.

A rate too low to simulate (its arrivals would pass the bound of simulated time, 1e9 s)
ends a search that halves: its ``limited_by`` says so.

Every rate simulated is a point of the study folder (``points/<configuration>,rate=R``), so
an interrupted search resumes where it stopped; the search is deterministic, so a rerun asks
for the same rates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchsim.config import ExperimentConfig
from batchsim.errors import ConfigError
from batchsim.studies.grid import cell, expand, label_part, short_names
from batchsim.studies.slo import REQUEST_SLOS, SUMMARY_SLOS
from batchsim.studies.store import FileDigests, Outcome, Point, PointStore
from batchsim.studies.sweep import (
    SweepPlan,
    make_labels_unique,
    point_label,
    scalar_metrics,
    write_marker,
    write_table,
)

if TYPE_CHECKING:
    import pandas as pd

RATE_KEY = "workload.arrival.rate"
MAX_DOUBLINGS = 10
"""How far the bracket search goes from the experiment's rate: up to x or / 2**10."""
DEFAULT_RTOL = 0.02
DEFAULT_MAX_QUEUE_GROWTH = 0.05
SEARCH_PROGRESS = "capacity search, rates simulated"
"""How the progress of a search names what it counts (how many rates it takes is not known
beforehand)."""


def parse_slo(items: Mapping[str, Any] | list[str], attainment: float | None) -> dict[str, float]:
    """``["p99_ttft_ms=2000", ...]`` (or a mapping) -> ``{"p99_ttft_ms": 2000.0, ...}``."""
    allowed = REQUEST_SLOS if attainment is not None else SUMMARY_SLOS
    pairs: list[tuple[str, Any, str]] = []
    if isinstance(items, Mapping):
        pairs = [(k, v, f"slo {k}") for k, v in items.items()]
    else:
        for item in items:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ConfigError(f"--slo {item!r}: expected METRIC=LIMIT, e.g. p99_ttft_ms=2000")
            pairs.append((key.strip(), raw.strip(), f"--slo {item}"))
    if not pairs:
        raise ConfigError("capacity needs at least one --slo METRIC=LIMIT, e.g. p99_ttft_ms=2000")
    out: dict[str, float] = {}
    for key, raw, label in pairs:
        if key not in allowed:
            hint = (
                "with --attainment an SLO is a per-request limit"
                if attainment is not None
                else "an SLO bounds a summary latency metric"
            )
            raise ConfigError(f"{label}: unknown metric {key!r}; {hint}: {', '.join(allowed)}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{label}: the limit must be a number of ms, got {raw!r}") from None
        if isinstance(raw, bool) or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{label}: the limit must be a finite number of ms > 0, got {raw!r}")
        out[key] = value
    return out


def _round(rate: float) -> float:
    return float(f"{rate:.6g}")


@dataclass
class Judge:
    """Whether a run sustains its rate, and if not, why."""

    slo: dict[str, float]
    attainment: float | None = None
    max_queue_growth: float = DEFAULT_MAX_QUEUE_GROWTH

    def __call__(self, summary: Mapping[str, Any]) -> str:
        """Empty if sustained, else the first reason it is not (``p99_ttft_ms 2345 > 2000``)."""
        if not summary.get("completed"):
            return "no request finished"
        if self.attainment is not None:
            got = summary.get("slo_attainment")
            if got is None or not got >= self.attainment:
                return f"slo_attainment {_num(got)} < {self.attainment:g}"
        else:
            for key, limit in self.slo.items():
                got = summary.get(key)
                if got is None or not got <= limit:
                    return f"{key} {_num(got)} > {limit:g}"
        if self.queue_grows(summary):
            growth = summary["queue_delay_growth"]
            return f"queue grows (queue_delay_growth {growth:.3g} > {self.max_queue_growth:g})"
        return ""

    def violation(self, summary: Mapping[str, Any]) -> float:
        """How far the SLOs are from holding: the largest metric / limit (attainment: target /
        attained); <= 1 when they hold, inf when a metric is undefined."""
        if self.attainment is not None:
            got = summary.get("slo_attainment")
            if got is None or got != got or got <= 0:
                return math.inf
            return self.attainment / float(got)
        worst = 0.0
        for key, limit in self.slo.items():
            got = summary.get(key)
            if got is None or got != got:
                return math.inf
            worst = max(worst, float(got) / limit)
        return worst

    def queue_grows(self, summary: Mapping[str, Any]) -> bool:
        """The stability criterion fails: queueing delay grows faster than allowed."""
        growth = summary.get("queue_delay_growth")
        return growth is not None and growth == growth and growth > self.max_queue_growth


def _num(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "undefined"
    return f"{value:.4g}"


@dataclass
class Trial:
    """One simulated rate of a search."""

    rate: float
    ok: bool
    grew: bool
    """The queue grew (the stability criterion failed)."""
    reason: str
    violation: float
    """:meth:`Judge.violation` at this rate."""


@dataclass
class Search:
    """The rate search of one configuration (see the module documentation).

    Before any rate is sustained, the search looks for one:

    - ``up``: while the latest rate misses a latency SLO with a stable queue and the miss
      shrinks as the rate rises (below a batching policy's sweet spot: static batching waits
      less to fill its batch at higher rates), double the rate;
    - ``band``: when doubling made the queue grow, the sustained rates (if any) lie between
      the last stable rate and it: bisect there, moving towards smaller misses, until a rate
      is sustained or the interval is within ``rtol``;
    - ``down``: otherwise halve below the lowest rate tried (an SLO only low loads meet).

    Once a rate is sustained, the highest sustained rate and the lowest unsustained rate above
    it bracket the capacity: double until one fails, then bisect geometrically.
    """

    label: str
    values: dict[str, Any]
    base: ExperimentConfig | None
    error: str = ""
    tried: list[Trial] = field(default_factory=list)
    lo_outcome: Outcome | None = None
    lo_label: str = ""
    done: bool = False
    phase: str = "up"
    band: tuple[float, float] = (0.0, 0.0)
    band_violation: float = math.inf
    """The miss at the band's lower end."""

    @property
    def lo(self) -> float | None:
        """The highest sustained rate."""
        passed = [t.rate for t in self.tried if t.ok]
        return max(passed) if passed else None

    @property
    def hi(self) -> float | None:
        """The lowest unsustained rate above :attr:`lo` (or at all, if none is sustained)."""
        lo = self.lo
        failed = [t.rate for t in self.tried if not t.ok and (lo is None or t.rate > lo)]
        return min(failed) if failed else None

    @property
    def reason(self) -> str:
        """Why :attr:`hi` is not sustained."""
        hi = self.hi
        return next((t.reason for t in self.tried if t.rate == hi), "")

    def add(self, trial: Trial, rtol: float) -> None:
        """Record a simulated rate and choose the next phase."""
        previous = self.tried[-1] if self.tried else None
        self.tried.append(trial)
        if trial.ok or self.lo is not None:
            self.phase = "bracket"
            return
        if self.phase == "up":
            if trial.grew:
                stable = [t for t in self.tried if not t.grew and t.rate < trial.rate]
                if stable:
                    below = max(stable, key=lambda t: t.rate)
                    self.phase = "band"
                    self.band = (below.rate, trial.rate)
                    self.band_violation = below.violation
                else:
                    self.phase = "down"
            elif previous is not None and not trial.violation < previous.violation:
                self.phase = "down"  # missing by more as the rate rises: look below
        elif self.phase == "band":
            a, b = self.band
            if trial.grew or not trial.violation < self.band_violation:
                self.band = (a, trial.rate)  # past the smallest miss, or overloaded
            else:
                self.band = (trial.rate, b)
                self.band_violation = trial.violation
            if self.band[1] <= self.band[0] * (1 + rtol):
                self.phase = "down"

    def next_rate(self, rtol: float, start: float) -> float | None:
        """The next rate to try, or None when the search is over."""
        if not self.tried:
            return start
        rates = [t.rate for t in self.tried]
        if self.phase == "up":
            top = max(rates)
            if top < start * 2**MAX_DOUBLINGS and top < _max_rate():
                return min(top * 2, _max_rate())
            self.phase = "down"
        if self.phase == "band":
            return _between(*self.band)
        if self.phase == "down":
            bottom = min(rates)
            return bottom / 2 if bottom > start / 2**MAX_DOUBLINGS else None
        lo, hi = self.lo, self.hi
        assert lo is not None
        if hi is None:
            if lo >= start * 2**MAX_DOUBLINGS or lo >= _max_rate():
                return None
            return min(lo * 2, _max_rate())
        if hi <= lo * (1 + rtol):
            return None
        return _between(lo, hi)


def _between(lo: float, hi: float) -> float:
    """The geometric midpoint, rounded to 6 significant digits when that stays inside."""
    mid = math.sqrt(lo * hi)
    rounded = _round(mid)
    return rounded if lo < rounded < hi else mid


def _max_rate() -> float:
    from batchsim.workload.common import MAX_RATE

    return MAX_RATE


@dataclass
class CapacityPlan:
    """A capacity study: a sweep plan (its configurations) and the search settings."""

    plan: SweepPlan
    judge: Judge
    rtol: float = DEFAULT_RTOL


def _start_rate(config: ExperimentConfig) -> float:
    arrival = config.workload.arrival
    rate = getattr(arrival, "rate", None)
    if arrival is None or rate is None:
        what = "a closed loop or a trace replay" if arrival is None else arrival.process
        raise ConfigError(
            f"capacity searches {RATE_KEY}, but this workload has no arrival rate ({what}); "
            "use workload.arrival.process poisson, gamma, constant or burst"
        )
    return float(rate)


def run_capacity(
    cplan: CapacityPlan,
    executor: Executor,
    *,
    out_dir: Path | None = None,
    progress: str = "off",
) -> pd.DataFrame:
    """Search every configuration's capacity; with ``out_dir``, resumable and written there
    (``sweep.json``, ``points/``, ``capacity.csv``/``.parquet``)."""
    from batchsim.studies.runner import Progress, Runner
    from batchsim.studies.store import check_study_dir

    plan = cplan.plan
    if RATE_KEY in plan.varied or any(k.startswith(RATE_KEY + ".") for k in plan.varied):
        raise ConfigError(f"capacity searches {RATE_KEY}; do not vary it with --grid")
    short = short_names(plan.varied)
    searches: list[Search] = []
    slo_override = {"slo": dict(cplan.judge.slo)} if cplan.judge.attainment is not None else {}
    for values in expand(plan.axes):
        label = point_label(values, short, None)
        try:
            base = plan.source.load({**values, **slo_override}, origin="--grid")
            _start_rate(base)
            searches.append(Search(label, dict(values), base))
        except ConfigError as exc:
            searches.append(Search(label, dict(values), None, error=str(exc), done=True))
    if searches and all(s.base is None for s in searches):
        first = searches[0].error
        raise ConfigError(
            first if len(searches) == 1 else f"every configuration is invalid; the first: {first}"
        )
    store = None
    if out_dir is not None:
        check_study_dir(out_dir, plan.kind)
        store = PointStore(out_dir, FileDigests())
        write_marker(plan, out_dir, len(searches))
    runner = Runner(
        executor, store, write_csv=False, progress=Progress(SEARCH_PROGRESS, progress, search=True)
    )
    labels: set[str] = set()

    def submit(search: Search) -> None:
        assert search.base is not None
        start = _start_rate(search.base)
        rate = search.next_rate(cplan.rtol, start)
        if rate is None:
            search.done = True
            return
        overrides = {**search.values, **slo_override, RATE_KEY: rate}
        try:
            config = plan.source.load(overrides, origin="--grid")
            error = ""
        except ConfigError as exc:
            config, error = None, str(exc)
        name = f"{search.label},rate={label_part(rate)}" if search.values else f"rate={rate:g}"
        point = Point(name, {**search.values, RATE_KEY: rate}, config, error)
        if point.label in labels:  # two configurations whose labels collide
            make_labels_unique([point, Point(point.label, {}, None)])
        labels.add(point.label)
        runner.submit(point, lambda p, o: judged(search, rate, p, o))

    internal = 0

    def judged(search: Search, rate: float, point: Point, outcome: Outcome) -> None:
        nonlocal internal
        internal += outcome.internal
        if outcome.summary is None:
            if not search.tried:  # the configuration itself is bad
                search.error, search.done = outcome.error, True
                return
            if rate < min(t.rate for t in search.tried):
                # halving found a rate too low to simulate (its arrivals would pass the bound
                # of simulated time, say): the search ends there, saying why
                reason = f"too low to simulate: {outcome.error}"
                search.add(Trial(rate, False, False, reason, math.inf), cplan.rtol)
                search.done = True
                return
            trial = Trial(rate, False, True, outcome.error, math.inf)  # too high to simulate
        else:
            reason = cplan.judge(outcome.summary)
            grew = cplan.judge.queue_grows(outcome.summary)
            trial = Trial(rate, not reason, grew, reason, cplan.judge.violation(outcome.summary))
        if trial.ok and (search.lo is None or rate > search.lo):
            search.lo_outcome, search.lo_label = outcome, point.label
        search.add(trial, cplan.rtol)
        submit(search)

    for search in searches:
        if not search.done:
            submit(search)
    runner.run_until_done()
    table = _capacity_table(searches, plan.varied)
    if out_dir is not None:
        write_table(table, out_dir, "capacity")
    table.attrs["num_internal"] = internal  # simulated rates that stopped on a bug
    return table


def _capacity_table(searches: list[Search], varied: list[str]) -> pd.DataFrame:
    import pandas as pd

    metrics: dict[str, None] = {}
    for s in searches:
        if s.lo_outcome is not None and s.lo_outcome.summary is not None:
            metrics.update(dict.fromkeys(scalar_metrics(s.lo_outcome.summary)))
    rows = []
    for s in searches:
        row: dict[str, Any] = {key: cell(s.values.get(key)) for key in varied}
        gpus = s.base.num_gpus if s.base is not None else math.nan
        if s.base is None or (s.lo is None and s.hi is None):
            rate = math.nan
        else:
            rate = s.lo if s.lo is not None else 0.0
        row["max_request_rate"] = rate
        row["max_request_rate_per_gpu"] = rate / gpus if rate == rate else math.nan
        row["num_gpus"] = gpus
        rates = [t.rate for t in s.tried]
        if s.hi is None and s.lo is not None:
            row["limited_by"] = f"nothing up to {s.lo:g} req/s"
        elif s.lo is None and rates:
            row["limited_by"] = (
                f"no rate from {min(rates):g} to {max(rates):g} req/s is sustained; "
                f"at {min(rates):g}: {s.reason}"
            )
        else:
            row["limited_by"] = s.reason
        row["num_evaluations"] = len(s.tried)
        summary = s.lo_outcome.summary if s.lo_outcome is not None else None
        found = scalar_metrics(summary) if summary is not None else {}
        row.update({m: found.get(m, math.nan) for m in metrics})
        row["error"] = s.error
        row["point"] = s.lo_label
        rows.append(row)
    columns = [
        *varied,
        "max_request_rate",
        "max_request_rate_per_gpu",
        "num_gpus",
        "limited_by",
        "num_evaluations",
        *metrics,
        "error",
        "point",
    ]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(columns)))


def capacity(
    base: str | Path | Mapping[str, Any],
    slo: Mapping[str, float],
    grid: Mapping[str | tuple[str, ...], Any] | None = None,
    *,
    attainment: float | None = None,
    rtol: float = DEFAULT_RTOL,
    max_queue_growth: float = DEFAULT_MAX_QUEUE_GROWTH,
    executor: Executor | None = None,
    out_dir: str | Path | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """The highest arrival rate each configuration sustains within ``slo`` (``capacity.csv``).

    Args:
        base: The base experiment (YAML path, built-in name or mapping) with an arrival rate.
        slo: Summary metric -> limit in ms (``{"p99_ttft_ms": 2000}``); with ``attainment``,
            per-request limits (``{"ttft_ms": 2000, "tpot_ms": 100}``).
        grid: Configurations, as for :func:`batchsim.sweep` (the ``sweep:`` block's grid and
            zip groups apply too).
        attainment: Fraction of requests that must meet every per-request limit.
        rtol: Relative tolerance of the search.
        max_queue_growth: Stability criterion (see the module documentation).
        executor: Any :class:`concurrent.futures.Executor`; default: a local process pool.
        out_dir: Also write the study folder there (resumable).
        progress: Show progress on stderr.
    """
    from batchsim.config import ExperimentSource
    from batchsim.studies.backends import open_executor
    from batchsim.studies.sweep import block_axes, grid_axes, merge_axes

    source = ExperimentSource.read(base)
    block, _ = block_axes(source)
    axes = merge_axes(block, grid_axes(grid or {}))
    cplan = make_plan(source, axes, slo, attainment, rtol, max_queue_growth)
    target = Path(out_dir) if out_dir is not None else None
    mode = "auto" if progress else "off"
    if executor is not None:
        return run_capacity(cplan, executor, out_dir=target, progress=mode)
    with open_executor("local") as pool:
        return run_capacity(cplan, pool, out_dir=target, progress=mode)


def make_plan(
    source: Any,
    axes: list[Any],
    slo: Mapping[str, Any] | list[str],
    attainment: float | None,
    rtol: float,
    max_queue_growth: float,
) -> CapacityPlan:
    """Check the search settings and build the plan."""
    if attainment is not None and (
        isinstance(attainment, bool) or not (0 < float(attainment) <= 1)
    ):
        raise ConfigError(f"--attainment must be a fraction in (0, 1], got {attainment!r}")
    if isinstance(rtol, bool) or not (1e-6 <= float(rtol) <= 1):
        raise ConfigError(f"--rtol must be a number from 1e-6 to 1, got {rtol!r}")
    if isinstance(max_queue_growth, bool) or not (0 <= float(max_queue_growth) <= 10):
        raise ConfigError(
            f"--max-queue-growth must be a number from 0 to 10, got {max_queue_growth!r}"
        )
    limits = parse_slo(slo, attainment)
    judge = Judge(limits, attainment, float(max_queue_growth))
    extra = {
        "slo": limits,
        "attainment": attainment,
        "rtol": float(rtol),
        "max_queue_growth": float(max_queue_growth),
        "rate_key": RATE_KEY,
    }
    plan = SweepPlan(source, axes, 1, kind="capacity", extra=extra)
    return CapacityPlan(plan, judge, float(rtol))
