"""A progress line for ``batchsim run`` on a terminal.

While a long run simulates, stderr shows one line, rewritten in place::

    simulated 1,234 s, 123,456/1,000,000 requests done, 148,210 it/s, ETA 2m 10s

then what follows (summarizing, writing), and the line is cleared at the end. Nothing is shown
when stderr is not a terminal, nor for runs shorter than a few seconds. The engine calls the
progress object before every pass of its loop (:class:`~batchsim.engine.engine.Engine`'s
``on_step``); it counts down and looks at the clock only every few hundred calls, so the cost
per iteration is one call and one subtraction.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from batchsim.engine.engine import Engine

SHOW_AFTER_S = 3.0
"""Wall time after which the line appears (shorter runs show nothing)."""
REFRESH_S = 0.5
"""Least wall time between two rewrites of the line."""
CHECK_EVERY = 256
"""Engine loop passes between two looks at the clock."""


class RunProgress:
    """The progress line of one run (see the module docstring)."""

    def __init__(self, stream: TextIO, *, show_after_s: float = SHOW_AFTER_S):
        self.stream = stream
        self.start = time.monotonic()
        self._show_at = self.start + show_after_s
        self._next = self._show_at
        self._countdown = CHECK_EVERY
        self._shown = False

    @classmethod
    def for_terminal(cls, stream: Any = None) -> RunProgress | None:
        """A progress line on ``stream`` (stderr by default) if it is a terminal, else None."""
        stream = sys.stderr if stream is None else stream
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):  # no isatty, or closed
            tty = False
        return cls(stream) if tty else None

    def __call__(self, engine: Engine) -> None:
        """The engine's ``on_step``."""
        self._countdown -= 1
        if self._countdown:
            return
        self._countdown = CHECK_EVERY
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + REFRESH_S
        self._show(self.simulating_text(engine, now - self.start))

    @staticmethod
    def simulating_text(engine: Engine, elapsed: float) -> str:
        """The line while the engine runs, ``elapsed`` wall seconds after the start."""
        done = engine.request_log.num_rows
        total = engine.source.num_total
        rate = engine.iterations.num_rows / elapsed if elapsed > 0 else 0.0
        text = (
            f"simulated {engine.clock:,.0f} s, {done:,}/{total:,} requests done, {rate:,.0f} it/s"
        )
        if 0 < done < total:
            text += f", ETA {_duration(elapsed * (total - done) / done)}"
        return text

    def stage(self, text: str) -> None:
        """Say what the run does now (summarizing, writing), if the line is shown."""
        if self._shown or time.monotonic() >= self._show_at:
            self._show(f"{text} ...")

    def close(self) -> None:
        """Clear the line (nothing if it was never shown)."""
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _show(self, text: str) -> None:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self._write("\r\x1b[K" + text[: max(width, 10)])
        self._shown = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken terminal: no progress, no error
            pass


def _duration(seconds: float) -> str:
    """``45s``, ``2m 10s``, ``1h 05m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
