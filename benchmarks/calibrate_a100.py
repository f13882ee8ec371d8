"""Compare batchsim's roofline cost model with measured A100 operator timings (Vidur, MIT).

Reads the CSVs of ``../shared/reference/measured/`` (relative to the repository root;
``--data DIR`` overrides) and prints, per point and in summary (median / p90 absolute % error):

* per-layer token-wise ops of Llama-2-7B, Llama-3-8B and Llama-2-70B at TP 1/2/4/8:
  ``qkv_proj`` = attn_pre_proj, ``o_proj`` = attn_post_proj,
  ``mlp`` = mlp_up_proj + mlp_act + mlp_down_proj,
  ``elementwise`` = input_layernorm + post_attention_layernorm + attn_rope + add;
  overall, per model/op/TP, and the knee region (64 <= tokens <= 512) separately;
* the attention kernel (Llama-2-70B shapes at TP2): decode by batch x context, prefill by
  chunk x cached context;
* CPU overhead per iteration (fit of base + per-sequence cost);
* NCCL all-reduce inside one DGX A100 node (fit of latency + achievable link bandwidth).

``--fit`` re-derives the default efficiencies by grid search (a few minutes on 2 cores) and
prints the values to put in the ``efficiency:`` block. The script is not part of the package;
nothing in batchsim or its tests reads the measured data.

Usage::

    python benchmarks/calibrate_a100.py                 # evaluate the a100-80gb profile
    python benchmarks/calibrate_a100.py --fit           # re-derive the defaults
    python benchmarks/calibrate_a100.py --csv out.csv   # every point to a CSV
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from batchsim.catalog.hardware import EFFICIENCY_KEYS, HardwareProfile, load_hardware
from batchsim.catalog.model import load_model
from batchsim.cost import OpCost, RooflineCostModel
from batchsim.cost.comm import ring_all_reduce_link_bytes, ring_all_reduce_time
from batchsim.cost.costs import CostSum
from batchsim.cost.gemm import Gemm
from batchsim.cost.layers import ElementwiseKernel, activation_flops

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "reference" / "measured"
MODELS = {"llama-2-7b": "llama-2-7b", "llama-3-8b": "llama-3-8b", "llama-2-70b": "llama-2-70b"}
KNEE = (64, 512)
DECODE = (1, 32)  # token counts of small decode batches
GROUPS = {
    "qkv_proj": (["attn_pre_proj"], ["qkv_proj"]),
    "o_proj": (["attn_post_proj"], ["o_proj"]),
    "mlp": (["mlp_up_proj", "mlp_act", "mlp_down_proj"], ["mlp_up", "mlp_act", "mlp_down"]),
    "elementwise": (
        ["input_layernorm", "post_attention_layernorm", "attn_rope", "add"],
        ["norms", "rope", "add"],
    ),
}


def with_efficiency(hw: HardwareProfile, **yaml_values: float) -> HardwareProfile:
    """Copy of ``hw`` with some ``efficiency:`` terms replaced (YAML units)."""
    eff = dict(hw.efficiency)
    attrs = {}
    for key, value in yaml_values.items():
        spec = EFFICIENCY_KEYS[key]
        eff[spec.si_name] = value / spec.per_si
        if spec.si_name in {f.name for f in dataclasses.fields(HardwareProfile)}:
            attrs[spec.si_name] = value / spec.per_si
    return dataclasses.replace(hw, efficiency=eff, **attrs)


def yaml_value(hw: HardwareProfile, key: str) -> float:
    spec = EFFICIENCY_KEYS[key]
    return hw.efficiency[spec.si_name] * spec.per_si


def abs_err(pred: Iterable[float], meas: Iterable[float]) -> np.ndarray:
    p, m = np.asarray(list(pred), float), np.asarray(list(meas), float)
    return np.abs(p / m - 1.0) * 100.0


def stats(err: np.ndarray) -> tuple[float, float, int]:
    if len(err) == 0:
        return (math.nan, math.nan, 0)
    return float(np.median(err)), float(np.percentile(err, 90)), len(err)


# --------------------------------------------------------------------------- layer ops


def load_layer_ops(data: Path) -> pd.DataFrame:
    """One row per (model, tp, num_tokens) with the median time (s) of each measured op."""
    frames = []
    for name in MODELS:
        df = pd.read_csv(data / f"a100_{name}_mlp.csv")
        cols = [c for c in df.columns if c.startswith("time_stats.") and c.endswith(".median")]
        df = df.groupby(["num_tensor_parallel_workers", "num_tokens"])[cols].median().reset_index()
        df.columns = [c.removeprefix("time_stats.").removesuffix(".median") for c in df.columns]
        df = df.rename(columns={"num_tensor_parallel_workers": "tp"})
        df.insert(0, "model", name)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    op_cols = [c for c in out.columns if c not in ("model", "tp", "num_tokens")]
    out[op_cols] = out[op_cols] * 1e-3  # ms -> s
    return out


def layer_breakdown(cm: RooflineCostModel, num_tokens: int) -> dict[str, OpCost]:
    """Per-layer costs of the token-wise kernels of one dense layer for ``num_tokens`` rows,
    on one GPU, priced by the cost model's own GEMM and elementwise models.

    Keys: ``qkv_proj``, ``o_proj``, ``mlp_up``, ``mlp_down``, ``mlp_act``, ``norms`` (both
    norms), ``rope``, ``add`` (the measured ops are per kernel; the simulator sums them).
    """
    t, layers = float(num_tokens), cm.layers

    def gemms(shapes: Iterable[Gemm]) -> OpCost:
        acc = CostSum()
        cm.gemm.add(acc, shapes, t, 1.0)
        return acc.op()

    def elementwise(elems: float, flops: float, launches: int) -> OpCost:
        acc = CostSum()
        acc.add(cm.elementwise.price(elems, flops, launches))
        return acc.op()

    def kernel(k: ElementwiseKernel) -> OpCost:
        return elementwise(t * k.elems, t * k.flops, k.launches)

    act = t * layers.activation_width * layers.gate_factor
    return {
        "qkv_proj": gemms(layers.qkv),
        "o_proj": gemms(layers.o),
        "mlp_up": gemms(layers.dense_mlp[:1]),
        "mlp_down": gemms(layers.dense_mlp[1:]),
        "mlp_act": elementwise(act, activation_flops(act), 1),
        "norms": kernel(layers.norms),
        "rope": kernel(layers.rope),
        "add": kernel(layers.residual_add),
    }


def predict_layer_ops(ops: pd.DataFrame, hw: HardwareProfile) -> pd.DataFrame:
    """Model's per-layer time (s) of every fine op for every measured row."""
    models = {name: load_model(spec) for name, spec in MODELS.items()}
    rows = []
    cms: dict[tuple[str, int], RooflineCostModel] = {}
    for model, tp, tokens in ops[["model", "tp", "num_tokens"]].itertuples(index=False):
        key = (model, int(tp))
        if key not in cms:
            cms[key] = RooflineCostModel(models[model], hw, tp=int(tp))
        bd = layer_breakdown(cms[key], int(tokens))
        row = {k: v.time for k, v in bd.items()}
        row.update({f"{k}:flops": v.flops for k, v in bd.items()})
        row.update({f"{k}:bytes": v.bytes for k, v in bd.items()})
        rows.append(row)
    return pd.DataFrame(rows, index=ops.index)


def layer_points(ops: pd.DataFrame, pred: pd.DataFrame) -> pd.DataFrame:
    """Long table: model, tp, num_tokens, op, measured_s, predicted_s, err_pct."""
    recs = []
    for group, (meas_cols, pred_cols) in GROUPS.items():
        meas = ops[meas_cols].sum(axis=1)
        p = pred[pred_cols].sum(axis=1)
        part = ops[["model", "tp", "num_tokens"]].copy()
        part["op"] = group
        part["measured_s"] = meas
        part["predicted_s"] = p
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


def load_attention(data: Path) -> pd.DataFrame:
    df = pd.read_csv(data / "a100_llama-2-70b_tp2_attention.csv")
    dec = df[~df.is_prefill]
    dec = dec.groupby(["batch_size", "kv_cache_size"])["time_stats.attn_decode.median"].median()
    dec = dec.reset_index().rename(columns={"time_stats.attn_decode.median": "measured_ms"})
    dec["kind"] = "decode"
    dec["chunk"] = 1
    pre = df[df.is_prefill]
    pre = pre.groupby(["prefill_chunk_size", "kv_cache_size"])["time_stats.attn_prefill.median"]
    pre = pre.median().reset_index()
    pre = pre.rename(
        columns={"time_stats.attn_prefill.median": "measured_ms", "prefill_chunk_size": "chunk"}
    )
    pre["kind"] = "prefill"
    pre["batch_size"] = 1
    out = pd.concat([dec, pre], ignore_index=True)
    out["measured_s"] = out.measured_ms * 1e-3
    # the profiler padded every block table to max_model_len: FlashAttention's split-KV
    # heuristic sees that key length, whatever the context
    out["split_tokens"] = float(df.max_model_len.max())
    return out[["kind", "batch_size", "chunk", "kv_cache_size", "split_tokens", "measured_s"]]


def predict_attention(att: pd.DataFrame, hw: HardwareProfile) -> pd.DataFrame:
    cm = RooflineCostModel(load_model("llama-2-70b"), hw, tp=2)
    pred = []
    cols = ["kind", "batch_size", "chunk", "kv_cache_size", "split_tokens"]
    for kind, b, q, c, split in att[cols].itertuples(index=False):
        b, q, c = int(b), int(q), int(c)
        pairs = b * (q * c + q * (q + 1) // 2)
        prefill = b * q if kind == "prefill" else 0
        pred.append(cm.attention_kernel(b, b * q, b * c, pairs, prefill, split).time)
    out = att.copy()
    out["predicted_s"] = pred
    out["err_pct"] = (out.predicted_s / out.measured_s - 1.0) * 100.0
    return out


# --------------------------------------------------------------------------- cpu / all-reduce


def fit_cpu(data: Path) -> tuple[pd.DataFrame, dict[str, tuple[float, float, tuple]]]:
    """Least-squares base + per_seq (ms) of schedule + sampler + prepare_inputs + outputs.

    Returns the fit per model/TP and two pooled fits: ``single_gpu`` (TP=1 engines, the
    profile default) and ``all`` (every engine; TP>=2 rows exclude the Ray RPC time).
    """
    df = pd.read_csv(data / "a100_cpu_overheads.csv")
    parts = [
        "schedule_median",
        "sampler_e2e_median",
        "prepare_inputs_e2e_median",
        "process_model_outputs_median",
    ]
    df["cpu_ms"] = df[parts].sum(axis=1)
    rows = []
    for (model, tp), g in df.groupby(["model_name", "tensor_parallel_degree"]):
        g = g.groupby("batch_size").cpu_ms.median()
        slope, base = np.polyfit(g.index.to_numpy(float), g.to_numpy(), 1)
        rows.append(
            {
                "model": model,
                "tp": tp,
                "base_ms": base,
                "per_seq_ms": slope,
                "bs8_ms": g.iloc[0],
                "bs128_ms": g.iloc[-1],
            }
        )
    agg = df.groupby(["model_name", "tensor_parallel_degree", "batch_size"]).cpu_ms.median()
    agg = agg.reset_index()
    pooled = {}
    for label, sel in [("single_gpu", agg.tensor_parallel_degree == 1), ("all", agg.cpu_ms > 0)]:
        a = agg[sel]
        slope, base = np.polyfit(a.batch_size.to_numpy(float), a.cpu_ms.to_numpy(), 1)
        err = abs_err(base + slope * a.batch_size, a.cpu_ms)
        pooled[label] = (float(base), float(slope), stats(err))
    return pd.DataFrame(rows), pooled


def load_all_reduce(data: Path) -> pd.DataFrame:
    df = pd.read_csv(data / "a100_dgx_all_reduce.csv")
    df = df[df.devices_per_node == df.num_workers]  # inside one node (NVLink/NVSwitch)
    df = df.groupby(["num_workers", "size"])["time_stats.all_reduce.median"].median().reset_index()
    df["bytes"] = df["size"] * 2.0  # fp16 elements
    df["measured_s"] = df["time_stats.all_reduce.median"] * 1e-3
    return df[["num_workers", "bytes", "measured_s"]]


def fit_all_reduce(ar: pd.DataFrame, link_bw: float) -> tuple[float, float, pd.DataFrame]:
    """Fit t = latency + 2(n-1)/n * bytes / (link_bw * eff) over messages <= 64 MiB."""
    sel = ar[ar.bytes <= 64 * 2**20]
    x = ring_all_reduce_link_bytes(sel.bytes, sel.num_workers)
    # least squares on relative error: weight 1/t
    w = 1.0 / sel.measured_s
    a = np.vstack([np.ones(len(x)), x]).T * w.to_numpy()[:, None]
    coef, *_ = np.linalg.lstsq(a, sel.measured_s.to_numpy() * w.to_numpy(), rcond=None)
    latency, inv_bw = float(coef[0]), float(coef[1])
    eff = 1.0 / inv_bw / link_bw
    return latency, eff, sel


def all_reduce_points(sel: pd.DataFrame, latency: float, bw: float) -> pd.DataFrame:
    out = sel.copy()
    out["predicted_s"] = ring_all_reduce_time(out.bytes, out.num_workers, bw, latency)
    out["err_pct"] = (out.predicted_s / out.measured_s - 1.0) * 100.0
    return out


# --------------------------------------------------------------------------- fitting


def objective(err: np.ndarray, knee: np.ndarray, small: np.ndarray) -> float:
    """Fit score, 1 at the targets: mean of median/5 % and p90/15 % over all points, the same
    over the knee region, and median/5 % over small decode batches (1-32 tokens), so that
    neither the many large-token points nor the knee can hide a bad decode regime."""
    return float(
        np.mean(
            [
                np.median(err) / 5,
                np.percentile(err, 90) / 15,
                np.median(knee) / 5,
                np.percentile(knee, 90) / 15,
                np.median(small) / 5,
            ]
        )
    )


def fit_gemm(ops: pd.DataFrame, hw: HardwareProfile) -> dict[str, float]:
    """Grid search of compute, memory, min_kernel_time_us, transition_exponent.

    Scored with :func:`objective` on the reported linear groups (qkv_proj, o_proj,
    mlp = up + act + down).
    """
    best = None
    grid = itertools.product(
        [0.68, 0.70, 0.72, 0.74, 0.76],
        [0.78, 0.80, 0.82, 0.84, 0.86],
        [4.0, 4.5, 5.0, 5.5],
        [1.5, 2.0, 2.5, 3.0],
    )
    for ec, em, lat, p in grid:
        h = with_efficiency(
            hw, compute=ec, memory=em, min_kernel_time_us=lat, transition_exponent=p
        )
        pts = layer_points(ops, predict_layer_ops(ops, h))
        pts = pts[pts.op != "elementwise"]
        errs = pts.err_pct.abs().to_numpy()
        kn = pts[pts.num_tokens.between(*KNEE)].err_pct.abs().to_numpy()
        small = pts[pts.num_tokens.between(*DECODE)].err_pct.abs().to_numpy()
        score = objective(errs, kn, small)
        if best is None or score < best[0]:
            best = (
                score,
                dict(compute=ec, memory=em, min_kernel_time_us=lat, transition_exponent=p),
                stats(errs),
                stats(kn),
            )
        print(
            f"  compute={ec:.2f} memory={em:.2f} min_kernel_time_us={lat:.1f} p={p:.1f}: "
            f"all {np.median(errs):5.2f}/{np.percentile(errs, 90):5.2f}  "
            f"knee {np.median(kn):5.2f}/{np.percentile(kn, 90):5.2f}",
            file=sys.stderr,
        )
    assert best is not None
    print(
        f"best GEMM terms: {best[1]}  linear groups median/p90 {best[2][0]:.2f}/"
        f"{best[2][1]:.2f}, knee {best[3][0]:.2f}/{best[3][1]:.2f}"
    )
    return best[1]


def fit_elementwise(ops: pd.DataFrame, hw: HardwareProfile) -> tuple[float, float]:
    """Grid search of elementwise efficiency and kernel time on norms + rope + add + act.

    Scored with :func:`objective`.
    """
    best = None
    meas_cols = ["input_layernorm", "post_attention_layernorm", "attn_rope", "add", "mlp_act"]
    knee = ops.num_tokens.between(*KNEE).to_numpy()
    small = ops.num_tokens.between(*DECODE).to_numpy()
    meas = ops[meas_cols].sum(axis=1).to_numpy()
    for eff, lat in itertools.product(np.arange(0.40, 0.61, 0.025), [1.5, 2.0, 2.5, 3.0, 3.5, 4.0]):
        h = with_efficiency(hw, elementwise=float(eff), elementwise_kernel_time_us=lat)
        pred = predict_layer_ops(ops, h)[["norms", "rope", "add", "mlp_act"]].sum(axis=1)
        err = abs_err(pred, meas)
        kn = err[knee]
        score = objective(err, kn, err[small])
        if best is None or score < best[0]:
            best = (score, float(eff), lat, stats(err), stats(kn))
    assert best is not None
    print(
        f"best elementwise efficiency {best[1]:.3f}, kernel time {best[2]:.1f} us: "
        f"median/p90 {best[3][0]:.2f}/{best[3][1]:.2f}, knee {best[4][0]:.2f}/"
        f"{best[4][1]:.2f} (norms+rope+add+act)"
    )
    return round(best[1], 3), best[2]


ATTENTION_TERMS = (
    "attention_kernel_time_us",
    "attention_sm_bandwidth",
    "attention_cta_time_us",
    "attention_combine_time_us",
    "attention_prefill_time_us",
    "attention",
    "attention_masked_fraction",
)


def fit_attention(att: pd.DataFrame, hw: HardwareProfile, passes: int = 3) -> dict[str, float]:
    """Coordinate search of the attention terms on both tables.

    Score: median/5 % + p90/15 % of the decode points plus the same of the prefill points
    (each table weighted alike). Every pass tries each term at x0.8 ... x1.25 of its value.
    """
    values = {k: yaml_value(hw, k) for k in ATTENTION_TERMS}

    def score(vals: dict[str, float]) -> float:
        pts = predict_attention(att, with_efficiency(hw, **vals))
        total = 0.0
        for kind in ("decode", "prefill"):
            err = pts[pts.kind == kind].err_pct.abs().to_numpy()
            total += np.median(err) / 5 + np.percentile(err, 90) / 15
        return total

    best = score(values)
    for _ in range(passes):
        for key in ATTENTION_TERMS:
            for factor in (0.8, 0.9, 0.95, 1.05, 1.1, 1.25):
                trial = dict(values, **{key: round(values[key] * factor, 3)})
                if key == "attention" and trial[key] > 1:
                    continue
                s = score(trial)
                if s < best:
                    best, values = s, trial
        print(f"  attention terms {values}: score {best:.3f}", file=sys.stderr)
    print("best attention terms: " + ", ".join(f"{k}={v:g}" for k, v in values.items()))
    return values


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help=f"directory of the measured CSVs (default: {DEFAULT_DATA})",
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
    if not args.data.is_dir():
        parser.error(f"--data: no such directory: {args.data}")
    hw = load_hardware(args.hardware)
    pd.set_option("display.width", 200)

    ops = load_layer_ops(args.data)
    att = load_attention(args.data)
    cpu_fits, cpu_pooled = fit_cpu(args.data)
    ar = load_all_reduce(args.data)

    if args.fit:
        print("# Fitting (grid search; progress on stderr)")
        ew, ew_lat = fit_elementwise(ops, hw)
        hw = with_efficiency(hw, elementwise=ew, elementwise_kernel_time_us=ew_lat)
        gemm = fit_gemm(ops, hw)
        hw = with_efficiency(hw, **gemm)
        hw = with_efficiency(hw, **fit_attention(att, hw))
        lat, eff = fit_all_reduce(ar, hw.interconnect_bandwidth)[:2]
        print(
            f"all-reduce: latency {lat * 1e6:.1f} us, link efficiency {eff:.3f} of "
            f"{hw.interconnect_bandwidth / 1e9:.0f} GB/s"
        )
        base, slope, _ = cpu_pooled["single_gpu"]
        print(f"cpu overhead (single-GPU engines): base {base:.3f} ms + {slope:.4f} ms/seq")
        print("\nefficiency block:")
        for key in EFFICIENCY_KEYS:
            print(f"  {key}: {yaml_value(hw, key):g}")

    print(f"# batchsim cost model vs measured A100 (Vidur) — profile {hw.name}")
    print("efficiency: " + ", ".join(f"{k}={yaml_value(hw, k):g}" for k in EFFICIENCY_KEYS))

    # ---- per-layer ops
    pred = predict_layer_ops(ops, hw)
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
    apts = predict_attention(att, hw)
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
    lat, eff, sel = fit_all_reduce(ar, hw.interconnect_bandwidth)
    arpts = all_reduce_points(
        sel, hw.interconnect_latency, hw.interconnect_bandwidth * hw.interconnect_efficiency
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
    print(
        f"\n## All-reduce inside a DGX A100 node\n\nfit: latency {lat * 1e6:.1f} us, "
        f"bus bandwidth {eff * hw.interconnect_bandwidth / 1e9:.0f} GB/s = {eff:.2f} x "
        f"{hw.interconnect_bandwidth / 1e9:.0f} GB/s; profile: latency "
        f"{hw.interconnect_latency * 1e6:.1f} us, efficiency {hw.interconnect_efficiency:.2f}"
    )
    print_table(pd.DataFrame(rows), "All-reduce |error| with the profile values (<= 64 MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
