"""Policy names -> scheduler classes; ``package.module:Class`` loads an out-of-tree policy."""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, cast

from batchsim.errors import ConfigError
from batchsim.scheduler.chunked_prefill import ChunkedPrefillScheduler
from batchsim.scheduler.continuous import ContinuousScheduler
from batchsim.scheduler.dynamic import DynamicScheduler
from batchsim.scheduler.interface import Scheduler
from batchsim.scheduler.static import StaticScheduler

POLICIES: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (StaticScheduler, DynamicScheduler, ContinuousScheduler, ChunkedPrefillScheduler)
}


def built_in(policy: type[Scheduler]) -> bool:
    """``policy`` is a built-in one (or its speculative variant): what it breaks is a bug in
    batchsim, not checked as a policy written elsewhere is."""
    return getattr(policy, "speculative_base", policy) in POLICIES.values()


def policy_name(policy: type[Scheduler]) -> str:
    """``module:Class`` of ``policy``, as errors name it."""
    kind: Any = policy  # (read as a class object, compiled or not)
    return f"{kind.__module__}:{kind.__qualname__}"


def policy_summary(policy: type[Scheduler]) -> str:
    """The first line of the docstring of the module that defines ``policy`` ("" if none).

    A module the compiled build compiled has no ``__doc__`` at run time: its docstring is read
    from the ``.py`` file shipped next to it."""
    module = sys.modules.get(policy.__module__)
    doc = getattr(module, "__doc__", None)
    origin = getattr(module, "__file__", None)
    if doc is None and origin:
        source = Path(origin).with_name(policy.__module__.rpartition(".")[2] + ".py")
        try:
            doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8")))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            doc = None
    lines = (doc or "").strip().splitlines()
    return lines[0] if lines else ""


def _import_from_cwd_too(module_name: str) -> ModuleType:
    """Import a module as ``python -m`` would: the working directory is searched first.

    (The ``batchsim`` console script's search path starts at its own bin/ directory.) The
    working directory is on ``sys.path`` only during the import.
    """
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        return importlib.import_module(module_name)
    sys.path.insert(0, cwd)
    try:
        importlib.invalidate_caches()
        return importlib.import_module(module_name)
    finally:
        sys.path.remove(cwd)


def load_policy(name: str, key: str = "scheduler.policy") -> type[Scheduler]:
    """Return the scheduler class for a built-in name or ``package.module:Class``."""
    policy: type[Scheduler] = load_class(
        name, POLICIES, Scheduler, key, "policy", "batchsim.scheduler.Scheduler"
    )
    return policy


T = TypeVar("T")


def load_class(
    name: str, builtins: dict[str, type[T]], base: type, key: str, kind: str, base_name: str
) -> type[T]:
    """A built-in class by name, or ``package.module:Class`` imported (as ``python -m``
    would: from the working directory too) and checked to be a concrete ``base`` subclass.

    Args:
        name: The configured value.
        builtins: Built-in names -> classes.
        base: The class it must derive from.
        key: The config key, for error messages (``scheduler.policy``).
        kind: What it is, for error messages (``policy``).
        base_name: ``base`` as users import it, for error messages.

    Raises:
        ConfigError: Naming the key and the allowed values.
    """
    if name in builtins:
        return builtins[name]
    allowed = " | ".join(builtins)
    if ":" not in name:
        raise ConfigError(
            f"{key}: unknown {kind} {name!r}; allowed: {allowed} | package.module:Class"
        )
    module_name, _, class_name = name.partition(":")
    if not (_dotted(module_name) and _dotted(class_name)):
        raise ConfigError(
            f"{key}: {name!r} is not a built-in {kind} or package.module:Class "
            f"(dotted Python names on both sides of one ':'); built-in: {allowed}"
        )
    try:
        module = _import_from_cwd_too(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{key}: cannot import module {module_name!r}: {_one_line(str(exc))}"
        ) from None
    except (Exception, SystemExit) as exc:  # the module's own code failed while importing
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{key}: importing module {module_name!r} failed with {_one_line(what)}"
        ) from None
    cls: object = module
    for part in class_name.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        if cls is None:
            raise ConfigError(f"{key}: module {module_name!r} has no attribute {class_name!r}")
        raise ConfigError(f"{key}: {name!r} is not a {base_name} subclass")
    missing = sorted(getattr(cls, "__abstractmethods__", None) or ())
    if not missing:  # a compiled base class has no __abstractmethods__: it lists them
        missing = [
            method
            for method in getattr(base, "abstract_methods", ())
            if getattr(cls, method, None) is getattr(base, method, None)
        ]
    if missing:
        raise ConfigError(
            f"{key}: {name!r} is abstract (it does not implement {', '.join(missing)})"
        )
    return cast("type[T]", cls)


def _dotted(text: str) -> bool:
    """``a.b.c`` of Python identifiers."""
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
