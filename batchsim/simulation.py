"""Assemble and run one experiment: config -> catalogs -> cost model -> KV cache -> policy ->
engine -> tables and summary, and write the output directory.

The output files and their names are a contract (``summary.json``, ``requests.csv``,
``iterations.csv``, ``config.yaml``; with ``output.format: parquet`` the tables are
``requests.parquet`` and ``iterations.parquet``; a cluster run adds ``replicas.csv``); a run
writes them into a hidden temporary directory and moves them in place only when everything
succeeded, so bad input, a full disk or an interrupt never leaves a half-written directory,
and it replaces only files of a previous batchsim run (:func:`check_output_dir`), removing
those of its files the new run does not write (the other format's tables, an iterations table
the new run leaves out).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import math
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from batchsim.catalog.hardware import HardwareProfile, load_hardware
from batchsim.catalog.model import ModelSpec, dtype_bytes, load_model
from batchsim.config import (
    OUTPUT_FORMATS,
    EngineConfig,
    ExperimentConfig,
    dump_config,
    keyword_overrides,
    load_experiment,
    unused_scheduler_keys,
)
from batchsim.cost import RooflineCostModel
from batchsim.cost.pipeline import PipelineCostModel
from batchsim.engine.engine import Engine, EngineOptions
from batchsim.engine.kv_cache import KVCacheManager, kv_capacity_blocks
from batchsim.engine.pipeline import PipelineEngine
from batchsim.engine.prefix_cache import PrefixCachingKVCacheManager
from batchsim.errors import (
    BatchsimError,
    ConfigError,
    PolicyError,
    describe_exception,
    write_error,
)
from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import ITERATION_COLUMNS, IterationLog, sample_rows
from batchsim.metrics.replicas import (
    pool_busy_fractions,
    replica_column_names,
    replica_table,
    transfer_summary,
)
from batchsim.metrics.requests import REQUEST_COLUMNS
from batchsim.metrics.slots import SLOT_COLUMNS
from batchsim.metrics.summary import summarize
from batchsim.metrics.writers import TableStream, _jsonable, write_csv, write_parquet
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.registry import built_in, load_policy, policy_name
from batchsim.scheduler.speculative import (
    SPECULATIVE_POLICIES,
    SpeculativeScheduler,
    Speculator,
    speculative_policy,
)
from batchsim.workload import generate, trace_notes

if TYPE_CHECKING:
    import pandas as pd

    from batchsim.progress import RunProgress

OUTPUT_FILES = ("summary.json", "requests.csv", "iterations.csv", "config.yaml")
"""The files of a run with the default ``output:`` block."""
SLOTS_FILE = "slots.csv"
"""Written besides the four when the run records its batch slots (``metrics.record_slots``)."""
TABLES = ("requests", "iterations", "slots", "replicas")
"""The tables a run may write, each as ``<table>.csv`` or ``<table>.parquet``."""
ALL_OUTPUT_FILES = (
    "summary.json",
    "config.yaml",
    *(f"{table}.{fmt}" for table in TABLES for fmt in OUTPUT_FORMATS),
)
"""Every name a run may write: a directory holding one that batchsim did not write is refused,
and a run replacing a previous one removes those of them it does not write itself."""


def output_files(config: ExperimentConfig) -> tuple[str, ...]:
    """The files a run of ``config`` writes (``summary.json`` first, ``config.yaml`` after the
    tables): the requests table, the iterations table unless ``output.iterations: none``, the
    slots table with ``metrics.record_slots``, the replicas table with ``cluster:``, in
    ``output.format``."""
    fmt = config.output.format
    names = ["summary.json", f"requests.{fmt}"]
    if config.output.iterations != "none":
        names.append(f"iterations.{fmt}")
    names.append("config.yaml")
    if config.metrics.record_slots:
        names.append(f"slots.{fmt}")
    if config.cluster is not None:
        names.append(f"replicas.{fmt}")
    return tuple(names)


@dataclass
class Result:
    """What one run produced.

    Attributes:
        summary: ``summary.json`` as a dict (vLLM benchmark names plus batchsim's own).
        config: The resolved experiment.
        notes: Things the user should know (e.g. keys the chosen policy ignores).
        request_columns: ``requests.csv`` as numpy columns.
        iteration_log: The per-iteration log; :attr:`iteration_columns` expands it.
        warnings: Things that make the results less trustworthy (e.g. shapes outside the
            hardware profile's ``calibrated_range``), one line each.
    """

    summary: dict[str, Any]
    config: ExperimentConfig
    request_columns: Columns
    iteration_log: IterationLog
    notes: list[str] = field(default_factory=list)
    slot_columns: Columns | None = None
    """``slots.csv`` as numpy columns, when the run recorded its batch slots
    (``metrics.record_slots``)."""
    replica_columns: Columns | None = None
    """``replicas.csv`` as numpy columns: one row per replica of a cluster (``cluster:``)."""
    warnings: list[str] = field(default_factory=list)
    staged: StagedOutput | None = field(default=None, repr=False, compare=False)
    """Where :meth:`write` puts the files first when it writes to ``staged.target`` (made
    before the run, maybe holding the iterations table written during it)."""

    @property
    def files(self) -> tuple[str, ...]:
        """The output files this run writes (:func:`output_files`): ``summary.json``,
        ``requests.csv``, ``iterations.csv``, ``config.yaml`` by default, and ``slots.csv`` if
        recorded, ``replicas.csv`` for a cluster; the tables as ``.parquet`` with
        ``output.format: parquet``; no iterations table with ``output.iterations: none``."""
        names = [n for n in output_files(self.config) if not n.startswith("slots.")]
        if self.slot_columns is not None:
            names.append(f"slots.{self.config.output.format}")
        return tuple(names)

    def iteration_tables(self) -> Iterable[Columns]:
        """The rows of the iterations table as written, in windows: all of them, or the
        sample ``output.iterations: {sample: N}`` asks for (empty with ``none``)."""
        output = self.config.output
        if output.iterations == "none":
            return iter(())
        n = output.iteration_sample
        log = self.iteration_log
        if n is None or n >= log.num_rows:
            return log.windows()
        return log.windows(rows=sample_rows(log.num_rows, n))

    @functools.cached_property
    def slots(self) -> pd.DataFrame:
        """``slots.csv`` as a pandas DataFrame (runs with ``metrics.record_slots: true``)."""
        import pandas as pd

        if self.slot_columns is None:
            raise ConfigError("this run did not record its slots (metrics.record_slots: true)")
        return pd.DataFrame(self.slot_columns, columns=SLOT_COLUMNS)

    @functools.cached_property
    def iteration_columns(self) -> Columns:
        """``iterations.csv`` as numpy columns (plus ``compute_bound``)."""
        return self.iteration_log.to_columns()

    @property
    def request_column_names(self) -> list[str]:
        """The columns of ``requests.csv``: :data:`REQUEST_COLUMNS`, with ``replica`` after
        ``request_id`` in a cluster run; a disaggregated run adds ``prefill_replica`` and
        ``decode_replica`` after it and ``kv_wait_ms``, ``kv_transfer_ms``,
        ``kv_transfer_bytes`` at the end."""
        names = _with_replica(REQUEST_COLUMNS, "request_id", self.replica_columns is not None)
        if "prefill_replica" not in self.request_columns:
            return names
        from batchsim.cluster.disaggregation import REQUEST_COLUMNS as POOL_COLUMNS
        from batchsim.cluster.disaggregation import TRANSFER_COLUMNS

        at = names.index("replica") + 1
        return [*names[:at], *POOL_COLUMNS, *names[at:], *TRANSFER_COLUMNS]

    @property
    def replica_column_names(self) -> list[str]:
        """The columns of ``replicas.csv`` (with ``pool`` in a disaggregated run)."""
        return replica_column_names(
            self.replica_columns is not None and "pool" in self.replica_columns
        )

    @property
    def iteration_column_names(self) -> list[str]:
        """The columns of ``iterations.csv``: :data:`ITERATION_COLUMNS`, with ``replica``
        after ``iteration`` in a cluster run (the iterations of replica 0, then replica 1...,
        numbered on across the cluster)."""
        return _with_replica(ITERATION_COLUMNS, "iteration", self.replica_columns is not None)

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request (``requests.csv``) as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.request_columns, columns=self.request_column_names)

    @functools.cached_property
    def iterations(self) -> pd.DataFrame:
        """One row per iteration (``iterations.csv``) as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.iteration_columns, columns=self.iteration_column_names)

    @functools.cached_property
    def replicas(self) -> pd.DataFrame:
        """One row per replica (``replicas.csv``) of a cluster run, as a pandas DataFrame."""
        import pandas as pd

        if self.replica_columns is None:
            raise ConfigError("this run has no replicas (cluster: is not set)")
        return pd.DataFrame(self.replica_columns, columns=self.replica_column_names)

    def write(self, out_dir: str | Path) -> Path:
        """Write the output files into ``out_dir`` (created if needed); return it.

        The files are written into a hidden temporary directory first and moved in place
        only when all of them were written, so a failure leaves ``out_dir`` as it was.

        Raises:
            ConfigError: ``out_dir`` may not be written (see :func:`check_output_dir`) or the
                OS refused (no space, no permission); the message ends with the OS reason.
        """
        target = Path(out_dir)
        check_output_dir(target)
        try:
            self._write(target, self.files)
            # a previous run's tables that this run does not write would contradict it (the
            # other format's, an iterations table left out, slots not recorded this time)
            for name in ALL_OUTPUT_FILES:
                if name not in self.files:
                    (target / name).unlink(missing_ok=True)
        except OSError as exc:
            raise write_error(target, exc) from exc
        return target

    def write_files(self, out_dir: str | Path, names: Sequence[str] = OUTPUT_FILES) -> None:
        """Write some of the output files into ``out_dir`` (created if needed), all or none.

        Unlike :meth:`write`, the directory is not checked: the caller owns it (a sweep writes
        each point's files into the point's own folder).

        Raises:
            OSError: The OS refused; the files already there are as they were.
        """
        self._write(Path(out_dir), names)

    def _write(self, target: Path, names: Sequence[str] = OUTPUT_FILES) -> None:
        staged = self.staged
        if staged is None or staged.target != target or not staged.open:
            staged = StagedOutput(target)
        self.staged = None  # consumed: committed or discarded below
        writers: dict[str, Callable[[Path], object]] = {
            "summary.json": lambda path: path.write_text(
                summary_json(self.summary), encoding="utf-8"
            ),
            "config.yaml": lambda path: path.write_text(dump_config(self.config), encoding="utf-8"),
        }
        tables: dict[str, tuple[Callable[[], Iterable[Columns]], list[str]]] = {
            "requests": (lambda: [self.request_columns], self.request_column_names),
            "iterations": (self.iteration_tables, self.iteration_column_names),
            "slots": (lambda: [self.slot_columns or {}], list(SLOT_COLUMNS)),
            "replicas": (lambda: [self.replica_columns or {}], self.replica_column_names),
        }
        try:
            streamed = staged.finish_streams()
            for name in names:
                if name in streamed:
                    continue
                path = staged.dir / name
                if name in writers:
                    writers[name](path)
                    continue
                table, fmt = name.rsplit(".", 1)
                rows, columns = tables[table]
                if fmt == "csv":
                    write_csv(rows(), columns, path)
                else:
                    write_parquet(rows(), columns, path)
            staged.commit(names)
        finally:
            staged.discard()


class StagedOutput:
    """The hidden temporary directory a run's output files are written into before they are
    moved into ``target`` together (into ``target`` if it exists, else beside it; missing
    parents are created, and removed again if nothing is committed).

    Made before the run (``batchsim run``), it lets the iterations table be written while the
    engine runs (:meth:`stream_iterations`); :meth:`Result.write` to the same ``target`` then
    completes it. :meth:`discard` removes what was not committed.

    Raises:
        OSError: The directory could not be made.
    """

    def __init__(self, target: Path):
        self.target = target
        self._created = _make_dirs(target.parent)
        try:
            self.into_existing = target.is_dir()
            self.dir = _make_staging_dir(target if self.into_existing else target.parent)
        except BaseException:
            self._remove_created()
            raise
        self.open = True
        self._streams: dict[str, TableStream] = {}

    def stream_iterations(self, config: ExperimentConfig, log: IterationLog) -> None:
        """Write ``log`` into the iterations table while it is logged, if that is the table
        the run writes (all iterations, one engine)."""
        output = config.output
        if config.cluster is not None or output.iterations != "all" or self._streams:
            return
        name = f"iterations.{output.format}"
        stream = TableStream(self.dir / name, ITERATION_COLUMNS, output.format)
        self._streams[name] = stream
        target = self.target

        def add(columns: Columns) -> None:
            try:
                stream.add(columns)
            except OSError as exc:  # a write in the background failed: stop the run
                raise write_error(target, exc) from exc

        log.stream_to(add, stream.rows)

    def finish_streams(self) -> set[str]:
        """Wait for the streamed tables to be written and close them; their names."""
        for stream in self._streams.values():
            stream.close()
        return set(self._streams)

    def commit(self, names: Sequence[str]) -> None:
        """Move the files ``names`` (all written) into the target."""
        if self.into_existing:
            # the summary last: a folder whose summary is new holds all the new files
            for name in sorted(names, key=lambda n: n == "summary.json"):
                os.replace(self.dir / name, self.target / name)
        else:
            os.rename(self.dir, self.target)
        self._created = []
        self.open = False

    def discard(self) -> None:
        """Remove the temporary directory and what it holds, and the parents made for it (a
        no-op after :meth:`commit`, apart from an emptied directory)."""
        for stream in self._streams.values():
            with contextlib.suppress(OSError):
                stream.abort()
        self._streams.clear()
        self.open = False
        shutil.rmtree(self.dir, ignore_errors=True)
        self._remove_created()

    def _remove_created(self) -> None:
        for directory in reversed(self._created):
            with contextlib.suppress(OSError):
                directory.rmdir()
        self._created = []


def _with_replica(columns: list[str], after: str, cluster: bool) -> list[str]:
    if not cluster:
        return columns
    at = columns.index(after) + 1
    return [*columns[:at], "replica", *columns[at:]]


def summary_json(summary: Mapping[str, Any]) -> str:
    """The text of ``summary.json`` (NaN and infinity as null)."""
    return json.dumps(_jsonable(summary), indent=2) + "\n"


def _make_dirs(directory: Path) -> list[Path]:
    """Create ``directory`` and missing parents; return the ones created, outermost first."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    missing.reverse()
    created = []
    try:
        for path in missing:
            os.mkdir(path)
            created.append(path)
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    return created


def _make_staging_dir(parent: Path) -> Path:
    """A new hidden directory in ``parent`` (permissions as for any new directory)."""
    while True:
        path = parent / f".batchsim-tmp-{secrets.token_hex(4)}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def is_batchsim_run(directory: Path) -> bool:
    """True if ``directory`` holds a ``summary.json`` that batchsim wrote."""
    path = directory / "summary.json"
    try:
        if not path.is_file() or path.stat().st_size > _MAX_SUMMARY_BYTES:
            return False
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    config = summary.get("config") if isinstance(summary, dict) else None
    return (
        isinstance(config, dict)
        and {"hardware", "model", "scheduler", "workload"} <= config.keys()
        and {"num_iterations", "completed", "wall_time_s"} <= summary.keys()
    )


_MAX_SUMMARY_BYTES = 1 << 24


def check_new_dir(target: Path) -> bool:
    """True if ``target`` does not exist and may be created (its nearest existing ancestor is
    a directory), False if it is an existing directory.

    Raises:
        ConfigError: ``target`` is a file, or lies under one.
    """
    if target.exists() and not target.is_dir():
        raise ConfigError(f"cannot write {target}: it exists and is not a directory")
    if target.exists():
        return False
    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise ConfigError(f"cannot write {target}: {ancestor} is not a directory")
    return True


def check_output_dir(out_dir: str | Path) -> Path:
    """Check that batchsim may write its output files into ``out_dir``.

    Allowed: a directory that does not exist yet (its parents are created), or an existing
    one that holds none of the output files or holds a previous batchsim run (recognised by
    the ``summary.json`` batchsim wrote); the output files of that run are replaced, other
    files are left alone. Anything else — a file, a path under a file, a directory holding a
    ``config.yaml`` (or another output name) that batchsim did not write — is refused.

    Raises:
        ConfigError: Naming the directory and why; nothing has been written.
    """
    target = Path(out_dir)
    if check_new_dir(target):
        return target
    clashing = [name for name in ALL_OUTPUT_FILES if os.path.lexists(target / name)]
    if clashing and not is_batchsim_run(target):
        raise ConfigError(
            f"cannot write {target}: it holds {', '.join(clashing)} that batchsim did not "
            "write (no batchsim summary.json there); batchsim writes into a new or empty "
            "directory, or replaces a previous run: choose one with -o DIR"
        )
    return target


def activation_reserve_bytes(model: ModelSpec, config: ExperimentConfig, tp: int) -> float:
    """Memory kept free for one forward pass's activations on one GPU (bytes).

    The peak of a forward pass over the token budget T: a few hidden-size tensors and the MLP's
    intermediate tensors per token, plus fp32 logits for the sampled rows. A deliberate,
    documented estimate; ``engine.activation_reserve_gb`` overrides it.
    """
    if config.engine.activation_reserve_gb is not None:
        return config.engine.activation_reserve_gb * 1e9
    tokens = config.scheduler.max_num_batched_tokens
    act_bytes = 2.0  # activations stay in 16-bit even with quantized weights
    width = model.intermediate_size
    if model.is_moe and model.moe_intermediate_size:
        width = max(model.moe_intermediate_size * model.num_experts_per_tok, width or 0)
    per_token = (4 * model.hidden_size + 2 * width / tp) * act_bytes
    logits = config.scheduler.max_num_seqs * model.vocab_size / tp * 4.0
    return tokens * per_token + logits


@dataclass(frozen=True)
class Setup:
    """Everything built from a config before the simulation starts."""

    config: ExperimentConfig
    hardware: HardwareProfile
    model: ModelSpec
    cost_model: RooflineCostModel
    num_gpu_blocks: int
    num_cpu_blocks: int = 0
    """Host swap space in KV blocks (``preemption_mode: swap`` only)."""
    swap_time_per_block: float = 0.0
    """Seconds to copy one KV block of one GPU over the host link."""
    draft_cost_model: RooflineCostModel | None = None
    """Speculative decoding's draft model on the same GPUs (``method: draft``)."""
    pipeline: PipelineCostModel | None = None
    """The stages of ``parallel.pipeline_parallel_size`` > 1 (None: no pipeline; then
    :attr:`cost_model` prices every iteration)."""


def with_engine_terms(hardware: HardwareProfile, engine: EngineConfig) -> HardwareProfile:
    """``hardware`` with the GPU-side terms the engine sets itself (``engine.
    all_reduce_latency_us``, ``engine.launch_overhead_ms``, e.g. from a framework preset) in
    place of the profile's; the same object when the engine sets neither."""
    changes: dict[str, float] = {}
    if engine.all_reduce_latency_us is not None:
        changes["interconnect_latency"] = engine.all_reduce_latency_us / 1e6
    if engine.launch_overhead_ms is not None:
        changes["launch_overhead"] = engine.launch_overhead_ms / 1e3
    if not changes:
        return hardware
    attrs: dict[str, Any] = dict(changes)  # the profile keeps each term twice (see catalog)
    return dataclasses.replace(hardware, efficiency={**hardware.efficiency, **changes}, **attrs)


_COST_MODELS: collections.OrderedDict[tuple, tuple[Any, ...]] = collections.OrderedDict()
_COST_MODELS_KEPT = 8
_COST_MODELS_LOCK = threading.Lock()


def cost_model_for(
    model: ModelSpec, hardware: HardwareProfile, engine: EngineConfig, tp: int
) -> RooflineCostModel:
    """The cost model of ``model`` on ``hardware`` (with the engine's own terms, see
    :func:`with_engine_terms`) at ``tp``: one object for the same catalog objects and terms,
    among the last few asked for in this process. Its per-shape prices are pure functions of
    these inputs, so the runs of a sweep that share them also share what earlier runs priced,
    with the same results."""
    key = (
        id(model),
        id(hardware),
        engine.all_reduce_latency_us,
        engine.launch_overhead_ms,
        tp,
        engine.dtype,
        engine.kv_cache_dtype,
    )
    with _COST_MODELS_LOCK:
        hit = _COST_MODELS.get(key)
        if hit is not None and hit[0] is model and hit[1] is hardware:
            _COST_MODELS.move_to_end(key)
            return hit[2]
    cost_model = RooflineCostModel(
        model,
        with_engine_terms(hardware, engine),
        tp=tp,
        dtype=engine.dtype,
        kv_dtype=engine.kv_cache_dtype,
    )
    with _COST_MODELS_LOCK:  # the objects are kept too, so that their ids stay theirs
        _COST_MODELS[key] = (model, hardware, cost_model)
        while len(_COST_MODELS) > _COST_MODELS_KEPT:
            _COST_MODELS.popitem(last=False)
    return cost_model


def build(config: ExperimentConfig, hardware: HardwareProfile | None = None) -> Setup:
    """Load catalogs and size the KV cache; raises ConfigError on anything inconsistent.

    ``hardware`` replaces the profile ``config.hardware`` names (``batchsim calibrate``
    simulates candidate profiles that exist only in memory).
    """
    if hardware is None:
        hardware = load_hardware(config.hardware)
    model = load_model(config.model)
    tp = config.parallel.tensor_parallel_size
    engine = config.engine
    cost_model = cost_model_for(model, hardware, engine, tp)
    hardware = cost_model.hardware  # with the engine's own terms
    pp = config.parallel.pipeline_parallel_size
    if engine.speculative and pp > 1:
        raise ConfigError(
            f"engine.speculative needs parallel.pipeline_parallel_size 1, got {pp} (a "
            "speculative pipeline is not modelled)"
        )
    draft = draft_cost_model(config, hardware, model) if engine.speculative else None
    pipeline = None
    stages = [cost_model]
    if pp > 1:
        pipeline = PipelineCostModel(
            model, hardware, tp=tp, pp=pp, dtype=engine.dtype, kv_dtype=engine.kv_cache_dtype
        )
        stages = pipeline.stages
    # the draft model's weights sit next to the target's; each block holds both KVs
    draft_kv = draft.kv_bytes_per_token_per_gpu if draft is not None else 0.0
    draft_weights = draft.weight_bytes_per_gpu if draft is not None else 0.0
    if engine.num_gpu_blocks is not None:
        blocks = engine.num_gpu_blocks
    else:
        # one block holds a token range in every layer: each stage's GPUs hold the range for
        # their layers, and the pool is as large as the stage with the least room allows
        blocks = min(
            kv_capacity_blocks(
                memory_bytes=hardware.memory_capacity,
                gpu_memory_utilization=engine.gpu_memory_utilization,
                weight_bytes=stage.weight_bytes_per_gpu + draft_weights,
                activation_reserve_bytes=activation_reserve_bytes(model, config, tp),
                block_bytes=(stage.kv_bytes_per_token_per_gpu + draft_kv) * engine.block_size,
            )
            for stage in stages
        )
    dtype_bytes(engine.dtype, "engine.dtype")
    if engine.enable_prefix_caching and model.sliding_window is not None:
        raise ConfigError(
            f"engine.enable_prefix_caching: true is not supported with a sliding-window model "
            f"({model.name}: sliding_window {model.sliding_window} tokens); set it to false"
        )
    cpu_blocks, swap_time = 0, 0.0
    if config.scheduler.preemption_mode == "swap":
        if hardware.host_bandwidth is None:
            raise ConfigError(
                f"scheduler.preemption_mode: swap needs the host link bandwidth, but hardware "
                f"{hardware.name} has no host_bandwidth_gb_s; add it to the profile or use "
                "preemption_mode: recompute"
            )
        # the stage with the most layers copies the most bytes per block
        kv_bytes_per_token = max(s.kv_bytes_per_token_per_gpu for s in stages) + draft_kv
        block_bytes = kv_bytes_per_token * engine.block_size
        cpu_blocks = int(engine.swap_space_gib * 2**30 // block_bytes)
        link = hardware.host_bandwidth * hardware.efficiency["host_transfer_efficiency"]
        swap_time = block_bytes / link
    return Setup(
        config,
        hardware,
        model,
        cost_model,
        blocks,
        cpu_blocks,
        swap_time,
        draft_cost_model=draft,
        pipeline=pipeline,
    )


def draft_cost_model(
    config: ExperimentConfig, hardware: HardwareProfile, model: ModelSpec
) -> RooflineCostModel | None:
    """The draft model of ``engine.speculative`` on the target's GPUs (None without one);
    raises ConfigError for a setting speculative decoding does not run with."""
    spec = config.engine.speculative
    assert spec is not None
    policy = config.scheduler.policy
    if policy not in SPECULATIVE_POLICIES:
        allowed = " or ".join(SPECULATIVE_POLICIES)
        raise ConfigError(f"engine.speculative needs scheduler.policy {allowed}, got {policy}")
    if model.sliding_window is not None:
        raise ConfigError(
            f"engine.speculative is not supported with a sliding-window model ({model.name}: "
            f"sliding_window {model.sliding_window} tokens)"
        )
    if spec.draft_model is None:
        return None
    draft = load_model(spec.draft_model, key="engine.speculative.draft_model")
    engine = config.engine
    try:
        return RooflineCostModel(
            draft,
            hardware,
            tp=config.parallel.tensor_parallel_size,
            dtype=engine.dtype,
            kv_dtype=engine.kv_cache_dtype,
        )
    except ConfigError as exc:
        raise ConfigError(f"engine.speculative.draft_model {draft.name}: {exc.message}") from None


def _make_policy(
    policy_cls: type[Scheduler],
    config: ExperimentConfig,
    kv: KVCacheManager,
    window: int | None,
    max_len: int | None,
) -> Scheduler:
    """The policy over ``kv``. One written elsewhere that raises while it is made broke a rule:
    the error names it (the compiled build also raises when it assigns an attribute that
    :class:`Scheduler` declares a value of another type, ``max_num_seqs = 8.0`` say)."""
    try:
        return policy_cls(config.scheduler, kv, window=window, max_model_len=max_len)
    except BatchsimError:
        raise
    except Exception as exc:
        if built_in(policy_cls):
            raise
        raise PolicyError(
            f"scheduler.policy {policy_name(policy_cls)}: __init__() raised "
            f"{describe_exception(exc)}"
        ) from None


def engine_parts(
    config: ExperimentConfig, setup: Setup, policy_cls: type[Scheduler]
) -> tuple[KVCacheManager, Scheduler, EngineOptions]:
    """The KV cache, the policy over it and the engine settings of one engine of ``config``
    (each replica of a cluster has its own)."""
    engine_cfg = config.engine
    hardware = setup.hardware
    window = setup.model.sliding_window
    watermark = int(engine_cfg.watermark * setup.num_gpu_blocks)
    kv: KVCacheManager
    if engine_cfg.enable_prefix_caching:
        kv = PrefixCachingKVCacheManager(
            setup.num_gpu_blocks,
            engine_cfg.block_size,
            setup.num_cpu_blocks,
            watermark_blocks=watermark,
        )
    else:
        kv = KVCacheManager(
            setup.num_gpu_blocks,
            engine_cfg.block_size,
            setup.num_cpu_blocks,
            window=window,
            watermark_blocks=watermark,
        )
    max_len = engine_cfg.max_model_len or setup.model.max_position_embeddings
    spec = engine_cfg.speculative
    if spec is not None:
        policy_cls = speculative_policy(policy_cls)
    scheduler = _make_policy(policy_cls, config, kv, window, max_len)
    if spec is not None:
        assert isinstance(scheduler, SpeculativeScheduler)
        scheduler.speculator = Speculator(spec, config.seed, setup.draft_cost_model)
    options = EngineOptions(
        cpu_overhead_base=(
            engine_cfg.cpu_overhead_ms / 1e3
            if engine_cfg.cpu_overhead_ms is not None
            else hardware.cpu_overhead_base
        ),
        cpu_overhead_per_seq=(
            engine_cfg.cpu_overhead_per_seq_ms / 1e3
            if engine_cfg.cpu_overhead_per_seq_ms is not None
            else hardware.cpu_overhead_per_seq
        ),
        async_scheduling=engine_cfg.async_scheduling,
        cuda_graph_max_batch_size=engine_cfg.cuda_graph_max_batch_size or 0,
        fast_forward=engine_cfg.fast_forward,
        swap_time_per_block=setup.swap_time_per_block,
        record_slots=config.metrics.record_slots,
    )
    return kv, scheduler, options


def simulate(
    config: ExperimentConfig,
    base_dir: Path | None = None,
    progress: RunProgress | None = None,
    hardware: HardwareProfile | None = None,
    staged: StagedOutput | None = None,
) -> Result:
    """Run one validated experiment and return its :class:`Result`.

    Args:
        config: The experiment.
        base_dir: The directory relative workload files are relative to.
        progress: A progress line to keep up to date (``batchsim run`` on a terminal).
        hardware: Use this profile instead of loading ``config.hardware`` (a single engine:
            the replicas of a ``cluster:`` load their own).
        staged: Where the result will be written (:meth:`Result.write` to its target): the
            iterations table is written there while the engine runs, when it can be
            (:meth:`StagedOutput.stream_iterations`). The caller discards it in the end.
    """
    wall_start = time.perf_counter()
    if config.cluster is not None:
        if hardware is not None:
            raise ConfigError("simulate(hardware=...) applies to one engine, not a cluster:")
        result = _simulate_cluster(config, base_dir, progress, wall_start)
        result.staged = staged
        return result
    setup = build(config, hardware)
    table = generate(config.workload, config.seed, base_dir)
    policy_cls = load_policy(config.scheduler.policy)
    kv, scheduler, options = engine_parts(config, setup, policy_cls)
    engine: Engine
    if setup.pipeline is not None:
        engine = PipelineEngine(scheduler, setup.pipeline, table, options, on_step=progress)
    else:
        engine = Engine(scheduler, setup.cost_model, table, options, on_step=progress)
    if staged is not None:
        staged.stream_iterations(config, engine.iterations)
    engine.run()
    engine.iterations.end_stream()
    bubble = engine.bubble_fraction if isinstance(engine, PipelineEngine) else 0.0
    assert engine.request_log.num_rows == engine.num_arrived, "a request never left"
    if progress is not None:
        progress.stage("summarizing")
    request_log, iterations, slot_log = engine.request_log, engine.iterations, engine.slot_log
    del engine, table  # the workload and the simulator: not needed any more
    requests = request_log.to_columns()
    summary = summarize(
        request_log,
        iterations,
        requests=requests,
        slo=config.slo.model_dump() if config.slo else None,
        warmup_s=config.metrics.warmup_s,
        cooldown_s=config.metrics.cooldown_s,
        request_rate=_request_rate(config),
        hand_over=True,
    )
    if isinstance(scheduler, SpeculativeScheduler):
        summary.update(scheduler.speculator.summary())
    summary["num_gpu_blocks"] = kv.num_blocks
    summary["kv_cache_capacity_tokens"] = kv.capacity_tokens
    summary["bubble_fraction"] = bubble
    summary["wall_time_s"] = time.perf_counter() - wall_start
    summary["config"] = config.model_dump(mode="json")  # as config.yaml: every key
    del scheduler
    notes = unused_key_notes(config, policy_cls) + trace_notes(config.workload, base_dir)
    notes += hybrid_window_notes(setup.model, requests)
    del request_log  # its token runs: only the summary needs them
    slots = slot_log.to_columns() if slot_log is not None else None
    warnings: list[str] = []
    if setup.hardware.calibrated_range is not None:
        warnings = range_warnings(setup, iterations, requests)
    return Result(
        summary,
        config,
        requests,
        iterations,
        notes,
        slot_columns=slots,
        warnings=warnings,
        staged=staged,
    )


def range_warnings(setup: Setup, iterations: IterationLog, requests: Columns) -> list[str]:
    """The hardware profile's ``calibrated_range`` against the run's extremes (model, TP,
    fewest and most tokens and requests of an iteration, longest request), one line each.
    Read from the per-run batch columns: no pass over the iterations."""
    calibrated = setup.hardware.calibrated_range
    assert calibrated is not None
    tokens = batch = None
    if iterations.num_rows:
        total = (
            iterations.batch_column("num_prefill_tokens").astype(np.int64)
            + iterations.batch_column("num_decode_tokens")
            + iterations.batch_column("num_padding_tokens")
        )
        seqs = iterations.batch_column("num_seqs")
        tokens = (int(total.min()), int(total.max()))
        batch = (int(seqs.min()), int(seqs.max()))
    context = None
    if len(requests["prompt_tokens"]):
        context = int((requests["prompt_tokens"] + requests["output_tokens"]).max())
    lines = calibrated.outside(
        model=setup.model.name,
        hidden_size=setup.model.hidden_size,
        tensor_parallel_size=setup.config.parallel.tensor_parallel_size,
        tokens=tokens,
        batch_size=batch,
        context_tokens=context,
    )
    return [f"hardware {setup.hardware.name}: {line}" for line in lines]


def _request_rate(config: ExperimentConfig) -> float:
    """The workload's mean arrival rate (NaN for a closed loop, a trace, or conversations,
    whose arrival process starts conversations, not requests)."""
    workload = config.workload
    if workload.arrival is None or workload.conversation is not None:
        return math.nan
    return workload.arrival.mean_rate()


def hybrid_window_notes(model: ModelSpec, requests: Columns) -> list[str]:
    """A note when a model that interleaves sliding-window and full-attention layers (Gemma
    2/3, gpt-oss) served a request longer than its window: batchsim charges those layers as
    full attention, so the run's KV-cache use and attention time are upper bounds."""
    window = model.hybrid_sliding_window
    if not model.is_hybrid_attention or window is None:
        return []
    ran = np.isfinite(requests["first_scheduled_time_s"])
    if not ran.any():
        return []
    contexts = requests["prompt_tokens"][ran].astype(np.int64) + requests["output_tokens"][ran]
    longest = int(contexts.max())
    if longest <= window:
        return []
    return [
        f"model {model.name}: {model.num_sliding_layers} of its {model.num_hidden_layers} "
        f"layers attend over a {window:,}-token sliding window and are simulated as full "
        f"attention; requests reached {longest:,} tokens, so KV-cache use and attention time "
        "are upper bounds past the window"
    ]


def unused_key_notes(config: ExperimentConfig, policy_cls: type[Scheduler]) -> list[str]:
    return [
        f"scheduler.{key} is not used by policy {config.scheduler.policy}"
        for key in unused_scheduler_keys(config, policy_cls.config_keys)
    ]


def _simulate_cluster(
    config: ExperimentConfig,
    base_dir: Path | None,
    progress: RunProgress | None,
    wall_start: float,
) -> Result:
    """:func:`simulate` of an experiment with a ``cluster:`` block."""
    from batchsim.cluster.replicas import run_cluster

    table = generate(config.workload, config.seed, base_dir)
    run = run_cluster(config, table, progress)
    del table
    if progress is not None:
        progress.stage("summarizing")
    requests = run.request_log.to_columns()
    if run.by_request is not None:  # a disaggregated cluster's own columns
        ids = requests["request_id"]
        for key, values in run.by_request.items():
            requests[key] = values[ids]
    metrics = config.metrics
    summary = summarize(
        run.request_log,
        run.iterations,
        requests=requests,
        slo=config.slo.model_dump() if config.slo else None,
        warmup_s=metrics.warmup_s,
        cooldown_s=metrics.cooldown_s,
        request_rate=_request_rate(config),
        hand_over=True,
        num_replicas=len(run.replicas),
    )
    if run.speculative is not None:
        summary.update(run.speculative)
    summary["num_gpu_blocks"] = sum(r.num_gpu_blocks for r in run.replicas)
    summary["kv_cache_capacity_tokens"] = run.capacity_tokens
    summary["bubble_fraction"] = 0.0  # replicas run without a pipeline
    replicas = replica_table(run.replicas, requests, metrics.warmup_s, metrics.cooldown_s)
    summary["num_gpus"] = config.num_gpus
    summary["request_goodput_per_gpu"] = summary["request_goodput"] / config.num_gpus
    if run.by_request is not None:
        summary.update(pool_busy_fractions(replicas))
        summary.update(transfer_summary(requests, metrics.warmup_s, metrics.cooldown_s))
    summary["wall_time_s"] = time.perf_counter() - wall_start
    summary["config"] = config.model_dump(mode="json")
    notes = run.notes + trace_notes(config.workload, base_dir)
    notes += hybrid_window_notes(load_model(config.model), requests)
    return Result(summary, config, requests, run.iterations, notes, replica_columns=replicas)


def run(
    experiment: str | Path | Mapping[str, Any] | ExperimentConfig,
    out_dir: str | Path | None = None,
    **overrides: Any,
) -> Result:
    """Simulate an experiment.

    Args:
        experiment: Path to an experiment YAML, a built-in experiment name, a mapping, or an
            :class:`ExperimentConfig`.
        out_dir: If given, write the output files there.
        **overrides: Dotted keys or top-level blocks, e.g.
            ``run("exp.yaml", **{"scheduler.max_num_seqs": 8})`` or
            ``run("exp.yaml", scheduler={"max_num_seqs": 8})``. A dotted key replaces its
            value (a mapping included); a mapping for a top-level block merges into it.

    Raises:
        ConfigError: Bad input (nothing is written).
    """
    if isinstance(experiment, ExperimentConfig):
        if overrides:
            raise ConfigError("overrides need a path or a mapping, not an ExperimentConfig")
        config, base = experiment, None
    else:
        config = load_experiment(experiment, keyword_overrides(overrides), origin="override")
        base = Path(experiment).parent if isinstance(experiment, (str, Path)) else None
    result = simulate(config, base)
    if out_dir is not None:
        result.write(out_dir)
    return result
