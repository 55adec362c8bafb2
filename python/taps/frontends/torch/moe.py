"""Mixture-of-experts blocks of an exported program, found by their module structure and made
the GShard form's operators (docs/moe.md).

A block is the innermost module around a ``topk`` whose subgraph also reads the experts' weights
(parameters of rank 3 stacked by expert). Its *routed part* is every node of the block that
depends on a ``topk`` or on the experts' weights: the sort, histogram, index and scatter of the
dispatch, the grouped matmuls (or batched matmuls) of the experts, the combine. Whatever the
implementation writes there is replaced, with ``g`` token groups (the batch's sequences), ``s``
tokens per group, ``e`` experts, ``c`` slots per expert and group, ``m`` the model's width and
``h`` the experts' hidden width, by:

- ``moe_route`` ``gse -> gsec``: the combine weights from the router's scores (top-k and the
  model's normalisation); the dispatch mask is where they are not zero;
- ``moe_dispatch`` ``gsec,gsm -> egcm``: each expert's tokens gathered;
- ``moe_expert`` ``egcm,efm -> egcf`` (gate and up), the gated activation (``swiglu`` ...),
  ``moe_expert`` ``egch,emh -> egcm`` (down);
- ``moe_combine`` ``gsec,egcm -> gsm``: the experts' outputs weighted back to their tokens;
- an ``add`` per other token-sized tensor the routed part adds (shared experts).

The router, its softmax or sigmoid and the shared experts are the block's other nodes and
convert by the ordinary rules. Routing is taken as balanced: ``c = ceil(k * s / e)`` (a
capacity factor of 1, what a model that drops no token holds on average).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taps._core import GraphError
from taps.frontends.torch.builder import AtenGraphBuilder, AtenValue, constant
from taps.graph import MOE_COMBINE, MOE_DISPATCH, MOE_EXPERT, MOE_ROUTE

#: The gated activation operator made for the experts' activation, by the ATen activation.
GLU_KINDS = {"silu": "swiglu", "gelu": "geglu", "relu": "reglu"}


@dataclass(frozen=True)
class MoeBlock:
    """A mixture-of-experts block of an exported program.

    Attributes:
        path: the block's module path.
        router: the module path of the top-k (the router).
        routed: the fx nodes replaced by the GShard operators, in graph order.
        last: the routed node (last in graph order) at which the operators are made.
        outputs: routed nodes read outside the routed part; the first is the block's output.
        tokens: the fx node of the block's input (the tokens).
        experts: the experts' stacked weights in order of use: ``(state_dict key, fx node)``.
        activation: the ATen activation of the experts (``silu``, ``gelu``, ``relu``).
        num_experts, top_k: from the router's top-k.
    """

    path: str
    router: str
    routed: tuple[Any, ...]
    last: str
    outputs: tuple[Any, ...]
    tokens: Any
    experts: tuple[tuple[str, Any], ...]
    activation: str
    num_experts: int
    top_k: int


def _stack(node: Any) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    return [str(path) for path, _ in stack.values()]


def _shape(node: Any) -> tuple[int, ...]:
    val = node.meta.get("val")
    return tuple(int(d) for d in val.shape) if hasattr(val, "shape") else ()


def find_blocks(program: Any, name_of: Callable[[Any], str]) -> list[MoeBlock]:
    """The mixture-of-experts blocks of ``program`` (an ``ExportedProgram``), in graph order;
    ``name_of`` gives an fx node's ATen operator name without overload."""
    nodes = list(program.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    params = {
        spec.arg.name: str(spec.target)
        for spec in program.graph_signature.input_specs
        if spec.kind.name == "PARAMETER"
    }
    held = {
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind.name in ("BUFFER", "CONSTANT_TENSOR", "PARAMETER")
    }
    topks = [n for n in nodes if n.op == "call_function" and name_of(n) == "topk"]
    within: dict[str, list[Any]] = {}  # module path -> the nodes of its subgraph, in order
    if topks:
        for n in nodes:
            if n.op == "call_function":
                for path in dict.fromkeys(_stack(n)):
                    within.setdefault(path, []).append(n)
    found: list[MoeBlock] = []
    done: set[Any] = set()
    for topk in topks:
        if topk in done:
            continue
        for path in reversed(_stack(topk)):
            members = within.get(path, [])
            block = _block(path, members, topk, params, held, order, name_of)
            if block is not None:
                found.append(block)
                done.update(n for n in members if name_of(n) == "topk")
                break
    return found


def _block(
    path: str,
    members: list[Any],
    topk: Any,
    params: dict[str, str],
    held: set[str],
    order: dict[Any, int],
    name_of: Callable[[Any], str],
) -> MoeBlock | None:
    inside = set(members)
    choices = [n for n in members if name_of(n) == "topk"]
    widths = {n: _shape(n.args[0])[-1] for n in choices}
    experts = max(widths.values())
    choice = next(n for n in choices if widths[n] == experts)
    weights = sorted(
        {
            a
            for n in members
            for a in n.all_input_nodes
            if a.name in params and len(_shape(a)) == 3 and _shape(a)[0] == experts
        },
        key=lambda a: min(order[u] for u in a.users if u in inside),
    )
    if not weights:
        return None
    routed: set[Any] = set()
    for n in members:  # graph order: a node is routed when it reads a routed node
        if n in choices or any(a in routed or a in weights for a in n.all_input_nodes):
            routed.add(n)
    outside = [
        a
        for n in members
        for a in n.all_input_nodes
        if a not in inside and a.op != "get_attr" and not (a.op == "placeholder" and a.name in held)
    ]
    tokens = list(dict.fromkeys(outside))
    if len(tokens) != 1:
        raise GraphError(
            f"the mixture-of-experts block {path} reads {len(tokens)} activations from outside "
            f"({', '.join(t.name for t in tokens)}; one, its tokens, expected)"
        )
    outputs = [n for n in members if n in routed and any(u not in routed for u in n.users)]
    width = _shape(tokens[0])[-1]
    numel = math.prod(_shape(tokens[0]))
    token_sized = [n for n in outputs if math.prod(_shape(n)) == numel and _shape(n)[-1] == width]
    if not token_sized:
        raise GraphError(f"the mixture-of-experts block {path} has no output of its tokens' size")
    out = token_sized[-1]
    activations = [name_of(n) for n in routed if name_of(n) in GLU_KINDS]
    return MoeBlock(
        path,
        _stack(choice)[-1],
        tuple(sorted(routed, key=order.__getitem__)),
        max(routed, key=order.__getitem__).name,
        (out, *(n for n in outputs if n is not out)),
        tokens[0],
        tuple((params[w.name], w) for w in weights),
        activations[0] if activations else "silu",
        experts,
        int(choice.args[1]),
    )


def _labels(shape: tuple[int, ...], width: int, other: str, into: str) -> list[str]:
    """Labels of a stacked expert weight: ``e`` its first dim, ``m`` the model's width,
    ``other`` the remaining one. When both are the model's width, the weight is taken as
    ``(expert, out, in)`` (``F.linear``'s order, as transformers and torchtitan store them);
    ``into`` is the label of its output (``m`` for the down projection)."""
    rest = list(shape[1:])
    if rest.count(width) == 2:
        return ["e", into, "m" if into != "m" else other]
    if rest.count(width) != 1:
        raise GraphError(
            f"expert weight of shape {list(shape)}: none of its dims is the model width {width}"
        )
    return ["e", *("m" if d == width else other for d in rest)]


def emit(
    block: MoeBlock, b: AtenGraphBuilder, env: dict[Any, Any], read: Callable[[Any], Any]
) -> None:
    """Make ``block``'s GShard operators from the converted values in ``env`` and set ``env``
    for the routed nodes read outside (the block's output; constants for the rest, such as
    load-balancing counters). ``read(node)`` is the converted value of a node that is not
    routed."""
    x = env[block.tokens]
    *lead, width = x.shape
    groups = lead[0] if len(lead) == 2 else 1
    seq = math.prod(lead) // groups
    experts, k = block.num_experts, block.top_k
    capacity = math.ceil(k * seq / experts)
    tokens = b.reshape(x, (groups, seq, width), block.path, "tokens")
    token_root = b.root(tokens.tensor)  # type: ignore[arg-type]
    scores: dict[int, AtenValue] = {}
    extras: dict[int, AtenValue] = {}
    for node in block.routed:
        for a in node.all_input_nodes:
            if a in block.routed:
                continue
            v = read(a)
            if not isinstance(v, AtenValue) or v.tensor is None:
                continue
            root = b.root(v.tensor)
            if b.tensors[root].kind == "parameter":
                continue
            size = math.prod(b.shape(root))
            if root == token_root:
                continue
            if size == groups * seq * experts:
                scores.setdefault(root, v)
            elif size == groups * seq * width:
                extras.setdefault(root, v)
            else:
                raise GraphError(
                    f"the mixture-of-experts block {block.path}: its routed part reads "
                    f"{a.name} of shape {list(v.shape)}, neither its scores nor its tokens"
                )
    if not scores:
        raise GraphError(f"the mixture-of-experts block {block.path} has no router scores")
    gse = [
        (b.reshape(v, (groups, seq, experts), block.router, "scores"), ("g", "s", "e"))
        for v in scores.values()
    ]
    route = b.op(
        MOE_ROUTE,
        block.router,
        gse,
        (groups, seq, experts, capacity),
        ("g", "s", "e", "c"),
        gse[0][0].dtype_bytes,
        partitionable="g",
        saved="none",
    )
    dtype = x.dtype_bytes
    h = b.op(
        MOE_DISPATCH,
        block.path,
        [(route, "gsec"), (tokens, "gsm")],
        (experts, groups, capacity, width),
        "egcm",
        dtype,
        partitionable="ge",
    )
    h = _experts(block, b, env, h, width, dtype)
    out = b.op(
        MOE_COMBINE,
        block.path,
        [(route, "gsec"), (h, "egcm")],
        (groups, seq, width),
        "gsm",
        dtype,
        partitionable="ge",
    )
    for v in extras.values():
        extra = b.reshape(v, (groups, seq, width), block.path, "shared")
        out = b.op("add", block.path, [(out, "gsm"), (extra, "gsm")], out.shape, "gsm", dtype)
    first, *others = block.outputs
    env[first] = b.reshape(out, _shape(first), block.path, "routed")
    for node in others:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        made = [constant(tuple(int(d) for d in t.shape), 4) for t in vals if hasattr(t, "shape")]
        env[node] = made if isinstance(val, (list, tuple)) else (made[0] if made else None)


def _experts(
    block: MoeBlock,
    b: AtenGraphBuilder,
    env: dict[Any, Any],
    h: AtenValue,
    width: int,
    dtype: int,
) -> AtenValue:
    """The experts' MLP on the dispatched tokens ``h`` (``egcm``): gate and up (one fused
    weight or two), the activation, down."""
    weights = [(key, env[node]) for key, node in block.experts]
    if len(weights) not in (2, 3):
        raise GraphError(
            f"the mixture-of-experts block {block.path} has {len(weights)} stacked expert "
            "weights (2 or 3 expected: up or gate and up, then down)"
        )
    e, g, c, _ = h.shape
    *ins, (down_key, down) = weights

    def project(key: str, w: AtenValue, x: AtenValue, x_labels: str, out: str) -> AtenValue:
        labels = _labels(w.shape, width, out if x_labels[-1] == "m" else "h", out)
        size = next(d for d, lab in zip(w.shape, labels) if lab == out) if out != "m" else width
        path = key.rsplit(".", 1)[0]
        # Tensor parallelism inside the experts as Megatron-LM's MLP: gate and up split by
        # their outputs, down by its inputs; the capacity and the model width stay whole.
        return b.op(
            MOE_EXPERT,
            path,
            [(x, x_labels), (w, labels)],
            (e, g, c, size),
            f"egc{out}",
            dtype,
            partitionable=("e", "g", "h" if out == "m" else out),
        )

    act = block.activation
    inner = next((d for d in down.shape[1:] if d != width), width)
    if len(ins) == 2:  # gate and up apart (torchtitan's w1 and w3)
        (gk, gw), (uk, uw) = ins
        gate, up = project(gk, gw, h, "egcm", "h"), project(uk, uw, h, "egcm", "h")
        hidden = b.op(
            GLU_KINDS[act],
            block.path,
            [(gate, "egch"), (up, "egch")],
            gate.shape,
            "egch",
            dtype,
            partitionable="egh",
        )
    else:
        key, w = ins[0]
        fused = project(key, w, h, "egcm", "f")
        if fused.shape[-1] == 2 * inner:  # gate and up in one weight, gate first
            pair = b.reshape(fused, (e, g, c, 2, inner), block.path, "gate_up")
            hidden = b.op(
                GLU_KINDS[act],
                block.path,
                [(pair, "egcth")],
                (e, g, c, inner),
                "egch",
                dtype,
                partitionable="egh",
            )
        else:  # no gate: up, the activation
            hidden = b.op(
                act, block.path, [(fused, "egch")], fused.shape, "egch", dtype, partitionable="egh"
            )
    return project(down_key, down, hidden, "egch", "m")
