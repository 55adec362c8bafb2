"""What the FSDP tests share: taps' predicted collectives of a plan by kind, group size and the
whole tensor's bytes (compared with what torch's ``fully_shard`` and XLA's partitioner issue), the
operators both tensor-split and storage-sharded, and a verification's rows of sharded storage."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable

import taps
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
