"""Run the points of a study on an executor: skip finished ones, record each as it ends,
report progress. Studies that choose their next points from the last results (capacity's
bisection) submit from the callback."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from typing import Any, TextIO

from batchsim.errors import ConfigError
from batchsim.studies.backends import InlineExecutor, run_point
from batchsim.studies.store import Outcome, Point, PointStore

Callback = Callable[[Point, Outcome], None]


class Progress:
    """A progress bar with ETA on a terminal (tqdm), one line per point otherwise, or nothing.

    Args:
        mode: ``"auto"`` (a bar if ``stream`` is a terminal, else lines), ``"bar"``,
            ``"lines"`` or ``"off"``.
        search: The points are a search's, added as it goes (a capacity search): how many
            it will take is not known, so no total is shown, only the points run so far.
    """

    def __init__(
        self, what: str, mode: str = "auto", stream: TextIO | None = None, *, search: bool = False
    ):
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode
        self.what = what
        self.search = search
        self.total = 0
        self.done = 0
        self._bar: Any = None

    def add(self, count: int) -> None:
        self.total += count
        if self._bar is not None and not self.search:
            self._bar.total = self.total
            self._bar.refresh()

    def start(self) -> None:
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=None if self.search else self.total, initial=self.done,
                unit="rate" if self.search else "point", desc=self.what, file=self.stream,
                dynamic_ncols=True,
            )  # fmt: skip

    def update(self, point: Point, outcome: Outcome) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self.mode == "lines" and not outcome.resumed:
            status = f"{outcome.wall_time_s:.2f} s" if outcome.ok else f"failed: {outcome.error}"
            count = f": {self.done} so far;" if self.search else f" {self.done}/{self.total}"
            print(
                f"batchsim: {self.what}{count} {point.label}: {status}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Runner:
    """Runs points on ``executor``; with a ``store``, skips finished points and records each.

    Args:
        executor: Where points run.
        store: The study folder, or None to keep nothing on disk.
        write_csv: Write each point's ``requests.csv`` and ``iterations.csv`` too.
        progress: Progress reporting.
        max_in_flight: Points submitted to the executor at a time (default: twice its
            workers, one for an :class:`InlineExecutor`): each point is recorded as soon as
            it ends, and a large grid is not queued all at once.
    """

    def __init__(
        self,
        executor: Executor,
        store: PointStore | None,
        *,
        write_csv: bool,
        progress: Progress,
        max_in_flight: int | None = None,
    ):
        self.executor = executor
        self.store = store
        self.write_csv = write_csv
        self.progress = progress
        self._pending: dict[Future[Any], tuple[Point, Callback]] = {}
        self._ready: deque[tuple[Point, Outcome, Callback]] = deque()
        self._waiting: deque[tuple[Point, Callback]] = deque()
        self.max_in_flight = max_in_flight if max_in_flight is not None else _window(executor)
        self.num_resumed = 0
        self.num_run = 0

    def submit(self, point: Point, callback: Callback) -> None:
        """Run ``point`` (or take its finished outcome) and call ``callback`` with it, from
        :meth:`run_until_done`."""
        self.progress.add(1)
        if point.config is None:
            if self.store is not None:
                self.store.prepare(point)
            self._ready.append((point, Outcome(None, point.error, 0.0), callback))
            return
        if self.store is not None:
            previous = self.store.finished(point, self.write_csv)
            if previous is not None:
                self.num_resumed += 1
                self._ready.append((point, previous, callback))
                return
        self.num_run += 1
        self._waiting.append((point, callback))

    def _fill(self) -> None:
        while self._waiting and len(self._pending) < self.max_in_flight:
            point, callback = self._waiting.popleft()
            task = point.task()
            if self.store is not None:
                folder = self.store.prepare(point)
                if self.write_csv:
                    task["csv_dir"] = str(folder)
            self._pending[self.executor.submit(run_point, task)] = (point, callback)

    def run_until_done(self) -> None:
        """Wait for every submitted point, including those submitted by callbacks.

        Raises:
            ConfigError: A worker process died (killed, out of memory); the points that
                finished are recorded, so running the study again resumes it.
        """
        try:
            self._fill()  # a local pool forks its workers now, before the progress bar's thread
            self.progress.start()
            try:
                self._loop()
            finally:
                self.progress.close()
        except BrokenExecutor as exc:  # run_point never raises: a worker process died
            raise ConfigError(
                f"a worker process stopped abruptly ({type(exc).__name__}: killed, or out of "
                "memory? fewer --workers need less memory); the finished points are kept: "
                "rerun the same command to resume"
            ) from None

    def _loop(self) -> None:
        while self._ready or self._pending or self._waiting:
            while self._ready:
                point, outcome, callback = self._ready.popleft()
                self._finish(point, outcome, callback)
            self._fill()
            if not self._pending:
                continue
            done, _ = wait(list(self._pending), return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: self._pending[f][0].label):
                point, callback = self._pending.pop(future)
                reply = future.result()
                error, internal = reply["error"], bool(reply["internal"])
                if error and not internal:
                    error = _name_value(error, point)
                outcome = Outcome(
                    reply["summary"], error, float(reply["wall_time_s"]), internal=internal
                )
                self._finish(point, outcome, callback)

    def _finish(self, point: Point, outcome: Outcome, callback: Callback) -> None:
        if self.store is not None and not outcome.resumed:
            self.store.record(point, outcome, _values_record(point))
        self.progress.update(point, outcome)
        callback(point, outcome)


def _window(executor: Executor) -> int:
    if isinstance(executor, InlineExecutor):
        return 1
    workers = getattr(executor, "_max_workers", None) or getattr(executor, "num_cpus", None)
    return 2 * int(workers) if workers else 256


def _name_value(error: str, point: Point) -> str:
    """A point's error found while simulating (an unknown hardware name, a model that does not
    fit) names the varied value it is about, as errors found while loading do
    (``--grid hardware=h100: hardware: unknown name ...``)."""
    from batchsim.config import name_override

    return str(name_override(ConfigError(error), point.values, "--grid"))


def _values_record(point: Point) -> dict[str, Any]:
    from batchsim.studies.grid import cell

    return {key: cell(value) for key, value in point.values.items()}
