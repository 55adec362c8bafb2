"""Identical layers exported once: a module whose ``ModuleList`` (or ``Sequential``) repeats
children of one structure is exported with a prefix of them, and the operators of the last
exported period are copied, renamed, for the rest (docs/frontends.md, "Repeated layers exported
once"). ``torch.export`` costs about the same per layer whatever it is; a copy costs nothing.

The copies are only made where the exported prefix shows them right: the last period's
operators must equal the period's before it up to the shift of their names (same operators,
same wiring: what a layer reads from the layer before it, and what it reads from outside the
list), each layer must read the one before it (children side by side, as a ``ModuleList`` of
experts, are exported whole: how many there are may matter), and what follows the list may read
only the last period. Otherwise the module is
exported whole."""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from taps.frontends.torch._extra import require_torch
from taps.frontends.torch.program import Conversion
from taps.graph import Graph

#: Attribute values compared by value between layers; any other object by identity.
_PLAIN = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class Cut:
    """One container exported with its first ``kept`` of ``total`` children: from child
    ``start`` on its children repeat with period ``period``."""

    path: str
    keys: tuple[str, ...]
    kept: int
    start: int
    period: int
    _index: dict[str, int] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {k: i for i, k in enumerate(self.keys)})

    def prefix(self, child: int) -> str:
        """The names of child ``child``'s operators and tensors start with this."""
        key = self.keys[child]
        return f"{self.path}.{key}." if self.path else f"{key}."

    def owner(self, name: str) -> int | None:
        """The child whose name ``name`` is (or under which it is), if any."""
        head = f"{self.path}." if self.path else ""
        if not name.startswith(head):
            return None
        return self._index.get(name[len(head) :].split(".", 1)[0])


def _value(torch: Any, v: Any, deep: bool = True) -> Any:
    """An attribute's value as compared between layers: plain values and dtypes by value,
    tensors by shape and dtype, another object by its class and its own plain attributes (an
    activation's approximation, a config's fields)."""
    if isinstance(v, _PLAIN):
        return v
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v)
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype))
    if isinstance(v, (tuple, list)) and all(isinstance(x, _PLAIN) for x in v):
        return (type(v).__name__, tuple(v))
    kind = (type(v).__module__, type(v).__qualname__, getattr(v, "__qualname__", None))
    if not deep or not hasattr(v, "__dict__"):
        return kind
    return (kind, tuple((k, _value(torch, x, False)) for k, x in sorted(vars(v).items())))


def _structure(torch: Any, child: Any) -> dict[tuple[str, str], Any]:
    """What two children of a container must share to run the same code on tensors of the same
    shapes, by (submodule, what): its class, its parameters' and buffers' shapes and dtypes,
    its other attributes; a child with hooks is like no other."""
    parts: dict[tuple[str, str], Any] = {}
    for name, sub in child.named_modules():
        if sub._forward_hooks or sub._forward_pre_hooks:
            return {("", "hooked"): id(child)}
        parts[name, "class"] = (type(sub).__module__, type(sub).__qualname__)
        parts[name, "parameters"] = tuple(
            (k, None if p is None else (tuple(p.shape), str(p.dtype), p.requires_grad))
            for k, p in sub._parameters.items()
        )
        parts[name, "buffers"] = tuple(
            (k, None if b is None else (tuple(b.shape), str(b.dtype)))
            for k, b in sub._buffers.items()
        )
        for k, v in vars(sub).items():
            if not k.startswith("_") and k != "training":
                parts[name, k] = _value(torch, v)
    return parts


def _labels(torch: Any, children: Sequence[Any]) -> list[Any]:
    """The children's structures, comparable: an attribute that holds each child's own index
    (``layer_idx``) is the same in all of them."""
    raw = [_structure(torch, c) for c in children]
    own = {
        k
        for k, v in raw[0].items()
        if v == 0 and all(type(r.get(k)) is int and r.get(k) == i for i, r in enumerate(raw))
    }
    return [tuple(sorted((k, "<index>" if k in own else v) for k, v in r.items())) for r in raw]


def _period(labels: Sequence[Any]) -> tuple[int, int, int] | None:
    """``(kept, start, period)``: the shortest prefix that holds two periods of the repeating
    tail and ends at the same phase as the whole list, or ``None`` when it is the whole list."""
    n = len(labels)
    best: tuple[int, int, int] | None = None
    for period in range(1, n // 3 + 1):
        for start in range(n - 3 * period + 1):
            if all(labels[i] == labels[i + period] for i in range(start, n - period)):
                kept = start + 2 * period + (n - start) % period
                if kept < n and (best is None or kept < best[0]):
                    best = (kept, start, period)
                break
    return best


def cuts(module: Any) -> list[Cut]:
    """The containers of ``module`` (outermost first, none inside another) whose children repeat
    enough that exporting a prefix of them saves work; a container whose parameters are also
    held elsewhere (a weight shared between layers) is left whole."""
    torch = require_torch()
    counts: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    found: list[Cut] = []
    for path, mod in module.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        if any(path.startswith(c.path + ".") or not c.path for c in found):
            continue
        children = list(mod.named_children())
        if len(children) < 3 or any(
            counts.get(id(p), 0) > 1 for _, c in children for p in c.parameters()
        ):
            continue
        got = _period(_labels(torch, [c for _, c in children]))
        if got is not None:
            found.append(Cut(path, tuple(k for k, _ in children), *got))
    return found


@contextlib.contextmanager
def truncated(module: Any, found: Sequence[Cut]) -> Iterator[None]:
    """``module`` with each cut's container holding only its first ``kept`` children."""
    held = []
    try:
        for cut in found:
            mod = module.get_submodule(cut.path) if cut.path else module
            held.append((mod, mod._modules))
            mod._modules = type(mod._modules)(list(mod._modules.items())[: cut.kept])
        yield
    finally:
        for mod, modules in held:
            mod._modules = modules


class NotRepeated(Exception):
    """The exported prefix does not show the copies right: export the module whole."""


def _names(entry: dict[str, Any]) -> list[str]:
    """The names a tensor or operator entry of :meth:`Graph.to_dict` holds: its own, its base's
    (a view), its inputs'."""
    return [
        entry["name"],
        *([entry["base"]] if "base" in entry else []),
        *(o["tensor"] for o in entry.get("inputs", ())),
    ]


def _renamed(entry: dict[str, Any], rename: Callable[[str], str]) -> dict[str, Any]:
    """``entry`` with every name it holds renamed."""
    out = dict(entry, name=rename(entry["name"]))
    if "base" in entry:
        out["base"] = rename(entry["base"])
    if "inputs" in entry:
        out["inputs"] = [dict(o, tensor=rename(o["tensor"])) for o in entry["inputs"]]
    return out


def _shifter(cut: Cut, by: Callable[[int], int | None]) -> Callable[[str], str]:
    """Renames a name of a repeating child ``c`` (from ``cut.start`` on) to the same name in
    child ``by(c)``; other names stay (what a repeating child reads of the children before the
    repeats, as T5's layers read the first layer's position bias, is read by every copy)."""

    def rename(name: str) -> str:
        c = cut.owner(name)
        if c is None or c < cut.start:
            return name
        to = by(c)
        if to is None or not cut.start <= to < len(cut.keys):
            raise NotRepeated(name)
        rest = name[len(cut.prefix(c)) - 1 :]  # "" for the child's own path, else ".x..."
        return cut.prefix(to)[:-1] + rest

    return rename


def _blank(name: str) -> str:
    return ""


def _repeats(cut: Cut, mine: dict[str, Any], theirs: dict[str, Any] | None) -> bool:
    """Whether entry ``mine`` of a child of the last exported period is entry ``theirs`` of the
    child a period before, but for the shift of names: what it reads from a repeating child
    ``c`` the other reads from ``c - period``; what it reads from the first period (the chain's
    start) the other reads from before the repeats; anything else is the same name."""
    if theirs is None or _renamed(mine, _blank) != _renamed(theirs, _blank):
        return False
    a, b = _names(mine), _names(theirs)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        c = cut.owner(x)
        if c is None or c < cut.start:
            if x != y:
                return False
        elif c - cut.period >= cut.start:
            if y != _shifter(cut, lambda c: c - cut.period)(x):
                return False
        elif (d := cut.owner(y)) is not None and d >= cut.start:
            return False
    return True


def _instanced(doc: dict[str, Any], module_of: dict[str, str], cut: Cut) -> None:
    """Add the copies of ``cut``'s missing children to the graph document ``doc`` (and their
    modules to ``module_of``), in place."""
    n, kept, period = len(cut.keys), cut.kept, cut.period
    owners = [cut.owner(op["name"]) for op in doc["ops"]]
    inside = [i for i, c in enumerate(owners) if c is not None]
    if not inside:
        raise NotRepeated(cut.path)
    first, last = inside[0], inside[-1]
    run = [c for c in owners[first : last + 1] if c is not None]
    if len(run) != last + 1 - first or any(a > b for a, b in itertools.pairwise(run)):
        raise NotRepeated(cut.path)  # the children's operators are not one run, child by child
    entries = [*doc["tensors"], *doc["ops"]]
    by_name = {e["name"]: e for e in entries}
    back = _shifter(cut, lambda c: c - period)
    for child in range(kept - period, kept):
        mine = [e for e in entries if cut.owner(e["name"]) == child]
        theirs = [e for e in entries if cut.owner(e["name"]) == child - period]
        if len(mine) != len(theirs) or not all(
            _repeats(cut, e, by_name.get(back(e["name"]))) for e in mine
        ):
            raise NotRepeated(cut.prefix(child))
        # Layers chain: each reads the one before it. Children side by side (a ModuleList of
        # experts) may be told apart by what reads them (the router's count of experts).
        if not any(cut.owner(x) == child - 1 for e in mine for x in _names(e)[1:]):
            raise NotRepeated(cut.prefix(child))
    # What follows the list reads its last period, which is the whole list's last period.
    tail = _shifter(cut, lambda c: c + n - kept if c >= kept - period else None)
    copies_ops: list[dict[str, Any]] = []
    copies_tensors: dict[str, list[dict[str, Any]]] = {}
    for child in range(kept, n):
        template = child - period * (-(-(child - kept + 1) // period))
        shift = _shifter(cut, functools.partial(operator.add, child - template))
        for e in doc["tensors"]:
            if cut.owner(e["name"]) == template:
                copies_tensors.setdefault(e["kind"], []).append(_renamed(e, shift))
        for op in doc["ops"]:
            if cut.owner(op["name"]) == template:
                copy = _renamed(op, shift)
                copies_ops.append(copy)
                module_of[copy["name"]] = shift(module_of[op["name"]])
    after = [_renamed(op, tail) for op in doc["ops"][last + 1 :]]
    doc["ops"] = doc["ops"][: last + 1] + copies_ops + after
    # Each kind's copies after the last of that kind in the list, where a whole export has them.
    tensors: list[dict[str, Any]] = []
    ends = {e["kind"]: i for i, e in enumerate(doc["tensors"]) if cut.owner(e["name"]) is not None}
    for i, e in enumerate(doc["tensors"]):
        tensors.append(e if cut.owner(e["name"]) is not None else _renamed(e, tail))
        for kind, end in ends.items():
            if i == end:
                tensors.extend(copies_tensors.get(kind, []))
    doc["tensors"] = tensors


def instanced(conversion: Conversion, found: Sequence[Cut]) -> Conversion:
    """The conversion of a module exported :func:`truncated` to ``found``, with the missing
    children's operators and parameters copied from the last exported period. Raises
    :class:`NotRepeated` when the prefix does not show the copies right."""
    doc = conversion.graph.to_dict()
    module_of = dict(conversion.module_of)
    for cut in found:
        _instanced(doc, module_of, cut)
    graph = Graph.from_dict(doc)
    return Conversion(graph, module_of, conversion.links, conversion.aliases)
