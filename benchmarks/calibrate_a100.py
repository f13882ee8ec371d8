"""Compare batchsim's roofline cost model with measured A100 operator timings (Vidur, MIT).

A detailed report over :mod:`batchsim.calibration` (the package reads the measurements,
prices them and fits the terms; ``batchsim calibrate`` is the command for a new GPU). Reads
the CSVs of ``../shared/reference/measured/`` (relative to the repository root; ``--data DIR``
overrides; without either, the rows of it this repository ships in
``tests/data/vidur_a100_sample/``, with a note) and prints, per point and in summary
(median / p90 absolute % error):

* per-layer token-wise ops of Llama-2-7B, Llama-3-8B and Llama-2-70B at TP 1/2/4/8:
  ``qkv_proj`` = attn_pre_proj, ``o_proj`` = attn_post_proj,
  ``mlp`` = mlp_up_proj + mlp_act + mlp_down_proj,
  ``elementwise`` = input_layernorm + post_attention_layernorm + attn_rope + add;
  overall, per model/op/TP, and the knee region (64 <= tokens <= 512) separately;
* the attention kernel (Llama-2-70B shapes at TP2): decode by batch x context, prefill by
  chunk x cached context;
* CPU overhead per iteration (fit of base + per-sequence cost);
* NCCL all-reduce inside one DGX A100 node (fit of latency + achievable link bandwidth).

``--fit`` re-derives the efficiencies (``batchsim.calibration.calibrate_ops``: the same fit and
held-out table as ``batchsim calibrate --hardware a100-80gb --ops DIR``, ~1 min on 2 cores)
and prints the values to put in the ``efficiency:`` block. Nothing in batchsim or its tests
reads the full measured data.

Usage::

    python benchmarks/calibrate_a100.py                 # evaluate the a100-80gb profile
    python benchmarks/calibrate_a100.py --fit           # re-derive the defaults
    python benchmarks/calibrate_a100.py --csv out.csv   # every point to a CSV
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from batchsim.calibration.fit import all_reduce_fit
from batchsim.calibration.held_out import calibrate_ops
from batchsim.calibration.measured import Measurements, read_measurements
from batchsim.calibration.predict import (
    layer_breakdown,
    predict_attention,
    with_terms,
    yaml_value,
)
from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile
from batchsim.catalog.hardware_files import load_hardware
from batchsim.cli.calibrate import print_ops
from batchsim.cost import RooflineCostModel
from batchsim.cost.comm import ring_all_reduce_time

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "reference" / "measured"
SAMPLE_DATA = REPO / "tests" / "data" / "vidur_a100_sample"
"""The rows of Vidur's data this repository ships (attribution and licence beside them): what
the script reads when the full data is not beside the checkout."""
KNEE = (64, 512)
GROUPS = {
    "qkv_proj": (["attn_pre_proj"], ["qkv_proj"]),
    "o_proj": (["attn_post_proj"], ["o_proj"]),
    "mlp": (["mlp_up_proj", "mlp_act", "mlp_down_proj"], ["mlp_up", "mlp_act", "mlp_down"]),
    "elementwise": (
        ["input_layernorm", "post_attention_layernorm", "attn_rope", "add"],
        ["norms", "rope", "add"],
    ),
}


def abs_err(pred: Iterable[float], meas: Iterable[float]) -> np.ndarray:
    p, m = np.asarray(list(pred), float), np.asarray(list(meas), float)
    return np.abs(p / m - 1.0) * 100.0


def stats(err: np.ndarray) -> tuple[float, float, int]:
    if len(err) == 0:
        return (math.nan, math.nan, 0)
    return float(np.median(err)), float(np.percentile(err, 90)), len(err)


# --------------------------------------------------------------------------- layer ops


def predict_layer_ops(meas: Measurements, hw: HardwareProfile) -> pd.DataFrame:
    """Model's per-layer time (s), FLOPs and bytes of every fine op for every measured row."""
    ops = meas.layer_ops
    rows = []
    cms: dict[tuple[str, int], RooflineCostModel] = {}
    for model, tp, tokens in ops[["model", "tp", "num_tokens"]].itertuples(index=False):
        key = (model, int(tp))
        if key not in cms:
            cms[key] = RooflineCostModel(meas.models[model], hw, tp=int(tp))
        bd = layer_breakdown(cms[key], int(tokens))
        row = {k: v.time for k, v in bd.items()}
        row.update({f"{k}:flops": v.flops for k, v in bd.items()})
        row.update({f"{k}:bytes": v.bytes for k, v in bd.items()})
        rows.append(row)
    return pd.DataFrame(rows, index=ops.index)


def layer_points(
    ops: pd.DataFrame,
    pred: pd.DataFrame,
    groups: dict[str, tuple[list[str], list[str]]] = GROUPS,
) -> pd.DataFrame:
    """Long table: model, tp, num_tokens, op, measured_s, predicted_s, err_pct; and the
    group's flops and bytes when ``pred`` has them (``predict_layer_ops``).

    ``groups``: op name -> (measured kernels, predicted kernels) summed into it.
    """
    recs = []
    for group, (meas_cols, pred_cols) in groups.items():
        meas = ops[meas_cols].sum(axis=1)
        p = pred[pred_cols].sum(axis=1)
        part = ops[["model", "tp", "num_tokens"]].copy()
        part["op"] = group
        part["measured_s"] = meas
        part["predicted_s"] = p
        for work in ("flops", "bytes"):
            cols = [f"{c}:{work}" for c in pred_cols]
            if set(cols) <= set(pred.columns):
                part[work] = pred[cols].sum(axis=1)
        recs.append(part)
    out = pd.concat(recs, ignore_index=True)
    out["err_pct"] = (out.predicted_s / out.measured_s - 1.0) * 100.0
    return out


def plain_roofline_points(ops: pd.DataFrame, pred: pd.DataFrame, hw: HardwareProfile):
    """Same comparison for a plain max(FLOPs/(peak*eff), bytes/(bw*eff)) per kernel."""
    peak = hw.peak_flops_for("bf16") * hw.compute_efficiency
    bw = hw.memory_bandwidth * hw.memory_efficiency
    plain = pd.DataFrame(index=pred.index)
    for k in ["qkv_proj", "o_proj", "mlp_up", "mlp_down", "mlp_act", "norms", "rope", "add"]:
        plain[k] = np.maximum(pred[f"{k}:flops"] / peak, pred[f"{k}:bytes"] / bw)
    return layer_points(ops, plain)


def summarize(points: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    err = points.err_pct.abs()
    g = err.groupby([points[c] for c in by]) if by else None
    if g is None:
        med, p90, n = stats(err.to_numpy())
        return pd.DataFrame([{"median_%": med, "p90_%": p90, "n": n}])
    return g.agg(
        **{
            "median_%": "median",
            "p90_%": lambda x: np.percentile(x, 90),
            "n": "size",
        }
    ).reset_index()


# --------------------------------------------------------------------------- attention


def attention_points(meas: Measurements, hw: HardwareProfile) -> pd.DataFrame:
    out = meas.attention.copy()
    out["predicted_s"] = predict_attention(out, meas.models, hw)
    out["err_pct"] = (out.predicted_s / out.measured_s - 1.0) * 100.0
    return out


# --------------------------------------------------------------------------- cpu / all-reduce


def fit_cpu(meas: Measurements) -> tuple[pd.DataFrame, dict[str, tuple[float, float, tuple]]]:
    """Least-squares base + per_seq (ms) of schedule + sampler + prepare_inputs + outputs.

    Returns the fit per model/TP and two pooled fits: ``single_gpu`` (TP=1 engines, the
    profile default, the rows ``batchsim calibrate`` fits) and ``all`` (every engine).
    """
    cpu = meas.cpu.assign(cpu_ms=meas.cpu.measured_s * 1e3)
    rows = []
    for (model, tp), g in cpu.groupby(["model", "tp"]):
        slope, base = np.polyfit(g.batch_size.to_numpy(float), g.cpu_ms.to_numpy(), 1)
        rows.append(
            {
                "model": model,
                "tp": tp,
                "base_ms": base,
                "per_seq_ms": slope,
                "bs8_ms": g.cpu_ms.iloc[0],
                "bs128_ms": g.cpu_ms.iloc[-1],
            }
        )
    pooled = {}
    for label, sel in [("single_gpu", cpu.tp == cpu.tp.min()), ("all", cpu.cpu_ms > 0)]:
        a = cpu[sel]
        slope, base = np.polyfit(a.batch_size.to_numpy(float), a.cpu_ms.to_numpy(), 1)
        err = abs_err(base + slope * a.batch_size, a.cpu_ms)
        pooled[label] = (float(base), float(slope), stats(err))
    return pd.DataFrame(rows), pooled


def all_reduce_points(ar: pd.DataFrame, latency: float, bw: float) -> pd.DataFrame:
    out = ar.copy()
    out["predicted_s"] = ring_all_reduce_time(out.bytes, out.num_workers, bw, latency)
    out["err_pct"] = (out.predicted_s / out.measured_s - 1.0) * 100.0
    return out


# --------------------------------------------------------------------------- printing


def print_table(df: pd.DataFrame, title: str, floatfmt: str = "{:.2f}") -> None:
    print(f"\n## {title}\n")
    cols = list(df.columns)
    cells = [
        [floatfmt.format(v) if isinstance(v, float) else str(v) for v in row]
        for row in df.itertuples(index=False)
    ]
    widths = [
        max(len(str(c)), *(len(r[i]) for r in cells)) if cells else len(str(c))
        for i, c in enumerate(cols)
    ]
    print("  ".join(str(c).rjust(w) for c, w in zip(cols, widths)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


def sample_tokens(tokens: pd.Series) -> pd.Series:
    """Rows printed per point by default: powers of two and every 32 inside the knee."""
    t = tokens.astype(int)
    pow2 = (t & (t - 1)) == 0
    return pow2 | (t.between(*KNEE) & (t % 32 == 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        help="directory of the measured CSVs (default: ../shared/reference/measured from the "
        "repository root, else the sample in tests/data/vidur_a100_sample)",
    )
    parser.add_argument("--hardware", default="a100-80gb", help="profile to evaluate")
    parser.add_argument("--fit", action="store_true", help="re-derive the default efficiencies")
    parser.add_argument(
        "--all-points",
        action="store_true",
        help="print every point (default: powers of two + knee every 32)",
    )
    parser.add_argument("--csv", type=Path, help="write every layer-op point to this CSV")
    args = parser.parse_args(argv)
    if args.data is None:
        args.data = DEFAULT_DATA if DEFAULT_DATA.is_dir() else SAMPLE_DATA
        if args.data == SAMPLE_DATA:
            print(
                "note: no ../shared/reference/measured beside the repository: reading the "
                "sample in tests/data/vidur_a100_sample (a few rows of Vidur's A100 data; "
                "--data DIR for the full set)",
                file=sys.stderr,
            )
    if not args.data.is_dir():
        parser.error(f"--data: no such directory: {args.data}")
    hw = load_hardware(args.hardware)
    pd.set_option("display.width", 200)
    meas = read_measurements([str(args.data)])

    if args.fit:
        print("# Fitting (batchsim.calibration.calibrate_ops: 5-fold held-out error)")
        result = calibrate_ops(meas, hw, folds=5)
        print_ops(result)
        hw = with_terms(hw, result.values)
        print("\nefficiency block:")
        for key in EFFICIENCY_KEYS:
            print(f"  {key}: {yaml_value(hw, key):g}")
        print(
            f"cpu_overhead: base_ms {yaml_value(hw, 'cpu_overhead.base_ms'):g}, "
            f"per_seq_ms {yaml_value(hw, 'cpu_overhead.per_seq_ms'):g}\n"
        )

    print(f"# batchsim cost model vs measured A100 (Vidur) — profile {hw.name}")
    print("efficiency: " + ", ".join(f"{k}={yaml_value(hw, k):g}" for k in EFFICIENCY_KEYS))

    # ---- per-layer ops
    ops = meas.layer_ops
    pred = predict_layer_ops(meas, hw)
    points = layer_points(ops, pred)
    if args.csv:
        points.to_csv(args.csv, index=False)
    wide = points.pivot_table(
        index=["model", "tp", "num_tokens"],
        columns="op",
        values=["measured_s", "predicted_s", "err_pct"],
    ).reset_index()
    shown = wide[sample_tokens(wide["num_tokens"])] if not args.all_points else wide
    table = pd.DataFrame(
        {"model": shown["model"], "tp": shown["tp"], "tokens": shown["num_tokens"]}
    )
    for op in GROUPS:
        table[f"{op}_meas_us"] = shown[("measured_s", op)] * 1e6
        table[f"{op}_pred_us"] = shown[("predicted_s", op)] * 1e6
        table[f"{op}_err%"] = shown[("err_pct", op)]
    print_table(table, "Per-layer ops per point (us; err = pred/meas - 1)", "{:.1f}")

    knee = points[points.num_tokens.between(*KNEE)]
    print_table(
        summarize(points, ["model", "op", "tp"]),
        "Per-layer ops: |error| by model / op / TP (all tokens)",
    )
    print_table(
        summarize(knee, ["model", "op", "tp"]),
        f"Per-layer ops: |error| by model / op / TP, knee {KNEE[0]}-{KNEE[1]} tokens",
    )
    print_table(summarize(points, ["op"]), "Per-layer ops: |error| by op")
    print_table(summarize(knee, ["op"]), "Per-layer ops: |error| by op, knee region")
    linear = points[points.op != "elementwise"]
    lknee = linear[linear.num_tokens.between(*KNEE)]
    plain = plain_roofline_points(ops, pred, hw)
    plain_lin = plain[plain.op != "elementwise"]
    summary_rows = []
    for label, pts in [
        ("linear ops (qkv, o, mlp), all tokens", linear),
        ("linear ops, knee 64-512", lknee),
        ("all four groups, all tokens", points),
        ("all four groups, knee 64-512", knee),
        ("plain max(compute, memory): linear ops", plain_lin),
        (
            "plain max(compute, memory): linear, knee",
            plain_lin[plain_lin.num_tokens.between(*KNEE)],
        ),
    ]:
        med, p90, n = stats(pts.err_pct.abs().to_numpy())
        summary_rows.append({"set": label, "median_%": med, "p90_%": p90, "n": n})
    print_table(pd.DataFrame(summary_rows), "Per-layer ops: overall")

    # ---- attention
    apts = attention_points(meas, hw)
    shown = (
        apts[
            (
                (apts.kind == "decode")
                & apts.batch_size.isin([1, 2, 4, 8, 16, 32, 64, 128])
                & apts.kv_cache_size.isin([32, 128, 512, 1024, 2048, 4032])
            )
            | (
                (apts.kind == "prefill")
                & apts.chunk.isin([64, 128, 256, 512, 1024, 2048, 4096])
                & apts.kv_cache_size.isin([0, 128, 512, 1024, 2048])
            )
        ]
        if not args.all_points
        else apts
    )
    t = shown.assign(measured_us=shown.measured_s * 1e6, predicted_us=shown.predicted_s * 1e6)
    print_table(
        t[
            [
                "kind",
                "batch_size",
                "chunk",
                "kv_cache_size",
                "measured_us",
                "predicted_us",
                "err_pct",
            ]
        ],
        "Attention kernel (Llama-2-70B TP2 shapes) per point",
        "{:.1f}",
    )
    arows = []
    for label, sel in [
        ("decode", apts.kind == "decode"),
        ("prefill", apts.kind == "prefill"),
        ("prefill, no cached context", (apts.kind == "prefill") & (apts.kv_cache_size == 0)),
        ("prefill over a cached context", (apts.kind == "prefill") & (apts.kv_cache_size > 0)),
        ("all", apts.kind.notna()),
    ]:
        med, p90, n = stats(apts[sel].err_pct.abs().to_numpy())
        arows.append({"set": label, "median_%": med, "p90_%": p90, "n": n})
    print_table(pd.DataFrame(arows), "Attention kernel: |error|")

    # ---- cpu overhead
    cpu_fits, cpu_pooled = fit_cpu(meas)
    print_table(cpu_fits, "CPU overhead per iteration: linear fit per model/TP (ms)", "{:.3f}")
    print()
    for label, (base, slope, (med, p90, n)) in cpu_pooled.items():
        print(
            f"pooled fit ({label} engines): base {base:.3f} ms + {slope:.4f} ms/seq "
            f"(|error| median {med:.1f} %, p90 {p90:.1f} %, n={n})"
        )
    print(
        f"profile {hw.name}: base {hw.cpu_overhead_base * 1e3:.3f} ms + "
        f"{hw.cpu_overhead_per_seq * 1e3:.4f} ms/seq"
    )

    # ---- all-reduce
    ar = meas.all_reduce
    found = all_reduce_fit(ar)
    lat, bus = found if found is not None else (math.nan, math.nan)
    arpts = all_reduce_points(
        ar, hw.interconnect_latency, hw.interconnect_bandwidth * hw.interconnect_efficiency
    )
    rows = []
    for n_gpu, g in arpts.groupby("num_workers"):
        med, p90, n = stats(g.err_pct.abs().to_numpy())
        small = g[g.bytes <= 1 << 20]
        rows.append(
            {
                "gpus": n_gpu,
                "median_%": med,
                "p90_%": p90,
                "median_small_%": stats(small.err_pct.abs().to_numpy())[0],
                "n": n,
            }
        )
    eff = bus / hw.interconnect_bandwidth
    print(
        f"\n## All-reduce inside a DGX A100 node\n\nfit: latency {lat * 1e6:.1f} us, "
        f"bus bandwidth {bus / 1e9:.0f} GB/s = {eff:.2f} x "
        f"{hw.interconnect_bandwidth / 1e9:.0f} GB/s; profile: latency "
        f"{hw.interconnect_latency * 1e6:.1f} us, efficiency {hw.interconnect_efficiency:.2f}"
    )
    print_table(pd.DataFrame(rows), "All-reduce |error| with the profile values (<= 64 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
