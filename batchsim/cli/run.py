"""``batchsim run`` and ``batchsim validate``: one experiment, simulated or only checked, and
what they print (the summary table of a run, :func:`print_summary`; the engines of a check)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from batchsim.cli.args import SET_HELP, output_path
from batchsim.cli.tables import _fmt
from batchsim.errors import write_error


def add_run(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``run`` command to ``sub``."""
    p = sub.add_parser(
        "run",
        help="simulate an experiment and write its outputs",
        description="Simulate an experiment, print a summary table, and write summary.json, "
        "requests.csv, iterations.csv and config.yaml into the output directory (the tables "
        "as .parquet with --format parquet; see the experiment's output: block).",
        epilog="The output directory must be new, empty, or hold a previous batchsim run "
        "(whose output files are replaced); batchsim refuses to replace files it did not write.",
    )
    p.add_argument("experiment", help="experiment YAML file, or a built-in experiment name")
    p.add_argument(
        "-o",
        "--output",
        type=output_path,
        metavar="DIR",
        help="output directory (default: runs/NAME, NAME being the experiment's name)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)
    p.add_argument(
        "--format",
        choices=("csv", "parquet"),
        help="file format of the request and iteration tables (requests.csv or "
        "requests.parquet, ...); the same as --set output.format=FORMAT (default: the "
        "experiment's output.format, csv)",
    )
    p.set_defaults(func=_cmd_run)


def add_validate(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``validate`` command to ``sub``."""
    p = sub.add_parser(
        "validate",
        help="check an experiment without running it",
        description="Check an experiment and its --set overrides, load its hardware and model "
        "and size its KV cache, without simulating; writes nothing.",
    )
    p.add_argument("experiment", help="experiment YAML file, or a built-in experiment name")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)
    p.set_defaults(func=_cmd_validate)


def _cmd_run(args: argparse.Namespace) -> int:
    from batchsim.config import ExperimentSource, parse_override
    from batchsim.outputs import StagedOutput, check_output_dir
    from batchsim.progress import RunProgress
    from batchsim.simulation import simulate

    overrides = dict(parse_override(item) for item in args.set)
    if args.format is not None:  # the same as --set output.format=FORMAT, given last
        overrides["output.format"] = args.format
    source = ExperimentSource.read(args.experiment)
    config = source.load(overrides)
    if "sweep" in source.studies:
        print(
            "note: the sweep: block is read by batchsim sweep and batchsim capacity; "
            "run simulates the base experiment",
            file=sys.stderr,
        )
    out_dir = Path(args.output) if args.output else Path("runs") / config.name
    check_output_dir(out_dir)  # before simulating: a long run must not end in a refusal
    try:  # the iterations table is written while the engine runs
        staged = StagedOutput(out_dir)
    except OSError as exc:
        raise write_error(out_dir, exc) from exc
    progress = RunProgress.for_terminal()
    try:
        result = simulate(config, Path(args.experiment).parent, progress, staged=staged)
        if progress is not None:
            progress.close()  # the notes on a line of their own
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if progress is not None:
            progress.stage(f"writing {out_dir}")
        result.write(out_dir)
    finally:
        staged.discard()
        if progress is not None:
            progress.close()
    engine = config.engine.framework or "plain engine"
    print(
        f"batchsim: {config.name} — {config.scheduler.policy} ({engine}) on {config.model} / "
        f"{config.hardware}"
    )
    if config.cluster is not None and config.cluster.disaggregation is not None:
        print(f"  {_pools_line(config.cluster)}")
    elif config.cluster is not None:
        print(f"  {_replicas_line(result.replicas)}, router {config.cluster.router}")
    print_summary(result.summary, reasons=reject_reasons(result.request_columns))
    print(f"  wrote {out_dir}/{{{','.join(result.files)}}}")
    sample = config.output.iteration_sample
    if sample is not None and sample < result.summary["num_iterations"]:
        print(
            f"  iterations.{config.output.format}: a sample of {sample:,} of "
            f"{result.summary['num_iterations']:,} iterations, evenly spaced (output.iterations)"
        )
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from batchsim.config import load_experiment, parse_override, unused_scheduler_keys
    from batchsim.deployment import assemble
    from batchsim.scheduler.registry import load_policy
    from batchsim.workload import generate, trace_notes

    overrides = dict(parse_override(item) for item in args.set)
    config = load_experiment(args.experiment, overrides)
    policy = load_policy(config.scheduler.policy)
    deployment = assemble(config)  # everything built, nothing run
    from batchsim.config import ExperimentSource
    from batchsim.studies.sweep import block_axes

    axes, seeds = block_axes(ExperimentSource.read(args.experiment))  # a bad block is an error
    if axes or seeds > 1:
        points = math.prod(len(axis) for axis in axes) * seeds
        print(f"note: its sweep: block has {points:,} points", file=sys.stderr)
    # Everything `run` checks before simulating: draw the workload too (cheap), so a trace or a
    # distribution that `run` would reject is rejected here with the same message.
    generate(config.workload, config.seed, Path(args.experiment).parent)
    for note in trace_notes(config.workload, Path(args.experiment).parent):
        print(f"note: {note}", file=sys.stderr)
    for key in unused_scheduler_keys(config, policy.config_keys):
        print(
            f"note: scheduler.{key} is not used by policy {config.scheduler.policy}",
            file=sys.stderr,
        )
    groups = deployment.groups
    if config.cluster is None:
        print(f"{args.experiment}: ok — {_engine_line(config, groups[0].setup)}")
        return 0
    if config.cluster.disaggregation is not None:
        print(f"{args.experiment}: ok — {_pools_line(config.cluster)}:")
        for group in groups:
            print(f"  {group.pool}: {group.count} x {_engine_line(group.experiment, group.setup)}")
        return 0
    print(
        f"{args.experiment}: ok — {config.cluster.num_replicas} replicas behind "
        f"{config.cluster.router}:"
    )
    for group in groups:
        print(f"  {group.count} x {_engine_line(group.experiment, group.setup)}")
    return 0


OVERLOAD_GROWTH = 0.05
"""``queue_delay_growth`` above which the summary says the queue grows (the default stability
bound of ``batchsim capacity``: arrivals more than about 5 % above what the engine serves)."""
SECONDS_ABOVE_MS = 10_000.0
"""A latency row whose largest value reaches this many ms is printed in seconds."""


def reject_reasons(columns: Any) -> list[tuple[str, int]]:
    """Why requests were rejected, with how many each, most first (the ``reject_reason`` of
    ``requests.csv``). A request's own numbers in a reason (``needs 40 KV blocks > KV cache
    capacity 30``) are gathered into their range: ``needs 35-40 KV blocks > ...``."""
    import re

    reasons = [
        str(r) for r, s in zip(columns["reject_reason"], columns["status"]) if s == "rejected"
    ]
    groups: dict[str, list[int]] = {}
    for reason in reasons:
        match = re.search(r"\d+", reason)
        key = reason if match is None else reason[: match.start()] + "{}" + reason[match.end() :]
        groups.setdefault(key, []).append(int(match.group()) if match else 0)
    out = []
    for key, numbers in groups.items():
        low, high = min(numbers), max(numbers)
        text = key.format(f"{low}" if low == high else f"{low}-{high}") if "{}" in key else key
        out.append((text or "no reason given", len(numbers)))
    return sorted(out, key=lambda item: -item[1])


def _latency_row(summary: dict[str, Any], name: str) -> str:
    """``mean / median / p90 / p99`` of one latency, in ms, or in s when it reaches 10 s (an
    all-at-once load's TTFT: ``1,234.57 s``, not ``1,234,567.89``)."""
    values = [summary[f"{s}_{name}_ms"] for s in ("mean", "median", "p90", "p99")]
    finite = [v for v in values if isinstance(v, (int, float)) and v == v]
    if finite and max(finite) >= SECONDS_ABOVE_MS:
        return " / ".join(_fmt(v / 1e3 if v == v else v) for v in values) + " s"
    return " / ".join(_fmt(v) for v in values) + " ms"


def _queue_delay_row(summary: dict[str, Any]) -> str:
    """``mean X, p99 Y`` of the queue delay, both in ms or both in s (from 10 s on)."""
    mean, p99 = summary["mean_queue_delay_ms"], summary["p99_queue_delay_ms"]
    finite = [v for v in (mean, p99) if isinstance(v, (int, float)) and v == v]
    if finite and max(finite) >= SECONDS_ABOVE_MS:
        return f"mean {_fmt(mean / 1e3, ' s')}, p99 {_fmt(p99 / 1e3, ' s')}"
    return f"mean {_fmt(mean, ' ms')}, p99 {_fmt(p99, ' ms')}"


def print_summary(
    summary: dict[str, Any], out: Any = None, reasons: list[tuple[str, int]] | None = None
) -> None:
    """A compact, human-readable summary table (on stdout by default), with why requests
    were rejected (``reasons``, from :func:`reject_reasons`) and whether the queue grew."""
    out = sys.stdout if out is None else out
    rows = [
        (
            "requests",
            f"{summary['completed']} completed, {summary['num_rejected']} rejected, "
            f"{summary['num_cancelled']} cancelled of {summary['num_requests']}",
        ),
        ("duration", _fmt(summary["duration"], " s")),
        (
            "throughput",
            f"{_fmt(summary['request_throughput'])} req/s, "
            f"{_fmt(summary['output_throughput'])} output tok/s, "
            f"{_fmt(summary['total_token_throughput'])} total tok/s",
        ),
    ]
    if summary.get("request_goodput") == summary.get("request_goodput"):
        per_gpu = ""
        if "request_goodput_per_gpu" in summary:  # a cluster
            gpus = summary["num_gpus"]
            per_gpu = f", {_fmt(summary['request_goodput_per_gpu'])} per GPU ({gpus} GPUs)"
        rows.append(("goodput", f"{_fmt(summary['request_goodput'])} req/s within SLO{per_gpu}"))
    for index, (reason, count) in enumerate(reasons or []):
        rows.insert(1 + index, ("rejected", f"{count} × {reason}"))
    rows.append(("", "mean / median / p90 / p99"))
    for name in ("ttft", "tpot", "itl", "e2el"):
        rows.append((name.upper(), _latency_row(summary, name)))
    rows.extend(
        [
            ("queue delay", _queue_delay_row(summary)),
            (
                "iterations",
                f"{summary['num_iterations']}, mean batch {_fmt(summary['mean_batch_size'])}, "
                f"{summary['compute_bound_fraction']:.0%} compute-bound",
            ),
            (
                "waste",
                f"padding {summary['padding_fraction']:.1%} of computed tokens, "
                f"empty slots {summary['empty_slot_fraction']:.1%}",
            ),
            (
                "KV cache",
                f"max usage {summary['max_kv_cache_usage']:.1%} of "
                f"{summary['kv_cache_capacity_tokens']:,} tokens, "
                f"{summary['num_preemptions']} preemptions"
                + (f" ({summary['num_swaps']} by swapping)" if summary.get("num_swaps") else ""),
            ),
        ]
    )
    engine = summary.get("config", {}).get("engine", {})
    if engine.get("enable_prefix_caching"):
        rate = summary["prefix_cache_hit_rate"]
        found = "-" if rate != rate else f"{rate:.1%}"
        rows.append(("prefix cache", f"{found} of prompt tokens found cached"))
    stages = summary.get("config", {}).get("parallel", {}).get("pipeline_parallel_size", 1)
    if stages > 1:
        rows.append(
            ("pipeline", f"{stages} stages, bubble {summary['bubble_fraction']:.1%} of stage time")
        )
    if summary.get("num_kv_transfers"):  # disaggregated prefill/decode
        rows.append(
            (
                "KV transfer",
                f"mean {_fmt(summary['mean_kv_transfer_ms'])} ms after "
                f"{_fmt(summary['mean_kv_wait_ms'])} ms waiting, "
                f"{summary['mean_kv_transfer_bytes'] / 1e6:,.1f} MB per request; busy "
                f"prefill {summary['prefill_busy_fraction']:.0%}, "
                f"decode {summary['decode_busy_fraction']:.0%}",
            )
        )
    growth = summary.get("queue_delay_growth")
    if isinstance(growth, float) and growth > OVERLOAD_GROWTH:
        # a FIFO queue fed a factor rho faster than it is served grows by rho - 1 s per s
        after = next(i for i, (key, _) in enumerate(rows) if key == "queue delay") + 1
        rows.insert(
            after,
            (
                "warning",
                f"queue grows: arrivals ≈ {1 + growth:.2f}× what the engine serves "
                f"(queue_delay_growth {growth:.2f} s/s); latencies grow with the run's length",
            ),
        )
    rows.append(("wall time", _fmt(summary["wall_time_s"], " s")))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}", file=out)


def _replicas_line(replicas: Any) -> str:
    """``8 replicas (4 x h100-sxm TP2, 4 x a100-80gb), completed 61-64 each``."""
    groups: dict[tuple[str, int], int] = {}
    for hardware, tp in zip(replicas["hardware"], replicas["tensor_parallel_size"]):
        groups[(hardware, tp)] = groups.get((hardware, tp), 0) + 1
    kinds = ", ".join(
        f"{count} x {hardware}" + (f" TP{tp}" if tp > 1 else "")
        for (hardware, tp), count in groups.items()
    )
    completed = replicas["completed"]
    spread = f"{completed.min()}-{completed.max()}" if len(completed) > 1 else f"{completed.max()}"
    return f"{len(replicas)} replicas ({kinds}), completed {spread} each"


def _pools_line(cluster: Any) -> str:
    """``2 prefill + 2 decode instances, router least_outstanding, decode router least_kv,
    KV over infiniband-ndr-400 (after_prefill)``."""
    pools = cluster.disaggregation
    transfer = pools.kv_transfer
    link = transfer.link
    if not isinstance(link, str):
        link = f"{link.bandwidth_gb_s:g} GB/s, {link.latency_us:g} us"
    return (
        f"{pools.prefill.replicas} prefill + {pools.decode.replicas} decode instances, "
        f"router {cluster.router}, decode router {pools.decode_router}, KV over {link} "
        f"({transfer.mode})"
    )


def _engine_line(config: Any, setup: Any) -> str:
    """``continuous on llama-2-7b / a100-80gb (tp=1), KV cache ... tokens``."""
    block = config.engine.block_size
    return (
        f"{config.scheduler.policy} on {setup.model.name} / "
        f"{setup.hardware.name} (tp={config.parallel.tensor_parallel_size}), KV cache "
        f"{setup.num_gpu_blocks:,} blocks x {block} = {setup.num_gpu_blocks * block:,} tokens"
        + (
            f", host swap space {setup.num_cpu_blocks:,} blocks "
            f"({setup.swap_time_per_block * 1e3:.3f} ms per block over the host link)"
            if config.scheduler.preemption_mode == "swap"
            else ""
        )
    )
