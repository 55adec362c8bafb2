"""Graph operators as JAX code: one ``jnp.einsum`` or elementwise function per operator.

The same function runs on whole tensors (the unsharded reference) and on a device's blocks under
``shard_map``; ``reduce`` is where the partial sums of a split contracted axis are summed (the
forward all_reduce of the sharded run, nothing in the reference). Operands are aligned by their
axis names, so any operand dim order works. A convolution or a pooling is an einsum too, with a
constant window tensor per spatial axis (:func:`window`): the graph keeps their axes and sizes,
not their stride or padding, and the replay needs only the axes (spatial axes are never split, so
the windows are whole on every device).

Reads by index (an embedding, ``index``, ``gather``) run on integer index values the program
draws below the indexed size (:func:`index_bounds`); a vocabulary split over devices reads its
own rows as a one-hot product, whose partial sums the reduce adds up, as a vocabulary-parallel
embedding does. Axes of the output that no input has are broadcast (``expand``, ``repeat``), or
taken from the whole input axis they narrow (``slice``, ``split``: the graph keeps sizes, not
offsets, so the operators narrowing one tensor read consecutive pieces, :func:`narrow_offsets`);
``cat`` joins its operands in order,
zeros where a constant operand was. Pointwise kinds run their function (a ``pow`` squares: the
exponent is not in the graph; a scalar operand the graph drops is a constant of the operator's
own, :func:`constant`); ``cumsum`` sums along its whole axis; others of one operand pass it
through.
Where an operator needs its place in the tensor (a one-hot's offset, a broadcast's block size),
it asks its :class:`Block`.

``reduce(y, addend=None)`` sums the partial sums of ``y`` and adds ``addend`` (an operand added
after the contraction, a linear's bias, already aligned to the output) once.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from taps.errors import VerifyError
from taps.frontends.gshard import fused_pair
from taps.graph import MOE_DISPATCH, MOE_ROUTE, Operator

Reduce = Callable[..., Any]


class Block:
    """A device's block of an operator's axes: per axis, its size and the mesh axes that split
    it (major first); the whole axis from 0 outside ``shard_map`` (no split). ``offsets``: per
    piece the operator reads (a slice's output axis, a selected dim), where it starts in the
    input's dim (:func:`narrow_offsets`; drawn from the operator's name if not given)."""

    def __init__(
        self,
        op: Operator,
        splits: Mapping[str, Sequence[tuple[str, int]]],
        offsets: Mapping[str, int] | None = None,
    ) -> None:
        self.splits = {a: tuple(splits.get(a, ())) for a in op.axes}
        self.sizes = {
            a: op.axis_size(a) // math.prod(n for _, n in s) for a, s in self.splits.items()
        }
        self.offsets = dict(offsets or {})

    def size(self, axis: str) -> int:
        """The block's size along ``axis``."""
        return self.sizes[axis]

    def start(self, axis: str) -> Any:
        """The block's first index along ``axis`` (a traced scalar under ``shard_map``)."""
        if not self.splits[axis]:
            return 0
        import jax

        index: Any = 0
        for name, n in self.splits[axis]:
            index = index * n + jax.lax.axis_index(name)
        return index * self.sizes[axis]


#: An operator's JAX form: ``(op, operands, reduce, block) -> output``.
Form = Callable[[Operator, list[Any], Reduce, Block], Any]


def whole(op: Operator, offsets: Mapping[str, int] | None = None) -> Block:
    """The block of a device holding ``op``'s whole axes."""
    return Block(op, {}, offsets)


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


#: A convolution's (input, kernel, output) spatial axes, and a pooling's (input, output): named
#: ``hi kh ho`` and ``wi kw wo`` in two dims, ``x<i>i k<i> x<i>o`` in one or three.
WINDOWS = (
    ("hi", "kh", "ho"),
    ("wi", "kw", "wo"),
    *((f"x{i}i", f"k{i}", f"x{i}o") for i in range(3)),
    ("hi", "ho"),
    ("wi", "wo"),
    *((f"x{i}i", f"x{i}o") for i in range(3)),
)


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


def _narrows(
    op: Operator, dims: Sequence[str], factors: Sequence[Sequence[str]]
) -> list[tuple[int, str, int]]:
    """The dims of an operand (``dims``, one of ``factors``) that ``op`` reads a piece of:
    ``<name>_in`` narrowed to its output axis ``<name>_out`` (which no factor has), and
    ``<name>_sel`` of which it selects one index (a split's piece, ``unbind``; the output lacks
    it). As ``(position, key, size)``: ``key`` the output axis, or the selected dim."""
    out = []
    for k, d in enumerate(dims):
        narrow = d[: -len("_in")] + "_out" if d.endswith("_in") else ""
        if narrow in op.output.dims and not any(narrow in f for f in factors):
            out.append((k, narrow, op.axis_size(narrow)))
        elif d.endswith("_sel") and d not in op.output.dims:
            out.append((k, d, 1))
    return out


def narrow_offsets(ops: Sequence[Operator]) -> dict[str, dict[str, int]]:
    """Where each operator reading a piece of its input (:func:`_narrows`: a slice, a split's
    piece) starts in that dim: the operators reading pieces of one tensor's dim take
    consecutive pieces, in graph order (a split's or an unbind's pieces, a rotary half and the
    other), wrapping round past its end. Sibling pieces differ, as in the model (the graph
    keeps sizes, not offsets)."""
    taken: dict[tuple[str, int], int] = {}
    out: dict[str, dict[str, int]] = {}
    for op in ops:
        factors = [o.dims for o in op.inputs if not o.addend]
        for o in op.inputs:
            if o.addend:
                continue
            for k, key, n in _narrows(op, o.dims, factors):
                first = taken.get((o.tensor, k), 0)
                out.setdefault(op.name, {})[key] = first % (op.axis_size(o.dims[k]) - n + 1)
                taken[(o.tensor, k)] = first + n
    return out


def _contract(
    op: Operator,
    factors: Sequence[tuple[Sequence[str], Any]],
    addends: Sequence[tuple[Sequence[str], Any]],
    reduce: Reduce,
    block: Block,
) -> Any:
    """The product of ``factors`` (and of a convolution's or pooling's windows) summed over the
    axes the output lacks, its partial sums reduced; then ``addends`` (a bias), once. An output
    axis ``<name>_out`` no factor has narrows the whole input axis ``<name>_in`` (a slice, from
    the block's offset), and a dim ``<name>_sel`` the output lacks is read at one index (a
    split's piece); any other output axis no factor has is a broadcast."""
    jnp = _jnp()
    narrowed: list[tuple[list[str], Any]] = []
    for dims, x in factors:
        names = list(dims)
        for k, key, _ in _narrows(op, dims, [f for f, _ in factors]):
            # A selected index stays a dim of size 1, which the einsum sums away.
            n = block.size(key) if key in op.output.dims else 1
            # Its own offset (the graph keeps none): XLA must not merge slices the model takes
            # at different places.
            first = block.offsets.get(key)
            if first is None:
                first = zlib.crc32(op.name.encode()) % (op.axis_size(dims[k]) - n + 1)
            x = jnp.take(x, first + np.arange(n), axis=k)
            if key in op.output.dims:
                names[k] = key
        narrowed.append((names, x))
    narrowed += [(list(dims), w) for dims, w in _windows(op, narrowed[0][1].dtype)]
    letters = {a: chr(ord("a") + i) if i < 26 else chr(65 + i - 26) for i, a in enumerate(op.axes)}

    def word(dims: Sequence[str]) -> str:
        return "".join(letters[d] for d in dims)

    out = op.output.dims
    made = [d for d in out if any(d in dims for dims, _ in narrowed)]
    spec = ",".join(word(dims) for dims, _ in narrowed) + "->" + word(made)
    y = jnp.einsum(spec, *(x for _, x in narrowed))
    if len(made) < len(out):
        y = jnp.expand_dims(y, [i for i, d in enumerate(out) if d not in made])
        y = jnp.broadcast_to(y, [block.size(d) for d in out])
    if not addends:
        return reduce(y)
    aligned = [_align(x, dims, out) for dims, x in addends]
    return reduce(y, sum(aligned[1:], aligned[0]))


def _einsum(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """The operator as the product of its operands (:func:`_contract`), addends after."""
    pairs = list(zip(op.inputs, xs))
    factors = [(o.dims, x) for o, x in pairs if not o.addend]
    return _contract(op, factors, [(o.dims, x) for o, x in pairs if o.addend], reduce, block)


def _ids(x: Any, bound: int) -> Any:
    """Index values: integers as given; computed ones (floats) folded into ``[0, bound)``."""
    jnp = _jnp()
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x
    return jnp.mod(jnp.floor(jnp.abs(x)), bound).astype(jnp.int32)


def _embedding(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``ids x table``: the table's rows the ids pick, as the one-hot product over the
    device's block of the vocabulary (zero for ids outside it; the reduce sums the blocks)."""
    import jax

    ids, table = op.inputs
    v = table.dims[0]
    hot = jax.nn.one_hot(
        _ids(xs[0], op.axis_size(v)) - block.start(v), block.size(v), dtype=xs[1].dtype
    )
    return _contract(op, [([*ids.dims, v], hot), (table.dims, xs[1])], [], reduce, block)


def _source(op: Operator, suffix: str) -> int | None:
    """The slot of the tensor an ``index`` or ``gather`` reads from (its dims with ``suffix``
    are the indexed ones); ``None`` when it is a constant the graph does not keep."""
    return next(
        (i for i, o in enumerate(op.inputs) if any(d.endswith(suffix) for d in o.dims)), None
    )


def index_bounds(op: Operator) -> dict[int, int]:
    """Per input slot read as index values, the size they index (values are drawn below it)."""
    if op.kind == "embedding":
        return {0: op.axis_size(op.inputs[1].dims[0])}
    suffix = {"index": "_idx", "gather": "_src"}.get(op.kind)
    if suffix is None:
        return {}
    src = _source(op, suffix)
    if src is None:
        return {i: 1 for i in range(len(op.inputs))}
    dims = op.inputs[src].dims
    indexed = [op.axis_size(d) for d in dims if d.endswith(suffix)]
    return {i: min(indexed) for i in range(len(op.inputs)) if i != src}


def constant(op: Operator) -> float:
    """The value, in ``[1, 2)``, the replay takes for a constant operand of ``op`` the graph
    does not keep (a scalar addend or factor, a buffer read by index): drawn from the
    operator's name, so that two operators the model computes differently never compute the
    same value (XLA would merge their collectives into one, where the model runs both)."""
    return 1.0 + zlib.crc32(op.name.encode()) % 1024 / 1024


def _constant_source(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """An ``index`` or ``gather`` of a constant table (what it holds is not in the graph): read
    as the table whose row ``i`` holds ``i + c`` (:func:`constant`), so the index values plus
    ``c``, broadcast."""
    factors = [(o.dims, x.astype(_jnp().float32)) for o, x in zip(op.inputs, xs)]
    # Added once, after the partial sums of a split table (an addend).
    return _contract(op, factors, [((), _jnp().float32(constant(op)))], reduce, block)


def _place(op: Operator, dims: Sequence[str], block: Block) -> Any:
    """Each element's row-major position in the whole tensor of ``dims``, on the block."""
    jnp = _jnp()
    place: Any = 0
    for k, d in enumerate(dims):
        shape = [1] * len(dims)
        shape[k] = block.size(d)
        at = jnp.reshape(block.start(d) + jnp.arange(block.size(d)), shape)
        place = place * op.axis_size(d) + at
    return place


def _index(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``x[i, j]``: the indexed dims of ``x`` are whole, the index tensors' dims (``i0``, ...)
    and ``x``'s other dims are the output's, in any split."""
    src = _source(op, "_idx")
    if src is None:
        return _constant_source(op, xs, reduce, block)
    x_dims = op.inputs[src].dims
    at = [k for k, d in enumerate(x_dims) if d.endswith("_idx")]
    kept = [d for d in x_dims if not d.endswith("_idx")]
    idx = [d for d in op.output.dims if d not in kept]
    bound = index_bounds(op)
    ids = tuple(
        _align(_ids(x, bound[i]), o.dims, idx)
        for i, (o, x) in enumerate(zip(op.inputs, xs))
        if i != src
    )
    if len(ids) < len(at):  # constant indices (dropped, the leading ones: ``x[arange(b), j]``)
        place = _place(op, idx, block)
        ids = tuple(place % op.axis_size(x_dims[k]) for k in at[: len(at) - len(ids)]) + ids
    x = _jnp().transpose(xs[src], at + [k for k in range(len(x_dims)) if k not in at])
    y = x.at[ids].get(mode="clip")
    y = _jnp().broadcast_to(y, [block.size(d) for d in idx] + list(y.shape[len(idx) :]))
    return _align(y, idx + kept, op.output.dims)


def _gather(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``gather(x, dim, ids)``: ``x`` along ``dim`` at the ids; ``x``'s other ``_src`` dims are
    read as their prefix of the ids' size. Without ids (a constant index), each position reads
    its own row."""
    src = _source(op, "_src")
    if src is None:
        return _constant_source(op, xs, reduce, block)
    jnp = _jnp()
    x, names = xs[src], list(op.inputs[src].dims)
    axis = None
    for k, d in enumerate(names):
        if d.endswith("_src"):
            names[k] = base = d[: -len("_src")]
            if base in op.partitionable:
                axis = k
            else:
                x = jnp.take(x, np.arange(block.size(base)), axis=k)
    if axis is None:
        raise VerifyError(f"operator {op.name!r} ({op.kind}): no gathered dim to replay")
    out = op.output.dims
    x = _align(x, names, out)
    rest = [(o, v) for i, (o, v) in enumerate(zip(op.inputs, xs)) if i != src]
    if rest:
        (o, v), bound = rest[0], index_bounds(op)[1 - src]
        ids = _align(_ids(v, bound), o.dims, out)
    else:
        k = out.index(names[axis])
        shape = [1] * len(out)
        shape[k] = block.size(out[k])
        ids = jnp.reshape(block.start(out[k]) + jnp.arange(block.size(out[k])), shape)
    ids = jnp.broadcast_to(ids, [block.size(d) for d in out])
    return jnp.take_along_axis(x, ids, axis=out.index(names[axis]), mode="clip")


def _cat(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``cat``: the operands in order along the joined (whole) axis ``<name>_cat``, zeros after
    them where the graph dropped a constant operand."""
    jnp = _jnp()
    out = list(op.output.dims)
    (joined,) = [k for k, d in enumerate(out) if d.endswith("_cat")]
    parts = []
    for o, x in zip(op.inputs, xs):
        names = [out[joined] if d not in out else d for d in o.dims]
        parts.append(_align(x, names, out))
    y = jnp.concatenate(parts, axis=joined)
    pad = [(0, 0)] * len(out)
    pad[joined] = (0, block.size(out[joined]) - y.shape[joined])
    return jnp.pad(y, pad)


def _stack(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``stack``: the operands along the new (output-only) axis, zeros for dropped constants."""
    jnp = _jnp()
    out = list(op.output.dims)
    (new,) = [k for k, d in enumerate(out) if all(d not in o.dims for o in op.inputs)]
    rest = [d for d in out if d != out[new]]
    y = jnp.stack([_align(x, o.dims, rest) for o, x in zip(op.inputs, xs)], axis=new)
    pad = [(0, 0)] * len(out)
    pad[new] = (0, block.size(out[new]) - y.shape[new])
    return jnp.pad(y, pad)


def _elementwise(fn: Callable[..., Any], arity: int = 1) -> Form:
    """``fn`` of the operands aligned to the output; of fewer than ``arity`` (the others
    constants the graph does not keep), of the operand and :func:`constant`."""

    def run(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
        aligned = [_align(x, o.dims, op.output.dims) for x, o in zip(xs, op.inputs)]
        if len(aligned) < arity:
            aligned.append(constant(op))
        return fn(*aligned)

    return run


#: The ``jax.numpy`` function of each comparison kind.
_COMPARISONS = {
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
}


def _compare(kind: str) -> Callable[[Any, Any], Any]:
    """The comparison ``kind`` of two operands, as 0/1 in the first one's dtype."""
    return lambda a, b: getattr(_jnp(), _COMPARISONS[kind])(a, b).astype(a.dtype)


def _whole_axes(op: Operator) -> tuple[int, ...]:
    """Output positions of the axes the operator keeps whole (what it normalises over)."""
    whole = tuple(i for i, d in enumerate(op.output.dims) if d not in op.partitionable)
    if not whole:
        raise VerifyError(f"operator {op.name!r} ({op.kind}): no whole axis to normalise over")
    return whole


def _layernorm(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
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


def _cumsum(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``cumsum`` along the axis it keeps whole."""
    y = _align(xs[0], op.inputs[0].dims, op.output.dims)
    for axis in _whole_axes(op):
        y = _jnp().cumsum(y, axis=axis)
    return y


def _softmax(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
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


def _square(x: Any) -> Any:
    return x * x


def _divide(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``div`` of two operands; of one (a division by a constant the graph does not keep, as a
    JAX mean's sum over its count), the operand as an einsum carries it over
    :func:`constant`."""
    if len(xs) != 2:
        return _einsum(op, xs, reduce, block) / constant(op)
    a, b = (_align(x, o.dims, op.output.dims) for x, o in zip(xs, op.inputs))
    return a / b


def _mean(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``mean``: the einsum's sum over the axes the output lacks, divided by their count."""
    summed = {d for o in op.inputs for d in o.dims} - set(op.output.dims)
    return _einsum(op, xs, reduce, block) / math.prod(op.axis_size(d) for d in summed)


def _chain(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """A chain of elementwise primitives the JAX front end fused into one operator (kind
    ``sub+exp``): the graph keeps its operands, not how the chain wires them, so a weighted
    mean of the operands aligned to the output (operand ``i`` weighs ``i + 1``), through the
    softsign ``s / (1 + |s|)``. Bounded, so a deep model's chains (a hand-written layer norm, a
    softmax, in every layer) neither overflow nor vanish, where their product would grow with
    each layer. The weights differ so that no two operands get one gradient (XLA would compute
    their reductions once: a layer norm's scale and bias). A chain that sums a split axis is an
    einsum (its partial sums are linear), and so is a chain of integers (index arithmetic: a
    negative id wrapped by ``where(i < 0, i + n, i)`` stays an id)."""
    jnp = _jnp()
    if any(op.axis_size(d) > 1 for d in op.contracted) or any(
        jnp.issubdtype(x.dtype, jnp.integer) for x in xs
    ):
        return _einsum(op, xs, reduce, block)
    aligned = [
        _align(x, o.dims, op.output.dims) * (i + 1) for i, (x, o) in enumerate(zip(xs, op.inputs))
    ]
    mean = sum(aligned[1:], aligned[0]) / math.comb(len(aligned) + 1, 2)
    return mean / (1 + jnp.abs(mean))


def _unary(name: str) -> Callable[[Any], Any]:
    """A pointwise function of ``jax.numpy`` by name (looked up when run: jax loads lazily)."""
    return lambda x: getattr(_jnp(), name)(x)


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


def _route(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
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


def _dispatch(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
    """``moe_dispatch`` ``gsec,gsm -> egcm``: each expert's tokens gathered where the routing
    tensor is not zero (its weights apply at the combine; no gradient reaches the router here,
    as in an index-based dispatch)."""
    mask = _jnp().where(xs[0] != 0, 1.0, 0.0).astype(xs[0].dtype)
    return _einsum(op, [mask, *xs[1:]], reduce, block)


def _glu(act: Callable[[Any], Any]) -> Form:
    """A gated activation, ``act(gate) * up``: of two operands, or of one whose extra axis of
    size 2 holds gate (first) and up (a fused gate-up projection)."""

    def run(op: Operator, xs: list[Any], reduce: Reduce, block: Block) -> Any:
        out = op.output.dims
        if len(xs) == 2:
            gate, up = (_align(x, o.dims, out) for x, o in zip(xs, op.inputs))
        else:
            pair, rest = fused_pair(op)
            gate, up = (_align(_jnp().take(xs[0], i, axis=pair), rest, out) for i in (0, 1))
        return act(gate) * up

    return run


OPERATORS: dict[str, Form] = {
    # n-ary: the JAX front end fuses a chain of adds (or of muls) into one operator.
    "add": _elementwise(lambda *xs: sum(xs[1:], xs[0]), 2),
    "embedding": _embedding,
    "index": _index,
    "gather": _gather,
    "cat": _cat,
    "stack": _stack,
    "mul": _elementwise(lambda *xs: math.prod(xs[1:], start=xs[0]), 2),
    # Comparisons: 0/1 in the first operand's dtype (a mask, no gradient: position ids from
    # a padding mask stay small integers, exact in floats).
    **{kind: _elementwise(_compare(kind), 2) for kind in _COMPARISONS},
    "relu": _elementwise(_relu),
    "gelu": _elementwise(_gelu),
    "silu": _elementwise(_silu),
    "div": _divide,
    "mean": _mean,
    # A power's exponent is not in the graph: squared, as RMS norms take it.
    "pow": _elementwise(_square),
    "square": _elementwise(_square),
    "rsqrt": _elementwise(lambda x: _jnp().reciprocal(_jnp().sqrt(_jnp().abs(x)))),
    "sqrt": _elementwise(lambda x: _jnp().sqrt(_jnp().abs(x))),
    "exp": _elementwise(_unary("exp")),
    "neg": _elementwise(_unary("negative")),
    "tanh": _elementwise(_unary("tanh")),
    "sigmoid": _elementwise(lambda x: _jnp().reciprocal(1 + _jnp().exp(-x))),
    "layernorm": _layernorm,
    "cumsum": _cumsum,
    "softmax": _softmax,
    MOE_ROUTE: _route,
    MOE_DISPATCH: _dispatch,
    "swiglu": _glu(_silu),
    "geglu": _glu(_gelu),
    "reglu": _glu(_relu),
}


def compute(op: Operator, xs: list[Any], reduce: Reduce, block: Block | None = None) -> Any:
    """Run ``op`` on ``xs`` (one array per input slot; ``block``: where the device's block of
    its axes lies, the whole axes by default); any other kind is an einsum."""
    block = whole(op) if block is None else block
    y = OPERATORS.get(op.kind, _chain if "+" in op.kind else _einsum)(op, xs, reduce, block)
    # An output axis only a size-1 operand has (a mask broadcast by the op) is the block's.
    return _jnp().broadcast_to(y, [block.size(d) for d in op.output.dims])
