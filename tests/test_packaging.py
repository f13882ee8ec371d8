"""What a user installing batchsim gets: supported Pythons, license, version, type hints."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

import batchsim
from batchsim import cli
from batchsim.validation import _as_model


class _GenericAliasOn310:
    """Behaves like ``tuple[int, ...]`` on Python 3.10, where ``isinstance(alias, type)`` is
    True because the alias forwards ``__class__`` to its origin, yet ``issubclass(alias, X)``
    raises TypeError."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type


@pytest.mark.parametrize(
    "annotation", [tuple[int, ...], list[str], dict[str, int], _GenericAliasOn310()]
)
def test_error_location_walk_treats_generic_aliases_as_non_models(annotation):
    assert isinstance(_GenericAliasOn310(), type)  # the 3.10 behaviour being imitated
    assert _as_model(annotation) is None


# ----------------------------------------------------------------------------- distribution

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_is_the_apache_2_text_with_the_batchsim_authors_copyright():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert re.search(r"Copyright \d{4} batchsim authors", text)
    assert _pyproject()["project"]["license"] == "Apache-2.0"


def test_the_version_has_one_source(capsys):
    project = _pyproject()
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == "batchsim/version.py"
    assert cli.main(["--version"]) == 0
    # and whether the engine that runs is the mypyc-compiled one (hatch_build.py)
    from batchsim.engine import engine

    compiled = not engine.__file__.endswith(".py")
    build = "engine compiled with mypyc" if compiled else "pure Python"
    assert capsys.readouterr().out.strip() == f"batchsim {batchsim.__version__} ({build})"
    assert importlib.metadata.version("batchsim") == batchsim.__version__


def test_an_installed_batchsim_runs_the_compiled_engine_where_it_could_compile():
    # pip install . compiles the engine loop (hatch_build.py) and falls back to pure Python,
    # with a warning only, where it cannot. On a machine with a C compiler an installed
    # batchsim (not this checkout) must be the compiled one: else a change broke the compile
    # without failing the install, and the suite would test only the fallback.
    if Path(batchsim.__file__).resolve().parent.parent == ROOT:
        pytest.skip("batchsim runs from this checkout (an editable install is pure Python)")
    if os.environ.get("BATCHSIM_PURE_PYTHON"):
        pytest.skip("BATCHSIM_PURE_PYTHON is set: the pure-Python build was asked for")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the install falls back to pure Python")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("no Python headers (Python.h): the install falls back to pure Python")
    assert cli.engine_build() == "engine compiled with mypyc", (
        "the installed engine is pure Python although a C compiler is here: pip install . "
        "printed why the compile failed (or set BATCHSIM_PURE_PYTHON=1 for a pure build)"
    )


def test_project_urls_name_no_placeholder():
    urls = _pyproject()["project"]["urls"]
    assert urls
    for url in urls.values():
        assert url.startswith("https://") and "example" not in url and "<" not in url


@pytest.mark.skipif(
    importlib.util.find_spec("hatchling") is None,
    reason="hatchling is not installed (pip install '.[test]' provides it)",
)
def test_sdist_carries_ci_docs_and_license_and_the_wheel_py_typed(tmp_path):
    # BATCHSIM_PURE_PYTHON: the wheel without the mypyc-compiled engine (hatch_build.py)
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "BATCHSIM_PURE_PYTHON": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version = batchsim.__version__
    with tarfile.open(tmp_path / f"batchsim-{version}.tar.gz") as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {".ci/run", "docs/calibration.md", "LICENSE", "README.md", "pyproject.toml"} <= names
    assert "hatch_build.py" in names  # a wheel built from the sdist compiles the engine
    assert {"tests/test_cli.py", "batchsim/py.typed", "experiments/quickstart.yaml"} <= names
    assert "frameworks/sglang.yaml" in names
    with zipfile.ZipFile(tmp_path / f"batchsim-{version}-py3-none-any.whl") as wheel:
        members = set(wheel.namelist())
        metadata = wheel.read(f"batchsim-{version}.dist-info/METADATA").decode("utf-8")
    assert {"batchsim/py.typed", "batchsim/__main__.py"} <= members
    assert not [m for m in members if m.endswith((".so", ".pyd"))]  # pure Python, as asked
    assert "batchsim/_data/experiments/quickstart.yaml" in members
    assert "batchsim/_data/frameworks/vllm-v1.yaml" in members
    assert f"batchsim-{version}.dist-info/licenses/LICENSE" in members
    assert f"\nVersion: {version}\n" in metadata
    assert "License-Expression: Apache-2.0" in metadata
    assert "Project-URL: Source, " in metadata


def _load_build_hook() -> Any:
    spec = importlib.util.spec_from_file_location("batchsim_hatch_build", ROOT / "hatch_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_compiled_build_is_cached_by_every_source_file_and_reused(tmp_path, monkeypatch):
    # One compile per machine: a second build of the same source takes the extensions from
    # the cache; a change to any file of the package (or the compiler's flags) is a new key.
    hook = _load_build_hook()
    (tmp_path / "batchsim" / "engine").mkdir(parents=True)
    source = tmp_path / "batchsim" / "engine" / "loop.py"
    source.write_text("x = 1\n", encoding="utf-8")
    key = hook._cache_key(tmp_path)
    (tmp_path / "batchsim" / "__pycache__").mkdir()
    (tmp_path / "batchsim" / "__pycache__" / "loop.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "batchsim" / "engine" / "loop.cpython-311-x86_64-linux-gnu.so").write_bytes(b"x")
    assert hook._cache_key(tmp_path) == key  # byte code and built files are not sources
    source.write_text("x = 2\n", encoding="utf-8")
    assert hook._cache_key(tmp_path) != key
    source.write_text("x = 1\n", encoding="utf-8")
    assert hook._cache_key(tmp_path) == key
    monkeypatch.setenv("CFLAGS", "-O0")
    assert hook._cache_key(tmp_path) != key
    monkeypatch.setenv("BATCHSIM_BUILD_CACHE", "off")
    assert hook._cache_root() is None
    monkeypatch.setenv("BATCHSIM_BUILD_CACHE", str(tmp_path / "cache"))
    assert hook._cache_root() == tmp_path / "cache"


def test_every_module_of_the_engine_loop_is_compiled():
    # The engine loop's modules run at every iteration: one left out of hatch_build.COMPILED
    # (as runs.py was when it was split out of stretch.py) runs as Python in every compiled
    # install. prefix_cache's manager subclasses the compiled KVCacheManager and overrides a
    # property, so it stays interpreted, as the policies do.
    compiled = set(_load_build_hook().COMPILED)
    engine = ROOT / "batchsim" / "engine"
    modules = {
        f"batchsim/engine/{path.name}"
        for path in engine.glob("*.py")
        if path.name not in ("__init__.py", "prefix_cache.py")
    }
    assert modules - compiled == set()
    assert all((ROOT / module).is_file() for module in compiled)  # no stale entry
