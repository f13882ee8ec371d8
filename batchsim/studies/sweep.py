"""``batchsim sweep``: one experiment, a grid of overrides, a table with one row per point.

The axes come from the experiment's ``sweep:`` block and from ``--grid``/``--zip`` (an axis
given on the command line replaces the block's axis of the same key)::

    sweep:
      grid:                                   # the cartesian product of these axes
        scheduler.policy: [static, continuous]
        scheduler.max_num_seqs: pow2:1..512
      zip:                                    # keys that vary together: one axis
        - scheduler.max_num_seqs: [8, 16, 32]
          scheduler.max_num_batched_tokens: [2048, 4096, 8192]
      seeds: 3                                # repetitions with seeds seed, seed+1, ...

Each point is the base experiment with its values set as ``--set`` would set them (a block
value replaces the whole block). Its row in ``sweep.csv``: a column per varied key (dotted
path), ``seed``, every summary metric under its summary name, ``wall_time_s``, ``error``
(empty where the point ran) and ``point`` (its folder under ``points/``). With several seeds,
``sweep_stats.csv`` has one row per configuration: each metric's mean over the seeds that ran
and ``<metric>_ci95``, the half-width of its 95 % Student-t confidence interval.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError

from batchsim.config import ExperimentConfig, ExperimentSource
from batchsim.errors import ConfigError, write_error
from batchsim.studies.grid import (
    MAX_POINTS,
    Axis,
    cell,
    check_key,
    combine_axes,
    expand,
    label_part,
    parse_values,
    short_names,
    varied_keys,
    zip_axis,
)
from batchsim.studies.store import (
    MARKER,
    FileDigests,
    Outcome,
    Point,
    PointStore,
    write_atomic,
)
from batchsim.validation import ConfigModel, StrictInt, config_error_from_pydantic

if TYPE_CHECKING:
    import pandas as pd

MAX_SEEDS = 10_000
MAX_LABEL_CHARS = 120

KEY_METRICS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "mean_batch_size",
    "busy_fraction",
    "prefix_cache_hit_rate",
)
"""The metrics printed in the table on the terminal (the files have all of them); those a
run does not report are left out, and so is ``prefix_cache_hit_rate`` (0) when no point
enables prefix caching."""


class SweepBlock(ConfigModel):
    """The ``sweep:`` block of an experiment."""

    grid: dict[str, Any] = Field(default_factory=dict)
    """Axes of the cartesian product: dotted key -> values (a list or a range form)."""
    zip: list[dict[str, Any]] = Field(default_factory=list)
    """Groups of keys that vary together: each a mapping of dotted key -> values."""
    seeds: StrictInt = Field(1, ge=1, le=MAX_SEEDS)
    """Repetitions of every point, with seeds seed, seed + 1, ..."""


@dataclass
class SweepPlan:
    """A sweep, resolved: the base experiment, its axes and the number of seeds."""

    source: ExperimentSource
    axes: list[Axis]
    seeds: int = 1
    kind: str = "sweep"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def varied(self) -> list[str]:
        return varied_keys(self.axes)


def block_axes(source: ExperimentSource) -> tuple[list[Axis], int]:
    """The axes and seeds of the experiment's ``sweep:`` block (none if it has none)."""
    raw = source.studies.get("sweep")
    if raw is None:
        return [], 1
    if not isinstance(raw, Mapping):
        raise source.block_error("sweep: must be a mapping with grid, zip and seeds", ["sweep"])
    data = dict(raw)
    if isinstance(data.get("zip"), Mapping):
        data["zip"] = [data["zip"]]  # one group
    try:
        block = SweepBlock.model_validate(data)
    except ValidationError as exc:
        err = config_error_from_pydantic(exc, "sweep", model=SweepBlock)
        path = err.message.split(" ", 1)[0].rstrip(":").split(".")
        raise source.block_error(err.message, path) from None
    axes = []
    for key, spec in block.grid.items():
        origin = f"sweep.grid.{key}"
        try:
            check_key(key, origin)
            axes.append(Axis((key,), tuple((v,) for v in parse_values(spec, origin)), origin))
        except ConfigError as exc:
            raise source.block_error(exc.message, ["sweep", "grid", key]) from None
    for i, group in enumerate(block.zip):
        origin = f"sweep.zip[{i}]"
        try:
            values = {}
            for key, spec in group.items():
                check_key(key, f"{origin}.{key}")
                values[key] = parse_values(spec, f"{origin}.{key}")
            if not values:
                raise ConfigError(f"{origin}: an empty zip group")
            axes.append(zip_axis(values, origin))
        except ConfigError as exc:
            raise source.block_error(exc.message, ["sweep", "zip"]) from None
    return axes, block.seeds


def grid_axes(
    grid: Mapping[str | tuple[str, ...], Any] | Sequence[tuple[str, Any]],
    origin: str = "grid",
) -> list[Axis]:
    """Axes from Python: ``{"scheduler.max_num_seqs": "pow2:1..64", "hardware": [...]}``; a
    tuple of keys is a zip group whose values are tuples
    (``{("scheduler.max_num_seqs", "scheduler.max_num_batched_tokens"): [(8, 2048), ...]}``)."""
    items = grid.items() if isinstance(grid, Mapping) else grid
    axes = []
    for key, spec in items:
        if isinstance(key, tuple):
            label = f"{origin} {','.join(key)}"
            for k in key:
                check_key(k, label)
            rows = parse_values(spec, label)
            if not all(isinstance(r, (tuple, list)) and len(r) == len(key) for r in rows):
                raise ConfigError(f"{label}: each value must be a tuple of {len(key)} values")
            axes.append(Axis(tuple(key), tuple(tuple(r) for r in rows), label))
        else:
            label = f"{origin} {key}"
            check_key(key, label)
            axes.append(Axis((key,), tuple((v,) for v in parse_values(spec, label)), label))
    return axes


def merge_axes(block: Sequence[Axis], given: Sequence[Axis]) -> list[Axis]:
    """The block's axes with those given on the command line (or in Python): a given axis
    replaces a block axis of the same single key, others are appended; a key given twice is
    an error (the second would silently replace the first)."""
    axes = list(block)
    once: dict[tuple[str, ...], str] = {}
    for axis in given:
        if axis.keys in once:
            raise ConfigError(
                f"{axis.origin} is given twice; give the values of {', '.join(axis.keys)} "
                "once, comma-separated (1,2,4) or as a range"
            )
        once[axis.keys] = axis.origin
        for i, old in enumerate(axes):
            if len(old.keys) == 1 and old.keys == axis.keys:
                axes[i] = axis
                break
        else:
            axes.append(axis)
    return combine_axes(axes)


def point_label(values: Mapping[str, Any], short: Mapping[str, str], seed: int | None) -> str:
    parts = [f"{short[key]}={label_part(value)}" for key, value in values.items()]
    if seed is not None:
        parts.append(f"seed={seed}")
    label = ",".join(parts) or "base"
    if len(label) > MAX_LABEL_CHARS:
        digest = hashlib.sha256(label.encode()).hexdigest()[:8]
        label = f"{label[: MAX_LABEL_CHARS - 9]}-{digest}"
    return label


def resolve_points(plan: SweepPlan, origin: str = "--grid") -> list[Point]:
    """One :class:`Point` per grid point and seed, in grid order (seeds innermost).

    A combination of values that does not make a valid experiment becomes a point with its
    one-line error; every point's error, if all fail, is raised instead (nothing to run).
    """
    total = math.prod(len(axis) for axis in plan.axes) * plan.seeds
    if total > MAX_POINTS:
        raise ConfigError(
            f"the sweep has {total:,} points (seeds included); a sweep may have {MAX_POINTS:,}"
        )
    short = short_names(plan.varied)
    points: list[Point] = []
    for values in expand(plan.axes):
        try:
            base = plan.source.load(values, origin=origin) if values else plan.source.load()
            error = ""
        except ConfigError as exc:
            base, error = None, str(exc)
        for rep in range(plan.seeds):
            config: ExperimentConfig | None = base
            seed = None
            if base is not None:
                seed = base.seed + rep
                if seed > 2**64 - 1:
                    config, error = None, f"seed {seed} is above 2**64 - 1"
                elif rep:
                    config = base.model_copy(update={"seed": seed})
            label = point_label(values, short, seed if plan.seeds > 1 else None)
            points.append(Point(label, dict(values), config, error if config is None else ""))
    make_labels_unique(points)
    if points and all(p.config is None for p in points):
        first = points[0].error
        raise ConfigError(
            first if len(points) == 1 else f"every point is invalid; the first: {first}"
        )
    return points


def make_labels_unique(points: list[Point]) -> None:
    seen: dict[str, int] = {}
    for p in points:
        seen[p.label] = seen.get(p.label, 0) + 1
    for p in points:
        if seen[p.label] > 1 or p.label.startswith("."):
            blob = json.dumps({k: cell(v) for k, v in p.values.items()}, sort_keys=True)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:8]
            p.label = f"{p.label}-{digest}".lstrip(".")


def scalar_metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's numbers (``config`` and ``wall_time_s`` left out)."""
    return {
        key: (math.nan if value is None else value)
        for key, value in summary.items()
        if key not in ("config", "wall_time_s")
        and (value is None or isinstance(value, (int, float)))
    }


def build_table(
    points: Sequence[Point], outcomes: Sequence[Outcome], varied: Sequence[str]
) -> pd.DataFrame:
    """``sweep.csv`` as a DataFrame: one row per point, in grid order."""
    import pandas as pd

    metrics: dict[str, None] = {}
    for outcome in outcomes:
        if outcome.summary is not None:
            metrics.update(dict.fromkeys(scalar_metrics(outcome.summary)))
    rows = []
    for point, outcome in zip(points, outcomes):
        row: dict[str, Any] = {key: cell(point.values.get(key)) for key in varied}
        row["seed"] = point.config.seed if point.config is not None else None
        found = scalar_metrics(outcome.summary) if outcome.summary is not None else {}
        row.update({m: found.get(m, math.nan) for m in metrics})
        row["wall_time_s"] = outcome.wall_time_s
        row["error"] = outcome.error
        row["point"] = point.label
        rows.append(row)
    columns = [*dict.fromkeys([*varied, "seed"]), *metrics, "wall_time_s", "error", "point"]
    return pd.DataFrame(rows, columns=columns)


def seed_stats(table: pd.DataFrame, varied: Sequence[str]) -> pd.DataFrame:
    """One row per configuration (the varied keys but ``seed``): every metric's mean over the
    seeds that ran, and ``<metric>_ci95``, the half-width of the 95 % confidence interval of
    that mean (Student's t with n - 1 degrees of freedom; NaN with one seed).
    ``num_seeds`` counts the seeds that ran; ``error`` holds the first failed seed's error."""
    import numpy as np
    import pandas as pd
    from scipy import stats

    keys = [k for k in varied if k != "seed"]
    skip = {*keys, "seed", "error", "point"}
    metrics = [c for c in table.columns if c not in skip]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, values in enumerate(table[keys].itertuples(index=False, name=None)):
        groups.setdefault(tuple(json.dumps(v, default=str) for v in values), []).append(i)
    rows = []
    for members in groups.values():
        part = table.iloc[members]
        ok = part[part["error"] == ""]
        n = len(ok)
        row: dict[str, Any] = {k: part.iloc[0][k] for k in keys}
        row["num_seeds"] = n
        t = float(stats.t.ppf(0.975, n - 1)) if n > 1 else math.nan
        for m in metrics:
            values = pd.to_numeric(ok[m], errors="coerce").to_numpy(dtype=float)
            values = values[~np.isnan(values)]
            row[m] = float(values.mean()) if values.size else math.nan
            row[f"{m}_ci95"] = (
                t * float(values.std(ddof=1)) / math.sqrt(values.size)
                if values.size > 1
                else math.nan
            )
        failed = part[part["error"] != ""]["error"]
        row["error"] = failed.iloc[0] if len(failed) else ""
        rows.append(row)
    columns = [*keys, "num_seeds"]
    for m in metrics:
        columns += [m, f"{m}_ci95"]
    return pd.DataFrame(rows, columns=[*columns, "error"])


def write_table(table: pd.DataFrame, root: Path, stem: str) -> None:
    """``<stem>.csv`` and ``<stem>.parquet`` in ``root``, each written atomically."""
    import secrets

    import numpy as np

    frame = table.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            kinds = {type(v) for v in frame[column] if v is not None and v == v}
            if len(kinds) > 1:  # parquet needs one type per column
                frame[column] = [None if v is None else str(v) for v in frame[column]]
    with np.errstate(invalid="ignore"):  # numpy < 1.25 warns casting NaN to text
        text = frame.to_csv(index=False)
    tmp = root / f".{stem}.parquet.{secrets.token_hex(4)}.tmp"
    try:
        write_atomic(root / f"{stem}.csv", text)
        frame.to_parquet(tmp, index=False)
        tmp.replace(root / f"{stem}.parquet")
    except OSError as exc:
        raise write_error(root, exc) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_marker(plan: SweepPlan, root: Path, num_points: int) -> None:
    """``sweep.json``: what the study is (read by ``batchsim plot``/``report`` and resume)."""
    from batchsim.version import __version__

    record = {
        "kind": plan.kind,
        "batchsim_version": __version__,
        "experiment": plan.source.source,
        "varied_keys": plan.varied,
        "axes": [
            {"keys": list(a.keys), "values": [[cell(v) for v in row] for row in a.values]}
            for a in plan.axes
        ],
        "seeds": plan.seeds,
        "num_points": num_points,
        **plan.extra,
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / MARKER, json.dumps(record, indent=2, default=str) + "\n")
    except OSError as exc:
        raise write_error(root, exc) from None


@dataclass
class SweepResult:
    """What a sweep produced."""

    table: pd.DataFrame
    stats: pd.DataFrame | None
    points: list[Point]
    outcomes: list[Outcome]
    num_resumed: int = 0

    @property
    def num_failed(self) -> int:
        return sum(not o.ok for o in self.outcomes)

    @property
    def num_internal(self) -> int:
        return sum(o.internal for o in self.outcomes)


def run_sweep(
    plan: SweepPlan,
    executor: Executor,
    *,
    out_dir: Path | None = None,
    write_csv: bool = True,
    progress: str = "off",
) -> SweepResult:
    """Run every point of ``plan`` on ``executor``; with ``out_dir``, resumable and written
    there (``sweep.json``, ``points/``, ``sweep.csv``/``.parquet``, ``sweep_stats.*``)."""
    from batchsim.studies.runner import Progress, Runner
    from batchsim.studies.store import check_study_dir

    points = resolve_points(plan)
    store = None
    if out_dir is not None:
        check_study_dir(out_dir, plan.kind)
        store = PointStore(out_dir, FileDigests())
        write_marker(plan, out_dir, len(points))
    outcomes: dict[int, Outcome] = {}
    runner = Runner(
        executor,
        store,
        write_csv=write_csv and store is not None,
        progress=Progress("sweep", progress),
    )
    index = {id(p): i for i, p in enumerate(points)}
    for point in points:
        runner.submit(point, lambda p, o: outcomes.__setitem__(index[id(p)], o))
    runner.run_until_done()
    ordered = [outcomes[i] for i in range(len(points))]
    table = build_table(points, ordered, plan.varied)
    stats = seed_stats(table, plan.varied) if plan.seeds > 1 else None
    if out_dir is not None:
        write_table(table, out_dir, "sweep")
        if stats is not None:
            write_table(stats, out_dir, "sweep_stats")
    return SweepResult(table, stats, points, ordered, runner.num_resumed)


def sweep(
    base: str | Path | Mapping[str, Any],
    grid: Mapping[str | tuple[str, ...], Any] | None = None,
    *,
    seeds: int | None = None,
    executor: Executor | None = None,
    out_dir: str | Path | None = None,
    summary_only: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Simulate every point of a grid and return one row per point (``sweep.csv``).

    Args:
        base: The base experiment: a YAML path, a built-in name, or a mapping. Its
            ``sweep:`` block, if any, gives the axes and seeds that ``grid`` and ``seeds`` do
            not override.
        grid: Dotted key -> values (a list, or text as for ``--grid``: ``"1,2,4"``,
            ``"pow2:1..512"``); a tuple of keys is a zip group whose values are tuples.
        seeds: Repetitions of every point (seeds seed, seed + 1, ...).
        executor: Any :class:`concurrent.futures.Executor` (a process pool, a Dask
            ``Client.get_executor()``, ...); default: a local process pool on every core.
        out_dir: Also write the sweep folder there (resumable, as ``batchsim sweep -o``).
        summary_only: Do not write each point's ``requests.csv`` and ``iterations.csv``.
        progress: Show a progress bar (or lines) on stderr.

    Returns:
        The table; with several seeds, ``result.attrs["stats"]`` holds the per-configuration
        means and 95 % confidence intervals (``sweep_stats.csv``).

    Raises:
        ConfigError: A bad axis, seed count or output folder, or every point is invalid.
    """
    from batchsim.studies.backends import open_executor

    source = ExperimentSource.read(base)
    block, block_seeds = block_axes(source)
    axes = merge_axes(block, grid_axes(grid or {}))
    count = block_seeds if seeds is None else seeds
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SEEDS:
        raise ConfigError(f"seeds must be a whole number from 1 to {MAX_SEEDS}, got {count!r}")
    plan = SweepPlan(source, axes, count)
    target = Path(out_dir) if out_dir is not None else None
    mode = "auto" if progress else "off"
    if executor is not None:
        result = run_sweep(
            plan, executor, out_dir=target, write_csv=not summary_only, progress=mode
        )
    else:
        with open_executor("local") as pool:
            result = run_sweep(
                plan, pool, out_dir=target, write_csv=not summary_only, progress=mode
            )
    table = result.table
    if result.stats is not None:
        table.attrs["stats"] = result.stats
    return table
