"""Measured GEMM corrections of a hardware profile: :class:`GemmTable` and :func:`load_gemm_table`.

A profile's analytic GEMM model (:mod:`batchsim.cost.gemm`) has a handful of terms; a GPU's
GEMM library does not follow any handful of terms exactly (kernel selection, stream-K,
swizzles). A *GEMM table* holds, per weight dtype and shape, how far the measured time of one
GEMM was from the profile's model when the profile was calibrated: ``ln(measured / modelled)``
on a grid of rows ``m``, output features ``n`` and input features ``k``. The cost model
multiplies its time by ``exp`` of that value, interpolated linearly in ``(ln m, ln n, ln k)``
between grid points and held at the grid's edges, so a calibrated GPU reproduces its
measured GEMMs at the grid points (to the 0.1 % the file's precision keeps) while everything
else — FLOPs, bytes, the bound — stays the roofline's. A GPU of the same family (H200 from
H100) can take the table fitted on its sibling: the correction is relative to the model,
and the model carries the datasheet differences.

File format (``hardware_profiles/<name>.gemm.csv``, written by ``batchsim calibrate
--kernel-table``), UTF-8 CSV with ``#`` comment lines for the sources::

    # source: ...
    dtype,n,k,1,2,4,...          <- the m grid, strictly increasing
    bf16,128,128,-12,31,...       <- round(1000 x ln(measured / modelled)), or empty: none

Every ``(n, k)`` pair of the ``n`` and ``k`` grids appears once per dtype; a value is an
integer in [-5000, 5000] (a factor within e^±5). Dtypes: :data:`TABLE_DTYPES`.

Must not import anything from batchsim but :mod:`batchsim.errors` and :mod:`batchsim.yamlio`.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

from batchsim.errors import ConfigError
from batchsim.yamlio import read_text

__all__ = ["MAX_TABLE_BYTES", "TABLE_DTYPES", "GemmTable", "load_gemm_table"]

TABLE_DTYPES = ("bf16", "fp8", "fp8_block", "nvfp4")
"""Dtypes a GEMM table may hold: 16-bit, fp8 with per-tensor scales, fp8 with block scales."""
MAX_TABLE_BYTES = 8 * 2**20
"""Largest GEMM table file read."""
MAX_VALUE = 5000
"""Largest |1000 x ln factor| of a table entry."""
_MAX_DIM = 2**24


@dataclass(frozen=True, eq=False)
class GemmTable:
    """ln(measured / modelled) GEMM time on a grid, per dtype (see the module docstring).

    Two tables are equal when their contents are (``digest``), whatever file they came from.

    Attributes:
        source: The file it was read from (for messages).
        m: Rows grid, strictly increasing.
        n: Output-features grid, strictly increasing.
        k: Input-features grid, strictly increasing.
        values: dtype -> flat tuple of ln factors, index ``(i_n * len(k) + i_k) * len(m) +
            i_m``; 0.0 where the file had no value.
        digest: SHA-256 of the grids and values.
    """

    source: str
    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    values: dict[str, tuple[float, ...]] = field(repr=False)
    digest: str = field(repr=False, default="")
    _logs: tuple[tuple[float, ...], ...] = field(repr=False, default=())

    def __post_init__(self) -> None:
        if not self.digest:
            h = hashlib.sha256(repr((self.m, self.n, self.k)).encode())
            for dtype in sorted(self.values):
                h.update(dtype.encode())
                h.update(repr(self.values[dtype]).encode())
            object.__setattr__(self, "digest", h.hexdigest())
        logs = tuple(tuple(math.log(v) for v in axis) for axis in (self.m, self.n, self.k))
        object.__setattr__(self, "_logs", logs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GemmTable) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes this table corrects."""
        return tuple(d for d in TABLE_DTYPES if d in self.values)

    def log_factor(self, dtype: str, m: float, n: float, k: float) -> float:
        """ln(measured / modelled) at (m, n, k): trilinear in the logs, held at the edges;
        0.0 for a dtype the table does not hold."""
        flat = self.values.get(dtype)
        if flat is None:
            return 0.0
        lm, ln_, lk = self._logs
        im, wm = _bracket(lm, math.log(max(m, 1.0)))
        in_, wn = _bracket(ln_, math.log(max(n, 1.0)))
        ik, wk = _bracket(lk, math.log(max(k, 1.0)))
        nm, nk = len(self.m), len(self.k)
        total = 0.0
        for dn, fn in ((0, 1.0 - wn), (1, wn)):
            if fn == 0.0:
                continue
            for dk, fk in ((0, 1.0 - wk), (1, wk)):
                if fk == 0.0:
                    continue
                base = ((in_ + dn) * nk + ik + dk) * nm + im
                lo = flat[base]
                hi = flat[base + 1] if wm > 0.0 else lo
                total += fn * fk * (lo + wm * (hi - lo))
        return total

    def factor(self, dtype: str, m: float, n: float, k: float) -> float:
        """measured / modelled GEMM time at (m, n, k) (1.0 for a dtype the table lacks)."""
        return math.exp(self.log_factor(dtype, m, n, k))


def _bracket(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """(i, w): x lies between axis[i] and axis[i + 1] at weight w (0 at the edges, held)."""
    if x <= axis[0] or len(axis) == 1:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 1, 0.0
    i = bisect.bisect_right(axis, x) - 1
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def _grid(cells: list[str], what: str, fail) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    values: list[int] = []
    for cell in cells:
        try:
            v = int(cell)
        except ValueError:
            raise fail(f"{what} grid value {cell!r} is not an integer") from None
        if not 1 <= v <= _MAX_DIM:
            raise fail(f"{what} grid value {v} must be in [1, {_MAX_DIM}]")
        if values and v <= values[-1]:
            raise fail(f"{what} grid must be strictly increasing, got {values[-1]} then {v}")
        values.append(v)
    if not values:
        raise fail(f"{what} grid is empty")
    return tuple(values)


def parse_gemm_table(text: str, source: str) -> GemmTable:
    """A :class:`GemmTable` from the text of its file.

    Raises:
        ConfigError: The rule broken, naming ``source`` and the line.
    """
    header: list[str] | None = None
    header_line = 0
    m_grid: tuple[int, ...] = ()
    rows: dict[str, dict[tuple[int, int], tuple[float, ...]]] = {}
    ns: dict[int, None] = {}
    ks: dict[int, None] = {}
    where: dict[tuple[str, int, int], int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue

        def fail(message: str, _n: int = number) -> ConfigError:
            return ConfigError(message, source, _n)

        cells = [c.strip() for c in line.split(",")]
        if header is None:
            if cells[:3] != ["dtype", "n", "k"]:
                raise fail(f"header must start with dtype,n,k then the m grid, got {line[:60]!r}")
            header, header_line = cells, number
            m_grid = _grid(cells[3:], "m", fail)
            continue
        if len(cells) != len(header):
            raise fail(
                f"expected {len(header)} comma-separated cells (as the header), got {len(cells)}"
            )
        dtype = cells[0]
        if dtype not in TABLE_DTYPES:
            raise fail(f"dtype {dtype!r} is not one of {', '.join(TABLE_DTYPES)}")
        try:
            n, k = int(cells[1]), int(cells[2])
        except ValueError:
            raise fail(f"n and k must be integers, got {cells[1]!r}, {cells[2]!r}") from None
        if not (1 <= n <= _MAX_DIM and 1 <= k <= _MAX_DIM):
            raise fail(f"n and k must be in [1, {_MAX_DIM}], got {n}, {k}")
        if (dtype, n, k) in where:
            raise fail(f"{dtype} n={n} k={k} appears twice (first on line {where[dtype, n, k]})")
        where[dtype, n, k] = number
        values: list[float] = []
        for cell in cells[3:]:
            if not cell:
                values.append(0.0)
                continue
            try:
                v = int(cell)
            except ValueError:
                raise fail(f"value {cell!r} is not an integer (1000 x ln factor)") from None
            if abs(v) > MAX_VALUE:
                raise fail(f"value {v} must be in [-{MAX_VALUE}, {MAX_VALUE}] (1000 x ln factor)")
            values.append(v / 1000.0)
        rows.setdefault(dtype, {})[n, k] = tuple(values)
        ns[n] = None
        ks[k] = None
    if header is None:
        raise ConfigError("no header line (dtype,n,k,<m grid>)", source)
    if not rows:
        raise ConfigError("no rows after the header", source, header_line)
    n_grid, k_grid = tuple(sorted(ns)), tuple(sorted(ks))
    flat: dict[str, tuple[float, ...]] = {}
    for dtype, table in rows.items():
        missing = [(n, k) for n in n_grid for k in k_grid if (n, k) not in table]
        if missing:
            n, k = missing[0]
            raise ConfigError(
                f"{dtype} has no row for n={n} k={k} ({len(missing)} (n, k) pairs missing); "
                "every dtype needs every pair of the n and k grids",
                source,
            )
        flat[dtype] = tuple(v for n in n_grid for k in k_grid for v in table[n, k])
    return GemmTable(source=source, m=m_grid, n=n_grid, k=k_grid, values=flat)


def load_gemm_table(path: Path, source: str | None = None) -> GemmTable:
    """Read and validate a GEMM table file.

    Raises:
        ConfigError: Unreadable, too large, not UTF-8, or a broken rule of the format (with
            its line).
    """
    shown = source if source is not None else str(path)
    return parse_gemm_table(read_text(path, limit=MAX_TABLE_BYTES, source=shown), shown)
