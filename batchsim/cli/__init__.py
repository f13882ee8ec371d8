"""The ``batchsim`` command line: run, sweep, capacity, plot, report, validate, roofline,
calibrate, kernel, list.

Exit codes: 0 ok, 2 bad input (one line on stderr, no traceback), 1 internal error, 130/143
when interrupted by SIGINT/SIGTERM.

This module owns the parser, the entry points (:func:`main`, :func:`console_main`), the exit
codes and the signal handling. Each family of commands has its own module, holding its options
and its run: :mod:`~batchsim.cli.run` (run, validate), :mod:`~batchsim.cli.studies` (sweep,
capacity), :mod:`~batchsim.cli.pictures` (plot, report), :mod:`~batchsim.cli.calibrate`,
:mod:`~batchsim.cli.kernel` (kernel), :mod:`~batchsim.cli.listing` (list); ``roofline``
is :mod:`batchsim.roofline`. They import their heavy libraries inside the commands, so that
``--help`` and ``--version`` load none.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from batchsim.cli import calibrate, kernel, listing, pictures, run, studies
from batchsim.errors import ConfigError, Interrupted

COMMANDS = (
    "run",
    "sweep",
    "capacity",
    "plot",
    "report",
    "validate",
    "roofline",
    "calibrate",
    "kernel",
    "list",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as ConfigError (exit 2, one line)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if self.prog == "batchsim" and "arguments are required" in message:
            # bare `batchsim` (the command is its only required argument): show the usage
            self.print_usage(sys.stderr)
            raise ConfigError(f"a command is required: {', '.join(COMMANDS)} (see batchsim --help)")
        raise ConfigError(f"{message} (see {self.prog} --help)")


DESCRIPTION = (
    "Simulate an LLM serving engine's batching policies (static, dynamic, continuous, chunked "
    "prefill) with a roofline cost model, without a GPU."
)
EPILOG = (
    "Exit codes: 0 ok; 2 bad input, reported as one line on stderr; 1 an internal error (a "
    "bug); 130 or 143 when interrupted by SIGINT or SIGTERM. 'batchsim COMMAND --help' "
    "describes a command."
)


def engine_build() -> str:
    """How the installed engine loop runs: compiled by mypyc (``pip install .``, see
    ``hatch_build.py``) or pure Python (an editable install, or a build that could not
    compile). Looks for the extension module without importing the engine."""
    from importlib.machinery import EXTENSION_SUFFIXES
    from pathlib import Path

    folder = Path(__file__).parents[1] / "engine"
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
    run.add_run(sub)
    studies.add_sweep(sub)
    studies.add_capacity(sub)
    pictures.add_plot(sub)
    pictures.add_report(sub)
    run.add_validate(sub)

    from batchsim import roofline

    p = sub.add_parser(
        "roofline",
        help="per-iteration time, FLOPs, bytes and bound of shapes",
        description=roofline.DESCRIPTION,
    )
    roofline.add_arguments(p)
    p.set_defaults(func=roofline.run)

    calibrate.add_calibrate(sub)
    kernel.add_kernel(sub)
    listing.add_list(sub)
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


class _Terminated(Interrupted):
    """SIGTERM, raised like Ctrl-C so that clean-up code (``finally``) runs."""


def _on_sigint(signum: int, frame: Any) -> None:
    raise Interrupted  # a KeyboardInterrupt that says it came from the user, not a policy


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
    # Ctrl-C as Python raises it, told apart from a KeyboardInterrupt a policy raises (which
    # is that policy's error); a caller's own SIGINT handler (or SIG_IGN) is left alone
    sigint = installed and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if sigint:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        return _main(argv)
    except _Terminated:
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)


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
