"""``batchsim calibrate``: its options, the run (reading the inputs, calling the fits of
:mod:`batchsim.calibration`, writing the new profile) and the tables it prints.

Owns :func:`add_calibrate` (light: the CLI builds its parser with it) and the run. Every input
is read and checked before anything is fitted, and nothing is written on bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchsim.cli.args import output_path, positive_int
from batchsim.dtypes import WEIGHT_DTYPES
from batchsim.errors import ConfigError, write_error

if TYPE_CHECKING:
    from batchsim.calibration.e2e import E2EFit
    from batchsim.calibration.held_out import CalibrationResult

_KIND = {
    "layer_ops": "layer ops",
    "attention": "attention",
    "cpu": "CPU overhead",
    "all_reduce": "all-reduce",
}


DESCRIPTION = (
    "Fit a hardware profile's terms to your own measurements and write a new profile YAML: "
    "per-operator GPU timings in the CSV layout of Vidur's profiler (--ops; fits the "
    "efficiency, fixed-time, attention, all-reduce and CPU-overhead terms they measure, and "
    "prints the k-fold held-out error per operator group), measured GEMM kernel tables "
    "(--kernel-table; fits the GEMM terms and ships the measured corrections), and/or vLLM "
    "benchmark_latency / benchmark_serving JSON results (--e2e; fits up to four aggregate "
    "terms so that simulated runs match). The new profile records the measured range "
    "(calibrated_range:); batchsim run warns when a run goes outside it. See docs/calibration.md."
)


EPILOG = (
    "Setup a result file does not hold (model, batch size, lengths, TP) comes from a sidecar "
    "NAME.yaml next to NAME.json (keys model, tensor_parallel_size, batch_size, input_len, "
    "output_len, set) or from --model, --tp, --batch-size, --input-len, --output-len. "
    "Example: batchsim calibrate --hardware a100-80gb --ops my_measurements/ -o my-gpu.yaml"
)


def add_calibrate(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``calibrate`` command and its options to ``sub``."""
    p = sub.add_parser(
        "calibrate",
        help="fit a hardware profile's terms to your own measurements",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    p.add_argument(
        "--hardware",
        required=True,
        metavar="BASE",
        help="the profile to start from: built-in name or profile YAML (its datasheet numbers "
        "are kept; terms the measurements do not cover keep its values)",
    )
    p.add_argument(
        "--ops",
        nargs="+",
        action="extend",
        default=[],
        metavar="DIR_OR_CSV",
        help="per-operator timings: CSV files in Vidur's layout, or directories of them",
    )
    p.add_argument(
        "--e2e",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE.json",
        help="vLLM benchmark_latency --output-json or benchmark_serving --save-result files",
    )
    p.add_argument(
        "--kernel-table",
        nargs="+",
        action="extend",
        default=[],
        metavar="GEMM_TABLE",
        help="measured GEMM kernel tables (NVIDIA AIConfigurator's gemm_perf layout, Parquet "
        "or CSV: gemm_dtype, m, n, k, latency in ms): fits the GEMM terms and writes the "
        "measured corrections beside the profile as NEW_PROFILE.gemm.csv",
    )
    p.add_argument(
        "--model",
        nargs="+",
        action="extend",
        default=[],
        metavar="M",
        help="the models measured (built-in names, model YAML or config.json); default: "
        "found among the built-in models by the CSV files' shapes. With --e2e, one model is "
        "the default model of the result files",
    )
    p.add_argument(
        "-o",
        "--output",
        type=output_path,
        required=True,
        metavar="NEW_PROFILE.yaml",
        help="profile to write",
    )
    p.add_argument(
        "--name", metavar="NAME", help="the new profile's name (default: the file's stem)"
    )
    p.add_argument(
        "--folds",
        type=positive_int,
        metavar="K",
        help="folds of the held-out error, at most the measured rows (--e2e: files); default "
        "5, or as many as there are files when fewer; 1: no held-out error",
    )
    p.add_argument(
        "--dtype",
        choices=WEIGHT_DTYPES,
        default="bf16",
        help="weight dtype of the measured kernels (default bf16; fp16 prices the same)",
    )
    p.add_argument("--tp", type=positive_int, metavar="N", help="--e2e: tensor-parallel degree")
    p.add_argument(
        "--batch-size", type=positive_int, metavar="N", help="--e2e: benchmark_latency --batch-size"
    )
    p.add_argument(
        "--input-len", type=positive_int, metavar="N", help="--e2e: prompt tokens per request"
    )
    p.add_argument(
        "--output-len", type=positive_int, metavar="N", help="--e2e: output tokens per request"
    )
    p.set_defaults(func=_cmd_calibrate)


def _pct(pair: tuple[float, float]) -> str:
    med, p90 = pair
    if math.isnan(med):
        return "-"
    return f"{med:.1f} / {p90:.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = [
        "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths)))
    ]
    for r in rows:
        lines.append(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        )
    return lines


def _num(value: float) -> str:
    return f"{value:.4g}"


def print_ops(result: CalibrationResult, out: Any = None) -> None:
    """The per-operator-group error table."""
    out = sys.stdout if out is None else out
    if result.folds:
        by_configuration = "configuration" in result.fold_unit.values()
        unit = (
            "whole (model, TP) configurations where there are enough of them, else single points"
            if by_configuration
            else "single points"
        )
        title = (
            f"|error| by operator group, median / p90 % ({result.folds}-fold held-out: "
            f"a fold holds out {unit})"
        )
    else:
        title = "|error| by operator group, median / p90 % (no held-out error: --folds 1)"
    print(title, file=out)
    rows = [
        [e.group, f"{e.points:,}", _pct(e.base), _pct(e.fitted), _pct(e.held_out)]
        for e in result.errors
    ]
    for line in _table(["group", "points", "base profile", "fitted", "held-out"], rows):
        print(f"  {line}", file=out)


def print_e2e(fit: E2EFit, out: Any = None) -> None:
    """The end-to-end comparison table."""
    out = sys.stdout if out is None else out
    print(
        "end-to-end: measured and simulated"
        + (f" ({fit.folds}-fold held-out over files)" if fit.folds else ""),
        file=out,
    )

    def err(value: float, measured: float) -> str:
        return "-" if math.isnan(value) else f"{(value / measured - 1) * 100:+.1f}%"

    rows = []
    for r in fit.rows:
        m = r["measured"]
        rows.append(
            [
                r["file"],
                r["metric"],
                _num(m),
                f"{_num(r['base'])} ({err(r['base'], m)})",
                f"{_num(r['fitted'])} ({err(r['fitted'], m)})",
                err(r["held_out"], m),
            ]
        )
    for line in _table(["file", "metric", "measured", "base profile", "fitted", "held-out"], rows):
        print(f"  {line}", file=out)


DEFAULT_FOLDS = 5
MIN_SCORED_US = 5.0  # batchsim.calibration.kernel_tables.MIN_SCORED_S, without importing it


def _folds(given: int | None, meas: Any, points: list[Any]) -> int:
    """``--folds``: a fold holds at least one row (an --e2e file), so more folds than rows is
    an error; the default is 5 (fewer --e2e files: as many folds as files)."""
    if given is None:
        return DEFAULT_FOLDS
    if meas is not None:
        rows = sum(f.points for f in meas.files)
        if given > rows:
            raise ConfigError(
                f"--folds {given}: more folds than the {rows} measured rows of --ops; give "
                f"at most {rows}"
            )
    if points and given > len(points):
        raise ConfigError(
            f"--folds {given}: more folds than the {len(points)} --e2e files; give at most "
            f"{len(points)} (1: no held-out error)"
        )
    return given


def _cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``batchsim calibrate``."""
    from batchsim.calibration.e2e import e2e_range, fit_e2e, read_points
    from batchsim.calibration.held_out import calibrate_ops
    from batchsim.calibration.kernel_tables import write_gemm_table
    from batchsim.calibration.measured import read_measurements
    from batchsim.calibration.predict import with_terms, yaml_value
    from batchsim.calibration.profile import (
        calibrated_profile,
        describe_files,
        merge_ranges,
        write_profile,
    )
    from batchsim.catalog.calibrated_range import CalibratedRange
    from batchsim.catalog.hardware_files import load_hardware

    if not args.ops and not args.e2e and not args.kernel_table:
        raise ConfigError(
            "give --ops DIR_OR_CSV..., --kernel-table GEMM_TABLE... or --e2e FILE.json... "
            "(or several)"
        )
    output = Path(args.output)
    if output.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"-o: the profile must be a .yaml or .yml file, got {args.output}")
    if output.is_dir():
        raise ConfigError(f"-o: {args.output} is a directory")
    name = args.name or output.stem
    if not name.strip():
        raise ConfigError("--name must not be empty")
    base = load_hardware(args.hardware, "--hardware")
    # every input first: bad input fails before any fitting
    meas = read_measurements(args.ops, args.model or None) if args.ops else None
    points = []
    if args.e2e:
        defaults = {
            "model": args.model[0] if len(args.model) == 1 else None,
            "tensor_parallel_size": args.tp,
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
        }
        points = read_points(args.e2e, defaults)

    kernel_rows = None
    if args.kernel_table:
        import pandas as pd

        from batchsim.calibration.kernel_tables import read_gemm_measurements

        frames = [read_gemm_measurements(Path(f)) for f in args.kernel_table]
        joined = pd.concat(frames, ignore_index=True)
        kernel_rows = joined.groupby(["dtype", "m", "n", "k"], as_index=False).agg(
            time_s=("time_s", "min")
        )
    table_path = output.with_name(f"{output.stem}.gemm.csv")

    folds = _folds(args.folds, meas, points)
    print(f"batchsim calibrate: {base.name} -> {name}")
    hw = base
    sources: list[str] = []
    cpu_sources: list[str] = []
    ranges: CalibratedRange | None = None
    values: dict[str, float] = {}
    if meas is not None:
        result = calibrate_ops(meas, base, folds=folds, dtype=args.dtype)
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        values.update(result.values)
        hw = with_terms(base, result.values)
        print_ops(result)
        ranges = result.calibrated_range
        families = ", ".join(f"{fam} ({n:,} points)" for fam, n in result.families.items())
        files = describe_files(
            [
                (f.name, f.points, _KIND[f.kind] + (f" of {f.model}" if f.model else ""))
                for f in meas.files
            ]
        )
        if result.families:
            sources.append(
                f"fitted by batchsim calibrate from per-operator timings: {files}; fitted "
                f"families: {families}"
            )
        if "cpu_overhead" in result.families:
            cpu_sources.append(
                "fitted by batchsim calibrate (least squares in the batch size) on "
                f"{result.families['cpu_overhead']} CPU-overhead points of "
                + ", ".join(f.name for f in meas.files if f.kind == "cpu")
            )
        missing = [k for k in _KIND if k not in {f.kind for f in meas.files}]
        if missing:
            print(
                "note: no "
                + ", ".join(_KIND[k] for k in missing)
                + f" measurements: those terms keep the values of {base.name}",
                file=sys.stderr,
            )
    table = None
    if kernel_rows is not None:
        import dataclasses

        from batchsim.calibration.kernel_tables import (
            fit_gemm_terms,
            gemm_errors,
            gemm_table_from,
        )

        if meas is not None:
            print(
                "note: --kernel-table refits the GEMM terms that --ops fitted",
                file=sys.stderr,
            )
        gemm_values, _ = fit_gemm_terms(hw, kernel_rows)
        values.update(gemm_values)
        hw = dataclasses.replace(with_terms(hw, gemm_values), gemm_table=None)
        table = gemm_table_from(hw, kernel_rows, source=str(table_path))
        before = gemm_errors(base, kernel_rows, corrected=base.gemm_table is not None)
        terms_only = gemm_errors(hw, kernel_rows, corrected=False)
        hw = dataclasses.replace(hw, gemm_table=table)
        after = gemm_errors(hw, kernel_rows)
        print(
            f"GEMM kernels of {MIN_SCORED_US:g} us or more (n, k >= 128), "
            "|error| median / p90 % on the tables fitted"
        )
        rows = [
            [
                str(b["dtype"]),
                f"{int(b['kernels']):,}",
                _pct((b["median_err_pct"], b["p90_err_pct"])),
                _pct((t["median_err_pct"], t["p90_err_pct"])),
                _pct((a["median_err_pct"], a["p90_err_pct"])),
            ]
            for b, t, a in zip(
                before.to_dict("records"), terms_only.to_dict("records"), after.to_dict("records")
            )
        ]
        header = ["dtype", "kernels", "base profile", "fitted terms", "with corrections"]
        for line in _table(header, rows):
            print(f"  {line}")
        names = ", ".join(Path(f).name for f in args.kernel_table)
        sources.append(
            f"GEMM terms ({', '.join(gemm_values)}) fitted by batchsim calibrate on the 16-bit "
            f"GEMMs of at least {MIN_SCORED_US:g} us of the kernel tables {names} "
            f"({len(kernel_rows):,} shapes)"
        )
    if points:
        for point in points:
            for note in point.notes:
                print(f"note: {point.file}: {note}", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="batchsim-calibrate-") as workdir:
            fit = fit_e2e(points, hw, Path(workdir), folds=folds)
        print_e2e(fit)
        values.update(fit.values)
        hw = with_terms(hw, fit.values)
        scales = ", ".join(f"{k} {_num(v)}" for k, v in fit.scales.items())
        files = describe_files(
            [
                (
                    p.file,
                    len(p.measured),
                    f"benchmark_{p.kind}, {p.setup.model} TP{p.setup.tensor_parallel_size}",
                )
                for p in points
            ]
        )
        sources.append(
            f"end-to-end fit by batchsim calibrate on vLLM benchmark results {files}: {scales} "
            "(memory_scale multiplies memory, elementwise, attention_sm_bandwidth; "
            "compute_scale multiplies compute, attention)"
        )
        if any(k.startswith("cpu_overhead") for k in fit.scales):
            cpu_sources.append(f"end-to-end fit on {', '.join(p.file for p in points)}")
        ranges = merge_ranges(ranges, e2e_range(points))
    sources.append(f"terms not fitted keep the values of profile {base.name}")
    print("terms (YAML units): base -> fitted")
    for key, value in values.items():
        print(f"  {key}: {_num(yaml_value(base, key))} -> {_num(value)}")
    if ranges is not None:
        for key, value in ranges.to_yaml().items():
            print(f"  calibrated_range.{key}: {value}")
    profile = calibrated_profile(
        args.hardware,
        base,
        hw,
        name=name,
        efficiency_source="; ".join(sources),
        cpu_source="; ".join(cpu_sources) if cpu_sources else None,
        calibrated_range=ranges,
        range_source="the shapes of the measurements the terms were fitted on (batchsim "
        "calibrate); batchsim run warns outside them",
    )
    if table is not None:
        profile["gemm_table"] = table_path.name
        profile["sources"]["gemm_table"] = (
            f"ln(measured / modelled) GEMM time per (dtype, n, k, m) of the kernel tables "
            f"{', '.join(Path(f).name for f in args.kernel_table)}, written by batchsim calibrate"
        )
        existed = table_path.exists()
        try:
            write_gemm_table(
                table,
                table_path,
                [f"GEMM corrections of hardware profile {name}", profile["sources"]["gemm_table"]],
            )
        except OSError as exc:
            raise write_error(table_path, exc) from None
        try:
            write_profile(output, profile)
        except BaseException:
            if not existed:
                table_path.unlink(missing_ok=True)
            raise
        print(f"wrote {table_path}")
    else:
        write_profile(output, profile)
    print(f"wrote {output}")
    return 0
