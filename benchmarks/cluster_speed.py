"""What do replicas cost? Wall time of simulating N replicas at proportional load.

    python benchmarks/cluster_speed.py                       # round_robin, 1 2 4 8 replicas
    python benchmarks/cluster_speed.py --router least_kv --repeat 3
    python benchmarks/cluster_speed.py --replicas 1,16 --per-replica 1000

Every case is workload (a) of ``benchmarks/speed.py`` scaled with the cluster: 2,000 requests
and 2 req/s per replica (Poisson; prompts uniform 512-2048, outputs uniform 128-512),
Llama-2-7B on A100-80GB replicas, continuous batching (``max_num_seqs`` 128,
``max_num_batched_tokens`` 4096), so that each replica sees the same load whatever N. The
first row is one engine without ``cluster:``. Timed: ``simulate()`` alone (set-up, the
simulation and the summary; no files), best of ``--repeat``, in this process. "per replica"
is the wall time divided by N, against that of the engine alone: 1.0 means N replicas cost
exactly N times one engine.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def experiment(replicas: int | None, router: str, per_replica: int) -> dict[str, Any]:
    n = replicas or 1
    data: dict[str, Any] = {
        "name": "cluster-speed",
        "seed": 0,
        "hardware": "a100-80gb",
        "model": "llama-2-7b",
        "engine": {"framework": None},  # the plain engine, as speed.py's cases
        "scheduler": {"policy": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096},
        "workload": {
            "num_requests": per_replica * n,
            "arrival": {"process": "poisson", "rate": 2.0 * n},
            "prompt_tokens": {"dist": "uniform", "min": 512, "max": 2048},
            "output_tokens": {"dist": "uniform", "min": 128, "max": 512},
        },
    }
    if replicas is not None:
        data["cluster"] = {"replicas": replicas, "router": router}
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,2,4,8", help="replica counts, comma-separated")
    parser.add_argument("--router", default="round_robin")
    parser.add_argument("--per-replica", type=int, default=2000, help="requests per replica")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per case")
    args = parser.parse_args(argv)
    from batchsim.config import validate_experiment
    from batchsim.simulation import simulate

    counts: list[int | None] = [None, *(int(n) for n in args.replicas.split(","))]
    rows = []
    alone = None
    for replicas in counts:
        config = validate_experiment(experiment(replicas, args.router, args.per_replica))
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = simulate(config)
            best = min(best, time.perf_counter() - start)
        n = replicas or 1
        if replicas is None:
            alone = best
        assert alone is not None
        rows.append(
            (
                "engine alone" if replicas is None else f"{replicas} x {args.router}",
                f"{result.summary['num_requests']:,}",
                f"{result.summary['num_iterations']:,}",
                f"{best:.2f}",
                f"{best / n:.2f}",
                f"{best / n / alone:.2f}",
                f"{result.summary['mean_ttft_ms']:.0f}",
            )
        )
    header = ("case", "requests", "iterations", "wall s", "s per replica", "vs alone", "TTFT ms")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(
                str(v).rjust(w) if i else str(v).ljust(w)
                for i, (v, w) in enumerate(zip(row, widths))
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
