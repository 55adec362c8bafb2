"""Graph operators as JAX code: one ``jnp.einsum`` or elementwise function per operator.

The same function runs on whole tensors (the unsharded reference) and on a device's blocks under
``shard_map``; ``reduce`` is where the partial sums of a split contracted axis are summed (the
forward all_reduce of the sharded run, nothing in the reference). Operands are aligned by their
axis names, so any operand dim order works. A convolution or a pooling is an einsum too, with a
constant window tensor per spatial axis (:func:`window`): the graph keeps their axes and sizes,
not their stride or padding, and the replay needs only the axes (spatial axes are never split, so
the windows are whole on every device). Embeddings (a gather) are a :class:`VerifyError`.

``reduce(y, addend=None)`` sums the partial sums of ``y`` and adds ``addend`` (an operand added
after the contraction, a linear's bias, already aligned to the output) once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from taps.errors import VerifyError
from taps.graph import Operator

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


#: A convolution's (input, kernel, output) spatial axes, and a pooling's (input, output).
WINDOWS = (("hi", "kh", "ho"), ("wi", "kw", "wo"), ("hi", "ho"), ("wi", "wo"))


def window(sizes: Sequence[int]) -> np.ndarray:
    """The 0/1 tensor that picks, for output position ``p`` and kernel offset ``k``, the input
    position ``p * s + k - pad`` (zero outside the input), ``s = max(1, n_in // n_out)`` and the
    padding centring the windows: a strided, padded convolution along one spatial axis with the
    graph's sizes. Without a kernel axis (pooling), the mean over the window of ``s`` inputs."""
    n_in, n_out = sizes[0], sizes[-1]
    s = max(1, n_in // n_out)
    n_k = sizes[1] if len(sizes) == 3 else s
    pad = max(0, ((n_out - 1) * s + n_k - n_in + 1) // 2)
    out = np.zeros((n_in, n_k, n_out))
    for p in range(n_out):
        for k in range(n_k):
            if 0 <= p * s + k - pad < n_in:
                out[p * s + k - pad, k, p] = 1.0
    return out if len(sizes) == 3 else out.sum(axis=1) / n_k


def _windows(op: Operator, dtype: Any) -> list[tuple[tuple[str, ...], Any]]:
    """The :func:`window` operands of the spatial axes ``op`` has (a convolution's or a
    pooling's), which no graph operand carries: the stride, padding or folded pooling are not in
    the graph, only the sizes."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for dims in WINDOWS:
        if all(d in op.axes for d in dims) and not any(d in w for w, _ in out for d in dims):
            out.append((dims, window([op.axis_size(d) for d in dims]).astype(dtype)))
    return out


def _einsum(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """The product of the factors (and of a convolution's or pooling's windows) summed over the
    axes the output lacks; then the addends (a bias), once, after the partial sums."""
    letters: dict[str, str] = {}
    for a in op.axes:
        letters[a] = chr(ord("a") + len(letters)) if len(letters) < 26 else chr(65 + len(letters))

    def word(dims: Sequence[str]) -> str:
        return "".join(letters[d] for d in dims)

    factors = [(o.dims, x) for o, x in zip(op.inputs, xs) if not o.addend]
    factors += _windows(op, xs[0].dtype)
    missing = [d for d in op.output.dims if all(d not in dims for dims, _ in factors)]
    wide = [d for d in missing if op.axis_size(d) != 1]
    if wide:
        raise VerifyError(
            f"operator {op.name!r} ({op.kind}): output axes {wide} come from no input, so it "
            "has no einsum form to replay"
        )
    # A size-1 output axis no input has (a mean kept with keepdims, then broadcast by the
    # reader): the einsum without it, the axis added back.
    made = [d for d in op.output.dims if d not in missing]
    spec = ",".join(word(dims) for dims, _ in factors) + "->" + word(made)
    y = _jnp().einsum(spec, *(x for _, x in factors))
    if missing:
        y = _jnp().expand_dims(y, [op.output.dims.index(d) for d in missing])
    addends = [_align(x, o.dims, op.output.dims) for o, x in zip(op.inputs, xs) if o.addend]
    return reduce(y, sum(addends[1:], addends[0])) if addends else reduce(y)


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
    "add": _elementwise(lambda a, b: a + b),
    "mul": _elementwise(lambda a, b: a * b),
    "relu": _elementwise(_relu),
    "gelu": _elementwise(_gelu),
    "layernorm": _layernorm,
    "softmax": _softmax,
}

#: Kinds whose computation is not an einsum of their operands.
UNSUPPORTED = ("embedding",)


def compute(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """Run ``op`` on ``xs`` (one array per input slot); any other kind is an einsum."""
    if op.kind in UNSUPPORTED:
        raise VerifyError(f"operator {op.name!r}: the replay has no JAX form for kind {op.kind!r}")
    return OPERATORS.get(op.kind, _einsum)(op, xs, reduce)
