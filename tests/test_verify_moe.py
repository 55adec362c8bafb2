"""Expert parallelism run on real engines: a tiny mixture-of-experts layer in the GShard form (the
parameters of torchtitan's MoE, tests/moe_models.py) under taps' expert-parallel plan, its
dispatch and combine all_to_alls read from what XLA compiles and what DTensor dispatches on the
fake process group, and matched to taps' prediction (kind, groups, bytes); its outputs and
gradients against the unsharded run on XLA and on gloo ranks. The routing is fixed: the dispatch
mask the router's top-k chooses, given as an input."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import taps
from moe_models import TitanGShard, gshard_plan, moe_graph, route, titan_moe
from taps.steps.kinds import layout_groups
from taps.verify import collectives, verify, verify_torch

G, S, E, M, H, K = 8, 4, 8, 8, 16, 2
C = S * K // E  # capacity factor 1: balanced routing fills every slot


def _layer() -> tuple[TitanGShard, torch.Tensor, torch.Tensor]:
    """The GShard layer with torchtitan's weights, an input and the routing it chooses."""
    real = titan_moe(E, M, H, K)
    layer = TitanGShard(E, M, H)
    layer.load_state_dict(real.state_dict())
    x = torch.randn(G, S, M, generator=torch.Generator().manual_seed(1)).requires_grad_()
    with torch.no_grad():
        dispatch = route(torch.softmax(layer.router.gate(x), dim=-1), K, C)
    return layer, x, dispatch


def _all_to_alls(rows: list) -> list:
    return [r for r in rows if r.kind == "all_to_all" and r.status != "shared"]


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_the_dispatch_and_combine_all_to_alls_xla_compiles_are_taps_prediction(ep: int) -> None:
    layer, x, dispatch = _layer()
    graph = taps.from_torch(layer, x, dispatch)
    cluster = taps.Cluster(nodes=2, devices_per_node=4)
    plan = gshard_plan(graph, cluster, ep)
    result = verify(plan, values={"dispatch": dispatch.numpy()})
    assert result.ok, result.mismatches
    rows = _all_to_alls(result.collectives)
    # Forward: dispatch (gate and up read one dispatched tensor: XLA moves it once) and combine;
    # backward: the gradients of gate's and up's inputs, each its own, and of combine's.
    assert sorted(r.phase for r in rows) == ["backward"] * 3 + ["forward"] * 2
    # Each moves a device's block of egcm (split over all devices) within its expert group.
    n = cluster.num_devices
    block = E * G * C * M // n * 4
    groups = tuple(tuple(range(i, i + ep)) for i in range(0, n, ep))
    for r in rows:
        assert r.status == "ok"
        assert r.group_size == ep
        assert r.predicted_bytes == r.measured_bytes == block * (ep - 1) // ep
        assert r.measured_groups == groups
        # The expert group sits inside a node up to 4 devices, across nodes beyond.
        assert r.inter_node_groups == (0 if ep <= 4 else n // ep)


def test_the_searched_moe_plan_runs_on_xla_as_predicted() -> None:
    layer, x, dispatch = _layer()
    plan = taps.search(taps.from_torch(layer, x, dispatch), taps.Cluster(2, 4)).plan
    result = verify(plan, values={"dispatch": dispatch.numpy()})
    assert result.ok, result.mismatches
    # The search splits the experts: tokens reach them by all_to_all.
    assert _all_to_alls(result.collectives)


@pytest.mark.parametrize("norm", [False, True])
def test_the_replay_computes_the_real_layer(norm: bool) -> None:
    """The replay's unsharded program is the layer itself: on the routing input and the layer's
    weights, XLA's reference output (checked against the sharded run by ``verify``) is
    torch's; with the top-k weights renormalised too (a division by a sum kept with
    ``keepdim``). Capacity for every token: none is dropped."""
    from taps.verify.xla.program import GraphProgram

    layer = TitanGShard(E, M, H, norm=norm)
    x = torch.randn(G, S, M, generator=torch.Generator().manual_seed(1)).requires_grad_()
    with torch.no_grad():
        dispatch = route(torch.softmax(layer.router.gate(x), dim=-1), K, S * K)
    graph = taps.from_torch(layer, x, dispatch)
    plan = gshard_plan(graph, taps.Cluster(1, 4), 2)
    values = {"x": x.detach().numpy(), "dispatch": dispatch.numpy()}
    values.update({k: p.detach().numpy() for k, p in layer.named_parameters()})
    prog = GraphProgram(plan, values=values)
    outs, _ = prog.reference()
    want = layer(x, dispatch).detach().numpy()
    np.testing.assert_allclose(np.asarray(outs[graph.ops[-1].name]), want, rtol=1e-5, atol=1e-5)


def test_values_name_only_parameters_and_inputs() -> None:
    layer, x, dispatch = _layer()
    plan = gshard_plan(taps.from_torch(layer, x, dispatch), taps.Cluster(1, 4), 2)
    with pytest.raises(taps.VerifyError, match="no parameters or inputs"):
        verify(plan, values={"routing": dispatch.numpy()})
    with pytest.raises(taps.VerifyError, match="has shape"):
        verify(plan, values={"dispatch": dispatch.numpy()[:1]})


def test_the_hlo_reader_reads_an_all_to_all() -> None:
    """An all_to_all XLA compiles from ``shard_map``, read back: kind, groups, bytes received
    (``(g - 1) / g`` of what a device puts in)."""
    from jax.sharding import Mesh, PartitionSpec

    devices = np.array(jax.devices()[:8]).reshape(2, 4)
    mesh = Mesh(devices, ("node", "expert"))

    def body(x: jax.Array) -> jax.Array:
        return jax.lax.all_to_all(x, "expert", 0, 1, tiled=True)

    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=PartitionSpec(None, ("node", "expert")),
        out_specs=PartitionSpec(None, ("node", "expert")),
    )
    x = np.zeros((16, 64), np.float32)
    (row,) = collectives(jax.jit(fn).lower(x).compile().as_text(), 8)
    assert row.kind == "all_to_all"
    assert row.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    in_bytes = 16 * 64 // 8 * 4
    assert (row.in_bytes, row.bytes) == (in_bytes, in_bytes * 3 // 4)


def test_the_all_to_alls_dtensor_dispatches_are_taps_prediction() -> None:
    """On the fake process group at the full world size (meta tensors): every collective taps'
    steps dispatch for the expert-parallel plan is predicted, all_to_alls included (on GPUs
    they run as all_to_all; gloo has none, so a CPU rank would gather)."""
    layer, x, dispatch = _layer()
    cluster = taps.Cluster(nodes=2, devices_per_node=4)
    plan = gshard_plan(taps.from_torch(layer, x, dispatch), cluster, 4)
    result = verify_torch(layer, [x, dispatch], plan, numerics=None)
    assert result.ok, result.mismatches
    rows = [r for r in result.collectives if r.kind == "all_to_all"]
    # torch runs the dispatch once per reader (gate and up), XLA once.
    assert len(rows) == 6
    block = E * G * C * M // cluster.num_devices * 4
    want_groups = layout_groups(taps.Layout([8], [2, 4], [0]), [0])
    for r in rows:
        assert r.status == "ok"
        assert r.group_size == 4
        assert r.measured_bytes == r.predicted_bytes == block * 3 // 4
        assert r.measured_groups == want_groups


def test_the_moe_plan_on_gloo_equals_the_unsharded_layer() -> None:
    """Four gloo ranks run taps' expert-parallel plan (2 data x 2 expert): the output and every
    gradient equal the dense layer's."""
    layer, x, dispatch = _layer()
    plan = gshard_plan(taps.from_torch(layer, x, dispatch), taps.Cluster(1, 4), 2)
    result = verify_torch(layer, [x, dispatch], plan, numerics=4)
    assert result.ok, (result.mismatches, result.errors)
    names = {f"grad {n}" for n, _ in layer.named_parameters()} | {"output 0", "grad x"}
    assert names <= set(result.errors)
    assert max(result.errors.values()) < 1e-5


# -- the MoE operators of the front ends (moe_route, moe_dispatch, moe_expert, moe_combine) ------


def _plain_moe(values: dict[str, np.ndarray], k: int) -> np.ndarray:
    """The layer of :func:`moe_graph` token by token: token ``t``'s choice ``j`` is expert
    ``(t k + j) mod e`` (the replay's balanced routing), weighted by its router probability."""
    x = values["x"]
    gate = values["router.gate.weight"]
    inner = "routed_experts.inner_experts"
    w1, w2, w3 = (values[f"{inner}.{w}"] for w in ("w1_EFD", "w2_EDF", "w3_EFD"))
    out = np.zeros_like(x)
    for gi in range(x.shape[0]):
        for t in range(x.shape[1]):
            logits = gate @ x[gi, t]
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            for j in range(k):
                e = (t * k + j) % gate.shape[0]
                a, b = w1[e] @ x[gi, t], w3[e] @ x[gi, t]
                out[gi, t] += probs[e] * (w2[e] @ (a / (1 + np.exp(-a)) * b))
    return out


def test_the_moe_operators_replay_the_layer() -> None:
    """The replay of taps' MoE operators (a fixed balanced routing at ``moe_route``, a
    gather at ``moe_dispatch``, SwiGLU experts) computes the layer as a plain token loop does."""
    from taps.verify.xla.program import GraphProgram

    graph = moe_graph()
    rng = np.random.default_rng(3)
    values = {
        n: rng.standard_normal(t.shape).astype(np.float32)
        for n, t in graph.tensors.items()
        if t.kind in ("parameter", "input")
    }
    prog = GraphProgram(gshard_plan(graph, taps.Cluster(1, 4), 2), values=values)
    outs, _ = prog.reference()
    np.testing.assert_allclose(
        np.asarray(outs["combine"]), _plain_moe(values, K), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("ep", [4, 8])
def test_the_moe_operators_all_to_alls_are_taps_prediction(ep: int) -> None:
    result = verify(gshard_plan(moe_graph(), taps.Cluster(2, 4), ep))
    assert result.ok, result.mismatches
    rows = _all_to_alls(result.collectives)
    # Forward the dispatch (read by w1 and w3 in one layout: once) and the combine; backward the
    # gradients of w1's, w3's and the combine's inputs.
    assert sorted(r.phase for r in rows) == ["backward"] * 3 + ["forward"] * 2
    block = E * G * C * M // 8 * 4
    for r in rows:
        assert (r.group_size, r.measured_bytes) == (ep, block * (ep - 1) // ep)
        assert r.inter_node_groups == (0 if ep <= 4 else 1)


def test_the_routing_gradient_is_priced_through_the_combine_and_replayed() -> None:
    """The router learns through the combine's weights: taps takes the gradient of the combine's
    routing operand back to ``moe_route`` (and on to the router and the block's input), not of
    the dispatch's (a gather by the mask, as an index dispatch: no engine computes one). The
    searched plan runs on XLA as predicted, backward edges included, and the router's gradient
    (reaching it through the routing alone) equals the unsharded run's."""
    from taps.search.compute import backward_work
    from taps.search.evaluate import step_layouts

    graph = moe_graph()
    dispatch, combine = graph.op("dispatch"), graph.op("combine")
    assert not graph.takes_gradient(dispatch, 0) and graph.takes_gradient(dispatch, 1)
    assert graph.takes_gradient(combine, 0) and graph.takes_gradient(combine, 1)
    # The combine's backward (2-byte elements): the experts' outputs' gradient moved (reading
    # grad_out, writing egcm's) and the weights' a dot of m per routed slot (reading both).
    slots = E * G * C * M
    work = backward_work(graph, combine)
    assert work.flops == 2 * slots
    assert work.bytes == 2 * (2 * (G * S * M + slots))
    assert backward_work(graph, dispatch).flops == 0
    plan = taps.search(graph, taps.Cluster(2, 4)).plan
    step = step_layouts(plan)
    backward = {
        (e.consumer, e.slot): b for (e, _), b in zip(step.layouts.redistributions, step.backward)
    }
    assert backward[("dispatch", 0)] is None and backward[("combine", 0)] is not None
    result = verify(plan)
    assert result.ok, result.mismatches
    assert not [r for r in result.collectives if "-> dispatch (gradient)" in r.what]
    grads = [k for k in result.errors if "router" in k and k.startswith("grad")]
    assert grads and max(result.errors[k] for k in grads) < result.tolerance
