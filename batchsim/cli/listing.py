"""``batchsim list``: the built-in hardware profiles, models, framework presets, batching
policies and workloads."""

from __future__ import annotations

import argparse
from typing import Any

from batchsim.cli.tables import _print_rows

LIST_KINDS = ("hardware", "models", "frameworks", "policies", "workloads")


def add_list(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``list`` command to ``sub``."""
    p = sub.add_parser(
        "list",
        help="list built-in hardware, models, policies or workloads",
        description="List the built-in hardware profiles, models, batching policies or "
        "workloads (with trace samples, arrival processes and distributions).",
    )
    p.add_argument("kind", choices=LIST_KINDS, help="what to list: " + ", ".join(LIST_KINDS))
    p.set_defaults(func=_cmd_list)


def _cmd_list(args: argparse.Namespace) -> int:
    if args.kind == "hardware":
        from batchsim.catalog.hardware_files import hardware_table

        _print_rows(hardware_table())
    elif args.kind == "models":
        from batchsim.catalog.model_files import model_table

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
