"""The metrics an SLO may bound: summary metrics (``batchsim capacity --slo``) and per-request
limits (``--attainment``, the experiment's ``slo:`` block). Names only, importing nothing: the
figures read them without loading the experiment schema."""

from __future__ import annotations

SUMMARY_SLOS = (
    *(
        f"{stat}_{metric}_ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "p90", "p99")
    ),
    "mean_queue_delay_ms",
    "p99_queue_delay_ms",
)
"""Summary metrics an SLO may bound (lower is better)."""
REQUEST_SLOS = ("ttft_ms", "tpot_ms", "e2el_ms")
"""Per-request limits for ``--attainment`` (the keys of the experiment's ``slo:`` block)."""
