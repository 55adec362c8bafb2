"""taps' plans run on PyTorch DTensor: every collective on the fake process group at the full
world size against taps' prediction, the numbers on 4 gloo ranks against the dense module, and
the placements of a framework tensor that views a graph tensor against DTensor's own arithmetic."""

from __future__ import annotations

import itertools
import json
import math
import sys

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import taps
from taps.cli import main
from taps.export import ExportError, layout_placements, mesh_for
from taps.export.distribute import framework_placements
from taps.frontends.torch import from_torch
from taps.verify import VerifyError, verify_torch
from taps.verify.result import OK
from test_frontend_torch import Block

torch_utils = pytest.importorskip("torch.distributed.tensor._utils")
dtensor = pytest.importorskip("torch.distributed.tensor")


def plain_mlp() -> tuple[nn.Module, torch.Tensor]:
    """A factory for ``taps verify --torch``: an MLP without biases (taps prices a bias gradient
    over too many devices, see test_a_bias_gradient_is_priced_over_too_many_devices)."""
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Linear(64, 256, bias=False), nn.ReLU(), nn.Linear(256, 64, bias=False)
    )
    return module, torch.randn(32, 64)


def block() -> tuple[nn.Module, torch.Tensor]:
    """A GPT-2-like pre-norm block (tests/test_frontend_torch.py), tokens as rows."""
    torch.manual_seed(0)
    return Block(hidden=64, heads=4, batch=8), torch.randn(8 * 16, 64, requires_grad=True)


def _verify(factory, nodes, per_node, pricing=None, **kwargs):
    module, x = factory()
    graph = from_torch(module, x)
    plan = taps.search(graph, taps.Cluster(nodes, per_node), pricing or taps.Pricing()).plan
    return verify_torch(module, [x], plan, **kwargs)


def _exact(result):
    assert result.ok, result.mismatches
    ok = [c for c in result.collectives if c.status == OK]
    assert ok and all(c.predicted_bytes == c.measured_bytes for c in ok)
    assert {c.phase for c in ok} == {"forward", "backward"}
    return ok


def test_mlp_on_64_devices_moves_the_predicted_bytes():
    ok = _exact(_verify(plain_mlp, 8, 8, numerics=None))
    assert any(c.kind != "all_reduce" for c in ok)  # a redistribution, not only gradients


@pytest.mark.parametrize("nodes", [2, 8])
def test_gpt2_block_moves_the_predicted_bytes(nodes):
    """On 16 and on 64 devices (a six-dim mesh: every bit of the rank cut somewhere)."""
    result = _verify(block, nodes, 8, numerics=None)
    ok = _exact(result)
    kinds = {c.kind for c in ok}
    assert {"all_to_all", "all_gather", "all_reduce"} <= kinds
    assert result.engine == "torch" and result.num_devices == 8 * nodes


def test_gpt2_block_numbers_on_4_gloo_ranks():
    """The whole verification at world 4: collectives on the fake process group, and outputs and
    every gradient (parameters and the input) on 4 gloo processes against the dense block."""
    result = _verify(block, 1, 4, numerics=4)
    _exact(result)
    module, _ = block()
    names = {f"grad {k}" for k, _ in module.named_parameters()} | {"grad x", "output 0"}
    assert set(result.errors) == names
    assert 0 < result.max_error <= result.tolerance  # sums in another order, not bit-equal


def test_a_bias_gradient_is_priced_over_too_many_devices():
    """In the paper's model, as on XLA (docs/verify.md): the bias is added after the forward
    partial sums, so its gradient is partial over fewer devices than taps prices."""

    def biased():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)), torch.randn(32, 64)

    result = _verify(biased, 2, 8, taps.Pricing(step="forward"), numerics=None)
    assert not result.ok
    (row,) = [c for c in result.collectives if c.status != OK and "bias" in c.what]
    # The engine reduces it over fewer devices, or (its block summed where it is added) not at all.
    assert row.status in ("differs", "missing")
    assert (row.measured_bytes or 0) < row.predicted_bytes


def test_a_wrong_prediction_is_reported(monkeypatch):
    """Every prediction off by a factor of two: nothing matches, every row is a mismatch."""
    import dataclasses

    from taps.verify.torch import engine

    real = engine.predicted_collectives

    def doubled(*args):
        return [dataclasses.replace(p, bytes=2 * p.bytes) for p in real(*args)]

    monkeypatch.setattr(engine, "predicted_collectives", doubled)
    result = _verify(plain_mlp, 2, 8, numerics=None)
    assert not result.ok
    predicted = [c for c in result.collectives if c.predicted_bytes is not None]
    assert predicted and all(c.status == "differs" for c in predicted)
    assert len(result.mismatches) == len(predicted)


def test_cli_torch_engine(tmp_path, capsys):
    out = tmp_path / "v.json"
    argv = ["verify", "--torch", "test_verify_torch:plain_mlp", "--nodes", "2"]
    argv += ["--devices-per-node", "8", "--engine", "torch", "--gloo", "0", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and doc["engine"] == "torch" and doc["num_devices"] == 16
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mlp", "--engine", "tpu"], "unknown engine 'tpu': expected xla or torch"),
        (["mlp", "--engine", "torch"], "the torch engine runs a torch module"),
        (["--torch", "test_verify_torch:plain_mlp", "--engine", "torch", "--gspmd"], "--gspmd"),
        # Was ignored without a word.
        (["mlp", "--gloo", "8"], "--gloo sets the gloo ranks of the torch engine's numerics"),
    ],
)
def test_cli_bad_input_is_one_line(argv, message, capsys):
    code = main(["verify", *argv, "--nodes", "1", "--devices-per-node", "4"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("gloo", ["3", "-4", "16"])
def test_cli_gloo_ranks_are_checked_before_any_work(gloo, capsys, monkeypatch):
    """Before: refused by the numerics run, after the search and the collectives had run."""
    import taps.cli.verify as cli

    monkeypatch.setattr(cli, "search", lambda *a, **k: pytest.fail("searched"))
    argv = ["--torch", "test_verify_torch:plain_mlp", "--engine", "torch", "--gloo", gloo]
    code = main(["verify", *argv, "--nodes", "1", "--devices-per-node", "4"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--gloo: a numerics run takes 4 or 8 ranks, not {gloo}" in err


def test_torch_missing_names_the_extra(monkeypatch):
    module, x = plain_mlp()
    graph = from_torch(module, x)
    plan = taps.search(graph, taps.Cluster(1, 4)).plan
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(taps.MissingExtraError, match=r"taps\[torch\]"):
        verify_torch(module, [x], plan, numerics=None)


def test_a_numerics_run_takes_4_or_8_ranks():
    module, x = plain_mlp()
    plan = taps.search(from_torch(module, x), taps.Cluster(1, 4)).plan
    with pytest.raises(VerifyError, match="takes 4 or 8 ranks, not 3"):
        verify_torch(module, [x], plan, numerics=3)
    # Checked before the collectives run (they were, before the numbers were refused).
    with pytest.raises(TypeError, match="verify_torch: the numerics' ranks must be an int"):
        verify_torch(None, [x], plan, numerics=4.0)


def test_a_search_result_is_not_a_plan():
    """The plan is the search result's ``.plan``: the result itself is refused in one line."""
    module, x = plain_mlp()
    result = taps.search(from_torch(module, x), taps.Cluster(1, 4))
    with pytest.raises(TypeError, match=r"verify_torch takes a taps\.Plan .*, got SearchResult"):
        verify_torch(module, [x], result, numerics=None)


# -- placements through a reshape, against DTensor's arithmetic ----------------------------------


@st.composite
def _reshaped_layouts(draw):
    """A graph tensor shape, an operand shape that merges runs of its dims, and a layout of the
    operand on up to 16 devices."""
    graph = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4))
    cuts = sorted(c for c in draw(st.sets(st.integers(1, 3))) if c < len(graph))
    bounds = [0, *cuts, len(graph)]
    operand = [math.prod(graph[a:b]) for a, b in itertools.pairwise(bounds)]
    device_matrix = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3))
    dims = list(range(len(device_matrix)))
    tensor_map = [draw(st.sampled_from([-1, *dims])) for _ in operand]
    assume(len({m for m in tensor_map if m >= 0}) == sum(m >= 0 for m in tensor_map))
    for d, m in zip(operand, tensor_map):
        assume(m < 0 or d % device_matrix[::-1][m] == 0)
    return graph, taps.Layout(operand, device_matrix, tensor_map)


def _elements(shape, index):
    full = np.arange(math.prod(shape)).reshape(shape)
    return np.sort(full[tuple(slice(lo, hi) for lo, hi in index)].ravel())


def _dtensor_elements(graph, mesh_shape, placements, r):
    coord = [int(c) for c in np.unravel_index(r, mesh_shape)]
    size, offset = torch_utils._compute_local_shape_and_global_offset(
        list(graph), list(mesh_shape), coord, placements
    )
    return _elements(graph, [(o, o + s) for o, s in zip(offset, size)])


@settings(max_examples=200, deadline=None)
@given(_reshaped_layouts())
def test_framework_placements_hold_the_taps_blocks(case):
    """When the placements exist, every rank's DTensor block of the framework tensor holds
    exactly the elements taps' layout gives it on the operand; when they do not, no placement
    list on the framework shape does."""
    graph, layout = case
    mesh = mesh_for([layout], layout.num_devices)
    texts = layout_placements(mesh, layout)
    want = [_elements(layout.shape, layout.shard_index(r)) for r in range(layout.num_devices)]

    def holds(placements):
        return all(
            np.array_equal(_dtensor_elements(graph, mesh.shape, placements, r), want[r])
            for r in range(layout.num_devices)
        )

    try:
        ours = framework_placements(texts, mesh.shape, layout.shape, graph, range(len(graph)))
    except ExportError:
        options = [dtensor.Replicate(), *(dtensor.Shard(i) for i in range(len(graph)))]
        assert not any(holds(list(p)) for p in itertools.product(options, repeat=len(mesh.shape)))
        return
    assert holds([dtensor.Shard(int(p[6:-1])) if p.startswith("Shard") else dtensor.Replicate()
                  for p in ours])  # fmt: skip


# -- taps' steps as PyTorch collectives, on gloo --------------------------------------------------

#: Redistributions on 4 ranks, from partial sums too: (source, target, planner).
_PAIRS = [
    (taps.Layout([8, 4], [2, 2], [-1, -1], [0]), taps.Layout([8, 4], [2, 2], [0, -1]), "optimal"),
    (taps.Layout([8, 4], [2, 2], [1, -1], [0]), taps.Layout([8, 4], [2, 2], [1, -1]), "optimal"),
    (taps.Layout([8, 4], [2, 2], [0, 1]), taps.Layout([8, 4], [2, 2], [1, 0]), "paper"),
    (taps.Layout([8, 8], [4], [0, -1]), taps.Layout([8, 8], [2, 2], [-1, 1]), "paper"),
]


def _steps_rank(rank, tmp):
    import warnings

    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh

    from taps.steps.torch import Steps

    tdist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=4)
    # torch's deprecated collectives (all_gather_tensor) warn: the steps use the supported ones
    warnings.simplefilter("error", FutureWarning)
    try:
        for i, (a, b, planner) in enumerate(_PAIRS):
            plan = taps.plan_redistribution(a, b, planner=planner)
            mesh = mesh_for([a, b, *(op.layout for op in plan.all_ops)], 4)
            steps = Steps(mesh, init_device_mesh("cpu", mesh.shape, mesh_dim_names=mesh.axis_names))
            full = np.arange(math.prod(a.shape), dtype=np.float32).reshape(a.shape)
            block = full[tuple(slice(lo, hi) for lo, hi in a.shard_index(rank))]
            # A partial layout's addends: the block on the ranks at coordinate 0 along every
            # partial device dim, zeros on the others.
            sizes = a.device_matrix[::-1]
            strides = [math.prod(sizes[:k]) for k in range(len(sizes))]
            first = all((rank // strides[k]) % sizes[k] == 0 for k in a.partial)
            coeff = 1.0 if first else 0.0
            got = steps.walk(torch.tensor(block * coeff), plan).numpy()
            want = full[tuple(slice(lo, hi) for lo, hi in b.shard_index(rank))]
            np.save(f"{tmp}/{i}.{rank}.npy", got - want.reshape(got.shape))
    finally:
        tdist.destroy_process_group()


def test_taps_steps_move_every_block_on_4_gloo_ranks(tmp_path):
    """taps' plans, from partial sums too (reduce_scatter, all_reduce), as PyTorch collectives on
    4 gloo processes: every rank ends with exactly its block of the target."""
    import torch.multiprocessing as mp

    kinds = {
        op.kind for a, b, p in _PAIRS for op in taps.plan_redistribution(a, b, planner=p).all_ops
    }
    assert {"reduce_scatter", "all_reduce", "all_to_all", "all_gather"} <= kinds
    mp.start_processes(_steps_rank, (str(tmp_path),), nprocs=4, start_method="spawn")
    for i in range(len(_PAIRS)):
        for r in range(4):
            assert not np.any(np.load(tmp_path / f"{i}.{r}.npy")), (i, r)


def test_dtensor_mode_places_every_tensor_as_taps_says():
    """The default mode on the fake process group: DTensor's own redistributions and
    propagation, the parameters and the output in taps' placements."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from taps.export import distribute_module, to_dtensor

    module, x = plain_mlp()
    found = taps.search(from_torch(module, x), taps.Cluster(2, 8)).plan
    plan = to_dtensor(found)
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
    try:
        mesh = DeviceMesh("cpu", torch.arange(16).reshape(plan.mesh.shape))
        dm = distribute_module(module.to("meta"), plan, x.to("meta"), mesh=mesh)
        y = dm(x.to("meta"))
        y.sum().backward()
    finally:
        tdist.destroy_process_group()
    assert list(y.placements) == plan.placements(found.graph.ops[-1].output.tensor)
    for name, p in dm.parameters.items():
        assert list(p.placements) == plan.placements(name)
        assert p.grad is not None and p.grad.shape == p.shape
