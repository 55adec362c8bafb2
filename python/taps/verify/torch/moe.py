"""Mixture-of-experts blocks on the torch engine: a block's routed part (its top-k, sort, histogram,
index, grouped matmuls, scatter: docs/moe.md) is no fx node of the plan, so the replay runs the
GShard form's operators the front end made of it instead, on each rank's blocks in taps' layouts
(their edges, partial sums and gradients as :meth:`taps.export.distribute._Interpreter.local_input`
takes any operator's), and the dense reference of the numbers computes the same operators on
whole tensors.

The routing is fixed, as on XLA (:func:`taps.verify.xla.operators.balanced_routing`): the
combine's weights are the router's scores at the balanced routing's slots, the same in every
token group, so the all_to_alls move what taps prices whatever the router's values; the dispatch
gathers the tokens where the weights are not zero and takes no gradient there (an index
dispatch), the router's gradient flows through the combine's weights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from taps.errors import VerifyError
from taps.export.distribute import Blocks, DistributedModule, Exported, packet_name
from taps.export.experts import stacked_parameters
from taps.frontends.gshard import GLU_KINDS, fused_pair
from taps.frontends.torch.moe import MoeBlock, find_blocks
from taps.frontends.torch.program import Link
from taps.graph import MOE_COMBINE, MOE_DISPATCH, MOE_ROUTE, Graph, Operator
from taps.verify.torch.values import import_torch
from taps.verify.xla.operators import balanced_routing


@dataclass
class _Block:
    """A block of the program with the graph operators made of its routed part (route first,
    the combine and the adds of shared experts last) and, during a run, the values of the nodes
    its routed part reads from outside, kept as they pass (the interpreter frees a value after
    its last reader)."""

    block: MoeBlock
    ops: list[Operator]
    seen: dict[Any, Any] = field(default_factory=dict)
    output: Any = None


def blocks_of(exported: Exported) -> list[_Block]:
    """The mixture-of-experts blocks of an exported module with their operators (the ``k``-th
    block's from the graph's ``k``-th ``moe_route``)."""
    graph = exported.conversion.graph
    found = find_blocks(exported.program, lambda n: packet_name(n.target))
    ops = graph.ops
    routes = [i for i, op in enumerate(ops) if op.kind == MOE_ROUTE]
    if len(routes) != len(found):
        raise VerifyError(
            f"the program has {len(found)} mixture-of-experts blocks, its graph {len(routes)}"
        )
    out = []
    for block, start in zip(found, routes):
        end = start + 1
        while end < len(ops) and ops[end].kind != MOE_COMBINE:
            end += 1
        made = ops[end].output.tensor
        end += 1
        while end < len(ops) and ops[end].kind == "add" and ops[end].inputs[0].tensor == made:
            made = ops[end].output.tensor
            end += 1
        out.append(_Block(block, ops[start:end]))
    return out


def _origin(exported: Exported) -> Callable[[Any], str | None]:
    """The graph tensor a node's value holds: the output of the operator its node (or the node
    it views or casts, back to one that made an operator) made, or the input its placeholder
    is."""
    made = {
        name: next(link.op for link in links if link.slot is None)
        for name, links in exported.conversion.links.items()
        if any(link.slot is None for link in links)
    }
    graph = exported.conversion.graph

    def origin(node: Any) -> str | None:
        at = node
        while True:
            if at.name in made:
                return graph.op(made[at.name]).output.tensor
            if at.op == "placeholder":
                return str(at.name)
            inputs = at.all_input_nodes
            if not inputs:  # a constant made in the program
                return None
            at = inputs[0]

    return origin


def _letters(ops: Sequence[Sequence[str]]) -> dict[str, str]:
    names = dict.fromkeys(d for dims in ops for d in dims)
    return {d: chr(ord("a") + i) for i, d in enumerate(names)}


def _aligned(x: Any, dims: Sequence[str], out: Sequence[str]) -> Any:
    return x.permute([list(dims).index(d) for d in out])


def compute(op: Operator, xs: list[Any]) -> Any:
    """What operator ``op`` of a block computes on ``xs`` (one tensor per input slot in its
    operand's dims, whole or a rank's block of them): the routing tensor from the scores at the
    balanced routing's slots, the dispatch by the routing's mask, the gated activations, adds,
    and every other operator (the experts, the combine) as the einsum of its labels."""
    torch = import_torch()
    out = op.output.dims
    if op.kind == MOE_ROUTE:
        if len(xs) != 1:
            raise VerifyError(f"operator {op.name!r}: the replay routes one score tensor")
        s, e, c = (op.axis_size(d) for d in out[1:])
        scores = _aligned(xs[0], op.inputs[0].dims, [d for d in out if d in op.inputs[0].dims])
        if tuple(scores.shape[1:]) != (s, e):
            raise VerifyError(f"operator {op.name!r}: the replay routes whole groups only")
        mask = torch.tensor(balanced_routing(s, e, c), dtype=scores.dtype, device=scores.device)
        return scores[..., None] * mask[None]
    if op.kind == MOE_DISPATCH:
        xs = [(xs[0] != 0).to(xs[1].dtype), *xs[1:]]
    if op.kind in GLU_KINDS.values():
        act = next(a for a, kind in GLU_KINDS.items() if kind == op.kind)
        if len(xs) == 2:
            gate, up = (_aligned(x, o.dims, out) for x, o in zip(xs, op.inputs))
        else:
            pair, rest = fused_pair(op)
            gate, up = (_aligned(xs[0].select(pair, i), rest, out) for i in (0, 1))
        return getattr(torch.nn.functional, act)(gate) * up
    if op.kind in GLU_KINDS:  # an expert's activation without a gate
        return getattr(torch.nn.functional, op.kind)(_aligned(xs[0], op.inputs[0].dims, out))
    if op.kind == "add":
        a, b = (_aligned(x, o.dims, out) for x, o in zip(xs, op.inputs))
        return a + b
    ins = [o for o in op.inputs if not o.addend]
    letters = _letters([*(o.dims for o in ins), out])
    spec = ",".join("".join(letters[d] for d in o.dims) for o in ins)
    return torch.einsum(f"{spec}->{''.join(letters[d] for d in out)}", *xs[: len(ins)])


def addend(op: Operator, slot: int, x: Any) -> Any:
    """Input ``slot`` of ``op``, an addend (an expert's bias), broadcast against its output."""
    dims, out = op.inputs[slot].dims, op.output.dims
    kept = [d for d in out if d in dims]
    x = _aligned(x, dims, kept)
    return x.reshape([x.shape[kept.index(d)] if d in dims else 1 for d in out])


def addends(op: Operator) -> list[int]:
    """The slots of ``op``'s addends."""
    return [i for i, o in enumerate(op.inputs) if o.addend]


def _zeros(node: Any, like: Any) -> Any:
    """A value for a routed node read outside the block but not its output (a load-balancing
    counter, the chosen experts): zeros of its shape, as the front end takes it (a constant)."""
    torch = import_torch()
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return [_zeros_of(v, like) for v in val]
    return _zeros_of(val, like) if isinstance(val, torch.Tensor) else val


def _zeros_of(val: Any, like: Any) -> Any:
    return like.new_zeros(tuple(val.shape), dtype=val.dtype)


class _Runner:
    """What a run does at a block's routed nodes: keeps what they read from outside, and at the
    first of the block's outputs computes its operators (``run``) and hands the outputs out."""

    def __init__(self, exported: Exported, run: Callable[[_Block, dict[str, Any]], Any]) -> None:
        self.blocks = blocks_of(exported)
        self.origin = _origin(exported)
        self.run = run
        self.of = {n.name: b for b in self.blocks for n in b.block.routed}

    def __call__(self, env: dict[Any, Any], node: Any) -> Any:
        b = self.of[node.name]
        if node is b.block.routed[0]:  # a new run
            b.seen, b.output = {}, None
        routed = set(b.block.routed)
        for a in node.all_input_nodes:
            if a not in routed and a in env:
                b.seen[a] = env[a]
        if node not in b.block.outputs:
            return None
        if b.output is None:
            origins = {a: self.origin(a) for a in b.seen}
            b.output = self.run(b, {t: b.seen[a] for a, t in origins.items() if t is not None})
            b.seen = {}
        if node is b.block.outputs[0]:
            return b.output
        return _zeros(node, self.like(b.output))

    @staticmethod
    def like(x: Any) -> Any:
        return x.local if isinstance(x, Blocks) else x


def install(dist: DistributedModule, exported: Exported) -> DistributedModule:
    """``dist`` (the training-step replay of ``exported``) running its mixture-of-experts blocks
    as their GShard operators on each rank's blocks (module doc); unchanged without blocks."""
    if not has_blocks(dist.graph):
        return dist
    replay = dist.replay
    if replay is None or not replay.training:
        raise VerifyError(
            "mixture-of-experts blocks are replayed on torch in the training step only"
        )
    graph = dist.graph

    def run(block: _Block, values: dict[str, Any]) -> Any:
        interp = state["interp"]
        made: dict[str, Blocks] = {}
        for op in block.ops:
            xs = []
            for slot, o in enumerate(op.inputs):
                root = graph.root(o.tensor)
                if root.producer is not None and root.name in made:
                    x: Any = made[root.name]
                elif root.kind == "parameter":
                    x = dist.parameters[root.name]
                elif root.name in values:
                    x = values[root.name]
                else:
                    raise VerifyError(
                        f"operator {op.name!r} reads {root.name!r}, which the block's routed "
                        "part does not read"
                    )
                shape = graph.tensors[o.tensor].shape
                link = Link(op.name, slot, 0, shape, root.shape, tuple(range(len(root.shape))))
                interp.unit = []
                local = interp.local_input(x, link)
                if interp.unit:
                    raise VerifyError(
                        f"operator {op.name!r}: sharded storage (fsdp) of experts is not replayed"
                    )
                xs.append(local.reshape(replay.layouts.inputs[op.name][slot].shard_shape))
            flowing = op.name in replay.flowing
            layout = (
                replay.layouts.plan.candidates[op.name].partial_output
                if flowing
                else replay.layouts.outputs[op.name]
            )
            out = graph.tensors[op.output.tensor].shape
            with dist.tracer.scope("op", op.name, None):
                result = replay.steps.sum(compute(op, xs), replay.partial[op.name])
                for slot in addends(op):  # a bias, once over the flowing partial sums
                    b = addend(op, slot, xs[slot])
                    result = replay.steps.add_once(result, b, replay.flowing.get(op.name, ()))
                made[op.output.tensor] = interp.made(
                    result, layout, Link(op.name, None, 0, out, out, tuple(range(len(out))))
                )
        last = made[block.ops[-1].output.tensor]
        shape = tuple(int(d) for d in block.block.outputs[0].meta["val"].shape)
        return Blocks(last.local, last.layout, shape, tuple(range(len(shape))), dist)

    runner = _Runner(exported, run)
    state: dict[str, Any] = {}

    def node(interp: Any, n: Any) -> Any:
        state["interp"] = interp
        return runner(interp.interpreter.env, n)

    dist.nodes.update({name: node for name in runner.of})
    return dist


def dense_run(exported: Exported, module: Any, inputs: Sequence[Any]) -> list[Any]:
    """The outputs of ``module`` (whose export is ``exported``) on ``inputs``, run as its program
    with each mixture-of-experts block's routed part computed as the GShard operators on whole
    tensors (the dense reference of a replay, module doc); gradients reach ``module``'s
    parameters and the inputs as in ``module(*inputs)``."""
    torch = import_torch()
    program, graph = exported.program, exported.conversion.graph
    own = dict(module.named_parameters())
    params = stacked_parameters(own, graph)

    def run(block: _Block, values: dict[str, Any]) -> Any:
        made: dict[str, Any] = {}
        for op in block.ops:
            xs = []
            for o in op.inputs:
                root = graph.root(o.tensor)
                if root.name in made:
                    whole = made[root.name]
                else:
                    whole = params[root.name] if root.kind == "parameter" else values[root.name]
                xs.append(whole.reshape(graph.tensors[o.tensor].shape))
            made[op.output.tensor] = compute(op, xs)
            for slot in addends(op):
                made[op.output.tensor] = made[op.output.tensor] + addend(op, slot, xs[slot])
        shape = tuple(int(d) for d in block.block.outputs[0].meta["val"].shape)
        return made[block.ops[-1].output.tensor].reshape(shape)

    runner = _Runner(exported, run)

    class Dense(torch.fx.Interpreter):  # type: ignore[misc,name-defined]
        def run_node(self, n: Any) -> Any:
            if n.name in runner.of:
                return runner(self.env, n)
            return super().run_node(n)

    args = []
    users = iter(inputs)
    for spec in program.graph_signature.input_specs:
        target = str(spec.target)
        if spec.kind.name == "PARAMETER":
            args.append(own[exported.conversion.aliases.get(target, target)])
        elif spec.kind.name == "USER_INPUT":
            args.append(next(users))
        elif target in program.state_dict:
            args.append(program.state_dict[target])
        else:
            args.append(program.constants[target])
    out = Dense(program.graph_module).run(*args, enable_io_processing=False)
    return list(out)


def has_blocks(graph: Graph) -> bool:
    """Whether ``graph`` has mixture-of-experts blocks (the replay runs them here)."""
    return any(op.kind == MOE_ROUTE for op in graph.ops)
