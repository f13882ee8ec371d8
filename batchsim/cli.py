"""The ``batchsim`` command line: run, sweep, capacity, plot, report, validate, roofline,
calibrate, list.

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback), 1 internal error, 130/143
when interrupted by SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchsim.errors import ConfigError, write_error

COMMANDS = (
    "run",
    "sweep",
    "capacity",
    "plot",
    "report",
    "validate",
    "roofline",
    "calibrate",
    "list",
)
LIST_KINDS = ("hardware", "models", "frameworks", "policies", "workloads")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as ConfigError (exit 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.prog == "batchsim" and "arguments are required" in message:
            # bare `batchsim` (the command is its only required argument): show the usage
            self.print_usage(sys.stderr)
            raise ConfigError(f"a command is required: {', '.join(COMMANDS)} (see batchsim --help)")
        raise ConfigError(f"{message} (see {self.prog} --help)")


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        if 0 < abs(value) < 0.1:  # two significant digits, not two decimals: 0.025, not 0.03
            text = f"{value:.2g}"
        elif abs(value) < 1e6:
            text = f"{value:,.2f}"
        else:  # whole numbers with separators, as the smaller ones (up to a trillion)
            text = f"{value:,.0f}" if abs(value) < 1e12 else f"{value:.3g}"
        return text + unit
    return f"{value}{unit}"


def print_summary(summary: dict[str, Any], out: Any = None) -> None:
    """A compact, human-readable summary table (on stdout by default)."""
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
    rows.append(("", "mean / median / p90 / p99 (ms)"))
    for name in ("ttft", "tpot", "itl", "e2el"):
        stats = " / ".join(
            _fmt(summary[f"{s}_{name}_ms"]) for s in ("mean", "median", "p90", "p99")
        )
        rows.append((name.upper(), stats))
    rows.extend(
        [
            (
                "queue delay",
                f"mean {_fmt(summary['mean_queue_delay_ms'])} ms, "
                f"p99 {_fmt(summary['p99_queue_delay_ms'])} ms",
            ),
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
    print(
        f"batchsim: {config.name} — {config.scheduler.policy} on {config.model} / {config.hardware}"
    )
    if config.cluster is not None and config.cluster.disaggregation is not None:
        print(f"  {_pools_line(config.cluster)}")
    elif config.cluster is not None:
        print(f"  {_replicas_line(result.replicas)}, router {config.cluster.router}")
    print_summary(result.summary)
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


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("(none)")
        return
    keys = list(rows[0])
    cells = [
        [_fmt(r.get(k)) if not isinstance(r.get(k), str) else r[k] for k in keys] for r in rows
    ]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)).rstrip())
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())


def _cmd_list(args: argparse.Namespace) -> int:
    if args.kind == "hardware":
        from batchsim.catalog.hardware import hardware_table

        _print_rows(hardware_table())
    elif args.kind == "models":
        from batchsim.catalog.model import model_table

        _print_rows(model_table())
    elif args.kind == "frameworks":
        from batchsim.catalog.frameworks import framework_table

        _print_rows(framework_table())
        print(
            "\nengine.framework: NAME fills the keys above that the experiment does not set "
            "(experiment key > preset > hardware profile); sources in frameworks/NAME.yaml"
        )
    elif args.kind == "policies":
        from batchsim.scheduler.registry import POLICIES, policy_summary

        rows = []
        for name, cls in POLICIES.items():
            rows.append(
                {
                    "policy": name,
                    "keys": ", ".join(sorted(cls.config_keys - {"policy"})),
                    "what": policy_summary(cls),
                }
            )
        _print_rows(rows)
        print(
            "\nout-of-tree: scheduler.policy: package.module:Class "
            "(a batchsim.scheduler.Scheduler subclass)"
        )
    else:
        from batchsim.workload import workload_table

        rows = workload_table()
        titles = {
            "workload": "Built-in workloads (workload: NAME)",
            "trace": "Trace samples (workload.trace.path: FILE)",
            "arrival": "Arrival processes (workload.arrival.process)",
            "length": "Length distributions (workload.prompt_tokens / output_tokens .dist)",
            "time": "Time distributions (workload.think_time_ms / cancel_after_ms .dist)",
            "trace-format": "Trace formats (workload.trace.format)",
        }
        for kind, title in titles.items():
            group = [r for r in rows if r["kind"] == kind]
            if not group:
                continue
            print(f"{title}:")
            for r in group:
                extra = ""
                if r.get("requests"):
                    extra = (
                        f" [{r['requests']} requests, mean prompt {r['mean_prompt_tokens']:.0f}, "
                        f"mean output {r['mean_output_tokens']:.0f}]"
                    )
                print(f"  {r['name']:<32} {r['description']}{extra}")
                if r.get("parameters") and kind not in ("workload", "trace"):
                    print(f"  {'':<32}   {r['parameters']}")
            print()
    return 0


def _study_source(args: argparse.Namespace) -> Any:
    """The base experiment with its ``--set`` overrides, and the study's axes."""
    from batchsim.config import ExperimentSource, parse_override
    from batchsim.studies.grid import parse_grid_item, zip_axis
    from batchsim.studies.sweep import block_axes, grid_axes, merge_axes

    overrides = dict(parse_override(item) for item in args.set)
    source = ExperimentSource.read(args.experiment)
    if overrides:
        try:
            source.load(overrides)
        except ConfigError as exc:
            if (exc.source or "").startswith("--set"):
                raise
        source = source.with_overrides(overrides)
    block, block_seeds = block_axes(source)
    given = grid_axes([parse_grid_item(item) for item in args.grid], "--grid")
    if args.zip:
        group = dict(parse_grid_item(item, "--zip") for item in args.zip)
        given.append(zip_axis(group, "--zip"))
    return source, merge_axes(block, given), block_seeds


def _study_dir(args: argparse.Namespace, source: Any, suffix: str) -> Path:
    if args.output:
        return Path(args.output)
    name = source.data.get("name") if isinstance(source.data.get("name"), str) else None
    return Path("runs") / f"{name or 'experiment'}-{suffix}"


def _progress_mode(args: argparse.Namespace) -> str:
    return "off" if args.quiet else "auto"


def _table_text(frame: Any, columns: list[str], max_rows: int = 60) -> list[str]:
    rows = []
    for _, record in frame.head(max_rows).iterrows():
        cells = []
        for column in columns:
            value = record[column]
            if isinstance(value, float):
                cells.append(_fmt(value))
            else:
                cells.append("" if value is None else str(value))
        rows.append(cells)
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)
    ]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if len(frame) > max_rows:
        lines.append(f"... {len(frame) - max_rows} more rows")
    return lines


def _cmd_sweep(args: argparse.Namespace) -> int:
    from batchsim.studies.backends import open_executor
    from batchsim.studies.sweep import KEY_METRICS, MAX_SEEDS, SweepPlan, run_sweep

    source, axes, block_seeds = _study_source(args)
    seeds = args.seeds if args.seeds is not None else block_seeds
    if not 1 <= seeds <= MAX_SEEDS:
        raise ConfigError(f"--seeds must be from 1 to {MAX_SEEDS}, got {seeds}")
    plan = SweepPlan(source, axes, seeds)
    out_dir = _study_dir(args, source, "sweep")
    from batchsim.studies.store import check_study_dir

    check_study_dir(out_dir, "sweep")
    with open_executor(args.backend, args.workers, args.address) as executor:
        result = run_sweep(
            plan,
            executor,
            out_dir=out_dir,
            write_csv=not args.summary_only,
            progress=_progress_mode(args),
        )
    if result.num_failed == len(result.points) and not result.num_internal:
        first = result.outcomes[0].error
        raise ConfigError(
            first
            if len(result.points) == 1
            else f"every point failed (see {out_dir}/sweep.csv); the first: {first}"
        )
    table = result.stats if result.stats is not None else result.table
    varied = [k for k in plan.varied if k != "seed" or result.stats is None]
    metrics = [m for m in KEY_METRICS if m in table.columns]
    caching = any(
        p.config is not None and p.config.engine.enable_prefix_caching for p in result.points
    )
    rates = result.table.get("prefix_cache_hit_rate")
    if not caching and (rates is None or not (rates > 0).any()):
        metrics = [m for m in metrics if m != "prefix_cache_hit_rate"]  # 0 without a cache
    if result.stats is not None:
        for m in metrics:
            table = table.assign(
                **{m: [f"{_fmt(v)} ± {_fmt(c)}" for v, c in zip(table[m], table[f"{m}_ci95"])]}
            )
    columns = [
        *varied,
        *metrics,
        "error",
    ]
    if not (table["error"] != "").any():
        columns.remove("error")
    if not args.quiet:
        print(f"batchsim sweep: {len(result.points)} points of {source.source or 'the experiment'}")
        for line in _table_text(table, columns):
            print(f"  {line}")
        files = "sweep.csv,sweep.parquet" + (
            ",sweep_stats.csv,sweep_stats.parquet" if result.stats is not None else ""
        )
        print(
            f"  wrote {out_dir}/{{{files}}} and points/ "
            f"({len(result.points) - result.num_resumed} run, {result.num_resumed} already done)"
        )
    if result.num_failed:
        print(
            f"batchsim: {result.num_failed} of {len(result.points)} points failed "
            f"(see the error column of {out_dir}/sweep.csv)",
            file=sys.stderr,
        )
    return 1 if result.num_internal else 0


def _cmd_capacity(args: argparse.Namespace) -> int:
    from batchsim.studies.backends import open_executor
    from batchsim.studies.capacity import make_plan, run_capacity

    source, axes, _ = _study_source(args)
    cplan = make_plan(source, axes, args.slo, args.attainment, args.rtol, args.max_queue_growth)
    out_dir = _study_dir(args, source, "capacity")
    from batchsim.studies.store import check_study_dir

    check_study_dir(out_dir, "capacity")
    with open_executor(args.backend, args.workers, args.address) as executor:
        table = run_capacity(cplan, executor, out_dir=out_dir, progress=_progress_mode(args))
    internal = table.attrs.get("num_internal", 0)
    if len(table) and (table["error"] != "").all() and not internal:
        first = table["error"].iloc[0]
        raise ConfigError(
            first
            if len(table) == 1
            else f"every configuration failed (see {out_dir}/capacity.csv); the first: {first}"
        )
    shown = [
        m
        for m in (
            "max_request_rate",
            "max_request_rate_per_gpu",
            *cplan.judge.slo,
            "limited_by",
            "error",
        )
        if m in table.columns
    ]
    if not (table["error"] != "").any():
        shown.remove("error")
    if not args.quiet:
        slo = ", ".join(f"{k} <= {v:g}" for k, v in cplan.judge.slo.items())
        if cplan.judge.attainment is not None:
            slo = f"{cplan.judge.attainment:.0%} of requests within {slo}"
        print(
            f"batchsim capacity: the highest arrival rate (req/s) sustained with {slo} "
            "and a queue that does not grow"
        )
        for line in _table_text(table, [*cplan.plan.varied, *shown]):
            print(f"  {line}")
        print(f"  wrote {out_dir}/{{capacity.csv,capacity.parquet}} and points/")
    if internal:
        print(
            f"batchsim: {internal} simulated rates stopped with an internal error (a bug; see "
            f"the error and limited_by columns of {out_dir}/capacity.csv)",
            file=sys.stderr,
        )
    return 1 if internal else 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from batchsim.plots import PlotOptions, check_options, figure, module
    from batchsim.plots.style import save

    module(args.kind)  # an unknown kind or option is an error before anything is read
    options = PlotOptions(metrics=list(args.metric), start=args.start, end=args.end)
    check_options(args.kind, options)
    out = Path(args.output) if args.output else Path(args.dirs[0]) / f"{args.kind}.png"
    fig = figure(args.kind, list(args.dirs), options)
    save(fig, out)
    print(f"wrote {out}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from batchsim.plots.report import write_report

    out = Path(args.output) if args.output else Path(args.dir) / "report.html"
    write_report(args.dir, out)
    print(f"wrote {out}")
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


DESCRIPTION = (
    "Simulate an LLM serving engine's batching policies (static, dynamic, continuous, chunked "
    "prefill) with a roofline cost model, without a GPU."
)
EPILOG = (
    "Exit codes: 0 ok; 2 bad input, reported as one line on stderr; 1 an internal error (a "
    "bug); 130 or 143 when interrupted by SIGINT or SIGTERM. 'batchsim COMMAND --help' "
    "describes a command."
)
SET_HELP = (
    "set a key of the experiment to a YAML value, e.g. scheduler.max_num_seqs=8 or "
    "'workload.arrival={process: all_at_once}' (a mapping replaces the whole block); repeat "
    "the option to set several keys, applied in order; file paths are relative to the "
    "working directory"
)


def engine_build() -> str:
    """How the installed engine loop runs: compiled by mypyc (``pip install .``, see
    ``hatch_build.py``) or pure Python (an editable install, or a build that could not
    compile). Looks for the extension module without importing the engine."""
    from importlib.machinery import EXTENSION_SUFFIXES
    from pathlib import Path

    folder = Path(__file__).parent / "engine"
    if any((folder / f"engine{suffix}").is_file() for suffix in EXTENSION_SUFFIXES):
        return "engine compiled with mypyc"
    return "pure Python"


def build_parser() -> argparse.ArgumentParser:
    """The ``batchsim`` argument parser with its four commands."""
    parser = _Parser(prog="batchsim", description=DESCRIPTION, epilog=EPILOG)
    from batchsim.version import __version__

    parser.add_argument(
        "--version",
        action="version",
        version=f"batchsim {__version__} ({engine_build()})",
        help="print the version (and whether the engine loop is compiled)",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="{" + ",".join(COMMANDS) + "}"
    )

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

    from batchsim.studies.grid import VALUES_HELP

    def study_arguments(p: argparse.ArgumentParser, kind: str) -> None:
        p.add_argument("experiment", help="experiment YAML file, or a built-in experiment name")
        p.add_argument(
            "--grid",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUES",
            help="an axis of the grid (repeat for the cartesian product); "
            + VALUES_HELP
            + "; replaces the sweep: block's axis of the same key",
        )
        p.add_argument(
            "--zip",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUES",
            help="keys that vary together: every --zip item joins one axis whose i-th point "
            "takes the i-th value of each (all with as many values)",
        )
        p.add_argument(
            "--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP
        )
        p.add_argument(
            "-o",
            "--output",
            metavar="DIR",
            help=f"study folder (default: runs/NAME-{kind}); rerunning into it skips "
            "finished points",
        )
        p.add_argument(
            "--workers",
            type=positive_int,
            metavar="N",
            help="parallel simulations (default: the cores of this machine; 1 runs them in "
            "this process)",
        )
        p.add_argument(
            "--backend",
            choices=("local", "ray"),
            default="local",
            help="local: a process pool on this machine (default); ray: a Ray cluster "
            "(pip install 'batchsim[ray]')",
        )
        p.add_argument(
            "--address",
            metavar="ADDR",
            help="Ray cluster address (auto, or ray://HOST:10001); default: start a local Ray",
        )
        p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")

    p = sub.add_parser(
        "sweep",
        help="simulate a grid of overrides; one table row per point",
        description="Simulate the experiment at every point of a grid (the experiment's "
        "sweep: block and --grid/--zip axes; the cartesian product of the axes), write one "
        "folder per point under DIR/points/ and DIR/sweep.csv and sweep.parquet with one row per "
        "point: the varied keys, seed, every summary metric, wall_time_s and error. A failing "
        "point records its error and the sweep goes on; rerunning skips finished points.",
        epilog="Example: batchsim sweep experiments/knee-llama2-7b-a100.yaml "
        "--grid scheduler.max_num_seqs=pow2:1..512",
    )
    study_arguments(p, "sweep")
    p.add_argument(
        "--seeds",
        type=positive_int,
        metavar="N",
        help="repeat every point with seeds seed, seed+1, ..., seed+N-1; sweep_stats.csv gets "
        "each metric's mean and 95%% confidence interval",
    )
    p.add_argument(
        "--summary-only",
        action="store_true",
        help="write only config.yaml and summary.json per point (no requests.csv, iterations.csv)",
    )
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser(
        "capacity",
        help="the highest arrival rate each configuration sustains within an SLO",
        description="For the experiment (or each configuration of a grid), search the highest "
        "workload.arrival.rate at which every SLO holds and the queue does not grow "
        "(queue_delay_growth <= --max-queue-growth): double or halve the experiment's rate to "
        "bracket it, then bisect to --rtol. Writes DIR/capacity.csv and capacity.parquet: the "
        "varied keys, max_request_rate, max_request_rate_per_gpu, limited_by and the summary "
        "metrics at that rate.",
        epilog="Example: batchsim capacity experiments/capacity-policies.yaml "
        "--slo p99_ttft_ms=2000 --slo p99_tpot_ms=100",
    )
    study_arguments(p, "capacity")
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=LIMIT",
        help="a summary latency metric and its limit in ms (p90_ttft_ms=2000, p99_tpot_ms=200, "
        "mean_e2el_ms=...); with --attainment, a per-request limit (ttft_ms, tpot_ms, e2el_ms)",
    )
    p.add_argument(
        "--attainment",
        type=float,
        metavar="FRACTION",
        help="the fraction of requests that must meet every --slo (DistServe's SLO attainment)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=0.02,
        help="relative tolerance of the rate search (default 0.02)",
    )
    p.add_argument(
        "--max-queue-growth",
        type=float,
        default=0.05,
        metavar="G",
        help="stability: the largest queue_delay_growth (seconds of queueing delay added per "
        "second of arrivals) a sustained rate may have (default 0.05)",
    )
    p.set_defaults(func=_cmd_capacity)

    from batchsim.plots import KINDS

    p = sub.add_parser(
        "plot",
        help="draw a figure of saved runs, sweeps or capacity studies",
        description="Draw a figure from result folders (batchsim run, sweep or capacity "
        "output) into a .png, .svg or .pdf file. Kinds: "
        + "; ".join(f"{kind}: {what}" for kind, (_, what) in KINDS.items())
        + ".",
    )
    p.add_argument("kind", choices=list(KINDS), metavar="KIND", help=", ".join(KINDS))
    p.add_argument("dirs", nargs="+", metavar="DIR", help="result folders to draw")
    p.add_argument("-o", "--output", metavar="FILE", help="figure file (default: DIR/KIND.png)")
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME",
        help="knee: the latency on the right axis (default p99_itl_ms); sweep: a summary "
        "metric per panel (repeat for up to four); other kinds take none",
    )
    p.add_argument(
        "--from", dest="start", type=_seconds, metavar="S", help="timeline, kv: start time (s)"
    )
    p.add_argument(
        "--to", dest="end", type=_seconds, metavar="S", help="timeline, kv: end time (s)"
    )
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser(
        "report",
        help="one self-contained HTML page of a run or a study",
        description="Write one self-contained HTML page for a run, a sweep or a capacity "
        "study: the experiment, the summary table, the figures inline, the resolved config "
        "and, for a study, its table (sortable). No network and no external files.",
    )
    p.add_argument("dir", metavar="DIR", help="a result folder")
    p.add_argument("-o", "--output", metavar="FILE", help="default: DIR/report.html")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser(
        "validate",
        help="check an experiment without running it",
        description="Check an experiment and its --set overrides, load its hardware and model "
        "and size its KV cache, without simulating; writes nothing.",
    )
    p.add_argument("experiment", help="experiment YAML file, or a built-in experiment name")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)
    p.set_defaults(func=_cmd_validate)

    from batchsim import roofline

    p = sub.add_parser(
        "roofline",
        help="per-iteration time, FLOPs, bytes and bound of shapes",
        description=roofline.DESCRIPTION,
    )
    roofline.add_arguments(p)
    p.set_defaults(func=roofline.run)

    from batchsim.calibration import command as calibrate

    p = sub.add_parser(
        "calibrate",
        help="fit a hardware profile's terms to your own measurements",
        description=calibrate.DESCRIPTION,
        epilog=calibrate.EPILOG,
    )
    calibrate.add_arguments(p)
    p.set_defaults(func=calibrate.run)

    p = sub.add_parser(
        "list",
        help="list built-in hardware, models, policies or workloads",
        description="List the built-in hardware profiles, models, batching policies or "
        "workloads (with trace samples, arrival processes and distributions).",
    )
    p.add_argument("kind", choices=LIST_KINDS, help="what to list: " + ", ".join(LIST_KINDS))
    p.set_defaults(func=_cmd_list)
    return parser


def _name_set_item(error: ConfigError, args: argparse.Namespace | None) -> ConfigError:
    """An error about a key given with ``--set`` names that item (errors found after loading,
    e.g. an unknown hardware name)."""
    items = getattr(args, "set", None) or []
    from batchsim.config import name_override, parse_override

    try:
        overrides = dict(parse_override(item) for item in items)
    except ConfigError:
        return error
    return name_override(error, overrides)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that clean-up code (``finally``) runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut clean-up short
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchsim`` console script; returns the exit code.

    SIGTERM and SIGINT (Ctrl-C) stop a run the same way: temporary files are removed and the
    exit code is 128 + the signal number (143, 130).
    """
    installed = threading.current_thread() is threading.main_thread()  # else not allowed
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if installed else None
    try:
        return _main(argv)
    except _Terminated:
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def console_main() -> int:
    """Entry point of the ``batchsim`` console script and ``python -m batchsim``: :func:`main`,
    then a quick exit.

    :func:`gc.freeze` before the interpreter exits spares its final garbage collections, which
    scan every object the imports created (~40 ms after a run, more than the simulation of a
    small experiment). Objects still alive then are released with the process. Code that calls
    :func:`main` in a process that goes on is not affected.

    Pydantic's plugins are turned off (``PYDANTIC_DISABLE_PLUGINS=__all__``, unless the
    variable is set): looking for them reads the metadata of every installed package when the
    first config model is built (~25 ms of every command), and batchsim's config models need
    none.
    """
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    code = main()
    gc.freeze()
    return code


def _main(argv: Sequence[str] | None) -> int:
    args: argparse.Namespace | None = None
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version
            return exc.code if isinstance(exc.code, int) else 0
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"batchsim: error: {_name_set_item(exc, args)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except Exception:
        traceback.print_exc()
        print(
            "batchsim: internal error (a bug; please report it with the command above)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(console_main())
