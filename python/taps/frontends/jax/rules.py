"""How each JAX primitive becomes taps operators: one rule per primitive, in :data:`RULES`.

A rule takes the builder, the jaxpr equation, its input values and the operator name to use, and
returns the output values. Every operator is an einsum over named axes (docs/graph.md), so a rule's
work is to label the dims of its operands and output:

- elementwise primitives share one label per output dim (broadcast operands skip the dims they
  broadcast); every axis may be split;
- ``dot_general``: batch dims shared by both operands and the output, contracting dims by both
  operands (split, they leave partial sums), free dims by one operand and the output;
- reductions: the reduced dims are contracted and may be split: each device reduces its part and an
  all_reduce combines the parts, which costs the same for a max as for a sum;
- convolution and pooling: batch and channels may be split, spatial dims stay whole;
- a gather that picks elements along some dims (``table[ids]``, ``take_along_axis``) contracts
  those dims, as ``taps.Graph.embedding`` its vocabulary; a scatter mirrors it;
- transposes, broadcasts, squeezes and dtype conversions relabel or alias a value (no operator),
  and reshapes are views (:mod:`taps.frontends.jax.builder`).

Calls (``jit``, ``custom_jvp_call``, ...) are inlined by :mod:`taps.frontends.jax.convert`, not
here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from taps.frontends.jax.builder import JaxprGraphBuilder, JaxprValue, constant

#: A rule returns the equation's output values, or None when the equation is a form of its
#: primitive the rule does not cover (then it is unsupported, as a primitive without a rule).
Rule = Callable[[JaxprGraphBuilder, Any, list[JaxprValue], str], "list[JaxprValue] | None"]


def _out(eqn: Any, i: int = 0) -> tuple[tuple[int, ...], int]:
    """Shape and bytes per element of an equation's output."""
    aval = eqn.outvars[i].aval
    return tuple(int(d) for d in aval.shape), int(aval.dtype.itemsize)


def _labels(n: int, prefix: str = "d") -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


def _stretch(v: JaxprValue, shape: tuple[int, ...]) -> JaxprValue:
    """``v`` read as ``shape``: a size-1 dim facing a larger one is a broadcast."""
    if not v.shape:
        return JaxprValue(v.source, (None,) * len(shape), shape)
    dims = tuple(d if n == m else None for d, n, m in zip(v.dims, v.shape, shape))
    return JaxprValue(v.source, dims, shape)


def elementwise(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """Operands of the output's shape, or broadcasting to it (scalars, size-1 dims)."""
    shape, dtype = _out(eqn)
    labels = _labels(len(shape))
    inputs = [(_stretch(v, shape), labels) for v in ins]
    return [b.op(name, eqn.primitive.name, inputs, labels, shape, dtype, fusible=True)]


def alias(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """A dtype conversion, copy or gradient stop: the same tensor."""
    return ins[: len(eqn.outvars)]


def broadcast_in_dim(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """The operand relabelled: new and stretched dims read no axis of its source."""
    (v,) = ins[:1]
    shape, _ = _out(eqn)
    dims: list[int | None] = [None] * len(shape)
    for i, d in enumerate(eqn.params["broadcast_dimensions"]):
        if v.shape[i] == shape[d]:  # a size-1 dim stretched to more is a broadcast
            dims[d] = v.dims[i]
    return [JaxprValue(v.source, tuple(dims), shape)]


def transpose(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """The operand's dims permuted: a relabelling."""
    (v,) = ins
    perm = eqn.params["permutation"]
    return [JaxprValue(v.source, tuple(v.dims[p] for p in perm), tuple(v.shape[p] for p in perm))]


def squeeze(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """The operand without its squeezed size-1 dims: a relabelling."""
    (v,) = ins
    gone = {d % len(v.shape) for d in eqn.params["dimensions"]}
    keep = [i for i in range(len(v.shape)) if i not in gone]
    return [JaxprValue(v.source, tuple(v.dims[i] for i in keep), tuple(v.shape[i] for i in keep))]


def reshape(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """A view of the operand's source (:meth:`JaxprGraphBuilder.reshape`)."""
    shape, dtype = _out(eqn)
    return [b.reshape(name, ins[0], shape, dtype)]


def reduction(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """Reduced dims are contracted: split, each device reduces its part and an all_reduce
    combines them. With ``split_reductions=False`` they stay whole."""
    (v,) = ins
    shape, dtype = _out(eqn)
    axes = {a % len(v.shape) for a in eqn.params["axes"]}
    labels = _labels(len(v.shape))
    out = tuple(label for i, label in enumerate(labels) if i not in axes)
    part = None if b.split_reductions else out
    return [b.op(name, eqn.primitive.name, [(v, labels)], out, shape, dtype, part)]


def dot_general(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """Batch dims (``b0``, ...) in both operands and the output, contracting dims (``k0``, ...)
    in both operands, free dims (``m0``, ... of the left, ``n0``, ... of the right) in one operand
    and the output, which lists batch, left free, right free dims in that order."""
    lhs, rhs = ins
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    left: list[str] = [""] * len(lhs.shape)
    right: list[str] = [""] * len(rhs.shape)
    for prefix, pairs in (("b", zip(lb, rb)), ("k", zip(lc, rc))):
        for i, (x, y) in enumerate(pairs):
            left[x] = right[y] = f"{prefix}{i}"
    free_l = [i for i in range(len(left)) if not left[i]]
    free_r = [i for i in range(len(right)) if not right[i]]
    for j, i in enumerate(free_l):
        left[i] = f"m{j}"
    for j, i in enumerate(free_r):
        right[i] = f"n{j}"
    out = (*_labels(len(lb), "b"), *(left[i] for i in free_l), *(right[i] for i in free_r))
    shape, dtype = _out(eqn)
    inputs = [(lhs, tuple(left)), (rhs, tuple(right))]
    return [b.op(name, "dot_general", inputs, out, shape, dtype)]


def _spatial(n: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """Labels of the spatial dims of a convolution's input, kernel and output."""
    return _labels(n, "i"), _labels(n, "k"), _labels(n, "o")


def conv_general_dilated(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """Batch ``b``, input channels ``ci`` (contracted), output channels ``co`` may be split;
    spatial dims stay whole. With ``feature_group_count`` g > 1 the channels are read as
    (g, per group) views and the groups are an axis ``g`` that may be split too (a depthwise
    convolution has one input channel per group); with ``batch_group_count`` > 1 (the weight
    gradient of a grouped convolution) nothing is split."""
    x, w = ins
    p = eqn.params
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    n = len(lhs_spec) - 2
    si, sk, so = _spatial(n)
    g, batch_groups = p["feature_group_count"], p["batch_group_count"]
    shape, dtype = _out(eqn)

    def labelled(spec: Any, first: str, second: str, spatial: tuple[str, ...]) -> list[str]:
        labels = [""] * (n + 2)
        labels[spec[0]], labels[spec[1]] = first, second
        for j in range(n):
            labels[spec[2 + j]] = spatial[j]
        return labels

    def grouped(
        v: JaxprValue, labels: list[str], dim: int, view: str
    ) -> tuple[JaxprValue, tuple[str, ...]]:
        """``v`` with its channel dim ``dim`` read as (g, per group)."""
        if g == 1:
            return v, tuple(labels)
        split = (*v.shape[:dim], g, v.shape[dim] // g, *v.shape[dim + 1 :])
        return b.reshape(f"{name}.{view}", v, split, dtype), (*labels[:dim], "g", *labels[dim:])

    inputs = [
        grouped(x, labelled(lhs_spec, "b", "ci", si), lhs_spec[1], "input_groups"),
        grouped(w, labelled(rhs_spec, "co", "ci", sk), rhs_spec[0], "weight_groups"),
    ]
    ol = labelled(out_spec, "b", "co", so)
    out_shape = shape
    if g > 1:
        c = out_spec[1]
        ol = [*ol[:c], "g", *ol[c:]]
        out_shape = (*shape[:c], g, shape[c] // g, *shape[c + 1 :])
    part = ("b", "g", "ci", "co") if batch_groups == 1 else ()
    out = b.op(name, "conv", inputs, tuple(ol), out_shape, dtype, part)
    return [out if g == 1 else b.reshape(f"{name}.channels", out, shape, dtype)]


def reduce_window(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """Pooling: a dim the window does not touch (size 1, stride 1, no padding or dilation) may be
    split; the others are whole, with an input and an output axis."""
    (v,) = ins
    p = eqn.params
    shape, dtype = _out(eqn)
    inl, outl, part = [], [], []
    for d in range(len(v.shape)):
        untouched = (
            p["window_dimensions"][d] == 1
            and p["window_strides"][d] == 1
            and tuple(p["padding"][d]) == (0, 0)
            and p["base_dilation"][d] == 1
            and p["window_dilation"][d] == 1
        )
        if untouched:
            inl.append(f"d{d}")
            outl.append(f"d{d}")
            part.append(f"d{d}")
        else:
            inl.append(f"i{d}")
            outl.append(f"o{d}")
    return [b.op(name, "pool", [(v, tuple(inl))], tuple(outl), shape, dtype, tuple(part))]


def _windowed(
    b: JaxprGraphBuilder,
    eqn: Any,
    ins: list[JaxprValue],
    name: str,
    touched: set[int],
    out: int = 0,
) -> JaxprValue:
    """An operator that keeps some dims of its array operands as they are and cuts, pads or
    joins the others: the kept dims are shared and may be split; each other dim stays whole, with
    an axis per operand and one for the output. Scalar operands (indices, pad values) only feed
    it."""
    shape, dtype = _out(eqn, out)
    inputs: list[tuple[JaxprValue, tuple[str, ...]]] = []
    for slot, v in enumerate(ins):
        if len(v.shape) != len(shape):
            inputs.append((v, ()))
            continue
        labels = tuple(f"i{d}_{slot}" if d in touched else f"d{d}" for d in range(len(shape)))
        inputs.append((v, labels))
    labels = tuple(f"o{d}" if d in touched else f"d{d}" for d in range(len(shape)))
    part = tuple(label for label in labels if label.startswith("d"))
    return b.op(name, eqn.primitive.name, inputs, labels, shape, dtype, part)


def slicing(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """``slice``, ``dynamic_slice`` and ``pad``: the dims they cut or pad stay whole."""
    shape, _ = _out(eqn)
    v = ins[0]
    cut = {d for d, (n, m) in enumerate(zip(v.shape, shape)) if n != m}
    if eqn.primitive.name == "slice":
        cut |= {d for d, s in enumerate(eqn.params["start_indices"]) if s}
    if eqn.primitive.name == "pad":
        cut |= {d for d, config in enumerate(eqn.params["padding_config"]) if any(config)}
    return [_windowed(b, eqn, ins, name, cut)]


def dynamic_update_slice(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """The dims the update does not cover stay whole."""
    v, update = ins[:2]
    cut = {d for d, (n, m) in enumerate(zip(v.shape, update.shape)) if n != m}
    return [_windowed(b, eqn, ins, name, cut)]


def concatenate(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """The joined dim stays whole."""
    return [_windowed(b, eqn, ins, name, {eqn.params["dimension"]})]


def split(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """One operator per part; the split dim stays whole."""
    axis = eqn.params["axis"] % len(ins[0].shape)
    return [_windowed(b, eqn, ins, name, {axis}, i) for i in range(len(eqn.outvars))]


def _index_labels(
    operand: tuple[int, ...],
    indexed: Sequence[int],
    batching: Sequence[int],
    index_batching: Sequence[int],
    n_index_dims: int,
) -> tuple[list[str], list[str]]:
    """Labels of a gather's or scatter's operand dims and index array dims: the indexed dims
    ``v`` (``v0``, ... with several), the batching dims ``b0``, ... (the same label in the
    index array), the others ``h0``, ...; the index array's other dims ``t0``, ... and its
    last dim (the index vector) ``index``."""
    single = len(indexed) == 1
    labels, h = [], 0
    for d in range(len(operand)):
        if d in indexed:
            labels.append("v" if single else f"v{list(indexed).index(d)}")
        elif d in batching:
            labels.append(f"b{list(batching).index(d)}")
        else:
            labels.append(f"h{h}")
            h += 1
    idx, t = [], 0
    for d in range(n_index_dims - 1):
        if d in index_batching:
            idx.append(f"b{list(index_batching).index(d)}")
        else:
            idx.append(f"t{t}")
            t += 1
    return labels, [*idx, "index"]


def _picked(
    eqn: Any, operand: JaxprValue, ids: JaxprValue, names: tuple[str, str, str]
) -> tuple[list[str], list[str], list[int]] | None:
    """The labels of a gather's or scatter's operand and index array (:func:`_index_labels`)
    and the operand dims it keeps whole (neither indexed nor batching), read from the dimension
    numbers' fields ``names`` (indexed dims, operand batching dims, index batching dims); None
    unless the index vector holds one index per indexed dim."""
    dn = eqn.params["dimension_numbers"]
    indexed, batching, index_batching = (tuple(getattr(dn, n, ())) for n in names)
    if ids.shape[-1:] != (len(indexed),):
        return None
    rest = [d for d in range(len(operand.shape)) if d not in indexed and d not in batching]
    labels, idx = _index_labels(operand.shape, indexed, batching, index_batching, len(ids.shape))
    return labels, idx, rest


def _windowed_labels(
    rank: int, window: Sequence[int], rest: Sequence[int], labels: list[str], idx: list[str]
) -> tuple[str, ...]:
    """The labels of a gather's output or a scatter's updates: the operand's whole dims at the
    ``window`` positions, the index array's dims (but the index vector) elsewhere, in order."""
    out = [""] * rank
    for pos, d in zip(window, rest):
        out[pos] = labels[d]
    lead = iter(idx[:-1])
    return tuple(o or next(lead) for o in out)


def gather(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue] | None:
    """A gather that picks single elements along its indexed dims (each slice 1 wide there and
    whole along every other dim): ``table[ids]`` (``jnp.take``, an embedding) and
    ``take_along_axis`` (a cross-entropy picking each row's label). The indexed dims are
    contracted, as an embedding's vocabulary (``taps.Graph.embedding``): split, each device
    picks the indices that fall in its part (zero elsewhere) and an all_reduce sums them, as
    Megatron-LM's vocabulary-parallel embedding and cross-entropy do; batching dims and the
    index array's dims may be split, the index vector is whole. Other gathers have no rule."""
    table, ids = ins
    dn = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    found = _picked(
        eqn, table, ids, ("start_index_map", "operand_batching_dims", "start_indices_batching_dims")
    )
    if found is None:
        return None
    labels, idx, rest = found
    sizes = tuple(eqn.params["slice_sizes"])
    picked = [d for d in range(len(table.shape)) if d not in rest]
    if (
        sorted(dn.collapsed_slice_dims) != sorted(dn.start_index_map)
        or any(sizes[d] != 1 for d in picked)
        or any(sizes[d] != table.shape[d] for d in rest)
        or len(dn.offset_dims) != len(rest)
    ):
        return None
    out = _windowed_labels(len(shape), dn.offset_dims, rest, labels, idx)
    simple = tuple(dn.start_index_map) == (0,) and not tuple(dn.operand_batching_dims)
    part = tuple(x for x in (*labels, *idx) if x != "index")
    inputs = [(ids, tuple(idx)), (table, tuple(labels))]
    return [b.op(name, "embedding" if simple else "gather", inputs, out, shape, dtype, part)]


def scatter(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue] | None:
    """``x.at[ids].add(u)`` (``scatter-add``) and ``x.at[ids].set(u)`` (``scatter``) of single
    elements along the indexed dims, the mirror of :func:`gather`: the output has the operand's
    axes, each device adds (or writes) the updates whose indices fall in its part of the indexed
    dims; the updates' index dims are contracted for an add into zeros (split, their partial
    sums are all_reduced) and whole otherwise (the last write wins, which is no sum)."""
    operand, ids, updates = ins
    dn = eqn.params["dimension_numbers"]
    shape, dtype = _out(eqn)
    found = _picked(
        eqn,
        operand,
        ids,
        ("scatter_dims_to_operand_dims", "operand_batching_dims", "scatter_indices_batching_dims"),
    )
    if found is None:
        return None
    labels, idx, rest = found
    window = tuple(dn.update_window_dims)
    if (
        sorted(dn.inserted_window_dims) != sorted(dn.scatter_dims_to_operand_dims)
        or len(window) != len(rest)
        or any(updates.shape[w] != operand.shape[d] for w, d in zip(window, rest))
    ):
        return None
    up = _windowed_labels(len(updates.shape), window, rest, labels, idx)
    # Split index dims leave partial sums, in which an operand that is not zero would be counted
    # once per part: only an add into a constant (zeros) may split them.
    summed = eqn.primitive.name == "scatter-add" and operand.source is None
    whole = {"index"} if summed else {"index", *idx}
    part = tuple(x for x in (*labels, *idx) if x not in whole)
    inputs = [(operand, tuple(labels)), (ids, tuple(idx)), (updates, up)]
    return [b.op(name, eqn.primitive.name, inputs, tuple(labels), shape, dtype, part)]


def unsupported(
    b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str
) -> list[JaxprValue]:
    """An operator per output that keeps every axis whole (``unknown="replicate"``)."""
    inputs = [(v, _labels(len(v.shape), f"x{slot}_")) for slot, v in enumerate(ins)]
    outs = []
    for i in range(len(eqn.outvars)):
        shape, dtype = _out(eqn, i)
        labels = _labels(len(shape), "o")
        outs.append(b.op(name, eqn.primitive.name, inputs, labels, shape, dtype, ()))
    return outs


def local(b: JaxprGraphBuilder, eqn: Any, ins: list[JaxprValue], name: str) -> list[JaxprValue]:
    """A primitive each device computes alone, from no model data (``iota``, random numbers
    drawn from a key, as for a dropout mask): a constant."""
    return [constant(_out(eqn, i)[0]) for i in range(len(eqn.outvars))]


def stack(
    b: JaxprGraphBuilder, values: list[JaxprValue], name: str, eqn: Any, out: int
) -> JaxprValue:
    """The per-step outputs of a ``scan`` stacked along a new leading dim (whole)."""
    shape, dtype = _out(eqn, out)
    labels = _labels(len(shape) - 1)
    inputs = [(v, labels) for v in values]
    return b.op(name, "stack", inputs, ("l", *labels), shape, dtype, labels)


def _table(rules: Sequence[tuple[Rule, str]]) -> dict[str, Rule]:
    return {prim: rule for rule, prims in rules for prim in prims.split()}


#: Primitive name -> rule. Anything else is unsupported (or kept whole with
#: ``unknown="replicate"``), unless all its inputs are constants.
RULES: dict[str, Rule] = _table(
    [
        (
            elementwise,
            "add add_any sub mul div rem pow max min neg exp exp2 log log1p expm1 tanh logistic "
            "erf erfc erf_inv integer_pow sqrt rsqrt cbrt square abs sign sin cos tan atan2 "
            "floor ceil round is_finite nextafter select_n clamp eq ne lt le gt ge and or not "
            "xor",
        ),
        (
            alias,
            "convert_element_type copy copy_p stop_gradient reduce_precision optimization_barrier",
        ),
        (broadcast_in_dim, "broadcast_in_dim"),
        (transpose, "transpose"),
        (squeeze, "squeeze"),
        (reshape, "reshape"),
        (
            reduction,
            "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin",
        ),
        (dot_general, "dot_general"),
        (conv_general_dilated, "conv_general_dilated"),
        (reduce_window, "reduce_window_max reduce_window_min reduce_window_sum"),
        (gather, "gather"),
        (scatter, "scatter-add scatter"),
        (slicing, "slice dynamic_slice pad"),
        (dynamic_update_slice, "dynamic_update_slice"),
        (concatenate, "concatenate"),
        (split, "split"),
        (
            local,
            "iota random_bits random_seed random_wrap random_unwrap random_split random_fold_in "
            "threefry2x32",
        ),
    ]
)
