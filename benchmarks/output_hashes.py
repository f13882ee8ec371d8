"""Are the shipped experiments' outputs byte-identical to a recorded set? One hash per file.

Runs every experiment of ``experiments/`` as its README runs it — ``batchsim run``, and
``batchsim sweep`` or ``batchsim capacity`` for those with a ``sweep:`` block — and prints a
SHA-256 of every file each one writes, with the one field that differs from run to run
taken out first (``wall_time_s``, in ``summary.json``, the sweep tables and point records).
Parquet tables are hashed by their rows (read back as CSV text), not their bytes, so that a
pyarrow upgrade does not count as a change.

    python benchmarks/output_hashes.py > before.json       # record
    python benchmarks/output_hashes.py --check before.json # compare: exit 1 on any change
    python benchmarks/output_hashes.py --only quickstart   # one experiment (name prefix)
    python benchmarks/output_hashes.py --source ...        # run this source tree (pure
                                                           # Python), not the installed one

A refactoring that must not change behaviour is checked with ``--check`` against the record
taken before it. The hashes depend on the versions of numpy and pandas (their text of a
float), so record and check on one machine.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"
CAPACITY = {"capacity-policies": ["--slo", "p99_ttft_ms=2000", "--slo", "p99_tpot_ms=20"]}
"""Experiments whose README command is ``batchsim capacity``, with its SLO (the others with
a ``sweep:`` block are ``batchsim sweep``)."""
_WALL = re.compile(r'"wall_time_s": [^,\n}]*')


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """(label, batchsim arguments) of each command the experiment is run with."""
    text = path.read_text(encoding="utf-8")
    out = [("run", ["run", str(path)])]
    if re.search(r"^sweep:", text, flags=re.MULTILINE):
        verb = "capacity" if path.stem in CAPACITY else "sweep"
        out.append((verb, [verb, str(path), *CAPACITY.get(path.stem, [])]))
    return out


def canonical(path: Path, places: dict[str, str]) -> bytes:
    """The bytes of ``path`` that a rerun must reproduce: ``places`` (paths of this checkout
    and of the output folder) are replaced by their names, so that a rerun elsewhere hashes
    the same."""
    if path.suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(path)
        frame = frame.drop(columns=[c for c in frame.columns if c == "wall_time_s"])
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False)
        return buffer.getvalue().encode()
    data = path.read_bytes()
    for place, name in places.items():
        data = data.replace(place.encode(), name.encode())
    if path.suffix == ".json" or path.name.endswith(".jsonl"):
        return _WALL.sub('"wall_time_s": _', data.decode()).encode()
    if path.suffix == ".csv" and b"wall_time_s" in data.split(b"\n", 1)[0]:
        import pandas as pd

        frame = pd.read_csv(path, keep_default_na=False, dtype=str)
        frame = frame.drop(columns=["wall_time_s"])
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False)
        return buffer.getvalue().encode()
    return data


def hash_tree(root: Path, places: dict[str, str]) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest = hashlib.sha256(canonical(path, places)).hexdigest()
            out[str(path.relative_to(root))] = digest
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", type=Path, help="compare with this record; exit 1 on change")
    parser.add_argument("--only", default="", help="experiments whose name starts with this")
    parser.add_argument(
        "--source", action="store_true", help="run this source tree instead of the installed"
    )
    args = parser.parse_args(argv)
    record: dict[str, dict[str, str]] = {}
    env = dict(os.environ)
    if args.source:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    tmp = Path(tempfile.mkdtemp(prefix="batchsim-output-hashes-"))
    places = {str(tmp): "<out>", str(REPO): "<repo>"}
    try:
        for path in sorted(EXPERIMENTS.glob("*.yaml")):
            if not path.stem.startswith(args.only):
                continue
            for label, batchsim_args in commands(path):
                out = Path(tmp) / f"{path.stem}-{label}"
                start = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-m", "batchsim", *batchsim_args, "-o", str(out)],
                    capture_output=True,
                    text=True,
                    cwd=tmp,
                    env=env,
                )
                took = time.perf_counter() - start
                key = f"{path.stem} ({label})"
                if proc.returncode != 0:
                    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    print(f"{key}: exit {proc.returncode}: {tail}", file=sys.stderr)
                    record[key] = {"exit": str(proc.returncode)}
                    continue
                record[key] = hash_tree(out, places)
                print(f"{key}: {len(record[key])} files, {took:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.check is None:
        json.dump(record, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    before = json.loads(args.check.read_text(encoding="utf-8"))
    changed = 0
    for key, files in record.items():
        old = before.get(key)
        if old is None:
            print(f"{key}: not in {args.check}")
            changed += 1
            continue
        for name in sorted(set(files) | set(old)):
            if files.get(name) != old.get(name):
                print(f"{key}: {name} differs")
                changed += 1
    same = sum(len(files) for files in record.values())
    print(f"{same} files in {len(record)} runs; {changed} differ from {args.check}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
