"""End-to-end calibration: fit a few aggregate terms so that simulated runs match vLLM's own
benchmark results.

Owns reading the result files of vLLM's two benchmark scripts and their setup
(:func:`read_points`), turning each into an experiment to simulate, the shapes they measured
(:func:`e2e_range`) and the fit (:func:`fit_e2e`). The JSON layouts (``docs/calibration.md``
cites the scripts):

* ``benchmarks/benchmark_latency.py --output-json`` (and ``vllm bench latency``):
  ``{"avg_latency": s, "latencies": [s, ...], "percentiles": {"10": s, ...}}`` — one batch of
  ``--batch-size`` requests of ``--input-len`` prompt and ``--output-len`` output tokens, run
  to completion ``--num-iters`` times. The file holds no setup: model, batch size, input and
  output length must be given (options or a sidecar YAML).
* ``benchmarks/benchmark_serving.py --save-result`` (and ``vllm bench serve``): ``completed``,
  ``num_prompts``, ``request_rate`` (a number or ``"inf"``), ``burstiness``,
  ``max_concurrency``, ``total_input_tokens``, ``total_output_tokens``, ``mean_ttft_ms``,
  ``mean_tpot_ms``, ... and, in most versions, the per-request ``input_lens`` and
  ``output_lens``. It holds no GPU, tensor-parallel degree or engine settings; ``model_id``
  is a Hugging Face name, so the model is given too.

Setup: a sidecar ``NAME.yaml`` next to ``NAME.json`` (keys :class:`Setup`), else the command's
options. The fitted terms, and why only these: a handful of end-to-end numbers pin down only
aggregate behaviour — a decode step's time at small batches (weights over bandwidth: the
memory-side efficiencies), how it grows with the batch (CPU time per sequence), the prefill
rate (the compute-side efficiencies) and the fixed CPU time per iteration. So the fit moves
at most four quantities, in this order of priority, never more than the measured numbers:

1. ``memory_scale``: multiplies ``memory``, ``elementwise`` and ``attention_sm_bandwidth``;
2. ``cpu_overhead.base_ms``;
3. ``compute_scale``: multiplies ``compute`` and ``attention``;
4. ``cpu_overhead.per_seq_ms``.

Per-kernel terms (tiles, fixed kernel times, the attention kernel's geometry) keep the base
profile's values: aggregate latencies cannot separate them. Must not import the engine but
through :mod:`batchsim.simulation`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, ValidationError

from batchsim.calibration.held_out import assign_folds
from batchsim.calibration.predict import with_terms, yaml_value
from batchsim.calibration.search import round_sig
from batchsim.catalog.calibrated_range import CalibratedRange
from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.model_files import load_model
from batchsim.errors import ConfigError
from batchsim.validation import ConfigModel, StrictInt, config_error_from_pydantic, format_value
from batchsim.yamlio import read_mapping

__all__ = [
    "E2E_TERMS",
    "E2EFit",
    "E2EPoint",
    "Setup",
    "e2e_range",
    "fit_e2e",
    "profile_values",
    "read_points",
]

E2E_TERMS = ("memory_scale", "cpu_overhead.base_ms", "compute_scale", "cpu_overhead.per_seq_ms")
"""The fitted quantities, in order of priority."""
MEMORY_SIDE = ("memory", "elementwise", "attention_sm_bandwidth")
COMPUTE_SIDE = ("compute", "attention")
_FRACTIONS = {"memory", "elementwise", "compute", "attention"}
_BOUNDS = {
    "cpu_overhead.base_ms": (0.001, 100.0),
    "cpu_overhead.per_seq_ms": (0.0001, 10.0),
}
SERVING_METRICS = ("mean_ttft_ms", "mean_tpot_ms")
"""The serving results compared (TTFT: prefill and queueing; TPOT: the decode step)."""


class Setup(ConfigModel):
    """What a benchmark result file does not say (sidecar ``NAME.yaml`` or options)."""

    model: str = Field(min_length=1)
    """Built-in model name, model YAML or config.json."""
    tensor_parallel_size: StrictInt = Field(1, ge=1, le=4096)
    batch_size: StrictInt | None = Field(None, ge=1, le=1_000_000)
    """benchmark_latency: ``--batch-size``."""
    input_len: StrictInt | None = Field(None, ge=1, le=2**24)
    """``--input-len`` (latency) / prompt tokens per request (serving, when the file has no
    ``input_lens``)."""
    output_len: StrictInt | None = Field(None, ge=1, le=2**24)
    """``--output-len`` / output tokens per request (serving, when no ``output_lens``)."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Experiment keys of the simulated engine, dotted (``scheduler.max_num_seqs: 256``)."""


@dataclass(frozen=True)
class E2EPoint:
    """One result file: what to simulate and what was measured.

    Attributes:
        file: File name (no directory).
        kind: ``latency`` or ``serving``.
        setup: Its setup.
        measured: Metric -> measured value (``avg_latency_s``; ``mean_ttft_ms``,
            ``mean_tpot_ms``).
        experiment: The experiment mapping to simulate (``hardware`` filled in at run time).
        overrides: Dotted experiment keys from the setup's ``set``.
        lengths: Per-request (prompt, output) tokens of a serving run, when the file has them.
        notes: How the simulation departs from the benchmark, one line each.
    """

    file: str
    kind: str
    setup: Setup
    measured: dict[str, float]
    experiment: dict[str, Any]
    overrides: dict[str, Any] = field(default_factory=dict)
    lengths: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    notes: list[str] = field(default_factory=list)


def _number(data: Mapping[str, Any], key: str, shown: str, *, required: bool = True) -> Any:
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{key}: missing (a vLLM benchmark result has it)", shown)
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{key} must be a number > 0, got {format_value(value)}", shown)
    return value


def _setup(path: Path, defaults: Mapping[str, Any]) -> Setup:
    sidecar = path.with_suffix(".yaml")
    data = {k: v for k, v in defaults.items() if v is not None}
    source = "command-line options"
    if sidecar.is_file():
        raw, _ = read_mapping(sidecar)
        data.update(raw)
        source = str(sidecar)
    if "model" not in data:
        raise ConfigError(
            f"{path.name}: the model is not in the file: give --model NAME (one model for "
            f"every --e2e file) or write model: in {sidecar}"
        )
    try:
        return Setup.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_pydantic(exc, "", source, model=Setup) from None


def _lens(data: Mapping[str, Any], key: str, shown: str) -> list[int] | None:
    values = data.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ConfigError(f"{key} must be a list of whole numbers >= 0", shown)
    return values


def _serving(path: Path, data: dict[str, Any], setup: Setup) -> E2EPoint:
    shown = str(path)
    measured = {m: float(_number(data, m, shown)) for m in SERVING_METRICS}
    completed = int(_number(data, "completed", shown))
    rate_raw = data.get("request_rate")
    if rate_raw == "inf" or (isinstance(rate_raw, float) and math.isinf(rate_raw)):
        rate = math.inf
    else:
        rate = float(_number(data, "request_rate", shown))
    burstiness = float(_number(data, "burstiness", shown, required=False) or 1.0)
    concurrency = data.get("max_concurrency")
    if concurrency is not None:
        concurrency = int(_number(data, "max_concurrency", shown))
    lengths = None
    inputs, outputs = _lens(data, "input_lens", shown), _lens(data, "output_lens", shown)
    notes: list[str] = []
    if inputs is not None and outputs is not None and len(inputs) == len(outputs):
        pairs = [(i, o) for i, o in zip(inputs, outputs, strict=True) if i > 0 and o > 0]
        if not pairs:
            raise ConfigError("input_lens/output_lens: no request with tokens", shown)
        lengths = (tuple(p for p, _ in pairs), tuple(o for _, o in pairs))
    elif setup.input_len is None or setup.output_len is None:
        total_in = _number(data, "total_input_tokens", shown)
        total_out = _number(data, "total_output_tokens", shown)
        setup = setup.model_copy(
            update={
                "input_len": setup.input_len or max(1, round(total_in / completed)),
                "output_len": setup.output_len or max(1, round(total_out / completed)),
            }
        )
        notes.append(
            f"no input_lens/output_lens in the file: every request simulated with the mean "
            f"lengths {setup.input_len} / {setup.output_len} tokens"
        )
    n = len(lengths[0]) if lengths else completed
    if rate == math.inf and concurrency is None:
        workload: dict[str, Any] = {"arrival": {"process": "all_at_once"}}
    elif rate == math.inf:  # --max-concurrency users sending back to back: a closed loop
        workload = {"concurrency": concurrency}
    elif burstiness == 1.0:
        workload = {"arrival": {"process": "poisson", "rate": rate}}
    else:  # vLLM: gamma intervals of shape = burstiness, i.e. cv = 1 / sqrt(burstiness)
        workload = {"arrival": {"process": "gamma", "rate": rate, "cv": 1 / math.sqrt(burstiness)}}
    if concurrency is not None and rate != math.inf:
        notes.append(
            f"max_concurrency {concurrency} with request_rate {rate:g}: simulated open loop at "
            "the rate (batchsim's closed loop has no arrival rate)"
        )
    workload["num_requests"] = n
    if lengths is None:
        assert setup.input_len is not None and setup.output_len is not None
        workload["prompt_tokens"] = {"dist": "fixed", "value": setup.input_len}
        workload["output_tokens"] = {"dist": "fixed", "value": setup.output_len}
    experiment = _experiment(path, setup, workload)
    return E2EPoint(
        path.name, "serving", setup, measured, experiment, dict(setup.set), lengths, notes
    )


def _latency(path: Path, data: dict[str, Any], setup: Setup) -> E2EPoint:
    shown = str(path)
    avg = float(_number(data, "avg_latency", shown))
    for key in ("batch_size", "input_len", "output_len"):
        if getattr(setup, key) is None:
            raise ConfigError(
                f"{path.name}: {key} is not in a benchmark_latency result: give "
                f"--{key.replace('_', '-')} or write {key}: in {path.with_suffix('.yaml')}"
            )
    workload = {
        "num_requests": setup.batch_size,
        "arrival": {"process": "all_at_once"},
        "prompt_tokens": {"dist": "fixed", "value": setup.input_len},
        "output_tokens": {"dist": "fixed", "value": setup.output_len},
    }
    experiment = _experiment(path, setup, workload)
    return E2EPoint(
        path.name, "latency", setup, {"avg_latency_s": avg}, experiment, dict(setup.set)
    )


def _experiment(path: Path, setup: Setup, workload: dict[str, Any]) -> dict[str, Any]:
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in path.stem)[:60] or "e2e"
    return {
        "name": name.lstrip(".") or "e2e",
        "seed": 0,
        "hardware": "in-memory",
        "model": setup.model,
        "parallel": {"tensor_parallel_size": setup.tensor_parallel_size},
        "workload": workload,
    }


def read_points(paths: Sequence[str], defaults: Mapping[str, Any]) -> list[E2EPoint]:
    """Read vLLM benchmark result files and their setup.

    Args:
        paths: ``benchmark_latency`` / ``benchmark_serving`` JSON files.
        defaults: Setup keys from the command line (``model``, ``tensor_parallel_size``,
            ``batch_size``, ``input_len``, ``output_len``; None: not given); a sidecar YAML
            overrides them.

    Raises:
        ConfigError: A missing or unreadable file, a result of neither script, a missing or
            non-positive value, setup that is neither in the sidecar nor given.
    """
    points = []
    for text in paths:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"--e2e: no such file: {text}")
        data, _ = read_mapping(path)
        setup = _setup(path, defaults)
        load_model(setup.model, "model")  # an unknown model is an error now, not mid-fit
        if "avg_latency" in data:
            points.append(_latency(path, data, setup))
        elif any(m in data for m in SERVING_METRICS):
            points.append(_serving(path, data, setup))
        else:
            raise ConfigError(
                "not a vLLM benchmark result: expected avg_latency (benchmark_latency "
                "--output-json) or mean_ttft_ms and mean_tpot_ms (benchmark_serving "
                "--save-result)",
                str(path),
            )
        _check_experiment(points[-1])
    return points


def _check_experiment(point: E2EPoint) -> None:
    """Validate the experiment a point simulates (its ``set:`` keys included) now, before
    any fitting; per-request lengths stand in as their means."""
    from batchsim.config import load_experiment

    experiment = dict(point.experiment)
    if point.lengths is not None:
        prompt, output = (max(1, round(sum(v) / len(v))) for v in point.lengths)
        experiment["workload"] = {
            **experiment["workload"],
            "prompt_tokens": {"dist": "fixed", "value": prompt},
            "output_tokens": {"dist": "fixed", "value": output},
        }
    try:
        load_experiment(experiment, point.overrides, origin="set")
    except ConfigError as exc:
        raise ConfigError(f"{point.file}: simulated experiment: {exc.message}") from None


# ------------------------------------------------------------------------------ simulation


def e2e_range(points: Sequence[E2EPoint]) -> CalibratedRange:
    """The shapes the points measured, as a profile's ``calibrated_range:``: their models
    and hidden sizes, tensor-parallel degrees and longest context (prompt + output tokens of
    a request; not measured when no point tells it)."""
    models = sorted({load_model(p.setup.model).name for p in points})
    hidden = [load_model(p.setup.model).hidden_size for p in points]
    tps = sorted({p.setup.tensor_parallel_size for p in points})
    contexts = []
    for p in points:
        if p.lengths is not None:
            contexts.append(max(a + b for a, b in zip(*p.lengths, strict=True)))
        elif p.setup.input_len and p.setup.output_len:
            contexts.append(p.setup.input_len + p.setup.output_len)
    return CalibratedRange(
        models=tuple(models),
        hidden_size=(min(hidden), max(hidden)),
        tensor_parallel_size=tuple(tps),
        context_tokens=(0, max(contexts)) if contexts else None,
    )


def profile_values(
    base: HardwareProfile, scales: Mapping[str, float], rounded: bool = True
) -> dict[str, float]:
    """The profile terms (YAML units) of the fitted quantities ``scales``
    (:data:`E2E_TERMS`), to 4 significant digits unless not ``rounded``."""
    values: dict[str, float] = {}
    for key in MEMORY_SIDE:
        values[key] = yaml_value(base, key) * scales.get("memory_scale", 1.0)
    for key in COMPUTE_SIDE:
        values[key] = yaml_value(base, key) * scales.get("compute_scale", 1.0)
    for key in ("cpu_overhead.base_ms", "cpu_overhead.per_seq_ms"):
        values[key] = scales.get(key, yaml_value(base, key))
    if rounded:
        values = {k: round_sig(v) for k, v in values.items()}
    return values


def _scale_bounds(base: HardwareProfile) -> dict[str, tuple[float, float]]:
    def top(keys: Sequence[str]) -> float:
        return min(1.0 / yaml_value(base, k) for k in keys if k in _FRACTIONS)

    return {
        "memory_scale": (0.2, top(MEMORY_SIDE)),
        "compute_scale": (0.2, top(COMPUTE_SIDE)),
        **_BOUNDS,
    }


class _Simulator:
    """Simulates the points (traces of per-request lengths written once, in ``workdir``)."""

    def __init__(self, points: Sequence[E2EPoint], workdir: Path) -> None:
        from batchsim.config import load_experiment

        self.configs = []
        for i, point in enumerate(points):
            experiment = dict(point.experiment)
            if point.lengths is not None:
                trace = workdir / f"lengths-{i}.csv"
                with open(trace, "w", newline="", encoding="utf-8") as f:
                    writer = csv.writer(f)
                    writer.writerow(["prompt_tokens", "output_tokens"])
                    writer.writerows(zip(*point.lengths, strict=True))
                workload = dict(experiment["workload"])
                workload["trace"] = {"path": str(trace), "columns": {"arrival_time": None}}
                experiment["workload"] = workload
            try:
                config = load_experiment(experiment, point.overrides, origin=f"{point.file}: set")
            except ConfigError as exc:
                raise ConfigError(f"{point.file}: simulated experiment: {exc.message}") from None
            self.configs.append(config)

    def run(self, hw: HardwareProfile, which: Sequence[int]) -> dict[int, dict[str, float]]:
        """Simulated metrics of points ``which`` on ``hw``."""
        from batchsim.simulation import simulate

        out = {}
        for i in which:
            summary = simulate(self.configs[i], None, None, hw).summary
            out[i] = {
                "avg_latency_s": float(summary["duration"]),
                "mean_ttft_ms": float(summary["mean_ttft_ms"]),
                "mean_tpot_ms": float(summary["mean_tpot_ms"]),
            }
        return out


def _errors(points: Sequence[E2EPoint], sims: Mapping[int, Mapping[str, float]]) -> list[float]:
    errs = []
    for i, sim in sims.items():
        for metric, value in points[i].measured.items():
            errs.append(abs(sim[metric] / value - 1.0) * 100.0)
    return errs


@dataclass
class E2EFit:
    """What :func:`fit_e2e` found.

    Attributes:
        scales: The fitted quantities (:data:`E2E_TERMS` subset).
        values: The profile terms they set (YAML units).
        rows: Per point and metric: file, metric, measured, base, fitted, held-out (NaN:
            none) simulated values.
        folds: Folds of the held-out error (0: none).
    """

    scales: dict[str, float]
    values: dict[str, float]
    rows: list[dict[str, Any]]
    folds: int


def _fit(
    sim: _Simulator,
    points: Sequence[E2EPoint],
    base: HardwareProfile,
    which: Sequence[int],
) -> dict[str, float]:
    """Least squares of log(simulated / measured) over the points ``which``, in the log of
    each fitted quantity (Nelder-Mead from ``base``: deterministic)."""
    from scipy.optimize import minimize

    observations = sum(len(points[i].measured) for i in which)
    terms = E2E_TERMS[: min(len(E2E_TERMS), observations)]
    bounds = _scale_bounds(base)
    start = {
        "memory_scale": 1.0,
        "compute_scale": 1.0,
        "cpu_overhead.base_ms": max(yaml_value(base, "cpu_overhead.base_ms"), 0.1),
        "cpu_overhead.per_seq_ms": max(yaml_value(base, "cpu_overhead.per_seq_ms"), 0.01),
    }
    x0 = np.zeros(len(terms))
    lower = np.array([math.log(max(bounds[k][0], 1e-3) / start[k]) for k in terms])
    upper = np.array([math.log(bounds[k][1] / start[k]) for k in terms])
    x0 = np.clip(x0, lower + 1e-9, upper - 1e-9)

    def scales_of(x: np.ndarray) -> dict[str, float]:
        return {k: start[k] * math.exp(float(v)) for k, v in zip(terms, x, strict=True)}

    def residuals(x: np.ndarray) -> np.ndarray:
        scales = scales_of(x)
        hw = with_terms(base, profile_values(base, scales, rounded=False))
        sims = sim.run(hw, which)
        return np.array(
            [
                math.log(sims[i][metric] / value)
                for i in which
                for metric, value in points[i].measured.items()
            ]
        )

    def score(x: np.ndarray) -> float:
        if np.any(x < lower) or np.any(x > upper):
            return math.inf
        return float(np.sum(residuals(x) ** 2))

    # Nelder-Mead: no derivatives (a serving run's mean TTFT moves in small steps as
    # iterations and arrivals realign), first steps of 10 % in every quantity
    simplex = np.vstack([x0, x0 + 0.1 * np.eye(len(terms))])
    options = {
        "initial_simplex": simplex,
        "xatol": 2e-3,
        "fatol": 1e-7,
        "maxfev": 60 * len(terms),
    }
    fit = minimize(score, x0, method="Nelder-Mead", options=options)
    return {k: round_sig(v) for k, v in scales_of(fit.x).items()}


MAX_MEASURED_RATIO = 100.0
"""A measured number more than this many times what the base profile simulates (or less
than its inverse) is refused: no setting of the fitted terms within their bounds comes near
it, so it is a wrong file or setup, not something to fit."""


def _check_plausible(
    points: Sequence[E2EPoint], base_sims: Mapping[int, Mapping[str, float]], base: HardwareProfile
) -> None:
    for i, point in enumerate(points):
        for metric, value in point.measured.items():
            simulated = base_sims[i][metric]
            ratio = value / simulated if simulated > 0 else math.inf
            if not 1 / MAX_MEASURED_RATIO <= ratio <= MAX_MEASURED_RATIO:
                key = "avg_latency" if metric == "avg_latency_s" else metric
                unit = "s" if metric == "avg_latency_s" else "ms"
                times = "over 1e300" if math.isinf(ratio) else f"{ratio:.3g}"
                raise ConfigError(
                    f"{key} {value:.4g} {unit} is {times} times what {base.name} simulates "
                    f"for this setup ({simulated:.4g} {unit}); a measurement must lie within "
                    f"{MAX_MEASURED_RATIO:g}x of it either way (is it of this model, GPU and "
                    "setup?)",
                    point.file,
                )


def fit_e2e(
    points: Sequence[E2EPoint], base: HardwareProfile, workdir: Path, folds: int = 5
) -> E2EFit:
    """Fit :data:`E2E_TERMS` (as many as there are measured numbers) so that the simulated
    points match the measured ones (mean absolute % error), from ``base``; then, with two or
    more files, the held-out error: each of ``min(folds, files)`` folds of files is left out,
    the terms fitted on the rest and the left-out files simulated.

    Args:
        points: The result files.
        base: The profile to start from (with any per-operator fit already applied).
        workdir: A directory for the per-request length files.
        folds: Folds of the held-out error (< 2: none).
    """
    sim = _Simulator(points, workdir)
    every = list(range(len(points)))
    base_sims = sim.run(base, every)
    _check_plausible(points, base_sims, base)
    scales = _fit(sim, points, base, every)
    values = profile_values(base, scales)
    fitted = sim.run(with_terms(base, values), every)
    held: dict[int, dict[str, float]] = {}
    k = min(folds, len(points))
    if k >= 2:
        fold_of = assign_folds([(p.file, i) for i, p in enumerate(points)], k)
        for f in range(k):
            train = [i for i in every if fold_of[i] != f]
            test = [i for i in every if fold_of[i] == f]
            sub = _fit(sim, points, base, train)
            held.update(sim.run(with_terms(base, profile_values(base, sub)), test))
    rows = []
    for i, point in enumerate(points):
        for metric, value in point.measured.items():
            rows.append(
                {
                    "file": point.file,
                    "metric": metric,
                    "measured": value,
                    "base": base_sims[i][metric],
                    "fitted": fitted[i][metric],
                    "held_out": held[i][metric] if i in held else math.nan,
                }
            )
    return E2EFit(scales, values, rows, k if k >= 2 else 0)
