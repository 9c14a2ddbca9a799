"""The package's layer stack (docs/architecture.md) holds: import-linter's layers contract in
pyproject.toml passes, a planted upward import breaks it, grimp finds no import cycle inside
torchair, and no module outgrows the size the design allows."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
# modules allowed over MAX_LINES, each with its reason
MAX_LINES = 600
_LONG_MODULES: dict[str, str] = {}


def _lint(package_parent: pathlib.Path, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(package_parent))
    return subprocess.run([sys.executable, "-c", _LINT], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_layers_contract_is_kept():
    result = _lint(ROOT, ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract is not vacuous: the bottom layer importing the CLI is reported by name."""
    shutil.copytree(ROOT / "torchair", tmp_path / "torchair",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    version = tmp_path / "torchair" / "base" / "version.py"
    version.write_text(version.read_text() + "\nimport torchair.cli  # planted upward import\n")
    result = _lint(tmp_path, tmp_path)
    assert result.returncode != 0, result.stdout
    assert "torchair.base is not allowed to import torchair.cli" in result.stdout


def _edges(graph: grimp.ImportGraph, root: str) -> dict[str, list[str]]:
    """Each module's imports, with the packages Python runs on the way: importing ``a.b.c`` runs
    ``a/b/__init__.py`` first (grimp records only ``a.b.c``). ``root`` itself is left out: every
    import of the package runs it before anything else."""
    modules = set(graph.modules)
    edges = {}
    for m in modules:
        targets = set(graph.find_modules_directly_imported_by(m))
        for t in list(targets):
            parts = t.split(".")
            for i in range(2, len(parts)):
                parent = ".".join(parts[:i])
                if parent in modules and parent != root and not m.startswith(parent + "."):
                    targets.add(parent)
        edges[m] = sorted(targets)
    return edges


def _cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    modules = sorted(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(_edges(graph, "p")) == [["p.a", "p.b", "p.c"]]


def test_cycle_finder_sees_package_inits():
    """``p.x`` importing ``p.q.y`` runs ``p/q/__init__.py``; when that imports ``p.x`` back, it
    is a cycle although no module names the other directly."""
    graph = grimp.ImportGraph()
    for name in ("p", "p.x", "p.q", "p.q.y"):
        graph.add_module(name)
    graph.add_import(importer="p.x", imported="p.q.y")
    graph.add_import(importer="p.q", imported="p.x")
    assert _cycles(_edges(graph, "p")) == [["p.q", "p.x"]]


def test_no_import_cycle_inside_torchair():
    graph = grimp.build_graph("torchair", cache_dir=None)
    assert _cycles(_edges(graph, "torchair")) == []


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for folder in ("torchair", "bench", "tools")
                                        for p in (ROOT / folder).rglob("*.py")))
def test_module_size(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= MAX_LINES or path in _LONG_MODULES, (
        f"{path} has {lines} lines (limit {MAX_LINES}): split it by concern")
