"""Serving-engine presets: :class:`FrameworkPreset`, :func:`load_framework` and friends.

A preset (``frameworks/<name>.yaml``) is a named set of experiment defaults that describe how
one serving engine runs a model: its CPU scheduling overhead and whether it overlaps the GPU
step, the latency of its all-reduce for small messages, its CUDA-graph batch padding, its
KV block size and its default batch limits and policy. ``engine.framework: NAME`` in an
experiment fills in every key of the preset that the experiment does not set itself, so the
precedence is: a key in the experiment (or ``--set``) > the preset > the hardware profile
(which gives what neither sets, e.g. the NCCL all-reduce latency).

A preset's YAML holds ``name``, ``description``, an ``engine:`` and a ``scheduler:`` block
(keys of the experiment's blocks of the same name) and ``sources:``, one entry per number
(``engine.block_size: "..."``). The keys and values are validated with the experiment itself.

Must not import anything from batchsim but :mod:`batchsim.catalog`, :mod:`batchsim.errors`
and :mod:`batchsim.yamlio`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from batchsim.catalog import catalog_dir, catalog_names
from batchsim.errors import ConfigError
from batchsim.yamlio import read_mapping

__all__ = [
    "DEFAULT_FRAMEWORK",
    "FRAMEWORK_BLOCKS",
    "FrameworkPreset",
    "apply_framework",
    "framework_names",
    "framework_table",
    "load_framework",
]

DEFAULT_FRAMEWORK = "vllm-v1"
"""The preset of an experiment whose ``engine:`` block has no ``framework`` key: the serving
engine current vLLM runs (``engine.framework: null`` asks for none: batchsim's plain engine,
every default from the experiment schema and the hardware profile)."""

FRAMEWORK_BLOCKS = ("engine", "scheduler")
"""Experiment blocks a preset may give defaults for."""

_TOP_KEYS = frozenset({"name", "description", *FRAMEWORK_BLOCKS, "sources"})


@dataclass(frozen=True)
class FrameworkPreset:
    """One serving engine's defaults.

    Attributes:
        name: The value of ``engine.framework``.
        description: One line.
        defaults: Per block (``engine``, ``scheduler``), the keys the preset sets.
        sources: Where each number comes from, by dotted key (``engine.block_size``).
    """

    name: str
    description: str
    defaults: dict[str, dict[str, Any]]
    sources: dict[str, str]

    def items(self) -> list[tuple[str, Any]]:
        """Every ``(dotted key, value)`` the preset sets."""
        return [
            (f"{block}.{key}", value)
            for block in FRAMEWORK_BLOCKS
            for key, value in self.defaults.get(block, {}).items()
        ]


def framework_names() -> list[str]:
    """Names of the built-in presets, sorted."""
    return catalog_names("frameworks")


def _allowed() -> str:
    return ", ".join(framework_names()) or "(none)"


@functools.lru_cache(maxsize=16)
def load_framework(name: str) -> FrameworkPreset:
    """The built-in preset ``name``.

    Raises:
        ConfigError: Not a built-in name (one line listing the names), or a malformed file.
    """
    if not isinstance(name, str) or name not in framework_names():
        raise ConfigError(f"engine.framework: unknown framework {name!r}; allowed: {_allowed()}")
    path = catalog_dir("frameworks") / f"{name}.yaml"
    doc, _ = read_mapping(path)
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_TOP_KEYS))}"
        )
    defaults: dict[str, dict[str, Any]] = {}
    for block in FRAMEWORK_BLOCKS:
        values = doc.get(block, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {block} must be a mapping")
        defaults[block] = dict(values)
    sources = doc.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ConfigError(f"{path}: sources must map dotted keys to text")
    preset = FrameworkPreset(
        name=str(doc.get("name", name)),
        description=str(doc.get("description", "")),
        defaults=defaults,
        sources={str(k): v for k, v in sources.items()},
    )
    missing = [key for key, _ in preset.items() if not preset.sources.get(key, "").strip()]
    if missing:
        raise ConfigError(f"{path}: {missing[0]} has no entry under sources")
    return preset


def apply_framework(data: dict[str, Any], policy_keys: Any = None) -> list[str]:
    """Fill the keys of ``data``'s ``engine.framework`` preset that ``data`` does not set.

    ``data`` is a raw experiment mapping (changed in place). Without an ``engine.framework``
    key it gets :data:`DEFAULT_FRAMEWORK`; ``engine.framework: null`` fills nothing. A
    scheduler key is filled only if the resolved policy reads it (``policy_keys(policy_name)``
    returns the keys it reads, or None when unknown: then every key is filled).

    Returns:
        The dotted keys the preset filled in.

    Raises:
        ConfigError: Unknown framework name, or a block that is not a mapping.
    """
    engine = data.setdefault("engine", {})
    if isinstance(engine, dict) and "framework" not in engine:
        engine["framework"] = DEFAULT_FRAMEWORK
    if not isinstance(engine, dict) or engine.get("framework") is None:
        return []
    preset = load_framework(engine["framework"])
    filled: list[str] = []
    for block in FRAMEWORK_BLOCKS:
        target = data.setdefault(block, {})
        if not isinstance(target, dict):
            return filled  # the schema reports the block
        for key, value in preset.defaults[block].items():
            if key not in target:
                target[key] = value
                filled.append(f"{block}.{key}")
    scheduler = data["scheduler"]
    if policy_keys is not None:
        reads = policy_keys(scheduler.get("policy", "continuous"))
        if reads is not None:
            for dotted in list(filled):
                block, key = dotted.split(".", 1)
                if block == "scheduler" and key not in reads:
                    del scheduler[key]
                    filled.remove(dotted)
    return filled


_TABLE_KEYS = (
    ("cpu_ms", "engine.cpu_overhead_ms"),
    ("cpu_per_seq_ms", "engine.cpu_overhead_per_seq_ms"),
    ("async", "engine.async_scheduling"),
    ("all_reduce_us", "engine.all_reduce_latency_us"),
    ("cuda_graph_max_bs", "engine.cuda_graph_max_batch_size"),
    ("block_size", "engine.block_size"),
    ("policy", "scheduler.policy"),
    ("max_num_seqs", "scheduler.max_num_seqs"),
    ("max_batched_tokens", "scheduler.max_num_batched_tokens"),
)


def framework_table() -> list[dict[str, Any]]:
    """One row per built-in preset for ``batchsim list frameworks``: name, description and
    the main numbers (None: not set by the preset, the hardware profile or the experiment's
    default applies)."""
    rows = []
    for name in framework_names():
        preset = load_framework(name)
        values = dict(preset.items())
        row: dict[str, Any] = {"name": preset.name}
        for column, key in _TABLE_KEYS:
            value = values.get(key)
            row[column] = str(value).lower() if isinstance(value, bool) else value
        row["description"] = preset.description
        rows.append(row)
    return rows
