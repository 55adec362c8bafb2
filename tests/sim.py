"""A replay simulator for layouts and redistribution plans, written from first principles.

A rank's shard of a layout is an ndarray of the local shape whose values are the GLOBAL flat
(row-major) indices of the elements it holds, so element identity is checkable after any sequence
of collectives. Nothing here imports ``taps``: layouts are read through their ``shape``,
``device_matrix`` and ``tensor_map`` attributes, or given as plain ``(shape, dm, map)`` tuples, and
ops through ``kind``, ``device_dim``, ``tensor_dim`` and ``to_tensor_dim``.

Partial sums: a layout whose device dims ``partial`` hold partial sums gives each rank an
*addend* of its block (:func:`values`): pseudo-random integers for all but the last coordinate of
the partial group, the remainder for the last, so that the addends sum to the flat indices.
Reduce-scatters and all-reduces sum them, and every other op moves them with the indices.

Conventions (docs/conventions.md#layouts): the device matrix is listed outermost first, so device
dim ``k`` has size ``dm[len(dm) - 1 - k]``; rank ``r`` has coordinates ``c_0 = r mod d_0``,
``c_1 = (r // d_0) mod d_1``, ...; a tensor dim split along device dim ``m`` holds block ``c_m`` of
``d_m`` equal blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

Parts = tuple[list[int], list[int], list[int]]
Layout4 = tuple[list[int], list[int], list[int], list[int]]


def parts(layout: Any) -> Parts:
    """``(shape, device_matrix, tensor_map)`` of a layout object or tuple, as lists of ints."""
    if isinstance(layout, tuple | list):
        shape, dm, tm = layout
    else:
        shape, dm, tm = layout.shape, layout.device_matrix, layout.tensor_map
    return [int(x) for x in shape], [int(x) for x in dm], [int(x) for x in tm]


def partial_of(layout: Any) -> list[int]:
    """The device dims of a layout object (``partial``) or 4-tuple holding partial sums."""
    if isinstance(layout, tuple | list):
        return sorted(int(k) for k in layout[3]) if len(layout) > 3 else []
    return sorted(int(k) for k in getattr(layout, "partial", []))


def dev_size(dm: list[int], k: int) -> int:
    """Size ``d_k`` of device dim ``k`` (0 = innermost, i.e. the LAST entry of ``dm``)."""
    assert 0 <= k < len(dm), (dm, k)
    return dm[len(dm) - 1 - k]


def coords(rank: int, dm: list[int]) -> list[int]:
    """Coordinates ``[c_0, c_1, ...]`` of ``rank`` (index ``k`` = device dim ``k``)."""
    out = []
    r = rank
    for k in range(len(dm)):
        d = dev_size(dm, k)
        out.append(r % d)
        r //= d
    return out


def rank_of(c: list[int], dm: list[int]) -> int:
    """Inverse of :func:`coords`."""
    r = 0
    stride = 1
    for k in range(len(dm)):
        r += c[k] * stride
        stride *= dev_size(dm, k)
    return r


def num_devices(dm: list[int]) -> int:
    return prod(dm)


def shard_shape(layout: Any) -> list[int]:
    shape, dm, tm = parts(layout)
    return [s if m < 0 else s // dev_size(dm, m) for s, m in zip(shape, tm, strict=True)]


def check_layout(layout: Any) -> None:
    """Assert that a layout is well formed (so the simulator never silently computes nonsense)."""
    shape, dm, tm = parts(layout)
    assert len(shape) == len(tm), (shape, tm)
    used = [m for m in tm if m >= 0]
    assert len(used) == len(set(used)), tm
    for s, m in zip(shape, tm, strict=True):
        assert s >= 1, shape
        assert -1 <= m < len(dm), (tm, dm)
        if m >= 0:
            assert s % dev_size(dm, m) == 0, (shape, dm, tm)
    for d in dm:
        assert d >= 1 and d & (d - 1) == 0, dm


def shard_slices(layout: Any, rank: int) -> list[tuple[int, int]]:
    """Per tensor dim, the half-open global range ``rank`` holds."""
    shape, dm, tm = parts(layout)
    c = coords(rank, dm)
    out = []
    for s, m in zip(shape, tm, strict=True):
        if m < 0:
            out.append((0, s))
        else:
            b = s // dev_size(dm, m)
            out.append((c[m] * b, (c[m] + 1) * b))
    return out


def shards(layout: Any) -> list[np.ndarray]:
    """Every rank's shard of ``layout``: global flat indices, in the local (row-major) shape."""
    check_layout(layout)
    shape, dm, _ = parts(layout)
    full = np.arange(prod(shape), dtype=np.int64).reshape(shape)
    out = []
    for r in range(num_devices(dm)):
        idx = tuple(slice(a, b) for a, b in shard_slices(layout, r))
        out.append(full[idx].copy())
    return out


def _addend(x: np.ndarray, q: int) -> np.ndarray:
    """The pseudo-random addend of partial coordinate ``q`` (not the last) of elements ``x``."""
    return (x * 7919 + q * 104729 + 13) % 1009 - 504


def values(layout: Any) -> list[np.ndarray]:
    """Every rank's values of ``layout``: the flat indices, or addends of them along the partial
    dims (the partial coordinate counts the partial dims innermost first)."""
    _, dm, _ = parts(layout)
    partial = partial_of(layout)
    group = prod(dev_size(dm, k) for k in partial)
    out = []
    for r, idx in enumerate(shards(layout)):
        c = coords(r, dm)
        q, stride = 0, 1
        for k in partial:
            q += c[k] * stride
            stride *= dev_size(dm, k)
        if q < group - 1:
            out.append(_addend(idx, q))
        else:
            out.append(idx - sum((_addend(idx, p) for p in range(group - 1)), np.zeros_like(idx)))
    return out


def element_sets(arrays: list[np.ndarray]) -> list[frozenset[int]]:
    return [frozenset(int(x) for x in a.ravel()) for a in arrays]


@dataclass(frozen=True)
class SimOp:
    """A stand-in for ``taps.CommOp`` (only the fields the simulator reads)."""

    kind: str
    device_dim: int
    tensor_dim: int
    to_tensor_dim: int | None = None
    permutation: list[int] | None = None


def _group(rank: int, k: int, dm: list[int]) -> list[int]:
    """The members of ``rank``'s group along device dim ``k``, in order of coordinate ``k``."""
    c = coords(rank, dm)
    members = []
    for t in range(dev_size(dm, k)):
        cc = list(c)
        cc[k] = t
        members.append(rank_of(cc, dm))
    return members


def replay(
    op: Any, arrays: list[np.ndarray], device_matrix: list[int]
) -> tuple[list[np.ndarray], list[int]]:
    """Apply one op to every rank's local array.

    Returns the new arrays and, per rank, the number of elements it received from OTHER ranks
    (counted from the data actually moved, not from a formula).
    """
    dm = [int(x) for x in device_matrix]
    n = num_devices(dm)
    assert len(arrays) == n, (len(arrays), dm)
    kind = op.kind
    k = int(op.device_dim)
    i = -1 if op.tensor_dim is None else int(op.tensor_dim)
    g = dev_size(dm, k)
    new: list[np.ndarray] = []
    received = [0] * n
    if kind == "slice":
        for r in range(n):
            a = arrays[r]
            assert a.shape[i] % g == 0, ("slice does not divide", a.shape, i, g)
            b = a.shape[i] // g
            c = coords(r, dm)[k]
            idx = [slice(None)] * a.ndim
            idx[i] = slice(c * b, (c + 1) * b)
            new.append(a[tuple(idx)].copy())
    elif kind == "all_gather":
        for r in range(n):
            pieces = []
            for m in _group(r, k, dm):
                pieces.append(arrays[m])
                if m != r:
                    received[r] += arrays[m].size
            new.append(np.concatenate(pieces, axis=i))
    elif kind == "all_to_all":
        j = int(op.to_tensor_dim)
        assert j != i
        # Every member splits its shard along j into g pieces; piece t goes to member t.
        outbox: dict[tuple[int, int], np.ndarray] = {}
        for r in range(n):
            a = arrays[r]
            assert a.shape[j] % g == 0, ("all_to_all split does not divide", a.shape, j, g)
            for t, piece in enumerate(np.split(a, g, axis=j)):
                dest = _group(r, k, dm)[t]
                outbox[(r, dest)] = piece
        for r in range(n):
            pieces = []
            for m in _group(r, k, dm):
                piece = outbox[(m, r)]
                pieces.append(piece)
                if m != r:
                    received[r] += piece.size
            new.append(np.concatenate(pieces, axis=i))
    elif kind == "collective_permute":
        sigma = [int(x) for x in op.permutation]
        assert sorted(sigma) == list(range(len(dm))), sigma
        for r in range(n):
            # The block rank r holds after the permute is the one held before by the rank whose
            # coordinate along k is r's coordinate along sigma[k].
            c = coords(r, dm)
            src = rank_of([c[sigma[j]] for j in range(len(dm))], dm)
            new.append(arrays[src].copy())
            if src != r:
                received[r] += arrays[src].size
    else:
        raise AssertionError(f"unknown op kind {kind!r}")
    return new, received


def reduce(
    op: Any, idx: list[np.ndarray], val: list[np.ndarray], device_matrix: list[int]
) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """An all_reduce or reduce_scatter of the values along ``op.device_dim``: the indices of a
    group must agree; a reduce_scatter also splits ``op.tensor_dim``. Counts what a ring moves:
    the shard cut into ``g`` chunks, each member receiving ``g - 1`` of them (and, for an
    all_reduce, the ``g - 1`` reduced chunks it does not own)."""
    dm = [int(x) for x in device_matrix]
    n = num_devices(dm)
    k = int(op.device_dim)
    g = dev_size(dm, k)
    new_idx, new_val, received = [], [], [0] * n
    for r in range(n):
        members = _group(r, k, dm)
        for m in members:
            assert np.array_equal(idx[m], idx[r]), "a reduction over different elements"
        total = sum((val[m] for m in members), np.zeros_like(val[r]))
        t = coords(r, dm)[k]
        if op.kind == "all_reduce":
            chunks = np.array_split(np.arange(total.size), g)
            received[r] = (g - 1) * len(chunks[t]) + total.size - len(chunks[t])
            new_idx.append(idx[r].copy())
            new_val.append(total)
        else:
            assert op.kind == "reduce_scatter", op.kind
            i = int(op.tensor_dim)
            assert total.shape[i] % g == 0, ("reduce_scatter split does not divide", total.shape)
            new_idx.append(np.split(idx[r], g, axis=i)[t].copy())
            new_val.append(np.split(total, g, axis=i)[t].copy())
            received[r] = (g - 1) * new_val[-1].size
    return new_idx, new_val, received


def apply_to_map(op: Any, tm: list[int]) -> list[int]:
    """The tensor map after ``op`` (asserting the op is legal on ``tm``)."""
    tm = list(tm)
    kind, k, i = op.kind, int(op.device_dim), int(op.tensor_dim)
    if kind == "slice":
        assert tm[i] == -1 and k not in tm, ("illegal slice", tm, k, i)
        tm[i] = k
    elif kind == "all_gather":
        assert tm[i] == k, ("illegal all_gather", tm, k, i)
        tm[i] = -1
    elif kind == "all_to_all":
        j = int(op.to_tensor_dim)
        assert tm[i] == k and tm[j] == -1, ("illegal all_to_all", tm, k, i, j)
        tm[i] = -1
        tm[j] = k
    else:
        raise AssertionError(f"unknown op kind {kind!r}")
    return tm


def apply_to_layout(op: Any, layout: Layout4) -> Layout4:
    """The layout (4-tuple) after ``op``, asserting the op is legal on ``layout``."""
    shape, dm, tm, partial = layout
    kind, k = op.kind, int(op.device_dim)
    if kind == "all_reduce":
        assert k in partial, ("all_reduce of a dim without partial sums", layout, k)
        return shape, dm, list(tm), [p for p in partial if p != k]
    if kind == "reduce_scatter":
        i = int(op.tensor_dim)
        assert k in partial and tm[i] == -1, ("illegal reduce_scatter", layout, k, i)
        tm = list(tm)
        tm[i] = k
        return shape, dm, tm, [p for p in partial if p != k]
    if kind == "collective_permute":
        sigma = [int(x) for x in op.permutation]
        assert all(sigma[p] == p for p in partial), ("a permute moves partial sums", sigma)
        return shape, dm, [m if m < 0 else sigma[m] for m in tm], list(partial)
    assert kind != "slice" or k not in partial, ("slice along a partial dim", layout, k)
    return shape, dm, apply_to_map(op, tm), list(partial)


@dataclass
class Step:
    """One replayed op: the layout it acted on (as tracked by the simulator) and what it moved."""

    phase: str  # "prelude", "ops" or "epilogue"
    op: Any
    layout: Parts
    received: list[int]
    partial: list[int] = field(default_factory=list)


@dataclass
class Replay:
    arrays: list[np.ndarray]
    received: list[int]
    steps: list[Step] = field(default_factory=list)


def layout4(layout: Any) -> Layout4:
    shape, dm, tm = parts(layout)
    return shape, dm, tm, partial_of(layout)


def partial_bits(layout: Layout4) -> set[int]:
    """The rank bits of the partial dims: one partial state, however the matrix is cut."""
    _, dm, _, partial = layout
    out: set[int] = set()
    for k in partial:
        lo = sum(dev_size(dm, j).bit_length() - 1 for j in range(k))
        out.update(range(lo, lo + dev_size(dm, k).bit_length() - 1))
    return out


def reshape_to(
    cur: Layout4, new: Layout4, idx: list[np.ndarray], val: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every rank's arrays seen as ``new`` instead of ``cur``: allowed only if it moves nothing
    (each rank holds the same flat elements in the same order, and the same partial sums)."""
    if cur == new:
        return idx, val
    assert num_devices(cur[1]) == num_devices(new[1]), (cur, new)
    assert partial_bits(cur) == partial_bits(new), ("partial sums differ", cur, new)
    want = shards(new[:3])
    local = shard_shape(new[:3])
    out_idx, out_val = [], []
    for r, (a, v) in enumerate(zip(idx, val, strict=True)):
        assert a.size == prod(local), (cur, new)
        a2 = a.reshape(local)
        assert np.array_equal(a2, want[r]), f"rank {r}: {cur} -> {new} is not a free reshape"
        out_idx.append(a2)
        out_val.append(v.reshape(local))
    return out_idx, out_val


def _check_volume(op: Any, received: list[int], phase: str) -> None:
    if op.kind == "collective_permute":
        # Devices that keep their block receive nothing.
        assert int(op.volume) == max(received), (phase, op, received)
    elif op.kind == "all_reduce":
        # A ring's chunks may differ by one element: the average, rounded up.
        assert int(op.volume) == -(-sum(received) // len(received)), (phase, op, received)
    else:
        assert len(set(received)) == 1, f"{phase} op {op!r}: uneven receive counts {received}"
        assert int(op.volume) == received[0], (
            f"{phase} op {op!r}: volume {op.volume} but the replay moved {received[0]} per rank"
        )


def replay_plan(plan: Any, source: Any, target: Any) -> Replay:
    """Replay ``plan`` (a ``taps.Redistribution``) from the ORIGINAL ``source`` to ``target``.

    Every rank starts with its indices and values (addends, if ``source`` holds partial sums) of
    ``source``. Before each op the arrays are seen as ``op.layout`` (only if that moves nothing);
    each op's ``group_size`` and ``volume`` are checked against the data it moved. After the
    prelude the arrays are seen as ``plan.source``, after the ops they must be exactly those of
    ``plan.target``, and at the end exactly the indices and values of ``target``.
    """
    src, tgt = layout4(source), layout4(target)
    assert num_devices(src[1]) == num_devices(tgt[1])
    idx, val = shards(src[:3]), values(source)
    cur = src
    steps: list[Step] = []
    for phase, ops in (("prelude", plan.prelude), ("ops", plan.ops), ("epilogue", plan.epilogue)):
        if phase == "ops":
            usrc, utgt = layout4(plan.source), layout4(plan.target)
            assert usrc[:2] == utgt[:2], ("unified shapes or matrices differ", usrc, utgt)
            idx, val = reshape_to(cur, usrc, idx, val)
            cur = usrc
        for op in ops:
            if phase == "prelude":
                assert op.kind == "all_gather", f"prelude op {op!r} is not an all_gather"
            if phase == "epilogue":
                assert op.kind == "slice", f"epilogue op {op!r} is not a slice"
            at = layout4(op.layout)
            idx, val = reshape_to(cur, at, idx, val)
            cur = at
            _, dm, _, _ = cur
            if op.kind == "collective_permute":
                moved = [k for k, to in enumerate(op.permutation) if k != to]
                assert int(op.group_size) == prod(dev_size(dm, k) for k in moved), op
            else:
                assert int(op.group_size) == dev_size(dm, int(op.device_dim)), op
            if op.kind != "all_to_all":
                assert op.to_tensor_dim is None, op
            if op.kind in ("all_reduce", "reduce_scatter"):
                idx, val, received = reduce(op, idx, val, dm)
            else:
                idx, received = replay(op, idx, dm)
                val, _ = replay(op, val, dm)
            _check_volume(op, received, phase)
            steps.append(Step(phase, op, cur[:3], received, list(cur[3])))
            cur = apply_to_layout(op, cur)
        if phase == "ops":
            assert cur == layout4(plan.target), ("ops do not end on plan.target", cur)
            for r, (a, e) in enumerate(zip(idx, shards(cur[:3]), strict=True)):
                assert a.shape == e.shape and np.array_equal(a, e), (
                    f"rank {r}: after the ops holds {a.tolist()} but plan.target gives {e.tolist()}"
                )
    idx, val = reshape_to(cur, tgt, idx, val)
    _, dm, _, partial = tgt
    for r, (a, e) in enumerate(zip(idx, shards(tgt[:3]), strict=True)):
        assert a.shape == e.shape and np.array_equal(a, e), (
            f"rank {r}: final {a.tolist()} but the target gives {e.tolist()}"
        )
        # The addends along the target's partial dims sum to the tensor.
        group = [r]
        for k in partial:
            group = [m for g in group for m in _group(g, k, dm)]
        total = sum((val[m] for m in group), np.zeros_like(val[r]))
        assert np.array_equal(total, e), f"rank {r}: the values sum to {total.tolist()}"
    n = num_devices(src[1])
    total = [sum(s.received[r] for s in steps) for r in range(n)]
    return Replay(idx, total, steps)
