"""Mixture-of-experts blocks of an exported program, found by their module structure and made
the GShard form's operators (docs/moe.md).

A block is the innermost module around a ``topk`` whose subgraph also reads the experts' weights:
parameters of rank 3 stacked by expert, or per-expert weights (an ``nn.ModuleList`` of expert
MLPs: one parameter per expert whose keys differ in the expert's index alone), which the graph
holds stacked under one name with ``*`` for the index (:func:`expert_keys`). Its *routed part*
is every node of the block that depends on a ``topk`` or on the experts' weights: the sort,
histogram, index and scatter of the dispatch, the grouped matmuls (or batched matmuls) of the
experts (or the per-expert linears), the combine. Whatever the
implementation writes there is replaced by the GShard form's operators
(:mod:`taps.frontends.gshard`), with ``g`` token groups (the batch's sequences), ``s`` tokens
per group, ``e`` experts, ``c`` slots per expert and group, ``m`` the model's width; the
other token-sized tensors the routed part adds (shared experts) are added to its combine.

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
from taps.frontends.gshard import GLU_KINDS, Experts, gshard
from taps.frontends.torch.builder import AtenGraphBuilder, AtenValue, constant


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
        experts: the experts' stacked weights in order of use, ``(name, fx nodes)``: a stacked
            parameter's ``state_dict`` key and its node, or per-expert weights' stacked name
            (``experts.*.w1.weight``, :func:`expert_keys`) and their nodes in expert order.
        biases: per weight, its experts' stacked bias in the same form (a parameter ``(e, out)``
            the routed part reads, named as the weight with a suffix: GPT-OSS's
            ``gate_up_proj_bias``; per expert, the bias of the weight's linear), or ``None``.
        activation: the ATen activation of the experts (``silu``, ``gelu``, ``relu``).
        num_experts, top_k: from the router's top-k.
    """

    path: str
    router: str
    routed: tuple[Any, ...]
    last: str
    outputs: tuple[Any, ...]
    tokens: Any
    experts: tuple[tuple[str, tuple[Any, ...]], ...]
    biases: tuple[tuple[str, tuple[Any, ...]] | None, ...]
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
    _check_static(nodes)
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


def _check_static(nodes: list[Any]) -> None:
    """Refuse, in one line, a program with a shape that depends on the data: a loop over
    experts that picks each one's tokens (``torch.where``, ``nonzero``) exports so, and taps
    reads static shapes only."""
    for n in nodes:
        val = n.meta.get("val")
        shape = getattr(val, "shape", ())
        if any(not isinstance(d, int) for d in shape):
            where = _stack(n)[-1] if _stack(n) else "the top-level module"
            raise GraphError(
                f"node {n.name} in {where} has a shape that depends on the data "
                f"({[str(d) for d in shape]}): taps reads static shapes; write the experts as "
                "stacked weights (an nn.Parameter [experts, out, in] read by grouped_mm, bmm "
                "or einsum) rather than a loop picking each expert's tokens"
            )


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
    read = {a for n in members for a in n.all_input_nodes if a.name in params}

    def first_use(nodes: tuple[Any, ...]) -> int:
        return min(order[u] for u in nodes[0].users if u in inside)

    stacks = [
        (params[a.name], (a,)) for a in read if len(_shape(a)) == 3 and _shape(a)[0] == experts
    ]
    singles = _per_expert(read, params, experts)
    if not stacks:
        stacks = [(k, ns) for k, ns in singles.items() if len(_shape(ns[0])) == 2]
    weights = sorted(stacks, key=lambda w: first_use(w[1]))
    if not weights:
        return None
    weight_nodes = {a for _, ns in weights for a in ns}
    routed: set[Any] = set()
    for n in members:  # graph order: a node is routed when it reads a routed node
        if n in choices or any(a in routed or a in weight_nodes for a in n.all_input_nodes):
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
    # The tokens' copies the experts read (transformers' batched_mm repeats each token k times):
    # made of the tokens alone and read by the routed part alone, they are the dispatch's.
    alone = {tokens[0]}
    for n in members:
        if n not in routed and all(a in alone or a.op == "get_attr" for a in n.all_input_nodes):
            alone.add(n)
    for n in reversed(members):
        if n in alone and n.users and all(u in routed for u in n.users):
            routed.add(n)
    outputs = [n for n in members if n in routed and any(u not in routed for u in n.users)]
    width = _shape(tokens[0])[-1]
    numel = math.prod(_shape(tokens[0]))
    token_sized = [n for n in outputs if math.prod(_shape(n)) == numel and _shape(n)[-1] == width]
    if not token_sized:
        raise GraphError(f"the mixture-of-experts block {path} has no output of its tokens' size")
    out = token_sized[-1]
    biases: list[tuple[str, tuple[Any, ...]] | None] = []
    for key, nodes in weights:
        if len(nodes) > 1:  # per expert: the bias of the weight's own linear
            bias = f"{key.rsplit('.', 1)[0]}.bias"
            biases.append((bias, singles[bias]) if bias in singles else None)
            continue
        # A stacked bias's key extends its weight's, as GPT-OSS names them.
        named = [
            a
            for n in members
            if n in routed
            for a in n.all_input_nodes
            if a.name in params
            and len(_shape(a)) == 2
            and _shape(a)[0] == experts
            and params[a.name].startswith(key)
        ]
        bias = min(named, key=lambda a: len(params[a.name]), default=None)
        biases.append(None if bias is None else (params[bias.name], (bias,)))
    activations = [name_of(n) for n in routed if name_of(n) in GLU_KINDS]
    return MoeBlock(
        path,
        _stack(choice)[-1],
        tuple(sorted(routed, key=order.__getitem__)),
        max(routed, key=order.__getitem__).name,
        (out, *(n for n in outputs if n is not out)),
        tokens[0],
        tuple(weights),
        tuple(biases),
        activations[0] if activations else "silu",
        experts,
        int(choice.args[1]),
    )


def _per_expert(read: set[Any], params: dict[str, str], experts: int) -> dict[str, tuple]:
    """Per-expert weights among the parameter nodes ``read``: by stacked name (the key with
    ``*`` for the one part that is the expert's index), the nodes of experts ``0 .. e-1``, one
    shape for all (what a ``ModuleList`` of ``e`` expert MLPs holds)."""
    groups: dict[str, dict[int, Any]] = {}
    for a in read:
        parts = params[a.name].split(".")
        for j, part in enumerate(parts):
            if part.isdigit() and int(part) < experts:
                name = ".".join([*parts[:j], "*", *parts[j + 1 :]])
                groups.setdefault(name, {})[int(part)] = a
    return {
        name: tuple(nodes[i] for i in range(experts))
        for name, nodes in sorted(groups.items())
        if len(nodes) == experts and len({_shape(a) for a in nodes.values()}) == 1
    }


def expert_keys(name: str, count: int) -> list[str] | None:
    """The ``state_dict`` keys of the per-expert weights the graph holds stacked as ``name``
    (``experts.*.w1.weight``: one ``*`` part, the expert's index), or ``None`` for a name of
    one parameter."""
    parts = name.split(".")
    if parts.count("*") != 1:
        return None
    j = parts.index("*")
    return [".".join([*parts[:j], str(i), *parts[j + 1 :]]) for i in range(count)]


def per_expert_parameters(blocks: list[MoeBlock]) -> dict[str, tuple[str, int]]:
    """Per placeholder of a per-expert weight (or bias) of ``blocks``: the stacked name the
    graph holds it under and the experts' count."""
    out: dict[str, tuple[str, int]] = {}
    for block in blocks:
        for got in (*block.experts, *block.biases):
            if got is not None and len(got[1]) > 1:
                out.update((n.name, (got[0], len(got[1]))) for n in got[1])
    return out


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
    experts = block.num_experts
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
    routed = Experts(
        block.path,
        block.router,
        tuple((key.rsplit(".", 1)[0], env[nodes[0]]) for key, nodes in block.experts),
        block.activation,
        experts,
        block.top_k,
        math.ceil(block.top_k * seq / experts),
        out_first=True,
        biases=tuple(None if a is None else env[a[1][0]] for a in block.biases),
    )
    gse = [b.reshape(v, (groups, seq, experts), block.router, "scores") for v in scores.values()]
    shared = [b.reshape(v, (groups, seq, width), block.path, "shared") for v in extras.values()]
    score_bytes = gse[0].dtype_bytes if gse else x.dtype_bytes
    out = gshard(b, routed, tokens, gse, shared, x.dtype_bytes, score_bytes)
    first, *others = block.outputs
    env[first] = b.reshape(out, _shape(first), block.path, "routed")
    for node in others:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        made = [constant(tuple(int(d) for d in t.shape), 4) for t in vals if hasattr(t, "shape")]
        env[node] = made if isinstance(val, (list, tuple)) else (made[0] if made else None)
