"""The README's examples work as written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import batchsim
from conftest import tiny_experiment

README = Path(__file__).resolve().parents[1] / "README.md"


def _code_block_after(heading: str, language: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block after {heading!r}"
    return match.group(1)


def test_readme_quickstart_commands_are_the_ci_commands():
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install ".[test]" && pytest' in text
    assert 'pip install ".[test]" && pytest' in ci
    assert "pip install . && batchsim run experiments/quickstart.yaml" in text


def test_readme_out_of_tree_policy_runs(tmp_path, monkeypatch):
    (tmp_path / "mypolicies.py").write_text(_code_block_after("## Writing a policy", "python"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        exp = tiny_experiment(scheduler={"policy": "mypolicies:ShortestPromptFirst"})
        exp["workload"]["arrival"] = {"process": "all_at_once"}
        exp["scheduler"]["max_num_seqs"] = 8
        result = batchsim.run(exp)
    finally:
        sys.modules.pop("mypolicies", None)
    assert result.summary["completed"] == 60
    # all arrive at t=0: shorter prompts are admitted no later than longer ones
    by_prompt = result.requests.sort_values(["prompt_tokens", "first_scheduled_time_s"])
    assert by_prompt["first_scheduled_time_s"].is_monotonic_increasing
    assert result.requests["first_scheduled_time_s"].nunique() > 1


def test_readme_user_router_runs(tmp_path, monkeypatch):
    module = _code_block_after("## Replicas and routing", "python")
    (tmp_path / "myrouters.py").write_text(module, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        exp = tiny_experiment()
        exp["cluster"] = {
            "replicas": [{"count": 1}, {"count": 1, "parallel": {"tensor_parallel_size": 2}}],
            "router": "myrouters:FewestWaitingFastestFirst",
        }
        exp["workload"]["arrival"] = {"process": "constant", "rate": 1.0}
        result = batchsim.run(exp)
    finally:
        sys.modules.pop("myrouters", None)
    # one request a second: none ever waits, so every request goes to the two-GPU replica
    assert result.replicas["num_requests"].tolist() == [0, 60]


def _in_a_scratch_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run README code from an empty folder that sees the repository's experiments/ (what
    the code writes goes there, not into the repository)."""
    (tmp_path / "experiments").symlink_to(README.parent / "experiments")
    monkeypatch.chdir(tmp_path)


def test_readme_python_api_example_runs(tmp_path, monkeypatch):
    _in_a_scratch_folder(tmp_path, monkeypatch)
    code = _code_block_after("## Python API", "python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["result"].summary["completed"] > 0
    assert (tmp_path / "runs" / "q64" / "summary.json").is_file()
    assert (tmp_path / "runs" / "q-parquet" / "requests.parquet").is_file()


def test_readme_sweep_and_capacity_api_example_runs(tmp_path, monkeypatch):
    _in_a_scratch_folder(tmp_path, monkeypatch)
    text = README.read_text(encoding="utf-8").split("## Python API", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    code = next(b for b in blocks if "batchsim.sweep(" in b)
    namespace: dict = {"batchsim": batchsim}
    exec(compile(code, "README.md", "exec"), namespace)
    table, capacity = namespace["table"], namespace["capacity"]
    assert len(table) == 9 * 3 and (table["error"] == "").all()
    stats = table.attrs["stats"]
    assert list(stats["scheduler.max_num_seqs"]) == [2**k for k in range(9)]
    assert (stats["num_seeds"] == 3).all()
    assert list(capacity["scheduler.policy"]) == ["static", "continuous"]
    static, continuous = capacity["max_request_rate"]
    assert continuous > static


def test_readme_figures_exist_and_come_from_the_figures_script():
    text = README.read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]+\]\((docs/figures/[^)]+)\)", text)
    assert len(images) == 8
    script = (README.parent / "docs" / "figures.py").read_text(encoding="utf-8")
    made = set(re.findall(r'"([a-z-]+\.png)"', script))
    for image in images:
        assert (README.parent / image).is_file(), image
        assert Path(image).name in made, f"{image} is not made by docs/figures.py"
    assert "python docs/figures.py" in text
