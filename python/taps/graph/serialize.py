"""The JSON form of a graph (schema in docs/graph.md): writing one line per tensor and operator,
and reading with errors that name the field."""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from taps._core import GraphError
from taps._support import arguments
from taps.graph.ir import GraphIR
from taps.graph.records import SAVED, is_positive_int

#: The graph class a document is read into (:class:`taps.Graph`).
G = TypeVar("G", bound=GraphIR)

FORMAT = "taps.graph"
VERSION = 1


def to_dict(g: GraphIR) -> dict[str, Any]:
    """The JSON document as Python objects (schema in docs/graph.md)."""
    tensors = []
    for t in g.tensors.values():
        if t.kind == "activation":
            continue  # made by its operator
        entry: dict[str, Any] = {
            "name": t.name,
            "kind": t.kind,
            "shape": list(t.shape),
            "dtype_bytes": t.dtype_bytes,
        }
        if t.kind == "input":
            entry["requires_grad"] = t.requires_grad
        elif t.kind == "parameter" and not t.requires_grad:
            entry["requires_grad"] = False  # a frozen one only: older files read the same
        if t.base is not None:
            entry["base"] = t.base
        tensors.append(entry)
    ops = []
    for op in g.ops:
        ops.append(
            {
                "name": op.name,
                "kind": op.kind,
                "axes": [[a, s] for a, s in zip(op.axes, op.axis_sizes)],
                "partitionable": list(op.partitionable),
                "inputs": [
                    {
                        "tensor": o.tensor,
                        "dims": list(o.dims),
                        **({"addend": True} if o.addend else {}),
                    }
                    for o in op.inputs
                ],
                "output": {
                    "dims": list(op.output.dims),
                    "dtype_bytes": g.tensors[op.output.tensor].dtype_bytes,
                    # Written only when not the default, so older files read the same.
                    **({"saved": op.saved} if op.saved != "output" else {}),
                },
            }
        )
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": g.name,
        "layers": g.layers,
        "tensors": tensors,
        "ops": ops,
    }
    if g.tied:
        doc["tied"] = [[list(inst) for inst in group] for group in g.tied]
    if g.stacks:
        doc["stacks"] = [
            {"name": name, "pieces": list(pieces), "axis": axis}
            for name, (pieces, axis) in g.stacks.items()
        ]
    return doc


def to_json(g: GraphIR) -> str:
    """The graph as JSON: one line per tensor and per operator, so files diff well."""
    doc = to_dict(g)
    lines = ["{"]
    for key in ("format", "version", "name", "layers"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(doc[key])},")
    keys = [k for k in ("tensors", "ops", "tied", "stacks") if k in doc]
    for key in keys:
        items = [f"    {json.dumps(item)}" for item in doc[key]]
        body = "[\n" + ",\n".join(items) + "\n  ]" if items else "[]"
        lines.append(f"  {json.dumps(key)}: {body}{'' if key == keys[-1] else ','}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def from_json(text: str | bytes, cls: type[G]) -> G:
    """Read a graph written by :func:`to_json` (schema in docs/graph.md). Errors name the
    field, e.g. ``ops[3].inputs[1].tensor: unknown tensor 'h9'``."""
    arguments.text("Graph.from_json", "text", text)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GraphError(f"not JSON: {e}") from None
    except RecursionError:
        raise GraphError("not a graph: JSON nested too deeply") from None
    except ValueError:  # an int literal longer than Python converts (4,300 digits)
        raise GraphError("not a graph: JSON holds a number too long to read") from None
    return from_dict(data, cls)


def from_dict(data: Any, cls: type[G]) -> G:
    """Read the document :func:`to_dict` makes; see :func:`from_json`."""
    _fields(data, "", {"format", "version", "name", "layers", "tensors", "ops", "tied", "stacks"})
    fmt, version = _get(data, "", "format", str), _get(data, "", "version", int)
    if fmt != FORMAT:
        raise GraphError(f"format: expected {FORMAT!r}, got {fmt!r}")
    if version != VERSION:
        raise GraphError(f"version: this taps reads version {VERSION}, got {version}")
    name, layers = _get(data, "", "name", str), _get(data, "", "layers", int)
    if layers < 1:
        raise GraphError(f"layers: must be a positive int, got {layers}")
    g = cls(name, layers)
    pending: list[_Pending] = []
    for i, t in enumerate(_get(data, "", "tensors", list)):
        view = _read_tensor(g, t, f"tensors[{i}]")
        if view is not None:
            pending.append(view)
    for i, op in enumerate(_get(data, "", "ops", list)):
        pending.append(_read_op(op, f"ops[{i}]"))
    _add_in_order(g, pending)
    if "tied" in data:
        for i, group in enumerate(_get(data, "", "tied", list)):
            if not isinstance(group, list) or not all(
                isinstance(inst, list) and all(isinstance(n, str) for n in inst) for inst in group
            ):
                raise GraphError(f"tied[{i}]: expected a list of lists of operator names")
            with _At(f"tied[{i}]"):
                g.tie(group)
    for i, stack in enumerate(_get(data, "", "stacks", list) if "stacks" in data else []):
        path = f"stacks[{i}]"
        _fields(stack, path, {"name", "pieces", "axis"})
        with _At(path):
            g.stack(
                _get(stack, path, "name", str),
                _list_of(stack, path, "pieces", str),
                _get(stack, path, "axis", int),
            )
    return g


def _add_in_order(g: GraphIR, pending: list[_Pending]) -> None:
    """Add views and operators once what they use exists: always the first ready one in file
    order, so a file in topological order keeps its order. Whatever is left waits on a
    tensor nobody makes, or on a cycle."""
    waiting: dict[str, list[int]] = {}
    missing = []
    ready: list[int] = []
    for i, p in enumerate(pending):
        wanted = {t for _, t in p.uses if t not in g.tensors}
        for t in wanted:
            waiting.setdefault(t, []).append(i)
        missing.append(len(wanted))
        if not wanted:
            ready.append(i)
    heapq.heapify(ready)
    done = set()
    while ready:
        i = heapq.heappop(ready)
        with _At(pending[i].path):
            pending[i].add(g)
        done.add(i)
        for j in waiting.get(pending[i].makes, []):
            missing[j] -= 1
            if not missing[j]:
                heapq.heappush(ready, j)
    pending = [p for i, p in enumerate(pending) if i not in done]
    if not pending:
        return
    maker = {p.makes: p for p in pending}
    for p in pending:
        for field, t in p.uses:
            if t not in g.tensors and t not in maker:
                raise GraphError(f"{p.path}.{field}: unknown tensor {t!r}")
    # Every item left waits on another one left: walking back from any of them must come
    # round to an item already seen, which closes a cycle.
    walk = [pending[0]]
    while True:
        nxt = next(maker[t] for _, t in walk[-1].uses if t not in g.tensors)
        if nxt in walk:
            break
        walk.append(nxt)
    cycle = walk[walk.index(nxt) :][::-1]  # data-flow order
    # Start at the operator that comes first in the file (views only if nothing else).
    start = min(range(len(cycle)), key=lambda i: (cycle[i].is_view, pending.index(cycle[i])))
    cycle = cycle[start:] + cycle[:start]
    names = [p.label for p in (*cycle, cycle[0])]
    raise GraphError(f"ops: the graph has a cycle: {' -> '.join(names)}")


# -- JSON reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pending:
    """A view or operator read from JSON, added once the tensors it uses exist."""

    path: str
    label: str  # how a cycle message names it
    is_view: bool
    uses: tuple[tuple[str, str], ...]  # (field, tensor name)
    makes: str
    add: Callable[[GraphIR], None]


class _At:
    """Prefix a GraphError raised inside with the field path it concerns."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, GraphError) and not str(exc).startswith(self.path):
            raise GraphError(f"{self.path}: {exc}") from None


def _fields(obj: Any, path: str, allowed: set[str]) -> None:
    """``obj`` must be an object with no fields but ``allowed`` (a typo is an error, not a
    silently missing option)."""
    if not isinstance(obj, dict):
        raise GraphError(f"{path or 'top level'}: expected an object, got {type(obj).__name__}")
    for key in obj:
        if key not in allowed:
            raise GraphError(f"{path or 'top level'}: unknown field {key!r}")


def _get(obj: dict, path: str, key: str, typ: type) -> Any:
    where = f"{path}.{key}" if path else key
    if key not in obj:
        raise GraphError(f"{where}: missing")
    value = obj[key]
    if (typ is int and isinstance(value, bool)) or not isinstance(value, typ):
        raise GraphError(f"{where}: expected {typ.__name__}, got {value!r}")
    return value


def _list_of(obj: dict, path: str, key: str, typ: type) -> list:
    values = _get(obj, path, key, list)
    for i, v in enumerate(values):
        if (typ is int and isinstance(v, bool)) or not isinstance(v, typ):
            raise GraphError(f"{path}.{key}[{i}]: expected {typ.__name__}, got {v!r}")
    return values


_TENSOR_FIELDS = {
    "input": {"name", "kind", "shape", "dtype_bytes", "requires_grad"},
    "parameter": {"name", "kind", "shape", "dtype_bytes", "requires_grad"},
    "view": {"name", "kind", "shape", "dtype_bytes", "base"},
}


def _read_tensor(g: GraphIR, t: Any, path: str) -> _Pending | None:
    """Add an input or parameter now; return a view, which waits for its base."""
    _fields(t, path, set().union(*_TENSOR_FIELDS.values()))
    kind = _get(t, path, "kind", str)
    if kind not in _TENSOR_FIELDS:
        hint = " (activations are not listed: operators make them)" if kind == "activation" else ""
        raise GraphError(
            f"{path}.kind: expected 'input', 'parameter' or 'view', got {kind!r}{hint}"
        )
    _fields(t, path, _TENSOR_FIELDS[kind])
    name = _get(t, path, "name", str)
    shape = _list_of(t, path, "shape", int)
    dtype = _get(t, path, "dtype_bytes", int)
    if kind == "input":
        requires_grad = _get(t, path, "requires_grad", bool)
        with _At(path):
            g.input(name, shape, dtype, requires_grad)
        return None
    if kind == "parameter":
        trained = _get(t, path, "requires_grad", bool) if "requires_grad" in t else True
        with _At(path):
            g.parameter(name, shape, dtype, trained)
        return None
    base = _get(t, path, "base", str)

    def add(g: GraphIR) -> None:
        if g.tensors[base].dtype_bytes != dtype:
            raise GraphError(
                f"{path}.dtype_bytes: view {name!r} has {dtype} but its base {base!r} has "
                f"{g.tensors[base].dtype_bytes}"
            )
        g.reshape(name, base, shape)

    return _Pending(path, f"view {name!r}", True, (("base", base),), name, add)


def _read_op(op: Any, path: str) -> _Pending:
    _fields(op, path, {"name", "kind", "axes", "partitionable", "inputs", "output"})
    name, kind = _get(op, path, "name", str), _get(op, path, "kind", str)
    sizes: dict[str, int] = {}
    for j, pair in enumerate(_get(op, path, "axes", list)):
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not is_positive_int(pair[1])
        ):
            raise GraphError(f"{path}.axes[{j}]: expected [name, positive size], got {pair!r}")
        if pair[0] in sizes:
            raise GraphError(f"{path}.axes[{j}]: axis {pair[0]!r} is listed twice")
        sizes[pair[0]] = pair[1]
    part = _list_of(op, path, "partitionable", str)
    inputs: list[tuple[str, list[str]]] = []
    addends: list[tuple[str, list[str]]] = []
    for j, operand in enumerate(_get(op, path, "inputs", list)):
        p = f"{path}.inputs[{j}]"
        _fields(operand, p, {"tensor", "dims", "addend"})
        addend = operand.get("addend", False)
        if not isinstance(addend, bool):
            raise GraphError(f"{p}.addend: expected bool, got {addend!r}")
        if addends and not addend:
            raise GraphError(f"{p}: an input after an addend must be an addend too")
        pair = (_get(operand, p, "tensor", str), _list_of(operand, p, "dims", str))
        (addends if addend else inputs).append(pair)
    out = _get(op, path, "output", dict)
    _fields(out, f"{path}.output", {"dims", "dtype_bytes", "saved"})
    out_dims = _list_of(out, f"{path}.output", "dims", str)
    dtype = _get(out, f"{path}.output", "dtype_bytes", int)
    saved = _get(out, f"{path}.output", "saved", str) if "saved" in out else "output"
    if saved not in SAVED:
        raise GraphError(f"{path}.output.saved: expected one of {', '.join(SAVED)}, got {saved!r}")

    def add(g: GraphIR) -> None:
        for field, dims in [
            *((f"inputs[{j}].dims", dims) for j, (_, dims) in enumerate([*inputs, *addends])),
            ("output.dims", out_dims),
        ]:
            for d in dims:
                if d not in sizes:
                    raise GraphError(f"{path}.{field}: axis {d!r} is not in axes")
        # The file's axis order is the operator's: keep it rather than the inferred one.
        g.add_operator(
            name,
            kind,
            inputs,
            out_dims,
            part,
            sizes,
            dtype,
            list(sizes),
            addends=addends,
            saved=saved,
        )

    uses = tuple((f"inputs[{j}].tensor", t) for j, (t, _) in enumerate([*inputs, *addends]))
    return _Pending(path, repr(name), False, uses, f"{name}.out", add)
