"""End-to-end validation: batchsim against NVIDIA AIConfigurator's Hopper and Blackwell runs.

    python benchmarks/validate_silicon.py                  # skipped rows, then the error table
    python benchmarks/validate_silicon.py --jobs 2 --csv F # two processes; per-row CSV in F
    python benchmarks/validate_silicon.py --gpu h100_sxm --framework vllm --limit 20 --rows
    python benchmarks/validate_silicon.py --list-skipped   # every row left out, with its reason

The rows are ``benchmarks/data/silicon_rows.csv``: the end-to-end measurements AIConfigurator
publishes (``silicon_sample.csv``, Apache-2.0; what was kept: ``benchmarks/data/README.md``).
Each is one deployment of vLLM, SGLang or TensorRT-LLM (the container images of Dynamo or of the
engine, version in the row) measured with aiperf: ``concurrency`` = N streaming clients, each
sending its next request as soon as the previous one finished, fixed input and output lengths
(``isl``, ``osl``, EOS ignored), 20 N requests after 2 N warm-up requests (AIConfigurator's
``bench_run.sh.j2``: ``--concurrency N --num-requests 20N --warmup-request-count 2N
--streaming``). The measured numbers are the means over requests of aiperf's
``time_to_first_token`` (send to first streamed token, at the client) and
``inter_token_latency`` = (request latency - TTFT) / (output tokens - 1), which is batchsim's
per-request TPOT: errors are batchsim's ``mean_ttft_ms`` / ``mean_tpot_ms`` over the same
requests divided by the measured ones, minus 1.

How a row maps onto an experiment (:func:`experiment`):
  * model (:data:`MODELS`; DeepSeek-R1 has DeepSeek-V3's architecture), GPU (:data:`GPUS`),
    serving-engine preset (:data:`FRAMEWORKS`: vllm-v1, sglang, tensorrt-llm);
  * weights: ``gemm_quant_mode`` fp8 or fp8_block -> ``engine.dtype: fp8``, none -> bf16
    (the checkpoint's; int4_wo would be batchsim's weight-only int4). The KV cache is bf16 (the
    engines' ``auto``: the activation dtype) except for checkpoints that quantize it
    (:data:`FP8_KV_CHECKPOINTS`); the rows do not say which one ran;
  * ``parallel.tensor_parallel_size = tp_size``, ``pipeline_parallel_size = pp_size``. A MoE
    layer is split as its attention (batchsim has no expert parallelism);
  * a closed loop: ``workload.concurrency: N``, no think time, 20 N requests of exactly
    ``isl`` prompt and ``osl`` output tokens, all N clients starting together on an idle
    engine. That is aiperf's profiling phase: its warm-up phase (2 N requests) runs to the
    end before the profiling phase starts (aiperf's warm-up ``grace_period`` is infinite and
    a phase is not ``seamless`` unless configured, aiperf 0.13 ``timing/config.py``), so the
    measured requests begin as one burst of N prompts. The warm-up leaves nothing batchsim
    carries over (no prefix caching, random prompts), so it is not simulated.
    ``scheduler.max_num_seqs = N`` (the deployment's batch size). The presets' token budgets
    and scheduling are kept (SGLang's prefill first; the rows do not record engine flags such
    as SGLang's ``--enable-mixed-chunk`` or a token budget), except that a TensorRT-LLM budget
    (no chunked context) is raised to ``isl + N`` where 8,192 is less: with 8,192-token
    prompts it would admit a prompt only once every decode had finished, which the measured
    TTFTs rule out (AIConfigurator's generated TensorRT-LLM configs set
    ``max_num_tokens`` to N + isl + 500, rounded up to 32);
  * disaggregated rows (``mode: disagg``): ``cluster.disaggregation`` with
    ``prefill_num_workers`` instances of ``prefill_tp_size`` GPUs and ``decode_num_workers`` of
    ``decode_tp_size`` (decode ``max_num_seqs = decode_batch_size``), KV over NVLink 4 when
    both pools fit in 8 GPUs, else InfiniBand NDR.

Rows left out (counted by reason; ``--list-skipped`` prints each): attention data parallelism
or expert parallelism (``attention_dp_size`` or ``moe_ep_size`` > 1, also in either pool), a
MoE whose ``moe_tp_size`` differs from ``tp_size``, disaggregated rows without worker counts
or number of clients, a weight precision batchsim lacks, and setups batchsim refuses (weights
that do not fit). The rows the data file does not hold (models not in the catalog) are
printed with their counts
(:data:`LEFT_OUT`).

Held out: the H200 and GB200 rows (their profiles are datasheets plus their family's terms,
H100's and B200's) are reported on their own lines and in no overall line; nothing here is
fitted to any row.

Requests per row: aiperf's 20 N. The first burst of N prompts waits for a whole wave of
prefills, and how fast later rounds spread out depends on the engine's scheduler (a
prefill-first one, SGLang's, keeps the clients in step; vLLM's mixed chunks spread them), so
every round is simulated: batchsim takes 0.01-1 s a row (up to 30 s for gpt-oss-120b with
512 clients: a sliding-window model's batches are built request by request), the whole file
about two and a half minutes with ``--jobs 2`` on a 2-core machine.
Deterministic: ``seed: 0``, and the same results with any ``--jobs``.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchsim.config import validate_experiment
from batchsim.errors import ConfigError
from batchsim.simulation import simulate

DATA = Path(__file__).resolve().parent / "data" / "silicon_rows.csv"
SOURCE = (
    "https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/"
    "aic-core/src/aiconfigurator_core/systems/silicon_sample.csv"
)

MODELS = {
    "Qwen/Qwen3-32B": "qwen3-32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
}
"""AIConfigurator's ``model_path`` -> batchsim's catalog name (``batchsim list models``)."""

MOE_MODELS = frozenset({"qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"})

GPUS = {
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200",
    "gb300": "gb300",
}
"""AIConfigurator's ``system`` -> batchsim's hardware profile."""

FRAMEWORKS = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "tensorrt-llm"}
"""AIConfigurator's ``backend`` -> batchsim's serving-engine preset (``engine.framework``)."""

WEIGHT_DTYPES = {
    "": "bf16",
    "bf16": "bf16",
    "fp8": "fp8",
    "fp8_block": "fp8",
    "int4_wo": "int4",
    "nvfp4": "nvfp4",
}
"""``gemm_quant_mode`` / ``moe_quant_mode`` -> ``engine.dtype`` (empty: the bf16 checkpoint)."""

FP8_KV_CHECKPOINTS = frozenset({"nvidia/Llama-3.1-8B-Instruct-FP8"})
"""Checkpoints whose quantization config also quantizes the KV cache (ModelOpt FP8)."""

HELD_OUT = ("h200_sxm", "gb200")
"""GPUs whose rows are only reported, on their own lines."""

LEFT_OUT = {
    "no catalog model: MiniMaxAI/MiniMax-M2.5": 523,
    "no catalog model: Qwen/Qwen3.5-397B-A17B": 351,
    "no catalog model: moonshotai/Kimi-K2.5": 241,
    "no catalog model: zhipuai/GLM-5": 108,
}
"""Upstream rows the data file does not hold, by reason (``benchmarks/make_silicon_rows.py``
prints the same counts); with the file's 3,998 rows they make the upstream 5,221."""

TRTLLM_TOKENS = 8192
"""The tensorrt-llm preset's ``max_num_batched_tokens`` (TensorRT-LLM's max_num_tokens)."""

ROUNDS = 20
"""aiperf's ``--num-requests 20N`` (AIConfigurator's ``BENCH_MULTI_ROUND``); the warm-up's
``2N`` ran before and drained."""
SINGLE_NODE_GPUS = 8


class Unsupported(Exception):
    """A row batchsim cannot express: ``reason`` (counted) and ``detail`` (listed)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def load_rows(path: Path = DATA) -> list[dict[str, str]]:
    """The data file's rows, as strings (empty: not given)."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _int(row: dict[str, str], key: str, default: int | None = None) -> int | None:
    text = row.get(key, "").strip()
    return int(float(text)) if text else default


def _size(row: dict[str, str], key: str) -> int:
    """A parallel size; empty or 0 (the gap-analysis rows' "not given") is 1."""
    return max(1, _int(row, key, 1) or 1)


def weight_dtype(row: dict[str, str]) -> str:
    """``engine.dtype`` for ``row``'s GEMM and MoE quantization (one dtype in batchsim)."""
    gemm, moe = row.get("gemm_quant_mode", ""), row.get("moe_quant_mode", "")
    dtypes = set()
    for mode in (gemm, moe):
        if mode not in WEIGHT_DTYPES:
            raise Unsupported(f"no such dtype in batchsim: {mode}")
        dtypes.add(WEIGHT_DTYPES[mode])
    if gemm and moe and len(dtypes) > 1:
        raise Unsupported(f"mixed weight dtypes: {gemm} / {moe}")
    return WEIGHT_DTYPES[gemm] if gemm else WEIGHT_DTYPES[moe]


def _check_layout(row: dict[str, str], prefix: str, model: str) -> int:
    """The pool's tensor parallelism, or :class:`Unsupported` for a layout batchsim lacks."""
    where = f" ({prefix.rstrip('_')})" if prefix else ""
    tp = _size(row, f"{prefix}tp_size")
    if _size(row, f"{prefix}attention_dp_size") > 1:
        raise Unsupported(f"attention data parallelism{where}")
    if _size(row, f"{prefix}moe_ep_size") > 1:
        raise Unsupported(f"expert parallelism{where}")
    if model in MOE_MODELS and _size(row, f"{prefix}moe_tp_size") != tp:
        raise Unsupported(f"MoE tensor parallelism differs from attention's{where}")
    return tp


def _scheduler(row: dict[str, str], batch: int) -> dict[str, Any]:
    """``scheduler:`` keys: the batch cap; for TensorRT-LLM (no chunked context), a token
    budget that holds a whole prompt beside ``batch`` decodes when the preset's does not."""
    keys: dict[str, Any] = {"max_num_seqs": batch}
    if row["backend"] == "trtllm":
        keys["max_num_batched_tokens"] = max(TRTLLM_TOKENS, int(row["isl"]) + batch)
    return keys


def experiment(row: dict[str, str]) -> dict[str, Any]:
    """The experiment mapping that reproduces ``row``'s deployment and benchmark.

    Raises:
        Unsupported: The row's setup has no batchsim counterpart.
    """
    system, path = row["system"], row["model_path"]
    if system not in GPUS:
        raise Unsupported(f"no GPU profile: {system}")
    if path not in MODELS:
        raise Unsupported(f"no catalog model: {path}")
    model = MODELS[path]
    dtype = weight_dtype(row)
    clients = _int(row, "concurrency")
    if clients is None or clients < 1:
        raise Unsupported("number of clients not given")
    engine = {
        "framework": FRAMEWORKS[row["backend"]],
        "dtype": dtype,
        "kv_cache_dtype": "fp8" if path in FP8_KV_CHECKPOINTS else "bf16",
    }
    config: dict[str, Any] = {
        "name": f"silicon-{row.get('row', '')}",
        "seed": 0,
        "hardware": GPUS[system],
        "model": model,
        "engine": engine,
        "workload": {
            "num_requests": ROUNDS * clients,
            "concurrency": clients,
            "prompt_tokens": {"dist": "fixed", "value": int(row["isl"])},
            "output_tokens": {"dist": "fixed", "value": int(row["osl"])},
        },
    }
    if row["mode"] == "agg":
        tp = _check_layout(row, "", model)
        config["parallel"] = {
            "tensor_parallel_size": tp,
            "pipeline_parallel_size": _size(row, "pp_size"),
        }
        config["scheduler"] = _scheduler(row, clients)
        return config
    prefill_workers = _int(row, "prefill_num_workers")
    decode_workers = _int(row, "decode_num_workers")
    if not prefill_workers or not decode_workers:
        raise Unsupported("disaggregated: worker counts not given")
    prefill_tp = _check_layout(row, "prefill_", model)
    decode_tp = _check_layout(row, "decode_", model)
    gpus = prefill_workers * prefill_tp + decode_workers * decode_tp
    decode_batch = _int(row, "decode_batch_size") or clients
    config["parallel"] = {"tensor_parallel_size": prefill_tp}
    config["cluster"] = {
        "router": "least_outstanding",
        "disaggregation": {
            "prefill": {"replicas": prefill_workers},
            "decode": {
                "replicas": decode_workers,
                "parallel": {"tensor_parallel_size": decode_tp},
                "scheduler": {"max_num_seqs": decode_batch},
            },
            "kv_transfer": {
                "link": "nvlink-4" if gpus <= SINGLE_NODE_GPUS else "infiniband-ndr-400"
            },
        },
    }
    config["scheduler"] = _scheduler(row, max(clients, decode_batch))
    return config


@dataclass(frozen=True)
class Prediction:
    """batchsim's means over the measured requests of one row."""

    ttft_ms: float
    tpot_ms: float
    wall_s: float


def predict(row: dict[str, str]) -> Prediction:
    """Simulate ``row`` (aiperf's profiling phase) and average TTFT and TPOT over its requests.

    Raises:
        Unsupported: The row cannot be expressed, or batchsim refuses the experiment (its
            message is the detail), or not every request finished.
    """
    config = experiment(row)
    start = time.perf_counter()
    try:
        result = simulate(validate_experiment(config))
    except ConfigError as exc:
        message = str(exc)
        raise Unsupported(f"batchsim refuses: {message.split(':')[0]}", message) from None
    measured = result.requests
    finished = measured[measured["status"] == "finished"]
    if len(finished) != len(measured):
        raise Unsupported(
            "not every request finished in batchsim",
            f"{len(finished)} of {len(measured)} finished",
        )
    return Prediction(
        float(np.mean(finished["ttft_ms"])),
        float(np.mean(finished["tpot_ms"])),
        time.perf_counter() - start,
    )


def _outcome(row: dict[str, str]) -> Prediction | Unsupported:
    try:
        return predict(row)
    except Unsupported as exc:
        return exc


def error(predicted: float, measured: float) -> float:
    """Signed relative error: predicted / measured - 1."""
    return predicted / measured - 1.0


@dataclass(frozen=True)
class ErrorStats:
    """Error statistics of one metric over a group of rows (fractions, not %)."""

    rows: int
    median_signed: float
    mean_signed: float
    median_abs: float
    mean_abs: float
    within_10: float
    within_20: float


def error_stats(errors: Sequence[float]) -> ErrorStats:
    """:class:`ErrorStats` of signed relative errors (NaN everywhere for no rows)."""
    values = np.asarray(errors, dtype=float)
    if values.size == 0:
        nan = math.nan
        return ErrorStats(0, nan, nan, nan, nan, nan, nan)
    magnitude = np.abs(values)
    return ErrorStats(
        rows=int(values.size),
        median_signed=float(np.median(values)),
        mean_signed=float(np.mean(values)),
        median_abs=float(np.median(magnitude)),
        mean_abs=float(np.mean(magnitude)),
        within_10=float(np.mean(magnitude <= 0.10)),
        within_20=float(np.mean(magnitude <= 0.20)),
    )


@dataclass(frozen=True)
class Result:
    """One simulated row: the measurement, the prediction and the errors."""

    row: dict[str, str]
    prediction: Prediction

    @property
    def ttft_error(self) -> float:
        return error(self.prediction.ttft_ms, float(self.row["silicon_ttft_ms"]))

    @property
    def tpot_error(self) -> float:
        return error(self.prediction.tpot_ms, float(self.row["silicon_tpot_ms"]))


def groups(results: Iterable[Result]) -> dict[str, list[Result]]:
    """The table's lines: GPU x framework x mode, then each GPU, then the overall line of the
    GPUs not held out; held-out GPUs only ever in their own lines."""
    results = list(results)
    lines: dict[str, list[Result]] = {}
    for r in sorted(
        results, key=lambda r: (r.row["system"] in HELD_OUT, r.row["system"], r.row["backend"])
    ):
        key = f"{r.row['system']} {r.row['backend']} {r.row['mode']}"
        lines.setdefault(key, []).append(r)
    for system in sorted({r.row["system"] for r in results}, key=lambda s: (s in HELD_OUT, s)):
        tag = " (held out)" if system in HELD_OUT else ""
        lines[f"{system} all{tag}"] = [r for r in results if r.row["system"] == system]
    lines["overall (not held out)"] = [r for r in results if r.row["system"] not in HELD_OUT]
    return lines


def _pct(value: float, signed: bool = False) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:+.0%}" if signed else f"{value:.0%}"


def format_table(results: Iterable[Result]) -> str:
    """The error table: per line the row count, then for TTFT and for TPOT the median and mean
    signed error, the median and mean absolute error, and the shares within 10 % and 20 %."""
    metrics = "med  mean |med| |mean| <10% <20%"
    header = f"{'GPU framework mode':<32} {'rows':>5} | TTFT {metrics} | TPOT {metrics}"
    out = [header, "-" * len(header)]
    for name, members in groups(results).items():
        cells = [f"{name:<32} {len(members):>5}"]
        for metric in ("ttft", "tpot"):
            s = error_stats([getattr(r, f"{metric}_error") for r in members])
            cells.append(
                f"     {_pct(s.median_signed, True):>4} {_pct(s.mean_signed, True):>5} "
                f"{_pct(s.median_abs):>5} {_pct(s.mean_abs):>6} {_pct(s.within_10):>4} "
                f"{_pct(s.within_20):>4}"
            )
        out.append(" |".join(cells))
    return "\n".join(out)


def select(
    rows: list[dict[str, str]], gpu: str | None, framework: str | None, limit: int | None
) -> list[dict[str, str]]:
    """The rows of ``gpu`` (a ``system``) and ``framework`` (a ``backend``), the first
    ``limit`` of them."""
    chosen = [
        r
        for r in rows
        if (gpu is None or r["system"] == gpu) and (framework is None or r["backend"] == framework)
    ]
    return chosen[:limit] if limit is not None else chosen


def run_rows(rows: list[dict[str, str]], jobs: int) -> list[Prediction | Unsupported]:
    """Each row's prediction or reason, in order (``jobs`` processes)."""
    if jobs <= 1 or len(rows) <= 1:
        return [_outcome(r) for r in rows]
    with multiprocessing.Pool(jobs) as pool:
        return list(pool.imap(_outcome, rows, chunksize=4))


def _setup(row: dict[str, str]) -> str:
    layout = f"tp{row['tp_size']}" if row["mode"] == "agg" else "disagg"
    return (
        f"{row['system']} {row['backend']} {row['model_path']} {row['gemm_quant_mode'] or 'bf16'}"
        f" {layout} N={row['concurrency']} {row['isl']}/{row['osl']}"
    )


def write_csv(path: str, results: list[Result]) -> None:
    """Per-row predictions and errors."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(
            [
                "row", "system", "backend", "backend_version", "image", "model_path", "mode",
                "gemm_quant_mode", "concurrency", "isl", "osl", "tp_size",
                "silicon_ttft_ms", "batchsim_ttft_ms", "ttft_error",
                "silicon_tpot_ms", "batchsim_tpot_ms", "tpot_error",
            ]
        )  # fmt: skip
        for r in results:
            row = r.row
            writer.writerow(
                [
                    row["row"], row["system"], row["backend"], row["backend_version"],
                    row["image"], row["model_path"], row["mode"], row["gemm_quant_mode"],
                    row["concurrency"], row["isl"], row["osl"], row["tp_size"],
                    row["silicon_ttft_ms"], f"{r.prediction.ttft_ms:.6g}", f"{r.ttft_error:.4f}",
                    row["silicon_tpot_ms"], f"{r.prediction.tpot_ms:.6g}", f"{r.tpot_error:.4f}",
                ]
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", choices=sorted(GPUS))
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), help="the row's backend")
    parser.add_argument("--limit", type=int, help="only the first N selected rows")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--csv", help="write the per-row predictions to this CSV file")
    parser.add_argument("--rows", action="store_true", help="print each simulated row")
    parser.add_argument(
        "--list-skipped", action="store_true", help="print every row left out and why"
    )
    args = parser.parse_args(argv)
    rows = select(load_rows(), args.gpu, args.framework, args.limit)
    start = time.perf_counter()
    outcomes = run_rows(rows, args.jobs)
    elapsed = time.perf_counter() - start
    results = [
        Result(r, o) for r, o in zip(rows, outcomes, strict=True) if isinstance(o, Prediction)
    ]
    skipped = [(r, o) for r, o in zip(rows, outcomes, strict=True) if isinstance(o, Unsupported)]
    print(f"{SOURCE}\n{len(rows)} rows of {DATA.name} selected: {len(results)} simulated, "
          f"{len(skipped)} left out ({elapsed:.1f} s, {args.jobs} job(s))")  # fmt: skip
    if args.list_skipped:
        for row, why in skipped:
            detail = f" ({why.detail})" if why.detail else ""
            print(f"  row {row['row']:>5}  {_setup(row)}: {why.reason}{detail}")
    print("\nleft out, by reason:")
    for reason, count in Counter(why.reason for _, why in skipped).most_common():
        print(f"  {count:>5}  {reason}")
    if args.gpu is None and args.framework is None and args.limit is None:
        print("not in the data file (benchmarks/data/README.md):")
        for reason, count in LEFT_OUT.items():
            print(f"  {count:>5}  {reason}")
    if args.rows:
        print(f"\n{'row':>5}  {'setup':<76} {'TTFT ms':>15} {'err':>6} {'TPOT ms':>13} {'err':>6}")
        for r in results:
            print(
                f"{r.row['row']:>5}  {_setup(r.row):<76} "
                f"{float(r.row['silicon_ttft_ms']):>7.0f}/{r.prediction.ttft_ms:<7.0f} "
                f"{r.ttft_error:>+6.0%} "
                f"{float(r.row['silicon_tpot_ms']):>6.1f}/{r.prediction.tpot_ms:<6.1f} "
                f"{r.tpot_error:>+6.0%}"
            )
    print("\nerror = batchsim / measured - 1 (med/mean: signed; |med|/|mean|: absolute; "
          "<10%/<20%: share of rows)")  # fmt: skip
    print(format_table(results))
    if args.csv:
        write_csv(args.csv, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
