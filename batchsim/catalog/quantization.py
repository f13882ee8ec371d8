"""A checkpoint's precision, read from its Hugging Face ``quantization_config``.

A quantized checkpoint says how its weights (and sometimes its KV cache) are stored, and the
serving engines load it that way without a flag: vLLM picks its quantization method from
``quant_method``, and a ModelOpt or compressed-tensors checkpoint with an FP8 KV-cache scheme
gets an FP8 KV cache. :func:`checkpoint_precision` maps the config to batchsim's dtype names
(:data:`~batchsim.dtypes.WEIGHT_DTYPES`, :data:`~batchsim.dtypes.KV_DTYPES`); an experiment
takes them for the ``engine`` keys it does not set, ``dtype`` and ``kv_cache_dtype``
(:mod:`batchsim.config.resolve`; without a KV-cache scheme the KV cache is ``bf16``, the
activations' dtype, as vLLM's ``auto`` gives for a quantized checkpoint), and its resolved
``config.yaml`` records them.

The methods read (field names as the checkpoints write them; vLLM's quantization docs,
docs.vllm.ai "Quantization", and Hugging Face transformers' quantization config classes):

- ``fp8``, ``fbgemm_fp8`` (DeepSeek-V3, Qwen3 FP8; block-wise when ``weight_block_size`` is
  given): ``fp8`` weights.
- ``mxfp4`` (gpt-oss): 4-bit floats with a shared scale per 32 weights, priced as ``nvfp4``
  (4-bit floats with an FP8 scale per 16: 4.5 bits a weight against MXFP4's 4.25). The
  layers a checkpoint leaves in 16 bits (``modules_to_not_convert``: gpt-oss's attention,
  router and embeddings) are priced in 4 bits too: batchsim has one weight dtype per model.
- ``modelopt`` (NVIDIA TensorRT Model Optimizer): ``quant_algo`` FP8... -> ``fp8``, NVFP4 ->
  ``nvfp4``, W4A16_AWQ / W4A8_AWQ -> ``int4``; ``kv_cache_quant_algo: FP8`` -> an ``fp8`` KV
  cache. The keys may sit under ``quantization`` (the ``hf_quant_config.json`` form).
- ``awq``, ``gptq`` and their Marlin forms: ``bits`` (AWQ: ``w_bit``) 4 or 8 -> ``int4`` /
  ``int8``.
- ``compressed-tensors`` (llm-compressor): the weights of every ``config_groups`` entry,
  ``num_bits`` and ``type`` (8 float -> ``fp8``, 8 int -> ``int8``, 4 int -> ``int4``, 4 float
  -> ``nvfp4``); ``kv_cache_scheme`` with 8 float bits -> an ``fp8`` KV cache.
- ``bitsandbytes``: ``load_in_4bit`` / ``load_in_8bit`` -> ``int4`` / ``int8``.

Anything else is an error naming these methods: the engine would load the checkpoint in a
precision batchsim does not know (set ``engine.dtype`` and remove ``quantization_config`` to
simulate it anyway).

This module imports nothing from batchsim but :mod:`batchsim.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from batchsim.errors import ConfigError

__all__ = ["QUANT_METHODS", "checkpoint_precision"]

QUANT_METHODS = (
    "fp8",
    "fbgemm_fp8",
    "mxfp4",
    "modelopt",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "compressed-tensors",
    "bitsandbytes",
)
"""The ``quant_method`` values :func:`checkpoint_precision` reads."""

_MODELOPT_WEIGHTS = {
    "FP8": "fp8",
    "FP8_PER_CHANNEL_PER_TOKEN": "fp8",
    "FP8_PB_WO": "fp8",
    "FP8_BLOCK_SCALES": "fp8",
    "NVFP4": "nvfp4",
    "W4A16_AWQ": "int4",
    "W4A8_AWQ": "int4",
}
_COMPRESSED_WEIGHTS = {(8, "float"): "fp8", (8, "int"): "int8", (4, "int"): "int4"}
_COMPRESSED_WEIGHTS[(4, "float")] = "nvfp4"

Error = Callable[[str, str], ConfigError]
"""Builds the error about a key under ``quantization_config`` (its dotted name, a message)."""


def checkpoint_precision(config: Any, error: Error) -> tuple[str, str | None]:
    """The weight dtype and KV-cache dtype (None: the engine's default) a checkpoint with
    ``quantization_config: config`` is served in.

    Raises:
        ConfigError: (from ``error``) not a mapping, an unknown ``quant_method``, or fields
            that do not say a supported precision.
    """
    if not isinstance(config, Mapping):
        raise error("", f"must be a mapping, got {type(config).__name__}")
    method = config.get("quant_method")
    if not isinstance(method, str) or method not in QUANT_METHODS:
        raise error(
            "quant_method",
            f"{method!r} is not a quantization method batchsim reads; supported: "
            f"{', '.join(QUANT_METHODS)} (or remove quantization_config and set engine.dtype)",
        )
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", None
    if method == "mxfp4":
        return "nvfp4", None
    if method == "modelopt":
        return _modelopt(config, error)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        key = "w_bit" if "w_bit" in config else "bits"
        bits = config.get(key)
        if type(bits) is not int or bits not in (4, 8):
            raise error(key, f"must be 4 or 8 (bits per weight), got {bits!r}")
        return ("int4" if bits == 4 else "int8"), None
    if method == "compressed-tensors":
        return _compressed(config, error)
    four, eight = config.get("load_in_4bit"), config.get("load_in_8bit")
    if four is True and eight is not True:
        return "int4", None
    if eight is True and four is not True:
        return "int8", None
    raise error("load_in_4bit", "bitsandbytes: exactly one of load_in_4bit, load_in_8bit is true")


def _modelopt(config: Mapping[str, Any], error: Error) -> tuple[str, str | None]:
    block = config.get("quantization")
    fields = block if isinstance(block, Mapping) else config
    prefix = "quantization." if fields is not config else ""
    algo = fields.get("quant_algo")
    if algo not in _MODELOPT_WEIGHTS:
        raise error(
            f"{prefix}quant_algo",
            f"{algo!r} is not read; supported: {', '.join(_MODELOPT_WEIGHTS)}",
        )
    kv = fields.get("kv_cache_quant_algo")
    if kv not in (None, "FP8"):
        raise error(f"{prefix}kv_cache_quant_algo", f"must be FP8 or null, got {kv!r}")
    return _MODELOPT_WEIGHTS[algo], ("fp8" if kv == "FP8" else None)


def _compressed(config: Mapping[str, Any], error: Error) -> tuple[str, str | None]:
    groups = config.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise error("config_groups", "must be a non-empty mapping of quantization schemes")
    found: set[str] = set()
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        where = f"config_groups.{name}.weights"
        if not isinstance(weights, Mapping):
            raise error(where, "must be a mapping with num_bits and type")
        scheme = (weights.get("num_bits"), weights.get("type"))
        if scheme not in _COMPRESSED_WEIGHTS or type(scheme[0]) is not int:
            allowed = ", ".join(f"{b} {t}" for b, t in _COMPRESSED_WEIGHTS)
            raise error(where, f"num_bits/type {scheme[0]!r}/{scheme[1]!r}; supported: {allowed}")
        found.add(_COMPRESSED_WEIGHTS[scheme])
    if len(found) > 1:
        raise error("config_groups", f"mixes weight dtypes {sorted(found)}; one is supported")
    kv_scheme = config.get("kv_cache_scheme")
    kv = None
    if kv_scheme is not None:
        if not isinstance(kv_scheme, Mapping) or (
            kv_scheme.get("num_bits"),
            kv_scheme.get("type"),
        ) != (8, "float"):
            raise error("kv_cache_scheme", "must be num_bits 8, type float (an FP8 KV cache)")
        kv = "fp8"
    return found.pop(), kv
