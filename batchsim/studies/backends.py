"""Where the points of a study run: in this process, a local process pool, a Ray cluster, or
any :class:`concurrent.futures.Executor` (a Dask ``Client.get_executor()`` included).

A point travels to a worker as a plain dict (the resolved config) and comes back as a small
dict (the summary, or the error): no result object is pickled. :func:`run_point` is the one
function every backend runs.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

from batchsim.errors import ConfigError

BACKENDS = ("local", "ray")

CSV_FILES = (
    "requests.csv",
    "iterations.csv",
    "slots.csv",
    "replicas.csv",
    "requests.parquet",
    "iterations.parquet",
    "slots.parquet",
    "replicas.parquet",
)
"""The per-request and per-iteration tables a worker may write into its point's folder, in the
point's ``output.format`` (slots only for runs that record their slots, iterations unless
``output.iterations: none``, replicas for a cluster)."""


def run_point(task: dict[str, Any]) -> dict[str, Any]:
    """Simulate one point; never raises.

    Args:
        task: ``{"config": <ExperimentConfig.model_dump()>, "csv_dir": <folder or None>}``;
            with ``csv_dir``, the point's tables (``requests.csv`` and ``iterations.csv``, or
            as its ``output:`` block says) are written there.

    Returns:
        ``{"summary": dict | None, "error": str, "internal": bool, "wall_time_s": float}``;
        ``error`` is empty when the point ran, else one line (``internal`` marks a bug rather
        than bad input).
    """
    start = time.perf_counter()
    summary = None
    error, internal = "", False
    try:
        from batchsim.config import ExperimentConfig
        from batchsim.simulation import simulate

        config = ExperimentConfig.model_validate(task["config"])
        result = simulate(config)
        if task.get("csv_dir"):
            result.write_files(task["csv_dir"], [n for n in result.files if n in CSV_FILES])
        summary = result.summary
    except ConfigError as exc:
        error = str(exc)
    except OSError as exc:
        error = f"cannot write {task.get('csv_dir')}: {exc.strerror or exc}"
    except Exception as exc:  # a bug: the sweep records it and goes on
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{os.path.basename(last.filename)}:{last.lineno}"
        error = f"internal error ({type(exc).__name__} at {where}): {exc}".replace("\n", " ")
        internal = True
    return {
        "summary": summary,
        "error": error,
        "internal": internal,
        "wall_time_s": time.perf_counter() - start,
    }


class InlineExecutor(Executor):
    """Runs each task in this process as it is submitted (one worker, no pickling)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


def _worker_signals() -> None:
    # Ctrl-C reaches the whole process group; the driver stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the driver's SIGTERM handler (batchsim's CLI raises an
    # exception from it for its clean-up); the pool would catch that exception and keep the
    # worker alive, so the driver's terminate() after Ctrl-C must end it instead.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def local_pool(workers: int) -> Executor:
    """A process pool whose workers run many points each.

    On Linux the workers are forked from this process, with batchsim already imported: a
    worker costs a fork, not an interpreter start and an import, and a script calling
    :func:`batchsim.sweep` needs no ``if __name__ == "__main__":`` guard. Elsewhere they are
    spawned (fork is unsafe on macOS), and scripts need the guard as for any process pool.
    The pool starts all its workers at once, before any thread of the sweep exists.
    """
    if workers <= 1:
        return InlineExecutor()
    import batchsim.simulation  # noqa: F401  (imported once here, inherited by the workers)

    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_worker_signals)


def stop_now(executor: Executor) -> None:
    """Stop an executor without waiting for running points (after Ctrl-C): cancel what has not
    started and end the local pool's worker processes."""
    if isinstance(executor, ProcessPoolExecutor):
        processes = dict(getattr(executor, "_processes", None) or {})
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes.values():
            with contextlib.suppress(Exception):
                process.terminate()
        for process in processes.values():
            with contextlib.suppress(Exception):
                process.join(timeout=5)
    else:
        executor.shutdown(wait=False, cancel_futures=True)


class RayExecutor(Executor):
    """Runs tasks as Ray remote functions (``--backend ray``).

    Connects to the cluster at ``address`` (``auto`` for a running local cluster, or
    ``ray://host:10001``); without one, starts a local Ray instance with ``num_cpus`` CPUs
    and stops it on shutdown. Every machine of a cluster needs batchsim installed (the same
    version), and point folders are written where the workers run: use a shared file system,
    or ``--summary-only`` so that only the driver writes.
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "--backend ray needs Ray: pip install 'batchsim[ray]' (or pip install ray)"
            ) from None
        self._ray = ray
        self._remote: dict[Callable[..., Any], Any] = {}
        self._pending: list[Any] = []
        self._started = False
        if not ray.is_initialized():
            options: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR"}
            if address:
                check_reachable(address)
                options["address"] = address
            else:  # a new local instance, even where `ray start` left a cluster running
                options.update(address="local", num_cpus=num_cpus, include_dashboard=False)
            try:
                ray.init(**options)
            except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError...
                where = f"at {address}" if address else "locally"
                message = " ".join(str(exc).split()) or type(exc).__name__
                raise ConfigError(f"--backend ray: cannot start Ray {where}: {message}") from None
            self._started = True

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self._ray.remote(num_cpus=1)(fn)
        ref = remote.remote(*args, **kwargs)
        self._pending.append(ref)
        return ref.future()  # type: ignore[no-any-return]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for ref in self._pending:
                with contextlib.suppress(Exception):
                    self._ray.cancel(ref, force=True)
        self._pending = []
        if self._started:
            self._ray.shutdown()
            self._started = False


CONNECT_TIMEOUT_S = 10.0
"""How long ``--address HOST:PORT`` may take to accept a connection."""


def check_reachable(address: str) -> None:
    """Refuse a Ray ``HOST:PORT`` (or ``ray://HOST:PORT``) address nothing listens on.

    ``ray.init`` retries an unreachable address for many minutes, logging as it goes; one
    TCP connection tells at once. Other forms (``auto``, ``local``) are left to Ray.

    Raises:
        ConfigError: Nothing accepts a connection at the address.
    """
    import socket

    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except (OSError, OverflowError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there ({reason or 'timed out'}); "
            "start one with ray start --head, or give --address auto or ray://HOST:10001"
        ) from None


@contextlib.contextmanager
def open_executor(
    backend: str = "local", workers: int | None = None, address: str | None = None
) -> Iterator[Executor]:
    """The executor of a backend, shut down on leaving (stopped at once on Ctrl-C)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if address and backend != "ray":
        raise ConfigError("--address is for --backend ray")
    count = workers if workers is not None else default_workers()
    executor: Executor
    executor = local_pool(count) if backend == "local" else RayExecutor(address, count)
    try:
        yield executor
    except BaseException:
        stop_now(executor)
        raise
    executor.shutdown(wait=True)
