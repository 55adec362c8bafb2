"""A replay simulator for layouts and redistribution plans, written from first principles.

A rank's shard of a layout is an ndarray of the local shape whose values are the GLOBAL flat
(row-major) indices of the elements it holds, so element identity is checkable after any sequence
of collectives. Nothing here imports ``taps``: layouts are read through their ``shape``,
``device_matrix`` and ``tensor_map`` attributes, or given as plain ``(shape, dm, map)`` tuples, and
ops through ``kind``, ``device_dim``, ``tensor_dim`` and ``to_tensor_dim``.

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


def parts(layout: Any) -> Parts:
    """``(shape, device_matrix, tensor_map)`` of a layout object or tuple, as lists of ints."""
    if isinstance(layout, tuple | list):
        shape, dm, tm = layout
    else:
        shape, dm, tm = layout.shape, layout.device_matrix, layout.tensor_map
    return [int(x) for x in shape], [int(x) for x in dm], [int(x) for x in tm]


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


def element_sets(arrays: list[np.ndarray]) -> list[frozenset[int]]:
    return [frozenset(int(x) for x in a.ravel()) for a in arrays]


@dataclass(frozen=True)
class SimOp:
    """A stand-in for ``taps.CommOp`` (only the fields the simulator reads)."""

    kind: str
    device_dim: int
    tensor_dim: int
    to_tensor_dim: int | None = None


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
    i = int(op.tensor_dim)
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
    else:
        raise AssertionError(f"unknown op kind {kind!r}")
    return new, received


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


@dataclass
class Step:
    """One replayed op: the layout it acted on (as tracked by the simulator) and what it moved."""

    phase: str  # "prelude", "ops" or "epilogue"
    op: Any
    layout: Parts
    received: list[int]


@dataclass
class Replay:
    arrays: list[np.ndarray]
    received: list[int]
    steps: list[Step] = field(default_factory=list)


def _same_layout(op_layout: Any, tracked: Parts) -> bool:
    return parts(op_layout) == tracked


def _run(
    phase: str,
    ops: list[Any],
    tracked: Parts,
    arrays: list[np.ndarray],
    steps: list[Step],
    loose_layout: Parts | None = None,
) -> tuple[Parts, list[np.ndarray]]:
    shape, dm, tm = tracked
    for op in ops:
        cur = (shape, dm, list(tm))
        if loose_layout is None:
            assert _same_layout(op.layout, cur), (
                f"{phase} op {op!r}: op.layout {parts(op.layout)} != tracked {cur}"
            )
        else:
            # Pre/epilogue ops may report either the layout just before them or the original one.
            assert _same_layout(op.layout, cur) or _same_layout(op.layout, loose_layout), (
                f"{phase} op {op!r}: op.layout {parts(op.layout)} is neither {cur} "
                f"nor {loose_layout}"
            )
        assert int(op.group_size) == dev_size(dm, int(op.device_dim)), op
        if op.kind != "all_to_all":
            assert op.to_tensor_dim is None, op
        arrays, received = replay(op, arrays, dm)
        assert len(set(received)) == 1, f"{phase} op {op!r}: uneven receive counts {received}"
        assert int(op.volume) == received[0], (
            f"{phase} op {op!r}: volume {op.volume} but the replay moved {received[0]} per rank"
        )
        steps.append(Step(phase, op, cur, received))
        tm = apply_to_map(op, tm)
    return (shape, dm, tm), arrays


def _reshape_all(arrays: list[np.ndarray], local_shape: list[int]) -> list[np.ndarray]:
    out = []
    for a in arrays:
        assert a.size == prod(local_shape), (a.shape, local_shape)
        out.append(a.reshape(local_shape))
    return out


def replay_plan(plan: Any, source: Any, target: Any) -> Replay:
    """Replay ``plan`` (a ``taps.Redistribution``) from the ORIGINAL ``source`` to ``target``.

    Checks on the way: every op's ``layout``/``group_size``/``volume`` against the simulator's own
    tracking; after the prelude, each rank holds exactly ``plan.source``'s elements; after the ops,
    exactly ``shards(plan.target)``; after the epilogue, exactly ``shards(target)``.
    """
    src = parts(source)
    tgt = parts(target)
    assert num_devices(src[1]) == num_devices(tgt[1])
    steps: list[Step] = []
    arrays = shards(src)

    # 1. Prelude: all_gathers on the original source layout.
    for op in plan.prelude:
        assert op.kind == "all_gather", f"prelude op {op!r} is not an all_gather"
    relaxed_src, arrays = _run("prelude", list(plan.prelude), src, arrays, steps, src)

    # 2. Free reshape to the unified source.
    usrc, utgt = parts(plan.source), parts(plan.target)
    assert usrc[0] == utgt[0], ("unified shapes differ", usrc, utgt)
    assert usrc[1] == utgt[1], ("unified device matrices differ", usrc, utgt)
    assert num_devices(usrc[1]) == num_devices(src[1])
    arrays = _reshape_all(arrays, shard_shape(usrc))
    assert element_sets(arrays) == element_sets(shards(usrc)), (
        "plan.source does not hold the elements of the (relaxed) source",
        relaxed_src,
        usrc,
    )

    # 3. The ops proper, on the unified layouts.
    final_u, arrays = _run("ops", list(plan.ops), usrc, arrays, steps)
    assert final_u == utgt, ("ops do not end on plan.target's map", final_u, utgt)
    expect = shards(utgt)
    for r, (a, e) in enumerate(zip(arrays, expect, strict=True)):
        assert a.shape == e.shape and np.array_equal(a, e), (
            f"rank {r}: after the ops holds {a.tolist()} but plan.target gives {e.tolist()}"
        )

    # 4. Free reshape to the relaxed original target, then the epilogue's free slices.
    rtm = list(tgt[2])
    for op in plan.epilogue:
        assert op.kind == "slice", f"epilogue op {op!r} is not a slice"
        i, k = int(op.tensor_dim), int(op.device_dim)
        assert rtm[i] == k, ("epilogue slices a dim the target does not split that way", op, tgt)
        rtm[i] = -1
    relaxed_tgt = (tgt[0], tgt[1], rtm)
    arrays = _reshape_all(arrays, shard_shape(relaxed_tgt))
    assert element_sets(arrays) == element_sets(shards(relaxed_tgt)), (
        "plan.target does not hold the elements of the (relaxed) target",
        relaxed_tgt,
        utgt,
    )
    # A row-major box of a row-major tensor lists its flat indices in increasing order, so equal
    # sets mean equal arrays: the reshape really is free.
    for a, e in zip(arrays, shards(relaxed_tgt), strict=True):
        assert np.array_equal(a, e)
    final_t, arrays = _run("epilogue", list(plan.epilogue), relaxed_tgt, arrays, steps, tgt)
    assert final_t == tgt
    expect = shards(tgt)
    for r, (a, e) in enumerate(zip(arrays, expect, strict=True)):
        assert a.shape == e.shape and np.array_equal(a, e), (
            f"rank {r}: final {a.tolist()} but the target gives {e.tolist()}"
        )

    n = num_devices(src[1])
    total = [sum(s.received[r] for s in steps) for r in range(n)]
    return Replay(arrays, total, steps)
