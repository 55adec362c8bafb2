"""taps.export's DTensor placements against DTensor's own arithmetic: the block a placement list
gives each mesh coordinate equals ``Layout.shard_index`` of the rank at that coordinate."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from strategies_gen import layouts, to_layout
from taps._support.extras import require
from taps.export import layout_placements, mesh_for, to_dtensor

dtensor = require("torch.distributed.tensor", "torch", "the DTensor export tests")
# DTensor's own placement arithmetic (private, but the one place DTensor computes a coordinate's
# block without a process group).
torch_utils = require("torch.distributed.tensor._utils", "torch", "the DTensor export tests")


def _dtensor_blocks(mesh, placements, shape):
    objects = [
        dtensor.Replicate() if p == "Replicate()" else dtensor.Shard(int(p[6:-1]))
        for p in placements
    ]
    out = []
    for r in range(mesh.num_devices):
        coord = [int(c) for c in np.unravel_index(r, mesh.shape)]
        size, offset = torch_utils._compute_local_shape_and_global_offset(
            list(shape), list(mesh.shape), coord, objects
        )
        out.append([(o, o + s) for o, s in zip(offset, size)])
    return out


@settings(max_examples=150)
@given(st.lists(layouts(max_log2_devices=6), min_size=1, max_size=3))
def test_every_rank_holds_the_taps_block(specs):
    n = taps.Layout(*specs[0]).num_devices
    lays = [to_layout(s) for s in specs if taps.Layout(*s).num_devices == n]
    mesh = mesh_for(lays, n)
    for layout in lays:
        want = [[tuple(b) for b in layout.shard_index(r)] for r in range(n)]
        assert _dtensor_blocks(mesh, layout_placements(mesh, layout), layout.shape) == want


def test_placement_objects():
    g = taps.models.mlp(batch=64, sizes=(32, 64, 32))
    plan = to_dtensor(taps.search(g, taps.Cluster(2, 4)).plan)
    for name, text in plan.tensors.items():
        assert [repr(p) for p in plan.placements(name)] == [
            "Replicate()" if t == "Replicate()" else f"Shard(dim={t[6:-1]})" for t in text
        ]


def _with_partial(draw_spec, choice):
    shape, dm, tm = draw_spec
    unused = [k for k in range(len(dm)) if k not in tm]
    partial = [k for k, keep in zip(unused, choice) if keep]
    return taps.Layout(list(shape), list(dm), list(tm), partial)


@settings(max_examples=150)
@given(layouts(max_log2_devices=6), st.lists(st.booleans(), min_size=6, max_size=6))
def test_partial_sums_are_partial_on_exactly_their_mesh_dims(spec, choice):
    from taps.steps.kinds import layout_groups

    layout = _with_partial(spec, choice)
    mesh = mesh_for([layout], layout.num_devices)
    texts = layout_placements(mesh, layout)
    # The Shard entries still give every rank its block ...
    want = [[tuple(b) for b in layout.shard_index(r)] for r in range(layout.num_devices)]
    shards = tuple(p if p.startswith("Shard") else "Replicate()" for p in texts)
    assert _dtensor_blocks(mesh, shards, layout.shape) == want
    # ... and the ranks that differ only along the Partial mesh dims are the ones taps sums over.
    coords = np.array(np.unravel_index(np.arange(layout.num_devices), mesh.shape)).T
    keep = [i for i, p in enumerate(texts) if p != "Partial()"]
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, c in enumerate(coords):
        groups.setdefault(tuple(c[keep]), []).append(r)
    got = tuple(sorted(tuple(g) for g in groups.values()))
    assert got == layout_groups(layout, layout.partial)
    assert ("Partial()" in texts) == any(layout.device_dim_size(k) > 1 for k in layout.partial)


def test_partial_placements_round_trip_through_json():
    import json

    from taps.export.dtensor import placement_objects

    graph = taps.models.mlp(batch=64, sizes=(32, 64, 32))
    # The paper's model's plan: its mesh is (4, 2).
    from taps.reproduce.cases import paper_cluster

    plan = to_dtensor(taps.search(graph, paper_cluster(1, 8), taps.Pricing(step="forward")).plan)
    assert plan.mesh.shape == (4, 2)
    layout = taps.Layout([64, 32], [4, 2], [1, -1], [0])
    texts = layout_placements(plan.mesh, layout)
    assert texts == ("Shard(0)", "Partial()")
    doc = json.loads(plan.to_json())
    doc["tensors"]["fc1.out"] = list(texts)
    objects = placement_objects(json.loads(json.dumps(doc))["tensors"]["fc1.out"])
    assert objects == [dtensor.Shard(0), dtensor.Partial("sum")]


def test_an_unknown_placement_is_one_clear_error():
    import pytest

    from taps.export import ExportError
    from taps.export.dtensor import placement_objects

    with pytest.raises(ExportError, match="unknown placement 'Shard\\(x\\)'"):
        placement_objects(["Shard(x)"])
