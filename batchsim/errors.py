"""Exceptions raised by batchsim.

Everything a user can cause (a bad YAML key, a missing trace file, an unknown model name)
raises :class:`ConfigError`, whose message is one line naming the file, the key path and the
allowed values. The CLI prints that line and exits with code 2. Anything else is a bug.
"""

from __future__ import annotations

import os
import traceback


class BatchsimError(Exception):
    """Base class of every exception batchsim raises on purpose."""


class ConfigError(BatchsimError, ValueError):
    """Bad user input: configuration, catalog entry, trace file or command-line value.

    Args:
        message: One line saying what is wrong: key path, rule and the offending value.
        source: The file the value came from, if any; prefixed to the message.
        line: 1-based line number in ``source``, if known.
    """

    def __init__(self, message: str, source: str | None = None, line: int | None = None):
        self.message = message
        self.source = source
        self.line = line
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.source:
            where = f"{self.source}:{self.line}: " if self.line else f"{self.source}: "
        return f"{where}{self.message}"

    def with_source(self, source: str, line: int | None = None) -> ConfigError:
        """Return a copy that names ``source`` (kept if one was already set)."""
        if self.source:
            return self
        return ConfigError(self.message, source, line if line is not None else self.line)


def write_error(path: object, exc: OSError) -> ConfigError:
    """``cannot write PATH: [Errno N] reason``: an output the OS refused (exit code 2)."""
    if exc.errno is not None and exc.strerror:
        reason = f"[Errno {exc.errno}] {exc.strerror}"
    else:
        reason = str(exc)
    return ConfigError(f"cannot write {path}: {reason}")


class DamagedFileError(ConfigError):
    """A file batchsim wrote was cut short (a table ending in the middle of a row): nothing
    drawn from it could be trusted, so a report stops on it instead of noting it."""


class Interrupted(KeyboardInterrupt):
    """A signal stopped the command line (Ctrl-C, SIGTERM): its handlers raise this, so that
    code catching whatever a policy raises (every :class:`BaseException`, a
    ``KeyboardInterrupt`` of its own included) lets the user's interrupt through."""


class PolicyError(ConfigError):
    """A batching policy written outside batchsim (``package.module:Class``) broke a rule of
    the scheduler interface: it raised, returned something that is not an iteration, or
    stopped making progress. The message names the policy and the rule."""


class RouterError(ConfigError):
    """A router written outside batchsim (``cluster.router: package.module:Class``) raised or
    chose something that is not a replica. The message names the router and the rule."""


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line)`` of an exception raised by code written outside
    batchsim (a policy, a router), pointing at the innermost frame outside batchsim."""
    package = os.path.dirname(__file__)  # the batchsim package
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith(package):
            where = f" (at {frame.filename}:{frame.lineno})"
            break
    message = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {message}{where}" if message else f"{type(exc).__name__}{where}"
