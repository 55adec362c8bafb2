"""Batched matmul and attention split along their batch dims only, run on each rank's blocks
(:mod:`taps.export.batched`): wherever :func:`batch_split` admits placements, every rank's op on
its blocks (cut by DTensor itself, on the fake process group as that rank) equals its block of
the dense result in the output placements it names; and the splits it refuses are unsound."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from taps.errors import ExportError
from taps.export import distribute_module
from taps.export.batched import ATTENTION_FREE, MATMUL_FREE, batch_split
from taps.export.distribute import export_module
from taps.export.draws import drawing
from taps.export.dtensor import PARTIAL, REPLICATE, DTensorPlacements, placement_objects
from taps.frontends import from_torch
from taps.plan.mesh import Mesh

MESHES = [(2, 2), (4,)]


def _blocks(tensors, placements, mesh_shape):
    """Per rank of a 4-rank fake process group, each tensor's block in its placements
    (DTensor's own cut: ``distribute_tensor`` of the whole, which the fake group does not
    communicate)."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    out = []
    for rank in range(4):
        tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            mesh = DeviceMesh("cpu", torch.arange(4).reshape(mesh_shape))
            out.append(
                [
                    distribute_tensor(x, mesh, placement_objects(p), src_data_rank=None).to_local()
                    for x, p in zip(tensors, placements)
                ]
            )
        finally:
            tdist.destroy_process_group()
    return out


def _check(fn, operands, placements, mesh_shape, grouped=False, free=()):
    """:func:`batch_split` of the operands; where it admits them, ``fn`` on every rank's blocks
    (in the placements it reads them in) equals that rank's block of ``fn`` on the whole."""
    split = batch_split([tuple(x.shape) for x in operands], placements, mesh_shape, grouped, free)
    if split is None:
        return None
    read, out = split
    whole = fn(*operands)
    for blocks, (want,) in zip(
        _blocks(operands, read, mesh_shape), _blocks([whole], [out], mesh_shape)
    ):
        torch.testing.assert_close(fn(*blocks), want)
    return split


@st.composite
def _placements(draw, shapes, mesh_shape):
    """Per operand a placement per mesh dim: some mesh dims split one batch dim of the output
    wherever the operands hold it (or leave it whole), the rest anything."""
    batches = [s[:-2] for s in shapes]
    rank = max(len(b) for b in batches)
    out = [[REPLICATE] * len(mesh_shape) for _ in shapes]
    for m in range(len(mesh_shape)):
        if rank and draw(st.booleans()):
            o = draw(st.integers(0, rank - 1))
            for k, b in enumerate(batches):
                d = o - (rank - len(b))
                if d >= 0 and draw(st.booleans()):
                    out[k][m] = f"Shard({d})"
        else:
            for k, s in enumerate(shapes):
                choices = [REPLICATE, PARTIAL, *(f"Shard({d})" for d in range(len(s)))]
                out[k][m] = draw(st.sampled_from(choices))
    return [tuple(p) for p in out]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_matmul_on_blocks_equals_its_block_of_the_whole(data):
    mesh_shape = data.draw(st.sampled_from(MESHES))
    batch = data.draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3))
    other = [data.draw(st.sampled_from([1, b])) for b in batch]
    other = other[data.draw(st.integers(0, len(other))) :]  # fewer batch dims broadcast too
    n, k, m = (data.draw(st.sampled_from([2, 4])) for _ in range(3))
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(*batch, n, k, generator=gen, dtype=torch.float64)
    b = torch.randn(*other, k, m, generator=gen, dtype=torch.float64)
    placements = data.draw(_placements([a.shape, b.shape], mesh_shape))
    _check(torch.matmul, [a, b], placements, mesh_shape, free=MATMUL_FREE)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_attention_on_blocks_equals_its_block_of_the_whole(data):
    mesh_shape = data.draw(st.sampled_from(MESHES))
    b, h = data.draw(st.sampled_from([1, 2, 4])), data.draw(st.sampled_from([2, 4]))
    heads_kv = data.draw(st.sampled_from([h, 2])) if h == 4 else h
    length, keys, e = 4, data.draw(st.sampled_from([2, 4])), 4
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, length, e, generator=gen, dtype=torch.float64)
    k = torch.randn(b, heads_kv, keys, e, generator=gen, dtype=torch.float64)
    v = torch.randn(b, heads_kv, keys, e, generator=gen, dtype=torch.float64)
    operands = [q, k, v]
    if data.draw(st.booleans()):
        mask_shape = (data.draw(st.sampled_from([1, b])), data.draw(st.sampled_from([1, h])))
        operands.append(torch.randn(*mask_shape, length, keys, generator=gen, dtype=torch.float64))
    causal = len(operands) == 3 and data.draw(st.booleans())
    grouped = heads_kv != h

    def attend(*xs):
        mask = xs[3] if len(xs) > 3 else None
        return F.scaled_dot_product_attention(
            *xs[:3], attn_mask=mask, is_causal=causal, enable_gqa=grouped
        )

    placements = data.draw(_placements([x.shape for x in operands], mesh_shape))
    _check(attend, operands, placements, mesh_shape, grouped, () if causal else ATTENTION_FREE)


def test_heads_split_over_both_mesh_dims_run_on_blocks():
    """The families' case (ALBERT, CLIP, ViT, the Swins): heads over both dims of a 2 x 2 mesh,
    the mask broadcast along them and replicated, read as it is; a replicated batch of the
    mask is cut to the query's split batch."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 4, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(2, 1, 4, 4, generator=gen, dtype=torch.float64)
    heads = ("Shard(1)", "Shard(1)")
    whole = (REPLICATE, REPLICATE)

    def attend(*xs):
        return F.scaled_dot_product_attention(*xs[:3], attn_mask=xs[3])

    read, out = _check(attend, [q, k, v, mask], [heads, heads, heads, whole], (2, 2))
    assert out == heads and read[3] == whole
    batch = ("Shard(0)", "Shard(1)")
    read, out = _check(attend, [q, k, v, mask], [batch, batch, batch, whole], (2, 2))
    assert out == batch and read[3] == ("Shard(0)", REPLICATE)
    # Swin's: heads on one mesh dim, the query length on the other (keys whole there), the
    # mask split along its query length; or the mask alone split there, the query cut to it.
    rows = ("Shard(1)", "Shard(2)")
    kv = ("Shard(1)", REPLICATE)
    free = ATTENTION_FREE
    read, out = _check(
        attend, [q, k, v, mask], [rows, kv, kv, (REPLICATE, "Shard(2)")], (2, 2), free=free
    )
    assert out == rows and read[0] == rows and read[3] == (REPLICATE, "Shard(2)")
    read, out = _check(
        attend, [q, k, v, mask], [kv, kv, kv, (REPLICATE, "Shard(2)")], (2, 2), free=free
    )
    assert out == rows and read[0] == rows
    assert (
        batch_split(
            [q.shape, k.shape, v.shape, mask.shape], [rows, rows, kv, kv], (2, 2), free=free
        )
        is None
    )


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        (("Shard(3)",), ("Shard(2)",), "the contracted dim: partial sums"),
        (("Shard(2)",), (REPLICATE,), "the rows of a matrix dim"),
        ((PARTIAL,), (REPLICATE,), "partial sums"),
        (("Shard(1)",), ("Shard(0)",), "two batch dims on one mesh dim"),
        ((REPLICATE,), ("Shard(0)",), "a broadcast dim split"),
    ],
)
def test_refused_splits_are_no_batch_split(a, b, why):
    """A split that is no split of batch dims alone (one whose blocks need communication, or
    placements that contradict each other) is refused: DTensor runs the node."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, 4, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(1, 4, 4, 4, generator=gen, dtype=torch.float64) if "broadcast" in why else x
    assert batch_split([x.shape, y.shape], [a, b], (4,)) is None, why


#: A 2 x 2 mesh (taps' names: ``d1`` the outer axis, on rank bit 1).
MESH = Mesh((2, 2), ("d1", "d0"), ((1, 2), (0, 1)))
HEADS = ("Shard(1)", "Shard(1)")


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


class _Matmul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def _heads_everywhere(module, *inputs):
    """Placements splitting dim 1 (the heads) of every tensor and operand of ``module``'s
    graph over both dims of :data:`MESH`."""
    graph = from_torch(module, *inputs)
    tensors = {t: HEADS for t in graph.tensors}
    operators = {
        op.name: {"inputs": [HEADS for _ in op.inputs], "output": HEADS} for op in graph.ops
    }
    return DTensorPlacements(MESH, tensors, operators)


def test_attention_dropout_on_blocks_is_the_dense_runs():
    """Attention that drops weights, heads over both mesh dims (DTensor stopped on it): every
    rank's output block is its block of the dense module's output under ``drawing`` with the
    run's seed (each rank drops its block of the step's one mask), and no collective is
    issued."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    module = _Attention().train()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 8, generator=gen) for _ in range(3))
    placements = _heads_everywhere(module, q, k, v)
    exported = export_module(module, q, k, v)
    with drawing(3):
        want = module(q, k, v)
    for rank in range(4):
        tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))
            dm = distribute_module(
                module, placements, q, k, v, mesh=mesh, exported=exported, seed=3
            )
            with CommDebugMode() as comm:
                got = dm(q, k, v)
            assert comm.get_total_counts() == 0  # run on the blocks: nothing moves
            block = distribute_tensor(want, mesh, got.placements, src_data_rank=None).to_local()
        finally:
            tdist.destroy_process_group()
        assert [str(p) for p in got.placements] == [str(p) for p in placement_objects(HEADS)]
        torch.testing.assert_close(got.to_local(), block)


def test_a_node_dtensor_cannot_run_is_one_export_error(fake_pg):
    """Six heads over four ranks is no even split: left to DTensor, whose unflatten refuses it,
    which is one ExportError naming the node and its arguments' placements."""
    from torch.distributed.device_mesh import DeviceMesh

    module = _Matmul()
    a, b = torch.randn(2, 6, 8, 8), torch.randn(2, 6, 8, 8)
    placements = _heads_everywhere(module, a, b)
    mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))
    dm = distribute_module(module, placements, a, b, mesh=mesh)
    with pytest.raises(ExportError, match=r"^node matmul \(matmul\): DTensor cannot run it on "):
        dm(a, b)


@pytest.fixture
def fake_pg():
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield
    tdist.destroy_process_group()
