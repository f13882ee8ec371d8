"""A study's folder: one sub-folder per point, resumable.

::

    DIR/
      sweep.json            what was swept (kind, base experiment, axes, seeds); marks DIR
      sweep.csv             one row per point (capacity: capacity.csv)
      points/<label>/       config.yaml, summary.json (or error.txt), point.json,
                            requests.csv and iterations.csv unless --summary-only (or
                            .parquet, as the experiment's output: block says)

A point is *finished* when its ``point.json`` says it ran and carries the point's key: a hash
of its resolved config, the contents of the files it reads (traces, profiles and models given
by path, and the built-in GPU profiles, models and frameworks it names) and the batchsim
version. ``point.json`` is written last and atomically, so a point interrupted while
writing never looks finished; a point whose key changed (the base experiment or a file it
reads changed) runs again, the others are skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchsim.config import ExperimentConfig, OutputConfig, dump_config
from batchsim.errors import ConfigError, write_error
from batchsim.outputs import ALL_OUTPUT_FILES, check_new_dir, output_files, summary_json

_DEFAULT_OUTPUT = OutputConfig().model_dump()

MARKER = "sweep.json"
POINTS = "points"
POINT_FILES = (*ALL_OUTPUT_FILES, "error.txt", "point.json")


@dataclass
class Point:
    """One simulation of a study.

    Attributes:
        label: Its folder name (unique in the study).
        values: The varied keys' values (dotted key -> value), as given.
        config: The resolved experiment, or None if the values do not make a valid one.
        error: Why they do not (one line), when ``config`` is None.
    """

    label: str
    values: dict[str, Any]
    config: ExperimentConfig | None
    error: str = ""
    _key: str | None = field(default=None, repr=False)

    def task(self) -> dict[str, Any]:
        assert self.config is not None
        return {"config": self.config.model_dump()}


@dataclass
class Outcome:
    """What a point produced: its summary, or its error."""

    summary: dict[str, Any] | None
    error: str
    wall_time_s: float
    internal: bool = False
    resumed: bool = False

    @property
    def ok(self) -> bool:
        return self.summary is not None


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` through a temporary file in its folder: it is whole or absent."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class FileDigests:
    """sha256 of the files configs refer to, read once per study."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], str] = {}
        self._catalog: dict[str, list[tuple[str, str]]] | None = None

    def catalog_files(self, name: str) -> list[tuple[str, str]]:
        """The built-in catalog files (GPU profiles, models, frameworks) named ``name``, as
        (``kind/name.yaml``, path): a point reads them as it reads the files its config gives
        by path."""
        if self._catalog is None:
            from batchsim.catalog import catalog_dir

            self._catalog = {}
            for kind in ("hardware_profiles", "models", "frameworks"):
                for path in sorted(catalog_dir(kind).glob("*.yaml")):
                    label = f"{kind}/{path.name}"
                    self._catalog.setdefault(path.stem, []).append((label, str(path)))
        return self._catalog.get(name, [])

    def of(self, path: str) -> str | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        cache_key = (path, stat.st_mtime_ns, stat.st_size)
        digest = self._cache.get(cache_key)
        if digest is None:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            digest = self._cache[cache_key] = h.hexdigest()
        return digest

    def key(self, config: ExperimentConfig) -> str:
        """The point key: a hash of the config, the files it names (by path, or built-in
        catalog entries by name) and batchsim's version."""
        from batchsim.version import __version__

        data = config.model_dump()
        if data.get("output") == _DEFAULT_OUTPUT:  # the key it had before output: existed
            del data["output"]
        files: dict[str, str | None] = {}

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)
            elif isinstance(node, str) and os.path.isabs(node) and os.path.isfile(node):
                files[node] = self.of(node)
            elif isinstance(node, str):
                for label, path in self.catalog_files(node):  # where it lives does not matter
                    files[label] = self.of(path)

        walk(data)
        blob = json.dumps(
            {"config": data, "files": files, "version": __version__},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


class PointStore:
    """The point folders of a study under ``root``."""

    def __init__(self, root: Path, digests: FileDigests | None = None):
        self.root = root
        self.digests = digests or FileDigests()

    def folder(self, point: Point) -> Path:
        return self.root / POINTS / point.label

    def key(self, point: Point) -> str:
        if point._key is None:
            assert point.config is not None
            point._key = self.digests.key(point.config)
        return point._key

    def finished(self, point: Point, need_csv: bool) -> Outcome | None:
        """The outcome of a previous run of ``point``, if it ran to the end with this key."""
        if point.config is None:
            return None
        folder = self.folder(point)
        try:
            record = json.loads((folder / "point.json").read_text(encoding="utf-8"))
            if not (
                isinstance(record, dict)
                and record.get("status") == "ok"
                and record.get("key") == self.key(point)
            ):
                return None
            if need_csv and not all(
                (folder / name).is_file() for name in output_files(point.config)
            ):
                return None
            summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(summary, dict):
            return None
        return Outcome(summary, "", float(record.get("wall_time_s", 0.0)), resumed=True)

    def prepare(self, point: Point) -> Path:
        """Create the point's folder and remove what a previous run left in it."""
        folder = self.folder(point)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name in POINT_FILES[::-1]:  # point.json first: never finished-looking
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
            for leftover in folder.glob(".*"):  # temporary files of an interrupted write
                if leftover.is_dir() and leftover.name.startswith(".batchsim-tmp-"):
                    shutil.rmtree(leftover, ignore_errors=True)
                elif leftover.name.endswith(".tmp"):
                    leftover.unlink(missing_ok=True)
        except OSError as exc:
            raise write_error(folder, exc) from None
        return folder

    def record(self, point: Point, outcome: Outcome, values: dict[str, Any]) -> None:
        """Write the point's files: config, summary or error, then ``point.json``."""
        folder = self.folder(point)
        try:
            if point.config is not None:
                write_atomic(folder / "config.yaml", dump_config(point.config))
            if outcome.summary is not None:
                write_atomic(folder / "summary.json", summary_json(outcome.summary))
            else:
                write_atomic(folder / "error.txt", outcome.error + "\n")
            record = {
                "status": "ok" if outcome.ok else "error",
                "key": self.key(point) if point.config is not None else None,
                "values": values,
                "seed": point.config.seed if point.config is not None else None,
                "wall_time_s": outcome.wall_time_s,
                "error": outcome.error,
            }
            write_atomic(folder / "point.json", json.dumps(record, indent=2, default=str) + "\n")
        except OSError as exc:
            raise write_error(folder, exc) from None


def check_study_dir(root: Path, kind: str) -> None:
    """``root`` may hold this study: new, empty, or a previous study of the same kind.

    Raises:
        ConfigError: Naming the folder and why; nothing has been written.
    """
    if check_new_dir(root):
        return
    marker = root / MARKER
    try:
        entries = [p.name for p in root.iterdir() if not p.name.startswith(".")]
    except OSError as exc:
        raise write_error(root, exc) from None
    if not entries:
        return
    try:
        previous = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        previous = None
    if not isinstance(previous, dict) or "kind" not in previous:
        raise ConfigError(
            f"cannot write {root}: it is not empty and holds no batchsim study ({MARKER}); "
            "a study writes into a new or empty directory, or resumes one: choose one with -o DIR"
        )
    if previous["kind"] != kind:
        raise ConfigError(
            f"cannot write {root}: it holds a batchsim {previous['kind']}, not a {kind}; "
            "choose another -o DIR"
        )
