"""Refit the shipped profiles' GEMM terms and corrections from measured kernel tables.

    python benchmarks/calibrate_kernels.py --aic PATH/TO/aiconfigurator   # rewrite them
    python benchmarks/calibrate_kernels.py --aic PATH --check            # print, write nothing

The measurements are NVIDIA AIConfigurator's GEMM kernel tables (github ai-dynamo/aiconfigurator,
Apache-2.0; see NOTICE): ``aic-core/src/aiconfigurator_core/systems/data/<gpu>/gemm/vllm/
<version>/gemm_perf.parquet``, one latency per (dtype, m, n, k) of the kernels vLLM runs. For
each GPU of :data:`FITS` this runs what ``batchsim calibrate --kernel-table`` runs — the four
GEMM terms (``compute``, ``memory``, ``min_kernel_time_us``, ``transition_exponent``) by
coordinate search from the same start (:data:`START`, the A100-derived values every profile
had before), then the ln(measured / modelled) grid — and writes
``hardware_profiles/<name>.gemm.csv`` and the four terms into ``<name>.yaml``. Then, on the
same GPU's fused-MoE table (``moe/<version>/moe_perf.parquet``), ``moe_compute``
(:func:`~batchsim.calibration.moe_tables.fit_moe_compute`), and on its attention tables
(``attention/<version>/{context,generation}_attention_perf.parquet``) the seven attention
terms (:func:`~batchsim.calibration.attention_tables.fit_attention_terms`), each written into
``<name>.yaml`` with its source.

The GPUs of :data:`COMPARED` (the A100) are only compared with their table, with the shipped
terms: printed, nothing written.

H200 and GB200 are held out: nothing here reads their tables. Their profiles take the terms
and the correction grid of their family (``h200``: ``h100-sxm``'s; ``gb200``: ``b200``'s), as
:data:`FAMILY` says, and ``benchmarks/heldout_kernels.py`` measures how well that predicts
their own tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from batchsim.calibration.attention_tables import (  # noqa: E402
    attention_errors,
    fit_attention_terms,
    read_attention_measurements,
)
from batchsim.calibration.kernel_tables import (  # noqa: E402
    fit_gemm_terms,
    gemm_errors,
    gemm_table_from,
    read_gemm_measurements,
    write_gemm_table,
)
from batchsim.calibration.moe_tables import (  # noqa: E402
    fit_moe_compute,
    moe_errors,
    read_moe_measurements,
)
from batchsim.calibration.predict import with_terms  # noqa: E402
from batchsim.catalog.hardware_files import load_hardware  # noqa: E402

AIC = "github ai-dynamo/aiconfigurator"
AIC_COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
DATA = "aic-core/src/aiconfigurator_core/systems/data"
FITS = {
    "h100-sxm": ("h100_sxm", "vllm/0.24.0"),
    "b200": ("b200_sxm", "vllm/0.24.0"),
    "b300": ("b300_sxm", "vllm/0.24.0"),
    "gb300": ("gb300", "vllm/0.24.0"),
}
"""batchsim profile -> (AIConfigurator system, framework/version) of the table fitted."""
COMPARED = {"a100-80gb": ("a100_sxm", "vllm/0.14.0")}
"""Profiles compared with a GEMM table but not refitted from it (printed, never written): the
A100's terms are fitted to its own operator timings, which the published end-to-end set
validates (docs/calibration.md)."""
FAMILY = {"h200": "h100-sxm", "gb200": "b200"}
"""Held-out profile -> the fitted profile whose terms and grid it takes."""
START = {"compute": 0.72, "memory": 0.8, "min_kernel_time_us": 5.0, "transition_exponent": 2.0}
"""Where every fit starts: the values fitted to A100 operator timings (docs/calibration.md)."""


def table_path(aic: Path, system: str, framework: str, kind: str = "gemm") -> Path:
    return aic / DATA / system / kind / framework / f"{kind}_perf.parquet"


def set_fitted(yaml_path: Path, terms: dict[str, float], tag: str, note: str) -> None:
    """Rewrite ``terms`` (``efficiency:`` keys) and, in ``sources.efficiency``, the note that
    starts with ``tag`` (a previous run's replaced), leaving every other line as it is."""
    text = yaml_path.read_text(encoding="utf-8")
    for key, value in terms.items():
        text, n = re.subn(rf"(?m)^(  {key}: ).*$", rf"\g<1>{value:g}", text)
        if n != 1:
            raise SystemExit(f"{yaml_path}: no single efficiency.{key} line")
    text = re.sub(rf"; {re.escape(tag)} [^;\"\\]*", "", text)
    text, n = re.subn(r'(?m)^(  efficiency: ".*)"$', lambda m: f'{m.group(1)}; {tag} {note}"', text)
    if n != 1:
        raise SystemExit(f"{yaml_path}: no single sources.efficiency line")
    yaml_path.write_text(text, encoding="utf-8")


def set_attention_terms(yaml_path: Path, terms: dict[str, float], note: str) -> None:
    """The attention terms and their note."""
    set_fitted(yaml_path, terms, "attention terms", note)


def set_moe_compute(yaml_path: Path, value: float, note: str) -> None:
    """``efficiency.moe_compute`` and its note."""
    set_fitted(yaml_path, {"moe_compute": value}, "moe_compute", f"{value:g}: {note}")


def set_terms(yaml_path: Path, terms: dict[str, float], table: str, source: str) -> None:
    """Rewrite the four GEMM terms, ``gemm_table:`` and its source in a profile YAML, leaving
    every other line as it is."""
    text = yaml_path.read_text(encoding="utf-8")
    for key, value in terms.items():
        text, n = re.subn(rf"(?m)^(  {key}: ).*$", rf"\g<1>{value:g}", text)
        if n != 1:
            raise SystemExit(f"{yaml_path}: no single efficiency.{key} line")
    prefix = "compute, memory, min_kernel_time_us and transition_exponent: see gemm_table; "
    if prefix not in text:
        text, n = re.subn(r'(?m)^(  efficiency: ")', rf"\g<1>{prefix}", text)
        if n != 1:
            raise SystemExit(f"{yaml_path}: no single sources.efficiency line")
    text = re.sub(r"(?m)^gemm_table: .*\n", "", text)
    text = re.sub(r"(?m)^  gemm_table: .*\n", "", text)
    text = text.replace("\nsources:\n", f"\ngemm_table: {table}\nsources:\n", 1)
    text = text.rstrip("\n") + f'\n  gemm_table: "{source}"\n'
    yaml_path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aic", required=True, type=Path, help="an AIConfigurator checkout")
    parser.add_argument("--check", action="store_true", help="print only, write nothing")
    args = parser.parse_args(argv)
    profiles = ROOT / "hardware_profiles"
    for name, (system, framework) in COMPARED.items():
        rel = f"{DATA}/{system}/gemm/{framework}/gemm_perf.parquet"
        rows = read_gemm_measurements(table_path(args.aic, system, framework))
        print(f"{name} (compared, not refitted): {len(rows):,} shapes of {rel}")
        for _, e in gemm_errors(load_hardware(name), rows, corrected=False).iterrows():
            print(
                f"  {e['dtype']:9s} {int(e['kernels']):>7,} kernels >= 5 us: |error| median / "
                f"p90 {e['median_err_pct']:.1f} / {e['p90_err_pct']:.1f} % by the shipped terms"
            )
    for name, (system, framework) in FITS.items():
        path = table_path(args.aic, system, framework)
        rows = read_gemm_measurements(path)
        base = with_terms(load_hardware(name), START)
        base = dataclasses.replace(base, gemm_table=None)
        terms, _ = fit_gemm_terms(base, rows)
        fitted = with_terms(base, terms)
        rel = f"{DATA}/{system}/gemm/{framework}/gemm_perf.parquet"
        where = f"{AIC} at {AIC_COMMIT}, {rel} (Apache-2.0)"
        table = gemm_table_from(fitted, rows, source=f"{name}.gemm.csv")
        print(f"{name}: {len(rows):,} shapes of {rel}")
        print("  terms: " + ", ".join(f"{k} {v:g}" for k, v in terms.items()))
        errs = gemm_errors(dataclasses.replace(fitted, gemm_table=table), rows)
        bare = gemm_errors(fitted, rows, corrected=False)
        for (_, e), (_, b) in zip(errs.iterrows(), bare.iterrows()):
            print(
                f"  {e['dtype']:9s} {int(e['kernels']):>7,} kernels >= 5 us: |error| median / "
                f"p90 {b['median_err_pct']:.1f} / {b['p90_err_pct']:.1f} % by the terms, "
                f"{e['median_err_pct']:.2f} / {e['p90_err_pct']:.2f} % with the grid"
            )
        if args.check:
            continue
        source = (
            f"ln(measured / modelled) GEMM time per (dtype, n, k, m), measured by NVIDIA "
            f"AIConfigurator ({where}); fitted by benchmarks/calibrate_kernels.py"
        )
        write_gemm_table(
            table,
            profiles / f"{name}.gemm.csv",
            [f"GEMM corrections of batchsim hardware profile {name}", source],
        )
        set_terms(
            profiles / f"{name}.yaml",
            terms,
            f"{name}.gemm.csv",
            f"{name}.gemm.csv: {source}. GEMM terms of efficiency (compute, memory, "
            "min_kernel_time_us, transition_exponent) fitted on the same table's 16-bit GEMMs",
        )
        moe_path = table_path(args.aic, system, framework, "moe")
        moe_rows = read_moe_measurements(moe_path)
        moe = fit_moe_compute(with_terms(fitted, {}), moe_rows)
        moe_rel = f"{DATA}/{system}/moe/{framework}/moe_perf.parquet"
        print(f"  moe_compute {moe:g} (bf16 fused MoE kernels of {moe_rel})")
        for _, e in moe_errors(with_terms(fitted, {"moe_compute": moe}), moe_rows).iterrows():
            print(
                f"  moe {e['dtype']:9s} {int(e['kernels']):>5,} kernels >= 5 us: |error| median / "
                f"p90 {e['median_err_pct']:.1f} / {e['p90_err_pct']:.1f} %"
            )
        attn_dir = args.aic / DATA / system / "attention" / framework
        attn_rows = pd.concat(
            [
                read_attention_measurements(attn_dir / f"{ph}_attention_perf.parquet", ph)
                for ph in ("context", "generation")
            ]
        )
        attn, _ = fit_attention_terms(with_terms(fitted, {"moe_compute": moe}), attn_rows)
        print("  attention terms: " + ", ".join(f"{k} {v:g}" for k, v in attn.items()))
        for _, e in attention_errors(with_terms(fitted, attn), attn_rows).iterrows():
            print(
                f"  attention {e['phase']:10s} {e['dtype']:4s} {int(e['kernels']):>6,} kernels "
                f">= 5 us: |error| median / p90 {e['median_err_pct']:.1f} / "
                f"{e['p90_err_pct']:.1f} %"
            )
        if args.check:
            continue
        attn_rel = f"{DATA}/{system}/attention/{framework}/{{context,generation}}_attention_perf"
        set_attention_terms(
            profiles / f"{name}.yaml",
            attn,
            f"(attention, attention_masked_fraction, attention_*_time_us, attention_sm_bandwidth):"
            f" fitted on the bf16 full-attention kernels of {AIC} at {AIC_COMMIT}, {attn_rel}"
            f".parquet by benchmarks/calibrate_kernels.py",
        )
        set_moe_compute(
            profiles / f"{name}.yaml",
            moe,
            f"fitted on the bf16 fused MoE kernels (>= 5 us, balanced routing, no EP) of "
            f"{AIC} at {AIC_COMMIT}, {moe_rel} by benchmarks/calibrate_kernels.py",
        )
        for held, family in FAMILY.items():
            if family != name:
                continue
            set_moe_compute(
                profiles / f"{held}.yaml",
                moe,
                f"{name}'s fitted value (held out: nothing fitted on this GPU's tables)",
            )
            set_attention_terms(
                profiles / f"{held}.yaml",
                attn,
                f"(attention, attention_masked_fraction, attention_*_time_us, "
                f"attention_sm_bandwidth): {name}'s fitted values (held out)",
            )
            set_terms(
                profiles / f"{held}.yaml",
                terms,
                f"{name}.gemm.csv",
                f"held out: the GEMM terms and corrections of {name} (same family), fitted by "
                f"benchmarks/calibrate_kernels.py on {where}; none of {held}'s own measurements",
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
