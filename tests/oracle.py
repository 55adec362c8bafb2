"""Plain-Python references for the topology model (docs/conventions.md#topology-aware-cost), by
brute force.

``inter_node_groups`` enumerates the communication groups and the nodes directly instead of using
the closed form; ``collective_cost`` then applies the cost formulas of docs/core.md. Nothing here
imports ``taps``.
"""

from __future__ import annotations

from math import ceil, prod
from typing import Any

from sim import coords, dev_size, parts, shard_shape

COLLECTIVES = ("all_reduce", "all_gather", "all_to_all")


def group_dims(layout: Any, collective: str, device_dim: int | None) -> set[int]:
    """The device dims ``G`` a collective communicates along."""
    _, dm, tm = parts(layout)
    if collective == "all_reduce":
        assert device_dim is None
        return {k for k in range(len(dm)) if k not in tm}
    assert collective in ("all_gather", "all_to_all"), collective
    assert device_dim is not None and 0 <= device_dim < len(dm)
    return {device_dim}


def groups(dm: list[int], gdims: set[int]) -> dict[tuple[int, ...], list[int]]:
    """Ranks grouped by their coordinates outside ``gdims``."""
    out: dict[tuple[int, ...], list[int]] = {}
    for r in range(prod(dm)):
        c = coords(r, dm)
        key = tuple(c[k] for k in range(len(dm)) if k not in gdims)
        out.setdefault(key, []).append(r)
    return out


def inter_node_groups(
    layout: Any, collective: str, devices_per_node: int, device_dim: int | None = None
) -> int:
    """Brute-force ``ct``: max over nodes of the number of distinct-data groups crossing it."""
    _, dm, tm = parts(layout)
    n = prod(dm)
    L = devices_per_node
    gdims = group_dims(layout, collective, device_dim)
    if collective == "all_reduce":
        data_dims = [k for k in range(len(dm)) if k not in gdims]  # every group is distinct
    else:
        data_dims = sorted({m for m in tm if m >= 0} - gdims)
    grp = groups(dm, gdims)
    best = 0
    for start in range(0, n, L):
        distinct = set()
        for members in grp.values():
            inside = sum(1 for r in members if start <= r < start + L)
            if 0 < inside < len(members):
                c = coords(members[0], dm)
                distinct.add(tuple(c[k] for k in data_dims))
        best = max(best, len(distinct))
    return best


def members_in_node(layout: Any, gdims: set[int], devices_per_node: int) -> int:
    """``k``: how many members of a group share a node (the same for every group that touches a
    node, for power-of-two device matrices and nodes of consecutive ranks)."""
    _, dm, _ = parts(layout)
    L = devices_per_node
    sizes = set()
    for members in groups(dm, gdims).values():
        for start in range(0, prod(dm), L):
            inside = sum(1 for r in members if start <= r < start + L)
            if inside:
                sizes.add(inside)
    assert len(sizes) == 1, sizes
    return sizes.pop()


def volume_elements(layout: Any, collective: str, device_dim: int | None = None) -> float:
    """Per-device volume in elements (all_reduce ``2(g-1)/g*s`` rounded up to whole elements,
    all_gather ``(g-1)*s``, all_to_all ``(g-1)/g*s``)."""
    _, dm, _ = parts(layout)
    s = prod(shard_shape(layout))
    g = prod(dev_size(dm, k) for k in group_dims(layout, collective, device_dim))
    if collective == "all_reduce":
        return ceil(2 * (g - 1) * s / g)
    if collective == "all_gather":
        return (g - 1) * s
    return (g - 1) / g * s


def collective_cost(
    layout: Any,
    collective: str,
    *,
    devices_per_node: int,
    intra_bandwidth: float,
    inter_bandwidth: float,
    device_dim: int | None = None,
    dtype_bytes: int = 2,
    model: str = "topology",
) -> float:
    """Seconds under the topology model, or bytes under ``model="volume"``."""
    v = volume_elements(layout, collective, device_dim) * dtype_bytes
    if model == "volume":
        return v
    assert model == "topology", model
    ct = inter_node_groups(layout, collective, devices_per_node, device_dim)
    be = intra_bandwidth if ct == 0 else inter_bandwidth / ct
    cost = v / be
    if collective == "all_to_all":
        gdims = group_dims(layout, collective, device_dim)
        _, dm, _ = parts(layout)
        p = prod(dev_size(dm, k) for k in gdims)
        k = members_in_node(layout, gdims, devices_per_node)
        if p > k:
            cost *= k * (p - k) / (p - 1)
    return cost


def cluster_cost(cluster: Any, layout: Any, collective: str, **kw: Any) -> float:
    """:func:`collective_cost` with the bandwidths and node size read from a cluster object."""
    return collective_cost(
        layout,
        collective,
        devices_per_node=int(cluster.devices_per_node),
        intra_bandwidth=float(cluster.intra_bandwidth),
        inter_bandwidth=float(cluster.inter_bandwidth),
        **kw,
    )


def plan_cost(steps: list[Any], cluster: Any, dtype_bytes: int = 2, model: str = "topology"):
    """Total cost of a replayed plan (``sim.Replay.steps``); slices are free."""
    total = 0.0
    for st in steps:
        if st.op.kind == "slice":
            continue
        total += cluster_cost(
            cluster,
            st.layout,
            st.op.kind,
            device_dim=int(st.op.device_dim),
            dtype_bytes=dtype_bytes,
            model=model,
        )
    return total
