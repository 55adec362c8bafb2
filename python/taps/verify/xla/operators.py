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
from taps.graph import MOE_DISPATCH, MOE_ROUTE, Operator

Reduce = Callable[..., Any]


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _align(x: Any, dims: Sequence[str], to: Sequence[str]) -> Any:
    """``x`` (dims ``dims``, a subset of ``to``, and any of size 1 that ``to`` lacks: a
    broadcast operand kept with ``keepdim``) transposed and expanded to broadcast as ``to``."""
    jnp = _jnp()
    extra = [i for i, d in enumerate(dims) if d not in to]
    if extra:
        x, dims = jnp.squeeze(x, extra), [d for d in dims if d in to]
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


def _silu(x: Any) -> Any:
    import jax

    return jax.nn.silu(x)


def _divide(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """``div`` of two operands; of one (a division by a constant the graph does not keep, as a
    JAX mean's sum over its count), the operand as an einsum carries it."""
    if len(xs) != 2:
        return _einsum(op, xs, reduce)
    a, b = (_align(x, o.dims, op.output.dims) for x, o in zip(xs, op.inputs))
    return a / b


def balanced_routing(tokens: int, experts: int, capacity: int) -> np.ndarray:
    """A fixed routing ``[s, e, c]`` (0/1) of ``tokens`` per group: the ``k`` choices of every
    token, ``k = c e / s`` (at least 1, at most ``e``), fill the experts' slots in turn, token by
    token (choice ``q = t k + j`` to expert ``q mod e``, slot ``q // e``): every expert gets as
    many tokens as the capacity allows, the balanced routing taps prices."""
    k = max(1, min(experts, capacity * experts // tokens))
    mask = np.zeros((tokens, experts, capacity))
    for q in range(min(tokens * k, experts * capacity)):
        mask[q // k, q % experts, q // experts] = 1.0
    return mask


def _route(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """``moe_route`` ``gse -> gsec``: the router's scores at the slots of
    :func:`balanced_routing` (the graph keeps the capacity, not the model's top-k, and the
    collectives do not depend on which tokens go where); the same in every token group, so a
    device's block of groups needs no other."""
    (o,) = op.inputs
    scores = _align(xs[0], o.dims, [d for d in op.output.dims if d in o.dims])
    s, e, c = (op.axis_size(d) for d in op.output.dims[1:])
    if tuple(scores.shape[1:]) != (s, e):
        raise VerifyError(f"operator {op.name!r} ({op.kind}): the replay routes whole groups only")
    mask = balanced_routing(s, e, c).astype(scores.dtype)
    return scores[..., None] * mask[None]


def _dispatch(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """``moe_dispatch`` ``gsec,gsm -> egcm``: each expert's tokens gathered where the routing
    tensor is not zero (its weights apply at the combine; no gradient reaches the router here,
    as in an index-based dispatch)."""
    mask = _jnp().where(xs[0] != 0, 1.0, 0.0).astype(xs[0].dtype)
    return _einsum(op, [mask, *xs[1:]], reduce)


def _glu(act: Callable[[Any], Any]) -> Callable[[Operator, list[Any], Reduce], Any]:
    """A gated activation, ``act(gate) * up``: of two operands, or of one whose extra axis of
    size 2 holds gate (first) and up (a fused gate-up projection)."""

    def run(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
        out = op.output.dims
        if len(xs) == 2:
            gate, up = (_align(x, o.dims, out) for x, o in zip(xs, op.inputs))
        else:
            dims = op.inputs[0].dims
            (pair,) = [i for i, d in enumerate(dims) if d not in out]
            rest = [d for d in dims if d in out]
            gate, up = (_align(_jnp().take(xs[0], i, axis=pair), rest, out) for i in (0, 1))
        return act(gate) * up

    return run


OPERATORS: dict[str, Callable[[Operator, list[Any], Reduce], Any]] = {
    "add": _elementwise(lambda a, b: a + b),
    "mul": _elementwise(lambda a, b: a * b),
    "relu": _elementwise(_relu),
    "gelu": _elementwise(_gelu),
    "silu": _elementwise(_silu),
    "div": _divide,
    "layernorm": _layernorm,
    "softmax": _softmax,
    MOE_ROUTE: _route,
    MOE_DISPATCH: _dispatch,
    "swiglu": _glu(_silu),
    "geglu": _glu(_gelu),
    "reglu": _glu(_relu),
}

#: Kinds whose computation is not an einsum of their operands.
UNSUPPORTED = ("embedding",)


def compute(op: Operator, xs: list[Any], reduce: Reduce) -> Any:
    """Run ``op`` on ``xs`` (one array per input slot); any other kind is an einsum."""
    if op.kind in UNSUPPORTED:
        raise VerifyError(f"operator {op.name!r}: the replay has no JAX form for kind {op.kind!r}")
    return OPERATORS.get(op.kind, _einsum)(op, xs, reduce)
