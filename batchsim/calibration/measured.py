"""Reading per-operator GPU timings in the CSV layout of Vidur's profiler.

Owns :func:`read_measurements`: files (or directories of ``*.csv`` files) in, one table per
kind of measurement out (:class:`Measurements`), every time in seconds. The layout is that of
the A100 measurements Vidur published (MIT licence; ``docs/calibration.md`` section
"Calibrating a profile for your GPU in an hour" lists the columns). A file's kind is told by
its columns:

* **layer ops** — ``time_stats.<op>.median`` (ms) of one transformer layer's token-wise
  kernels for ``num_tokens`` rows: ``attn_pre_proj`` (fused QKV), ``attn_post_proj`` (O),
  ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj``, ``input_layernorm``,
  ``post_attention_layernorm``, ``attn_rope``, ``add``; with ``n_head, n_kv_head, n_embd,
  n_expanded_embd, num_tokens, num_tensor_parallel_workers``;
* **attention** — ``time_stats.attn_decode.median`` / ``time_stats.attn_prefill.median`` with
  ``n_embd, n_q_head, n_kv_head, num_tensor_parallel_workers, batch_size,
  prefill_chunk_size, kv_cache_size, is_prefill`` (``max_model_len`` optional);
* **all-reduce** — ``time_stats.all_reduce.median`` with ``num_workers, size`` (fp16
  elements; ``devices_per_node`` optional: rows spanning nodes are left out);
* **CPU overhead** — ``schedule_median, sampler_e2e_median, prepare_inputs_e2e_median,
  process_model_outputs_median`` (ms) with ``model_name, batch_size, tensor_parallel_degree``.

Which catalog model a layer-op or attention file measured is found from its shape columns
(hidden size, heads, KV heads, MLP width) among the ``--model`` names given, else among the
built-in models (the file name breaks a tie). Every problem — a missing column, a time that
is not a finite number > 0, an empty file, an operator name this reader does not know — is a
:class:`~batchsim.errors.ConfigError` naming the file.

Must not import the engine or the scheduler (pandas is imported here: the command loads this
module when it runs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from batchsim.catalog.model import ModelSpec
from batchsim.catalog.model_files import list_models, load_model
from batchsim.errors import ConfigError

__all__ = [
    "ATTENTION_OPS",
    "CPU_COLUMNS",
    "KNOWN_OPS",
    "LAYER_GROUPS",
    "MeasuredFile",
    "Measurements",
    "read_measurements",
]

LAYER_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("attn_pre_proj",),
    "o_proj": ("attn_post_proj",),
    "mlp": ("mlp_up_proj", "mlp_act", "mlp_down_proj"),
    "elementwise": ("input_layernorm", "post_attention_layernorm", "attn_rope", "add"),
}
"""Operator groups of the layer-op files and the measured kernels each sums."""
ATTENTION_OPS = ("attn_decode", "attn_prefill")
IGNORED_OPS = (
    "emb",  # the embedding lookup (once per iteration, not per layer)
    "attn_input_reshape",
    "attn_output_reshape",
    "attn_kv_cache_save",  # priced with the attention group, not with the kernel alone
)
KNOWN_OPS = (
    *(op for ops in LAYER_GROUPS.values() for op in ops),
    *ATTENTION_OPS,
    "all_reduce",
    *IGNORED_OPS,
)
"""Every ``time_stats.<op>`` name the reader accepts (the ignored ones are not used)."""
CPU_COLUMNS = (
    "schedule_median",
    "sampler_e2e_median",
    "prepare_inputs_e2e_median",
    "process_model_outputs_median",
)
"""The CPU-overhead parts summed per iteration (ms)."""
MAX_ALL_REDUCE_BYTES = 64 * 2**20
"""Larger all-reduce messages are left out: the fit is of latency and link bandwidth."""

_STAT = re.compile(r"^time_stats\.(.+)\.(min|max|mean|median|std)$")
_LAYER_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")
_LAYER_KEYS = ("num_tokens", "num_tensor_parallel_workers")
_ATTENTION_KEYS = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
)


@dataclass(frozen=True)
class MeasuredFile:
    """One input file: its name (no directory), kind and the points it gave."""

    name: str
    kind: str
    points: int
    model: str | None = None


@dataclass
class Measurements:
    """Every point read, by kind (times in seconds).

    Attributes:
        layer_ops: ``file, model, tp, num_tokens`` and one column per measured kernel of
            :data:`LAYER_GROUPS` (a missing group's columns are NaN).
        attention: ``file, model, tp, kind`` (decode | prefill), ``batch_size, chunk,
            kv_cache_size, split_tokens, measured_s``.
        cpu: ``file, model, tp, batch_size, measured_s`` (the four parts summed).
        all_reduce: ``file, num_workers, bytes, measured_s``.
        files: The files, in the order read.
        models: The catalog models the points refer to, by name.
    """

    layer_ops: pd.DataFrame
    attention: pd.DataFrame
    cpu: pd.DataFrame
    all_reduce: pd.DataFrame
    files: list[MeasuredFile] = field(default_factory=list)
    models: dict[str, ModelSpec] = field(default_factory=dict)


def _csv_files(paths: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.csv") if p.is_file())
            if not found:
                raise ConfigError(f"--ops: no .csv file in or below directory {text}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise ConfigError(f"--ops: no such file or directory: {text}")
    return list(dict.fromkeys(files))


def _read_csv(path: Path) -> pd.DataFrame:
    shown = str(path)
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ConfigError("empty file: expected a CSV header and data rows", shown) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"not a readable CSV file: {reason}", shown) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", shown) from None
    if frame.empty:
        raise ConfigError("no data rows (only a header)", shown)
    return frame


def _ops_of(frame: pd.DataFrame, shown: str) -> set[str]:
    ops = set()
    for column in frame.columns:
        match = _STAT.match(str(column))
        if match is None:
            continue
        op = match.group(1)
        if op not in KNOWN_OPS:
            raise ConfigError(
                f"column {column}: unknown operator {op!r}; known operators: "
                + ", ".join(KNOWN_OPS),
                shown,
            )
        if match.group(2) == "median":  # the statistic compared; the others are not read
            ops.add(op)
    return ops


def _require(frame: pd.DataFrame, columns: Sequence[str], kind: str, shown: str) -> None:
    for column in columns:
        if column not in frame.columns:
            raise ConfigError(
                f"missing column {column} (a {kind} file needs " + ", ".join(columns) + ")",
                shown,
            )


def _times(frame: pd.DataFrame, column: str, rows: np.ndarray, shown: str) -> np.ndarray:
    """The values of ``column`` on ``rows`` (bool mask) as seconds; each a finite number > 0
    (ms in the file)."""
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = rows & ~(np.isfinite(values) & (values > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConfigError(
            f"data row {i + 1}: {column} must be a finite number > 0 (ms), "
            f"got {frame[column].iloc[i]!r}",
            shown,
        )
    return values * 1e-3


def _counts(frame: pd.DataFrame, column: str, shown: str, minimum: int = 1) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < minimum) | (values != np.round(values))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ConfigError(
            f"data row {i + 1}: {column} must be a whole number >= {minimum}, "
            f"got {frame[column].iloc[i]!r}",
            shown,
        )
    return values.astype(np.int64)


class _ModelMatcher:
    """Finds the catalog model a file measured from its shape columns."""

    def __init__(self, names: Sequence[str] | None) -> None:
        self._given = [load_model(name, "--model") for name in names] if names else None
        self._catalog: list[ModelSpec] | None = None

    def candidates(self) -> list[ModelSpec]:
        if self._given is not None:
            return self._given
        if self._catalog is None:
            self._catalog = [m for m in list_models() if not m.is_moe]
        return self._catalog

    def match(self, shape: dict[str, int], shown: str) -> ModelSpec:
        def fits(m: ModelSpec) -> bool:
            return all(
                getattr(m, attr) == value
                for attr, value in (
                    ("hidden_size", shape.get("n_embd")),
                    ("num_attention_heads", shape.get("heads")),
                    ("num_key_value_heads", shape.get("kv_heads")),
                    ("intermediate_size", shape.get("n_expanded_embd", m.intermediate_size)),
                )
            )

        found = [m for m in self.candidates() if fits(m)]
        described = ", ".join(f"{k}={v}" for k, v in shape.items())
        if not found:
            where = "the --model names" if self._given is not None else "the built-in models"
            raise ConfigError(
                f"no model among {where} has this file's shape ({described}); "
                "give the model with --model NAME (a built-in name, model YAML or config.json)",
                shown,
            )
        if len(found) > 1:
            stem = Path(shown).name.lower()
            named = [m for m in found if m.name.lower() in stem]
            if len(named) >= 1:
                return max(named, key=lambda m: len(m.name))
            raise ConfigError(
                f"models {', '.join(m.name for m in found)} all have this file's shape "
                f"({described}); choose one with --model NAME",
                shown,
            )
        return found[0]


def _shape_of(frame: pd.DataFrame, columns: dict[str, str], shown: str) -> dict[str, int]:
    shape = {}
    for key, column in columns.items():
        values = _counts(frame, column, shown)
        if len(np.unique(values)) != 1:
            raise ConfigError(
                f"{column}: one model per file, but it takes values "
                + ", ".join(str(v) for v in np.unique(values)[:5]),
                shown,
            )
        shape[key] = int(values[0])
    return shape


def _check_tp(model: ModelSpec, tps: np.ndarray, column: str, shown: str) -> None:
    for tp in np.unique(tps).tolist():
        if model.num_attention_heads % tp:
            raise ConfigError(
                f"{column}={tp} does not divide the {model.num_attention_heads} attention "
                f"heads of {model.name}",
                shown,
            )


def _layer_ops(frame: pd.DataFrame, ops: set[str], matcher: _ModelMatcher, shown: str) -> tuple:
    _require(frame, (*_LAYER_SHAPE, *_LAYER_KEYS), "layer-op", shown)
    groups = [g for g, needed in LAYER_GROUPS.items() if set(needed) & ops]
    for group in groups:
        for op in LAYER_GROUPS[group]:
            if op not in ops:
                raise ConfigError(
                    f"missing column time_stats.{op}.median (group {group} sums "
                    + ", ".join(LAYER_GROUPS[group])
                    + ")",
                    shown,
                )
    if not groups:
        raise ConfigError(
            "no layer-op timings: expected time_stats.<op>.median for op in "
            + ", ".join(op for ops_ in LAYER_GROUPS.values() for op in ops_),
            shown,
        )
    shape = _shape_of(
        frame,
        {
            "n_embd": "n_embd",
            "heads": "n_head",
            "kv_heads": "n_kv_head",
            "n_expanded_embd": "n_expanded_embd",
        },
        shown,
    )
    model = matcher.match(shape, shown)
    if model.is_moe:
        raise ConfigError(
            f"model {model.name} is a mixture of experts: layer ops need a dense model", shown
        )
    tokens = _counts(frame, "num_tokens", shown)
    tps = _counts(frame, "num_tensor_parallel_workers", shown)
    _check_tp(model, tps, "num_tensor_parallel_workers", shown)
    every = np.ones(len(frame), dtype=bool)
    data = {"tp": tps, "num_tokens": tokens}
    for group in groups:
        for op in LAYER_GROUPS[group]:
            data[op] = _times(frame, f"time_stats.{op}.median", every, shown)
    table = pd.DataFrame(data).groupby(["tp", "num_tokens"], sort=True).median().reset_index()
    table.insert(0, "model", model.name)
    table.insert(0, "file", Path(shown).name)
    return table, model


def _flag(frame: pd.DataFrame, column: str, shown: str) -> np.ndarray:
    raw = frame[column]
    if raw.dtype == bool:
        return raw.to_numpy()
    text = raw.astype(str).str.strip().str.lower()
    known = text.isin(["true", "false", "1", "0"])
    if not known.all():
        i = int(np.flatnonzero(~known.to_numpy())[0])
        raise ConfigError(
            f"data row {i + 1}: {column} must be True or False, got {raw.iloc[i]!r}", shown
        )
    return text.isin(["true", "1"]).to_numpy()


def _attention(frame: pd.DataFrame, ops: set[str], matcher: _ModelMatcher, shown: str) -> tuple:
    _require(frame, _ATTENTION_KEYS, "attention", shown)
    shape = _shape_of(
        frame, {"n_embd": "n_embd", "heads": "n_q_head", "kv_heads": "n_kv_head"}, shown
    )
    model = matcher.match(shape, shown)
    prefill = _flag(frame, "is_prefill", shown)
    tps = _counts(frame, "num_tensor_parallel_workers", shown)
    _check_tp(model, tps, "num_tensor_parallel_workers", shown)
    batch = _counts(frame, "batch_size", shown)
    chunk = _counts(frame, "prefill_chunk_size", shown, minimum=0)
    context = _counts(frame, "kv_cache_size", shown, minimum=0)
    split = (
        _counts(frame, "max_model_len", shown).astype(float)
        if "max_model_len" in frame.columns
        else np.full(len(frame), np.nan)
    )
    parts = []
    for kind, rows in (("decode", ~prefill), ("prefill", prefill)):
        if not rows.any():
            continue
        op = f"attn_{kind}"
        if op not in ops:
            raise ConfigError(f"missing column time_stats.{op}.median ({kind} rows)", shown)
        seconds = _times(frame, f"time_stats.{op}.median", rows, shown)
        if kind == "prefill":
            bad = rows & (chunk < 1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ConfigError(
                    f"data row {i + 1}: prefill_chunk_size must be >= 1 on a prefill row", shown
                )
        part = pd.DataFrame(
            {
                "tp": tps[rows],
                "kind": kind,
                "batch_size": batch[rows] if kind == "decode" else 1,
                "chunk": chunk[rows] if kind == "prefill" else 1,
                "kv_cache_size": context[rows],
                "split_tokens": split[rows],
                "measured_s": seconds[rows],
            }
        )
        keys = ["tp", "kind", "batch_size", "chunk", "kv_cache_size"]
        parts.append(part.groupby(keys, sort=True).median().reset_index())
    table = pd.concat(parts, ignore_index=True)
    table.insert(0, "model", model.name)
    table.insert(0, "file", Path(shown).name)
    return table, model


def _all_reduce(frame: pd.DataFrame, shown: str) -> pd.DataFrame:
    _require(frame, ("time_stats.all_reduce.median", "num_workers", "size"), "all-reduce", shown)
    workers = _counts(frame, "num_workers", shown, minimum=2)
    size = _counts(frame, "size", shown)
    keep = np.ones(len(frame), dtype=bool)
    if "devices_per_node" in frame.columns:
        keep = _counts(frame, "devices_per_node", shown) == workers  # inside one node
    keep &= size * 2.0 <= MAX_ALL_REDUCE_BYTES
    if not keep.any():
        raise ConfigError(
            "no all-reduce row inside one node (devices_per_node = num_workers) with a message "
            f"of at most {MAX_ALL_REDUCE_BYTES // 2**20} MiB",
            shown,
        )
    seconds = _times(frame, "time_stats.all_reduce.median", keep, shown)
    part = pd.DataFrame(
        {"num_workers": workers[keep], "bytes": size[keep] * 2.0, "measured_s": seconds[keep]}
    )
    table = part.groupby(["num_workers", "bytes"], sort=True).median().reset_index()
    table.insert(0, "file", Path(shown).name)
    return table


def _cpu(frame: pd.DataFrame, shown: str) -> pd.DataFrame:
    _require(
        frame,
        (*CPU_COLUMNS, "model_name", "batch_size", "tensor_parallel_degree"),
        "CPU-overhead",
        shown,
    )
    every = np.ones(len(frame), dtype=bool)
    total = sum(_times(frame, column, every, shown) for column in CPU_COLUMNS)
    part = pd.DataFrame(
        {
            "model": frame["model_name"].astype(str).to_numpy(),
            "tp": _counts(frame, "tensor_parallel_degree", shown),
            "batch_size": _counts(frame, "batch_size", shown),
            "measured_s": total,
        }
    )
    table = part.groupby(["model", "tp", "batch_size"], sort=True).median().reset_index()
    table.insert(0, "file", Path(shown).name)
    return table


_EMPTY = {
    "layer_ops": ["file", "model", "tp", "num_tokens"],
    "attention": [
        "file",
        "model",
        "tp",
        "kind",
        "batch_size",
        "chunk",
        "kv_cache_size",
        "split_tokens",
        "measured_s",
    ],
    "cpu": ["file", "model", "tp", "batch_size", "measured_s"],
    "all_reduce": ["file", "num_workers", "bytes", "measured_s"],
}


def read_measurements(paths: Sequence[str], models: Sequence[str] | None = None) -> Measurements:
    """Read per-operator timings (files, or directories of ``*.csv`` files).

    Args:
        paths: CSV files or directories (every ``*.csv`` file below them, sorted by path: the
            ``profiling_outputs/`` folder of Vidur's profiler works as it is).
        models: Model names (built-in, YAML or config.json) the layer-op and attention files
            measured; None: found among the built-in models by shape.

    Raises:
        ConfigError: A missing path, an unreadable or empty file, a missing column, an
            unknown operator, a time that is not a finite number > 0, a layout that is none
            of the four, or no model of the file's shape.
    """
    matcher = _ModelMatcher(models)
    tables: dict[str, list[pd.DataFrame]] = {k: [] for k in _EMPTY}
    files: list[MeasuredFile] = []
    specs: dict[str, ModelSpec] = {}
    for path in _csv_files(paths):
        shown = str(path)
        frame = _read_csv(path)
        ops = _ops_of(frame, shown)
        attention, layer = (
            ops & set(ATTENTION_OPS),
            ops & {op for group in LAYER_GROUPS.values() for op in group},
        )
        model: ModelSpec | None = None
        if attention and (layer or "all_reduce" in ops):
            raise ConfigError(
                "holds attention timings and other operators: one kind of measurement per file",
                shown,
            )
        if attention:
            kind = "attention"
            table, model = _attention(frame, ops, matcher, shown)
        elif layer:
            if "all_reduce" in ops:
                raise ConfigError("holds layer-op and all-reduce timings: one kind per file", shown)
            kind = "layer_ops"
            table, model = _layer_ops(frame, ops, matcher, shown)
        elif "all_reduce" in ops:
            kind = "all_reduce"
            table = _all_reduce(frame, shown)
        elif any(column in frame.columns for column in CPU_COLUMNS):
            kind = "cpu"
            table = _cpu(frame, shown)
        else:
            raise ConfigError(
                "not a known measurement layout: expected time_stats.<op>.median columns "
                f"(ops: {', '.join(KNOWN_OPS)}) or the CPU-overhead columns "
                f"{', '.join(CPU_COLUMNS)}",
                shown,
            )
        if model is not None:
            specs[model.name] = model
        tables[kind].append(table)
        files.append(MeasuredFile(path.name, kind, len(table), model.name if model else None))

    def joined(kind: str) -> pd.DataFrame:
        if not tables[kind]:
            return pd.DataFrame({c: [] for c in _EMPTY[kind]})
        return pd.concat(tables[kind], ignore_index=True)

    return Measurements(
        joined("layer_ops"),
        joined("attention"),
        joined("cpu"),
        joined("all_reduce"),
        files,
        specs,
    )
