"""How long do ``batchsim plot`` and ``batchsim report`` take on saved results?

    python benchmarks/plot_speed.py                # the checkout's batchsim, best of 1
    python benchmarks/plot_speed.py --repeat 3     # best of 3 per command
    python benchmarks/plot_speed.py --installed    # the installed batchsim instead

Into a temporary folder it writes, once and untimed: a run of the quickstart experiment (500
requests, Llama-3-8B on an A100-80GB, with ``metrics.record_slots`` so that every run figure
can draw it), a sweep of it over ``scheduler.max_num_seqs`` (8..128) on two GPUs, a sweep of it
over the arrival rate (2..16 req/s), and a capacity study of two policies. Then it times each
figure kind that draws one of those folders and the report of the run, of the first sweep and
of the capacity study, each as a whole command (``python -m batchsim`` in a subprocess:
interpreter start-up, imports, reading the folder, drawing and writing the file), the way a
user waits for it, best of ``--repeat``; the CPU time (user + system) is printed beside it,
as a machine shared with other work stretches the wall time. Targets on a 2-core machine
(wall time): a figure <= 2 s, a report <= 5 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = REPO / "experiments" / "quickstart.yaml"
TARGET_PLOT_S = 2.0
TARGET_REPORT_S = 5.0


def batchsim(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``python -m batchsim ARGS``; its wall time and its CPU time (user + system) in
    seconds (it must succeed). On a shared machine the wall time grows with the others' load;
    the CPU time much less."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "batchsim", *args], env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"batchsim {' '.join(args)} failed:\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def make_results(root: Path, env: dict[str, str]) -> dict[str, Path]:
    """The folders the figures are drawn from (see the module documentation)."""
    exp = str(EXPERIMENT)
    folders = {
        "run": root / "run",
        "knee": root / "knee",
        "load": root / "load",
        "capacity": root / "capacity",
    }
    batchsim(["run", exp, "-o", str(folders["run"]), "--set", "metrics.record_slots=true"], env)
    small = ["--set", "workload.num_requests=200", "-q", "--workers", "2"]
    knee = ["--grid", "scheduler.max_num_seqs=pow2:8..128", "--grid", "hardware=a100-80gb,h100-sxm"]
    batchsim(["sweep", exp, *knee, "-o", str(folders["knee"]), *small], env)
    load = ["--grid", "workload.arrival.rate=2,4,8,16"]
    batchsim(["sweep", exp, *load, "-o", str(folders["load"]), *small], env)
    policies = [
        "--grid",
        "scheduler.policy=continuous,chunked_prefill",
        "--slo",
        "p99_ttft_ms=2000",
    ]
    batchsim(["capacity", exp, *policies, "-o", str(folders["capacity"]), *small], env)
    return folders


CASES = (
    ("plot knee", "knee", ["plot", "knee"]),
    ("plot sweep", "knee", ["plot", "sweep"]),
    ("plot latency-throughput", "load", ["plot", "latency-throughput"]),
    ("plot capacity", "capacity", ["plot", "capacity"]),
    ("plot cdf", "run", ["plot", "cdf"]),
    ("plot timeline", "run", ["plot", "timeline"]),
    ("plot roofline", "run", ["plot", "roofline"]),
    ("plot kv", "run", ["plot", "kv"]),
    ("report of a run", "run", ["report"]),
    ("report of a sweep", "knee", ["report"]),
    ("report of a capacity study", "capacity", ["report"]),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="best of N per command")
    parser.add_argument(
        "--installed", action="store_true", help="time the installed batchsim, not the checkout"
    )
    args = parser.parse_args()
    env = dict(os.environ)
    if not args.installed:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    which = "installed batchsim" if args.installed else f"batchsim of {REPO.name}/"
    print(f"{which}, {os.cpu_count()} cores, best of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        folders = make_results(root, env)
        print(f"results written in {time.perf_counter() - start:.1f} s (untimed below)")
        print(f"load average {os.getloadavg()[0]:.1f} (the wall times grow with it)")
        print(f"{'command':<28} {'wall s':>7} {'cpu s':>6}  target (wall)")
        failed = 0
        for name, folder, argv in CASES:
            kind = argv[1] if argv[0] == "plot" else "report"
            out = root / "out" / f"{folder}-{kind}.{'html' if kind == 'report' else 'png'}"
            times = [
                batchsim([*argv, str(folders[folder]), "-o", str(out)], env)
                for _ in range(max(args.repeat, 1))
            ]
            target = TARGET_REPORT_S if kind == "report" else TARGET_PLOT_S
            seconds, cpu = min(t[0] for t in times), min(t[1] for t in times)
            failed += seconds > target
            mark = "ok" if seconds <= target else "SLOW"
            print(f"{name:<28} {seconds:>7.2f} {cpu:>6.2f}  <= {target:g} s {mark}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
