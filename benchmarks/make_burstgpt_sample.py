"""Write ``workloads/burstgpt_synthetic_sample.csv``: a SYNTHETIC trace in BurstGPT's CSV layout.

BurstGPT (github.com/HPMLL/BurstGPT, CC BY 4.0) publishes its traces as CSV files with the
header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (seconds since
midnight of the first day; ``Response tokens`` is 0 for failed requests). The data files are
stored with Git LFS, and none was at hand when this sample was made, so the rows here are
drawn from a seeded generator in the same layout — placeholder distributions, not BurstGPT's
statistics: bursty gamma inter-arrival times (CV 3; mean 3.7 s, the average rate of
BurstGPT_1.csv: 1,429.7k rows in about 61 days, per its README) rounded to whole seconds,
log-normal request tokens (median 350, sigma 0.95, at most 8,192) and response tokens
(median 240, sigma 0.75, at most 4,096), 80 % ChatGPT / 20 % GPT-4, 70 % conversation /
30 % API logs, about 2 % failed requests (0 response tokens) and 1 % rows with 0 request and
0 response tokens. Use it to try the format; replay the real files for their statistics.

Usage::

    python benchmarks/make_burstgpt_sample.py      # rewrites the sample (same seed, same file)
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

ROWS = 500
SEED = 2024
OUT = Path(__file__).resolve().parents[1] / "workloads" / "burstgpt_synthetic_sample.csv"


def main() -> None:
    rng = np.random.default_rng(SEED)
    cv = 3.0
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 3.7 / shape, ROWS)
    stamps = np.floor(5.0 + np.cumsum(gaps) - gaps[0]).astype(np.int64)
    request = np.minimum(8192, np.maximum(1, rng.lognormal(np.log(350), 0.95, ROWS))).astype(int)
    response = np.minimum(4096, np.maximum(1, rng.lognormal(np.log(240), 0.75, ROWS))).astype(int)
    fate = rng.random(ROWS)
    response[fate < 0.03] = 0  # failed requests
    request[fate < 0.01] = 0  # and a few rows with nothing at all
    model = np.where(rng.random(ROWS) < 0.8, "ChatGPT", "GPT-4")
    log = np.where(rng.random(ROWS) < 0.7, "Conversation log", "API log")
    with open(OUT, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(
            ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
        )
        for row in zip(stamps, model, request, response, request + response, log, strict=True):
            writer.writerow([int(row[0]), row[1], int(row[2]), int(row[3]), int(row[4]), row[5]])
    print(f"wrote {OUT} ({ROWS} rows)")


if __name__ == "__main__":
    main()
