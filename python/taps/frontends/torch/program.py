"""The conversion driver of the PyTorch front end: an ``ExportedProgram``'s training IR turned
into a :class:`~taps.graph.Graph` node by node, through the op rules of
:mod:`taps.frontends.torch.rules`, with the links from each fx node to the operators it made.
Nothing is allocated: shapes come from the exported graph's metadata.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taps._core import GraphError
from taps.frontends.torch import moe
from taps.frontends.torch._extra import require_torch
from taps.frontends.torch.builder import AtenGraphBuilder, AtenValue, constant
from taps.frontends.torch.rules import RULES, Unsupported, flat
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
    #: Per parameter ``state_dict`` key that names a tensor another key named first (a weight
    #: tied to two modules), that first key: the graph's name of the one parameter.
    aliases: dict[str, str] = field(default_factory=dict)


def check_unknown(unknown: str) -> None:
    """Raise :class:`taps.GraphError` unless ``unknown`` is ``"error"`` or ``"replicate"``."""
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
    """What a rule sees of one node (see :class:`taps.frontends.torch.rules.Context`)."""

    def __init__(
        self,
        torch: Any,
        b: AtenGraphBuilder,
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
    layer's output (requires a gradient); ``rows`` as in
    :func:`~taps.frontends.torch.module.from_torch`."""
    torch = require_torch()
    check_unknown(unknown)
    b = AtenGraphBuilder()
    env: dict[Any, Any] = {}
    sig = program.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    nodes = list(program.graph.nodes)
    user = 0
    # Mixture-of-experts blocks: their routed part becomes the GShard form's operators, made at
    # its last node (docs/moe.md).
    blocks = moe.find_blocks(program, lambda n: _target_name(n.target))
    per_expert = moe.per_expert_parameters(blocks)
    # Parameters first, in state_dict order, so every parameter is in the graph (also one the
    # forward pass does not use) and the count matches the module's. A tensor under several
    # keys (tied weights) is one parameter, named by its first key as ``named_parameters`` does;
    # per-expert weights are one stacked parameter, where their first expert's is.
    placeholders = {n.name: n for n in nodes if n.op == "placeholder"}
    first_key: dict[int, str] = {}
    aliases: dict[str, str] = {}
    values: dict[str, Any] = {}
    for spec in sig.input_specs:
        if spec.kind.name == "PARAMETER" and spec.arg.name in per_expert:
            key, count = per_expert[spec.arg.name]
            if key not in values:
                val = placeholders[spec.arg.name].meta["val"]
                shape = (count, *(int(d) for d in val.shape))
                values[key] = b.parameter(key, shape, _dtype_bytes(val.dtype))
            env[placeholders[spec.arg.name]] = values[key]
        elif spec.kind.name == "PARAMETER":
            target = str(spec.target)
            held = program.state_dict.get(target)
            key = first_key.setdefault(id(held), target) if held is not None else target
            if key != target:
                aliases[target] = key
            else:
                val = placeholders[spec.arg.name].meta["val"]
                values[key] = b.parameter(
                    key,
                    tuple(int(d) for d in val.shape),
                    _dtype_bytes(val.dtype),
                    held is None or held.requires_grad,
                )
            env[placeholders[spec.arg.name]] = values[key]
    routed = {n.name: block for block in blocks for n in block.routed}
    nodes, bindings, results = _inlined(program, routed)
    unsupported: list[str] = []
    # Per node that made operators: (first record, records end, flattened args, output value).
    made: dict[str, tuple[int, int, list[Any], Any]] = {}
    for node in nodes:
        if node in bindings:  # a wrapped subgraph's input: the wrapper's argument
            env[node] = env.get(bindings[node])
            continue
        if node in results:  # a wrapper: its subgraph's outputs
            env[node] = [env.get(o) if hasattr(o, "users") else o for o in results[node]]
            continue
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
        if node.name in routed:
            block = routed[node.name]
            if node.name == block.last:
                moe.emit(block, b, env, env.get)
            continue
        kind = _target_name(node.target)
        # An in-place variant (relu_, add_) converts as its functional form; later readers of
        # the mutated tensor see the result.
        in_place = kind.endswith("_") and not kind.startswith("_") and kind[:-1] in RULES
        kind = kind[:-1] if in_place else kind
        path = _module_path(node)
        cx = _Context(torch, b, node, env, kind, path, rows)
        tensors = [a for a in flat([*cx.args, *cx.kwargs.values()]) if isinstance(a, AtenValue)]
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
    graph.share_parameters()
    links = {k: _links(b, op_names, *m) for k, m in made.items()}
    return Conversion(graph, {n: rec.path for n, rec in zip(op_names, b.ops)}, links, aliases)


#: Higher-order operators that run a subgraph in a mode (autocast, grad mode: torchtitan's
#: router): the subgraph converts in their place.
_WRAPPERS = ("wrap_with_autocast", "wrap_with_set_grad_enabled")


def _inlined(program: Any, skipped: Mapping[str, Any]) -> tuple[list[Any], dict, dict]:
    """The program's nodes with each wrapper's subgraph before it (but a ``skipped`` wrapper's),
    the subgraphs' placeholders bound to the wrappers' arguments, and each wrapper's outputs."""
    nodes: list[Any] = []
    bindings: dict[Any, Any] = {}
    results: dict[Any, Any] = {}

    def add(graph: Any, owner: Any) -> None:
        for node in graph.nodes:
            name = str(getattr(node.target, "__name__", ""))
            if node.op == "call_function" and name in _WRAPPERS and node.name not in skipped:
                at = next(i for i, a in enumerate(node.args) if getattr(a, "op", "") == "get_attr")
                sub = getattr(owner, node.args[at].target)
                inputs = [n for n in sub.graph.nodes if n.op == "placeholder"]
                bindings.update(zip(inputs, node.args[at + 1 :]))
                nodes.extend(inputs)
                add(sub.graph, sub)
                out = next(n for n in sub.graph.nodes if n.op == "output")
                results[node] = list(flat(list(out.args)))
            nodes.append(node)

    add(program.graph, program.graph_module)
    return nodes, bindings, results


def _links(
    b: AtenGraphBuilder, op_names: list[str], first: int, end: int, args: list[Any], out: Any
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
                    if isinstance(a, AtenValue)
                    and not a.constant
                    and not a.hidden
                    and b.root(a.tensor) == b.root(tid)  # type: ignore[arg-type]
                ),
                None,
            )
            if k is not None:
                a = args[k]
                found.append(Link(op_names[i], slot, k, b.shape(tid), b.shape(a.tensor), a.perm))
    if isinstance(out, AtenValue) and not out.constant and not out.hidden:
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


def _replicate(cx: _Context, tensors: list[AtenValue]) -> Any:
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
