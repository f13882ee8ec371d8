"""The package's shape: imports point down the layers of docs/architecture.md, with no cycle,
and no module holds more than one idea's worth of lines.

The imports are read from the source with ``ast`` — every ``import`` and ``from ... import``,
at module level, inside functions and under ``if TYPE_CHECKING:`` alike — not from what Python
happens to import at run time.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "batchsim"

DOC = ROOT / "docs" / "architecture.md"


def read_layers() -> list[tuple[str, tuple[str, ...]]]:
    """The layers of docs/architecture.md's table, bottom first: (name, module prefixes
    relative to ``batchsim``; ``""`` is ``batchsim/__init__.py``, the public API). The test
    reads the picture from the document, so the two cannot drift apart."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1]
    layers = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| layer") or line.startswith("|--"):
            if layers and not line.strip():
                break
            continue
        name, modules = (cell.strip() for cell in line.strip("|").split("|")[:2])
        prefixes = []
        for item in re.findall(r"`([^`]+)`", modules):
            item = item.rstrip("/").replace("/", ".")
            prefixes.append("" if item == "batchsim" else item)
        layers.append((name, tuple(prefixes)))
    return layers


LAYERS = read_layers()
"""A module belongs to the layer of its longest matching prefix and may import its own layer
and those below."""

MAX_LINES = 600
"""No module is longer (one idea per module; split along the ideas past this)."""


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their ``__init__``)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source: ``import a.b`` and
    ``from a import b`` are ``a.b`` when that is a module, else the nearest enclosing module
    (``from batchsim.workload import generate`` is ``batchsim.workload``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("batchsim") and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    relative = name.removeprefix("batchsim").removeprefix(".")
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = relative == prefix or (prefix != "" and relative.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{name} is in no layer of LAYERS"
    return best


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_the_layers_are_read_from_the_document():
    names = [name for name, _ in LAYERS]
    assert names[0] == "foundation" and names[-1] == "commands" and len(names) >= 10
    assert layer_of("batchsim.engine.request") < layer_of("batchsim.scheduler.interface")
    assert layer_of("batchsim.scheduler.interface") < layer_of("batchsim.engine.engine")
    assert layer_of("batchsim") == len(LAYERS) - 1


def test_every_module_is_in_a_layer():
    for name in module_names():
        layer_of(name)


def test_every_import_points_down_the_layers(graph):
    upward = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                upward.append(
                    f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan's
    algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles(graph):
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_module_is_longer_than_an_idea():
    long = []
    for name, path in sorted(module_names().items()):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{name}: {lines} lines")
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)
