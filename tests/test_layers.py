"""Layers point one way: retrievers -> ragspec core -> ragspec.lc -> apps -> benchmarks; and no modules import each other.

Inside ragspec core the order is: the engine's pure parts (``ragspec.engine``) -> the back ends
(``ragspec.backends``) -> the decode loop (``ragspec.decoding``) -> the RAG layer (``ragspec``'s own
modules: pipeline, answers, prompts, remote...) -> LangChain (``ragspec.lc``); and no two packages
inside ragspec depend on each other both ways.

Every import statement counts, also the lazy ones inside functions and under ``TYPE_CHECKING``
(a lazy import still makes a cycle between packages). A module may import its own layer and
the layers below it, never one above; within a layer, no chain of imports leads back to the
module it started from.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["retrievers", "ragspec.engine", "ragspec.backends", "ragspec.decoding", "ragspec", "ragspec.lc", "apps", "benchmarks"]
FACADE = Path("ragspec/__init__.py")
"""The public entry point: ``ragspec.ChatRagSpec`` etc. resolve lazily by name (its ``TYPE_CHECKING``
imports name them for type checkers); no module of a layer imports through it."""


def layer_of(module: str) -> int | None:
    """Index in ``LAYERS`` of the most specific layer ``module`` belongs to (None: not ours)."""
    matches = [i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + ".")]
    return max(matches, key=lambda i: len(LAYERS[i]), default=None)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]  # `from ragspec import lc`
    return found


def sources() -> list[Path]:
    return sorted(p for top in ("retrievers", "ragspec", "apps", "benchmarks") for p in (ROOT / top).rglob("*.py"))


def violations(path: Path) -> list[str]:
    module = module_name(path)
    own = layer_of(module)
    assert own is not None
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    bad, lines = [], set()
    for line, imported in imported_modules(ast.parse(path.read_text(encoding="utf-8")), package):
        target = layer_of(imported)
        if target is not None and target > own and line not in lines:  # one report per statement
            lines.add(line)
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported} ({LAYERS[target]} is above {LAYERS[own]})")
    return bad


def test_no_module_imports_a_layer_above_it() -> None:
    assert sources(), "no sources found"
    bad = [v for path in sources() if path.relative_to(ROOT) != FACADE for v in violations(path)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ragspec.lc.base import RagSpecParams\n", ["imports ragspec.lc.base"]),
        ("import apps.collection\n", ["imports apps.collection"]),
        ("def f():\n    from benchmarks.bench import main\n", ["imports benchmarks.bench"]),
        ("def f():\n    from ragspec import lc\n", ["imports ragspec.lc"]),
        ("from ragspec.engine.config import GenerationConfig\nfrom retrievers import BM25Retriever\n", []),
        ("from ragspec.decoding.generator import SpeculativeGenerator\nfrom ragspec.backends import load_model\n", []),
    ],
)
def test_the_check_sees_upward_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: list[str]) -> None:
    core = tmp_path / "ragspec"
    core.mkdir()
    (core / "probe.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = violations(core / "probe.py")
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), found


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("engine", "from ragspec.backends import KVCache\n", "imports ragspec.backends"),
        ("engine", "def f():\n    from ragspec.decoding import calibration\n", "imports ragspec.decoding"),
        ("backends", "from ragspec.decoding.generator import SpeculativeGenerator\n", "imports ragspec.decoding.generator"),
        ("decoding", "from ragspec.pipeline import DocumentQA\n", "imports ragspec.pipeline"),
        ("backends", "from ragspec.engine.results import ModelLoadError\n", None),
        ("decoding", "from ragspec.backends import load_model\n", None),
    ],
)
def test_the_check_sees_the_order_inside_ragspec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: str, source: str, expected: str | None
) -> None:
    folder = tmp_path / "ragspec" / package
    folder.mkdir(parents=True)
    (folder / "probe.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = violations(folder / "probe.py")
    assert (found == []) if expected is None else (len(found) == 1 and expected in found[0]), found


def import_graph(paths: Iterable[Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules of ours (``from package import module`` names the module)."""
    modules = {module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        statements: dict[int, list[str]] = {}
        for line, imported in imported_modules(ast.parse(path.read_text(encoding="utf-8")), package):
            statements.setdefault(line, []).append(imported)
        targets = set()
        for names in statements.values():
            base, rest = names[0], names[1:]
            if rest and all(n.startswith(base + ".") and n in modules for n in rest):
                names = rest  # `from a import b, c` of modules b and c: not a's own code
            for imported in names:
                while imported and imported not in modules:  # `from a.b import name`: the module a.b
                    imported = imported.rpartition(".")[0]
                if imported and imported != module:
                    targets.add(imported)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other() -> None:
    graph = import_graph(p for p in sources() if p.relative_to(ROOT) != FACADE)
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def package_edges(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """Which package imports which: a module's import counts for every package holding it and not
    the module imported, towards every package holding that module and not the importer."""

    def holders(module: str) -> set[str]:
        return {p for p in packages if module.startswith(p + ".")}

    edges: dict[str, set[str]] = {p: set() for p in packages}
    for module, targets in graph.items():
        for target in targets:
            for source in holders(module) - holders(target) - {target}:
                edges[source] |= holders(target) - holders(module) - {module}
    return edges


def two_way(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, ()))


def test_no_two_packages_inside_ragspec_depend_on_each_other() -> None:
    paths = [p for p in sources() if p.relative_to(ROOT) != FACADE]
    packages = {module_name(p) for p in paths if p.name == "__init__.py" and module_name(p).startswith("ragspec.")}
    assert {"ragspec.engine", "ragspec.backends", "ragspec.decoding", "ragspec.lc"} <= packages
    found = two_way(package_edges(import_graph(paths), packages))
    assert not found, "packages that import each other: " + "; ".join(f"{a} <-> {b}" for a, b in found)


def test_the_check_sees_packages_that_depend_on_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, source in {"a/__init__.py": "", "a/x.py": "from ragspec.b.y import g\n", "a/z.py": "",
                         "b/__init__.py": "", "b/y.py": "def g():\n    from ragspec.a import z\n",
                         "c/__init__.py": "", "c/w.py": "from ragspec.a import x\n"}.items():
        (tmp_path / "ragspec" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ragspec" / name).write_text(source)
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    graph = import_graph(sorted((tmp_path / "ragspec").rglob("*.py")))
    assert not cycles(graph)  # modules alone: no cycle (x -> y -> z)
    assert two_way(package_edges(graph, {"ragspec.a", "ragspec.b", "ragspec.c"})) == [("ragspec.a", "ragspec.b")]


def test_the_check_sees_cycles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = tmp_path / "ragspec"
    core.mkdir()
    (core / "a.py").write_text("def f():\n    from ragspec.b import g\n")
    (core / "b.py").write_text("from ragspec import c\n")
    (core / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ragspec.a import f\n")
    (core / "d.py").write_text("from ragspec.a import f\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert cycles(import_graph(sorted(core.glob("*.py")))) == [["ragspec.a", "ragspec.b", "ragspec.c"]]
