"""The PyTorch front end: ``torch.export`` a module on the meta device (or fake tensors), then turn
the training IR into a :class:`~taps.graph.Graph` with the op rules of
:mod:`taps.frontends.aten_rules`. Nothing is allocated: shapes come from the exported graph's
metadata. docs/frontends.md describes what each operator becomes.
"""

from __future__ import annotations

import importlib
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taps._core import GraphError
from taps._support.extras import require
from taps.frontends.aten_rules import RULES, Unsupported, flat
from taps.frontends.builder import Builder, Value, constant
from taps.graph import Graph

UNKNOWN = ("error", "replicate")

#: Operators whose output is their first input seen another way: the output order of the
#: operator before them looks through these.
_THROUGH = {
    "clone",
    "contiguous",
    "detach",
    "alias",
    "dropout",
    "_to_copy",
    "to",
    "type_as",
}
_VIEWS = {"view", "reshape", "_unsafe_view"}
_PERMUTES = {"transpose", "permute", "t", "swapaxes", "swapdims", "numpy_T"}


def _torch() -> Any:
    return require("torch", "torch", "taps.from_torch")


@dataclass(frozen=True)
class Link:
    """How a graph tensor of an operator is seen by the fx node that made the operator.

    Attributes:
        op: the operator's name.
        slot: the input slot (``None``: the operator's output).
        arg: for an input, its position among the node's arguments flattened (lists and tuples
            opened, keyword arguments after positional ones).
        operand_shape: the shape of the operator's operand (or output) tensor in the graph.
        graph_shape: the shape of the graph tensor the node's argument (or output) views; a
            row-major reshape of ``operand_shape``.
        perm: for each dim of the node's argument (or output), the dim of ``graph_shape`` that
            holds it.
    """

    op: str
    slot: int | None
    arg: int
    operand_shape: tuple[int, ...]
    graph_shape: tuple[int, ...]
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Conversion:
    """A converted program: the graph, the module path of each operator, and for each fx node
    (by name) that made operators, how their inputs and output are its arguments and output
    (inputs first, in operator and slot order, then the output; empty for a node whose
    operators read and make only tensors of its own)."""

    graph: Graph
    module_of: dict[str, str]
    links: dict[str, list[Link]] = field(default_factory=dict)


def from_torch(
    module: Any,
    *example_inputs: Any,
    unknown: str = "error",
    tie: bool = True,
    name: str | None = None,
    kwargs: Mapping[str, Any] | None = None,
    rows: bool = True,
) -> Graph:
    """The graph of ``module`` called on ``example_inputs`` (and keyword ``kwargs``).

    Build the module and the inputs on the meta device (``with torch.device("meta"):``) to
    convert a model of any size without allocating it. Parameter names are the module's
    ``state_dict`` keys, operator names its module paths (``layers.3.attention.wo``; a module
    that makes several operators gives ``path.kind``). An input with ``requires_grad`` stands
    for an earlier layer's output (its gradient flows back).

    With ``rows`` (the default), operators on (batch, seq, features) tensors other than
    attention (linear layers, norms, elementwise operators, embeddings) see batch * seq as one
    rows axis, as Megatron-LM's 2-D matmuls and :func:`taps.models.gpt` do: far fewer
    strategies to search; ``rows=False`` keeps batch and sequence apart (sequence splits too).

    ``unknown="error"`` raises :class:`taps.GraphError` listing every operator without a rule;
    ``"replicate"`` keeps such operators whole (no partitionable axis). With ``tie``, identical
    repeated blocks (children of a ``ModuleList``, ``ModuleDict`` or ``Sequential``) are declared
    with :meth:`Graph.tie`.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    check_unknown(unknown)
    try:
        program = torch.export.export(module, tuple(example_inputs), dict(kwargs or {}))
    except Exception as e:  # torch raises many kinds; the user needs the message, once
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"torch.export failed on {type(module).__name__}: {first}") from None
    grads = [
        bool(getattr(t, "requires_grad", False))
        for t in flat([*example_inputs, *(kwargs or {}).values()])
        if isinstance(t, torch.Tensor)
    ]
    conversion = convert(program, unknown, name or type(module).__name__, grads, rows)
    if tie:
        for instances in repeated_blocks(conversion, module):
            conversion.graph.tie(instances)
    return conversion.graph


def check_unknown(unknown: str) -> None:
    if unknown not in UNKNOWN:
        raise GraphError(f"unknown= must be 'error' or 'replicate', got {unknown!r}")


def _dtype_bytes(dtype: Any) -> int:
    """Bytes per element; a complex element is two real ones (its hidden axis)."""
    size = int(dtype.itemsize)
    return size // 2 if dtype.is_complex else size


def _target_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return str(packet.__name__)
    return str(getattr(target, "__name__", target))


class _Context:
    """What a rule sees of one node (see :class:`taps.frontends.aten_rules.Context`)."""

    def __init__(
        self,
        torch: Any,
        b: Builder,
        node: Any,
        env: dict[Any, Any],
        kind: str,
        path: str,
        rows: bool,
    ) -> None:
        self.b, self.node, self.kind, self.path, self.rows = b, node, kind, path, rows
        resolve = _resolver(env)
        self.args = [resolve(a) for a in node.args]
        self.kwargs = {k: resolve(a) for k, a in node.kwargs.items()}
        vals = _tensor_vals(torch, node.meta.get("val"))
        self.shapes = [tuple(int(d) for d in v.shape) for v in vals]
        self.dtypes = [_dtype_bytes(v.dtype) for v in vals]
        self.complex_out = bool(vals) and vals[0].dtype.is_complex

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)

    def order(self) -> list[int] | None:
        """The framework dims of this node's output in the order the transposes that read it
        (and nothing else) want them, so that they and a following reshape cost nothing."""
        node, dims = self.node, None
        while len(node.users) == 1:
            (user,) = node.users
            name = _target_name(user.target)
            if name in _PERMUTES:
                rank = len(self.shapes[0])
                dims = list(range(rank)) if dims is None else dims
                if name == "permute":
                    p = [d % rank for d in user.args[1]]
                elif name in ("t", "numpy_T"):
                    p = list(range(rank))[::-1]
                else:
                    p = list(range(rank))
                    a, c = user.args[1] % rank, user.args[2] % rank
                    p[a], p[c] = p[c], p[a]
                dims = [dims[i] for i in p]
            elif name not in _THROUGH and not (name in _VIEWS and _shape(user) == _shape(node)):
                break
            node = user
        return dims


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val")
    return tuple(val.shape) if hasattr(val, "shape") else None


def _resolver(env: dict[Any, Any]) -> Callable[[Any], Any]:
    def resolve(a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return type(a)(resolve(x) for x in a)
        if hasattr(a, "op") and hasattr(a, "users"):  # an fx.Node
            return env.get(a)
        return a

    return resolve


def _tensor_vals(torch: Any, val: Any) -> list[Any]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _module_path(node: Any) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return str(list(stack.values())[-1][0])


def convert(
    program: Any,
    unknown: str = "error",
    name: str = "model",
    input_grads: Sequence[bool] = (),
    rows: bool = True,
) -> Conversion:
    """Convert an ``ExportedProgram`` (its training IR) into a graph.

    ``input_grads`` says, for each user input in order, whether it stands for an earlier
    layer's output (requires a gradient); ``rows`` as in :func:`from_torch`."""
    torch = _torch()
    check_unknown(unknown)
    b = Builder()
    env: dict[Any, Any] = {}
    sig = program.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    nodes = list(program.graph.nodes)
    user = 0
    # Parameters first, in state_dict order, so every parameter is in the graph (also one the
    # forward pass does not use) and the count matches the module's.
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    for spec in sig.input_specs:
        if spec.kind.name == "PARAMETER":
            val = placeholders[spec.arg.name].meta["val"]
            env[placeholders[spec.arg.name]] = b.parameter(
                spec.target, tuple(int(d) for d in val.shape), _dtype_bytes(val.dtype)
            )
    unsupported: list[str] = []
    # Per node that made operators: (first record, records end, flattened args, output value).
    made: dict[str, tuple[int, int, list[Any], Any]] = {}
    for node in nodes:
        if node.op == "placeholder":
            if node in env:
                continue
            val = node.meta.get("val")
            spec = kinds.get(node.name)
            kind = spec.kind.name if spec is not None else "USER_INPUT"
            if not isinstance(val, torch.Tensor):
                env[node] = val
            elif kind == "USER_INPUT":
                grad = input_grads[user] if user < len(input_grads) else False
                user += 1
                env[node] = b.input(
                    node.name,
                    tuple(int(d) for d in val.shape),
                    _dtype_bytes(val.dtype),
                    grad,
                )
            else:  # buffers and lifted constants: the same on every device, no gradient
                target = spec.target if spec is not None else node.name
                env[node] = constant(
                    tuple(int(d) for d in val.shape), _dtype_bytes(val.dtype), str(target)
                )
            continue
        if node.op != "call_function":
            continue
        kind = _target_name(node.target)
        # An in-place variant (relu_, add_) converts as its functional form; later readers of
        # the mutated tensor see the result.
        in_place = kind.endswith("_") and not kind.startswith("_") and kind[:-1] in RULES
        kind = kind[:-1] if in_place else kind
        path = _module_path(node)
        cx = _Context(torch, b, node, env, kind, path, rows)
        tensors = [a for a in flat([*cx.args, *cx.kwargs.values()]) if isinstance(a, Value)]
        if kind != "getitem" and all(v.constant for v in tensors) and cx.shapes:
            # Made from constants alone (a mask, rotary tables): computed on every device.
            env[node] = _constants(cx)
            continue
        rule = RULES.get(kind)
        first = len(b.ops)
        try:
            if rule is None:
                raise Unsupported("no rule")
            env[node] = rule(cx)
            if len(b.ops) > first:
                made[node.name] = (
                    first,
                    len(b.ops),
                    flat([*cx.args, *cx.kwargs.values()]),
                    env[node],
                )
            if in_place and node.args and node.args[0] in env:
                env[node.args[0]] = env[node]
        except Unsupported as e:
            where = path or "the top-level module"
            reason = "" if str(e) == "no rule" else f" ({e})"
            unsupported.append(f"{node.target} in {where}{reason}")
            env[node] = _replicate(cx, tensors)
    if unsupported and unknown == "error":
        listed = "".join(f"\n  {u}" for u in unsupported)
        raise GraphError(
            f"{len(unsupported)} operator(s) of {name} have no rule in taps "
            f"(unknown='replicate' keeps them whole):{listed}"
        )
    graph, op_names = b.build(name)
    links = {k: _links(b, op_names, *m) for k, m in made.items()}
    return Conversion(graph, {n: rec.path for n, rec in zip(op_names, b.ops)}, links)


def _links(
    b: Builder, op_names: list[str], first: int, end: int, args: list[Any], out: Any
) -> list[Link]:
    """The links of one node's operators (records ``first`` to ``end``) with its flattened
    arguments and output value: an operand views an argument when both are views of one graph
    tensor (every view is a row-major reshape of its root)."""
    found: list[Link] = []
    for i in range(first, end):
        rec = b.ops[i]
        for slot, (tid, _) in enumerate(rec.inputs):
            k = next(
                (
                    k
                    for k, a in enumerate(args)
                    if isinstance(a, Value)
                    and not a.constant
                    and not a.hidden
                    and b.root(a.tensor) == b.root(tid)  # type: ignore[arg-type]
                ),
                None,
            )
            if k is not None:
                a = args[k]
                found.append(Link(op_names[i], slot, k, b.shape(tid), b.shape(a.tensor), a.perm))
    if isinstance(out, Value) and not out.constant and not out.hidden:
        root = b.root(out.tensor)  # type: ignore[arg-type]
        for i in reversed(range(first, end)):
            if b.root(b.ops[i].output) == root:
                rec = b.ops[i]
                found.append(
                    Link(op_names[i], None, -1, b.shape(rec.output), b.shape(out.tensor), out.perm)  # type: ignore[arg-type]
                )
                break
    return found


def _constants(cx: _Context) -> Any:
    values = [constant(s, d) for s, d in zip(cx.shapes, cx.dtypes)]
    val = cx.node.meta.get("val")
    return values if isinstance(val, (list, tuple)) else values[0]


def _replicate(cx: _Context, tensors: list[Value]) -> Any:
    """An operator without a rule kept whole: no axis can be split. One per tensor output."""
    inputs = [(v, [f"x{k}_{i}" for i in range(len(v.shape))]) for k, v in enumerate(tensors)]
    inputs = [(v, labels) for v, labels in inputs if not v.constant]
    outs = []
    for shape, dtype in zip(cx.shapes, cx.dtypes):
        if not inputs:
            outs.append(constant(shape, dtype))
            continue
        out_l = [f"y{i}" for i in range(len(shape))]
        outs.append(cx.b.op(cx.kind, cx.path, inputs, shape, out_l, dtype, partitionable=()))
    val = cx.node.meta.get("val")
    return outs if isinstance(val, (list, tuple)) else (outs[0] if outs else None)


# -- repeated blocks --------------------------------------------------------------------------


def _block_signature(graph: Graph, names: Sequence[str]) -> tuple[Any, ...]:
    """What makes two blocks repeats of each other: per operator, everything but names, and
    where each input comes from (an operator of the block by position, or outside)."""
    index = {n: i for i, n in enumerate(names)}
    sig = []
    for n in names:
        op = graph.op(n)
        inputs = []
        for o in op.inputs:
            t, root = graph.tensors[o.tensor], graph.root(o.tensor)
            source = index.get(root.producer or "", -1) if root.kind == "activation" else -1
            # An input from outside the block comes from a different producer in every
            # instance (the one before it): its root's shape need not agree.
            root_shape = root.shape if source >= 0 else None
            inputs.append((o.dims, t.shape, t.kind, root.kind, root_shape, t.dtype_bytes, source))
        # Graph.signature is what Graph.tie compares (it also holds gradients and parameters).
        sig.append((op.kind, graph.signature(n), op.output.dims, tuple(inputs)))
    return tuple(sig)


def repeated_blocks(conversion: Conversion, module: Any) -> list[list[list[str]]]:
    """Identical repeated blocks of a converted module: for every ``ModuleList``,
    ``ModuleDict`` or ``Sequential`` (outermost first), its children whose operators have the
    same signature (kinds, axes, sizes, operand shapes and the wiring inside the block), grouped.
    Each group lists its instances (two or more), each the operator names of one child in graph
    order, aligned by position. A block inside an instance already grouped is not grouped
    again."""
    torch = _torch()
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    ops_of: dict[str, list[str]] = {}
    for op_name, path in conversion.module_of.items():
        ops_of.setdefault(path, []).append(op_name)
    order = {op.name: i for i, op in enumerate(conversion.graph.ops)}
    covered: set[str] = set()
    found: list[list[list[str]]] = []
    for path, mod in module.named_modules():
        if not isinstance(mod, containers) or any(
            path == c or path.startswith(c + ".") for c in covered
        ):
            continue
        by_sig: dict[tuple[Any, ...], list[tuple[str, list[str]]]] = {}
        for child_name, child in mod.named_children():
            child_path = f"{path}.{child_name}" if path else child_name
            names = sorted(
                (
                    n
                    for p, ns in ops_of.items()
                    if p == child_path or p.startswith(child_path + ".")
                    for n in ns
                ),
                key=order.__getitem__,
            )
            if len(names) < 2:  # a single operator gains nothing from a tie
                continue
            key = (type(child).__qualname__, _block_signature(conversion.graph, names))
            by_sig.setdefault(key, []).append((child_path, names))
        for members in by_sig.values():
            if len(members) > 1:
                found.append([names for _, names in members])
                covered.update(p for p, _ in members)
    return found


def load(path: str, unknown: str = "error", name: str | None = None) -> Graph:
    """The graph of a saved ``torch.export`` archive (``.pt2``)."""
    torch = _torch()
    try:
        program = torch.export.load(path)
    except Exception as e:
        raise GraphError(f"cannot load torch.export archive {path!r}: {e}") from None
    return convert(program, unknown, name or path.rsplit("/", 1)[-1].removesuffix(".pt2")).graph


def load_factory(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``(module, inputs)`` made by ``package.module:factory``, a callable returning the module
    and its example inputs (a tuple or a single tensor)."""
    torch = _torch()
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise GraphError(f"{spec!r} is not package.module:factory")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as e:
        raise GraphError(f"cannot import {module_name!r}: {e}") from None
    except AttributeError:
        raise GraphError(f"module {module_name!r} has no {attr!r}") from None
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise GraphError(f"{spec} must return (module, inputs), got {type(made).__name__}")
    module, inputs = made
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return module, tuple(inputs)


def from_factory(spec: str, unknown: str = "error", tie: bool = True) -> Graph:
    """The graph of ``package.module:factory`` (:func:`load_factory`), converted by
    :func:`from_torch`."""
    module, inputs = load_factory(spec)
    return from_torch(module, *inputs, unknown=unknown, tie=tie, name=spec.partition(":")[2])
