"""A plain-Python implementation of the cost functions of the core, the differential oracle of the
Rust kernels (tests/test_reference.py) and their speed baseline (benches/test_bench_kernel.py).

Written from docs/conventions.md and docs/core.md; nothing here imports ``taps``. A layout is a
plain ``(shape, device_matrix, tensor_map)`` triple and a cluster a ``(nodes, devices_per_node,
intra_bandwidth, inter_bandwidth)`` tuple.

Unification works on *segments*: a layout is a list of tensor dims, outermost first, each a
``(size, bits, origin)`` triple where ``bits`` is the half-open range ``[lo, hi)`` of the rank's
bits the dim is split along (or ``None``) and ``origin`` the dim of the input it came from. Two
refinements alternate until neither changes anything (docs/conventions.md#unification): every
device boundary cuts the split dims it falls inside (outer bits to the outer part), and every
flat-index boundary of either shape cuts the dim it falls inside (the split stays on the outer
part, or the device range is cut with it). A boundary with no such cut is a *blocker*: the views
are reshaped (docs/core.md: runs of unsplit dims merged, then the canonical form), and the planner
gives up a split as a last resort (the fallback prelude of all_gathers and the epilogue of free
slices).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

Triple = tuple[list[int], list[int], list[int]]
Segment = tuple[int, tuple[int, int] | None, int]


class UnifyError(ValueError):
    """No rewrite to one device matrix and one shape preserves both distributions."""


def log2(x: int) -> int:
    return x.bit_length() - 1


def triple(layout: Any) -> Triple:
    shape, dm, tm = layout
    return [int(s) for s in shape], [int(d) for d in dm], [int(m) for m in tm]


def dsize(dm: list[int], k: int) -> int:
    """``d_k``: device dim 0 is the last entry of the matrix."""
    return dm[len(dm) - 1 - k]


def bits_of(dm: list[int], k: int) -> tuple[int, int]:
    """The rank bits device dim ``k`` occupies (inner dims take the low bits)."""
    lo = sum(log2(dsize(dm, j)) for j in range(k))
    return lo, lo + log2(dsize(dm, k))


def shard_size(layout: Triple) -> int:
    shape, dm, tm = layout
    return prod(s // (dsize(dm, m) if m >= 0 else 1) for s, m in zip(shape, tm))


# --- unification ----------------------------------------------------------------------------


class Blocked(Exception):
    """A boundary of one side that no cut of the other side's dim ``dim`` can hold."""

    def __init__(self, first: bool, dim: int):
        super().__init__(first, dim)
        self.first = first
        self.dim = dim


def segments(layout: Triple) -> list[Segment]:
    shape, dm, tm = layout
    out: list[Segment] = []
    for i, (size, m) in enumerate(zip(shape, tm)):
        if size == 1:
            continue
        bits = bits_of(dm, m) if m >= 0 and dsize(dm, m) > 1 else None
        out.append((size, bits, i))
    return out


def used_bits(layout: Triple) -> set[int]:
    """Device boundaries of the dims the map uses; unused dims only replicate."""
    _, dm, tm = layout
    out: set[int] = set()
    for m in tm:
        if m >= 0 and dsize(dm, m) > 1:
            out.update(bits_of(dm, m))
    return out


def cut_devices(segs: list[Segment], bounds: set[int]) -> tuple[list[Segment], bool]:
    out: list[Segment] = []
    changed = False
    for size, bits, origin in segs:
        inside = sorted(b for b in bounds if bits and bits[0] < b < bits[1])
        if not inside:
            out.append((size, bits, origin))
            continue
        changed = True
        assert bits is not None
        edges = [bits[0], *inside, bits[1]]
        rest = size
        # Outermost bits first: each outer range takes exactly its own factor of the dim.
        for lo, hi in reversed(list(itertools.pairwise(edges))[1:]):
            out.append((1 << (hi - lo), (lo, hi), origin))
            rest //= 1 << (hi - lo)
        out.append((rest, (edges[0], edges[1]), origin))
    return out, changed


def flat_bounds(segs: list[Segment]) -> set[int]:
    """Where the dims start in the flat index: products of the sizes of the dims inside."""
    out: set[int] = set()
    inner = 1
    for size, _, _ in reversed(segs[1:]):
        inner *= size
        out.add(inner)
    return out


def cut_flat(
    segs: list[Segment], bounds: set[int], devices: set[int], first: bool
) -> tuple[list[Segment], bool]:
    """Cuts every dim at the flat boundaries inside it, innermost dim first."""
    out: list[Segment] = []
    changed = False
    inner = 1
    for size, bits, origin in reversed(segs):
        top = inner * size
        cuts = sorted(f for f in bounds if inner < f < top)
        if not cuts:
            out.append((size, bits, origin))
            inner = top
            continue
        changed = True
        g = 1 << (bits[1] - bits[0]) if bits else 1
        prev = inner
        for f in cuts:
            if f % prev or top % f:
                raise Blocked(first, origin)
            q = top // f  # the size of the part above f
            if bits and q % g:
                if g % q:
                    raise Blocked(first, origin)
                devices.add(bits[1] - log2(q))
            prev = f
        edges = [inner, *cuts, top]
        for lo_f, hi_f in itertools.pairwise(edges):
            seg_bits = None
            if bits and top // hi_f < g:
                lo_bit = bits[0] if top // lo_f >= g else bits[1] - log2(top // lo_f)
                seg_bits = (lo_bit, bits[1] - log2(top // hi_f))
            out.append((hi_f // lo_f, seg_bits, origin))
        inner = top
    out.reverse()
    return out, changed


def assemble(segs: list[Segment], devices: set[int]) -> Triple:
    edges = sorted(devices)
    dm = [1 << (hi - lo) for lo, hi in reversed(list(itertools.pairwise(edges)))]
    tm = [-1 if bits is None else edges.index(bits[0]) for _, bits, _ in segs]
    return [s for s, _, _ in segs], dm, tm


def try_unify(a: Triple, b: Triple) -> tuple[Triple, Triple]:
    """One unification of the two layouts as they are; raises :class:`Blocked`."""
    sa, sb = segments(a), segments(b)
    devices = {0, log2(prod(a[1]))} | used_bits(a) | used_bits(b)
    while True:
        sa, ca = cut_devices(sa, devices)
        sb, cb = cut_devices(sb, devices)
        bounds = flat_bounds(sa) | flat_bounds(sb)
        sa, fa = cut_flat(sa, bounds, devices, True)
        sb, fb = cut_flat(sb, bounds, devices, False)
        if not (ca or cb or fa or fb):
            return assemble(sa, devices), assemble(sb, devices)


def check_same_tensor(a: Triple, b: Triple) -> None:
    if prod(a[1]) != prod(b[1]) or prod(a[0]) != prod(b[0]):
        raise ValueError(f"{a} and {b} do not describe one tensor on one set of devices")


@dataclass
class View:
    """A layout seen through a reshape that moves nothing: ``groups`` of adjacent original dims
    merged (only unsplit ones), or the canonical form (each split dim cut into its split part and
    its local rest, runs of unsplit parts merged)."""

    layout: Triple
    groups: list[list[int]]
    canonical: bool = False

    @classmethod
    def of(cls, layout: Triple) -> View:
        return cls(layout, [[i] for i in range(len(layout[0]))])

    def split(self, i: int) -> bool:
        _, dm, tm = self.layout
        return tm[i] >= 0 and dsize(dm, tm[i]) > 1

    def dims(self) -> list[tuple[int, int, int | None]]:
        """Per view dim: size, map entry, the original dim whose split it carries."""
        shape, dm, tm = self.layout
        if not self.canonical:
            out = []
            for grp in self.groups:
                carried = grp[0] if len(grp) == 1 and self.split(grp[0]) else None
                size = prod(shape[i] for i in grp)
                out.append((size, -1 if carried is None else tm[carried], carried))
            return out
        dims: list[tuple[int, int, int | None]] = []
        for i, size in enumerate(shape):
            g = dsize(dm, tm[i]) if self.split(i) else 1
            if g > 1:
                dims.append((g, tm[i], i))
            local = size // g
            if local == 1:
                continue
            if dims and dims[-1][2] is None:
                dims[-1] = (dims[-1][0] * local, -1, None)
            else:
                dims.append((local, -1, None))
        return dims

    def view(self) -> Triple:
        dims = self.dims()
        return [d[0] for d in dims], list(self.layout[1]), [d[1] for d in dims]

    def split_dim(self, j: int) -> int | None:
        dims = self.dims()
        return dims[j][2] if 0 <= j < len(dims) else None

    def merge_around(self, j: int) -> bool:
        """Merges unsplit view dim ``j`` with an unsplit neighbour, the inner one first."""
        if self.canonical or self.split_dim(j) is not None:
            return False
        for left in (j, j - 1):
            if left >= 0 and left + 1 < len(self.groups):
                other = left + 1 if left == j else left
                if self.split_dim(other) is None:
                    self.groups[left : left + 2] = [self.groups[left] + self.groups[left + 1]]
                    return True
        return False

    def merge_all(self) -> bool:
        if self.canonical:
            return False
        merged: list[list[int]] = []
        unsplit: list[bool] = []
        for j, grp in enumerate(self.groups):
            free = self.split_dim(j) is None
            if merged and free and unsplit[-1]:
                merged[-1] = merged[-1] + grp
            else:
                merged.append(grp)
                unsplit.append(free)
        changed = len(merged) != len(self.groups)
        self.groups = merged
        return changed


def reshape_for(blocked: Blocked, a: View, b: View) -> bool:
    """The gentlest reshape that may lift the blocker; ``False`` when none is left."""
    this, other = (a, b) if blocked.first else (b, a)
    if this.merge_around(blocked.dim) or other.merge_all() or this.merge_all():
        return True
    changed = not (a.canonical and b.canonical)
    a.canonical = b.canonical = True
    return changed


def unify(a: Any, b: Any) -> tuple[Triple, Triple]:
    """docs/core.md ``unify``: raises :class:`UnifyError` when no reshape helps."""
    va, vb = View.of(triple(a)), View.of(triple(b))
    check_same_tensor(va.layout, vb.layout)
    while True:
        try:
            return try_unify(va.view(), vb.view())
        except Blocked as blocked:
            if not reshape_for(blocked, va, vb):
                raise UnifyError(f"cannot unify {a} with {b}") from None


# --- Algorithm 1 ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    kind: str  # "slice", "all_gather" or "all_to_all"
    device_dim: int
    tensor_dim: int
    to_tensor_dim: int | None
    layout: Triple  # before the op

    @property
    def volume(self) -> int:
        """Elements received per device (docs/conventions.md#redistribution)."""
        g = dsize(self.layout[1], self.device_dim)
        s = shard_size(self.layout)
        return {"slice": 0, "all_gather": (g - 1) * s, "all_to_all": (g - 1) * (s // g)}[self.kind]


def algorithm1(source: Triple, target: Triple) -> list[Op]:
    """docs/conventions.md#redistribution on unified layouts."""
    shape, dm, m = source[0], source[1], list(source[2])
    t = target[2]
    ops: list[Op] = []

    def emit(kind: str, k: int, i: int, to: int | None = None) -> None:
        ops.append(Op(kind, k, i, to, (shape, dm, list(m))))

    while True:
        progress = True
        while progress:
            progress = False
            for i in range(len(m)):  # slice everything sliceable
                if m[i] == -1 and t[i] != -1 and t[i] not in m:
                    emit("slice", t[i], i)
                    m[i] = t[i]
                    progress = True
            for i in range(len(m)):  # gather-then-slice on one device dim: all_to_all
                if m[i] == -1 and t[i] != -1 and t[i] in m:
                    j = m.index(t[i])
                    emit("all_to_all", t[i], j, i)
                    m[j], m[i] = -1, t[i]
                    progress = True
        wrong = [i for i in range(len(m)) if m[i] != -1 and m[i] != t[i]]
        if not wrong:
            return ops
        emit("all_gather", m[wrong[0]], wrong[0])
        m[wrong[0]] = -1


@dataclass
class Plan:
    source: Triple
    target: Triple
    prelude: list[Op]
    ops: list[Op]
    epilogue: list[Op]

    @property
    def all_ops(self) -> list[Op]:
        return self.prelude + self.ops + self.epilogue

    @property
    def volume(self) -> int:
        return sum(op.volume for op in self.all_ops)


def plan(a: Any, b: Any) -> Plan:
    """docs/core.md ``plan_redistribution``, with the gather fallback when unification fails."""
    src, tgt = View.of(triple(a)), View.of(triple(b))
    check_same_tensor(src.layout, tgt.layout)
    prelude: list[Op] = []
    relaxed: list[tuple[int, int]] = []
    while True:
        try:
            source, target = try_unify(src.view(), tgt.view())
            break
        except Blocked as blocked:
            if reshape_for(blocked, src, tgt):
                continue
            side = src if blocked.first else tgt
            j = blocked.dim
            # Give up the blocked dim's split or, if it has none, a neighbour's (inner first).
            dims = [d for d in (side.split_dim(x) for x in (j, j + 1, j - 1)) if d is not None]
            if not dims:
                raise UnifyError(f"no split to give up to unify {a} with {b}") from None
            shape, dm, tm = side.layout
            k = tm[dims[0]]
            side.layout = (shape, dm, [-1 if i == dims[0] else x for i, x in enumerate(tm)])
            if blocked.first:
                prelude.append(Op("all_gather", k, dims[0], None, (shape, dm, tm)))
            else:
                relaxed.append((dims[0], k))
    epilogue = []
    shape, dm, tm = tgt.layout
    for dim, k in reversed(relaxed):
        epilogue.append(Op("slice", k, dim, None, (shape, dm, tm)))
        tm = [k if i == dim else x for i, x in enumerate(tm)]
    return Plan(source, target, prelude, algorithm1(source, target), epilogue)


# --- topology (docs/conventions.md#topology-aware-cost) ------------------------------------


@dataclass(frozen=True)
class ClusterParams:
    nodes: int
    devices_per_node: int
    intra: float = 60e9
    inter: float = 6e9


def cluster_params(c: Any) -> ClusterParams:
    return c if isinstance(c, ClusterParams) else ClusterParams(*c)


def extents(dm: list[int], per_node: int) -> list[int]:
    """``e_k``: how many coordinates of device dim ``k`` a node of consecutive ranks holds."""
    out = []
    inner = 1
    for k in range(len(dm)):
        d = dsize(dm, k)
        out.append(min(d, max(1, per_node // inner)))
        inner *= d
    return out


def ct(layout: Triple, group: list[int], per_node: int) -> int:
    """Groups with distinct data that leave one node at once (0: the group stays inside)."""
    _, dm, tm = layout
    e = extents(dm, per_node)
    if all(e[k] == dsize(dm, k) for k in group):
        return 0
    return prod(e[k] for k in range(len(dm)) if k in tm and k not in group)


def seconds(layout: Triple, kind: str, group: list[int], nbytes: float, c: ClusterParams) -> float:
    if nbytes == 0:
        return 0.0
    n = ct(layout, group, c.devices_per_node)
    if n == 0:
        return nbytes / c.intra
    factor = 1.0
    if kind == "all_to_all":
        # Only the k(p-k) of the p(p-1) peer transfers that leave the node use the slow link.
        dm = layout[1]
        p = float(prod(dsize(dm, k) for k in group))
        e = extents(dm, c.devices_per_node)
        k = float(prod(e[j] for j in group))
        factor = k * (p - k) / (p - 1.0)
    return factor * nbytes / (c.inter / n)


def op_cost(op: Op, c: ClusterParams, dtype_bytes: float, model: str) -> float:
    if op.kind == "slice":
        return 0.0
    nbytes = op.volume * dtype_bytes
    if model == "volume":
        return nbytes
    return seconds(op.layout, op.kind, [op.device_dim], nbytes, c)


def plan_cost(p: Plan, c: Any, dtype_bytes: float = 2, model: str = "topology") -> float:
    params = cluster_params(c)
    total = 0.0
    for op in p.all_ops:
        total += op_cost(op, params, dtype_bytes, model)
    return total


def redistribution_costs(
    sources: list[Any], targets: list[Any], cluster: Any, dtype_bytes: float = 2, model="topology"
) -> np.ndarray:
    """The ``len(sources) x len(targets)`` matrix of plan costs (docs/core.md "Batch costs")."""
    out = np.zeros((len(sources), len(targets)))
    for i, a in enumerate(sources):
        for j, b in enumerate(targets):
            out[i, j] = plan_cost(plan(a, b), cluster, dtype_bytes, model)
    return out


# --- intra-operator all_reduce (docs/conventions.md) --------------------------------------


def strategy_layout(
    degrees: list[int],
    device_map: list[int],
    axes: list[int],
    shape: list[int],
    device_matrix: list[int] | None = None,
    per_replica: bool = False,
):
    """The layout a strategy gives a tensor whose dims are the strategy axes ``axes`` (-1: whole):
    by default one device dim per split axis, sized by its degree, ordered by the device map;
    dims of an explicit ``device_matrix`` that no axis takes hold replicas. ``per_replica`` puts
    a leading dim per replica dim (outermost first), split along it."""
    if device_matrix is None:
        h = sum(d > 1 for d in degrees)
        dm = [1] * h
        for d, m in zip(degrees, device_map):
            if m >= 0:
                dm[h - 1 - m] = d
    else:
        dm = list(device_matrix)
    tm = [device_map[a] if a >= 0 else -1 for a in axes]
    if per_replica:
        spare = [k for k in reversed(range(len(dm))) if k not in device_map]
        return [dsize(dm, k) for k in spare] + list(shape), dm, spare + tm
    return list(shape), dm, tm


def allreduce_cost(layout: Triple, c: Any, dtype_bytes: float, model: str) -> float:
    """An all_reduce of partial sums over the device dims the map does not use."""
    _, dm, tm = layout
    group = [k for k in range(len(dm)) if k not in tm]
    g = prod(dsize(dm, k) for k in group)
    # A ring's 2 (g-1)/g of the shard, in whole elements.
    nbytes = -(-2 * (g - 1) * shard_size(layout) // g) * dtype_bytes
    if model == "volume":
        return nbytes
    return seconds(layout, "all_reduce", group, nbytes, cluster_params(c))


def allreduce_costs(
    degrees: list[list[int]],
    device_maps: list[list[int]],
    tensors: list[tuple[Any, ...]],
    cluster: Any,
    model: str = "topology",
    device_matrices: list[list[int]] | None = None,
) -> np.ndarray:
    """Per strategy, the summed all_reduce cost of the tensors (strategy axes, shape, dtype), each
    replica reducing on its own (the per-replica layout)."""
    out = np.zeros(len(degrees))
    for s, (deg, dmap) in enumerate(zip(degrees, device_maps)):
        matrix = None if device_matrices is None else list(device_matrices[s])
        total = 0.0
        for axes, shape, dtype_bytes in tensors:
            layout = strategy_layout(list(deg), list(dmap), axes, shape, matrix, per_replica=True)
            total += allreduce_cost(layout, cluster, dtype_bytes, model)
        out[s] = total
    return out
