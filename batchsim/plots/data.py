"""Read result folders for figures and reports: a run (``batchsim run``), a sweep
(``batchsim sweep``) or a capacity study (``batchsim capacity``). Figures read folders only,
so any saved result can be drawn later.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchsim.errors import ConfigError, DamagedFileError
from batchsim.yamlio import read_mapping

if TYPE_CHECKING:
    import pandas as pd

MAX_JSON_BYTES = 64 * 2**20


def _read_json(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB")
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_csv(path: Path, **kwargs: Any) -> pd.DataFrame:
    import pandas as pd

    if not path.is_file():
        raise ConfigError(f"{path}: no such file (a run written with --summary-only has none)")
    try:
        last_row = _last_line(path)
        cut_at = _count_lines(path) + 1 if last_row is None else 0  # the line cut short
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if last_row is None:
        raise _cut(path, cut_at)
    try:
        table = pd.read_csv(path, **kwargs)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        message = " ".join(str(exc).split())
        raise ConfigError(f"{path}: cannot read it as CSV ({message})") from None
    if len(table) and last_row != "" and _num_fields(last_row) != len(table.columns):
        raise _cut(path, len(table) + 1)  # the header is line 1
    return table


def _cut(path: Path, line: int) -> DamagedFileError:
    return DamagedFileError(
        "the table ends in the middle of a row (a file cut short?); write it again "
        "(rerun the command that wrote it)",
        str(path),
        line,
    )


def _count_lines(path: Path) -> int:
    """The newlines of a file."""
    count = 0
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            count += chunk.count(b"\n")
    return count


_TAIL_BYTES = 1 << 16


def _last_line(path: Path) -> str | None:
    """The last line of a text file ("" when it is longer than the tail read: not checked),
    or None when the file does not end with a newline (a table batchsim writes ends every
    row with one: without it, the file was cut short)."""
    with path.open("rb") as file:
        size = file.seek(0, 2)
        start = max(0, size - _TAIL_BYTES)
        file.seek(start)
        tail = file.read()
    if not tail:
        return ""  # empty: pandas says so
    if not tail.endswith(b"\n"):
        return None
    lines = tail[:-1].rsplit(b"\n", 1)
    if len(lines) == 1 and start > 0:
        return ""
    return lines[-1].decode("utf-8", errors="replace").rstrip("\r")


def _num_fields(line: str) -> int:
    import csv

    return len(next(csv.reader([line]), []))


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # From memory, on the calling thread: pd.read_parquet and pq.read_table start
        # pyarrow's thread pools (and reading a file, its I/O pool), and pyarrow 14 could
        # abort at interpreter exit once they had run.
        with pq.ParquetFile(pa.BufferReader(path.read_bytes())) as parquet:
            return parquet.read(use_threads=False).to_pandas(use_threads=False)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        message = " ".join(str(exc).split())
        raise ConfigError(f"{path}: cannot read it as Parquet ({message})") from None


TABLE_FORMATS = ("csv", "parquet")


def finite_number(value: Any) -> float:
    """A table cell as a float; NaN when it is empty, not a number, or not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number if math.isfinite(number) else math.nan


def ok_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a study table whose point ran (``error`` empty)."""
    return table[_blank(table["error"])] if "error" in table else table


@dataclass
class Run:
    """A run's folder: ``summary.json``, ``config.yaml``, and the CSVs when written."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    label: str = ""
    """How the run is named in legends (its folder name, or the sweep point's values)."""
    values: dict[str, Any] = field(default_factory=dict)
    """The varied keys' values, for a point of a sweep."""

    @property
    def policy(self) -> str:
        return str((self.config.get("scheduler") or {}).get("policy", ""))

    @property
    def output(self) -> dict[str, Any]:
        """The config's ``output:`` block (empty for runs written before it existed)."""
        output = self.config.get("output")
        return output if isinstance(output, dict) else {}

    def table_path(self, table: str) -> Path:
        """The file of one of the run's tables (``requests``, ``iterations``, ``slots``): in
        the format its config names (``output.format``; CSV for runs written before it
        existed), else in the other format if only that one is there."""
        fmt = self.output.get("format")
        preferred = fmt if fmt in TABLE_FORMATS else "csv"
        path = self.path / f"{table}.{preferred}"
        if not path.is_file():
            for other in TABLE_FORMATS:
                candidate = self.path / f"{table}.{other}"
                if other != preferred and candidate.is_file():
                    return candidate
        return path

    def has_table(self, table: str) -> bool:
        """Whether the run's folder holds that table (in either format)."""
        return self.table_path(table).is_file()

    def missing_table(self, table: str, needed_by: str) -> ConfigError:
        """The error of a figure that needs a table the run did not write, saying why."""
        if table == "iterations" and self.output.get("iterations") == "none":
            why = "the run was written with output.iterations: none"
            fix = "rerun with --set output.iterations=all"
        elif table == "slots":
            why = "the run did not record its slots"
            fix = "rerun with --set metrics.record_slots=true"
        else:
            why = "a run written with --summary-only has none"
            fix = ""
        return ConfigError(
            f"{self.path}: no {self.table_path(table).name} ({why}); {needed_by} needs it"
            + (f": {fix}" if fix else "")
        )

    @property
    def iterations_sample(self) -> int | None:
        """N when the iterations table holds a sample of N of the run's iterations
        (``output.iterations: {sample: N}`` and more iterations than N), else None."""
        mode = self.output.get("iterations")
        n = mode.get("sample") if isinstance(mode, dict) else None
        total = self.summary.get("num_iterations")
        if isinstance(n, int) and (not isinstance(total, int) or total > n):
            return n
        return None

    def iterations_note(self) -> str | None:
        """What a figure drawn from a sampled iterations table should say, else None."""
        n = self.iterations_sample
        if n is None:
            return None
        total = self.summary.get("num_iterations")
        of = f" of {total:,}" if isinstance(total, int) else ""
        return f"iterations: a sample of {n:,}{of} (output.iterations: {{sample: {n}}})"

    def require_all_iterations(self, needed_by: str) -> None:
        """Raise unless the run's iterations table holds every iteration."""
        if not self.has_table("iterations"):
            raise self.missing_table("iterations", needed_by)
        note = self.iterations_note()
        if note is not None:
            raise ConfigError(
                f"{self.table_path('iterations')} holds only some iterations ({note}); "
                f"{needed_by} needs every iteration: rerun with --set output.iterations=all"
            )

    def _table(self, table: str, **csv_options: Any) -> pd.DataFrame:
        path = self.table_path(table)
        if not path.is_file():
            raise ConfigError(
                f"{self.path / (table + '.csv')}: no such file (a run written with "
                "--summary-only has none)"
            )
        if path.suffix == ".parquet":
            return _read_parquet(path)
        return _read_csv(path, **csv_options)

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """``requests.csv`` (or ``requests.parquet``): empty cells and the ``nan`` of times
        a request never reached are missing values (as in the Parquet file)."""
        return self._table("requests", keep_default_na=False, na_values=["", "nan"])

    @functools.cached_property
    def iterations(self) -> pd.DataFrame:
        """``iterations.csv`` (or ``iterations.parquet``): every iteration, or the sample
        ``output.iterations`` asked for (:attr:`iterations_sample`)."""
        return self._table("iterations")

    @functools.cached_property
    def replicas(self) -> pd.DataFrame:
        """``replicas.csv`` (or ``replicas.parquet``) of a cluster run: one row per replica."""
        return self._table("replicas", keep_default_na=False, na_values=["", "nan"])

    @functools.cached_property
    def slots(self) -> pd.DataFrame:
        """``slots.csv`` (or ``slots.parquet``; runs with ``metrics.record_slots: true``)."""
        if not self.has_table("slots"):
            raise ConfigError(
                f"{self.path}: no slots.csv; rerun with --set metrics.record_slots=true "
                "to record which request sits in which batch slot"
            )
        return self._table("slots")

    @property
    def has_csv(self) -> bool:
        """Whether the run wrote its requests and iterations tables (CSV or Parquet)."""
        return self.has_table("iterations") and self.has_table("requests")

    def has_iteration_rows(self) -> bool:
        """Whether the iterations table has a row, read no further than needed (its second
        line, or a Parquet file's footer)."""
        path = self.table_path("iterations")
        try:
            if path.suffix == ".parquet":
                import pyarrow.parquet as pq

                return bool(pq.ParquetFile(path).metadata.num_rows)
            with open(path, encoding="utf-8") as f:
                return bool(f.readline()) and bool(f.readline().strip())
        except (OSError, UnicodeDecodeError, ValueError):
            return False


@dataclass
class Study:
    """A sweep's or a capacity study's folder."""

    path: Path
    kind: str
    """``sweep`` or ``capacity``."""
    marker: dict[str, Any]
    """``sweep.json``."""

    @property
    def varied(self) -> list[str]:
        return list(self.marker.get("varied_keys") or [])

    @functools.cached_property
    def table(self) -> pd.DataFrame:
        """``sweep.csv`` or ``capacity.csv``: one row per point or configuration."""
        name = "capacity.csv" if self.kind == "capacity" else "sweep.csv"
        return _read_csv(self.path / name, keep_default_na=False, na_values=[""])

    @functools.cached_property
    def stats(self) -> pd.DataFrame | None:
        """``sweep_stats.csv`` (sweeps over several seeds), else None."""
        path = self.path / "sweep_stats.csv"
        if not path.is_file():
            return None
        return _read_csv(path, keep_default_na=False, na_values=[""])

    def point(self, label: str) -> Run:
        """The run of one point (its folder under ``points/``)."""
        run = load_run(self.path / "points" / label)
        run.label = label
        return run

    def runs(self) -> list[Run]:
        """The runs of the points that ran, in table order."""
        table = self.table
        ok = ok_rows(table)
        runs = []
        for _, row in ok.iterrows():
            if not row.get("point"):
                continue
            run = self.point(str(row["point"]))
            run.values = {key: row[key] for key in self.varied if key in row}
            runs.append(run)
        return runs

    def zipped_with(self, key: str) -> list[str]:
        """The varied keys on ``key``'s axis: ``key`` and the keys of its zip group."""
        for axis in self.marker.get("axes") or []:
            keys = list(axis.get("keys") or []) if isinstance(axis, dict) else []
            if key in keys:
                return keys
        return [key]

    def series(self, keys: list[str]) -> list[Series]:
        """The points that ran, grouped by their values of ``keys`` (one line of a figure
        each), in table order. With several seeds a series' rows are ``sweep_stats.csv``'s
        (means over the seeds and ``<metric>_ci95``), else ``sweep.csv``'s."""
        table = self.table
        ran = table
        if "error" in ran:
            ran = ran[_blank(ran["error"])]
        if "point" in ran:
            ran = ran[~_blank(ran["point"])]
        stats = self.stats
        if stats is not None and "num_seeds" in stats:
            stats = stats[stats["num_seeds"].fillna(0) > 0]
        groups: dict[tuple[str, ...], tuple[dict[str, Any], list[Any], list[str]]] = {}
        for index, row in ran.iterrows():
            values = {key: row[key] for key in keys if key in row}
            group = tuple(_value_key(v) for v in values.values())
            entry = groups.setdefault(group, (values, [], []))
            entry[1].append(index)
            entry[2].append(str(row["point"]))
        series = []
        for group, (values, indices, points) in groups.items():
            if stats is not None:
                mask = [
                    tuple(_value_key(row.get(k)) for k in values) == group
                    for _, row in stats.iterrows()
                ]
                rows = stats[mask]
            else:
                rows = ran.loc[indices]
            series.append(Series(values_label(values), values, rows, points))
        return _compact_labels(series)

    @functools.cached_property
    def base_config(self) -> dict[str, Any]:
        """The config of the study's first point that ran (model, GPU, workload for titles)."""
        for name in self.table.get("point", []):
            path = self.path / "points" / str(name) / "config.yaml"
            if path.is_file():
                data, _ = read_mapping(path)
                return data
        return {}


@dataclass
class Series:
    """Points of a study sharing their values of some varied keys: one line of a figure."""

    label: str
    """The values, as a legend names them (``policy=static, hardware=h100-sxm``)."""
    values: dict[str, Any]
    rows: pd.DataFrame
    """Their rows: of ``sweep.csv``, or of ``sweep_stats.csv`` for a sweep over seeds."""
    points: list[str]
    """Their folders under ``points/`` (every seed's), in table order."""


BARE_KEYS = ("scheduler.policy", "hardware", "model")
"""Keys whose values name themselves: a label of one of them alone is just the value."""


def value_text(value: Any) -> str:
    """A table cell as a label shows it: ``8`` not ``8.0``, a file's name without its
    folders."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and "/" in value and not value.lstrip().startswith(("{", "[")):
        return Path(value).name
    return str(value)


def values_label(values: dict[str, Any]) -> str:
    """``policy=static, max_num_seqs=8`` (keys shortened as point folders are); a policy,
    GPU or model alone is named by its value."""
    from batchsim.studies.grid import short_names

    if len(values) == 1 and next(iter(values)) in BARE_KEYS:
        return value_text(next(iter(values.values())))
    short = short_names(list(values))
    return ", ".join(f"{short[key]}={value_text(value)}" for key, value in values.items())


def _mapping(value: Any) -> dict[str, Any] | None:
    """A whole block's value in a sweep table (JSON text of a mapping), else None."""
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _compact_labels(series: list[Series]) -> list[Series]:
    """Labels of series that vary a whole block (``engine.speculative={...}``) name only the
    keys of the block that differ between the series, and a point without the block (an
    empty cell) says ``none``: a legend of full JSON mappings would not fit the figure."""
    keys = {k for s in series for k, v in s.values.items() if _mapping(v) is not None}
    if not keys:
        return series
    differing: dict[str, list[str]] = {}
    for key in keys:
        blocks = [_mapping(s.values.get(key)) for s in series]
        present = [b for b in blocks if b is not None]
        inner = sorted(
            {k for b in present for k in b},
            key=lambda k: min(list(b).index(k) if k in b else len(b) for b in present),
        )
        differing[key] = [
            k for k in inner if len({json.dumps(b.get(k), sort_keys=True) for b in present}) > 1
        ] or inner
    out = []
    for s in series:
        shown: dict[str, Any] = {}
        for key, value in s.values.items():
            block = _mapping(value)
            if key not in keys:
                shown[key] = value
            elif block is None:
                shown[key] = "none"
            else:
                shown[key] = " ".join(
                    f"{k}={value_text(block.get(k))}" for k in differing[key] if k in block
                )
        out.append(Series(values_label(shown), s.values, s.rows, s.points))
    return out


def _blank(column: pd.Series) -> pd.Series:
    """Which cells are empty (NaN, None or blank text)."""
    return column.isna() | (column.astype(str).str.strip() == "")


def _value_key(value: Any) -> str:
    """Cells of the same value read from sweep.csv and sweep_stats.csv compare equal."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return value_text(value) if isinstance(value, (int, float)) else str(value)


def load_run(path: str | Path) -> Run:
    """A run folder (it holds the ``summary.json`` batchsim wrote)."""
    folder = Path(path)
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        raise ConfigError(f"{folder}: not a batchsim run (no summary.json)")
    summary = _read_json(summary_path)
    if not isinstance(summary, dict) or "completed" not in summary:
        raise ConfigError(f"{summary_path}: not a summary.json that batchsim wrote")
    config = summary.get("config")
    if not isinstance(config, dict):
        config_path = folder / "config.yaml"
        config = read_mapping(config_path)[0] if config_path.is_file() else {}
    return Run(folder, summary, config, label=folder.name)


def load(path: str | Path) -> Run | Study:
    """A run, a sweep or a capacity study, recognised by its files.

    Raises:
        ConfigError: The folder is none of them (naming what it lacks).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such directory")
    marker_path = folder / "sweep.json"
    if marker_path.is_file():
        marker = _read_json(marker_path)
        kind = marker.get("kind") if isinstance(marker, dict) else None
        if kind not in ("sweep", "capacity"):
            raise ConfigError(f"{marker_path}: not a sweep.json that batchsim wrote")
        return Study(folder, str(kind), marker)
    if (folder / "summary.json").is_file():
        return load_run(folder)
    raise ConfigError(
        f"{folder}: not a batchsim result folder (no summary.json of a run, no sweep.json of "
        "a sweep or capacity study)"
    )
