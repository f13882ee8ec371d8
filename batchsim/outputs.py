"""A run's output folder: which files it writes, and how they land all or none.

The output files and their names are a contract (``summary.json``, ``requests.csv``,
``iterations.csv``, ``config.yaml``; with ``output.format: parquet`` the tables are
``requests.parquet`` and ``iterations.parquet``; ``slots`` with ``metrics.record_slots``; a
cluster run adds ``replicas.csv``). A run writes them into a hidden temporary directory
(:class:`StagedOutput`) and moves them in place only when everything succeeded, so bad input, a
full disk or an interrupt never leaves a half-written directory, and it replaces only files of
a previous batchsim run (:func:`check_output_dir`), removing those of its files the new run
does not write (the other format's tables, an iterations table the new run leaves out).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchsim.config import OUTPUT_FORMATS, ExperimentConfig
from batchsim.errors import ConfigError, write_error
from batchsim.metrics.columns import Columns
from batchsim.metrics.iterations import ITERATION_COLUMNS, IterationLog
from batchsim.metrics.writers import TableStream, _jsonable

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
        the run writes (all iterations). The deployment offers the log of an engine that
        runs alone (:meth:`~batchsim.deployment.base.Deployment.run`'s ``stream``)."""
        output = config.output
        if output.iterations != "all" or self._streams:
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
