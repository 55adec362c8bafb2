"""Sharded parameter storage (FSDP, ZeRO-3) in the exact replay of the training step.

A parameter an operator stores sharded (``plan.pricing.fsdp``, docs/search.md) is held by each
device as its share of the block the operator computes with: that block's dim 0 cut into as many
pieces as its gradient's reduction group has devices (padded with zeros to a multiple, as FSDP2
pads), the device taking the piece at its place in the group. The operator then runs as FSDP2's
``fully_shard`` unit with ``reshard_after_forward=True``, one ``jax.custom_vjp`` (:func:`unit`):

- forward: each such parameter all-gathered over the group (dim 0), then the operator;
- backward: the shards all-gathered again (the forward's gathered copy is not kept: only the
  shards are residuals), the operator's local backward on the gathered blocks, and each
  parameter's gradient reduce-scattered over the group (dim 0, padded) to the device's shard.

Both gathers and the reduce_scatter are the collectives taps prices for the operator
(:func:`taps.search.prices.sharded_storage`); everything else the operator does is as without
sharding (its forward partial sums, a bias added once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from taps._core import Layout
from taps.graph import Graph, Operator
from taps.plan.mesh import Mesh
from taps.search.prices import Collective
from taps.steps.kinds import layout_groups
from taps.verify.result import relative_error
from taps.verify.xla.operators import Block, Reduce, compute


@dataclass(frozen=True)
class Stored:
    """One operator slot reading a parameter stored sharded.

    Attributes:
        layout: the layout the operator computes with (the gathered block's).
        group: the ranks of each reduction group (sorted; a device's piece is its place in its
            group), from the gradient's reduce_scatter.
        axes: the mesh axes of the group, outermost first (the gathers' and scatter's axes).
    """

    layout: Layout
    group: tuple[tuple[int, ...], ...]
    axes: tuple[str, ...]

    @classmethod
    def of(cls, mesh: Mesh, layout: Layout, scatter: Collective) -> Stored:
        over = scatter.layout
        unused = [k for k in range(len(over.device_matrix)) if k not in over.tensor_map]
        return cls(layout, layout_groups(over, unused), mesh.unused_axes(over))

    @property
    def size(self) -> int:
        return len(self.group[0])

    @property
    def rows(self) -> int:
        """Dim 0 of the block the operator computes with."""
        return self.layout.shard_shape[0]

    @property
    def shard_shape(self) -> tuple[int, ...]:
        """A device's piece: dim 0 padded to a multiple of the group, cut."""
        return (-(-self.rows // self.size), *self.layout.shard_shape[1:])

    def shards(self, whole: Any) -> np.ndarray:
        """Every device's piece of ``whole`` (the parameter as the operator reads it), stacked in
        rank order."""
        want = np.asarray(whole).reshape(self.layout.shape)
        rows = self.shard_shape[0]
        out = np.zeros((self.layout.num_devices, *self.shard_shape), dtype=want.dtype)
        for group in self.group:
            for place, r in enumerate(group):
                block = want[tuple(slice(lo, hi) for lo, hi in self.layout.shard_index(r))]
                piece = block[place * rows : (place + 1) * rows]
                out[r, : piece.shape[0]] = piece
        return out

    def error(self, blocks: Any, whole: Any) -> float:
        """The largest difference of any device's piece (``blocks[r]``) from its piece of
        ``whole``, relative to the largest magnitude of ``whole``."""
        # Every element of ``whole`` is in some piece, so the pieces' scale is the tensor's.
        want = self.shards(np.asarray(whole, dtype=np.float64))
        return relative_error(np.asarray(blocks).reshape(want.shape), want)


def stored_leaves(
    graph: Graph,
    intra: Mapping[str, list[Collective]],
    leaf_layouts: Mapping[str, Layout],
    mesh: Mesh,
) -> dict[str, Stored]:
    """Per leaf key (``"op#slot"``, its layout in ``leaf_layouts``) whose parameter its operator
    stores sharded (a reduce_scatter of its gradient in ``intra``), how."""
    out: dict[str, Stored] = {}
    for op in graph.ops:
        scatters = [c for c in intra[op.name] if c.kind == "reduce_scatter"]
        for slot, o in enumerate(op.inputs):
            c = next((c for c in scatters if c.tensor == o.tensor), None)
            key = f"{op.name}#{slot}"
            if c is not None and key in leaf_layouts:
                scatters.remove(c)
                out[key] = Stored.of(mesh, leaf_layouts[key], c)
    return out


def _local(y: Any, addend: Any = None) -> Any:
    """An operator's ``reduce`` as its backward sees it: the output's gradient passes to the
    partial sums, and whole to an addend (taps' own backward of both)."""
    return y if addend is None else y + addend


def unit(
    jax: Any, op: Operator, stored: Mapping[int, Stored], reduce: Reduce, block: Block
) -> Callable[[list[Any]], Any]:
    """``op`` on its inputs (``xs``, each slot's local value; the slots in ``stored`` as the
    device's shard) as an FSDP unit (module doc) on the device's ``block``, in ``jax``."""
    jnp = jax.numpy
    slots = sorted(stored)

    def gather(slot: int, shard: Any) -> Any:
        s = stored[slot]
        return jax.lax.all_gather(shard, s.axes, axis=0, tiled=True)[: s.rows]

    def scatter(slot: int, g: Any) -> Any:
        s = stored[slot]
        pad = [(0, s.shard_shape[0] * s.size - s.rows)] + [(0, 0)] * (g.ndim - 1)
        return jax.lax.psum_scatter(jnp.pad(g, pad), s.axes, scatter_dimension=0, tiled=True)

    def whole(xs: list[Any], gathered: Mapping[int, Any]) -> list[Any]:
        return [gathered.get(k, x) for k, x in enumerate(xs)]

    @jax.custom_vjp
    def run(xs: list[Any]) -> Any:
        return compute(op, whole(xs, {k: gather(k, xs[k]) for k in slots}), reduce, block)

    def fwd(xs: list[Any]) -> tuple[Any, list[Any]]:
        return run(xs), xs  # the shards are kept, not the gathered blocks

    def bwd(xs: list[Any], g: Any) -> tuple[list[Any]]:
        # Gathered again (the replay compiles without CSE, which would merge this gather into
        # the forward's: keeping the gathered block, FSDP's reshard_after_forward=False).
        gathered = {k: gather(k, xs[k]) for k in slots}
        _, pull = jax.vjp(lambda ys: compute(op, ys, _local, block), whole(xs, gathered))
        (grads,) = pull(g)
        # FSDP2 gathers before a unit's backward whether or not the backward reads the
        # parameter (it does not when no input of the operator needs a gradient); XLA drops what
        # nothing reads, so the gradient is made to read the gathered block (adding 0 times its
        # sum: the same numbers).
        scattered = {
            k: scatter(k, grads[k]) + 0 * jnp.sum(gathered[k]).astype(grads[k].dtype) for k in slots
        }
        return (whole(grads, scattered),)

    run.defvjp(fwd, bwd)
    return run


def unit_slots(stored: Mapping[str, Stored], op: Operator) -> dict[int, Stored]:
    """The slots of ``op`` reading a parameter it stores sharded (``stored``, by leaf key)."""
    return {
        slot: stored[f"{op.name}#{slot}"]
        for slot in range(len(op.inputs))
        if f"{op.name}#{slot}" in stored
    }
