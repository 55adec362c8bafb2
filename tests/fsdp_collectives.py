"""taps' predicted collectives of a plan by kind, group size and the whole tensor's bytes: what
the FSDP tests compare with the collectives torch's ``fully_shard`` and XLA's partitioner issue."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection

import taps


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
