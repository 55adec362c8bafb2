"""Batched matmul and attention split along their batch dims only, run on each rank's blocks.

DTensor runs a batched ``matmul`` and ``scaled_dot_product_attention`` (its math path, on CPU)
by flattening the batch dims into one and unflattening the result. A dim split over several
mesh dims (attention heads over both dims of a 2 x 2 mesh: ``(Shard(1), Shard(1))``) flattens
to a ``_StridedShard`` on each mesh dim with the same split factor, which the unflatten then
refuses ("Cannot unflatten tensor with _StridedShard placement", torch's
``_ops/_view_ops.py``: it expects the second mesh dim's factor divided by the first's); and
attention told ``is_causal`` builds its mask as a plain tensor that DTensor refuses to add.

Neither is needed when every operand is split along batch dims only: the batch dims are
independent, so each rank's block of the output is the op on its blocks of the operands, with
no communication (what taps prices for an operator split so). :func:`batch_split` finds
whether the operands' placements are such a split (a replicated operand may be cut locally to
match, which moves nothing) and the output's placements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from taps.export.dtensor import PARTIAL, REPLICATE


def _shard_dim(text: str) -> int | None:
    return int(text[6:-1]) if text.startswith("Shard(") else None


#: A matrix dim one operand may split alone: ``(operand, its dim, the output's dim)``, dims
#: counted from the end, with the operands that follow it along a dim of theirs (read split
#: there where they hold it, else replicated) as ``(operand, its dim)`` pairs.
Free = tuple[int, int, int, tuple[tuple[int, int], ...]]

#: ``matmul``'s rows of its first operand and columns of its second.
MATMUL_FREE: tuple[Free, ...] = ((0, -2, -2, ()), (1, -1, -1, ()))

#: Attention's query length (each query's row of weights is its own), the mask following;
#: not when causal (the mask then depends on a query's position in the whole).
ATTENTION_FREE: tuple[Free, ...] = ((0, -2, -2, ((3, -2),)),)


def batch_split(
    shapes: Sequence[Sequence[int]],
    placements: Sequence[Sequence[str]],
    mesh_shape: Sequence[int],
    grouped: bool = False,
    free: Sequence[Free] = (),
) -> tuple[list[tuple[str, ...]], tuple[str, ...]] | None:
    """Per operand the placements it is read in, and the output's placements, when the
    operands (of ``shapes``, in ``placements`` per mesh dim) of a batched op are split along
    batch dims only, or along a ``free`` matrix dim (:data:`MATMUL_FREE`,
    :data:`ATTENTION_FREE`); ``None`` otherwise.

    An operand's batch dims are all but its last two, aligned from the right with the others'
    (broadcasting), and the output's leading dims are their broadcast, then two matrix dims.
    On each mesh dim every split operand must split the same batch dim of the output, an
    operand holding that dim whole is read split there too (cut locally from its replicated
    block), one broadcast along it (size 1, or without the dim) must be replicated, and every
    split is even; or one operand splits a free dim of its own, the others replicated there
    but for its followers. No operand may hold partial sums (the op is not linear in every
    operand). ``grouped`` admits batch dims whose sizes differ without one being 1 (attention's
    grouped-query heads: a key head serves a group of query heads, and even blocks keep the
    groups whole)."""
    batches = [tuple(s[:-2]) if len(s) >= 2 else () for s in shapes]
    rank = max((len(b) for b in batches), default=0)
    sizes = [1] * rank
    for b in batches:
        for i, size in enumerate(b):
            o = rank - len(b) + i
            if size != 1 and sizes[o] not in (1, size) and not grouped:
                return None
            sizes[o] = max(sizes[o], size)
    read = [list(p) for p in placements]
    out: list[str] = []
    for m, n in enumerate(mesh_shape):
        if any(p[m] == PARTIAL for p in placements):
            return None
        targets: set[tuple[str, int]] = set()  # ("batch", output dim) or ("free", entry)
        for k, (shape, p) in enumerate(zip(shapes, placements)):
            d = _shard_dim(p[m])
            if d is None or n == 1:
                continue
            if d < len(batches[k]):
                targets.add(("batch", rank - len(batches[k]) + d))
                continue
            mine = (k, d - len(shape))
            entry = next(
                (i for i, f in enumerate(free) if (f[0], f[1]) == mine or mine in f[3]), None
            )
            if entry is None:  # a split of a matrix dim that is not free
                return None
            targets.add(("free", entry))
        if len(targets) > 1:
            return None
        if not targets:
            out.append(REPLICATE)
            continue
        ((kind, at),) = targets
        if kind == "free":
            owner, own, dim, followers = free[at]
            follow = {**dict(followers), owner: own}
            for k, (shape, p) in enumerate(zip(shapes, placements)):
                d = len(shape) + follow[k] if k in follow and len(shape) >= -follow[k] else None
                if d is not None and shape[d] != 1:
                    read[k][m] = f"Shard({d})"
                elif p[m] != REPLICATE:
                    return None
            out.append(f"Shard({rank + 2 + dim})")
            continue
        for k, (b, p) in enumerate(zip(batches, placements)):
            d = at - (rank - len(b))
            if 0 <= d < len(b) and b[d] != 1:
                read[k][m] = f"Shard({d})"
            elif p[m] != REPLICATE:
                return None
        out.append(f"Shard({at})")
    for shape, p in zip(shapes, read):
        for d, size in enumerate(shape):
            parts = math.prod(n for n, t in zip(mesh_shape, p) if t == f"Shard({d})")
            if size % parts:
                return None
    return [tuple(p) for p in read], tuple(out)
