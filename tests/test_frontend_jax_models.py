"""The JAX front end on the models people write (flax linen and nnx, equinox, plain JAX with a
loss): every pytree leaf is one graph parameter (a scanned stack named as the leaf, a tied
embedding one parameter), gathers and scatters on integer labels and ids convert, a search
runs, the export places every leaf with a spec of its rank, and layer norms written the usual
ways (by hand, flax, equinox) and a cross-entropy on integer labels verify on XLA."""

from __future__ import annotations

import math

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import taps
from taps.export import to_jax
from taps.frontends.jax import from_jax
from taps.verify.xla.devices import jax_with_devices

S = jax.ShapeDtypeStruct
F32 = jnp.float32
X = S((16, 32), F32)
LABELS = S((16,), jnp.int32)

jax_with_devices(8)


def _leaves(tree: object) -> dict[str, tuple[int, ...]]:
    """Every leaf's name as the front end names a parameter (its key path) and its shape."""
    return {
        jax.tree_util.keystr(path, simple=True, separator="."): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _check(fn, params, *inputs) -> taps.Graph:
    """Convert, compare the parameters with the pytree's leaves, search, export every leaf."""
    g = from_jax(fn, params, *inputs)
    leaves = _leaves(params)
    pieces = {p for ps, _ in g.stacks.values() for p in ps}
    named = {n for n, t in g.tensors.items() if t.kind == "parameter"} - pieces
    assert named | (set(g.stacks) - pieces) == set(leaves)
    assert g.num_parameters() == sum(math.prod(s) for s in leaves.values())
    for name in g.stacks:
        if name in leaves:
            assert g.stack_shape(name) == leaves[name]
    assert taps.Graph.from_json(g.to_json()) == g
    specs = to_jax(taps.search(g, taps.Cluster(1, 4)).plan).tensors
    for name, shape in leaves.items():
        assert len(specs[name]) == len(shape), name
    return g


class _Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.Dense(64)(nn.LayerNorm()(x))
        return x + nn.Dense(32)(nn.gelu(h)), None


class _Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
        blocks = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=4)
        return blocks()(x, None)[0]


def test_flax_scan_keeps_the_leaf_names():
    """The 6 stacked leaves of a 4-step ``nn.scan`` are named as the pytree names them (their
    steps' slices are parameters of their own, ``.0`` ... ``.3``)."""
    m = _Scanned()
    params = jax.eval_shape(m.init, jax.random.key(0), X)
    g = _check(m.apply, params, X)
    assert len(g.stacks) == 6
    kernel = "params.Scan_Block_0.Dense_0.kernel"
    assert g.stacks[kernel] == (tuple(f"{kernel}.{i}" for i in range(4)), 0)


class _Tied(nn.Module):
    @nn.compact
    def __call__(self, ids):
        embed = nn.Embed(100, 32)
        h = nn.LayerNorm()(embed(ids))
        return embed.attend(nn.Dense(32)(h))  # the output head reads the embedding again


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()


def test_flax_tied_embedding_with_a_cross_entropy_on_labels():
    m = _Tied()
    ids = S((4, 16), jnp.int32)
    params = jax.eval_shape(m.init, jax.random.key(0), ids)

    def loss(p, ids, labels):
        return _cross_entropy(m.apply(p, ids), labels)

    g = _check(loss, params, ids, S((4, 16), jnp.int32))
    (share,) = [op for op in g.ops if op.kind == taps.graph.SHARE]
    assert share.inputs[0].tensor == "params.Embed_0.embedding"
    picks = [op for op in g.ops if op.kind == "gather"]
    assert len(picks) == 1 and "v" in picks[0].contracted and "v" in picks[0].partitionable


def test_flax_nnx_model():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1 = nnx.Linear(32, 64, rngs=rngs)
            self.norm = nnx.LayerNorm(64, rngs=rngs)
            self.fc2 = nnx.Linear(64, 10, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.relu(self.norm(self.fc1(x))))

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Net(nnx.Rngs(0))))

    def loss(state, x, labels):
        return _cross_entropy(nnx.merge(graphdef, state)(x), labels)

    _check(loss, state, X, LABELS)


def test_equinox_model():
    mlp = eqx.filter_eval_shape(eqx.nn.MLP, 32, 10, 64, 2, key=jax.random.key(0))
    params, static = eqx.partition(mlp, lambda leaf: isinstance(leaf, S))  # shapes, no arrays

    def loss(params, x, labels):
        return _cross_entropy(jax.vmap(eqx.combine(params, static))(x), labels)

    _check(loss, params, X, LABELS)


def test_plain_jax_embedding_lookup_and_loss():
    params = {"table": S((100, 32), F32), "w": S((32, 100), F32)}

    def loss(p, ids, labels):
        h = jnp.take(p["table"], ids, axis=0)  # (16, 32)
        logits = h @ p["w"]
        picked = jax.nn.log_softmax(logits)[jnp.arange(16), labels]
        return -picked.mean()

    g = _check(loss, params, LABELS, LABELS)
    kinds = [op.kind for op in g.ops]
    assert "embedding" in kinds and "gather" in kinds


def test_scatter_add_of_updates():
    def fn(p, ids, u):
        return jnp.zeros((100, 16)).at[ids].add(u * p["s"]) + p["b"]

    params = {"s": S((16,), F32), "b": S((100, 16), F32)}
    g = _check(fn, params, S((8,), jnp.int32), S((8, 16), F32))
    (scatter,) = [op for op in g.ops if op.kind == "scatter-add"]
    assert scatter.output.dims[0] == "v" and "t0" in scatter.contracted

    def written(p, x, ids, u):
        return x.at[ids].set(u) @ p["w"]

    g = from_jax(
        written, {"w": S((16, 4), F32)}, S((100, 16), F32), S((8,), jnp.int32), S((8, 16), F32)
    )
    (scatter,) = [op for op in g.ops if op.kind == "scatter"]
    assert "t0" not in scatter.partitionable  # the last write wins: no sum to split


def _ln_mean_var(p, x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * p["g"] + p["b"]


def _ln_rsqrt(p, x):
    m, v = jnp.mean(x, -1, keepdims=True), jnp.var(x, -1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * p["g"] + p["b"]


@pytest.mark.parametrize("form", [_ln_mean_var, _ln_rsqrt, "flax", "equinox"])
def test_layer_norms_verify_on_xla(form):
    """The usual JAX layer norms (their mean kept with keepdims, then broadcast back) replay
    on 8 XLA host devices, every collective as priced."""
    if form == "flax":
        fn = lambda p, x: nn.LayerNorm().apply(p, x)  # noqa: E731
        params = jax.eval_shape(nn.LayerNorm().init, jax.random.key(0), X)
    elif form == "equinox":
        norm = eqx.filter_eval_shape(eqx.nn.LayerNorm, 32)
        params, static = eqx.partition(norm, lambda leaf: isinstance(leaf, S))
        fn = lambda p, x: jax.vmap(eqx.combine(p, static))(x)  # noqa: E731
    else:
        fn, params = form, {"g": S((32,), F32), "b": S((32,), F32)}
    g = from_jax(fn, params, X)
    result = taps.verify(taps.search(g, taps.Cluster(2, 4)).plan)
    assert result.ok, result


def _picked(logits, labels):
    """The cross-entropy's pick written as advanced indexing (rows by ``arange``)."""
    return -jax.nn.log_softmax(logits)[jnp.arange(logits.shape[0]), labels].mean()


@pytest.mark.parametrize("pick", [_cross_entropy, _picked])
def test_a_cross_entropy_on_integer_labels_verifies_on_xla(pick):
    """A linear classifier's loss on integer labels (a ``gather`` of the log-probabilities at
    the labels, ``take_along_axis`` or ``x[arange, labels]``) replays on 8 XLA host devices:
    every collective as priced, the loss and gradients those of the unsharded run."""
    g = from_jax(lambda p, x, labels: pick(x @ p["w"], labels), {"w": S((32, 10), F32)}, X, LABELS)
    assert "gather" in [op.kind for op in g.ops]
    result = taps.verify(taps.search(g, taps.Cluster(2, 4)).plan)
    assert result.ok, result


def _gpt_block(x, p, heads):
    """A pre-norm GPT block on (batch, seq, hidden), its layer norms written by hand."""
    b, t, h = x.shape
    q, k, v = (
        (_ln_mean_var({"g": p["g1"], "b": p["b1"]}, x) @ p[n]).reshape(b, t, heads, h // heads)
        for n in ("wq", "wk", "wv")
    )
    a = jax.nn.softmax(jnp.einsum("bsnd,btnd->bnst", q, k), -1)
    x = x + jnp.einsum("bnst,btnd->bsnd", a, v).reshape(b, t, h) @ p["wo"]
    y = _ln_mean_var({"g": p["g2"], "b": p["b2"]}, x)
    return x + jax.nn.gelu(y @ p["w1"]) @ p["w2"]


def _scanned_gpt(p, ids, labels):
    """A plain-JAX GPT whose layers are one ``lax.scan`` over stacked weights, with its loss."""
    x = p["wte"][ids] + p["wpe"]
    x = jax.lax.scan(lambda x, layer: (_gpt_block(x, layer, heads=4), None), x, p["layers"])[0]
    return _cross_entropy(_ln_mean_var({"g": p["gf"], "b": p["bf"]}, x) @ p["head"], labels)


def _gpt_params(layers=2, hidden=32, seq=8, vocab=64):
    shapes = {
        **{n: (hidden,) for n in ("g1", "b1", "g2", "b2")},
        **{n: (hidden, hidden) for n in ("wq", "wk", "wv", "wo")},
        **{"w1": (hidden, 4 * hidden), "w2": (4 * hidden, hidden)},
    }
    return {
        "wte": S((vocab, hidden), F32),
        "wpe": S((seq, hidden), F32),
        "layers": {n: S((layers, *s), F32) for n, s in shapes.items()},
        "gf": S((hidden,), F32),
        "bf": S((hidden,), F32),
        "head": S((hidden, vocab), F32),
    }


@pytest.mark.parametrize("model", ["plain", "flax"])
def test_a_scanned_model_verifies_on_xla(model):
    """A model whose layers are a ``scan`` (a plain-JAX GPT with its loss; a flax ``nn.scan``
    of blocks, whose residual add of a biased Dense is one 3-operand add) replays on 4 XLA
    host devices: every collective as priced, outputs and gradients those of the unsharded
    run. Its fused elementwise chains (the hand-written layer norms and softmax in every layer)
    stay bounded: replayed as products they overflowed by the second layer."""
    if model == "plain":
        ids = S((2, 8), jnp.int32)
        g = _check(_scanned_gpt, _gpt_params(), ids, ids)
    else:
        m = _Scanned()
        g = _check(m.apply, jax.eval_shape(m.init, jax.random.key(0), X), X)
    assert g.stacks
    result = taps.verify(taps.search(g, taps.Cluster(1, 4)).plan)
    assert result.ok, result.mismatches
    assert result.collectives and {c.status for c in result.collectives} <= {"ok", "shared"}
    assert 0 < result.max_error < 1e-4


def test_the_plan_places_a_flax_state_and_its_inputs_by_their_pytrees():
    class Net(nnx.Module):
        def __init__(self, rngs):
            self.fc1 = nnx.Linear(32, 64, rngs=rngs)
            self.fc2 = nnx.Linear(64, 10, rngs=rngs)

        def __call__(self, x):
            return self.fc2(nnx.relu(self.fc1(x)))

    graphdef, state = nnx.split(Net(nnx.Rngs(0)))  # real arrays: the user's own state

    def loss(state, x, labels):
        return _cross_entropy(nnx.merge(graphdef, state)(x), labels)

    plan = taps.search(from_jax(loss, state, X, LABELS), taps.Cluster(1, 4)).plan
    shardings = to_jax(plan)
    placed = jax.device_put(state, shardings.tree(state))
    x = jax.random.normal(jax.random.key(1), X.shape)
    labels = jnp.arange(16) % 10
    x_placed = jax.device_put(x, shardings.tree(x, "x"))
    split = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(placed)[0]:
        name = jax.tree_util.keystr(path, simple=True, separator=".")
        assert leaf.sharding.spec == shardings.partition_spec(name), name
        split += any(leaf.sharding.spec)
    assert split > 0 or any(x_placed.sharding.spec)  # the plan splits something: not vacuous
    assert x_placed.sharding.spec == shardings.partition_spec("x")
    ran = jax.jit(jax.value_and_grad(loss))(placed, x_placed, labels)
    dense = jax.value_and_grad(loss)(state, x, labels)
    assert abs(float(ran[0]) - float(dense[0])) < 1e-5
    with pytest.raises(taps.ExportError, match="unknown tensor 'y'"):
        shardings.tree(x, "y")
