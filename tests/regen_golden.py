"""Regenerate the golden summaries in ``tests/golden/`` after an *intended* behaviour change.

    python tests/regen_golden.py            # from the repository root

Each golden file holds a small experiment and the summary it produced; ``test_examples.py``
reruns the experiment and compares every numeric summary key (except ``wall_time_s``) to
1e-9 relative. Review the diff of the JSON files before committing: every changed number is
a behaviour change of the simulator (engine, policies, cost model or catalogs).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

_BASE: dict[str, Any] = {
    "seed": 7,
    "hardware": "a100-80gb",
    "model": "llama-2-7b",
    "workload": {
        "num_requests": 60,
        "arrival": {"process": "poisson", "rate": 6.0},
        "prompt_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.8, "min": 8, "max": 1500},
        "output_tokens": {"dist": "exponential", "mean": 48, "max": 256},
    },
    "slo": {"ttft_ms": 300, "tpot_ms": 40},
}
_PLAIN = {"framework": None}  # batchsim's plain engine: no serving-engine preset
EXPERIMENTS: dict[str, dict[str, Any]] = {
    "static-padded": {
        **_BASE,
        "name": "golden-static-padded",
        "engine": _PLAIN,
        "scheduler": {"policy": "static", "max_num_seqs": 8, "padding": True},
    },
    "dynamic-cancel": {
        **_BASE,
        "name": "golden-dynamic-cancel",
        "engine": _PLAIN,
        "scheduler": {"policy": "dynamic", "max_num_seqs": 8, "max_wait_ms": 40},
        "workload": {
            **_BASE["workload"],
            "cancel_after_ms": {"dist": "exponential", "mean": 4000},
        },
    },
    "continuous-mixed-preempt": {
        **_BASE,
        "name": "golden-continuous-mixed-preempt",
        "engine": {**_PLAIN, "num_gpu_blocks": 150},
        "scheduler": {
            "policy": "continuous",
            "max_num_seqs": 16,
            "max_num_batched_tokens": 2048,
            "mix_prefill_decode": True,
        },
    },
    "chunked-async-closed-loop": {
        **_BASE,
        "name": "golden-chunked-async-closed-loop",
        "engine": {**_PLAIN, "async_scheduling": True, "cpu_overhead_ms": 4.0},
        "scheduler": {
            "policy": "chunked_prefill",
            "max_num_seqs": 16,
            "max_num_batched_tokens": 256,
        },
        "workload": {
            "num_requests": 60,
            "concurrency": 6,
            "think_time_ms": {"dist": "exponential", "mean": 300},
            "prompt_tokens": _BASE["workload"]["prompt_tokens"],
            "output_tokens": _BASE["workload"]["output_tokens"],
        },
    },
    # no engine.framework key: the default serving engine, vllm-v1
    "default-engine": {**_BASE, "name": "golden-default-engine"},
}


def comparable(summary: dict[str, Any]) -> dict[str, float | int | None]:
    """The numeric keys of a summary that do not depend on wall time (NaN -> None)."""
    out: dict[str, float | int | None] = {}
    for key, value in summary.items():
        if key == "wall_time_s" or isinstance(value, (bool, str, dict, list)) or value is None:
            continue
        value = float(value) if isinstance(value, float) else int(value)
        out[key] = None if isinstance(value, float) and math.isnan(value) else value
    return out


def main() -> int:
    sys.path.insert(0, str(GOLDEN_DIR.parent.parent))
    from batchsim.config import validate_experiment
    from batchsim.simulation import simulate

    GOLDEN_DIR.mkdir(exist_ok=True)
    for name, experiment in EXPERIMENTS.items():
        summary = simulate(validate_experiment(experiment)).summary
        path = GOLDEN_DIR / f"{name}.json"
        golden = {"experiment": experiment, "summary": comparable(summary)}
        path.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
