"""The ``batchsim roofline`` command: price a few iteration shapes with the cost model.

Owns the command's options (:func:`add_arguments`), their validation (one-line
:class:`~batchsim.errors.ConfigError` naming the option and the allowed values) and its three
output formats (table, csv, json). ``batchsim.cli`` wires it in as a subcommand.

Two kinds of shapes:

* ``--batch 1,8,64 --context C`` — decode iterations: B requests, each with C cached tokens;
* ``--tokens 1,512,2048 [--context C]`` — one prefill chunk of N tokens after C cached tokens.

Must not import simpy, the engine or the scheduler: it needs only the catalogs and
:mod:`batchsim.cost`, and imports them when the command runs (the CLI builds its parser with
:func:`add_arguments`, which must stay light).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

from batchsim.dtypes import KV_DTYPES as STORED_KV_DTYPES
from batchsim.dtypes import WEIGHT_DTYPES
from batchsim.errors import ConfigError

if TYPE_CHECKING:
    from batchsim.cost import BatchShape, RooflineCostModel

__all__ = ["FORMATS", "add_arguments", "build_rows", "run"]

DESCRIPTION = (
    "Price iteration shapes with the cost model: decode batches (--batch B1,B2,... with "
    "--context cached tokens per request) or one prefill chunk (--tokens N1,N2,...). Prints "
    "time, tok/s, FLOPs, bytes (weights and KV cache), arithmetic intensity, bound and the "
    "time of each operator group, with the ridge point and the knee batch size (where "
    "decode turns compute-bound; the table marks it)."
)
FORMATS = ("table", "csv", "json")
KV_DTYPES = ("auto", *STORED_KV_DTYPES)
DEFAULT_DECODE_CONTEXT = 1024
MAX_KNEE_BATCH = 65536


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``roofline`` options to ``parser``."""
    parser.add_argument(
        "--model",
        required=True,
        metavar="NAME",
        help="built-in model name, model YAML or config.json",
    )
    parser.add_argument(
        "--hardware", required=True, metavar="NAME", help="built-in hardware name or profile YAML"
    )
    parser.add_argument("--tp", default="1", metavar="N", help="tensor-parallel degree (default 1)")
    parser.add_argument(
        "--dtype",
        default=None,
        metavar="DTYPE",
        help=f"weight dtype: {', '.join(WEIGHT_DTYPES)} (default: the checkpoint's, else bf16)",
    )
    parser.add_argument(
        "--kv-dtype",
        default=None,
        metavar="DTYPE",
        help=(
            f"KV-cache dtype: {', '.join(KV_DTYPES)} "
            "(default auto = weight dtype; bf16 beside a quantized checkpoint)"
        ),
    )
    parser.add_argument(
        "--batch",
        metavar="B1,B2,...",
        help="decode batch sizes, comma-separated (e.g. 1,8,64,256)",
    )
    parser.add_argument(
        "--tokens",
        metavar="N1,N2,...",
        help="prefill chunk sizes in tokens, comma-separated (e.g. 1,512,2048)",
    )
    parser.add_argument(
        "--context",
        default=None,
        metavar="C",
        help=f"cached tokens per request (default {DEFAULT_DECODE_CONTEXT} with --batch, "
        "0 with --tokens)",
    )
    parser.add_argument(
        "--format",
        default="table",
        metavar="{" + ",".join(FORMATS) + "}",
        help="output format (default table); csv and json carry every column of the table",
    )
    parser.add_argument(
        "--ideal",
        action="store_true",
        help="pure datasheet roofline: efficiencies 1, no tiles, floors or overheads",
    )


# --------------------------------------------------------------------------- validation


def _int_list(option: str, text: str) -> list[int]:
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(
                f"{option}: expected comma-separated integers >= 1, got {text!r}"
            ) from None
        if value < 1:
            raise ConfigError(f"{option}: values must be integers >= 1, got {value}")
        values.append(value)
    return values


def _int(option: str, text: Any, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{option}: expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise ConfigError(f"{option}: must be an integer >= {minimum}, got {value}")
    return value


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{option}: unknown value {value!r}; allowed: {', '.join(allowed)}")
    return value


# --------------------------------------------------------------------------- rows


def build_rows(
    cost_model: RooflineCostModel, shapes: list[tuple[int, int, BatchShape]]
) -> list[dict[str, Any]]:
    """One output row per (batch size, context, shape)."""
    from batchsim.cost import OP_NAMES

    rows = []
    for batch, context, shape in shapes:
        cost = cost_model.estimate(shape)
        tokens = int(shape.num_tokens)
        rows.append(
            {
                "batch_size": batch,
                "context_len": context,
                "num_tokens": tokens,
                "time_ms": cost.time * 1e3,
                "tokens_per_s": tokens / cost.time if cost.time > 0 else 0.0,
                "flops": float(cost.flops),
                "bytes": float(cost.bytes),
                "weight_bytes": float(cost.weight_bytes),
                "kv_bytes": float(cost.kv_bytes),
                "intensity": float(cost.intensity),
                "bound": cost.bound,
                "ops": {name: cost.ops[name].time * 1e3 for name in OP_NAMES},
                "knee": False,
            }
        )
    return rows


def mark_knee(rows: list[dict[str, Any]], knee: int | None) -> None:
    """Set ``knee`` on the decode row at the knee batch size, or on the smallest batch past it
    when the knee is not among the rows (the row the table marks)."""
    past = [row for row in rows if knee is not None and row["batch_size"] >= knee]
    if past:
        min(past, key=lambda row: row["batch_size"])["knee"] = True


def run(args: argparse.Namespace) -> int:
    """Execute ``batchsim roofline``; returns the exit code (errors raise ConfigError)."""
    from batchsim.catalog.hardware_files import load_hardware
    from batchsim.catalog.model_files import load_model
    from batchsim.cost import BatchShape, RooflineCostModel

    fmt = _choice("--format", args.format, FORMATS)
    tp = _int("--tp", args.tp, 1)
    if (args.batch is None) == (args.tokens is None):
        raise ConfigError(
            "roofline: give exactly one of --batch (decode batch sizes) or --tokens "
            "(prefill chunk sizes), e.g. --batch 1,8,64 or --tokens 512,2048"
        )
    decode = args.batch is not None
    sizes = _int_list("--batch" if decode else "--tokens", args.batch if decode else args.tokens)
    default_context = DEFAULT_DECODE_CONTEXT if decode else 0
    context = default_context if args.context is None else _int("--context", args.context, 0)

    model = load_model(args.model, key="--model")
    hardware = load_hardware(args.hardware, key="--hardware")
    # a quantized checkpoint runs in its own precision, as in an experiment (config.resolve)
    checkpoint = model.checkpoint_dtype
    dtype = _choice("--dtype", args.dtype or checkpoint or "bf16", WEIGHT_DTYPES)
    default_kv = "auto" if checkpoint is None else model.checkpoint_kv_cache_dtype or "bf16"
    kv_dtype = _choice("--kv-dtype", args.kv_dtype or default_kv, KV_DTYPES)
    heads = model.num_attention_heads
    if heads % tp:
        allowed = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ConfigError(
            f"--tp: must divide the {heads} attention heads of {model.name}, got {tp}; "
            f"allowed: {allowed}"
        )
    cost_model = RooflineCostModel(
        model, hardware, tp=tp, dtype=dtype, kv_dtype=kv_dtype, ideal=args.ideal
    )
    window = model.sliding_window
    if decode:
        shapes = [(b, context, BatchShape.decode(b, context, window)) for b in sizes]
    else:
        shapes = [(1, context, BatchShape.prefill(n, context, window)) for n in sizes]
    rows = build_rows(cost_model, shapes)
    knee = cost_model.knee_batch_size(context, MAX_KNEE_BATCH)
    if decode:
        mark_knee(rows, knee)
    result = {
        "model": model.name,
        "hardware": hardware.name,
        "tp": tp,
        "dtype": dtype,
        "kv_dtype": cost_model.kv_dtype,
        "compute_dtype": cost_model.compute_dtype,
        "ideal": bool(args.ideal),
        "context_len": context,
        "ridge_point": cost_model.ridge_point,
        "ridge_point_datasheet": hardware.ridge_point(cost_model.compute_dtype),
        "knee_batch_size": knee,
        "rows": rows,
    }
    out = sys.stdout
    if fmt == "json":
        json.dump(result, out, indent=2)
        out.write("\n")
    elif fmt == "csv":
        _write_csv(rows, knee, out)
    else:
        _write_table(result, decode, out)
    return 0


# --------------------------------------------------------------------------- output


_CSV_SCALARS = (
    "batch_size",
    "context_len",
    "num_tokens",
    "time_ms",
    "tokens_per_s",
    "flops",
    "bytes",
    "weight_bytes",
    "kv_bytes",
    "intensity",
    "bound",
)


def _csv_cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _write_csv(rows: list[dict[str, Any]], knee: int | None, out: TextIO) -> None:
    """Every column of the table, plus the knee batch size of the header on every row."""
    from batchsim.cost import OP_NAMES

    writer = csv.writer(out, lineterminator="\n")
    ops = [f"{name}_ms" for name in OP_NAMES]
    writer.writerow([*_CSV_SCALARS, *ops, "knee", "knee_batch_size"])
    for row in rows:
        writer.writerow(
            [_csv_cell(row[k]) for k in _CSV_SCALARS]
            + [_csv_cell(row["ops"][name]) for name in OP_NAMES]
            + [_csv_cell(row["knee"]), _csv_cell(knee)]
        )


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _write_table(result: dict[str, Any], decode: bool, out: TextIO) -> None:
    from batchsim.cost import OP_NAMES

    rows = result["rows"]
    knee = result["knee_batch_size"]
    mode = "ideal datasheet roofline" if result["ideal"] else "calibrated roofline"
    print(
        f"{result['model']} on {result['hardware']}  tp={result['tp']}  dtype={result['dtype']} "
        f"(compute {result['compute_dtype']})  kv={result['kv_dtype']}  [{mode}]",
        file=out,
    )
    what = (
        f"decode: B requests x {result['context_len']} cached tokens"
        if decode
        else f"prefill: one chunk of N tokens after {result['context_len']} cached tokens"
    )
    knee_text = (
        f"decode turns compute-bound at B = {knee}"
        if knee is not None
        else f"decode stays memory-bound up to B = {MAX_KNEE_BATCH}"
    )
    ridge = f"ridge point {result['ridge_point']:.0f} FLOP/B"
    if result["ideal"]:
        ridge += " (datasheet)"
    else:  # the profile's efficiencies move it from the one `batchsim list hardware` shows
        ridge += (
            f" (achievable peak / achievable bandwidth; datasheet "
            f"{result['ridge_point_datasheet']:.0f})"
        )
    print(
        f"{what}; {ridge}; knee at context {result['context_len']}: {knee_text}",
        file=out,
    )
    head = [
        "batch",
        "context",
        "tokens",
        "time ms",
        "tok/s",
        "FLOPs",
        "bytes",
        "weight bytes",
        "KV bytes",
        "FLOP/B",
        "bound",
        *OP_NAMES,
        "",
    ]
    cells = []
    for row in rows:
        mark = ""
        if row["knee"]:
            mark = "<- knee" if row["batch_size"] == knee else f"<- knee at B = {knee}"
        cells.append(
            [
                str(row["batch_size"]),
                str(row["context_len"]),
                str(row["num_tokens"]),
                f"{row['time_ms']:.3f}",
                f"{row['tokens_per_s']:,.0f}",
                _si(row["flops"], "FLOP"),
                _si(row["bytes"], "B"),
                _si(row["weight_bytes"], "B"),
                _si(row["kv_bytes"], "B"),
                f"{row['intensity']:.1f}",
                row["bound"],
            ]
            + [f"{row['ops'][name]:.3f}" for name in OP_NAMES]
            + [mark]
        )
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("op columns: time in ms per operator group", file=out)
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)).rstrip(), file=out)
    for c in cells:
        print(
            "  ".join(
                v.rjust(w) if i < len(c) - 1 else v for i, (v, w) in enumerate(zip(c, widths))
            ).rstrip(),
            file=out,
        )
