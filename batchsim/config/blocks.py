"""The blocks of an experiment besides the workload's, the scheduler's and the cluster's:
``parallel:``, ``engine:``, ``slo:``, ``metrics:`` and ``output:`` — every key with its default,
bounds and unit (``_ms`` milliseconds, ``_s`` seconds, ``_gb`` / ``_gib`` bytes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from batchsim.scheduler.config import SpeculativeConfig
from batchsim.validation import (
    MAX_GB,
    MAX_MS,
    MAX_SECONDS,
    MAX_STEP_MS,
    MAX_TOKENS,
    ConfigModel,
    FieldError,
    StrictBool,
    StrictFloat,
    StrictInt,
    format_value,
    number_problem,
)

WeightDtype = Literal["fp16", "bf16", "fp8", "int8", "int4", "nvfp4"]
KvDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]
FrameworkName = Literal["vllm-v0", "vllm-v1", "sglang", "tensorrt-llm", "lmdeploy"]


class ParallelConfig(ConfigModel):
    """``parallel:`` — how the model is split across GPUs."""

    tensor_parallel_size: StrictInt = Field(1, ge=1, le=65536)
    """GPUs sharing every layer (weights, FLOPs and KV heads split; two all-reduces per layer)."""
    pipeline_parallel_size: StrictInt = Field(1, ge=1, le=1024)
    """Pipeline stages P: the layers are split into P consecutive stages of
    ``tensor_parallel_size`` GPUs each (TP x PP GPUs per engine); up to P batches are in
    flight, one per stage (see :mod:`batchsim.engine.pipeline`). 1: no pipeline."""


class EngineConfig(ConfigModel):
    """``engine:`` — memory, precision and the step loop."""

    gpu_memory_utilization: StrictFloat = Field(0.9, gt=0, le=1)
    """Fraction of GPU memory the engine may use (weights + activations + KV cache)."""
    block_size: StrictInt = Field(16, ge=1, le=MAX_TOKENS)
    """Tokens per KV-cache block."""
    dtype: WeightDtype = "bf16"
    """Weight precision (int8/int4 are weight-only quantization computing in bf16; nvfp4 runs
    on FP4 tensor cores where the GPU has them, else weight-only). Unset: a quantized
    checkpoint's own (its ``quantization_config``, :mod:`batchsim.catalog.quantization`),
    else bf16."""
    kv_cache_dtype: KvDtype = "auto"
    """KV-cache precision; ``auto`` = same as ``dtype`` (fp16 for int weights). Unset with a
    quantized checkpoint: its FP8 KV-cache scheme's ``fp8``, else ``bf16``."""
    max_model_len: StrictInt | None = Field(None, ge=1, le=2 * MAX_TOKENS)
    """Longest prompt + output accepted (tokens); default: the model's context length."""
    num_gpu_blocks: StrictInt | None = Field(None, ge=1, le=2**40)
    """Override the KV-cache size in blocks (default: computed from memory)."""
    activation_reserve_gb: StrictFloat | None = Field(None, ge=0, le=MAX_GB)
    """Memory kept for activations (GB); default: estimated from the token budget."""
    cpu_overhead_ms: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS)
    """CPU time per iteration (ms); default: the hardware profile's ``cpu_overhead.base_ms``."""
    cpu_overhead_per_seq_ms: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS)
    """Extra CPU time per request in the iteration (ms); default: from the hardware profile."""
    watermark: StrictFloat = Field(0.01, ge=0, lt=1)
    """Fraction of KV blocks admission keeps free (vLLM's block-manager watermark): a waiting
    request is admitted, or a swapped one resumed, only if this many blocks stay free after
    its allocation; running requests may grow into them."""
    swap_space_gib: StrictFloat = Field(4.0, ge=0, le=MAX_GB)
    """Host memory per GPU for KV blocks preempted by swapping (GiB; vLLM's ``swap_space``).
    Used with ``scheduler.preemption_mode: swap``."""
    async_scheduling: StrictBool = False
    """Overlap the CPU work of an iteration with the previous GPU step (vLLM V1 async)."""
    framework: FrameworkName | None = None
    """Serving-engine preset (``frameworks/NAME.yaml``, ``batchsim list frameworks``): fills
    every ``engine.*`` and ``scheduler.*`` key it sets that the experiment does not set.
    Precedence: experiment key (or ``--set``) > preset > hardware profile. An experiment
    without this key runs ``vllm-v1`` (current vLLM; ``validate_experiment`` fills it in);
    ``null`` runs batchsim's plain engine, every default from this schema and the profile."""
    all_reduce_latency_us: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS * 1e3)
    """Fixed time per tensor-parallel all-reduce (us); default: the hardware profile's
    ``efficiency.interconnect_latency_us`` (NCCL)."""
    launch_overhead_ms: StrictFloat | None = Field(None, ge=0, le=MAX_STEP_MS)
    """Fixed GPU-side time per forward pass (ms); default: the hardware profile's
    ``efficiency.launch_overhead_ms``."""
    cuda_graph_max_batch_size: StrictInt | None = Field(None, ge=0, le=MAX_TOKENS)
    """Largest CUDA-graph batch size: a decode-only iteration of n <= this requests runs as
    the next captured size (1, 2, 4, then multiples of 8, vLLM) and the added rows count as
    padding tokens; larger batches run unpadded. None or 0: no padding."""
    fast_forward: StrictBool = True
    """Advance decode-only stretches in one step, for policies that declare
    ``decode_stretches`` (same results; off only to cross-check)."""
    enable_prefix_caching: StrictBool = False
    """Automatic prefix caching (vLLM's ``enable_prefix_caching``): full KV blocks of content
    that requests share (the workload's prefix segments) stay cached after their requests
    leave, and a request starting with cached blocks skips computing them
    (:mod:`batchsim.engine.prefix_cache`). Not with a sliding-window model."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (:mod:`batchsim.scheduler.speculative`); null: none."""


class SloConfig(ConfigModel):
    """``slo:`` — latency objectives for ``request_goodput`` (ms)."""

    ttft_ms: StrictFloat | None = Field(None, gt=0, le=MAX_MS)
    tpot_ms: StrictFloat | None = Field(None, gt=0, le=MAX_MS)
    e2el_ms: StrictFloat | None = Field(None, gt=0, le=MAX_MS)


class MetricsConfig(ConfigModel):
    """``metrics:`` — what the summary counts."""

    warmup_s: StrictFloat = Field(0.0, ge=0, le=MAX_SECONDS)
    """Leave out requests arriving in the first ``warmup_s`` seconds."""
    cooldown_s: StrictFloat = Field(0.0, ge=0, le=MAX_SECONDS)
    """Leave out requests arriving in the last ``cooldown_s`` seconds."""
    record_slots: StrictBool = False
    """Record which request sits in which batch slot in every iteration (``slots.csv``, for
    ``batchsim plot timeline`` and the ITL distribution); costs time per iteration."""


OUTPUT_FORMATS = ("csv", "parquet")
MAX_ITERATION_SAMPLE = 1_000_000_000
"""Most iteration rows ``output.iterations: {sample: N}`` may ask for."""


class IterationSample(ConfigModel):
    """``output.iterations: {sample: N}`` — N iteration rows, evenly spaced over the run."""

    sample: StrictInt = Field(ge=2, le=MAX_ITERATION_SAMPLE)


class OutputConfig(ConfigModel):
    """``output:`` — how the run's tables are written (the summary is the same whatever)."""

    format: Literal["csv", "parquet"] = "csv"
    """File format of the request, iteration and slot tables (``requests.csv`` or
    ``requests.parquet``, ...); ``summary.json`` and ``config.yaml`` are always JSON and YAML."""
    iterations: Literal["all", "none"] | IterationSample = "all"
    """Rows of the iteration table: ``all``, ``none`` (no file), or ``{sample: N}``: N rows
    evenly spaced over the run, the first and the last included (their ``iteration`` column
    keeps the numbers of the full run)."""

    @field_validator("iterations", mode="before")
    @classmethod
    def _iterations(cls, value: Any) -> Any:
        # One message for the three forms (a union would report one error per form).
        if isinstance(value, IterationSample) or (
            isinstance(value, str) and value in ("all", "none")
        ):
            return value
        if isinstance(value, Mapping) and set(value) == {"sample"}:
            problem = number_problem(value["sample"], integer=True, ge=2, le=MAX_ITERATION_SAMPLE)
            if problem:
                raise FieldError("sample", problem)
            return IterationSample(sample=int(value["sample"]))
        raise FieldError(
            "",
            "must be all, none or {sample: N} (N iteration rows evenly spaced over the run); "
            f"got {format_value(value)}",
        )

    @property
    def iteration_sample(self) -> int | None:
        """N of ``iterations: {sample: N}``, else None."""
        return self.iterations.sample if isinstance(self.iterations, IterationSample) else None
