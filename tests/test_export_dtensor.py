"""taps.export's DTensor placements against DTensor's own arithmetic: the block a placement list
gives each mesh coordinate equals ``Layout.shard_index`` of the rank at that coordinate."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from strategies_gen import layouts, to_layout
from taps.export import layout_placements, mesh_for, to_dtensor
from taps.extras import require

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
    plan = to_dtensor(taps.search(g, taps.Cluster(2, 4)))
    for name, text in plan.tensors.items():
        assert [repr(p) for p in plan.placements(name)] == [
            "Replicate()" if t == "Replicate()" else f"Shard(dim={t[6:-1]})" for t in text
        ]
