"""Issue 25, item 2: no import circle in bench/. Its scripts import each other as top-level
modules (each runs with bench/ as ``sys.path[0]``), which import-linter cannot see: grimp
builds graphs of packages only. So this reads the imports, function-local ones included."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def sibling_imports() -> dict[str, set[str]]:
    modules = {path.stem: path for path in BENCH.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
        graph[name] = found & set(modules) - {name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that ends where it began), or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for imported in sorted(graph[name]):
            if found := visit(imported, [*path, name]):
                return found
        done.add(name)
        return None

    for name in sorted(graph):
        if found := visit(name, []):
            return found
    return None


def test_cycle_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_bench_has_no_import_circle() -> None:
    graph = sibling_imports()
    # the shared parts, not bench_e2e
    assert graph["bench_dra"] == {"_apiserver", "_e2e_common", "_memory", "_one_node"}
    # Before: bench_e2e -> bench_dra -> bench_e2e.
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])
