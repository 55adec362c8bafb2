"""Graph operators as JAX code: one ``jnp.einsum`` or elementwise function per operator.

The same function runs on whole tensors (the unsharded reference) and on a device's blocks under
``shard_map``; ``reduce`` is where the partial sums of a split contracted axis are summed (the
forward all_reduce of the sharded run, nothing in the reference). Operands are aligned by their
axis names, so any operand dim order works. Kinds without an einsum form here (convolutions,
pooling, embeddings) are a :class:`VerifyError`.

``reduce(y, addend=None)`` sums the partial sums of ``y`` and adds ``addend`` (an operand added
after the contraction, a linear's bias, already aligned to the output) once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from taps.graph import Operator

from .devices import VerifyError

Reduce = Callable[..., Any]


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _align(x: Any, dims: Sequence[str], to: Sequence[str]) -> Any:
    """``x`` (dims ``dims``, a subset of ``to``) transposed and expanded to broadcast as ``to``."""
    jnp = _jnp()
    order = [d for d in to if d in dims]
    x = jnp.transpose(x, [list(dims).index(d) for d in order])
    return jnp.reshape(x, [x.shape[order.index(d)] if d in dims else 1 for d in to])


def _einsum(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    letters: dict[str, str] = {}
    for a in op.axes:
        letters[a] = chr(ord("a") + len(letters)) if len(letters) < 26 else chr(65 + len(letters))

    def word(dims: Sequence[str]) -> str:
        return "".join(letters[d] for d in dims)

    missing = [d for d in op.output.dims if all(d not in o.dims for o in op.inputs)]
    if missing:
        raise VerifyError(
            f"operator {op.name!r} ({op.kind}): output axes {missing} come from no input, so it "
            "has no einsum form to replay"
        )
    spec = ",".join(word(o.dims) for o in op.inputs) + "->" + word(op.output.dims)
    return reduce(_jnp().einsum(spec, *xs))


def _linear(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """``x @ W``, summed, then the bias (added once, after the partial sums)."""
    if len(xs) == 2:
        return _einsum(op, xs, reduce)
    y = _einsum(dataclasses.replace(op, inputs=op.inputs[:2]), xs[:2], lambda y: y)
    return reduce(y, _align(xs[2], op.inputs[2].dims, op.output.dims))


def _elementwise(fn: Callable[..., Any]) -> Callable[[Operator, list[Any], Reduce], Any]:
    def run(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
        return fn(*(_align(x, o.dims, op.output.dims) for x, o in zip(xs, op.inputs)))

    return run


def _whole_axes(op: Operator) -> tuple[int, ...]:
    """Output positions of the axes the operator keeps whole (what it normalises over)."""
    whole = tuple(i for i, d in enumerate(op.output.dims) if d not in op.partitionable)
    if not whole:
        raise VerifyError(f"operator {op.name!r} ({op.kind}): no whole axis to normalise over")
    return whole


def _layernorm(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    jnp = _jnp()
    axes = _whole_axes(op)
    x = _align(xs[0], op.inputs[0].dims, op.output.dims)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + 1e-5)
    for x_extra, o in zip(xs[1:], op.inputs[1:]):
        aligned = _align(x_extra, o.dims, op.output.dims)
        y = y * aligned if o is op.inputs[1] else y + aligned
    return y


def _softmax(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    import jax

    x = _align(xs[0], op.inputs[0].dims, op.output.dims)
    return jax.nn.softmax(x, axis=_whole_axes(op))


def _gelu(x: Any) -> Any:
    import jax

    return jax.nn.gelu(x)


def _relu(x: Any) -> Any:
    import jax

    return jax.nn.relu(x)


OPERATORS: dict[str, Callable[[Operator, list[Any], Reduce], Any]] = {
    "linear": _linear,
    "add": _elementwise(lambda a, b: a + b),
    "mul": _elementwise(lambda a, b: a * b),
    "relu": _elementwise(_relu),
    "gelu": _elementwise(_gelu),
    "layernorm": _layernorm,
    "softmax": _softmax,
}

#: Kinds whose computation is not an einsum of their operands.
UNSUPPORTED = ("conv2d", "pool", "embedding")


def compute(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """Run ``op`` on ``xs`` (one array per input slot); any other kind is an einsum."""
    if op.kind in UNSUPPORTED:
        raise VerifyError(f"operator {op.name!r}: the replay has no JAX form for kind {op.kind!r}")
    return OPERATORS.get(op.kind, _einsum)(op, xs, reduce)
