"""How fast does ``batchsim sweep`` get through a grid? Points per second against the ideal.

    python benchmarks/sweep_speed.py               # 64 points on 2 workers, best of 1
    python benchmarks/sweep_speed.py --repeat 3    # best of 3
    python benchmarks/sweep_speed.py --points 128 --workers 2

The grid is the quickstart experiment (500 requests, Llama-3-8B on an A100-80GB, continuous
batching) at ``--points`` seeds, so every point costs about the same. The ideal is
``points x simulate() time of one point / workers``: what a sweep would take if running a
point cost nothing beyond its simulation. The overhead per point is
``(sweep wall time - ideal) x workers / points``: start-up of the pool, moving configs and
summaries between processes, writing the point folders and the tables.

Three ways are timed: the command line (``batchsim sweep`` in a subprocess, whole process,
point folders with ``--summary-only``), the Python API on a local process pool, and the
Python API with the points' CSV files written as well (the default of ``batchsim sweep``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = REPO / "experiments" / "quickstart.yaml"


def best(times: list[float]) -> float:
    return min(times)


def time_simulate(repeat: int) -> float:
    from batchsim.config import load_experiment
    from batchsim.simulation import simulate

    config = load_experiment(EXPERIMENT)
    simulate(config)  # warm: imports and catalog caches, as in a long-lived worker
    times = []
    for _ in range(max(repeat, 3)):
        start = time.perf_counter()
        simulate(config)
        times.append(time.perf_counter() - start)
    return best(times)


def time_cli(points: int, workers: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            argv = [
                sys.executable, "-m", "batchsim", "sweep", str(EXPERIMENT),
                "--grid", f"seed=range:0..{points - 1}", "--workers", str(workers),
                "--summary-only", "-q", "-o", os.path.join(tmp, "sweep"),
            ]  # fmt: skip
            start = time.perf_counter()
            subprocess.run(argv, check=True)
            times.append(time.perf_counter() - start)
    return best(times)


def time_api(points: int, workers: int, repeat: int, summary_only: bool) -> float:
    import batchsim
    from batchsim.studies.backends import local_pool

    times = []
    for _ in range(repeat):
        tmp = tempfile.mkdtemp()
        try:
            start = time.perf_counter()
            with local_pool(workers) as pool:
                table = batchsim.sweep(
                    EXPERIMENT,
                    {"seed": f"range:0..{points - 1}"},
                    executor=pool,
                    out_dir=os.path.join(tmp, "sweep"),
                    summary_only=summary_only,
                )
            times.append(time.perf_counter() - start)
            assert (table["error"] == "").all() and len(table) == points
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return best(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    one = time_simulate(args.repeat)
    ideal = args.points * one / args.workers
    print(
        f"grid: {args.points} points of {EXPERIMENT.relative_to(REPO)} on {args.workers} workers "
        f"({os.cpu_count()} cores); simulate() of one point {one * 1e3:.0f} ms; "
        f"ideal {ideal:.2f} s = {args.points / ideal:.1f} points/s"
    )
    print(f"{'how':<44} {'wall s':>8} {'points/s':>9} {'vs ideal':>9} {'overhead/point':>15}")
    n, w, r = args.points, args.workers, args.repeat
    cases = [
        ("batchsim sweep --summary-only (whole CLI)", lambda: time_cli(n, w, r)),
        ("batchsim.sweep(summary_only=True)", lambda: time_api(n, w, r, True)),
        ("batchsim.sweep() with the CSV files", lambda: time_api(n, w, r, False)),
    ]
    for name, measure in cases:
        wall = measure()
        overhead = (wall - ideal) * args.workers / args.points
        print(
            f"{name:<44} {wall:>8.2f} {args.points / wall:>9.1f} {ideal / wall:>8.0%} "
            f"{overhead * 1e3:>12.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
