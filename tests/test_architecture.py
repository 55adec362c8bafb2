"""Imports in python/taps go one way (docs/architecture.md): every module has a layer, and
imports only from lower layers or from its own package."""

from __future__ import annotations

import ast
from collections.abc import Set
from pathlib import Path

import taps

PACKAGE = Path(taps.__file__).parent

#: docs/architecture.md's table: the first dotted prefix that matches gives the layer.
LAYERS = {
    "taps._core": 0,
    "taps.extras": 1,
    "taps.checks": 1,
    "taps.limits": 1,
    "taps.outputs": 1,
    "taps.graph": 1,
    "taps.models": 2,
    "taps.sharding": 2,
    "taps.reductions": 2,
    "taps.tying": 3,
    "taps.lagrange": 3,
    "taps.prune": 3,
    "taps.elimination": 3,
    "taps.costs": 3,
    "taps.ilp": 4,
    "taps.search": 5,
    "taps.reports": 6,
    "taps.frontends": 6,
    "taps.export": 6,
    "taps.verify": 6,
    "taps.plot": 7,
    "taps.reproduce": 7,
    "taps.cli": 8,
    "taps": 9,
}
#: Sideways imports the table allows: verify reads export's meshes, export runs the torch front
#: end's program, reproduce draws with plot's figure.
ALLOWED = {
    ("taps.verify", "taps.export"),
    ("taps.export", "taps.frontends"),
    ("taps.reproduce", "taps.plot"),
}


def _unit(module: str) -> str:
    """The row of the table a module belongs to."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    raise AssertionError(f"{module} is in no layer: add it to docs/architecture.md and LAYERS")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, module: str, known: Set[str] = frozenset()) -> set[str]:
    """The taps modules ``path`` imports; ``from a import b`` counts as ``a.b`` when that is a
    module in ``known``, else as ``a``."""
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


def test_imports_go_one_way():
    modules = _modules()
    wrong = []
    for module, path in sorted(modules.items()):
        mine = _unit(module)
        for target in sorted(_imports(path, module, set(modules))):
            if target not in modules and target != "taps._core":
                continue
            theirs = _unit(target)
            if theirs == mine or (mine, theirs) in ALLOWED:
                continue
            if LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{module} (layer {LAYERS[mine]}) imports {target} ({LAYERS[theirs]})")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_wrong_import(tmp_path):
    """The rule is not vacuous: an import of the search from the graph is flagged."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from taps.search import search\n", encoding="utf-8")
    assert "taps.search" in _imports(bad, "taps.graph.bad")
    assert LAYERS[_unit("taps.search")] > LAYERS[_unit("taps.graph.bad")]
