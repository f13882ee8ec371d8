"""``batchsim list``: the built-in hardware profiles, models, framework presets, batching
policies, workloads and experiments."""

from __future__ import annotations

import argparse
from typing import Any

from batchsim.cli.tables import _print_rows

LIST_KINDS = ("hardware", "models", "frameworks", "policies", "workloads", "experiments")


def add_list(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``list`` command to ``sub``."""
    p = sub.add_parser(
        "list",
        help="list built-in hardware, models, policies, workloads or experiments",
        description="List the built-in hardware profiles, models, batching policies, "
        "workloads (with trace samples, arrival processes and distributions) or experiments "
        "(with the command that runs each and what it shows).",
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
    elif args.kind == "experiments":
        _print_rows(experiment_table())
        print(
            "\nrun one by name (batchsim run quickstart) or by file; the comments at the top "
            "of each file say what to compare"
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


def experiment_table() -> list[dict[str, str]]:
    """The shipped experiments: name, the command that runs them (``run``; for a file with a
    ``sweep:`` block, the first of ``batchsim sweep`` and ``batchsim capacity`` its comments
    name, ``sweep`` if neither) and their ``description:``."""
    import re

    from batchsim.catalog import catalog_dir, catalog_names
    from batchsim.yamlio import read_mapping

    rows = []
    for name in catalog_names("experiments"):
        path = catalog_dir("experiments") / f"{name}.yaml"
        data, text = read_mapping(path)
        comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
        named = re.search(r"batchsim (sweep|capacity)\b", comments)
        command = "run" if "sweep" not in data else named.group(1) if named else "sweep"
        description = str(data.get("description") or "").strip()
        rows.append({"experiment": name, "command": command, "what it shows": description})
    return rows
