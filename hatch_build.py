"""Wheel build hook: compile batchsim's engine loop with mypyc.

``pip install .`` builds a wheel in which the modules of the engine's iteration loop (listed
in :data:`COMPILED`) are also compiled to C extensions by mypyc, from the same Python source:
the simulation runs about 2.2x faster (a whole ``batchsim run``, start-up and output
included, 1.6x). The ``.py`` files ship next to them, and Python imports the compiled module
when both are there.

- ``BATCHSIM_PURE_PYTHON=1`` builds a pure-Python wheel (no compiler needed).
- A build that cannot compile (no C compiler, say) warns and builds a pure-Python wheel.
- Editable installs (``pip install -e .``) and the sdist are pure Python.
- One compile per machine: the built extensions are kept in a cache folder
  (``$BATCHSIM_BUILD_CACHE``, else ``$XDG_CACHE_HOME/batchsim/mypyc``, else
  ``~/.cache/batchsim/mypyc``) under a key of everything the build reads: every file of the
  package, this hook, the Python version and platform, the mypy and setuptools versions and
  the compiler's environment (``CC``, ``CFLAGS``...). A second build of the same source
  (``pip install ".[test]"`` after ``pip install .``) takes them from there in seconds.
  ``BATCHSIM_BUILD_CACHE=off`` compiles every time.

``batchsim --version`` says which one is installed. The results are the same either way (the
test suite runs on both).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

COMPILED = (
    "batchsim/cost/attention.py",
    "batchsim/cost/model.py",
    "batchsim/engine/arrivals.py",
    "batchsim/engine/cohort.py",
    "batchsim/engine/collector.py",
    "batchsim/engine/engine.py",
    "batchsim/engine/guard.py",
    "batchsim/engine/kv_cache.py",
    "batchsim/engine/options.py",
    "batchsim/engine/pipeline.py",
    "batchsim/engine/repeat.py",
    "batchsim/engine/speculative_drain.py",
    "batchsim/engine/request.py",
    "batchsim/engine/runs.py",
    "batchsim/engine/stretch.py",
    "batchsim/metrics/columns.py",
    "batchsim/metrics/iterations.py",
    "batchsim/metrics/requests.py",
    "batchsim/metrics/timing.py",
    "batchsim/scheduler/cohorts.py",
    "batchsim/scheduler/core.py",
    "batchsim/scheduler/interface.py",
    "batchsim/scheduler/output.py",
    "batchsim/scheduler/speculation.py",
    "batchsim/scheduler/toolkit.py",
    "batchsim/scheduler/windowed.py",
)
"""The modules compiled: the iteration loop and what it calls at every iteration, the
mechanism every policy shares (:mod:`batchsim.scheduler.core`, ``toolkit``, ``cohorts`` and
the contract class of :mod:`batchsim.scheduler.interface`) included. Classes of
these modules that other code subclasses (:class:`~batchsim.scheduler.Scheduler`, the KV
cache, the scheduler's output) are marked ``mypyc_attr(allow_interpreted_subclasses=True)``:
the policies stay Python, so that anyone can subclass them and override any method, as in a
pure-Python install. Nothing pydantic is compiled (the ``scheduler:`` block lives in
:mod:`batchsim.scheduler.config` for that reason)."""

PURE_ENV = "BATCHSIM_PURE_PYTHON"
CACHE_ENV = "BATCHSIM_BUILD_CACHE"
COMPILER_ENV = ("CC", "CXX", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED", "ARCHFLAGS")
"""The environment variables that change what the C compiler makes (part of the cache key)."""


def _cache_root() -> Path | None:
    """The folder of cached builds (None: caching is off)."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen.lower() in ("off", "0", "no", "false"):
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME", "") or str(Path.home() / ".cache")
    return Path(base) / "batchsim" / "mypyc"


def _cache_key(root: Path) -> str:
    """A hash of everything the compiled build depends on."""
    import hashlib
    import platform
    import sys
    from importlib.metadata import version

    digest = hashlib.sha256()
    for name in ("mypy", "setuptools"):
        digest.update(f"{name}={version(name)}\n".encode())
    digest.update(f"{sys.version}|{sys.implementation.cache_tag}|{platform.platform()}\n".encode())
    for name in COMPILER_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\n".encode())
    digest.update(Path(__file__).read_bytes())
    package = root / "batchsim"
    for path in sorted(package.rglob("*")):
        built = path.suffix in (".so", ".pyd")
        if path.is_file() and "__pycache__" not in path.parts and not built:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


class MypycBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._work: Path | None = None
        if self.target_name != "wheel" or version == "editable":
            return
        if os.environ.get(PURE_ENV, "") not in ("", "0"):
            self.app.display_info(f"batchsim: {PURE_ENV} is set, building pure Python")
            return
        try:
            built = self._compile()
        except (Exception, SystemExit) as exc:  # no compiler, mypyc failed: pure Python works
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.app.display_warning(
                f"batchsim: could not compile the engine with mypyc ({message}); building "
                f"pure Python, which gives the same results more slowly (set {PURE_ENV}=1 to "
                "skip this attempt)"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for path, target in built:
            build_data["force_include"][str(path)] = target

    def _compile(self) -> list[tuple[Path, str]]:
        """The compiled extensions, from the cache or built (:meth:`_build`): (built file, its
        path in the wheel) of each."""
        cache = _cache_root()
        if cache is None:
            return self._build()
        entry = cache / _cache_key(Path(self.root))
        files = sorted(p for p in entry.rglob("*") if p.is_file()) if entry.is_dir() else []
        if files:
            self.app.display_info(f"batchsim: compiled engine taken from the cache {entry}")
            return [(p, p.relative_to(entry).as_posix()) for p in files]
        built = self._build()
        try:  # into a scratch folder next to the entry, then renamed: never half-written
            cache.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=cache))
            for path, target in built:
                (scratch / target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, scratch / target)
            try:
                scratch.rename(entry)
            except OSError:  # another build stored it meanwhile
                shutil.rmtree(scratch, ignore_errors=True)
        except OSError as exc:  # a read-only home, say: the build itself is fine
            self.app.display_warning(f"batchsim: could not cache the compiled engine ({exc})")
        return built

    def _build(self) -> list[tuple[Path, str]]:
        """Compile :data:`COMPILED` in a scratch copy of the package; (built file, its path
        in the wheel) of each extension."""
        from mypyc.build import mypycify
        from setuptools import Distribution

        work = self._work = Path(tempfile.mkdtemp(prefix="batchsim-mypyc-"))
        shutil.copytree(
            Path(self.root) / "batchsim",
            work / "batchsim",
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"),
        )
        here = os.getcwd()
        os.chdir(work)  # mypyc writes its C sources and cache under the working directory
        try:
            extensions = mypycify(
                # The build environment has none of batchsim's dependencies: their types are
                # Any, and the modules not compiled are read for their types only.
                ["--ignore-missing-imports", "--follow-imports=silent", *COMPILED],
                opt_level="3",
                group_name="batchsim",
            )
            distribution = Distribution({"name": "batchsim", "ext_modules": extensions})
            build_ext: Any = distribution.get_command_obj("build_ext")
            build_ext.build_lib = str(work / "lib")
            build_ext.build_temp = str(work / "temp")
            build_ext.ensure_finalized()
            build_ext.run()
            outputs = [Path(p) for p in build_ext.get_outputs()]
        finally:
            os.chdir(here)
        missing = [p for p in outputs if not p.is_file()]
        if not outputs or missing:
            raise RuntimeError(f"mypyc built nothing at {missing or work}")
        return [(p, p.relative_to(work / "lib").as_posix()) for p in outputs]

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._work is not None:  # the scratch copy _compile() made
            shutil.rmtree(self._work, ignore_errors=True)
