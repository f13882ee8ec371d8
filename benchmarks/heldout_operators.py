"""Per-operator error of batchsim's shipped H100 and A40 profiles on Vidur's measurements.

The efficiency terms of every NVIDIA profile were fitted on A100 operator timings only
(``benchmarks/calibrate_a100.py``, docs/calibration.md). Vidur's repository also holds the same
per-layer operator tables measured on an H100 and an A40 (``data/profiling/compute/{h100,a40}/
<org>/<model>/mlp.csv``, MIT licence); batchsim never read them. This script prices every
measured point with the *shipped* profile (``h100-sxm``, ``a40``; nothing is fitted or changed)
and prints the median and p90 absolute error per GPU and operator group:

* linear ops: ``qkv_proj`` (attn_pre_proj), ``o_proj`` (attn_post_proj) and ``mlp``
  (mlp_up_proj + mlp_act + mlp_down_proj), one point per op;
* elementwise ops: input_layernorm + post_attention_layernorm + attn_rope + add;
* whole layer: the sum of all of them at one point (model, TP, tokens).

Every measured ``num_tokens`` (1-4096) and TP degree (1/2/4/8) is used, as in the summaries of
``calibrate_a100.py``; the knee (64-512 tokens) is shown separately. Vidur's model names are
mapped to catalog models; a model batchsim's catalog lacks is skipped with a note
(``--stand-ins`` also prices internlm-20b as llama-2-13b, the same layer shape). Vidur's A100
folder, when present, is shown as a reference row (the GPU the terms were fitted on).

Usage::

    python benchmarks/heldout_operators.py --vidur ~/src/vidur         # a checkout
    python benchmarks/heldout_operators.py --git-dir vidur.git          # a bare repository
    python benchmarks/heldout_operators.py --vidur V --points           # also every sampled point

Neither batchsim nor its tests read these files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from calibrate_a100 import (
    KNEE,
    layer_points,
    predict_layer_ops,
    print_table,
    sample_tokens,
    stats,
    summarize,
)

from batchsim.calibration.measured import read_measurements
from batchsim.calibration.predict import yaml_value
from batchsim.catalog.hardware import HardwareProfile
from batchsim.catalog.hardware_files import load_hardware
from batchsim.errors import ConfigError

COMPUTE = Path("data") / "profiling" / "compute"
GPUS = {
    # Vidur's folder: (batchsim profile, held out?, what Vidur measured on)
    "h100": ("h100-sxm", True, "H100 80GB in Vidur's 'H100 DGX' node (SXM5)"),
    "a40": ("a40", True, "A40 48GB in Vidur's '8xA40 pairwise NVLink' node (PCIe)"),
    "a100": ("a100-80gb", False, "A100 80GB, the GPU the terms were fitted on"),
}
CATALOG = {
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "meta-llama/Meta-Llama-3-8B": "llama-3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
}
"""Vidur model ids that are batchsim catalog models."""
STAND_INS = {
    # Vidur profiles internlm-20b with its Llama-2 layer (no biases, RMSNorm, gated SiLU MLP):
    # hidden 5120, 40 query and 40 KV heads, MLP 13824 - llama-2-13b's layer exactly.
    "internlm/internlm-20b": "llama-2-13b",
}
"""Vidur model ids outside the catalog priced by a catalog model with the same layer."""
LINEAR = ("qkv_proj", "o_proj", "mlp")
KERNELS = {
    # measured kernel(s) -> the cost model's piece (for the diagnosis table)
    "qkv_proj": (["attn_pre_proj"], ["qkv_proj"]),
    "o_proj": (["attn_post_proj"], ["o_proj"]),
    "mlp_up": (["mlp_up_proj"], ["mlp_up"]),
    "mlp_down": (["mlp_down_proj"], ["mlp_down"]),
    "mlp_act": (["mlp_act"], ["mlp_act"]),
    "norms": (["input_layernorm", "post_attention_layernorm"], ["norms"]),
    "rope": (["attn_rope"], ["rope"]),
    "add": (["add"], ["add"]),
}
GEMMS = ("qkv_proj", "o_proj", "mlp_up", "mlp_down")
SMALL, LARGE = 16, 2048
"""Tokens at or below SMALL: the GEMMs stream their weights (memory-bound); at or above
LARGE: they are compute-bound."""


def extract_from_git(git_dir: Path, rev: str, gpus: list[str], into: Path) -> None:
    """Copy ``data/profiling/compute/<gpu>/**/mlp.csv`` of ``rev`` into ``into`` (same paths)."""

    def git(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True)

    for gpu in gpus:
        listed = git("ls-tree", "-r", "--name-only", rev, "--", f"{COMPUTE.as_posix()}/{gpu}/")
        if listed.returncode != 0:
            sys.exit(f"--git-dir: git ls-tree failed: {listed.stderr.decode().strip()}")
        for name in listed.stdout.decode().split():
            if not name.endswith("/mlp.csv"):
                continue
            shown = git("show", f"{rev}:{name}")
            if shown.returncode != 0:  # listed, but its blob is not in this copy
                print(f"note: {name}: not readable from {git_dir}, skipped", file=sys.stderr)
                continue
            out = into / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(shown.stdout)


def gpu_points(
    root: Path, gpu: str, hw: HardwareProfile, stand_ins: bool
) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Points of every usable model measured on ``gpu`` by op group and by kernel, and the
    notes for the models left out."""
    groups, kernels, notes = [], [], []
    folder = root / COMPUTE / gpu
    for csv in sorted(folder.glob("*/*/mlp.csv")):
        vidur_id = f"{csv.parent.parent.name}/{csv.parent.name}"
        name = CATALOG.get(vidur_id)
        label = name
        if name is None and stand_ins and vidur_id in STAND_INS:
            name = STAND_INS[vidur_id]
            label = f"{vidur_id.split('/')[1].lower()} (as {name})"
        if name is None:
            extra = " (--stand-ins: priced as a same-shape model)" if vidur_id in STAND_INS else ""
            notes.append(f"{gpu}: {vidur_id}: not in batchsim's catalog, skipped{extra}")
            continue
        try:
            meas = read_measurements([str(csv)], [name])
        except ConfigError as exc:
            notes.append(f"{gpu}: {vidur_id}: {exc}")
            continue
        pred = predict_layer_ops(meas, hw)
        for out, table in (
            (groups, layer_points(meas.layer_ops, pred)),
            (kernels, layer_points(meas.layer_ops, pred, KERNELS)),
        ):
            table["model"] = label
            table.insert(0, "gpu", gpu)
            out.append(table)
    if not groups:
        return pd.DataFrame(), pd.DataFrame(), notes
    return pd.concat(groups, ignore_index=True), pd.concat(kernels, ignore_index=True), notes


def whole_layer(points: pd.DataFrame) -> pd.DataFrame:
    """One point per (gpu, model, tp, tokens): all groups summed, measured and predicted."""
    keys = ["gpu", "model", "tp", "num_tokens"]
    out = points.groupby(keys, sort=True)[["measured_s", "predicted_s"]].sum().reset_index()
    out["op"] = "layer"
    out["err_pct"] = (out.predicted_s / out.measured_s - 1.0) * 100.0
    return out


def sets_of(points: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {
        "linear ops": points[points.op.isin(LINEAR)],
        "elementwise ops": points[points.op == "elementwise"],
        "whole layer": whole_layer(points),
    }


def summary_rows(points: pd.DataFrame, gpu: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for label, pts in sets_of(points).items():
        knee = pts[pts.num_tokens.between(*KNEE)]
        med, p90, n = stats(pts.err_pct.abs().to_numpy())
        kmed, kp90, _ = stats(knee.err_pct.abs().to_numpy())
        rows.append(
            {
                "gpu": gpu,
                "set": label,
                "median_%": med,
                "p90_%": p90,
                "signed_median_%": float(np.median(pts.err_pct)),
                "knee_median_%": kmed,
                "knee_p90_%": kp90,
                "n": n,
            }
        )
    return rows


def kernel_rows(kernels: pd.DataFrame, hw: dict[str, HardwareProfile]) -> pd.DataFrame:
    """Per GPU and kernel: signed median error by regime, the rate the measured kernels
    reached, and the shortest measured time next to its prediction (the fixed kernel time).

    ``bw@small``: bytes (as the cost model counts them) over the measured time at <= SMALL
    tokens, as a fraction of the datasheet bandwidth; ``rate@large``: the same at >= LARGE
    tokens, FLOPs over peak for GEMMs and bytes over bandwidth for elementwise kernels.
    """
    rows = []
    for (gpu, kernel), k in kernels.groupby(["gpu", "op"], sort=False):
        prof = hw[str(gpu)]
        small, large = k[k.num_tokens <= SMALL], k[k.num_tokens >= LARGE]
        knee = k[k.num_tokens.between(*KNEE)]
        if kernel in GEMMS:
            rate = large.flops / large.measured_s / prof.peak_flops_for("bf16")
        else:
            rate = large.bytes / large.measured_s / prof.memory_bandwidth
        fastest = k.loc[k.measured_s.idxmin()]
        rows.append(
            {
                "gpu": gpu,
                "kernel": kernel,
                f"err@<={SMALL}_%": float(np.median(small.err_pct)),
                "err@knee_%": float(np.median(knee.err_pct)),
                f"err@>={LARGE}_%": float(np.median(large.err_pct)),
                "bw@small": float(np.median(small.bytes / small.measured_s))
                / prof.memory_bandwidth,
                "rate@large": float(np.median(rate)),
                "min_meas_us": float(fastest.measured_s) * 1e6,
                "its_pred_us": float(fastest.predicted_s) * 1e6,
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--vidur", type=Path, help="a Vidur checkout (holds data/profiling/compute)")
    src.add_argument("--git-dir", type=Path, help="a Vidur git directory (bare repositories too)")
    parser.add_argument("--rev", default="HEAD", help="revision read with --git-dir (HEAD)")
    parser.add_argument(
        "--gpus",
        nargs="+",
        default=list(GPUS),
        choices=list(GPUS),
        help="Vidur GPU folders to evaluate (default: all three; a100 is the fitted reference)",
    )
    parser.add_argument(
        "--stand-ins",
        action="store_true",
        help="also price internlm-20b as llama-2-13b (identical layer shape)",
    )
    parser.add_argument(
        "--points",
        action="store_true",
        help="print every point of the sampled tokens (powers of two + knee every 32)",
    )
    parser.add_argument("--csv", type=Path, help="write every point to this CSV")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="vidur-") as tmp:
        if args.git_dir is not None:
            if not args.git_dir.is_dir():
                parser.error(f"--git-dir: no such directory: {args.git_dir}")
            root = Path(tmp)
            extract_from_git(args.git_dir, args.rev, args.gpus, root)
        else:
            root = args.vidur
            if not (root / COMPUTE).is_dir():
                parser.error(f"--vidur: no {COMPUTE} below {root}")
        return report(root, args)


def report(root: Path, args: argparse.Namespace) -> int:
    profiles = {gpu: load_hardware(GPUS[gpu][0]) for gpu in args.gpus}
    parts, kparts, notes = [], [], []
    for gpu in args.gpus:
        if not (root / COMPUTE / gpu).is_dir():
            notes.append(f"{gpu}: no {COMPUTE / gpu} folder, skipped")
            continue
        pts, kpts, n = gpu_points(root, gpu, profiles[gpu], args.stand_ins)
        notes += n
        if not pts.empty:
            parts.append(pts)
            kparts.append(kpts)
    for note in notes:
        print(f"note: {note}")
    if not parts:
        print("no usable measurements found", file=sys.stderr)
        return 1
    points = pd.concat(parts, ignore_index=True)
    if args.csv:
        points.to_csv(args.csv, index=False)

    print("\n# batchsim cost model vs Vidur's per-layer operator timings, shipped profiles")
    for gpu, prof in profiles.items():
        name, held_out, setup = GPUS[gpu]
        print(
            f"{gpu}: profile {name} ({'held out' if held_out else 'fitted'}); measured on {setup}; "
            f"{prof.peak_flops_for('bf16') / 1e12:.1f} TFLOP/s x compute "
            f"{prof.compute_efficiency:g}, {prof.memory_bandwidth / 1e12:.3g} TB/s x memory "
            f"{prof.memory_efficiency:g}, elementwise {yaml_value(prof, 'elementwise'):g}"
        )

    if args.points:
        wide = points.pivot_table(
            index=["gpu", "model", "tp", "num_tokens"], columns="op", values="err_pct"
        ).reset_index()[["gpu", "model", "tp", "num_tokens", *LINEAR, "elementwise"]]
        shown = wide[sample_tokens(wide["num_tokens"])]
        print_table(shown, "Per point: signed error % (pred/meas - 1)", "{:.1f}")

    print_table(
        summarize(points, ["gpu", "model", "op"]),
        "|error| by GPU / model / op group (all TPs, all tokens)",
    )

    rows = []
    for gpu in profiles:
        g = points[points.gpu == gpu]
        if not g.empty:
            rows += summary_rows(g, gpu)
    held = points[points.gpu.map(lambda gpu: GPUS[gpu][1])]
    if held.gpu.nunique() > 1:
        rows += summary_rows(held, "held-out overall")
    print_table(pd.DataFrame(rows), "|error| by GPU and set (targets: median <= 5 %, p90 <= 15 %)")
    print_table(
        kernel_rows(pd.concat(kparts, ignore_index=True), profiles),
        "Diagnosis per kernel: signed median error (pred/meas - 1) by tokens, fraction of the "
        "datasheet rate reached, fastest point",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
