"""The layout of python/taps (docs/architecture.md): every module has a layer and imports only
from lower layers or from its own package; no module imports itself back through others (no
cycle, lazy imports included); and every file the docs name exists."""

from __future__ import annotations

import ast
import re
from collections.abc import Set
from pathlib import Path

import taps

PACKAGE = Path(taps.__file__).parent
ROOT = PACKAGE.parent.parent

#: docs/architecture.md's table: the longest dotted prefix that matches gives the layer.
LAYERS = {
    "taps._core": 0,
    "taps.errors": 1,
    "taps._support": 2,
    "taps.graph": 3,
    "taps.models": 4,
    "taps.plan": 4,
    "taps.solve": 4,
    "taps.search": 5,
    "taps.calibrate": 5,
    "taps.frontends": 5,
    "taps.steps": 5,
    "taps.report": 6,
    "taps.export": 6,
    "taps.verify": 7,
    "taps.reproduce": 7,
    "taps.cli": 8,
    "taps": 9,
}
#: At most this many modules loose at the top of the package (the rest live in packages).
MAX_LOOSE = 5


def _unit(module: str) -> str:
    """The row of the table a module belongs to; a module in no row fails."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if prefix != "taps" and (module == prefix or module.startswith(prefix + ".")):
            return prefix
    if module == "taps":
        return "taps"
    raise AssertionError(f"{module} is in no layer: add it to docs/architecture.md and LAYERS")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, module: str, known: Set[str] = frozenset()) -> set[str]:
    """The taps modules ``path`` imports, lazy ones too; ``from a import b`` counts as ``a.b``
    when that is a module in ``known``, else as ``a``."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                out.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    out.add(sub if sub in known else node.module)
    return {name for name in out if name == "taps" or name.startswith("taps.")}


def _graph() -> dict[str, set[str]]:
    """Every module's imports of other taps modules (``taps._core`` as its own node)."""
    modules = _modules()
    known = set(modules) | {"taps._core"}
    graph = {}
    for module, path in modules.items():
        targets = set()
        for t in _imports(path, module, known):
            while t not in known:
                t = t.rpartition(".")[0]
            if t != module:
                targets.add(t)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

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
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_imports_go_one_way():
    wrong = []
    for module, targets in sorted(_graph().items()):
        mine = _unit(module)
        for target in sorted(targets):
            theirs = _unit(target)
            if theirs != mine and LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{module} (layer {LAYERS[mine]}) imports {target} ({LAYERS[theirs]})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    """Not even inside a package: a submodule never imports its package's ``__init__``."""
    assert _cycles(_graph()) == []


def test_the_checks_see_a_wrong_import_and_a_cycle(tmp_path):
    """The rules are not vacuous: an import of the search from the graph is flagged, and so is
    a cycle of two modules."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from taps.search import search\n", encoding="utf-8")
    assert "taps.search" in _imports(bad, "taps.graph.bad")
    assert LAYERS[_unit("taps.search")] > LAYERS[_unit("taps.graph.bad")]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    try:
        _unit("tapsx.other")
    except AssertionError:
        pass
    else:
        raise AssertionError("a module in no row passed")


def test_few_modules_lie_loose_at_the_top():
    loose = sorted(
        p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__" and not p.stem.startswith("_")
    )
    assert len(loose) <= MAX_LOOSE, loose


def test_every_file_the_docs_name_exists():
    """Paths the README and docs/ give (in backticks or links) are in the tree."""
    pattern = re.compile(r"[`(]((?:python|rust|tests|benches|docs)/[\w./{},-]*\w/?)[`)]")
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in pattern.finditer(doc.read_text(encoding="utf-8")):
            text = match.group(1)
            # `rust/src/plan/{ops,paper,optimal}.rs` names three files.
            brace = re.search(r"\{([^}]*)\}", text)
            names = (
                [
                    text[: brace.start()] + part + text[brace.end() :]
                    for part in brace.group(1).split(",")
                ]
                if brace
                else [text]
            )
            missing += [f"{doc.name}: {n}" for n in names if not (ROOT / n).exists()]
    assert not missing, "\n".join(missing)


def test_the_public_names_are_one_list_and_each_resolves():
    """``taps`` imports its public names on first use (:data:`taps._HOMES`): ``__all__``, the
    table and the type checkers' imports name the same things, and each name is the object its
    home module holds."""
    import importlib

    assert sorted(taps.__all__) == sorted([*taps._HOMES, "__version__"])
    source = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    checked = {
        alias.asname or alias.name: node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("taps")
        for alias in node.names
    }
    homes = {n: m.rpartition(".")[0] if m == f"taps.{n}" else m for n, m in taps._HOMES.items()}
    assert checked == homes
    for name, home in taps._HOMES.items():
        module = importlib.import_module(home)
        assert getattr(taps, name) is (module if home == f"taps.{name}" else getattr(module, name))
    assert dir(taps) == sorted(taps.__all__)  # no importlib, TYPE_CHECKING or _HOMES
