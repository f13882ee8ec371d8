"""``batchsim plot`` and ``batchsim report``: a figure, or one HTML page, of saved results."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from batchsim.cli.args import _seconds, output_path


def add_plot(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``plot`` command to ``sub``."""
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
    p.add_argument(
        "-o",
        "--output",
        type=output_path,
        metavar="FILE",
        help="figure file (default: DIR/KIND.png)",
    )
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


def add_report(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``report`` command to ``sub``."""
    p = sub.add_parser(
        "report",
        help="one self-contained HTML page of a run or a study",
        description="Write one self-contained HTML page for a run, a sweep or a capacity "
        "study: the experiment, the summary table, the figures inline, the resolved config "
        "and, for a study, its table (sortable). No network and no external files.",
    )
    p.add_argument("dir", metavar="DIR", help="a result folder")
    p.add_argument(
        "-o", "--output", type=output_path, metavar="FILE", help="default: DIR/report.html"
    )
    p.set_defaults(func=_cmd_report)


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
