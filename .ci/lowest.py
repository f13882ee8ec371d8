"""Read pyproject.toml for the CI run on the oldest supported Python.

``python .ci/lowest.py constraints`` prints pip constraints pinning every runtime dependency
to the lower bound pyproject allows (``numpy>=1.24`` -> ``numpy==1.24``);
``python .ci/lowest.py python`` prints the oldest Python that ``requires-python`` allows.
A dependency written other than ``NAME>=VERSION`` is an error: its lowest version would be
unknown, so CI could not test it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main(what: str) -> int:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    if what == "python":
        match = re.fullmatch(r"\s*>=\s*(\d+\.\d+)\s*", project["requires-python"])
        if not match:
            print(f"requires-python must be '>=X.Y', got {project['requires-python']!r}")
            return 1
        print(match[1])
        return 0
    for requirement in project["dependencies"]:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)\s*", requirement)
        if not match:
            print(f"cannot pin {requirement!r}: expected NAME>=VERSION", file=sys.stderr)
            return 1
        print(f"{match[1]}=={match[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "constraints"))
