"""Exports name every parameter of the module: a parameter read only through views placed by
:func:`taps.export.roots.reshaped` (checked block by block against the view's layout), and a
tied weight run by ``distribute_module``. Every model family's export, naming every parameter
and buffer, is checked by ``tests/test_frontend_models.py``."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from strategies_gen import groupings, layouts, to_layout
from taps.export import distribute_module, to_dtensor
from taps.export.distribute import framework_placements, nearest_placements
from taps.export.roots import reshaped
from taps.frontends import from_torch


def _flat_blocks(layout: taps.Layout) -> list[set[int]]:
    """Per rank, the row-major flat indices of its block."""
    flat = np.arange(int(np.prod(layout.shape))).reshape(layout.shape)
    return [
        set(flat[tuple(slice(a, b) for a, b in layout.shard_index(r))].ravel())
        for r in range(layout.num_devices)
    ]


@settings(max_examples=200, deadline=None)
@given(layouts(max_log2_devices=5), st.data())
def test_reshaped_layout_holds_the_same_elements(spec, data):
    """Every rank holds, in the reshaped layout, the elements it holds in the view's layout;
    exactly those when every split was carried over (else a superset: the dim left whole)."""
    layout = to_layout(spec)
    atoms = [a for d in layout.shape for a in _factors(d)]
    shape = data.draw(groupings(atoms))
    root = reshaped(layout, shape)
    assert root.shape == list(shape) and root.device_matrix == layout.device_matrix
    before, after = _flat_blocks(layout), _flat_blocks(root)
    kept = sorted(m for m in root.tensor_map if m >= 0)
    split = sorted(m for m, d in zip(layout.tensor_map, layout.shape) if m >= 0)
    for b, a in zip(before, after):
        assert b <= a
        if kept == split:
            assert a == b


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out or [1]


def test_reshaped_examples():
    # A fused QKV weight (64, 192) seen as (64, 3, 64): the split of the 3 stays on its dim.
    qkv = taps.Layout([64, 3, 64], [2, 2], [0, -1, 1])
    assert reshaped(qkv, [64, 192]).tensor_map == [0, -1]  # the inner 64 is no top factor
    # A layer scale (64,) read as (64, 1, 1): the channels split carries over.
    assert reshaped(taps.Layout([64, 1, 1], [4], [0, -1, -1]), [64]).tensor_map == [0]


class _TiedHead(torch.nn.Module):
    """An input projection whose weight the output reads again (a tied embedding and head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Linear(32, 64, bias=False)
        self.mid = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.mid(self.emb(x))) @ self.emb.weight


@pytest.mark.parametrize("mode", ["dtensor", "taps"])
def test_distribute_module_runs_a_tied_weight(mode):
    """Either mode runs a module whose weight two operators read, on the fake process group:
    the one parameter is placed where its share operator holds it and takes a gradient (in
    taps' replay, its uses' gradients carried back through the share operator)."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    module, x = _TiedHead(), torch.randn(16, 32)
    graph = from_torch(module, x)
    assert graph.ops[0].name == "emb.weight.share"
    plan = taps.search(graph, taps.Cluster(1, 4)).plan
    dt = to_dtensor(plan)
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = DeviceMesh(
            "cpu", torch.arange(4).reshape(dt.mesh.shape), mesh_dim_names=dt.mesh.axis_names
        )
        dm = distribute_module(module, plan, x, mesh=mesh, mode=mode)
        y = dm(x)
        y.to_local().sum().backward()
        grad = dm.grad("emb.weight")  # the replay gathers it from every rank
    finally:
        tdist.destroy_process_group()
    assert tuple(y.shape) == (16, 32)
    assert set(dm.parameters) == {"emb.weight", "mid.weight", "mid.bias"}
    placed = [str(p) for p in dm.parameters["emb.weight"].placements]
    if mode == "dtensor":
        assert placed == [str(p) for p in dt.placements("emb.weight")]
    else:  # held whole; one block in the share operator's layout reads it for both uses
        assert len(dm.readers["emb.weight"]) == 1
    assert grad is not None


def test_a_plan_of_another_batch_or_module_is_refused():
    """A plan names its module's operators; the module called on another batch makes the same
    names, so the sizes are compared too (a plan of another module by its operators)."""
    from taps.errors import ExportError
    from taps.plan.plan import unlike_operators

    module, x = _TiedHead(), torch.randn(16, 32)
    plan = taps.search(from_torch(module, x), taps.Cluster(1, 4)).plan
    assert unlike_operators(plan.graph, from_torch(module, x)) is None
    refused = r"^the plan is not of this module: operator 'emb' .*another batch"
    with pytest.raises(ExportError, match=refused):
        distribute_module(module, plan, torch.randn(32, 32), mode="dtensor")
    other = torch.nn.Sequential(torch.nn.Linear(32, 32))
    with pytest.raises(ExportError, match="are in one and not the other"):
        distribute_module(other, plan, x, mode="dtensor")


def test_nearest_placements_leave_whole_the_splits_without_a_form():
    """A fused QKV weight (64, 3, 64) split by heads inside each of q, k and v has no DTensor
    form on the module's (64, 192): that mesh dim is left whole, the others kept; placements
    that have a form are unchanged."""
    qkv, fused = (64, 3, 64), (64, 192)
    assert nearest_placements(["Replicate()", "Shard(2)"], (2, 2), qkv, fused, (0, 1)) == (
        "Replicate()",
        "Replicate()",
    )
    assert nearest_placements(["Shard(2)", "Shard(0)"], (2, 2), qkv, fused, (0, 1)) == (
        "Replicate()",
        "Shard(0)",
    )
    with pytest.raises(taps.TapsError, match="no DTensor form"):
        framework_placements(["Shard(2)", "Shard(0)"], (2, 2), qkv, fused, (0, 1))
    # The split of the 3 is the top factor of the 192: it has a form, kept.
    for texts in (["Shard(1)", "Shard(0)"], ["Partial()", "Shard(1)"]):
        assert nearest_placements(texts, (2, 2), qkv, fused, (0, 1)) == framework_placements(
            texts, (2, 2), qkv, fused, (0, 1)
        )


@pytest.mark.parametrize(
    ("factory", "mode"),
    [
        ("gpt2", "dtensor"),  # the fused QKV split by heads, left whole for DTensor
        ("falcon", "dtensor"),  # lift_fresh_copy of a constant table
        ("bert", "taps"),  # training dropout of partial sums
    ],
)
def test_distribute_module_runs_the_families(factory, mode):
    """The forward of a family runs on the fake process group in the mode where DTensor
    refused it before, its output in the placements of the operator that makes it."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import torch_factories

    module, inputs = getattr(torch_factories, factory)()
    module.train()
    graph = from_torch(module, *inputs)
    plan = taps.search(graph, taps.Cluster(1, 4)).plan
    dt = to_dtensor(plan, module)
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        mesh = DeviceMesh(
            "cpu", torch.arange(4).reshape(dt.mesh.shape), mesh_dim_names=dt.mesh.axis_names
        )
        out = distribute_module(module, plan, *inputs, mesh=mesh, mode=mode)(*inputs)
    finally:
        tdist.destroy_process_group()
    logits = out if isinstance(out, torch.distributed.tensor.DTensor) else out[0]
    assert logits.shape[:2] == inputs[0].shape


#: Convnet families whose forward runs under real DTensor (mode="dtensor"): every convolution
#: given the nearest placements DTensor's rule computes right (docs/export.md).
CONVNETS = ["tv_resnet", "tv_mobilenet_v3", "timm_convnext"]

#: Transformer families whose attention (or batched matmul) taps splits along its heads over
#: both mesh dims, which DTensor's own propagation cannot unflatten (a ``_StridedShard``), or
#: whose causal attention builds a plain mask inside DTensor (torchtitan's Llama): run on each
#: rank's blocks (taps.export.batched; docs/export.md).
HEADS_OVER_MESH_DIMS = [
    "albert",
    "clip",
    "clip_vision",
    "tv_vit",
    "swin",
    "timm_swin",
    "tv_swin",
    "torchtitan_llama",
]


@pytest.mark.parametrize("factory", CONVNETS + HEADS_OVER_MESH_DIMS)
def test_dtensor_mode_runs_families_on_gloo(factory, tmp_path):
    """The forward of a family distributed in ``mode="dtensor"`` on 4 gloo ranks equals the
    dense module's, every output (a convnet: DTensor's convolution rule, given a split weight
    or input channels, labels the local block as the whole output; a transformer: DTensor
    stopped inside attention; the run stopped, or went on wrong, before)."""
    from taps.verify.torch.ranks import run_ranks

    with open(tmp_path / "payload.pkl", "wb") as f:
        pickle.dump((factory, str(tmp_path)), f)
    run_ranks("dtensor_ranks", str(tmp_path), 4)
    errors = json.loads((tmp_path / "errors.json").read_text())
    assert errors["output"] < 1e-4, errors
