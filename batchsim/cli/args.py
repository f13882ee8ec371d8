"""Argument types and help texts that several commands' options share: :func:`positive_int`,
:func:`_seconds` and the help of ``--set``."""

from __future__ import annotations

import argparse
import math

SET_HELP = (
    "set a key of the experiment to a YAML value, e.g. scheduler.max_num_seqs=8 or "
    "'workload.arrival={process: all_at_once}' (a mapping replaces the whole block); repeat "
    "the option to set several keys, applied in order; file paths are relative to the "
    "working directory"
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


def output_path(text: str) -> str:
    """An argparse type: a path to write (``-o``); an empty one is an error, not the default
    (a script's ``-o "$DIR"`` with ``DIR`` unset must not write elsewhere)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path to write, got {text!r} (empty)")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value
