"""End-to-end validation: batchsim against published results of serving engines.

    python benchmarks/validate_published.py            # the table, then per-source errors
    python benchmarks/validate_published.py --csv F    # also write the rows to F
    python benchmarks/validate_published.py --fit-lmdeploy-cpu   # redo the lmdeploy CPU fit

Each row below is one published number with its source and its exact setup (model, GPU,
tensor parallelism, weight/KV precision, batch, input/output lengths, the metric), read from
the source's own text. Each is simulated with the matching serving-engine preset
(``engine.framework``) and compared: error = simulated / published - 1. The summary prints
the median and p90 of the absolute error per source and over all rows.

How a setup maps onto an experiment:
  * TensorRT-LLM v0.6.1 ``performance.md`` (gptSessionBenchmark, a static batch): ``batch``
    requests of fixed lengths arriving together, ``policy: static`` with ``max_num_seqs =
    batch``; "throughput" is generated tokens / time of the whole batch (per GPU on H100),
    "1st token latency" a batch of one with one output token (its TTFT). The published batch
    ran as one batch, so the KV cache is sized to hold it (``engine.num_gpu_blocks``): memory
    limits are the engine's, not what is validated here; for the same reason admission keeps
    no watermark of free blocks (``engine.watermark: 0``), else the last requests of the batch
    would run as a second batch. H100 rows are FP8 weights and FP8 KV
    cache (``--enable_fp8 --fp8_kv_cache``), A100 rows FP16. The source's build commands do not
    pass ``--use_custom_all_reduce`` (opt-in then), so its TP 4 rows use NCCL's all-reduce.
  * vLLM PR #2192 (``benchmarks/benchmark_latency.py``, vLLM 0.2.7, V0): ``batch`` prompts of
    256 tokens generating 256 tokens each, submitted together; the reported latency is the time
    until the whole batch finished (the run's duration). V0 without chunked prefill packs
    prompts up to ``max_num_batched_tokens = max(max_model_len, 2048)`` = 4096 for Llama-2.
    "before" used NCCL (the A100 profile's fitted 31 us), "after" the custom all-reduce (the
    preset's). vLLM 0.2.7 drove its tensor-parallel workers through Ray, which the vllm-v0
    preset (a single-process V0 engine) does not charge: these rows set the CPU time per
    iteration measured for this very setup (Llama-2-70B, TP 4, A100, a vLLM-derived engine with
    Ray workers) in Vidur's ``a100_cpu_overheads.csv`` (MIT): schedule + sampler +
    prepare_inputs + process_model_outputs, medians fitted linear in the batch (1.39 ms +
    0.043 ms per request), plus ``ray_comm_time`` 6.77 ms (median of its 13 batch sizes).
  * LMDeploy v0.1.0a1 ``a100_fp16.md`` (``benchmark/profile_generation.py``): ``batch``
    threads each send 6 requests of fixed lengths one after another; throughput is all
    generated tokens over the elapsed time. A closed loop of ``batch`` users with no think
    time; the KV cache is the source's (its scripts' ``cache_max_entry_count`` blocks of 128
    tokens); TurboMind v0.1 runs decodes and whole new prompts in one pass (continuous,
    mixed, a budget that never splits a prompt). Rows whose users did not all fit in that
    cache are left out (TurboMind's own eviction then decided the order). The Llama-2-7B rows
    fit the ``lmdeploy`` preset's CPU time (``--fit-lmdeploy-cpu``); the summary also prints
    the error without them.

Every row of these sources whose setup is pinned down and whose model and GPU batchsim has is
here. Left out: the A100 table's TP > 1 rows (per-GPU or total throughput unclear: its header
says "out tok/s", the H100 one "per GPU"), GPT-J 6B and Falcon 180B (no such catalog model),
and vLLM #2192's LLaMA 33B and A30/T4 rows (no such model or GPU profile).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from batchsim.config import validate_experiment
from batchsim.simulation import simulate

TRTLLM_061 = (
    "https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c47297d8c06bafac73/"
    "docs/source/performance.md"
)
VLLM_2192 = "https://github.com/vllm-project/vllm/pull/2192"
LMDEPLOY_010 = (
    "https://github.com/InternLM/lmdeploy/blob/ebe90bc943eeace841b33fa54fbf1726311b63db/"
    "docs/en/benchmark/a100_fp16.md"
)


@dataclass(frozen=True)
class Published:
    """One published end-to-end number and the setup that produced it."""

    source: str
    """Short name of the source (rows are summarised per source)."""
    url: str
    framework: str
    model: str
    hardware: str
    tp: int
    dtype: str
    kv_dtype: str
    batch: int
    input_len: int
    output_len: int
    metric: str
    """``throughput_per_gpu`` (generated tok/s per GPU), ``output_throughput`` (generated tok/s
    of the whole engine), ``ttft_ms`` or ``latency_s``."""
    value: float
    what: str
    """The row as the source labels it."""
    engine: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    rounds: int = 0
    """0: the ``batch`` requests arrive together (a static batch); else a closed loop of
    ``batch`` users, each sending ``rounds`` requests one after another."""


def _trt(
    hw: str, model: str, tp: int, batch: int, isl: int, osl: int, metric: str, value: float
) -> Published:
    fp8 = not hw.startswith("a100")  # the H100 and L40S tables are FP8
    gpu = {"h100-sxm": "H100 FP8", "l40s": "L40S FP8"}.get(hw, "A100 FP16")
    label = "LLaMA 7B" if model == "llama-2-7b" else "LLaMA 70B"
    kind = "peak throughput" if metric == "throughput_per_gpu" else "low latency"
    if metric != "throughput_per_gpu" or hw == "l40s":
        kind += " (v0.5 data)"
    return Published(
        source="TensorRT-LLM v0.6.1 performance.md",
        url=TRTLLM_061,
        framework="tensorrt-llm",
        model=model,
        hardware=hw,
        tp=tp,
        dtype="fp8" if fp8 else "fp16",
        kv_dtype="fp8" if fp8 else "fp16",
        batch=batch,
        input_len=isl,
        output_len=osl,
        metric=metric,
        value=value,
        what=f"{kind}, {gpu}, {label}, BS {batch}, TP {tp}, {isl}/{osl}",
        scheduler={"policy": "static", "padding": False},
        # the source's build commands (Llama2-70b: --tp_size 4) leave out
        # --use_custom_all_reduce, which was opt-in: its all-reduces are NCCL's (the profiles'
        # fitted 31 us), not the preset's custom kernel
        engine={"all_reduce_latency_us": 31.0} if tp > 1 else {},
    )


# CPU time per iteration of a TP-4 engine driven through Ray (Llama-2-70B on A100): Vidur's
# a100_cpu_overheads.csv medians, linear fit over batch 8..128, plus the Ray communication time
RAY_TP4_CPU_MS = 1.39 + 6.77
RAY_TP4_CPU_PER_SEQ_MS = 0.043


def _vllm(batch: int, value: float, custom: bool) -> Published:
    engine: dict[str, Any] = {
        "cpu_overhead_ms": RAY_TP4_CPU_MS,
        "cpu_overhead_per_seq_ms": RAY_TP4_CPU_PER_SEQ_MS,
    }
    if not custom:
        engine["all_reduce_latency_us"] = 31.0
    return Published(
        source="vLLM PR #2192 (custom all-reduce)",
        url=VLLM_2192,
        framework="vllm-v0",
        model="llama-2-70b",
        hardware="a100-80gb",
        tp=4,
        dtype="fp16",
        kv_dtype="auto",
        batch=batch,
        input_len=256,
        output_len=256,
        metric="latency_s",
        value=value,
        what=f"benchmark_latency, Llama 70B, A100-80G, TP 4, BS {batch}, 256/256, "
        + ("after (custom all-reduce)" if custom else "before (NCCL)"),
        engine=engine,
        scheduler={"policy": "continuous", "max_num_batched_tokens": 4096},
    )


# LMDeploy v0.1.0a1 on A100-80G, the source's config.ini edits (benchmark/benchmark_{7b,13b,70b}.sh
# of the same commit): KV blocks of 128 tokens (cache_block_seq_len), cache_max_entry_count
# blocks (> 1 is a count), max_context_token_num 4 x session_len (4,104) prompt tokens per pass
LMDEPLOY_BLOCK = 128
LMDEPLOY_PASS_TOKENS = 4 * 4104
LMDEPLOY_BLOCKS = {"llama-2-7b": 1000, "llama-2-13b": 500, "llama-2-70b": 4000}
LMDEPLOY_ROUNDS = 6  # profile_generation.py --test-round default, each user one after another


def lmdeploy_fits(model: str, batch: int, isl: int, osl: int) -> bool:
    """Whether the source's KV cache held all ``batch`` sequences at full length."""
    return batch * math.ceil((isl + osl) / LMDEPLOY_BLOCK) <= LMDEPLOY_BLOCKS[model]


def _lmdeploy(model: str, tp: int, batch: int, isl: int, osl: int, value: float) -> Published:
    label = model.replace("llama-2-", "llama2-")  # the source's model names
    return Published(
        source="LMDeploy v0.1.0a1 a100_fp16.md",
        url=LMDEPLOY_010,
        framework="lmdeploy",
        model=model,
        hardware="a100-80gb",
        tp=tp,
        dtype="fp16",
        kv_dtype="auto",
        batch=batch,
        input_len=isl,
        output_len=osl,
        metric="output_throughput",
        value=value,
        what=f"static inference, A100 FP16, {label}, concurrency {batch}, TP {tp}, {isl}/{osl}",
        engine={"block_size": LMDEPLOY_BLOCK, "num_gpu_blocks": LMDEPLOY_BLOCKS[model]},
        # TurboMind v0.1 runs the decodes and every new prompt (whole) in one pass
        scheduler={
            "policy": "continuous",
            "mix_prefill_decode": True,
            "max_num_batched_tokens": max(LMDEPLOY_PASS_TOKENS, batch * isl + batch),
        },
        rounds=LMDEPLOY_ROUNDS,
    )


# "Static Inference Benchmark" tables: every model ran profile_generation.py's grid, the
# concurrencies of the source's scripts times the default (prompt, output) token pairs
LMDEPLOY_CONCURRENCY = (1, 16, 32, 64)
LMDEPLOY_LENGTHS = ((1, 128), (128, 128), (128, 2048), (2048, 128), (2048, 2048))
# (model, TP) -> throughput (out tok/s of the engine), in grid order: concurrency, then lengths
LMDEPLOY_THROUGHPUT: dict[tuple[str, int], tuple[float, ...]] = {
    ("llama-2-7b", 1): (
        100.02, 102.21, 98.92, 86.1, 93.78,
        1504.72, 1272.47, 1010.62, 348.87, 601.63,
        2136.73, 2125.47, 1462.12, 450.43, 733.34,
        4154.81, 3024.07, 1852.06, 493.46, 755.65,
    ),
    ("llama-2-13b", 1): (
        57.49, 56.58, 55.29, 48.99, 52.12,
        869.45, 757.3, 605.88, 257.92, 366.67,
        1667.5, 1301.27, 860.14, 291.54, 389.64,
        3049.16, 2033.22, 998.86, 286.32, 387.86,
    ),
    ("llama-2-70b", 4): (
        33.94, 33.63, 32.38, 28.32, 31.9,
        468.52, 439.77, 482.99, 189.34, 399.42,
        906.03, 746.36, 853.56, 232.6, 636.23,
        1425.79, 1159.84, 1391.8, 270.47, 930.46,
    ),
}  # fmt: skip


def lmdeploy_table() -> list[tuple[str, int, int, int, int, float]]:
    """Every row of the source's tables: (model, TP, concurrency, prompt, output, tok/s)."""
    grid = [(b, isl, osl) for b in LMDEPLOY_CONCURRENCY for isl, osl in LMDEPLOY_LENGTHS]
    return [
        (model, tp, *setup, value)
        for (model, tp), values in LMDEPLOY_THROUGHPUT.items()
        for setup, value in zip(grid, values, strict=True)
    ]


ROWS: list[Published] = [
    # TensorRT-LLM v0.6.1, "Peak Throughput", H100 GPUs (FP8), out tok/s/GPU
    _trt("h100-sxm", "llama-2-7b", 1, 768, 128, 128, "throughput_per_gpu", 19694),
    _trt("h100-sxm", "llama-2-7b", 1, 112, 128, 2048, "throughput_per_gpu", 6818),
    _trt("h100-sxm", "llama-2-7b", 1, 80, 2048, 128, "throughput_per_gpu", 2244),
    _trt("h100-sxm", "llama-2-7b", 1, 48, 2048, 2048, "throughput_per_gpu", 2740),
    _trt("h100-sxm", "llama-2-70b", 2, 1024, 128, 128, "throughput_per_gpu", 2657),
    _trt("h100-sxm", "llama-2-70b", 4, 480, 128, 2048, "throughput_per_gpu", 1486),
    _trt("h100-sxm", "llama-2-70b", 2, 96, 2048, 128, "throughput_per_gpu", 306),
    _trt("h100-sxm", "llama-2-70b", 2, 64, 2048, 2048, "throughput_per_gpu", 547),
    # "Peak Throughput", L40S GPUs (FP8), v0.5 data, out tok/s (TP 1: per GPU = total)
    _trt("l40s", "llama-2-7b", 1, 64, 128, 128, "throughput_per_gpu", 3240),
    _trt("l40s", "llama-2-7b", 1, 64, 128, 2048, "throughput_per_gpu", 1622),
    _trt("l40s", "llama-2-7b", 1, 32, 2048, 128, "throughput_per_gpu", 581),
    _trt("l40s", "llama-2-7b", 1, 16, 2048, 2048, "throughput_per_gpu", 531),
    # "Peak Throughput", A100 GPUs (FP16), out tok/s (TP 1 rows only: per GPU = total)
    _trt("a100-80gb", "llama-2-7b", 1, 384, 128, 128, "throughput_per_gpu", 5586),
    _trt("a100-80gb", "llama-2-7b", 1, 60, 128, 2048, "throughput_per_gpu", 1928),
    _trt("a100-80gb", "llama-2-7b", 1, 52, 2048, 128, "throughput_per_gpu", 591),
    # "Low Latency" (v0.5 data), batch size 1, 1st token latency (ms)
    _trt("h100-sxm", "llama-2-7b", 1, 1, 128, 1, "ttft_ms", 7),
    _trt("h100-sxm", "llama-2-7b", 1, 1, 2048, 1, "ttft_ms", 36),
    _trt("h100-sxm", "llama-2-70b", 4, 1, 128, 1, "ttft_ms", 26),
    _trt("h100-sxm", "llama-2-70b", 4, 1, 2048, 1, "ttft_ms", 109),
    _trt("l40s", "llama-2-7b", 1, 1, 128, 1, "ttft_ms", 14),
    _trt("l40s", "llama-2-7b", 1, 1, 2048, 1, "ttft_ms", 73),
    _trt("a100-80gb", "llama-2-7b", 1, 1, 128, 1, "ttft_ms", 16),
    _trt("a100-80gb", "llama-2-7b", 1, 1, 2048, 1, "ttft_ms", 133),
    _trt("a100-80gb", "llama-2-70b", 4, 1, 128, 1, "ttft_ms", 47),
    _trt("a100-80gb", "llama-2-70b", 4, 1, 2048, 1, "ttft_ms", 377),
    # vLLM PR #2192, "Latency and memory" table (benchmark_latency, 5 iterations)
    _vllm(64, 16.37, custom=False),
    _vllm(64, 14.57, custom=True),
    # LMDeploy v0.1.0a1 "Static Inference Benchmark": every row whose batch the KV cache held
    *(
        _lmdeploy(model, tp, batch, isl, osl, value)
        for model, tp, batch, isl, osl, value in lmdeploy_table()
        if lmdeploy_fits(model, batch, isl, osl)
    ),
]


def experiment(row: Published) -> dict[str, Any]:
    """The experiment mapping that reproduces ``row``'s setup."""
    engine: dict[str, Any] = {
        "framework": row.framework,
        "dtype": row.dtype,
        "kv_cache_dtype": row.kv_dtype,
        **row.engine,
    }
    if row.scheduler.get("policy") == "static":
        block = 64  # the preset's block size (TensorRT-LLM tokens_per_block)
        per_seq = math.ceil((row.input_len + row.output_len) / block)
        engine["num_gpu_blocks"] = row.batch * per_seq
        engine["watermark"] = 0.0
    return {
        "name": "validate",
        "seed": 0,
        "hardware": row.hardware,
        "model": row.model,
        "parallel": {"tensor_parallel_size": row.tp},
        "engine": engine,
        "scheduler": {"max_num_seqs": row.batch, **row.scheduler},
        "workload": {
            **(
                {"num_requests": row.batch * row.rounds, "concurrency": row.batch}
                if row.rounds
                else {"num_requests": row.batch, "arrival": {"process": "all_at_once"}}
            ),
            "prompt_tokens": {"dist": "fixed", "value": row.input_len},
            "output_tokens": {"dist": "fixed", "value": row.output_len},
        },
    }


def simulated(row: Published) -> float:
    """``row``'s metric as batchsim predicts it."""
    summary = simulate(validate_experiment(experiment(row))).summary
    expected = row.batch * max(1, row.rounds)
    if summary["completed"] != expected:
        raise RuntimeError(f"{row.what}: only {summary['completed']} of {expected} finished")
    if row.metric == "throughput_per_gpu":
        return float(summary["output_throughput"]) / row.tp
    if row.metric == "output_throughput":
        return float(summary["output_throughput"])
    if row.metric == "ttft_ms":
        return float(summary["mean_ttft_ms"])
    if row.metric == "latency_s":
        return float(summary["duration"])
    raise ValueError(row.metric)


FIT_MODEL = "llama-2-7b"
"""The LMDeploy rows of this model fit the ``lmdeploy`` preset's CPU time; the others check it."""


def used_for_fit(row: Published) -> bool:
    """Whether ``row`` was used to fit a term of its preset (see :func:`fit_lmdeploy_cpu`)."""
    return row.framework == "lmdeploy" and row.model == FIT_MODEL


def _log_errors(rows: list[Published], engine: dict[str, Any]) -> np.ndarray:
    """log(simulated / published) of ``rows`` with ``engine`` keys on top of each row's."""
    return np.array(
        [
            math.log(simulated(replace(row, engine={**row.engine, **engine})) / row.value)
            for row in rows
        ]
    )


def fit_lmdeploy_cpu() -> tuple[float, float]:
    """Fit the ``lmdeploy`` preset's CPU time per iteration (``cpu_overhead_ms`` +
    ``cpu_overhead_per_seq_ms`` x batch) to the LMDeploy rows of :data:`FIT_MODEL`: least
    squares of log(simulated / published), on a grid of 0.05 ms x 0.0025 ms/request. Prints
    the fit and the error of the other models' rows, which it did not see."""
    rows = [r for r in ROWS if r.framework == "lmdeploy"]
    train = [r for r in rows if used_for_fit(r)]
    held = [r for r in rows if not used_for_fit(r)]
    best: tuple[float, float, float] | None = None
    for base in np.arange(0.0, 1.0001, 0.05):
        for per_seq in np.arange(0.0, 0.0501, 0.0025):
            terms = {
                "cpu_overhead_ms": round(float(base), 4),
                "cpu_overhead_per_seq_ms": round(float(per_seq), 4),
            }
            cost = float(np.mean(_log_errors(train, terms) ** 2))
            if best is None or cost < best[0]:
                best = (cost, terms["cpu_overhead_ms"], terms["cpu_overhead_per_seq_ms"])
    assert best is not None
    _, base, per_seq = best
    terms = {"cpu_overhead_ms": base, "cpu_overhead_per_seq_ms": per_seq}
    print(f"fit on {len(train)} {FIT_MODEL} rows: cpu_overhead_ms {base}, per_seq_ms {per_seq}")
    for name, group in ((f"fitted ({FIT_MODEL})", train), ("held out (other models)", held)):
        errs = np.abs(np.expm1(_log_errors(group, terms)))
        print(
            f"  {name:<28} {len(group):>3} rows: median {np.median(errs):.1%}, "
            f"p90 {np.percentile(errs, 90):.1%}"
        )
    return base, per_seq


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument(
        "--fit-lmdeploy-cpu",
        action="store_true",
        help="fit the lmdeploy preset's CPU time per iteration to the Llama-2-7B LMDeploy rows "
        "and print it with the error of the other rows (about 20 s)",
    )
    args = parser.parse_args(argv)
    if args.fit_lmdeploy_cpu:
        fit_lmdeploy_cpu()
        return 0
    results = []
    print(f"{'source / setup':<86} {'metric':<18} {'published':>10} {'batchsim':>10} {'error':>8}")
    for row in ROWS:
        sim = simulated(row)
        err = sim / row.value - 1.0
        results.append((row, sim, err))
        print(f"{row.what:<86} {row.metric:<18} {row.value:>10.4g} {sim:>10.4g} {err:>+8.1%}")
    print()
    print(f"{'source':<42} {'rows':>5} {'median |error|':>15} {'p90 |error|':>12}")
    groups: dict[str, list[float]] = {}
    for row, _, err in results:
        groups.setdefault(row.source, []).append(abs(err))
    groups["all"] = [abs(err) for _, _, err in results]
    groups["all but the rows a preset was fitted to"] = [
        abs(err) for row, _, err in results if not used_for_fit(row)
    ]
    for name, errs in groups.items():
        values = np.array(errs)
        print(
            f"{name:<42} {len(values):>5} {np.median(values):>15.1%} "
            f"{np.percentile(values, 90):>12.1%}"
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["source", "url", "setup", "metric", "published", "batchsim", "error"])
            for row, sim, err in results:
                writer.writerow([row.source, row.url, row.what, row.metric, row.value, sim, err])
    return 0


if __name__ == "__main__":
    sys.exit(main())
