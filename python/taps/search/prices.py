"""What a strategy costs inside its operator: the intra-operator collectives (the all_reduces of
partial sums and gradients), and the memory it needs per device. The layouts come from
:mod:`taps.plan.candidates`; this module only prices them (docs/conventions.md:
"Intra-operator communication" and "Topology-aware cost")."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np

from taps._core import Cluster, Layout, Strategy
from taps.graph import SHARE, Graph, Operand, Operator
from taps.plan.candidates import Candidate, operand_axis_indices, operand_shape, split_dims
from taps.plan.pricing import Pricing

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel
    from taps.plan.pricing import Step


def partial_flows(graph: Graph, step: Step = "training") -> frozenset[str]:
    """The operators whose output partial sums flow to their consumer (training step): those with
    a partitionable contracted axis whose output has exactly one consumer (one graph edge). The
    edge then plans from the partial layout (a reduce_scatter where the consumer splits the
    tensor, an all_reduce where it does not). An output with no consumer, or with several, is
    all_reduced once at its operator, as in the paper."""
    if step != "training":
        return frozenset()
    uses = Counter(e.tensor for e in graph.edges)
    return frozenset(
        op.name
        for op in graph.ops
        if set(op.contracted) & set(op.partitionable) and uses[op.output.tensor] == 1
    )


#: What a parameter-reading operator's collectives are for (:attr:`Collective.reason`): the
#: forward's all_reduce of partial sums, a gradient's reduction, and under sharded storage (FSDP)
#: the parameter's all_gathers before the forward and before the backward.
FORWARD_GATHER = "forward gather"
BACKWARD_GATHER = "backward gather"
GATHERS = (FORWARD_GATHER, BACKWARD_GATHER)


@dataclass(frozen=True)
class Collective:
    """One intra-operator collective over the device dims the tensor's map does not use: an
    all_reduce of partial sums, or of a parameter's gradient; under sharded storage (FSDP) a
    parameter's all_gather (forward and backward) and its gradient's reduce_scatter. Each replica
    of a replicated operator reduces on its own: the layout stacks the replicas' copies along
    leading dims split over the replica dims, so those dims are outside the group."""

    tensor: str
    reason: str  # "forward partial sum", "gradient", FORWARD_GATHER or BACKWARD_GATHER
    layout: Layout
    dtype_bytes: int
    kind: Literal["all_reduce", "all_gather", "reduce_scatter"] = "all_reduce"
    #: A parameter's gradient under ZeRO (``zero=True``): a reduce_scatter over the group and an
    #: all_gather of the updated shards, the all_reduce's bytes over its group, priced as it.
    zero: bool = False
    #: A parameter's gradient, or its gathers under FSDP: on the communication stream, the
    #: gradient reduced in the gradient dtype, in buckets alongside the backward
    #: (docs/search.md#the-step-time).
    parameter: bool = False

    def cost(self, cluster: Cluster, cost_model: CostModel = "topology") -> float:
        """Seconds (or bytes) on ``cluster``. A ring all_reduce is a reduce_scatter followed by
        an all_gather over the same group, each half its ring steps and bytes, so the topology
        model prices either of them over the group as half that all_reduce (exactly what
        ``collective_cost`` gives the kind along one device dim; the group may span several)."""
        whole = cluster.collective_cost(
            self.layout, "all_reduce", None, self.dtype_bytes, cost_model
        )
        return whole if self.kind == "all_reduce" else whole / 2


def _replicated(layout: Layout) -> bool:
    """Whether some device dim is unused by the map (so an all_reduce over it is needed)."""
    return len(layout.device_matrix) > sum(m >= 0 for m in layout.tensor_map)


def reduced_operands(
    graph: Graph, op: Operator, step: Step = "forward", flowing: bool = False
) -> list[tuple[Operand, str, tuple[str, ...]]]:
    """The operands of ``op`` whose shard can be a partial sum that the operator all_reduces, in
    order, each with the partitionable axes it lacks that the reduction does not run over:

    - the output, if a contracted axis can be split and its partial sums do not flow to the
      consumer (``flowing``, :func:`partial_flows`);
    - every input that needs a gradient; in the training step only those no operator produces
      (parameters and graph inputs: an activation's gradient goes back on its edge), and an
      addend's gradient is summed over the output axes it lacks only (the others are kept apart);
      none of a ``share`` operator (its uses reduce the shared parameter's gradient).

    Each needs an all_reduce over the device dims its per-replica layout leaves unused, but for
    the axes kept apart (the replicas of a replicated operator see the same output gradient, so
    they compute the same input gradients: nothing is partial over the replica dims); for the
    output that is exactly when a contracted axis is split."""
    out: list[tuple[Operand, str, tuple[str, ...]]] = []
    if set(op.contracted) & set(op.partitionable) and not flowing:
        out.append((op.output, "forward partial sum", ()))
    for slot, o in enumerate(op.inputs):
        # A shared parameter's gradient is reduced by its uses (on their edges in the training
        # step, at them in the paper's model), which hand it back summed.
        if not graph.takes_gradient(op, slot) or op.kind == SHARE:
            continue
        apart: tuple[str, ...] = ()
        if step == "training":
            if graph.root(o.tensor).producer is not None:
                continue
            summed = op.gradient_axes(o)
            apart = tuple(a for a in op.partitionable if a not in o.dims and a not in summed)
        out.append((o, "gradient", apart))
    return out


def _reduction_axes(
    op: Operator, operand: Operand, apart: Sequence[str], degrees: Sequence[int]
) -> tuple[list[int], list[int]]:
    """The strategy axes and shape of ``operand``'s all_reduce layout under a strategy of
    ``degrees`` (:func:`_reduction_layout`): the axes kept ``apart`` as leading dims of their
    degree."""
    idx = [op.partitionable.index(a) for a in apart]
    return (
        [*idx, *operand_axis_indices(op, operand)],
        [*(degrees[i] for i in idx), *operand_shape(op, operand)],
    )


def _reduction_layout(
    op: Operator, operand: Operand, strategy: Strategy, apart: Sequence[str]
) -> Layout:
    """The per-replica layout of ``operand`` whose unused device dims are the group of its
    all_reduce: the axes kept ``apart`` stacked as leading dims of their degree, so that their
    device dims split something and stay outside the group (each of their coordinates runs its
    own all_reduce), as the replica dims do."""
    return strategy.tensor_layout(
        *_reduction_axes(op, operand, apart, strategy.degrees), per_replica=True
    )


def is_parameter_gradient(graph: Graph, reduced: tuple[Operand, str, tuple[str, ...]]) -> bool:
    """Whether one of :func:`reduced_operands` is a parameter's gradient (of a view of one too)."""
    operand, reason, _ = reduced
    return reason == "gradient" and graph.root(operand.tensor).kind == "parameter"


def reduced_dtype_bytes(
    graph: Graph,
    reduced: tuple[Operand, str, tuple[str, ...]],
    gradient_bytes: int | None = None,
) -> int:
    """Bytes per element one of :func:`reduced_operands` is reduced in: a parameter's gradient in
    ``gradient_bytes`` (None: the parameter's dtype), everything else in its own dtype."""
    if gradient_bytes is not None and is_parameter_gradient(graph, reduced):
        return gradient_bytes
    return graph.tensors[reduced[0].tensor].dtype_bytes


def collective_of(
    graph: Graph,
    op: Operator,
    strategy: Strategy,
    reduced: tuple[Operand, str, tuple[str, ...]],
    zero: bool = False,
    gradient_bytes: int | None = None,
) -> Collective | None:
    """The all_reduce of one of :func:`reduced_operands` under ``strategy``, or None if its
    layout leaves no device dim of the group unused; a parameter's gradient is reduced in
    ``gradient_bytes`` (None: the parameter's dtype)."""
    operand, reason, apart = reduced
    layout = _reduction_layout(op, operand, strategy, apart)
    if not _replicated(layout):
        return None
    t = graph.tensors[operand.tensor]
    param = is_parameter_gradient(graph, reduced)
    dtype = reduced_dtype_bytes(graph, reduced, gradient_bytes)
    return Collective(t.name, reason, layout, dtype, zero=zero and param, parameter=param)


def sharded_storage(collective: Collective, weight_bytes: int) -> list[Collective]:
    """A parameter's gradient all_reduce under sharded storage (FSDP2's ``fully_shard`` with its
    default ``reshard_after_forward=True``, ZeRO-3): the parameter, stored as ``1/g`` of it on
    each of the ``g`` devices of the reduction's group, is all-gathered in ``weight_bytes`` per
    element before the forward and again before the backward (the forward's gathered copy is
    freed), and the gradient is reduce-scattered instead of all-reduced."""
    gather = replace(collective, dtype_bytes=weight_bytes, kind="all_gather", zero=False)
    return [
        replace(gather, reason=FORWARD_GATHER),
        replace(gather, reason=BACKWARD_GATHER),
        replace(collective, kind="reduce_scatter", zero=False),
    ]


def intra_collectives(
    graph: Graph,
    op: Operator,
    candidate: Candidate,
    step: Step = "forward",
    flowing: bool = False,
    zero: bool = False,
    gradient_bytes: int | None = None,
    sharded: bool = False,
    parameter_bytes: int | None = None,
) -> list[Collective]:
    """The all_reduces a candidate of ``op`` needs (:func:`reduced_operands`), one per
    operand whose layout leaves a device dim of its group unused; with ``zero``, a parameter's
    gradient is marked as ZeRO's reduce_scatter and all_gather; with ``sharded`` (FSDP), it is
    :func:`sharded_storage`'s gathers of the weight (in ``parameter_bytes``, None: its dtype) and
    reduce_scatter. Parameters' gradients are reduced in ``gradient_bytes`` (None: their own
    dtype)."""
    found = (
        collective_of(graph, op, candidate.strategy, r, zero, gradient_bytes)
        for r in reduced_operands(graph, op, step, flowing)
    )
    out: list[Collective] = []
    for c in found:
        if c is None:
            continue
        if sharded and c.parameter:
            out += sharded_storage(c, parameter_bytes or graph.tensors[c.tensor].dtype_bytes)
        else:
            out.append(c)
    return out


def all_reduce_operands(
    graph: Graph,
    op: Operator,
    step: Step = "forward",
    flowing: bool = False,
    gradient_bytes: int | None = None,
    parameters: bool | None = None,
) -> list[tuple[list[int], list[int], float]]:
    """The operands of :func:`reduced_operands` that keep no axis apart, as
    ``(strategy axes, shape, dtype bytes)`` for the Rust kernel ``allreduce_costs``, which prices
    an all_reduce over no device dim at 0 (in the per-replica layout, as
    :func:`intra_collectives`). ``parameters`` keeps only parameters' gradients (True) or only the
    rest (False); parameters' gradients are reduced in ``gradient_bytes``."""
    return [
        (
            operand_axis_indices(op, r[0]),
            operand_shape(op, r[0]),
            float(reduced_dtype_bytes(graph, r, gradient_bytes)),
        )
        for r in reduced_operands(graph, op, step, flowing)
        if not r[2] and parameters in (None, is_parameter_gradient(graph, r))
    ]


def apart_operands(
    graph: Graph,
    op: Operator,
    degrees: Sequence[int],
    step: Step = "forward",
    flowing: bool = False,
    gradient_bytes: int | None = None,
    parameters: bool | None = None,
) -> list[tuple[list[int], list[int], float]]:
    """The operands of :func:`reduced_operands` that keep axes apart, as
    :func:`all_reduce_operands` gives the others, for the strategies of ``degrees`` (one per
    partitionable axis; only those of the axes kept apart are read): their layouts' leading dims
    have those axes' degrees, so the kernel prices together only strategies that agree on
    them."""
    return [
        (
            *_reduction_axes(op, r[0], r[2], degrees),
            float(reduced_dtype_bytes(graph, r, gradient_bytes)),
        )
        for r in reduced_operands(graph, op, step, flowing)
        if r[2] and parameters in (None, is_parameter_gradient(graph, r))
    ]


def copies_of(graph: Graph) -> dict[str, int]:
    """How many times each operator runs in the model: ``graph.layers`` times the instances of
    its tie (:attr:`taps.Graph.tied`), or ``graph.layers`` for an operator in no tie."""
    out = dict.fromkeys((op.name for op in graph.ops), graph.layers)
    for group in graph.tied:
        for inst in group:
            for name in inst:
                out[name] = graph.layers * len(group)
    return out


def memory(
    graph: Graph,
    op: Operator,
    candidate: Candidate,
    pricing: Pricing = Pricing(),
    kept: float = 1.0,
    sharded: bool = False,
    copies: int = 1,
) -> float:
    """Bytes per device for one layer of ``op``: its parameter shards with their gradients,
    master copies and optimizer state (:meth:`Pricing.parameter_memory`), and what its backward
    keeps of its output shard (:func:`saved_bytes`), ``kept`` of it (activation checkpointing,
    :class:`taps.search.checkpointing.Checkpointing`). A device of a replicated strategy holds its
    replica's whole blocks: the layouts' replica dims split nothing. With ``pricing.zero``, all
    of a parameter's bytes but its weight are divided among the ``g`` devices its gradient is
    reduced over (ZeRO: gradient, master copy and optimizer state sharded). With ``sharded``
    (FSDP), the weight of a parameter that needs a gradient is divided so too, and the weight
    gathered to compute with is held only while the operator runs: at most the running
    operator's and the prefetched one's, so at most twice the largest. It is charged as twice its
    gathered weight spread over the operator's ``copies`` in the model (:func:`copies_of`), whose
    sum bounds that from above."""
    total = 0.0
    for operand, layout in zip(op.inputs, candidate.inputs):
        if graph.root(operand.tensor).kind == "parameter":  # a view of one too
            weight, rest = pricing.parameter_memory(graph.tensors[operand.tensor].dtype_bytes)
            if not graph.tensors[operand.tensor].requires_grad:
                rest = 0.0  # frozen: no gradient, master copy or optimizer state
            shard = math.prod(layout.shard_shape)
            if pricing.zero or sharded:
                dims = split_dims(op, candidate.strategy, op.gradient_axes(operand))
                g = float(np.prod([layout.device_dim_size(k) for k in dims]))
                rest /= g
                if sharded and g > 1 and graph.tensors[operand.tensor].requires_grad:
                    total += 2 * shard * weight / copies
                    weight /= g
            total += shard * (weight + rest)
    if op.kind == SHARE:  # its output is the parameter it holds, counted above, not saved
        return total
    out = saved_bytes(op, candidate.output, graph.tensors[op.output.tensor].dtype_bytes)
    return total + kept * out


def memories(
    graph: Graph,
    op: Operator,
    degrees: np.ndarray,
    pricing: Pricing = Pricing(),
    kept: float = 1.0,
    sharded: bool = False,
    copies: int = 1,
) -> np.ndarray:
    """:func:`memory` of every candidate of ``op`` at once, to the bit: ``degrees`` holds the
    degrees of each candidate's strategy (one row per candidate), which give every shard's
    shape. The search's tables price hundreds of candidates per operator this way."""
    total = np.zeros(len(degrees))

    def shard_of(operand: Operand, dims: slice = slice(None)) -> np.ndarray:
        """Elements per device of ``operand`` (of its dims ``dims``), per candidate."""
        shard = np.ones(len(degrees), dtype=np.int64)
        for i, size in list(zip(operand_axis_indices(op, operand), operand_shape(op, operand)))[
            dims
        ]:
            shard *= size // degrees[:, i] if i >= 0 else size
        return shard

    for operand in op.inputs:
        if graph.root(operand.tensor).kind != "parameter":
            continue
        tensor = graph.tensors[operand.tensor]
        weight, rest = pricing.parameter_memory(tensor.dtype_bytes)
        if not tensor.requires_grad:
            rest = 0.0
        shard = shard_of(operand).astype(np.float64)
        if pricing.zero or sharded:
            summed = op.gradient_axes(operand)
            axes = [i for i, a in enumerate(op.partitionable) if a in summed]
            g = np.prod(degrees[:, axes], axis=1).astype(np.float64)
            rests = rest / g
            if sharded and tensor.requires_grad:
                gathered = g > 1
                total += np.where(gathered, 2.0 * shard * weight / copies, 0.0)
                total += shard * (np.where(gathered, weight / g, weight) + rests)
                continue
            total += shard * (weight + rests)
        else:
            total += shard * (weight + rest)
    if op.kind == SHARE:
        return total
    if op.saved == "none":
        saved = np.zeros(len(degrees))
    elif op.saved == "rows":
        saved = _times(shard_of(op.output, slice(-1)), ROW_BYTES)
    else:
        saved = _times(shard_of(op.output), graph.tensors[op.output.tensor].dtype_bytes)
    return total + kept * saved


def _times(counts: np.ndarray, factor: int) -> np.ndarray:
    """``float(count * factor)`` of every entry, the product in Python's integers (it may not
    fit 64 bits): once per distinct count."""
    values, inverse = np.unique(counts, return_inverse=True)
    return np.array([float(int(v) * factor) for v in values])[inverse]


#: Bytes of the per-row statistic an operator that keeps ``"rows"`` saves (fp32 logsumexp).
ROW_BYTES = 4


def saved_bytes(op: Operator, output: Layout, dtype_bytes: int) -> float:
    """Bytes per device the backward keeps of ``op``'s output in layout ``output``
    (:attr:`taps.graph.Operator.saved`): its shard, one fp32 number per row of it (all dims but
    the last), or nothing."""
    shard = output.shard_shape
    if op.saved == "none":
        return 0.0
    if op.saved == "rows":
        return float(math.prod(shard[:-1]) * ROW_BYTES)
    return float(math.prod(shard) * dtype_bytes)
