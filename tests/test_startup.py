"""Start-up: ``import batchsim``, ``batchsim --version`` and ``--help`` load no heavy library, and
``batchsim run`` loads only what a run needs. Each check runs in a fresh interpreter, since this
one has imported everything already. (The times are measured by ``benchmarks/speed.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import batchsim
from batchsim.cli import COMMANDS

HEAVY = ("numpy", "pandas", "pyarrow", "pydantic", "simpy", "scipy", "matplotlib", "tqdm", "ray")
"""Libraries that ``import batchsim``, ``--version`` and ``--help`` must not load."""
NOT_FOR_A_RUN = ("matplotlib", "scipy", "tqdm", "ray", "pandas")
"""Libraries that ``batchsim run`` must not load."""
PACKAGE_PARENT = str(Path(batchsim.__file__).resolve().parent.parent)


def loaded_after(code: str, tmp_path: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter that imports this batchsim (with the environment
    ``env``, by default this one's); it prints one JSON line, returned here."""
    env = dict(os.environ if env is None else env)
    paths = [PACKAGE_PARENT, env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main_then_modules(argv: list[str]) -> str:
    return f"""
        import contextlib, io, json, sys
        import batchsim
        from batchsim import cli
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = cli.main({argv!r})
        out = {{"code": code, "stderr": err.getvalue(), "modules": sorted(sys.modules)}}
        print(json.dumps(out))
    """


def top_level(modules: list[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_import_batchsim_loads_only_its_errors_and_version(tmp_path):
    out = loaded_after(
        """
        import json, sys
        import batchsim
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("batchsim"))))
        """,
        tmp_path,
    )
    assert out == ["batchsim", "batchsim.errors", "batchsim.version"]


@pytest.mark.parametrize(
    "argv", [["--version"], ["--help"], *([command, "--help"] for command in COMMANDS)]
)
def test_version_and_help_load_no_heavy_library(argv, tmp_path):
    out = loaded_after(main_then_modules(argv), tmp_path)
    assert out["code"] == 0, out["stderr"]
    assert not top_level(out["modules"]) & set(HEAVY)


def test_run_loads_no_plotting_statistics_progress_or_ray(tmp_path):
    exp = tmp_path / "one.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "one",
                "hardware": "a100-80gb",
                "model": "llama-2-7b",
                "scheduler": {"policy": "continuous"},
                "workload": {
                    "num_requests": 1,
                    "arrival": {"process": "all_at_once"},
                    "prompt_tokens": {"dist": "fixed", "value": 64},
                    "output_tokens": {"dist": "fixed", "value": 4},
                },
            }
        ),
        encoding="utf-8",
    )
    out = loaded_after(main_then_modules(["run", str(exp), "-o", str(tmp_path / "out")]), tmp_path)
    assert out["code"] == 0, out["stderr"]
    assert (tmp_path / "out" / "requests.csv").is_file()
    assert not top_level(out["modules"]) & set(NOT_FOR_A_RUN)
    assert "batchsim.studies.sweep" not in out["modules"]


def test_plot_and_report_of_a_sweep_load_no_experiment_schema_or_simulator(tmp_path):
    import batchsim
    from batchsim.studies.backends import InlineExecutor
    from conftest import tiny_experiment

    grid = {"scheduler.max_num_seqs": [2, 4], "scheduler.policy": ["static", "continuous"]}
    small = tiny_experiment(workload={"num_requests": 8})
    batchsim.sweep(small, grid, executor=InlineExecutor(), out_dir=tmp_path / "sweep")
    for argv in (
        ["plot", "sweep", str(tmp_path / "sweep"), "-o", str(tmp_path / "s.png")],
        ["plot", "knee", str(tmp_path / "sweep"), "-o", str(tmp_path / "k.png")],
        ["report", str(tmp_path / "sweep"), "-o", str(tmp_path / "r.html")],
    ):
        out = loaded_after(main_then_modules(argv), tmp_path)
        assert out["code"] == 0, out["stderr"]
        loaded = set(out["modules"])
        # figures read saved files: no experiment schema, no simulation
        assert not loaded & {"batchsim.config", "batchsim.simulation", "batchsim.studies.sweep"}
        assert "simpy" not in top_level(out["modules"])


def test_the_api_names_load_on_first_use_and_are_the_objects_of_their_modules(tmp_path):
    out = loaded_after(
        """
        import json, sys
        import batchsim
        before = "batchsim.simulation" in sys.modules
        from batchsim import run
        import batchsim.config, batchsim.simulation
        from batchsim.studies import capacity, sweep
        import batchsim.cost.kernels
        same = {
            "kernel": batchsim.kernel is batchsim.cost.kernels.kernel,
            "run": run is batchsim.simulation.run is batchsim.run,
            "Result": batchsim.Result is batchsim.simulation.Result,
            "load_experiment": batchsim.load_experiment is batchsim.config.load_experiment,
            "ExperimentConfig": batchsim.ExperimentConfig is batchsim.config.ExperimentConfig,
            "sweep": batchsim.sweep is sweep.sweep,
            "capacity": batchsim.capacity is capacity.capacity,
        }
        print(json.dumps({"before": before, "same": same}))
        """,
        tmp_path,
    )
    assert out["before"] is False
    assert out["same"] == dict.fromkeys(out["same"], True)
    assert set(out["same"]) | {"BatchsimError", "ConfigError", "__version__"} == set(
        batchsim.__all__
    )


def test_the_api_names_in_this_process():
    from batchsim import config, errors, simulation
    from batchsim.studies import capacity, sweep

    assert batchsim.run is simulation.run
    assert batchsim.Result is simulation.Result
    assert batchsim.load_experiment is config.load_experiment
    assert batchsim.ExperimentConfig is config.ExperimentConfig
    assert batchsim.sweep is sweep.sweep
    assert batchsim.capacity is capacity.capacity
    assert batchsim.ConfigError is errors.ConfigError
    assert batchsim.BatchsimError is errors.BatchsimError
    assert isinstance(batchsim.__version__, str)
    assert set(batchsim.__all__) <= set(dir(batchsim))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        batchsim.no_such_name  # noqa: B018
    assert not hasattr(batchsim, "no_such_name")


@pytest.mark.parametrize("preset", [None, "logfire"])
def test_the_command_turns_pydantic_plugins_off_unless_told_otherwise(preset, tmp_path):
    # looking the plugins up reads every installed package's metadata (~25 ms of a run)
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if preset is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = preset
    code = """
        import json, os
        from batchsim import cli
        cli.main = lambda: print(json.dumps(os.environ.get("PYDANTIC_DISABLE_PLUGINS"))) or 0
        cli.console_main()
    """
    assert loaded_after(code, tmp_path, env) == (preset or "__all__")
