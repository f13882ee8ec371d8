"""How fast is batchsim? Wall time, peak memory and simulated iterations/s per case.

It measures the installed batchsim (printed first): after ``pip install .``, whose engine loop
mypyc compiles (``hatch_build.py``); an editable install or ``BATCHSIM_PURE_PYTHON=1``
measures pure Python.

    python benchmarks/speed.py                 # cases (a) (b) (c), a few minutes at most
    python benchmarks/speed.py --million       # also (d): 1,000,000 requests (takes minutes)
    python benchmarks/speed.py --azure PATH    # the Azure conv trace somewhere else
    python benchmarks/speed.py --repeat 3      # best of 3 runs per case (noisy machines)
    python benchmarks/speed.py --only f:       # only (f): reading big traces

Cases:
  (a) 10,000 requests, Poisson 2 req/s, prompts uniform 512-2048, outputs uniform 128-512,
      Llama-2-7B on an A100-80GB, continuous batching, max_num_seqs 128, max_num_batched_tokens
      4096: the workload batchsim and Vidur 0.0.26 were timed on side by side. Timed twice: the
      whole ``batchsim run`` (CLI in a subprocess, start-up and outputs included) and
      ``simulate()`` alone. Targets: <= 0.6 s and <= 0.5 s.
  (b) the same workload under each policy. Target: continuous-mixed and chunked prefill
      within 1.2x of continuous.
  (c) the full Azure LLM inference 2023 conversation trace (default
      ``../shared/traces/azure_llm_2023_conv.csv`` from the repository root; skipped if absent).
  (d) ``--million``: workload (a) with 1,000,000 requests. Targets: <= 60 s, <= 1 GB peak.
  (e) the cost of one iteration as the batch grows: saturated decode (every request arrives at
      t=0, prompts of 32 tokens, outputs of 4,000), continuous batching with ``max_num_seqs``
      16 and 1024 (KV cache sized to hold them all), ``engine.fast_forward: false`` so that
      every iteration is scheduled, priced and applied on its own. Timed: the engine's loop
      alone (no set-up or summary), as iterations/s. Target: iterations/s at 16 <= 2x those
      at 1024.
  (f) reading traces: a 1,000,000-row Azure-format trace (the shipped conversation sample
      repeated, each copy shifted past the previous one) loaded whole, target <= 0.5 s; and a
      3,000,000-row one behind a workload with ``num_requests: 1000``, which should cost about
      as much as a 1000-row file. The files are generated in a temporary folder. "read s" is
      timed inside the child (``load_trace`` or ``generate``, lazy imports included); "imports
      only" is the same child without reading, the floor of the peak memory.

  (g) every feature as fast as a plain run, ``simulate()`` timed as in (a): workload (a) as a
      pipeline of P = 2 and P = 4 stages (targets: within 2x of (a)); with speculative decoding
      (``ngram``, k = 4, alpha 0.8; target: within 3x of (a)); 8 replicas behind round_robin at
      8 x the load (16,000 requests, 16 req/s; target: within 1.5x of 8 x one engine of 2,000
      requests at 2 req/s, also timed); a model whose layers alternate sliding-window and full
      attention (gpt-oss-20b, its decodes a cohort past the window) beside a full-attention
      model of its size class (Llama-3-8B), both on an H100, for their iterations/s (no target:
      the two models batch differently).

Start-up, warm, best of 5 (first, a few seconds): ``batchsim --version`` and ``batchsim run`` of
a 1-request experiment, each as ``python -m batchsim`` in a subprocess, run once to warm the
caches (the OS file cache; the bytecode cache too unless PYTHONDONTWRITEBYTECODE is set), then
5 times; the fastest wall time counts. Targets: <= 0.15 s and <= 0.3 s. ``--only start-up``
runs only this section.

Every case runs in its own subprocess, so its peak memory (max RSS, from ``os.wait4``) is its
own. Peak memory of a ``simulate()`` case includes the interpreter and imports (~150 MB).

Phases: every case timed as a whole ``batchsim run`` ((a), (c), (d)) is run once more with
each phase timed inside the process: start-up (interpreter, imports, reading the experiment:
the process's wall time minus the phases below), building the cost model, workload
generation, simulate (the engine's loop), summary and writing the output files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
DEFAULT_AZURE = REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
TARGET_WALL_S = 0.6
TARGET_SIMULATE_S = 0.5
TARGET_PEAK_MB = 500.0
TARGET_BATCH_RATIO = 2.0
TARGET_AZURE_S = 1.5
TARGET_MILLION_S = 60.0
TARGET_MILLION_MB = 1000.0


def workload_a(num_requests: int = 10_000) -> dict[str, Any]:
    return {
        "num_requests": num_requests,
        "arrival": {"process": "poisson", "rate": 2.0},
        "prompt_tokens": {"dist": "uniform", "min": 512, "max": 2048},
        "output_tokens": {"dist": "uniform", "min": 128, "max": 512},
    }


def experiment(name: str, scheduler: dict[str, Any], workload: dict[str, Any], **top: Any):
    # the plain engine (engine.framework: null), as these cases were defined before vllm-v1
    # became the default: their figures stay comparable across versions
    engine = {"framework": None, **top.pop("engine", {})}
    return {
        "name": name,
        "seed": 0,
        "hardware": top.pop("hardware", "a100-80gb"),
        "model": top.pop("model", "llama-2-7b"),
        "engine": engine,
        "scheduler": scheduler,
        "workload": workload,
        **top,
    }


CONTINUOUS = {"policy": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "acceptance_rate": 0.8}
FEATURE_CASES = {
    "g: pipeline P=2": ({"parallel": {"pipeline_parallel_size": 2}}, 10_000, 2.0),
    "g: pipeline P=4": ({"parallel": {"pipeline_parallel_size": 4}}, 10_000, 2.0),
    "g: speculative ngram k=4": ({"engine": {"speculative": NGRAM}}, 10_000, 2.0),
    "g: one engine, 2,000 requests": ({}, 2_000, 2.0),
    "g: 8 replicas, 16,000 requests": ({"cluster": {"replicas": 8}}, 16_000, 16.0),
    "g: llama-3-8b, H100": ({"hardware": "h100-sxm", "model": "llama-3-8b"}, 10_000, 2.0),
    "g: gpt-oss-20b, H100 (sliding window)": (
        {"hardware": "h100-sxm", "model": "gpt-oss-20b"},
        10_000,
        2.0,
    ),
}
"""Case (g): the experiment's extra blocks, its number of requests and its arrival rate."""
FEATURE_TARGETS = {
    "g: pipeline P=2": ("a: continuous 10k", 1, 2.0),
    "g: pipeline P=4": ("a: continuous 10k", 1, 2.0),
    "g: speculative ngram k=4": ("a: continuous 10k", 1, 3.0),
    "g: 8 replicas, 16,000 requests": ("g: one engine, 2,000 requests", 8, 1.5),
}
"""Case (g)'s targets: (the case it is measured against, times how many of it, the most
allowed ratio)."""


def feature_experiment(name: str) -> dict[str, Any]:
    blocks, num_requests, rate = FEATURE_CASES[name]
    workload = {**workload_a(num_requests), "arrival": {"process": "poisson", "rate": rate}}
    return experiment(name.split(":")[0], CONTINUOUS, workload, **blocks)


POLICY_SCHEDULERS = {
    # Request-level batches of 32 fill in ~16 s at 2 req/s and drain well within that.
    "static": {"policy": "static", "max_num_seqs": 32},
    "dynamic": {"policy": "dynamic", "max_num_seqs": 32, "max_wait_ms": 2000},
    "continuous": CONTINUOUS,
    "continuous-mixed": {**CONTINUOUS, "mix_prefill_decode": True},
    "chunked_prefill": {
        "policy": "chunked_prefill",
        "max_num_seqs": 128,
        "max_num_batched_tokens": 512,
    },
}

# Runs in a fresh interpreter: simulate() alone, timed inside, result as one JSON line.
_SIMULATE_ONLY = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from batchsim.config import load_experiment
    from batchsim.simulation import simulate
    path = Path(sys.argv[1])
    config = load_experiment(path)
    start = time.perf_counter()
    result = simulate(config, path.parent)
    wall = time.perf_counter() - start
    s = result.summary
    print(json.dumps({"wall_s": wall, "iterations": s["num_iterations"],
                      "requests": s["num_requests"], "completed": s["completed"]}))
    """
)


# A whole ``batchsim run`` with each phase timed (the functions simulate() calls, wrapped).
_PHASES = textwrap.dedent(
    """
    import json, sys, time
    from batchsim import cli, simulation
    from batchsim.engine.engine import Engine
    spent = {}
    def wrap(owner, name, phase):
        inner = getattr(owner, name)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - start
        setattr(owner, name, timed)
    wrap(simulation, "assemble", "build")
    wrap(simulation, "generate", "workload")
    wrap(Engine, "run", "simulate")
    wrap(simulation, "summarize", "summary")
    wrap(simulation.Result, "write", "writing")
    code = cli.main(["run", sys.argv[1], "-o", sys.argv[2]])
    print(json.dumps({"code": code, **spent}))
    """
)
PHASES = ("build", "workload", "simulate", "summary", "writing")


def bench_phases(name: str, workdir: Path) -> dict[str, Any]:
    """One ``batchsim run`` of the case's experiment with its phases timed."""
    path = workdir / f"{name}.yaml"
    wall, _, code, out, err = run_child(
        [sys.executable, "-c", _PHASES, str(path), str(workdir / f"phases-{name[0]}")]
    )
    row: dict[str, Any] = {"case": name, "wall_s": wall}
    if code != 0:
        row["error"] = (err.strip().splitlines() or ["?"])[-1]
        return row
    spent = json.loads(out.strip().splitlines()[-1])
    row.update({phase: spent.get(phase, 0.0) for phase in PHASES})
    row["start_up"] = wall - sum(row[phase] for phase in PHASES)
    return row


PHASE_COLUMNS = [
    ("case", "case", "{}"),
    ("wall_s", "run s", "{:.2f}"),
    ("start_up", "start-up", "{:.2f}"),
    *((phase, phase, "{:.2f}") for phase in PHASES),
]


# Runs in a fresh interpreter: read a trace (whole, or behind num_requests), timed inside.
_READ_TRACE = textwrap.dedent(
    """
    import json, sys, time
    from batchsim.workload import TraceConfig, generate, load_trace, parse_workload
    path, limit = sys.argv[1], int(sys.argv[2])
    start = time.perf_counter()
    if limit > 0:
        workload = {"trace": {"path": path, "format": "azure"}, "num_requests": limit}
        rows = len(generate(parse_workload(workload), 0))
    elif limit == 0:
        rows = len(load_trace(TraceConfig(path=path, format="azure")))
    else:
        rows = 0
    print(json.dumps({"read_s": time.perf_counter() - start, "rows": rows}))
    """
)
TRACE_TARGET_S = 0.5


def write_azure_trace(path: Path, rows: int) -> Path:
    """An Azure-format trace of ``rows`` rows: the shipped conversation sample repeated, each
    copy shifted in time past the end of the previous one (CRLF lines, like the original)."""
    import numpy as np

    sample = (REPO / "workloads" / "azure_conv_sample.csv").read_text(encoding="utf-8")
    header, *lines = sample.splitlines()
    stamps = np.array([line.split(",", 1)[0] for line in lines], dtype="datetime64[ns]")
    tails = [line[line.index(",") :] + "\r\n" for line in lines]
    period = (stamps[-1] - stamps[0]) + np.timedelta64(1, "s")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(header + "\r\n")
        done = 0
        copy = 0
        while done < rows:
            take = min(len(lines), rows - done)
            shifted = stamps[:take] + period * copy
            text = np.datetime_as_string(shifted, unit="ns")  # 2023-11-16T18:15:46.680590000
            f.write("".join(f"{t[:10]} {t[11:27]}{tail}" for t, tail in zip(text, tails)))
            done += take
            copy += 1
    return path


def bench_trace(name: str, path: Path | None, limit: int, repeat: int) -> dict[str, Any]:
    argv = [sys.executable, "-c", _READ_TRACE, str(path or ""), str(limit)]
    wall, peak, code, out, err = best_of(repeat, argv)
    row: dict[str, Any] = {"case": name}
    if code != 0:
        row["error"] = (err.strip().splitlines() or ["?"])[-1]
        return row
    info = json.loads(out.strip().splitlines()[-1])
    row.update(rows=info["rows"], read_s=info["read_s"], process_s=wall, peak_mb=peak)
    if path is not None:
        row["file_mb"] = path.stat().st_size / 2**20
    return row


TRACE_COLUMNS = [
    ("case", "case", "{}"),
    ("file_mb", "file MB", "{:.0f}"),
    ("rows", "rows read", "{:,}"),
    ("read_s", "read s", "{:.2f}"),
    ("process_s", "process s", "{:.2f}"),
    ("peak_mb", "peak MB", "{:.0f}"),
]


# Case (f): (name, rows of the generated trace or 0 for none, num_requests or 0 or -1).
TRACE_CASES = [
    ("f: imports only", 0, -1),
    ("f: azure 1M, whole", 1_000_000, 0),
    ("f: azure 3M, num_requests 1000", 3_000_000, 1000),
]


def trace_cases(workdir: Path, names: list[str], repeat: int) -> list[dict[str, Any]]:
    """Run the (f) cases in ``names``: imports alone, a 1M-row trace read whole, a 3M-row one
    behind num_requests."""
    out = []
    for name, size, limit in TRACE_CASES:
        if name not in names:
            continue
        path = workdir / f"azure_{size}.csv" if size else None
        if path is not None and not path.exists():
            print(f"writing a {size:,}-row trace ...", file=sys.stderr, flush=True)
            write_azure_trace(path, size)
        print(f"running {name} ...", file=sys.stderr, flush=True)
        out.append(bench_trace(name, path, limit, repeat))
    return out


def experiment_e(max_num_seqs: int) -> dict[str, Any]:
    """Case (e): ``max_num_seqs`` requests decoding together, iteration by iteration."""
    return experiment(
        f"e-{max_num_seqs}",
        {"policy": "continuous", "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 8192},
        {
            "num_requests": max_num_seqs,
            "arrival": {"process": "all_at_once"},
            "prompt_tokens": {"dist": "fixed", "value": 32},
            "output_tokens": {"dist": "fixed", "value": 4000},
        },
        engine={"fast_forward": False, "num_gpu_blocks": 300_000},
    )


# Case (e): the engine's loop alone (Engine.run), timed inside a fresh interpreter.
_LOOP_ONLY = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from batchsim.config import load_experiment
    from batchsim.engine.engine import Engine
    from batchsim.simulation import simulate
    loop = Engine.run
    spent = []
    def timed(self):
        start = time.perf_counter()
        loop(self)
        spent.append(time.perf_counter() - start)
    Engine.run = timed
    path = Path(sys.argv[1])
    s = simulate(load_experiment(path), path.parent).summary
    print(json.dumps({"wall_s": spent[0], "iterations": s["num_iterations"],
                      "requests": s["num_requests"], "completed": s["completed"]}))
    """
)


def measured_build() -> str:
    """Which batchsim the cases run: its folder and whether its engine loop is compiled."""
    code = "import batchsim, batchsim.cli as c; print(batchsim.__file__, c.engine_build())"
    _, _, status, out, err = run_child([sys.executable, "-c", code])
    if status:
        return f"batchsim does not import: {err.strip()}"
    path, build = out.strip().split(" ", 1)
    return f"measuring batchsim from {Path(path).parent} ({build})"


def run_child(argv: list[str]) -> tuple[float, float, int, str, str]:
    """Run a subprocess; return (wall s, peak RSS MB, exit code, stdout, stderr)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        # from a neutral folder: the installed batchsim is measured (run from the repository,
        # ``python -c`` would import its source tree, never compiled)
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=tempfile.gettempdir())
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        peak_mb = usage.ru_maxrss / 1024.0  # Linux: KiB
        if sys.platform == "darwin":
            peak_mb /= 1024.0  # macOS: bytes
        return wall, peak_mb, proc.returncode, out.read(), err.read()


def best_of(repeat: int, argv: list[str]) -> tuple[float, float, int, str, str]:
    """Run ``argv`` ``repeat`` times; the fastest run's wall time, the largest peak."""
    runs = [run_child(argv) for _ in range(repeat)]
    failed = [r for r in runs if r[2] != 0]
    if failed:
        return failed[0]
    fastest = min(runs, key=lambda r: r[0])
    return (fastest[0], max(r[1] for r in runs), 0, fastest[3], fastest[4])


def bench(
    name: str,
    exp: dict[str, Any],
    workdir: Path,
    with_cli: bool,
    repeat: int = 1,
    child: str = _SIMULATE_ONLY,
) -> dict[str, Any]:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False), encoding="utf-8")
    row: dict[str, Any] = {"case": name}
    runs = [run_child([sys.executable, "-c", child, str(path)]) for _ in range(repeat)]
    failed = [r for r in runs if r[2] != 0]
    if failed:
        row["error"] = (failed[0][4].strip().splitlines() or ["?"])[-1]
        return row
    # the fastest run as timed inside the child (the subprocess's own wall time includes
    # the interpreter start-up), and the largest peak
    infos = [json.loads(r[3].strip().splitlines()[-1]) for r in runs]
    info = min(infos, key=lambda i: i["wall_s"])
    peak = max(r[1] for r in runs)
    row.update(
        requests=info["requests"],
        completed=info["completed"],
        iterations=info["iterations"],
        simulate_s=info["wall_s"],
        iter_per_s=info["iterations"] / info["wall_s"],
        req_per_s=info["requests"] / info["wall_s"],
        simulate_peak_mb=peak,
    )
    if with_cli:
        argv = [sys.executable, "-m", "batchsim", "run", str(path), "-o", str(workdir / name)]
        wall, peak, code, _, err = best_of(repeat, argv)
        if code != 0:
            row["error"] = (err.strip().splitlines() or ["?"])[-1]
        row.update(cli_s=wall, cli_peak_mb=peak)
    return row


# Start-up: what a user waits for before anything is simulated.
STARTUP = "start-up"
STARTUP_REPEAT = 5
STARTUP_TARGETS_S = {"batchsim --version": 0.15, "batchsim run, 1 request": 0.3}
ONE_REQUEST = {
    "num_requests": 1,
    "arrival": {"process": "all_at_once"},
    "prompt_tokens": {"dist": "fixed", "value": 128},
    "output_tokens": {"dist": "fixed", "value": 16},
}


def bench_startup(workdir: Path, names: list[str]) -> list[dict[str, Any]]:
    """Each start-up case: one warm-up run, then the best of ``STARTUP_REPEAT``."""
    path = workdir / "startup-one.yaml"
    exp = experiment("startup-one", CONTINUOUS, ONE_REQUEST)
    path.write_text(yaml.safe_dump(exp, sort_keys=False), encoding="utf-8")
    batchsim = [sys.executable, "-m", "batchsim"]
    argvs = {
        "batchsim --version": [*batchsim, "--version"],
        "batchsim run, 1 request": [*batchsim, "run", str(path), "-o", str(workdir / "startup")],
    }
    rows = []
    for name in names:
        print(f"running {STARTUP}: {name} ...", file=sys.stderr, flush=True)
        run_child(argvs[name])  # warm-up
        wall, peak, code, _, err = best_of(STARTUP_REPEAT, argvs[name])
        row: dict[str, Any] = {"case": name, "wall_s": wall, "peak_mb": peak}
        if code != 0:
            row["error"] = (err.strip().splitlines() or ["?"])[-1]
        rows.append(row)
    return rows


def print_startup(rows: list[dict[str, Any]]) -> None:
    print(f"{STARTUP}, warm, best of {STARTUP_REPEAT}:")
    width = max(len(r["case"]) for r in rows)
    for r in rows:
        target = STARTUP_TARGETS_S[r["case"]]
        if "error" in r:
            print(f"  {r['case']:<{width}}  FAILED: {r['error']}")
            continue
        verdict = "ok" if r["wall_s"] <= target else "MISSED"
        print(
            f"  {r['case']:<{width}}  {r['wall_s']:.3f} s  {r['peak_mb']:.0f} MB  "
            f"(target <= {target:g} s: {verdict})"
        )


COLUMNS = [
    ("case", "case", "{}"),
    ("requests", "requests", "{:,}"),
    ("iterations", "iterations", "{:,}"),
    ("simulate_s", "simulate s", "{:.2f}"),
    ("iter_per_s", "iter/s", "{:,.0f}"),
    ("req_per_s", "req/s", "{:,.0f}"),
    ("simulate_peak_mb", "peak MB", "{:.0f}"),
    ("cli_s", "batchsim run s", "{:.2f}"),
    ("cli_peak_mb", "run peak MB", "{:.0f}"),
]


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]] = COLUMNS) -> None:
    cells = [
        [fmt.format(r[key]) if r.get(key) is not None else "-" for key, _, fmt in columns]
        for r in rows
    ]
    widths = [
        max(len(title), *(len(c[i]) for c in cells)) for i, (_, title, _) in enumerate(columns)
    ]
    print(
        "  ".join(
            title.rjust(w) if i else title.ljust(w)
            for i, ((_, title, _), w) in enumerate(zip(columns, widths))
        )
    )
    for c in cells:
        print("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(c, widths))))
    for r in rows:
        if "error" in r:
            print(f"  {r['case']}: FAILED: {r['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--azure", type=Path, default=DEFAULT_AZURE, help="Azure conv trace CSV")
    parser.add_argument("--million", action="store_true", help="also run 1,000,000 requests")
    parser.add_argument("--only", help="run only cases whose name contains this")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each case N times and report the fastest (shared machines are noisy); "
        "case (d) runs once",
    )
    args = parser.parse_args(argv)

    cases: list[tuple[str, dict[str, Any], bool]] = [
        ("a: continuous 10k", experiment("a", CONTINUOUS, workload_a()), True),
    ]
    loop_cases = {f"e: decode {seqs} seqs (loop)": experiment_e(seqs) for seqs in (16, 1024)}
    for policy, scheduler in POLICY_SCHEDULERS.items():
        cases.append(
            (f"b: {policy} 10k", experiment(f"b-{policy}", scheduler, workload_a()), False)
        )
    cases += [(name, feature_experiment(name), False) for name in FEATURE_CASES]
    azure = args.azure.resolve()
    if azure.is_file():
        trace = {"trace": {"path": str(azure), "format": "azure"}}
        scheduler = {
            "policy": "chunked_prefill",
            "max_num_seqs": 256,
            "max_num_batched_tokens": 2048,
        }
        cases.append(
            (
                "c: azure conv (chunked)",
                experiment("c", scheduler, trace, hardware="h100-sxm", model="llama-3-8b"),
                True,
            )
        )
    else:
        print(f"(c) skipped: no Azure conv trace at {azure} (use --azure PATH)")
    if args.million:
        cases.append(("d: continuous 1M", experiment("d", CONTINUOUS, workload_a(1_000_000)), True))
    startup = list(STARTUP_TARGETS_S)
    trace_names = [name for name, _, _ in TRACE_CASES if not args.only or args.only in name]
    if args.only:
        cases = [c for c in cases if args.only in c[0]]
        startup = [name for name in startup if args.only in f"{STARTUP}: {name}"]
        loop_cases = {name: exp for name, exp in loop_cases.items() if args.only in name}
        if not cases and not startup and not trace_names and not loop_cases:
            print(f"no case name contains {args.only!r}", file=sys.stderr)
            return 2

    rows = []
    trace_rows = []
    phase_rows = []
    print(measured_build())
    with tempfile.TemporaryDirectory(prefix="batchsim-speed-") as tmp:
        startup_rows = bench_startup(Path(tmp), startup)
        for name, exp, with_cli in cases:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            repeat = 1 if name.startswith("d:") else args.repeat  # (d) takes minutes per run
            rows.append(bench(name, exp, Path(tmp), with_cli, repeat))
            if with_cli:
                print(f"running {name}, phases ...", file=sys.stderr, flush=True)
                phase_rows.append(bench_phases(name, Path(tmp)))
        for name, exp in loop_cases.items():
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append(bench(name, exp, Path(tmp), False, args.repeat, child=_LOOP_ONLY))
        if trace_names:
            trace_rows = trace_cases(Path(tmp), trace_names, args.repeat)
    if startup_rows:
        print()
        print_startup(startup_rows)
    if rows:
        print()
        print_table(rows)
    if phase_rows:
        print("\nphases of batchsim run (s, one run each):")
        print_table(phase_rows, PHASE_COLUMNS)
    if trace_rows:
        print()
        print_table(trace_rows, TRACE_COLUMNS)
        whole = next((r for r in trace_rows if r["case"].startswith("f: azure 1M")), None)
        if whole and "read_s" in whole:
            ok = whole["read_s"] <= TRACE_TARGET_S
            print(
                f"\ntarget (f): 1M-row trace read <= {TRACE_TARGET_S:g} s: "
                f"{whole['read_s']:.2f} s {'ok' if ok else 'MISSED'}"
            )
    first = rows[0] if rows and rows[0]["case"].startswith("a:") else None
    if first and "cli_s" in first:
        ok_time = first["cli_s"] <= TARGET_WALL_S
        ok_sim = first["simulate_s"] <= TARGET_SIMULATE_S
        ok_mem = first["cli_peak_mb"] <= TARGET_PEAK_MB
        print(
            f"\ntarget (a): batchsim run <= {TARGET_WALL_S:g} s: {first['cli_s']:.2f} s "
            f"{'ok' if ok_time else 'MISSED'}; simulate() <= {TARGET_SIMULATE_S:g} s: "
            f"{first['simulate_s']:.2f} s {'ok' if ok_sim else 'MISSED'}; peak <= "
            f"{TARGET_PEAK_MB:g} MB: {first['cli_peak_mb']:.0f} MB {'ok' if ok_mem else 'MISSED'}"
        )
    by_policy = {r["case"]: r.get("simulate_s") for r in rows if r["case"].startswith("b:")}
    base = by_policy.get("b: continuous 10k")
    for policy in ("continuous-mixed", "chunked_prefill"):
        other = by_policy.get(f"b: {policy} 10k")
        if base and other:
            ratio = other / base
            print(
                f"target (b): {policy} / continuous <= 1.2: {ratio:.2f} "
                f"{'ok' if ratio <= 1.2 else 'MISSED'}"
            )
    azure = next((r for r in rows if r["case"].startswith("c:") and "cli_s" in r), None)
    if azure:
        ok = azure["cli_s"] <= TARGET_AZURE_S
        print(
            f"target (c): batchsim run <= {TARGET_AZURE_S:g} s: {azure['cli_s']:.2f} s "
            f"{'ok' if ok else 'MISSED'}"
        )
    million = next((r for r in rows if r["case"].startswith("d:") and "cli_s" in r), None)
    if million:
        ok_sim = million["simulate_s"] <= TARGET_MILLION_S
        peak = max(million["simulate_peak_mb"], million["cli_peak_mb"])
        ok_mem = peak <= TARGET_MILLION_MB
        print(
            f"target (d): simulate() <= {TARGET_MILLION_S:g} s: {million['simulate_s']:.1f} s "
            f"{'ok' if ok_sim else 'MISSED'} (batchsim run {million['cli_s']:.1f} s); peak <= "
            f"{TARGET_MILLION_MB:g} MB: {peak:.0f} MB {'ok' if ok_mem else 'MISSED'}"
        )
    by_case = {r["case"]: r.get("simulate_s") for r in rows}
    for name, (against, times, most) in FEATURE_TARGETS.items():
        mine, theirs = by_case.get(name), by_case.get(against)
        if mine and theirs:
            ratio = mine / (times * theirs)
            what = f"{times} x ({against})" if times > 1 else f"({against})"
            print(
                f"target (g): {name} / {what} <= {most:g}: {ratio:.2f} "
                f"{'ok' if ratio <= most else 'MISSED'}"
            )
    loops = [r for r in rows if r["case"].startswith("e:") and "iter_per_s" in r]
    if len(loops) == 2:
        ratio = loops[0]["iter_per_s"] / loops[1]["iter_per_s"]
        print(
            f"target (e): iter/s at 16 seqs / at 1024 <= {TARGET_BATCH_RATIO:g}: {ratio:.2f} "
            f"{'ok' if ratio <= TARGET_BATCH_RATIO else 'MISSED'}"
        )
    return 1 if any("error" in r for r in [*startup_rows, *rows, *trace_rows]) else 0


if __name__ == "__main__":
    sys.exit(main())
