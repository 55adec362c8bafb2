"""torch's FSDP2 on the plan's sharded storage: ``taps.export.fsdp.fully_shard_plan`` shards the
modules of a real transformers Llama whose parameters the plan stores sharded, on the fake process
group, and the collectives ``fully_shard`` issues in a forward and backward (read as they are
dispatched) are taps' prediction: per sharded parameter two all_gathers of its weight and a
reduce_scatter of its gradient, of the group size and bytes taps prices; the DTensor and JAX
exports place those parameters as stored (``Shard(0)`` on the group's mesh dims)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import tempfile
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

import taps
from fsdp_collectives import edge_collectives, megatron_plan, predicted
from taps.export.fsdp import fully_shard_plan
from taps.export.storage import stored_groups
from taps.plan.candidates import Candidate, strategies_for
from taps.verify.torch.ranks import run_ranks
from torch_models import llama

WORLD = 4
KINDS = {"_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter"}
#: DTensor's collectives (tensor parallelism) by their functional op, with their group's arg.
FUNCTIONAL = {"all_reduce": ("all_reduce", 2)}


class _Collectives(TorchDispatchMode):
    """Every c10d collective dispatched: kind, group size (the whole tensor's elements over the
    shard's) and bytes of the whole tensor (the gathered output, the scattered input)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in KINDS:
            whole, shard = args[:2] if name == "_allgather_base_" else args[1::-1]
            group = whole.numel() // shard.numel()
            self.seen.append((KINDS[name], group, whole.numel() * whole.element_size()))
        elif "_c10d_functional" in str(func) and name in FUNCTIONAL:
            kind, at = FUNCTIONAL[name]
            group = dist.distributed_c10d._resolve_process_group(args[at]).size()
            self.seen.append((kind, group, args[0].numel() * args[0].element_size()))
        elif "c10d" in str(func) and not any(
            w in str(func) for w in ("barrier", "wait_tensor", "_wrap_tensor_autograd")
        ):
            raise AssertionError(f"unexpected collective {func}")
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def fake_group():
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    yield
    dist.destroy_process_group()


def _data_parallel_plan(graph: taps.Graph, cluster: taps.Cluster) -> taps.Plan:
    """Every operator that reads a parameter splits only what leaves the parameter whole (its
    rows), all storing their parameters sharded."""
    chosen = {}
    for op in graph.ops:
        for s in strategies_for(graph, op.name, cluster):
            cand = Candidate.of(op, s)
            params = [
                lay
                for o, lay in zip(op.inputs, cand.inputs)
                if graph.root(o.tensor).kind == "parameter"
            ]
            if all(m < 0 for lay in params for m in lay.tensor_map):
                chosen[op.name] = s
                break
    return taps.Plan(graph, cluster, chosen, taps.Pricing(fsdp=True))


@pytest.fixture(scope="module")
def llama_plan():
    module, ids = llama()
    return module, ids, _data_parallel_plan(taps.from_torch(module, ids), taps.Cluster(1, WORLD))


def test_fully_shard_issues_the_gathers_and_scatters_taps_prices(fake_group, llama_plan):
    module, ids, plan = llama_plan
    want = predicted(plan, ("all_gather", "reduce_scatter"))
    module.to_empty(device="cpu")
    mesh = torch.distributed.device_mesh.init_device_mesh(
        "cpu",
        taps.export.to_dtensor(plan).mesh.shape,
        mesh_dim_names=taps.export.to_dtensor(plan).mesh.axis_names,
    )
    sharded = fully_shard_plan(module, plan, mesh)
    params = {n for n, _ in module.named_parameters()}
    assert set(stored_groups(plan)) == params  # every parameter, data parallel
    assert len(sharded) == len(params)  # one parameter per module in Llama
    record = _Collectives()
    with record:
        module(ids).sum().backward()
    seen = Counter(record.seen)
    assert seen == want
    assert sum(n for (k, _, _), n in seen.items() if k == "all_gather") == 2 * len(params)


def test_the_exports_place_stored_parameters_sharded(llama_plan):
    plan = llama_plan[2]
    placements = taps.export.to_dtensor(plan)
    specs = taps.export.to_jax(plan)
    axes = placements.mesh.axis_names
    for name in stored_groups(plan):
        assert placements.tensors[name] == ("Shard(0)",) * len(axes), name
        first = specs.tensors[name][0]
        assert (first if isinstance(first, tuple) else (first,)) == axes, name
    unsharded = taps.export.to_dtensor(plan.with_pricing(taps.Pricing()))
    assert all(set(unsharded.tensors[n]) == {"Replicate()"} for n in stored_groups(plan))


@pytest.fixture(scope="module")
def megatron():
    module, ids = llama()
    return module, ids, megatron_plan(taps.from_torch(module, ids), taps.Cluster(2, 2))


def test_fsdp_with_tensor_parallelism_issues_taps_collectives(fake_group, megatron):
    """2-D: FSDP over the data-parallel mesh dim, Megatron's column and row splits over the
    other; torch issues FSDP's gathers and scatters of the local tensor-parallel shards and
    tensor parallelism's all-reduces (one per row split forward, one per column split's input
    gradient), each of taps' kind, group and bytes."""
    module, ids, plan = megatron
    want = predicted(plan) + edge_collectives(plan)
    module = copy.deepcopy(module).to_empty(device="cpu")  # the fixture's stays on meta
    placements = taps.export.to_dtensor(plan)
    mesh = torch.distributed.device_mesh.init_device_mesh(
        "cpu", placements.mesh.shape, mesh_dim_names=placements.mesh.axis_names
    )
    applied = fully_shard_plan(module, plan, mesh)
    styles = Counter(a.style for a in applied.values())
    assert styles == {"colwise": 10, "rowwise": 4, None: 6}  # 2 layers; embedding, 5 norms
    assert {a.mesh_axes for a in applied.values()} == {("d1",)}
    assert {a.tp_axes for a in applied.values() if a.style} == {("d0",)}
    local = ids[: ids.shape[0] // 2]  # this rank's batch (data parallel over d1)
    record = _Collectives()
    with record:
        module(local).sum().backward()
    seen = Counter(record.seen)
    assert seen == want
    assert seen[("all_reduce", 2, local.numel() * 64 * 4)] == 2 * 7  # per layer: 2 + 5


def test_fsdp_with_tensor_parallelism_on_gloo_equals_the_dense_module(megatron):
    """The same 2-D application on 4 gloo ranks (2 x 2): the output and every parameter's
    gradient (gathered from its 2-D shards) equal the dense module's."""
    module, ids, plan = megatron
    with tempfile.TemporaryDirectory(prefix="taps-fsdp-tp-") as tmp:
        with open(os.path.join(tmp, "payload.pkl"), "wb") as f:
            pickle.dump((module, ids, plan.to_json(), tmp), f)
        run_ranks("fsdp_tp_ranks", tmp, 4)
        with open(os.path.join(tmp, "errors.json")) as f:
            errors = json.load(f)
    names = {f"grad {n}" for n, _ in module.named_parameters()}
    assert names | {"output 0"} == set(errors)
    assert max(errors.values()) < 1e-5, errors


@pytest.mark.parametrize(
    ("weight", "message"),
    [([0, 1], "split along dims \\[0, 1\\] of a Linear"), ([-1, 0], "not Megatron-style")],
    ids=["both-dims", "row-split-of-a-replicated-input"],
)
def test_a_plan_the_local_forward_cannot_run_is_refused(megatron, weight, message):
    """A query projection split along both weight dims, or along its input features while its
    input is replicated there (the module's own forward on local blocks would compute something
    else): one ExportError line, before any process group is touched."""
    module, _, plan = megatron
    op = plan.graph.op("model.layers.0.self_attn.q_proj")
    chosen = dict(plan.strategies)
    chosen[op.name] = next(
        s
        for s in strategies_for(plan.graph, op.name, plan.cluster, replicas=True)
        if list(Candidate.of(op, s).inputs[1].tensor_map) == weight
        and list(Candidate.of(op, s).inputs[1].device_matrix) == [2, 2]
    )
    bad = taps.Plan(plan.graph, plan.cluster, chosen, plan.pricing)
    with pytest.raises(taps.export.ExportError, match=message):
        fully_shard_plan(module, bad, mesh=None)
