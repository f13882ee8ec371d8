"""The tree is lint-, format- and type-clean (ruff and mypy, configured in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    command = " ".join(proc.args[2:])
    return f"$ {command}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}"


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install '.[test]' provides it)")


def test_ruff_check_and_format():
    _require("ruff")
    procs = [_run("ruff", "check", "."), _run("ruff", "format", "--check", ".")]
    failed = [p for p in procs if p.returncode != 0]
    assert not failed, "\n".join(_report(p) for p in failed)


def test_mypy():
    _require("mypy")
    proc = _run("mypy", "batchsim")
    assert proc.returncode == 0, _report(proc)
