"""``batchsim kernel``: one kernel's predicted time on a hardware profile.

Owns the command's options (:func:`add_kernel`, light) and its run, which calls
:func:`batchsim.cost.kernels.kernel` — the same pricing a simulation uses — and prints the
time and the bound (``--json``: one object ``{"time_us": ..., "bound": ..., "flops": ...,
"bytes": ...}``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

DESCRIPTION = (
    "Predict one kernel's time on a hardware profile with batchsim's cost model (the same "
    "pricing a simulation uses, measured GEMM corrections included), to check a profile "
    "against your own kernel measurements. Prints the time in microseconds and the bound."
)
EPILOG = (
    "Examples: batchsim kernel --hardware h100-sxm gemm --m 128 --n 4096 --k 4096 --dtype fp8; "
    "batchsim kernel --hardware h200 attention --phase generation --batch 64 --kv-len 2048 "
    "--heads 32 --kv-heads 8 --head-dim 128; batchsim kernel --hardware h100-sxm moe --tokens 256 "
    "--hidden 7168 --inter 2048 --top-k 8 --experts 256 --tp 8 --dtype fp8_block; "
    "batchsim kernel --hardware b200 allreduce "
    "--size-bytes 1048576 --gpus 8 --json"
)


def _whole(text: str) -> int:
    from batchsim.cli.args import positive_int

    return positive_int(text)


def _whole0(text: str) -> int:
    from batchsim.errors import ConfigError

    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"expected a whole number >= 0, got {text!r}")
    return value


def add_kernel(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``kernel`` command and its kinds to ``sub``."""
    p = sub.add_parser(
        "kernel",
        help="predict one kernel's time (GEMM, attention, MoE, all-reduce) on a GPU profile",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    p.add_argument(
        "--hardware", required=True, metavar="H", help="built-in profile name or profile YAML"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    g = kinds.add_parser("gemm", help="one m x k @ k x n GEMM of weights in --dtype")
    g.add_argument("--m", type=_whole, required=True, help="rows (tokens)")
    g.add_argument("--n", type=_whole, required=True, help="output features")
    g.add_argument("--k", type=_whole, required=True, help="input features")
    g.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp8", "fp8_block", "nvfp4"),
        default="bf16",
        help="weights (and activations for fp8 and, on FP4 tensor cores, nvfp4): fp8 "
        "per-tensor or fp8_block block scales, nvfp4 16-value blocks",
    )
    a = kinds.add_parser("attention", help="one layer's attention kernel on one GPU")
    a.add_argument("--phase", choices=("context", "generation"), required=True)
    a.add_argument("--batch", type=_whole, required=True, help="sequences")
    a.add_argument("--q-len", type=_whole, help="new tokens per sequence (context; generation: 1)")
    a.add_argument(
        "--kv-len", type=_whole0, required=True, help="cached tokens per sequence before them"
    )
    a.add_argument("--heads", type=_whole, required=True, help="query heads on the GPU")
    a.add_argument("--kv-heads", type=_whole, required=True, help="KV heads on the GPU")
    a.add_argument("--head-dim", type=_whole, required=True)
    a.add_argument("--kv-dtype", choices=("bf16", "fp16", "fp8"), default="bf16")
    e = kinds.add_parser("moe", help="the routed experts' GEMMs of one MoE layer")
    e.add_argument("--tokens", type=_whole, required=True, help="tokens routed")
    e.add_argument("--hidden", type=_whole, required=True, help="hidden size")
    e.add_argument("--inter", type=_whole, required=True, help="one expert's intermediate size")
    e.add_argument("--top-k", type=_whole, required=True, help="experts per token")
    e.add_argument("--experts", type=_whole, required=True, help="routed experts")
    e.add_argument("--tp", type=_whole, default=1, help="tensor parallelism of the experts")
    e.add_argument("--dtype", choices=("bf16", "fp16", "fp8", "fp8_block", "nvfp4"), default="bf16")
    r = kinds.add_parser("allreduce", help="one ring all-reduce")
    r.add_argument("--size-bytes", type=_whole, required=True, help="message size, bytes")
    r.add_argument("--gpus", type=_whole, required=True, help="GPUs in the ring")
    p.set_defaults(func=_cmd_kernel)


def _cmd_kernel(args: argparse.Namespace) -> int:
    from batchsim.catalog.hardware_files import load_hardware
    from batchsim.cost.kernels import kernel

    hw = load_hardware(args.hardware, "--hardware")
    if args.kind == "gemm":
        shape: dict[str, Any] = {"m": args.m, "n": args.n, "k": args.k, "dtype": args.dtype}
    elif args.kind == "attention":
        shape = {
            "phase": args.phase,
            "batch": args.batch,
            "q_len": args.q_len,
            "kv_len": args.kv_len,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "head_dim": args.head_dim,
            "kv_dtype": args.kv_dtype,
        }
    elif args.kind == "moe":
        shape = {
            "tokens": args.tokens,
            "hidden": args.hidden,
            "inter": args.inter,
            "top_k": args.top_k,
            "experts": args.experts,
            "tp": args.tp,
            "dtype": args.dtype,
        }
    else:
        shape = {"size_bytes": args.size_bytes, "gpus": args.gpus}
    estimate = kernel(hw, args.kind, **shape)
    if args.json:
        print(json.dumps(estimate.to_dict()))
    else:
        print(f"{estimate.time_us:.4g} us  {estimate.bound}-bound  ({hw.name}, {args.kind})")
    return 0
