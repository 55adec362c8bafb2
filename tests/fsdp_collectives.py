"""What the FSDP tests share: taps' predicted collectives of a plan by kind, group size and the
whole tensor's bytes (compared with what torch's ``fully_shard`` and XLA's partitioner issue), the
operators both tensor-split and storage-sharded, and a verification's rows of sharded storage."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable

import taps
from taps.plan.candidates import Candidate, strategies_for
from taps.plan.layouts import layouts_of
from taps.search.prices import BACKWARD_GATHER, FORWARD_GATHER
from taps.verify import CollectiveCheck

GATHERS = (FORWARD_GATHER, BACKWARD_GATHER)


def predicted(plan: taps.Plan, kinds: Collection[str] | None = None) -> Counter:
    """Every operator collective of ``taps.breakdown(plan)`` (only ``kinds``, if given) as
    ``(kind, group size, bytes of the whole tensor in the collective's dtype)``."""
    return Counter(
        (
            c.kind,
            math.prod(
                c.layout.device_dim_size(k)
                for k in range(len(c.layout.device_matrix))
                if k not in c.layout.tensor_map
            ),
            math.prod(c.layout.shard_shape) * c.dtype_bytes,
        )
        for r in taps.breakdown(plan)
        for c, _ in r.collectives
        if kinds is None or c.kind in kinds
    )


def tensor_split(plan: taps.Plan) -> list[str]:
    """The operators that store a parameter sharded and also split it (tensor parallelism)."""
    layouts = layouts_of(plan)
    return [
        op.name
        for op in plan.graph.ops
        if plan.pricing.shards(op.name)
        and any(
            m >= 0
            for o, lay in zip(op.inputs, layouts.inputs[op.name])
            if plan.graph.root(o.tensor).kind == "parameter"
            for m in lay.tensor_map
        )
    ]


def fsdp_rows(rows: Iterable[CollectiveCheck]) -> Counter:
    """A verification's rows of sharded storage (gathers and gradient reduce_scatters) by
    status, kind and phase."""
    return Counter(
        (c.status, c.kind, c.phase)
        for c in rows
        if c.what.startswith(GATHERS) or (c.kind, c.what[:8]) == ("reduce_scatter", "gradient")
    )


def stored_rows(n: int) -> dict:
    """The rows :func:`fsdp_rows` holds when ``n`` parameters are stored sharded, all matched."""
    return {
        ("ok", "all_gather", "forward"): n,
        ("ok", "all_gather", "backward"): n,
        ("ok", "reduce_scatter", "backward"): n,
    }


#: Megatron's column-split (input replicated, output features split) and row-split (input
#: features split, output summed) projections of a transformers Llama.
_COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROWS = ("o_proj", "down_proj")


def megatron_plan(graph: taps.Graph, cluster: taps.Cluster) -> taps.Plan:
    """Llama on a 2 x 2 cluster as torch users split it (2-D: FSDP x tensor parallelism): the
    batch over device dim 1 (data parallel) everywhere; over device dim 0, the column-split
    projections' output features and the row-split ones' input features, the attention heads
    and the MLP's hidden features, everything else replicated there (so ``replicas``
    strategies); every parameter stored sharded over device dim 1."""
    chosen = {}
    for op in graph.ops:
        leaf = op.name.rpartition(".")[2]
        for s in strategies_for(graph, op.name, cluster, replicas=True):
            cand = Candidate.of(op, s)
            out = cand.output
            if list(out.device_matrix) != [2, 2]:
                continue
            want = [1] + [-1] * (len(out.shape) - 1)
            for i, size in enumerate(out.shape[1:], 1):  # heads, or the MLP's hidden features
                if (len(out.shape), size) in ((4, 4), (2, 128)):
                    want[i] = 0
            weight, partial = None, []
            if op.kind == "linear" and leaf in _COLUMNS:
                want, weight = [1, 0], [0, -1]
            elif op.kind == "linear" and leaf in _ROWS:
                want, weight, partial = [1, -1], [-1, 0], [0]
            if list(out.tensor_map) != want:
                continue
            if weight is not None and list(cand.inputs[1].tensor_map) != weight:
                continue
            made = cand.partial_output.partial if cand.partial_output is not None else []
            if list(made) == partial:
                chosen[op.name] = s
                break
    return taps.Plan(graph, cluster, chosen, taps.Pricing(fsdp=True))


def edge_collectives(plan: taps.Plan) -> Counter:
    """The collectives of ``taps.breakdown(plan)``'s edges (forward and backward
    redistributions) as ``(kind, group size, bytes)``, 4 bytes an element."""
    return Counter(
        (c.kind, c.group_size, c.volume * 4)
        for r in taps.breakdown(plan)
        for i in r.incoming
        for plan_ in (i.redistribution, i.backward)
        if plan_ is not None
        for c in plan_.all_ops
    )
