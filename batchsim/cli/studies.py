"""``batchsim sweep`` and ``batchsim capacity``: studies of many simulations of one experiment
(a grid of overrides; the highest arrival rate each configuration sustains), their options and
the tables they print."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from batchsim.cli.args import SET_HELP, output_path, positive_int
from batchsim.cli.tables import _fmt, _table_text
from batchsim.errors import ConfigError


def add_sweep(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``sweep`` command to ``sub``."""
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
    _study_arguments(p, "sweep")
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


def add_capacity(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``capacity`` command to ``sub``."""
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
    _study_arguments(p, "capacity")
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


def _study_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    """The options ``sweep`` and ``capacity`` share (``kind``: the command, for the default
    folder)."""
    from batchsim.studies.grid import VALUES_HELP

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
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help=SET_HELP)
    p.add_argument(
        "-o",
        "--output",
        type=output_path,
        metavar="DIR",
        help=f"study folder (default: runs/NAME-{kind}); rerunning into it skips finished points",
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
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress (the points as they run); the table and errors still print",
    )


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


def _workers(args: argparse.Namespace, num_parallel: int, what: str) -> int | None:
    """``--workers``, at most the simulations that can run at once (``num_parallel``): a
    larger pool would only start idle processes. Says so when it caps the number given; the
    default (the cores) is capped silently, and stays a pool when it was one (the points run
    in this process only when asked to or on one core)."""
    if args.backend != "local":
        return args.workers
    if args.workers is None:
        from batchsim.studies.backends import default_workers

        cores = default_workers()
        return cores if cores <= 1 else min(cores, max(2, num_parallel))
    if args.workers <= num_parallel:
        return args.workers
    count = max(1, num_parallel)
    print(
        f"batchsim: --workers {args.workers} capped at {count}, the {what}",
        file=sys.stderr,
    )
    return count


def _progress_mode(args: argparse.Namespace) -> str:
    return "off" if args.quiet else "auto"


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
    num_points = math.prod(len(axis.values) for axis in axes) * seeds
    workers = _workers(args, num_points, "points to run" if num_points != 1 else "point to run")
    with open_executor(args.backend, workers, args.address) as executor:
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
    num_searches = math.prod(len(axis.values) for axis in axes)  # each one rate at a time
    what = "configurations to search" if num_searches != 1 else "configuration to search"
    workers = _workers(args, num_searches, what)
    with open_executor(args.backend, workers, args.address) as executor:
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
