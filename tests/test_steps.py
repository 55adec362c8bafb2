"""taps' steps as JAX collectives on their own (taps.steps.jax, with the groups of
taps.steps.kinds): steps of layouts with partial sums (reduce-scatter) and block moves
(collective-permute), run on hand-made ops and on the optimal planner's own plans, and checked
against numpy and against the compiled HLO."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import taps
from taps.export.jax import jax_mesh, layout_spec
from taps.plan.mesh import mesh_for
from taps.steps.jax import redistribute
from taps.steps.kinds import step_kind
from taps.verify import collectives
from taps.verify.xla.devices import jax_with_devices

jax = jax_with_devices(64)  # one JAX per test session: the most any module needs
P = jax.sharding.PartitionSpec


def _op(kind, layout, **fields):
    defaults = {"device_dim": 0, "tensor_dim": None, "to_tensor_dim": None, "permutation": None}
    return SimpleNamespace(kind=kind, layout=layout, **{**defaults, **fields})


def _plan(op, source, target):
    return SimpleNamespace(prelude=[], ops=[op], epilogue=[], source=source, target=target)


def test_reduce_scatter_sums_partials_and_splits():
    """Eight ranks as [2, 4]; the four ranks of each row hold partial sums of an (8, 4) tensor:
    afterwards each holds its quarter of the rows of the row's sum."""
    before = taps.Layout([8, 4], [2, 4], [-1, -1])
    after = taps.Layout([8, 4], [2, 4], [0, -1])
    op = _op("reduce_scatter", before, tensor_dim=0)
    mesh = mesh_for([before, after], 8)
    everywhere = P(mesh.axis_names)  # one block per rank, stacked

    def body(x):
        return redistribute(x[0], _plan(op, before, after), after, mesh)[None]

    fn = jax.shard_map(body, mesh=jax_mesh(mesh), in_specs=everywhere, out_specs=everywhere)
    partials = np.arange(8 * 8 * 4, dtype=np.float32).reshape(8, 8, 4)
    compiled = jax.jit(fn).lower(partials).compile()
    got = np.asarray(compiled(partials))
    for r in range(8):
        row = range(4 * (r // 4), 4 * (r // 4) + 4)
        total = sum(partials[j] for j in row)
        np.testing.assert_array_equal(got[r], total[2 * (r % 4) : 2 * (r % 4) + 2])
    (c,) = collectives(compiled.as_text(), 8)
    assert (c.kind, c.groups) == ("reduce_scatter", step_kind("reduce_scatter").groups(op))
    assert c.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert (c.in_bytes, c.bytes) == (128, 96)


def test_collective_permute_moves_blocks_between_device_dims():
    """A [4, 4] tensor split along device dims 0 and 1 of [2, 2]; the permutation swaps them."""
    before = taps.Layout([4, 4], [2, 2], [0, 1])
    after = taps.Layout([4, 4], [2, 2], [1, 0])
    op = _op("collective_permute", before, permutation=[1, 0])
    mesh = mesh_for([before, after], 4)
    jmesh = jax_mesh(mesh)
    fn = jax.shard_map(
        lambda x: redistribute(x, _plan(op, before, after), after, mesh),
        mesh=jmesh,
        in_specs=P(*layout_spec(mesh, before)),
        out_specs=P(*layout_spec(mesh, after)),
    )
    full = np.arange(16, dtype=np.float32).reshape(4, 4)
    x = jax.device_put(full, jax.sharding.NamedSharding(jmesh, P(*layout_spec(mesh, before))))
    compiled = jax.jit(fn).lower(x).compile()
    out = compiled(x)
    rank = {d: r for r, d in enumerate(jmesh.devices.reshape(-1))}
    for shard in out.addressable_shards:
        block = tuple(slice(a, b) for a, b in after.shard_index(rank[shard.device]))
        np.testing.assert_array_equal(np.asarray(shard.data), full[block])
    (c,) = collectives(compiled.as_text(), 4)
    assert c.kind == "collective_permute"
    # Ranks 1 and 2 swap blocks; 0 and 3 keep theirs (XLA lists them too).
    assert (
        c.groups == step_kind("collective_permute").groups(op) == ((0, 0), (1, 2), (2, 1), (3, 3))
    )
    assert (c.in_bytes, c.bytes) == (16, 16)


def test_the_optimal_planners_reduce_scatter_runs_as_planned():
    """The planner's own plan from partial sums (device dim 0, the four ranks of each row of
    [2, 4]) to a split: one reduce_scatter, run through the step table on XLA, each rank ends with
    its quarter of the rows of its row's sum."""
    before = taps.Layout([8, 4], [2, 4], [-1, -1], partial=[0])
    after = taps.Layout([8, 4], [2, 4], [0, -1])
    plan = taps.plan_redistribution(before, after, planner="optimal")
    assert [op.kind for op in plan.all_ops] == ["reduce_scatter"]
    layouts = [before, after, plan.source, plan.target, *(op.layout for op in plan.all_ops)]
    mesh = mesh_for(layouts, 8)
    everywhere = P(mesh.axis_names)  # one block per rank, stacked

    def body(x):
        return redistribute(x[0], plan, after, mesh)[None]

    fn = jax.shard_map(body, mesh=jax_mesh(mesh), in_specs=everywhere, out_specs=everywhere)
    partials = np.arange(8 * 8 * 4, dtype=np.float32).reshape(8, 8, 4)
    compiled = jax.jit(fn).lower(partials).compile()
    got = np.asarray(compiled(partials))
    for r in range(8):
        row = range(4 * (r // 4), 4 * (r // 4) + 4)
        total = sum(partials[j] for j in row)
        block = tuple(slice(a, b) for a, b in after.shard_index(r))
        np.testing.assert_array_equal(got[r], total[block])
    (c,) = collectives(compiled.as_text(), 8)
    assert c.kind == "reduce_scatter"
    assert (
        c.groups == step_kind("reduce_scatter").groups(plan.ops[0]) == ((0, 1, 2, 3), (4, 5, 6, 7))
    )
    assert c.bytes == plan.volume * 4
