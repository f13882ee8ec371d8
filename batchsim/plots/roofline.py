"""``batchsim plot roofline``: every iteration of a run on the roofline of its GPU.

Each iteration is a point: its arithmetic intensity (``iterations.csv``
``arithmetic_intensity``, FLOP per device-memory byte) against the FLOP/s it achieved
(``flops`` / ``gpu_time_ms``, the GPU part of the iteration: the forward pass, its fixed
launch cost and, under tensor parallelism, its all-reduces; CPU scheduling and swap copies
are not in it), log-log, coloured by composition: prefill only, decode only, or both
(``num_prefill_tokens``, ``num_decode_tokens``). A run of more than :data:`MAX_POINTS`
iterations is drawn from a deterministic sample of that many (every composition keeps
at least a tenth of the sample, or all of its iterations if fewer), and the figure says so.

The roofs are those of one GPU of the hardware profile named in the run's config, for the
compute dtype the weights run at (``batchsim.cost.terms.compute_dtype``: bf16/fp16 as such,
fp8 on GPUs with fp8 tensor cores, 16-bit for weight-only int8/int4): the datasheet dense
peak FLOP/s and memory bandwidth (solid), and the achievable roofs the cost model prices
GEMMs and streaming reads at, peak x ``efficiency.compute`` and bandwidth x
``efficiency.memory`` (dashed), each with its ridge point (peak / bandwidth, FLOP/B).

**Tensor parallelism.** The cost model prices an iteration on one GPU: with
``tensor_parallel_size`` N, ``iterations.csv`` ``flops`` and ``bytes`` are those of one GPU
(a 1/N shard of the weights and heads, its all-reduce traffic not counted in ``bytes``), and
``gpu_time_ms`` is the time of that GPU. So the points and the roofs are both per GPU, and the
roofs are not multiplied by N; the figure says "per GPU" when N > 1.

**Clusters.** The iterations of every replica share one figure when the replicas share
their GPU, dtype and tensor parallelism; when groups of replicas differ
(``cluster.replicas: [...]``), only the first group's replicas are drawn, under their own
roofs, and the figure says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from batchsim.errors import ConfigError
from batchsim.plots.data import Run, Study
from batchsim.plots.style import PHASE_COLORS, catalog_name, finish, new_figure, run_title, suptitle

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from batchsim.catalog.hardware import HardwareProfile
    from batchsim.plots import PlotOptions

MAX_POINTS = 20_000
"""Most iterations drawn; a larger run is drawn from a deterministic sample."""
SAMPLE_SEED = 0

COLUMNS = (
    "flops",
    "bytes",
    "arithmetic_intensity",
    "gpu_time_ms",
    "num_prefill_tokens",
    "num_decode_tokens",
)
"""The ``iterations.csv`` columns the figure reads."""

PHASES = (
    ("prefill", "prefill only"),
    ("decode", "decode only"),
    ("mixed", "prefill + decode"),
)
"""(composition, legend name), in drawing order."""

ROOF_COLOR = "0.15"
ACHIEVABLE_COLOR = "0.45"
TFLOPS = 1e12


def applies(source: Run | Study) -> bool:
    """A run with an ``iterations.csv`` of at least one iteration."""
    from batchsim.plots.kv import has_iterations

    return isinstance(source, Run) and has_iterations(source)


def plot(sources: list[Run | Study], options: PlotOptions) -> Figure:
    """The run's iterations (arithmetic intensity vs achieved TFLOP/s, log-log) under the
    compute and memory roofs of its GPU.

    Raises:
        ConfigError: Not exactly one run folder, a run without ``iterations.csv``, an
            iterations.csv without the columns it needs, or a hardware profile that cannot be
            loaded; one line naming the folder.
    """
    run = _one_run(sources)
    iterations = run.iterations
    absent = [c for c in COLUMNS if c not in iterations.columns]
    if absent:
        raise ConfigError(f"{run.table_path('iterations')}: no column {absent[0]!r}")
    gpu = _gpu(run)
    if gpu.replicas is not None:
        iterations = iterations[np.isin(iterations["replica"].to_numpy(), gpu.replicas)]
    hardware, dtype = _hardware(run, gpu.hardware, gpu.dtype)
    roofs = Roofs.of(hardware, dtype)

    phase = composition(iterations)
    flops = iterations["flops"].to_numpy(dtype=float)
    seconds = iterations["gpu_time_ms"].to_numpy(dtype=float) / 1e3
    intensity = iterations["arithmetic_intensity"].to_numpy(dtype=float)
    drawable = (flops > 0) & (seconds > 0) & (intensity > 0) & (phase != "")
    total = int(drawable.sum())
    if not total:
        raise ConfigError(f"{run.path}: no iteration with FLOPs and GPU time to draw")
    chosen = sample(np.flatnonzero(drawable), phase, MAX_POINTS)

    fig, ax = new_figure(figsize=(8.0, 5.6))
    x_all, y_all = intensity[drawable], flops[drawable] / seconds[drawable] / TFLOPS
    lo = min(float(x_all.min()), roofs.ridge_achievable) / 3
    hi = max(float(x_all.max()), roofs.ridge) * 3
    for key, name in PHASES:
        rows = chosen[phase[chosen] == key]
        count = int((phase[drawable] == key).sum())
        if not count:
            continue
        ax.scatter(
            intensity[rows],
            flops[rows] / seconds[rows] / TFLOPS,
            s=9,
            alpha=0.5,
            linewidths=0,
            color=PHASE_COLORS[key],
            label=f"{name} ({count:,} iterations)",
            rasterized=rows.size > 2_000,
        )
    _draw_roofs(ax, roofs, lo, hi)

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    top = roofs.peak / TFLOPS
    ax.set_ylim(min(float(y_all.min()), roofs.bandwidth * lo / TFLOPS) / 2, top * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP/B)")
    per_gpu = " per GPU" if gpu.tp > 1 else ""
    ax.set_ylabel(f"achieved TFLOP/s{per_gpu} (FLOPs / GPU time)")
    notes = [f"{roofs.dtype} peaks of {hardware.name}", *gpu.notes]
    sampled = run.iterations_note()
    if sampled:
        notes.append(sampled)
    if total > chosen.size:
        notes.append(f"a sample of {chosen.size:,} of {total:,} iterations drawn")
    if per_gpu:
        notes.append(f"tensor parallel x{gpu.tp}: FLOPs, bytes, time and roofs of one GPU")
    ax.set_title("; ".join(notes), fontsize="small", color="0.3")
    finish(ax, loc="upper left", markerscale=2)
    suptitle(fig, run_title("Roofline", run.config))
    return fig


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Roofs:
    """One GPU's roofs for one compute dtype: datasheet and achievable, FLOP/s and B/s."""

    dtype: str
    peak: float
    bandwidth: float
    peak_achievable: float
    bandwidth_achievable: float

    @classmethod
    def of(cls, hardware: HardwareProfile, dtype: str) -> Roofs:
        """The roofs of ``hardware`` for weights of ``dtype`` (``engine.dtype``)."""
        from batchsim.cost.terms import compute_dtype

        cdtype = compute_dtype(hardware, dtype)
        peak = hardware.peak_flops_for(cdtype)
        return cls(
            cdtype,
            peak,
            hardware.memory_bandwidth,
            peak * hardware.compute_efficiency,
            hardware.memory_bandwidth * hardware.memory_efficiency,
        )

    @property
    def ridge(self) -> float:
        """Datasheet ridge point, FLOP/B."""
        return self.peak / self.bandwidth

    @property
    def ridge_achievable(self) -> float:
        """Ridge point of the achievable roofs, FLOP/B."""
        return self.peak_achievable / self.bandwidth_achievable

    @property
    def has_achievable(self) -> bool:
        return (self.peak_achievable, self.bandwidth_achievable) != (self.peak, self.bandwidth)


def composition(iterations: pd.DataFrame) -> np.ndarray:
    """``prefill``, ``decode`` or ``mixed`` per iteration ('' for one with neither)."""
    prefill = iterations["num_prefill_tokens"].to_numpy() > 0
    decode = iterations["num_decode_tokens"].to_numpy() > 0
    out = np.full(prefill.size, "", dtype=object)
    out[prefill & ~decode] = "prefill"
    out[decode & ~prefill] = "decode"
    out[prefill & decode] = "mixed"
    return out


def sample(rows: np.ndarray, phase: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` of ``rows`` (sorted), the same every time: all when few;
    otherwise each composition gets its share of ``limit``, and at least a tenth of it (or
    all its rows, if fewer), so rare prefill iterations stay visible among millions of
    decodes."""
    if rows.size <= limit:
        return rows
    rng = np.random.default_rng(SAMPLE_SEED)
    groups = [rows[phase[rows] == key] for key, _ in PHASES]
    wants = [min(g.size, max(round(limit * g.size / rows.size), limit // 10)) for g in groups]
    largest = int(np.argmax([g.size for g in groups]))
    wants[largest] -= max(0, sum(wants) - limit)  # the floors of the small groups come from it
    picked = [
        rng.choice(g, size=want, replace=False) if want < g.size else g
        for g, want in zip(groups, wants)
    ]
    return np.sort(np.concatenate(picked))


def _tp(config: dict[str, Any]) -> int:
    tp = (config.get("parallel") or {}).get("tensor_parallel_size", 1)
    return int(tp) if isinstance(tp, int) and not isinstance(tp, bool) else 1


@dataclass(frozen=True)
class _Gpu:
    """The GPU whose roofs the figure draws, and the replicas drawn under them."""

    hardware: Any
    dtype: str
    tp: int
    replicas: list[int] | None = None
    """The replicas drawn (None: every iteration of the run)."""
    notes: tuple[str, ...] = ()


def _gpu(run: Run) -> _Gpu:
    """The run's GPU; for a cluster whose groups of replicas differ, the first group's."""
    config = run.config
    hardware = config.get("hardware")
    dtype = str((config.get("engine") or {}).get("dtype") or "bf16")
    tp = _tp(config)
    cluster = config.get("cluster")
    groups = cluster.get("replicas") if isinstance(cluster, dict) else None
    pools = cluster.get("disaggregation") if isinstance(cluster, dict) else None
    if isinstance(pools, dict):  # the prefill pool and the decode pool, as groups
        groups = [
            {**pool, "count": pool.get("replicas")}
            for pool in (pools.get("prefill"), pools.get("decode"))
            if isinstance(pool, dict)
        ]
    if not isinstance(groups, list) or not groups:
        return _Gpu(hardware, dtype, tp)
    kinds = []
    for group in groups:
        group = group if isinstance(group, dict) else {}
        engine = group.get("engine") or {}
        kinds.append(
            (
                group.get("hardware") or hardware,
                str(engine.get("dtype") or dtype),
                _tp({"parallel": group.get("parallel") or config.get("parallel")}),
                int(group.get("count") or 0),
            )
        )
    if len({kind[:3] for kind in kinds}) == 1:
        return _Gpu(*kinds[0][:3])
    first_hardware, first_dtype, first_tp, count = kinds[0]
    name = catalog_name(first_hardware)
    last = f"-{count - 1}" if count > 1 else ""
    note = f"replicas 0{last} ({count} x {name}) of {sum(k[3] for k in kinds)}"
    return _Gpu(first_hardware, first_dtype, first_tp, list(range(count)), (note,))


def _hardware(run: Run, name: Any, dtype: str) -> tuple[HardwareProfile, str]:
    from batchsim.catalog.hardware_files import load_hardware

    if not isinstance(name, str) or not name:
        raise ConfigError(f"{run.path}: the run's config names no hardware profile")
    try:
        hardware = load_hardware(name)
        Roofs.of(hardware, dtype)
    except ConfigError as exc:
        raise ConfigError(f"{run.path}: cannot draw its GPU's roofs: {exc.message}") from None
    return hardware, dtype


def _one_run(sources: Sequence[Run | Study]) -> Run:
    if len(sources) != 1:
        names = ", ".join(str(s.path) for s in sources) or "none"
        raise ConfigError(f"roofline draws one run per figure, got {len(sources)} folders: {names}")
    source = sources[0]
    if isinstance(source, Study):
        raise ConfigError(
            f"{source.path}: a {source.kind} study; roofline draws one run (give the folder "
            "of one of its points, under points/)"
        )
    if not source.has_table("iterations"):
        raise source.missing_table("iterations", "roofline")
    return source


# --------------------------------------------------------------------------- drawing


def _draw_roofs(ax: Axes, roofs: Roofs, lo: float, hi: float) -> None:
    """Memory roof up to the ridge point, compute roof after it, for the datasheet and the
    achievable numbers; the ridge points marked and labelled."""
    _roof(ax, roofs.peak, roofs.bandwidth, lo, hi, "datasheet", "-", ROOF_COLOR)
    if roofs.has_achievable:
        _roof(
            ax,
            roofs.peak_achievable,
            roofs.bandwidth_achievable,
            lo,
            hi,
            "achievable",
            "--",
            ACHIEVABLE_COLOR,
        )


def _roof(
    ax: Axes,
    peak: float,
    bandwidth: float,
    lo: float,
    hi: float,
    kind: str,
    style: str,
    color: str,
) -> None:
    ridge = peak / bandwidth
    ax.plot(
        [lo, ridge],
        [bandwidth * lo / TFLOPS, peak / TFLOPS],
        linestyle=style,
        color=color,
        linewidth=1.4,
        label=f"memory roof, {kind}: {bandwidth / 1e12:.4g} TB/s",
    )
    ax.plot(
        [ridge, hi],
        [peak / TFLOPS, peak / TFLOPS],
        linestyle=style,
        color=color,
        linewidth=2.0,
        label=f"compute roof, {kind}: {peak / TFLOPS:.4g} TFLOP/s",
    )
    ax.plot([ridge], [peak / TFLOPS], marker="o", color=color, markersize=5)
    # the ridge point's intensity: a dotted drop line, labelled at the bottom of the axes
    # (beside the corner, where iterations are compute-heavy and high, there are no points)
    ax.axvline(ridge, color=color, linestyle=":", linewidth=0.9)
    datasheet = kind == "datasheet"
    ax.annotate(
        f"ridge {ridge:.0f} FLOP/B ({kind})",
        (ridge, 0.02),
        xycoords=("data", "axes fraction"),
        xytext=(3 if datasheet else -3, 0),
        textcoords="offset points",
        rotation=90,
        fontsize="x-small",
        color=color,
        ha="left" if datasheet else "right",
        va="bottom",
    )
