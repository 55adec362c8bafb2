"""Expert weights exported: real MoE modules (transformers' Mixtral block, torchtitan's MoE) in
the GShard form under an expert-parallel plan, every parameter of the real module placed, the
experts split over the expert-parallel devices in DTensor and in JAX; and per-expert placements on
sub-meshes (:mod:`taps.export.experts`) against JAX's own shardings and against DTensor."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import taps
from moe_models import (
    MixtralGShard,
    TitanGShard,
    assert_experts_held,
    gshard_plan,
    mixtral_block,
    moe_graph,
    route,
    titan_moe,
)
from taps.export import layout_placements, mesh_for, to_dtensor, to_jax
from taps.export.dtensor import DTensorPlacements
from taps.export.experts import expert_placements

G, S, E, M, H, K = 8, 4, 8, 8, 16, 2
C = S * K // E
EP = 4

#: Per real module: its factory, its GShard form, and its router's scores from the input.
MODULES = {
    "mixtral": (
        mixtral_block,
        MixtralGShard,
        lambda real, x: torch.nn.functional.linear(x, real.gate.weight),
    ),
    "torchtitan": (
        titan_moe,
        TitanGShard,
        lambda real, x: torch.softmax(real.router.gate(x), dim=-1),
    ),
}


def _pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, torch.Tensor]:
    make, gshard, scores = MODULES[name]
    real = make(E, M, H, K)
    layer = gshard(E, M, H)
    layer.load_state_dict(real.state_dict())  # strict: the same parameters, names and shapes
    x = torch.randn(G, S, M, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        dispatch = route(scores(real, x), K, S * K)  # capacity for every token: none dropped
    return real, layer, x, dispatch


@pytest.mark.parametrize("name", MODULES)
def test_the_gshard_form_computes_the_real_module(name: str) -> None:
    real, layer, x, dispatch = _pair(name)
    with torch.no_grad():
        want = real(x)
        got = layer(x, dispatch)
    want = want[0] if isinstance(want, tuple) else want
    # torchtitan's experts run in bf16 (its grouped matmul casts), Mixtral's in fp32.
    tol = 2e-2 if name == "torchtitan" else 1e-5
    assert float((got - want).abs().max()) <= tol * float(want.abs().max())


def _expert_weights(module: torch.nn.Module) -> list[str]:
    return [n for n, p in module.named_parameters() if p.dim() == 3]


@pytest.mark.parametrize("name", MODULES)
def test_every_parameter_of_a_real_moe_is_placed_with_its_experts_split(name: str) -> None:
    real, layer, _, _ = _pair(name)
    x = torch.randn(G, S, M)
    dispatch = torch.zeros(G, S, E, C)
    cluster = taps.Cluster(nodes=2, devices_per_node=4)
    plan = gshard_plan(taps.from_torch(layer, x, dispatch), cluster, EP)
    dt, jx = to_dtensor(plan), to_jax(plan)
    names = [n for n, _ in real.named_parameters()]
    assert set(names) <= set(dt.tensors) and set(names) <= set(jx.tensors)
    # The mesh cuts the ranks into nodes... and the expert group: the innermost EP ranks.
    (inner,) = [a for a, size in zip(dt.mesh.axis_names, dt.mesh.shape) if size == EP]
    for n in _expert_weights(real):
        assert dt.tensors[n] == tuple(
            "Shard(0)" if a == inner else "Replicate()" for a in dt.mesh.axis_names
        )
        assert jx.tensors[n][0] in (inner, (inner,)) and all(s is None for s in jx.tensors[n][1:])
        # JAX's own placement of the spec: rank r holds the experts of its position in its
        # expert group, whole.
        sharding = jx.sharding(n, jx.jax_mesh())
        shape = tuple(dict(real.named_parameters())[n].shape)
        for r, device in enumerate(jx.jax_mesh().devices.reshape(-1)):
            index = sharding.devices_indices_map(shape)[device]
            per = E // EP
            assert (index[0].start or 0, index[0].stop or E) == ((r % EP) * per, (r % EP + 1) * per)
    # The router is read by every token group: whole on every device.
    router = next(n for n in names if n not in _expert_weights(real))
    assert set(dt.tensors[router]) <= {"Replicate()", "Shard(0)", "Shard(1)"}


@pytest.mark.parametrize("name", MODULES)
def test_the_searched_plan_places_every_parameter_of_a_real_moe(name: str) -> None:
    real, layer, x, dispatch = _pair(name)
    plan = taps.search(taps.from_torch(layer, x, dispatch), taps.Cluster(2, 4)).plan
    dt = to_dtensor(plan)
    for n, p in real.named_parameters():
        assert len(dt.tensors[n]) == len(dt.mesh.shape)
        assert "Partial()" not in dt.tensors[n]
        for k in (int(t[6:-1]) for t in dt.tensors[n] if t.startswith("Shard(")):
            assert k < p.dim()


@st.composite
def stacked_layouts(draw: st.DrawFn) -> taps.Layout:
    """A stacked expert weight ``[e, a, b]`` on 2 to 16 devices: each dim split over a device
    dim or whole, in any order."""
    matrix = draw(st.lists(st.sampled_from([2, 4]), min_size=1, max_size=3))
    dims = draw(st.permutations([*range(len(matrix)), -1, -1, -1]))[:3]
    shape = [8, 4, 8]
    return taps.Layout(shape, matrix, dims)


@given(stacked_layouts(), st.booleans())
def test_each_expert_lives_where_the_stacked_weight_puts_it(
    layout: taps.Layout, finest: bool
) -> None:
    """Against the layout itself (``Layout.shard_index``, taps' core) and JAX's placement of the
    expert's sub-mesh spec: each expert on exactly the ranks whose block of the stacked weight
    holds it, and there each rank's block of the expert is its block of the stacked weight. On
    the finest mesh (one axis per bit, as another tensor of the plan may ask) a device dim of 4
    is two mesh axes, the expert dim split over both."""
    n = layout.num_devices
    bits = n.bit_length() - 1
    others = [taps.Layout([1], [2] * bits, [-1])] if finest and bits > 1 else []
    mesh = mesh_for([layout, *others], n)
    placements = DTensorPlacements(mesh, {"w": layout_placements(mesh, layout)}, {})
    experts = expert_placements(placements, "w", layout.shape[0])
    devices = np.array(jax.devices()[:n])
    for w in experts:
        holders = [
            r
            for r in range(n)
            if layout.shard_index(r)[0][0] <= w.expert < layout.shard_index(r)[0][1]
        ]
        assert sorted(w.ranks) == holders
        sub = [mesh.shape[mesh.axis_names.index(a)] for a in w.mesh_axes]
        jmesh = jax.sharding.Mesh(
            devices[list(w.ranks)].reshape(sub or [1]), w.mesh_axes or ("one",)
        )
        spec: list[tuple[str, ...]] = [(), ()]
        for a, p in zip(w.mesh_axes, w.placements):
            if p.startswith("Shard("):
                spec[int(p[6:-1])] += (a,)
        named = jax.sharding.NamedSharding(
            jmesh, jax.sharding.PartitionSpec(*(s or None for s in spec))
        )
        blocks = named.devices_indices_map(tuple(layout.shape[1:]))
        for r in w.ranks:
            got = [
                (s.start or 0, s.stop or size)
                for s, size in zip(blocks[devices[r]], layout.shape[1:])
            ]
            assert got == layout.shard_index(r)[1:]


def test_experts_are_distributed_on_their_sub_meshes_as_dtensors() -> None:
    """Every rank of the fake process group in turn: the DTensors of the experts it holds have
    its block of the stacked weight, as DTensor places the stacked weight itself."""
    layout = taps.Layout([8, 4, 8], [2, 2, 2], [1, -1, 0])  # experts 2 ways, width 2 ways
    mesh = mesh_for([layout], 8)
    placements = DTensorPlacements(mesh, {"w": layout_placements(mesh, layout)}, {})
    stacked = torch.arange(8 * 4 * 8, dtype=torch.float32).reshape(8, 4, 8)
    assert_experts_held(placements, "w", layout, stacked, list(stacked))


def test_an_uneven_expert_split_is_refused() -> None:
    layout = taps.Layout([8, 4, 8], [4], [0, -1, -1])
    mesh = mesh_for([layout], 4)
    placements = DTensorPlacements(mesh, {"w": layout_placements(mesh, layout)}, {})
    with pytest.raises(taps.ExportError, match="do not split evenly"):
        expert_placements(placements, "w", 6)
    with pytest.raises(taps.ExportError, match="unknown tensor"):
        expert_placements(placements, "v", 8)


def _jax_layer(params: dict, x: jax.Array, route: jax.Array) -> jax.Array:
    """The GShard layer in JAX (torchtitan's parameter names), the routing given."""
    import jax.numpy as jnp

    inner = "routed_experts.inner_experts"
    probs = jax.nn.softmax(jnp.einsum("gsm,em->gse", x, params["router.gate.weight"]), axis=-1)
    combine = probs[..., None] * route
    h = jnp.einsum("gsec,gsm->egcm", route, x)
    a = jnp.einsum("egcm,ehm->egch", h, params[f"{inner}.w1_EFD"])
    b = jnp.einsum("egcm,ehm->egch", h, params[f"{inner}.w3_EFD"])
    y = jnp.einsum("egch,emh->egcm", jax.nn.silu(a) * b, params[f"{inner}.w2_EDF"])
    return jnp.einsum("gsec,egcm->gsm", combine, y)


def test_a_jax_moe_runs_in_the_exported_shardings() -> None:
    """The plan of taps' MoE operators exported to JAX: every parameter's ``PartitionSpec`` puts
    its experts on the expert-parallel mesh axes; the JAX layer jitted with its parameters and
    tokens placed so computes what it computes on one device."""
    from taps.verify.xla.operators import balanced_routing

    graph = moe_graph(G, S, E, C, M, H)
    plan = gshard_plan(graph, taps.Cluster(2, 4), EP)
    jx = to_jax(plan)
    mesh = jx.jax_mesh()
    (inner,) = [a for a, size in zip(jx.mesh.axis_names, jx.mesh.shape) if size == EP]
    rng = np.random.default_rng(0)
    params = {
        n: rng.standard_normal(t.shape).astype(np.float32)
        for n, t in graph.tensors.items()
        if t.kind == "parameter"
    }
    for n, w in params.items():
        if w.ndim == 3:
            assert jx.tensors[n][0] in (inner, (inner,))
    x = rng.standard_normal((G, S, M)).astype(np.float32)
    route = np.broadcast_to(balanced_routing(S, E, C), (G, S, E, C)).astype(np.float32)
    placed = {n: jax.device_put(w, jx.sharding(n, mesh)) for n, w in params.items()}
    got = jax.jit(_jax_layer)(placed, jax.device_put(x, jx.sharding("x", mesh)), route)
    want = _jax_layer(params, x, route)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    # Each device holds the experts of its place in its expert group.
    w = placed["routed_experts.inner_experts.w1_EFD"]
    for shard in w.addressable_shards:
        r = list(mesh.devices.flat).index(shard.device)  # rank r is mesh position r
        per = E // EP
        assert (shard.index[0].start, shard.index[0].stop) == ((r % EP) * per, (r % EP + 1) * per)
