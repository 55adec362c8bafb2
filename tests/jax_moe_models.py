"""Mixture-of-experts layers written the ways JAX users write them, for tests/test_moe_jax.py.

- :class:`GShardMoe` (flax linen) and :class:`NnxMoe` (flax nnx): a router (softmax or sigmoid,
  ``jax.lax.top_k``), dispatch and combine by one-hot masks and einsums with a capacity factor
  (GShard, Switch Transformer), experts an einsum over stacked ``[experts, d, f]`` weights;
- :func:`sorted_moe` (plain JAX): tokens sorted by expert (``argsort``), gathered, run by
  ``jax.lax.ragged_dot`` over the stacked weights, and summed back by ``segment_sum``.

Every layer takes tokens ``[batch, seq, d]`` and returns the same shape.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx


def gshard_masks(
    probs: jax.Array, k: int, capacity: int, renormalise: bool
) -> tuple[jax.Array, jax.Array]:
    """The GShard dispatch mask and combine weights ``[g, s, e, c]`` of router probabilities
    ``[g, s, e]``: each token's ``k`` best experts, slots taken in token order (choice by
    choice), tokens past an expert's ``capacity`` dropped."""
    e = probs.shape[-1]
    weights, experts = jax.lax.top_k(probs, k)  # [g, s, k]
    if renormalise:
        weights = weights / weights.sum(-1, keepdims=True)
    choice = jax.nn.one_hot(experts, e, dtype=probs.dtype)  # [g, s, k, e]
    # Slots in order: every token's first choice before any second choice.
    order = jnp.swapaxes(choice, 1, 2).reshape(choice.shape[0], -1, e)  # [g, k*s, e]
    position = (jnp.cumsum(order, axis=1) - 1.0) * order
    position = jnp.swapaxes(position.reshape(choice.shape[0], k, -1, e), 1, 2)  # [g, s, k, e]
    kept = choice * (position < capacity)
    slot = jax.nn.one_hot(position.sum(-1).astype(jnp.int32), capacity, dtype=probs.dtype)
    dispatch = jnp.einsum("gske,gskc->gsec", kept, slot)
    combine = jnp.einsum("gsk,gske,gskc->gsec", weights, kept, slot)
    return dispatch, combine


def swiglu_experts(xe: jax.Array, wi_0: jax.Array, wi_1: jax.Array, wo: jax.Array) -> jax.Array:
    """The experts on their tokens ``egcm``: ``silu(x wi_0) * (x wi_1)`` then ``wo``."""
    h = jax.nn.silu(jnp.einsum("egcm,emh->egch", xe, wi_0)) * jnp.einsum("egcm,emh->egch", xe, wi_1)
    return jnp.einsum("egch,ehm->egcm", h, wo)


class GShardMoe(nn.Module):
    """A GShard / Switch layer in flax linen: ``router`` a dense layer, experts ``wi_0``,
    ``wi_1`` ``[e, d, f]`` and ``wo`` ``[e, f, d]``."""

    experts: int
    top_k: int
    hidden: int
    capacity_factor: float = 1.0
    sigmoid: bool = False
    renormalise: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """The layer on tokens ``[g, s, d]``."""
        _, s, d = x.shape
        e, f = self.experts, self.hidden
        logits = nn.Dense(e, use_bias=False, name="router")(x)
        probs = jax.nn.sigmoid(logits) if self.sigmoid else jax.nn.softmax(logits, axis=-1)
        capacity = max(1, math.ceil(self.top_k * s * self.capacity_factor / e))
        dispatch, combine = gshard_masks(probs, self.top_k, capacity, self.renormalise)
        init = nn.initializers.normal(d**-0.5)
        wi_0 = self.param("wi_0", init, (e, d, f))
        wi_1 = self.param("wi_1", init, (e, d, f))
        wo = self.param("wo", nn.initializers.normal(f**-0.5), (e, f, d))
        xe = jnp.einsum("gsec,gsm->egcm", dispatch, x)
        return jnp.einsum("gsec,egcm->gsm", combine, swiglu_experts(xe, wi_0, wi_1, wo))


class MoeLayer(nn.Module):
    """A pre-norm transformer MLP sublayer with an MoE: ``x + moe(norm(x))``."""

    experts: int
    top_k: int
    hidden: int
    capacity_factor: float = 1.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """The sublayer on ``[g, s, d]``."""
        moe = GShardMoe(self.experts, self.top_k, self.hidden, self.capacity_factor, name="moe")
        return x + moe(nn.RMSNorm(name="norm")(x))


class MoeStack(nn.Module):
    """``layers`` MoE sublayers in a row (``layer_0``, ...)."""

    layers: int
    experts: int
    top_k: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """The sublayers on ``[g, s, d]``."""
        for i in range(self.layers):
            x = MoeLayer(self.experts, self.top_k, self.hidden, name=f"layer_{i}")(x)
        return x


class NnxMoe(nnx.Module):
    """The GShard layer in flax nnx, with a shared expert beside the routed ones (DeepSeek's)."""

    def __init__(self, d: int, f: int, experts: int, top_k: int, rngs: nnx.Rngs) -> None:
        self.top_k = top_k
        self.router = nnx.Linear(d, experts, use_bias=False, rngs=rngs)
        init = nnx.initializers.normal(d**-0.5)
        self.wi_0 = nnx.Param(init(rngs.params(), (experts, d, f)))
        self.wi_1 = nnx.Param(init(rngs.params(), (experts, d, f)))
        self.wo = nnx.Param(nnx.initializers.normal(f**-0.5)(rngs.params(), (experts, f, d)))
        self.shared_in = nnx.Linear(d, f, use_bias=False, rngs=rngs)
        self.shared_out = nnx.Linear(f, d, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """The layer on tokens ``[g, s, d]``."""
        _, s, _ = x.shape
        e = self.wi_0[...].shape[0]
        probs = jax.nn.softmax(self.router(x), axis=-1)
        capacity = math.ceil(self.top_k * s / e)
        dispatch, combine = gshard_masks(probs, self.top_k, capacity, True)
        xe = jnp.einsum("gsec,gsm->egcm", dispatch, x)
        ye = swiglu_experts(xe, self.wi_0[...], self.wi_1[...], self.wo[...])
        shared = self.shared_out(jax.nn.silu(self.shared_in(x)))
        return jnp.einsum("gsec,egcm->gsm", combine, ye) + shared


def sorted_moe(params: dict[str, Any], x: jax.Array, top_k: int) -> jax.Array:
    """A dropless MoE in plain JAX (as MaxText's and Megablocks' sparse paths): every token's
    ``top_k`` experts by a sigmoid router, the token copies sorted by expert (``argsort``) and
    gathered, the experts a grouped matmul (``jax.lax.ragged_dot``) over the stacked
    ``w_in [e, d, 2f]`` (gate and up fused) and ``w_out [e, f, d]``, the results weighted and
    summed back to their tokens (``segment_sum``)."""
    b, s, d = x.shape
    e = params["w_in"].shape[0]
    tokens = x.reshape(b * s, d)
    scores = jax.nn.sigmoid(tokens @ params["router"])
    weights, experts = jax.lax.top_k(scores, top_k)  # [t, k]
    weights = weights / weights.sum(-1, keepdims=True)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat)
    token_of = order // top_k
    sorted_x = tokens[token_of]
    sizes = jnp.bincount(flat, length=e)
    h = jax.lax.ragged_dot(sorted_x, params["w_in"], sizes)
    gate, up = jnp.split(h, 2, axis=-1)
    y = jax.lax.ragged_dot(jax.nn.silu(gate) * up, params["w_out"], sizes)
    y = y * weights.reshape(-1)[order][:, None]
    out = jax.ops.segment_sum(y, token_of, num_segments=b * s)
    return out.reshape(b, s, d)
