"""The front-end builder's views against torch: a transpose is a relabelling and a reshape a view
of the graph tensor, so reading the graph tensor through the builder's view must give exactly the
elements torch computes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from taps.frontends.torch.builder import AtenGraphBuilder, AtenValue, groups


def _factorizations(draw, n: int) -> tuple[int, ...]:
    """A random shape with ``n`` elements (dims of size 1 included)."""
    dims = []
    rest = n
    for p in (2, 3, 5):
        while rest % p == 0:
            rest //= p
            dims.append(p)
    order = draw(st.permutations(dims))
    out, cur = [], 1
    for d in order:
        cur *= d
        if draw(st.booleans()):
            out.append(cur)
            cur = 1
    out.append(cur)
    if draw(st.booleans()):
        out.insert(draw(st.integers(0, len(out))), 1)
    return tuple(out)


@st.composite
def cases(draw):
    n = draw(st.sampled_from([12, 24, 30, 36, 60, 120]))
    taps_shape = _factorizations(draw, n)
    perm = tuple(draw(st.permutations(range(len(taps_shape)))))
    target = _factorizations(draw, n)
    return taps_shape, perm, target


def _read(b: AtenGraphBuilder, v: AtenValue, data: dict[int, torch.Tensor]) -> torch.Tensor:
    """The framework tensor ``v`` as the graph holds it: its graph tensor, made from its base
    by a row-major reshape (views) or by the operator's copy (a transpose), then permuted."""
    assert v.tensor is not None
    t = data[b.root(v.tensor)].reshape(b.shape(v.tensor))
    return t.permute(*v.perm)


@given(cases())
def test_reshape_of_a_transposed_tensor_reads_what_torch_computes(case):
    taps_shape, perm, target = case
    b = AtenGraphBuilder()
    x = b.input("x", taps_shape, 4)
    data = {x.tensor: torch.arange(math.prod(taps_shape)).reshape(taps_shape)}
    v = b.permute(x, perm)
    framework = data[x.tensor].permute(*perm)
    assert torch.equal(_read(b, v, data), framework)
    out = b.reshape(v, target, "", "view")
    if b.ops:  # not expressible as a view: a copy in framework order came first
        (copy,) = b.ops
        data[copy.output] = framework.contiguous()
    assert out.shape == target
    assert torch.equal(_read(b, out, data), framework.reshape(target))


@pytest.mark.parametrize(
    ("a", "c", "expected"),
    [
        ((4, 6), (24,), [([0, 1], [0])]),
        ((2, 1, 12), (2, 3, 4), [([0], [0]), ([2], [1, 2])]),
        ((6, 4), (4, 6), [([0, 1], [0, 1])]),
        ((1,), (1, 1), []),
    ],
)
def test_groups(a, c, expected):
    assert groups(a, c) == expected


def test_factor_splits_the_producing_operator():
    """A split of (b, 3h) into q, k, v makes the projection's out axis two axes (3, h)."""
    b = AtenGraphBuilder()
    x = b.input("x", (8, 16), 2)
    w = b.parameter("w", (48, 16), 2)
    y = b.op("linear", "proj", [(x, ["b", "in"]), (w, ["out", "in"])], (8, 48), ["b", "out"], 2)
    chunks = b.reshape(y, (8, 3, 16), "proj", "chunks")
    b.factor(chunks, 1, "proj")
    g, names = b.build("g")
    op = g.op(names[0])
    assert op.output.dims == ("b", "out0", "out1")
    assert [op.axis_size(a) for a in op.output.dims] == [8, 3, 16]
    assert g.tensors[op.inputs[1].tensor].base == "w"  # the weight seen as (3, 16, 16)
    assert g.root("proj.chunks").name == op.output.tensor
