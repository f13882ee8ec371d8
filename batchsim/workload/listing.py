"""What ``batchsim list workloads`` shows: :func:`workload_table`.

Owns the rows describing the built-in ``workloads/`` catalog (workload files and trace
samples, with their request counts and mean token counts; for a workload with shared prefixes
or conversations, the mean whole prompt of its seed-0 draw), the arrival processes, the length
and time distributions and the trace formats.
"""

from __future__ import annotations

from typing import Any

from batchsim.catalog import catalog_dir, catalog_names
from batchsim.validation import ConfigModel
from batchsim.workload.arrivals import ARRIVAL_PROCESSES
from batchsim.workload.config import WorkloadDefinition, load_workload
from batchsim.workload.distributions import LENGTH_DISTRIBUTIONS, TIME_DISTRIBUTIONS
from batchsim.workload.generation import generate
from batchsim.workload.traces import TRACE_FORMATS, TraceConfig, load_trace


def _parameters(cls: type[ConfigModel], tag: str) -> str:
    parts = []
    for name, info in cls.model_fields.items():
        if name == tag:
            continue
        optional = "" if info.is_required() else " [optional]"
        parts.append(f"{name}: {info.description or ''}{optional}")
    return "; ".join(parts)


def _doc_line(cls: type) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0].replace("``", "")


_SAMPLE_DESCRIPTIONS = {
    "azure_conv_sample.csv": "First 2,000 requests of the Azure LLM inference trace 2023, "
    "conversation service (Splitwise, ISCA'24; CC-BY)",
    "azure_code_sample.csv": "First 500 requests of the Azure LLM inference trace 2023, "
    "code-completion service (Splitwise, ISCA'24; CC-BY)",
    "mooncake_synthetic_sample.jsonl": "First 200 requests of the Mooncake FAST'25 synthetic "
    "trace, with prefix hash ids (Apache-2.0)",
    "burstgpt_synthetic_sample.csv": "SYNTHETIC rows in the BurstGPT CSV layout (placeholder "
    "distributions, not BurstGPT data; 500 rows, 18 failed ones skipped)",
}

_Row = dict[str, Any]


def _row(
    name: str,
    kind: str,
    description: str,
    parameters: str = "",
    requests: int | None = None,
    mean_prompt: float | None = None,
    mean_output: float | None = None,
) -> _Row:
    return {
        "name": name,
        "kind": kind,
        "description": description,
        "parameters": parameters,
        "requests": requests,
        "mean_prompt_tokens": None if mean_prompt is None else round(mean_prompt, 1),
        "mean_output_tokens": None if mean_output is None else round(mean_output, 1),
    }


def _definition_row(definition: WorkloadDefinition) -> _Row:
    cfg = definition.config
    parts: list[str] = []
    if cfg.trace is not None:
        trace = load_trace(cfg.trace, definition.base_dir, limit=cfg.num_requests)
        count = min(cfg.num_requests or len(trace), len(trace))
        mean_p = float(trace.prompt_tokens[:count].mean())
        mean_o = float(trace.output_tokens[:count].mean())
        parts.append(f"trace={cfg.trace.path}")
        requests: int | None = count
    else:
        assert cfg.prompt_tokens is not None and cfg.output_tokens is not None
        mean_p = cfg.prompt_tokens.analytic_mean(definition.base_dir)
        mean_o = cfg.output_tokens.analytic_mean(definition.base_dir)
        parts.append(f"prompt={cfg.prompt_tokens.describe()}")
        parts.append(f"output={cfg.output_tokens.describe()}")
        requests = cfg.num_requests
        if cfg.shared_prefix is not None:
            parts.append(f"shared_prefix={cfg.shared_prefix.describe()}")
        if cfg.conversation is not None:
            parts.append(f"conversation({cfg.conversation.describe()})")
        if cfg.shared_prefix is not None or cfg.conversation is not None:
            # whole prompts (prefix and history included): the mean of the seed-0 draw
            table = generate(cfg, 0, definition.base_dir)
            mean_p = float(table.prompt_tokens.mean())
    if cfg.arrival is not None:
        parts.insert(0, f"arrival={cfg.arrival.describe()}")
    if cfg.concurrency is not None:
        parts.insert(0, f"concurrency={cfg.concurrency}")
    if cfg.think_time_ms is not None:
        parts.append(f"think_time_ms={cfg.think_time_ms.describe()}")
    if cfg.duration_s is not None:
        parts.append(f"duration_s={cfg.duration_s:g}")
    return _row(
        definition.name,
        "workload",
        definition.description,
        "; ".join(parts),
        requests,
        mean_p,
        mean_o,
    )


def workload_table() -> list[dict[str, Any]]:
    """Everything ``batchsim list workloads`` shows, one dict per row.

    Rows have the keys ``name, kind, description, parameters, requests, mean_prompt_tokens,
    mean_output_tokens``. Kinds: ``workload`` (YAML files in ``workloads/``), ``trace`` (trace
    samples shipped there), ``arrival`` (arrival processes), ``length`` (token-length
    distributions), ``time`` (think/cancel-time distributions), ``trace-format``.
    """
    rows: list[_Row] = []
    for name in catalog_names("workloads"):
        rows.append(_definition_row(load_workload(name)))
    directory = catalog_dir("workloads")
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".csv", ".jsonl") or path.name.startswith("_"):
                continue
            trace = load_trace(TraceConfig(path=str(path)))
            rows.append(
                _row(
                    path.name,
                    "trace",
                    _SAMPLE_DESCRIPTIONS.get(path.name, f"{trace.format} trace"),
                    f"format={trace.format}",
                    len(trace),
                    float(trace.prompt_tokens.mean()),
                    float(trace.output_tokens.mean()),
                )
            )
    groups: list[tuple[str, dict[str, type[ConfigModel]], str]] = [
        ("arrival", dict(ARRIVAL_PROCESSES), "process"),
        ("length", dict(LENGTH_DISTRIBUTIONS), "dist"),
        ("time", dict(TIME_DISTRIBUTIONS), "dist"),
    ]
    for kind, classes, tag in groups:
        for name, cls in classes.items():
            rows.append(_row(name, kind, _doc_line(cls), _parameters(cls, tag)))
    for name, text in TRACE_FORMATS.items():
        rows.append(_row(name, "trace-format", text))
    return rows
