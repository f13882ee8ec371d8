"""The ``batchsim`` command: run, validate, roofline, list.

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback), 1 internal error.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchsim.errors import ConfigError

LIST_KINDS = ("hardware", "models", "policies", "workloads")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as ConfigError (exit 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        text = f"{value:,.2f}" if abs(value) < 1e6 else f"{value:.3g}"
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
        rows.append(("goodput", f"{_fmt(summary['request_goodput'])} req/s within SLO"))
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
            ("wall time", _fmt(summary["wall_time_s"], " s")),
        ]
    )
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}", file=out)


def _cmd_run(args: argparse.Namespace) -> int:
    from batchsim.config import load_experiment, parse_override
    from batchsim.simulation import simulate

    overrides = dict(parse_override(item) for item in args.set)
    config = load_experiment(args.experiment, overrides)
    result = simulate(config, Path(args.experiment).parent)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    out_dir = Path(args.output) if args.output else Path("runs") / config.name
    result.write(out_dir)
    print(
        f"batchsim: {config.name} — {config.scheduler.policy} on {config.model} / {config.hardware}"
    )
    print_summary(result.summary)
    print(f"  wrote {out_dir}/{{summary.json,requests.csv,iterations.csv,config.yaml}}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from batchsim.config import load_experiment, parse_override, unused_scheduler_keys
    from batchsim.scheduler.registry import load_policy
    from batchsim.simulation import build
    from batchsim.workload import generate

    overrides = dict(parse_override(item) for item in args.set)
    config = load_experiment(args.experiment, overrides)
    policy = load_policy(config.scheduler.policy)
    setup = build(config)
    # Everything `run` checks before simulating: draw the workload too (cheap), so a trace or a
    # distribution that `run` would reject is rejected here with the same message.
    generate(config.workload, config.seed, Path(args.experiment).parent)
    for key in unused_scheduler_keys(config, policy.config_keys):
        print(
            f"note: scheduler.{key} is not used by policy {config.scheduler.policy}",
            file=sys.stderr,
        )
    block = config.engine.block_size
    print(
        f"{args.experiment}: ok — {config.scheduler.policy} on {setup.model.name} / "
        f"{setup.hardware.name} (tp={config.parallel.tensor_parallel_size}), KV cache "
        f"{setup.num_gpu_blocks:,} blocks x {block} = {setup.num_gpu_blocks * block:,} tokens"
        + (
            f", host swap space {setup.num_cpu_blocks:,} blocks "
            f"({setup.swap_time_per_block * 1e3:.3f} ms per block over the host link)"
            if config.scheduler.preemption_mode == "swap"
            else ""
        )
    )
    return 0


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
    elif args.kind == "policies":
        from batchsim.scheduler.registry import POLICIES

        rows = []
        for name, cls in POLICIES.items():
            doc = ((cls.__module__ and sys.modules[cls.__module__].__doc__) or "").strip()
            rows.append(
                {
                    "policy": name,
                    "keys": ", ".join(sorted(cls.config_keys - {"policy"})),
                    "what": doc.splitlines()[0] if doc else "",
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="batchsim", description=__doc__.splitlines()[0] if __doc__ else None)
    from batchsim import __version__

    parser.add_argument("--version", action="version", version=f"batchsim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="simulate an experiment and write its outputs")
    p.add_argument("experiment", help="experiment YAML (or a built-in experiment name)")
    p.add_argument("-o", "--output", help="output directory (default: runs/<name>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a key, e.g. --set scheduler.max_num_seqs=8",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("validate", help="check an experiment without running it")
    p.add_argument("experiment")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    p.set_defaults(func=_cmd_validate)

    from batchsim import roofline

    p = sub.add_parser("roofline", help="per-iteration time, FLOPs, bytes and bound of shapes")
    roofline.add_arguments(p)
    p.set_defaults(func=roofline.run)

    p = sub.add_parser("list", help="list built-in hardware, models, policies or workloads")
    p.add_argument("kind", choices=LIST_KINDS)
    p.set_defaults(func=_cmd_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchsim`` console script; returns the exit code."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"batchsim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
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
    sys.exit(main())
