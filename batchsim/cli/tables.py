"""How the command line prints numbers and tables: one style for every number
(:func:`_fmt`), the rows of ``batchsim list`` and the table of a sweep or a capacity study."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        if 0 < abs(value) < 0.1:  # two significant digits, not two decimals: 0.025, not 0.03
            text = f"{value:.2g}"
        elif abs(value) < 1e6:
            text = f"{value:,.2f}"
        else:  # whole numbers with separators, as the smaller ones (up to a trillion)
            text = f"{value:,.0f}" if abs(value) < 1e12 else f"{value:.3g}"
        return text + unit
    return f"{value}{unit}"


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("(none)")
        return
    keys = list(rows[0])
    cells = [
        [_fmt(r.get(k)) if not isinstance(r.get(k), str) else r[k] for k in keys] for r in rows
    ]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)).rstrip())
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())


def _table_text(frame: Any, columns: list[str], max_rows: int = 60) -> list[str]:
    rows = []
    for _, record in frame.head(max_rows).iterrows():
        cells = []
        for column in columns:
            value = record[column]
            if isinstance(value, float):
                cells.append(_fmt(value))
            else:
                cells.append("" if value is None else str(value))
        rows.append(cells)
    widths = [
        max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)
    ]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if len(frame) > max_rows:
        lines.append(f"... {len(frame) - max_rows} more rows")
    return lines
