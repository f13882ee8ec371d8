"""Regenerate the figures of the README from the shipped experiments.

    python docs/figures.py            # from the repository root; writes docs/figures/*.png

Every figure is made by batchsim's own commands (``batchsim sweep``, ``capacity``, ``run``
and ``plot``) in a temporary folder; nothing is drawn by hand. It takes about half a minute
on two cores. The simulator is deterministic and the figures carry no date or version, so
rerunning it draws the same pictures: a file of ``docs/figures`` is replaced only when its
pixels differ from the new drawing (another matplotlib or zlib may encode the same pixels in
other bytes; such a file is left alone, so the checkout stays clean).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from batchsim.cli import main

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "figures"
EXP = REPO / "experiments"


def steps(work: Path) -> list[tuple[str, list[list[str]]]]:
    """(figure file, the batchsim commands that make it)."""
    w = str(work)
    return [
        (
            "knee.png",
            [
                ["sweep", f"{EXP}/knee-llama2-7b-a100.yaml", "-q", "--summary-only",
                 "-o", f"{w}/knee"],
                ["plot", "knee", f"{w}/knee"],
            ],
        ),
        (
            "max-delay.png",
            [
                ["sweep", f"{EXP}/max-delay-tradeoff.yaml", "-q", "--summary-only",
                 "-o", f"{w}/delay"],
                ["plot", "sweep", f"{w}/delay", "--metric", "p99_ttft_ms",
                 "--metric", "mean_batch_size", "--metric", "busy_fraction"],
            ],
        ),
        (
            "capacity.png",
            [
                ["capacity", f"{EXP}/capacity-policies.yaml", "-q", "-o", f"{w}/capacity",
                 "--slo", "p99_ttft_ms=2000", "--slo", "p99_tpot_ms=20"],
                ["plot", "capacity", f"{w}/capacity"],
            ],
        ),
        (
            "timeline.png",
            [
                ["run", f"{EXP}/static-vs-continuous.yaml", "-o", f"{w}/static",
                 "--set", "metrics.record_slots=true"],
                ["run", f"{EXP}/static-vs-continuous.yaml", "-o", f"{w}/continuous",
                 "--set", "metrics.record_slots=true", "--set", "scheduler.policy=continuous"],
                ["plot", "timeline", f"{w}/static", f"{w}/continuous", "--from", "0", "--to", "30"],
            ],
        ),
        ("cdf.png", [["plot", "cdf", f"{w}/static", f"{w}/continuous"]]),
        (
            "roofline.png",
            [
                ["run", f"{EXP}/quickstart.yaml", "-o", f"{w}/chunked",
                 "--set", "scheduler.policy=chunked_prefill",
                 "--set", "scheduler.max_num_batched_tokens=512"],
                ["plot", "roofline", f"{w}/chunked"],
            ],
        ),
        (
            "latency-throughput.png",
            [
                ["sweep", f"{EXP}/quickstart.yaml", "-q", "--summary-only", "-o", f"{w}/load",
                 "--grid", "workload.arrival.rate=2,4,6,8,10,12",
                 "--grid", "scheduler.policy=dynamic,continuous,chunked_prefill"],
                ["plot", "latency-throughput", f"{w}/load"],
            ],
        ),
        (
            "kv.png",
            [
                ["run", f"{EXP}/kv-pressure.yaml", "-o", f"{w}/kv"],
                ["plot", "kv", f"{w}/kv"],
            ],
        ),
    ]  # fmt: skip


def same_picture(a: Path, b: Path) -> bool:
    """Whether two PNG files hold the same pixels (their bytes may differ: another zlib or
    matplotlib version compresses the same picture differently)."""
    import numpy as np
    from matplotlib.image import imread

    if not (a.is_file() and b.is_file()):
        return False
    first, second = imread(a), imread(b)
    return first.shape == second.shape and bool(np.array_equal(first, second))


def build() -> int:
    """Draw every figure; replace a file of docs/figures only where its picture changed."""
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, commands in steps(Path(tmp)):
            drawn = Path(tmp) / name
            for argv in commands:
                if argv[0] == "plot":
                    argv = [*argv, "-o", str(drawn)]
                code = main(argv)
                if code:
                    print(f"figures: batchsim {' '.join(argv)} exited {code}", file=sys.stderr)
                    return code
            target = OUT / name
            if same_picture(drawn, target):
                print(f"figures: {target.relative_to(REPO)} unchanged")
            else:
                shutil.copyfile(drawn, target)
                print(f"figures: {target.relative_to(REPO)} rewritten (its picture changed)")
    return 0


if __name__ == "__main__":
    sys.exit(build())
