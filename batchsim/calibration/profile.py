"""Writing the calibrated hardware profile.

Owns :func:`calibrated_profile` (the base profile's YAML with the fitted terms, the measured
range and sources saying what the terms were fitted from: file names and point counts, no
dates, no directories) and :func:`write_profile` (atomic; the written file is loaded back with
:func:`~batchsim.catalog.hardware_files.load_hardware` before it replaces anything).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchsim.calibration.predict import yaml_value
from batchsim.calibration.search import round_sig
from batchsim.catalog import resolve
from batchsim.catalog.calibrated_range import CalibratedRange
from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.catalog.hardware_files import load_hardware
from batchsim.errors import write_error
from batchsim.yamlio import dump, read_mapping

__all__ = ["calibrated_profile", "describe_files", "merge_ranges", "write_profile"]


def _plain(value: float) -> float | int:
    """4 significant digits; whole numbers as integers (``5`` rather than ``5.0``)."""
    value = round_sig(value)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def merge_ranges(a: CalibratedRange | None, b: CalibratedRange | None) -> CalibratedRange | None:
    """The union of two measured ranges (None: nothing measured)."""
    if a is None or b is None:
        return a or b

    def span(x: tuple[int, int] | None, y: tuple[int, int] | None) -> tuple[int, int] | None:
        if x is None or y is None:
            return x or y
        return (min(x[0], y[0]), max(x[1], y[1]))

    tps = sorted({*(a.tensor_parallel_size or ()), *(b.tensor_parallel_size or ())})
    return CalibratedRange(
        models=tuple(sorted({*a.models, *b.models})),
        hidden_size=span(a.hidden_size, b.hidden_size),
        tensor_parallel_size=tuple(tps) if tps else None,
        tokens=span(a.tokens, b.tokens),
        batch_size=span(a.batch_size, b.batch_size),
        context_tokens=span(a.context_tokens, b.context_tokens),
    )


def calibrated_profile(
    base_name: str,
    base: HardwareProfile,
    fitted: HardwareProfile,
    *,
    name: str,
    efficiency_source: str,
    cpu_source: str | None,
    calibrated_range: CalibratedRange | None,
    range_source: str,
) -> dict[str, Any]:
    """The new profile as a YAML mapping.

    Args:
        base_name: ``--hardware`` as given (a built-in name or a path).
        base: The base profile.
        fitted: The base profile with the fitted terms.
        name: The new profile's name.
        efficiency_source: What the ``efficiency:`` terms were fitted from.
        cpu_source: What the ``cpu_overhead:`` terms were fitted from (None: not fitted; the
            base profile's source is kept).
        calibrated_range: The measured shapes (None: no block).
        range_source: Where the range comes from.
    """
    raw, _ = read_mapping(resolve("hardware_profiles", base_name, "--hardware"))
    out: dict[str, Any] = {}
    for key, value in raw.items():
        # a GEMM table is relative to the terms it was fitted with: refitted terms drop it
        # (batchsim calibrate --kernel-table writes a new one)
        if key in ("efficiency", "cpu_overhead", "calibrated_range", "gemm_table", "sources"):
            continue
        out[key] = value
    out["name"] = name
    description = base.description or base.name
    out["description"] = f"{description}; terms fitted by batchsim calibrate"
    out["efficiency"] = {key: _plain(yaml_value(fitted, key)) for key in EFFICIENCY_KEYS}
    out["cpu_overhead"] = {
        "base_ms": float(round_sig(fitted.cpu_overhead_base * 1e3)),
        "per_seq_ms": float(round_sig(fitted.cpu_overhead_per_seq * 1e3)),
    }
    if calibrated_range is not None:
        out["calibrated_range"] = calibrated_range.to_yaml()
    sources = {k: v for k, v in base.sources.items() if k.split(".")[0] in out}
    sources["efficiency"] = efficiency_source
    if cpu_source is not None:
        sources["cpu_overhead"] = cpu_source
    if calibrated_range is not None:
        sources["calibrated_range"] = range_source
    out["sources"] = sources
    return out


def write_profile(path: Path, profile: Mapping[str, Any]) -> HardwareProfile:
    """Write ``profile`` to ``path`` (through a temporary file in the same directory, loaded
    back before it replaces ``path``) and return it loaded.

    Raises:
        ConfigError: The path cannot be written.
    """
    text = dump(dict(profile))
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        load_hardware(str(tmp))  # what is written must load
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return load_hardware(str(path))


def describe_files(files: Sequence[tuple[str, int, str]]) -> str:
    """``name (N points: what)`` for each file, joined with ``; ``."""
    return "; ".join(
        f"{name} ({points:,} point{'s' if points != 1 else ''}{': ' + what if what else ''})"
        for name, points, what in files
    )
