"""Golden tests: every shipped example runs, and small fixed runs reproduce stored summaries.

The golden summaries in ``tests/golden/*.json`` catch unintended behaviour changes anywhere in
the simulator. After an *intended* change, regenerate them and review the diff::

    python tests/regen_golden.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from regen_golden import EXPERIMENTS, GOLDEN_DIR, comparable

from batchsim import cli
from batchsim.config import load_experiment, validate_experiment
from batchsim.simulation import simulate

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "experiments").glob("*.yaml"))
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))


def test_there_are_examples_and_golden_files():
    assert len(EXAMPLES) >= 5
    assert {p.stem for p in GOLDEN_FILES} == set(EXPERIMENTS)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_experiment_validates_and_runs(path, capsys):
    assert cli.main(["validate", str(path)]) == 0
    capsys.readouterr()
    config = load_experiment(path)
    summary = simulate(config, path.parent).summary
    ended = summary["completed"] + summary["num_rejected"] + summary["num_cancelled"]
    assert ended == summary["num_requests"] > 0
    assert summary["completed"] > 0.9 * summary["num_requests"]
    assert summary["output_throughput"] > 0
    assert summary["num_iterations"] > 0


def _matches(got: Any, want: Any) -> bool:
    if want is None:
        return got is None
    if isinstance(want, int) and not isinstance(want, bool):
        return got == want
    return got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.stem for p in GOLDEN_FILES])
def test_golden_summary_is_reproduced(path):
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert golden["experiment"] == EXPERIMENTS[path.stem], (
        "tests/regen_golden.py changed: run python tests/regen_golden.py"
    )
    summary = comparable(simulate(validate_experiment(golden["experiment"])).summary)
    want = golden["summary"]
    assert summary.keys() == want.keys(), "summary keys changed: python tests/regen_golden.py"
    changed = {k: (want[k], summary[k]) for k in want if not _matches(summary[k], want[k])}
    assert not changed, f"behaviour changed (golden, now): {changed}"
