"""Kernel fidelity on GPUs no term was fitted on: the shipped profiles against measured tables.

    python benchmarks/heldout_kernels.py --aic PATH/TO/aiconfigurator

For each GPU below, the shipped profile (``hardware_profiles/<name>.yaml`` with its GEMM
table) predicts every GEMM of the GPU's measured kernel table (NVIDIA AIConfigurator, github
ai-dynamo/aiconfigurator, Apache-2.0: ``aic-core/src/aiconfigurator_core/systems/data/<gpu>/
gemm/vllm/0.24.0/gemm_perf.parquet``), and the table prints, per dtype, the median and p90
absolute error over the kernels of 5 us or more with n, k >= 128, and the median signed error
(+: batchsim too slow). The profile's error without its correction grid (its terms alone) is
beside it.

- **held out**: H200 and GB200. Their profiles are their datasheets plus the GEMM terms and
  the correction grid fitted on their family (H100, B200) by ``benchmarks/calibrate_kernels.py``;
  nothing was fitted, tuned or chosen on their tables. Targets: median <= 5 %, p90 <= 15 %.
- **sibling check** (not held out, for the design): B300's table priced by a B300 profile
  that takes B200's terms and grid as a held-out GPU would (its own fitted ones are shipped).
- **fitted**: H100, B200, B300 on the tables they were fitted on (the grid reproduces them).

Then the fused MoE kernels of each GPU's ``moe/vllm/0.24.0/moe_perf.parquet`` (balanced
routing, no expert parallelism; bf16, fp8 per-tensor, fp8 block-scaled and, where measured,
NVFP4 experts), priced by ``batchsim kernel moe`` — the routed experts' grouped GEMMs as a
simulation prices them, with the profile's ``moe_compute`` (fitted on the bf16 MoE kernels of
H100, B200 and B300 by ``benchmarks/calibrate_kernels.py``; H200 and GB200 take their
family's). The measured kernel also routes, permutes and activates the tokens, which the price
leaves out.

Last, the attention kernels of ``attention/vllm/0.24.0/{context,generation}_attention_perf
.parquet`` (full attention, no window; context: ``batch`` prompts of ``isl`` tokens on an empty
cache; generation: ``batch`` decode rows after ``step`` cached tokens), priced by ``batchsim
kernel attention`` with the profile's attention terms (fitted on the bf16 kernels of H100,
B200, B300 and GB300's tables by ``benchmarks/calibrate_kernels.py``; H200 and GB200 take their
family's). All-reduce kernels are not in this script yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from batchsim.calibration.attention_tables import (  # noqa: E402
    attention_errors,
    read_attention_measurements,
)
from batchsim.calibration.kernel_tables import gemm_errors, read_gemm_measurements  # noqa: E402
from batchsim.calibration.moe_tables import moe_errors, read_moe_measurements  # noqa: E402
from batchsim.catalog.hardware import EFFICIENCY_KEYS  # noqa: E402
from batchsim.catalog.hardware_files import load_hardware  # noqa: E402

DATA = "aic-core/src/aiconfigurator_core/systems/data"
CASES = (
    ("held out", "h200", "h200", "h200_sxm"),
    ("held out", "gb200", "gb200", "gb200"),
    ("sibling check", "b300 as B200's sibling", "b300:b200", "b300_sxm"),
    ("fitted", "h100-sxm", "h100-sxm", "h100_sxm"),
    ("fitted", "b200", "b200", "b200_sxm"),
    ("fitted", "b300", "b300", "b300_sxm"),
)
GEMM_TERMS = ("compute", "memory", "min_kernel_time_us", "transition_exponent", "moe_compute")


def profile(spec: str):  # type: ignore[no-untyped-def]
    """``name`` or ``name:family`` (``name``'s datasheet, ``family``'s GEMM terms and grid)."""
    name, _, family = spec.partition(":")
    hw = load_hardware(name)
    if not family:
        return hw
    fam = load_hardware(family)
    eff = dict(hw.efficiency)
    attrs = {}
    for key in GEMM_TERMS:
        si = EFFICIENCY_KEYS[key].si_name
        eff[si] = fam.efficiency[si]
        if hasattr(hw, si):
            attrs[si] = fam.efficiency[si]
    return dataclasses.replace(hw, efficiency=eff, gemm_table=fam.gemm_table, **attrs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic", required=True, type=Path, help="an AIConfigurator checkout")
    parser.add_argument("--framework", default="vllm/0.24.0", help="tables of this version")
    args = parser.parse_args(argv)
    header = (
        f"{'':14s}{'profile':24s}{'dtype':10s}{'kernels':>8s}  {'median':>7s}  {'p90':>6s}"
        f"  {'signed':>7s}   terms only (median / p90)"
    )
    print(f"GEMM |error| % over kernels >= 5 us, n and k >= 128 ({args.framework} tables)")
    print(header)
    for group, label, spec, system in CASES:
        path = args.aic / DATA / system / "gemm" / args.framework / "gemm_perf.parquet"
        if not path.is_file():
            print(f"{group:14s}{label:24s}(no table {path.name} for {system})")
            continue
        rows = read_gemm_measurements(path)
        hw = profile(spec)
        with_grid = gemm_errors(hw, rows)
        bare = gemm_errors(hw, rows, corrected=False)
        for (_, e), (_, b) in zip(with_grid.iterrows(), bare.iterrows()):
            print(
                f"{group:14s}{label:24s}{e['dtype']:10s}{int(e['kernels']):>8,}  "
                f"{e['median_err_pct']:6.1f}%  {e['p90_err_pct']:5.1f}%  "
                f"{e['median_signed_pct']:+6.1f}%   {b['median_err_pct']:.1f} / "
                f"{b['p90_err_pct']:.1f}"
            )
    moe_table(args.aic, args.framework)
    attention_table(args.aic, args.framework)
    return 0


def moe_table(aic: Path, framework: str) -> None:
    print(f"\nMoE |error| % over fused MoE kernels >= 5 us, no EP, balanced ({framework} tables)")
    head = f"{'':14s}{'profile':24s}{'dtype':10s}{'kernels':>8s}  {'median':>7s}  {'p90':>6s}"
    print(f"{head}  signed")
    for group, label, spec, system in CASES:
        group = group if group == "held out" else "not held out"  # no MoE term is fitted
        path = aic / DATA / system / "moe" / framework / "moe_perf.parquet"
        if not path.is_file():
            print(f"{group:14s}{label:24s}(no table {path.name} for {system})")
            continue
        for _, e in moe_errors(profile(spec), read_moe_measurements(path)).iterrows():
            print(
                f"{group:14s}{label:24s}{e['dtype']:10s}{int(e['kernels']):>8,}  "
                f"{e['median_err_pct']:6.1f}%  {e['p90_err_pct']:5.1f}%  "
                f"{e['median_signed_pct']:+6.1f}%"
            )


def attention_table(aic: Path, framework: str) -> None:
    print(f"\nattention |error| % over kernels >= 5 us, full attention ({framework} tables)")
    head = f"{'':14s}{'profile':24s}{'phase':11s}{'kv':6s}{'kernels':>8s}  {'median':>7s}"
    print(f"{head}  {'p90':>6s}  signed")
    for group, label, spec, system in CASES:
        group = group if group == "held out" else "not held out"
        for phase in ("context", "generation"):
            path = aic / DATA / system / "attention" / framework / f"{phase}_attention_perf.parquet"
            if not path.is_file():
                continue
            rows = read_attention_measurements(path, phase)
            for _, e in attention_errors(profile(spec), rows).iterrows():
                print(
                    f"{group:14s}{label:24s}{phase:11s}{e['dtype']:6s}{int(e['kernels']):>8,}  "
                    f"{e['median_err_pct']:6.1f}%  {e['p90_err_pct']:5.1f}%  "
                    f"{e['median_signed_pct']:+6.1f}%"
                )


if __name__ == "__main__":
    raise SystemExit(main())
