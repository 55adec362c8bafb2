"""taps.export: layouts onto JAX shardings and DTensor placements, checked against what JAX
itself says each device holds (``devices_indices_map``) and against the Rust ``shard_index``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from strategies_gen import POW2_ATOMS, layouts, to_layout
from taps.export import ExportError, layout_placements, layout_spec, mesh_for, to_dtensor, to_jax
from taps.verify.xla.devices import jax_with_devices

jax = jax_with_devices(64)  # one JAX per test session: the most any module needs


def _blocks(layout: taps.Layout) -> list[list[tuple[int, int]]]:
    return [[tuple(r) for r in layout.shard_index(rank)] for rank in range(layout.num_devices)]


def _jax_blocks(sharding, shape) -> list[list[tuple[int, int]]]:
    index = sharding.devices_indices_map(tuple(shape))
    out = []
    for device in jax.devices()[: sharding.mesh.size]:
        out.append([s.indices(n)[:2] for s, n in zip(index[device], shape)])
    return out


@settings(max_examples=150)
@given(st.lists(layouts(max_log2_devices=6), min_size=1, max_size=3), st.data())
def test_every_device_holds_the_taps_block(specs, data):
    """One mesh for several layouts of one device count (a finer mesh where their device
    matrices cut differently); each layout's NamedSharding puts on every device exactly the block
    ``Layout.shard_index`` gives that rank."""
    n = taps.Layout(*specs[0]).num_devices
    lays = [to_layout(s) for s in specs if taps.Layout(*s).num_devices == n]
    mesh = mesh_for(lays, n)
    jmesh = taps.export.jax.jax_mesh(mesh)
    for layout in lays:
        sharding = taps.export.jax.named_sharding(jmesh, layout_spec(mesh, layout))
        assert _jax_blocks(sharding, layout.shape) == _blocks(layout)


@given(layouts(max_log2_devices=5, atoms=POW2_ATOMS))
def test_mesh_is_the_coarsest(spec):
    """Alone, a layout's mesh is its device matrix without size-1 dims."""
    layout = to_layout(spec)
    mesh = mesh_for([layout], layout.num_devices)
    assert list(mesh.shape) == ([d for d in layout.device_matrix if d > 1] or [1])


def test_fine_mesh_where_matrices_cut_differently():
    a = taps.Layout([8, 8], [2, 4], [1, 0])
    b = taps.Layout([8, 8], [4, 2], [0, 1])
    mesh = mesh_for([a, b], 8)
    assert mesh.shape == (2, 2, 2)
    assert layout_spec(mesh, a) == ("d2", ("d1", "d0"))
    assert layout_spec(mesh, b) == ("d0", ("d2", "d1"))
    assert layout_placements(mesh, a) == ("Shard(0)", "Shard(1)", "Shard(1)")


def test_bad_device_count():
    with pytest.raises(ExportError, match="power of two"):
        mesh_for([], 6)


def test_mlp_export_round_trips_json():
    g = taps.models.mlp(batch=64, sizes=(32, 64, 32))
    cluster = taps.Cluster(2, 4)
    result = taps.search(g, cluster)
    plan = to_jax(result.plan)
    doc = json.loads(plan.to_json())
    assert doc["format"] == "taps.export.jax"
    assert set(doc["tensors"]) == set(g.tensors)
    assert doc["mesh"]["shape"] == list(plan.mesh.shape)
    dt = json.loads(to_dtensor(result.plan).to_json())
    assert set(dt["tensors"]) == set(g.tensors)
    lays = taps.export.layouts_of(result.plan).tensors
    for name, spec in plan.tensors.items():
        sharding = plan.sharding(name)
        shape = g.tensors[name].shape
        assert _jax_blocks(sharding, shape) == _blocks(lays[name]), name
        assert plan.partition_spec(name) == jax.sharding.PartitionSpec(*spec)
        assert len(spec) == len(shape)
