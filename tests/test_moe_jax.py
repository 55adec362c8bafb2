"""Mixture-of-experts layers written in JAX (tests/jax_moe_models.py: flax linen and nnx GShard
layers, a plain-JAX sorted dispatch with ``ragged_dot`` and ``segment_sum``) read by the jaxpr
front end as the GShard form's operators (docs/moe.md "JAX"), named and counted as the pytree,
searched (expert parallelism where it pays), exported (the expert dim split in the
``PartitionSpec``) and run on XLA under the plan, the all_to_alls XLA compiles matched to taps'
prediction."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from jax_moe_models import GShardMoe, MoeLayer, MoeStack, NnxMoe, gshard_masks, sorted_moe
from moe_models import gshard_plan
from taps.export import to_jax
from taps.frontends.jax import from_jax
from taps.graph import MOE_COMBINE, MOE_DISPATCH, MOE_EXPERT, MOE_ROUTE, Operator
from taps.plan.experts import expert_splits
from taps.verify import verify
from taps.verify.xla.devices import jax_with_devices

jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs

S = jax.ShapeDtypeStruct
F32 = jnp.float32
#: The GShard operators in order, as the torch front end makes them for a gated MLP.
GSHARD = [MOE_ROUTE, MOE_DISPATCH, MOE_EXPERT, MOE_EXPERT, "swiglu", MOE_EXPERT, MOE_COMBINE]


def _leaves(tree: object) -> dict[str, tuple[int, ...]]:
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _linen(layer: object, x: S) -> tuple[taps.Graph, dict]:
    params = jax.eval_shape(layer.init, jax.random.key(0), x)  # type: ignore[attr-defined]
    return from_jax(layer.apply, params, x), params  # type: ignore[attr-defined]


def _moe_ops(graph: taps.Graph) -> list[Operator]:
    first = next(i for i, op in enumerate(graph.ops) if op.kind == MOE_ROUTE)
    last = next(i for i, op in enumerate(graph.ops) if op.kind == MOE_COMBINE)
    return graph.ops[first : last + 1]


def _check_parameters(graph: taps.Graph, params: object) -> None:
    """Every pytree leaf is one graph parameter of its shape, counted once."""
    leaves = _leaves(params)
    got = {n: tuple(t.shape) for n, t in graph.tensors.items() if t.kind == "parameter"}
    assert got == leaves
    assert graph.num_parameters() == sum(math.prod(s) for s in leaves.values())


@pytest.mark.parametrize(
    ("sigmoid", "renormalise", "factor"), [(False, False, 1.0), (True, True, 1.25)]
)
def test_a_flax_gshard_layer_becomes_the_gshard_operators(sigmoid, renormalise, factor) -> None:
    e, k, d, f, g, s = 8, 2, 16, 32, 4, 16
    layer = GShardMoe(e, k, f, factor, sigmoid, renormalise)
    graph, params = _linen(layer, S((g, s, d), F32))
    ops = _moe_ops(graph)
    assert [op.kind for op in ops] == GSHARD
    route, dispatch, gate, up, _, down, combine = ops
    c = math.ceil(k * s * factor / e)  # the model's capacity
    assert graph.tensors[route.output.tensor].shape == (g, s, e, c)
    assert graph.tensors[dispatch.output.tensor].shape == (e, g, c, d)
    # The router's scores (its softmax or sigmoid) are what the routing reads.
    made = graph.root(route.inputs[0].tensor).name
    scores = next(op for op in graph.ops if op.output.tensor == made)
    assert ("logistic" in scores.kind) == sigmoid
    assert [op.inputs[1].tensor for op in (gate, up, down)] == [
        "params.wi_0",
        "params.wi_1",
        "params.wo",
    ]
    assert [op.inputs[1].dims for op in (gate, up, down)] == [("e", "m", "h")] * 2 + [
        ("e", "h", "m")
    ]
    assert set(combine.partitionable) == {"g", "e"}
    assert graph.ops[-1] is combine  # nothing of the masks, cumsums or top-k is left
    _check_parameters(graph, params)


def test_the_block_sits_in_the_model_named_as_the_pytree() -> None:
    """A pre-norm sublayer: the norm before, the residual add after; two sublayers, two blocks,
    each reading its own experts."""
    graph, params = _linen(MoeStack(2, 4, 1, 8), S((2, 8, 8), F32))
    _check_parameters(graph, params)
    experts = [op for op in graph.ops if op.kind == MOE_EXPERT]
    assert [op.inputs[1].tensor for op in experts] == [
        f"params.layer_{i}.moe.{w}" for i in (0, 1) for w in ("wi_0", "wi_1", "wo")
    ]
    combines = [op for op in graph.ops if op.kind == MOE_COMBINE]
    assert [op.name for op in combines] == [f"MoeStack/layer_{i}/moe/moe_combine" for i in (0, 1)]
    # The residual add reads the combine; the second layer's norm reads the first's output.
    add = next(op for op in graph.ops if op.name == "MoeStack/layer_0/add")
    assert combines[0].output.tensor in [i.tensor for i in add.inputs]


def test_an_nnx_layer_with_a_shared_expert() -> None:
    e, k, d, f = 8, 2, 16, 32
    model = nnx.eval_shape(lambda: NnxMoe(d, f, e, k, nnx.Rngs(0)))
    graphdef, state = nnx.split(model)

    def apply(state: nnx.State, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    graph = from_jax(apply, state, S((4, 16, d), F32))
    assert [op.kind for op in _moe_ops(graph)] == GSHARD
    _check_parameters(graph, state)
    # The shared expert is ordinary linears beside the block, added to its output.
    shared = [op for op in graph.ops if any(i.tensor.startswith("shared") for i in op.inputs)]
    assert len(shared) == 2 and all(op.kind == "dot_general" for op in shared)


def _sorted_params(e: int, d: int, f: int) -> dict[str, S]:
    return {"router": S((d, e), F32), "w_in": S((e, d, 2 * f), F32), "w_out": S((e, f, d), F32)}


def test_a_sorted_dispatch_with_ragged_dot_and_segment_sum() -> None:
    """argsort, a gather of the tokens, ``ragged_dot`` over a fused gate-up weight,
    ``segment_sum``: the same operators, the gate-up pair read as one weight."""
    e, k, d, f, b, s = 8, 2, 16, 32, 4, 16
    params = _sorted_params(e, d, f)
    graph = from_jax(lambda p, x: sorted_moe(p, x, k), params, S((b, s, d), F32))
    ops = _moe_ops(graph)
    assert [op.kind for op in ops] == [
        MOE_ROUTE,
        MOE_DISPATCH,
        MOE_EXPERT,
        "swiglu",
        MOE_EXPERT,
        MOE_COMBINE,
    ]
    route = ops[0]
    # Dropless: every token's k copies, k s / e slots per expert and group on average.
    assert graph.tensors[route.output.tensor].shape == (b, s, e, k * s // e)
    assert ops[2].inputs[1].dims == ("e", "m", "f") and ops[4].inputs[1].dims == ("e", "h", "m")
    _check_parameters(graph, params)


@settings(max_examples=15, deadline=None)
@given(
    e=st.sampled_from([2, 4, 8, 16]),
    k=st.integers(1, 4),
    d=st.sampled_from([8, 12]),
    f=st.sampled_from([8, 24]),
    s=st.sampled_from([4, 16, 32]),
    factor=st.sampled_from([1.0, 1.5, 2.0]),
)
def test_every_shape_converts_with_the_models_capacity(e, k, d, f, s, factor) -> None:
    k = min(k, e)
    graph, params = _linen(GShardMoe(e, k, f, factor), S((2, s, d), F32))
    route = next(op for op in graph.ops if op.kind == MOE_ROUTE)
    c = min(s, max(1, math.ceil(k * s * factor / e)))
    assert graph.tensors[route.output.tensor].shape == (2, s, e, c)
    _check_parameters(graph, params)
    sorted_graph = from_jax(
        lambda p, x: sorted_moe(p, x, k), _sorted_params(e, d, f), S((2, s, d), F32)
    )
    route = next(op for op in sorted_graph.ops if op.kind == MOE_ROUTE)
    assert sorted_graph.tensors[route.output.tensor].shape == (2, s, e, math.ceil(k * s / e))


def test_a_top_k_without_experts_still_has_no_rule() -> None:
    def pick(w: jax.Array, x: jax.Array) -> jax.Array:
        return jax.lax.top_k(x @ w, 2)[0]

    with pytest.raises(taps.GraphError, match=r"no rule for 1 primitive.*top_k"):
        from_jax(pick, S((8, 4), F32), S((16, 8), F32))


def test_a_routed_part_reading_something_else_is_one_clear_line() -> None:
    """The experts' output scaled by an input of neither the tokens' nor the scores' size."""

    def odd(p: dict, x: jax.Array, scale: jax.Array) -> jax.Array:
        probs = jax.nn.softmax(x @ p["router"])
        _, idx = jax.lax.top_k(probs, 1)
        mask = jax.nn.one_hot(idx[..., 0], 4)
        h = jnp.einsum("te,td,edf->tef", mask, x, p["w"]) * scale
        return jnp.einsum("tef,efd->td", h, p["v"])

    params = {"router": S((8, 4), F32), "w": S((4, 8, 16), F32), "v": S((4, 16, 8), F32)}
    with pytest.raises(taps.GraphError) as err:
        from_jax(odd, params, S((32, 8), F32), S((16,), F32))
    assert "neither its tokens" in str(err.value) and "\n" not in str(err.value)


# -- search, export, verify ------------------------------------------------------------------


def _mixtral_layer() -> tuple[taps.Graph, dict]:
    """A Mixtral 8x7B-width MoE sublayer (8 experts, top-2, 4096 wide, 14336 hidden), bf16,
    batch 64 x 4096."""
    x = S((64, 4096, 4096), jnp.bfloat16)
    params = jax.eval_shape(MoeLayer(8, 2, 14336).init, jax.random.key(0), x)
    params = jax.tree_util.tree_map(lambda a: S(a.shape, jnp.bfloat16), params)
    return from_jax(MoeLayer(8, 2, 14336).apply, params, x), params


def test_the_search_splits_the_experts_of_a_mixtral_width_layer_on_dgx_h100() -> None:
    """On 8 x 8 DGX H100 the search splits the 8 experts 8 ways (each device holds its own),
    faster than the best plan that keeps them whole (the same graph, ``e`` not splittable)."""
    graph, _ = _mixtral_layer()
    cluster = taps.Cluster.preset("dgx-h100", 8)
    found = taps.search(graph, cluster)
    splits = expert_splits(found.plan)
    assert {s.expert for s in splits} == {8}
    data = graph.to_dict()
    for op in data["ops"]:
        op["partitionable"] = [a for a in op["partitionable"] if a != "e"]
    whole = taps.search(taps.Graph.from_dict(data), cluster)
    assert found.cost < whole.cost
    # Expert weights divided by the expert-parallel degree: the searched plan fits where the
    # experts kept whole need more memory per device.
    assert found.memory_per_device < whole.memory_per_device


def test_the_export_splits_the_expert_dim() -> None:
    graph, params = _linen(GShardMoe(8, 2, 32), S((8, 4, 16), F32))
    cluster = taps.Cluster(nodes=2, devices_per_node=4)
    specs = to_jax(gshard_plan(graph, cluster, 4))
    for w in ("wi_0", "wi_1", "wo"):
        spec = specs.tensors[f"params.{w}"]
        assert len(spec) == 3 and spec[0] is not None and spec[1:] == (None, None), spec
    assert set(specs.tensors) >= set(_leaves(params))


G, SEQ, E, M, H, K = 8, 4, 8, 8, 16, 2


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_the_all_to_alls_xla_compiles_are_taps_prediction(ep: int) -> None:
    """GShard's plan (tokens split over every device, the experts over ``ep``), run on XLA
    with a fixed balanced routing: the dispatch and combine all_to_alls (forward and backward)
    are taps' prediction in kind, group and bytes, and the outputs and gradients equal the
    unsharded run's."""
    layer, x = GShardMoe(E, K, H), S((G, SEQ, M), F32)
    params = jax.eval_shape(layer.init, jax.random.key(0), x)
    # The tokens take a gradient, as a layer's input does in a model (the previous layer's).
    graph = from_jax(layer.apply, params, x, grad_argnums=1)
    cluster = taps.Cluster(nodes=2, devices_per_node=4)
    result = verify(gshard_plan(graph, cluster, ep))
    assert result.ok, result.mismatches
    assert result.max_error < result.tolerance
    rows = [r for r in result.collectives if r.kind == "all_to_all" and r.status != "shared"]
    assert sorted(r.phase for r in rows) == ["backward"] * 3 + ["forward"] * 2
    c = SEQ * K // E
    block = E * G * c * M // cluster.num_devices * 4
    groups = tuple(tuple(range(i, i + ep)) for i in range(0, cluster.num_devices, ep))
    for r in rows:
        assert r.status == "ok"
        assert r.group_size == ep
        assert r.predicted_bytes == r.measured_bytes == block * (ep - 1) // ep
        assert r.measured_groups == groups
        assert r.inter_node_groups == (0 if ep <= 4 else cluster.num_devices // ep)


def test_the_searched_plan_of_a_sorted_moe_runs_on_xla_as_predicted() -> None:
    params = _sorted_params(E, M, H)
    graph = from_jax(lambda p, x: sorted_moe(p, x, K), params, S((G, SEQ, M), F32), grad_argnums=1)
    plan = taps.search(graph, taps.Cluster(2, 4)).plan
    result = verify(plan)
    assert result.max_error < result.tolerance
    assert [r for r in result.collectives if r.kind == "all_to_all" and r.status == "ok"]


# -- the recognised operators compute the layer ------------------------------------------------


def _einsum(op: Operator, arrays: list[np.ndarray]) -> np.ndarray:
    letters: dict[str, str] = {}
    for dims in [*(o.dims for o in op.inputs), op.output.dims]:
        for d in dims:
            letters.setdefault(d, chr(ord("a") + len(letters)))
    spec = ",".join("".join(letters[d] for d in o.dims) for o in op.inputs)
    return np.einsum(f"{spec}->{''.join(letters[d] for d in op.output.dims)}", *arrays)


def _run_experts(graph: taps.Graph, values: dict[str, np.ndarray], combine: np.ndarray):
    """The recognised operators from dispatch to combine in numpy, on the model's own combine
    weights ``gsec`` at ``moe_route``'s output (the dispatch mask where they are not zero):
    the experts read by the labels the front end gave their weights."""
    env = dict(values)
    env[next(op for op in graph.ops if op.kind == MOE_ROUTE).output.tensor] = combine
    silu = lambda a: a / (1 + np.exp(-a))  # noqa: E731
    for op in _moe_ops(graph)[1:]:
        xs = []
        for o in op.inputs:
            t = graph.tensors[o.tensor]
            base = env[o.tensor] if o.tensor in env else env[graph.root(o.tensor).name]
            # Views are reshapes; the routing keeps its own capacity (a slot for every token),
            # so the experts' tensors (egc...) keep their own c.
            if base.size == math.prod(t.shape):
                base = np.reshape(base, t.shape)
            elif len(t.shape) > base.ndim:
                base = np.reshape(base, base.shape[:3] + t.shape[3:])
            xs.append(base)
        if op.kind == MOE_DISPATCH:
            xs[0] = (xs[0] != 0).astype(xs[0].dtype)
        if op.kind == "swiglu":
            if len(xs) == 1:  # a fused gate-up pair: its axis t, gate first
                pair = op.inputs[0].dims.index("t")
                gate, up = np.take(xs[0], 0, axis=pair), np.take(xs[0], 1, axis=pair)
            else:
                gate, up = xs
            env[op.output.tensor] = silu(gate) * up
        else:
            env[op.output.tensor] = _einsum(op, xs)
    return env[_moe_ops(graph)[-1].output.tensor]


def _sorted_combine(params: dict, x: np.ndarray, k: int) -> np.ndarray:
    """``sorted_moe``'s routing as GShard combine weights, a slot for every token."""
    b, s, _ = x.shape
    e = params["w_in"].shape[0]
    scores = 1 / (1 + np.exp(-(x @ params["router"])))
    out = np.zeros((b, s, e, s), np.float32)
    for gi in range(b):
        used = [0] * e
        for t in range(s):
            top = np.argsort(-scores[gi, t], kind="stable")[:k]
            w = scores[gi, t, top] / scores[gi, t, top].sum()
            for ei, wi in zip(top, w):
                out[gi, t, ei, used[ei]] = wi
                used[ei] += 1
    return out


@pytest.mark.parametrize("model", ["gshard", "gshard square", "sorted"])
def test_the_recognised_operators_compute_the_layer(model: str) -> None:
    """The experts' weights read with the labels, order and activation the front end found,
    from dispatch to combine, on the model's own routing, equal the JAX layer's output; also
    when the experts' hidden width is the model's (``[e, in, out]`` told apart by order)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, M)).astype(np.float32)
    if model.startswith("gshard"):
        hidden = M if model == "gshard square" else H
        layer = GShardMoe(E, K, hidden, capacity_factor=E / K, renormalise=True)
        params = layer.init(jax.random.key(1), x)
        graph = from_jax(layer.apply, params, x)
        probs = jax.nn.softmax(x @ params["params"]["router"]["kernel"], axis=-1)
        _, combine = gshard_masks(probs, K, 8, True)
        want = layer.apply(params, x)
    else:
        params = {
            n: rng.standard_normal(v.shape).astype(np.float32) / 3
            for n, v in _sorted_params(E, M, H).items()
        }
        graph = from_jax(lambda p, x: sorted_moe(p, x, K), params, x)
        combine = _sorted_combine(params, x, K)
        want = sorted_moe(params, x, K)
    values = {n: np.asarray(v) for n, v in _leaves_values(params).items()}
    tokens = next(op for op in graph.ops if op.kind == MOE_DISPATCH).inputs[1].tensor
    values[graph.root(tokens).name] = x
    got = _run_experts(graph, values, np.asarray(combine))
    np.testing.assert_allclose(got.reshape(want.shape), np.asarray(want), rtol=1e-4, atol=1e-5)


def _leaves_values(tree: object) -> dict[str, object]:
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
