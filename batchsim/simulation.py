"""Run one experiment: config -> deployment -> requests -> simulation -> tables and summary.

:func:`simulate` assembles the experiment's deployment (:mod:`batchsim.deployment`), draws the
workload's requests, runs the deployment on them and summarizes its records into a
:class:`Result`; :func:`run` is the public entry (an experiment file, a mapping or a config,
overrides, an output folder). What the folder holds, and how it is written all or none, is
:mod:`batchsim.outputs`'.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.model import ModelSpec
from batchsim.config import (
    ExperimentConfig,
    dump_config,
    keyword_overrides,
    load_experiment,
)
from batchsim.deployment import assemble
from batchsim.deployment.setup import hybrid_kv_fallback
from batchsim.errors import ConfigError, write_error
from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import ITERATION_COLUMNS, IterationLog, sample_rows
from batchsim.metrics.replicas import replica_column_names
from batchsim.metrics.requests import REQUEST_COLUMNS
from batchsim.metrics.slots import SLOT_COLUMNS
from batchsim.metrics.summary import summarize
from batchsim.metrics.writers import write_csv, write_parquet
from batchsim.outputs import (
    ALL_OUTPUT_FILES,
    OUTPUT_FILES,
    StagedOutput,
    check_output_dir,
    output_files,
    summary_json,
)
from batchsim.workload import generate, trace_notes

if TYPE_CHECKING:
    import pandas as pd

    from batchsim.progress import RunProgress


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
        from batchsim.deployment.disaggregated import REQUEST_COLUMNS as POOL_COLUMNS
        from batchsim.deployment.disaggregated import TRANSFER_COLUMNS

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


def _with_replica(columns: list[str], after: str, cluster: bool) -> list[str]:
    if not cluster:
        return columns
    at = columns.index(after) + 1
    return [*columns[:at], "replica", *columns[at:]]


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
        hardware: Use this profile instead of loading ``config.hardware`` (one engine: the
            replicas of a ``cluster:`` load their own).
        staged: Where the result will be written (:meth:`Result.write` to its target): the
            iterations table is written there while the engine runs, when it can be
            (:meth:`StagedOutput.stream_iterations`). The caller discards it in the end.
    """
    wall_start = time.perf_counter()
    deployment = assemble(config, hardware)
    table = generate(config.workload, config.seed, base_dir)
    stream = None
    if staged is not None:
        stream = functools.partial(staged.stream_iterations, config)
    run = deployment.run(table, progress, stream)
    del table  # the workload: not needed any more
    if progress is not None:
        progress.stage("summarizing")
    requests = run.request_columns()
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
        num_replicas=run.num_engines,
    )
    summary.update(run.summary_fields(summary, requests))
    summary["wall_time_s"] = time.perf_counter() - wall_start
    summary["config"] = config.model_dump(mode="json")  # as config.yaml: every key
    notes = run.notes + trace_notes(config.workload, base_dir)
    notes += hybrid_window_notes(deployment.model, requests, hybrid_kv_fallback(config.engine))
    iterations = run.iterations
    run.request_log = None  # type: ignore[assignment]  # its token runs: only the summary's
    return Result(
        summary,
        config,
        requests,
        iterations,
        notes,
        slot_columns=run.slot_columns(),
        replica_columns=run.replica_columns,
        warnings=run.warnings(requests),
        staged=staged,
    )


def _request_rate(config: ExperimentConfig) -> float:
    """The workload's mean arrival rate (NaN for a closed loop, a trace, or conversations,
    whose arrival process starts conversations, not requests)."""
    workload = config.workload
    if workload.arrival is None or workload.conversation is not None:
        return math.nan
    return workload.arrival.mean_rate()


def hybrid_window_notes(model: ModelSpec, requests: Columns, fallback: str | None) -> list[str]:
    """A note when a model that interleaves sliding-window and full-attention layers (Gemma
    2/3, gpt-oss) ran with a setting its per-group KV cache does not support (``fallback``
    names it) and served a request longer than its window: batchsim then charges those layers
    as full attention, so the run's KV-cache use and attention time are upper bounds."""
    window = model.hybrid_sliding_window
    if not model.is_hybrid_attention or window is None or fallback is None:
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
        f"attention with {fallback}; requests reached {longest:,} tokens, so KV-cache use and "
        "attention time are upper bounds past the window"
    ]


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
