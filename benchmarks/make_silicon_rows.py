"""Write ``benchmarks/data/silicon_rows.csv`` from NVIDIA AIConfigurator's ``silicon_sample.csv``.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) publishes end-to-end serving
measurements as ``aic-core/src/aiconfigurator_core/systems/silicon_sample.csv`` (5,221 rows at
commit 095f58a51c4ca8e61b66ec108d86f223f8d559ce): one row per deployment (backend and version,
model, GPU, precision, aggregated or disaggregated, parallel layout), input/output length and
number of concurrent clients, with the measured mean TTFT and TPOT.
``benchmarks/validate_silicon.py`` reads the derived file this script writes; neither reads the
upstream file at run time.

What is kept (``benchmarks/data/README.md`` says the same):
  * the rows on a GPU batchsim has a profile for (``h100_sxm``, ``h200_sxm``, ``b200_sxm``,
    ``b300_sxm``, ``gb200``, ``gb300``) and of a model batchsim's catalog has
    (:data:`KEEP_MODELS`); the others are counted (the script prints the counts, which
    ``validate_silicon.LEFT_OUT`` repeats) but not shipped, to keep the file small;
  * ``row``: the row's position in the upstream file (1 = its first data row), for tracing;
  * the columns the benchmark needs; the free-text ``silicon_data_source`` is dropped, except
    its ``silicon_concurrency`` (the number of concurrent clients, ``concurrency``; the upstream
    ``batch_size`` where it is absent) and the container ``image`` (its last two path parts);
  * ``precision`` (implied by ``gemm_quant_mode``), ``id`` and the ``*_pp_size`` columns of
    disaggregated pools (all 1 or empty upstream) are dropped; times are rounded to 5 digits.

Usage::

    git -C AIC_REPO show 095f58a5:aic-core/src/aiconfigurator_core/systems/silicon_sample.csv \\
        > silicon_sample.csv
    python benchmarks/make_silicon_rows.py silicon_sample.csv
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "silicon_rows.csv"

KEEP_SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300")
KEEP_MODELS = (
    "Qwen/Qwen3-32B",
    "nvidia/Qwen3-32B-NVFP4",
    "Qwen/Qwen3-235B-A22B-FP8",
    "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3",
    "nvidia/DeepSeek-R1-NVFP4",
    "nvidia/DeepSeek-V3.1-NVFP4",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "nvidia/Llama-3.1-8B-Instruct-FP8",
    "openai/gpt-oss-120b",
)

POOL_FIELDS = ("num_workers", "batch_size", "tp_size", "attention_dp_size", "moe_tp_size")
POOL_FIELDS += ("moe_ep_size",)
COLUMNS = [
    "row",
    "backend",
    "backend_version",
    "image",
    "model_path",
    "system",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "moe_quant_mode",
    "concurrency",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    *(f"{pool}_{name}" for pool in ("prefill", "decode") for name in POOL_FIELDS),
    "silicon_ttft_ms",
    "silicon_tpot_ms",
]


def _int(text: str) -> str:
    """``"8.0"`` -> ``"8"``; empty stays empty."""
    return str(int(float(text))) if text.strip() else ""


def derive(row: dict[str, str], number: int) -> dict[str, str]:
    """The kept columns of upstream ``row`` (``number``: its position, 1 = first data row)."""
    source = row["silicon_data_source"]
    clients = re.search(r"silicon_concurrency=(\d+)", source)
    image = re.search(r"image=([^;]+)", source) or re.search(r";\s*(\S+/\S+:\S+)\s*$", source)
    out = {name: row.get(name, "") for name in COLUMNS}
    out["row"] = str(number)
    out["image"] = "/".join(image.group(1).strip().split("/")[-2:]) if image else ""
    out["concurrency"] = clients.group(1) if clients else _int(row["batch_size"])
    for name in COLUMNS:
        if name.endswith("_size") or name.endswith("_workers") or name in ("isl", "osl"):
            out[name] = _int(out[name])
    for name in ("silicon_ttft_ms", "silicon_tpot_ms"):
        out[name] = f"{float(row[name]):.5g}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sample", type=Path, help="AIConfigurator's silicon_sample.csv")
    args = parser.parse_args(argv)
    with open(args.sample, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    kept, left_out = [], Counter()
    for number, row in enumerate(rows, start=1):
        if row["system"] not in KEEP_SYSTEMS:
            left_out[f"no GPU profile: {row['system']}"] += 1
        elif row["model_path"] not in KEEP_MODELS:
            left_out[f"no catalog model: {row['model_path']}"] += 1
        else:
            kept.append(derive(row, number))
    with open(OUT, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
    print(f"wrote {OUT} ({len(kept)} of {len(rows)} rows); left out:")
    for reason, count in sorted(left_out.items()):
        print(f"  {count:>5}  {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
