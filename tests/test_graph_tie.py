"""Tied repeats in the graph IR: validation, equality and the JSON round trip."""

from __future__ import annotations

import pytest

import taps


def _stack(layers: int, width: int = 64) -> tuple[taps.Graph, list[list[str]]]:
    g = taps.Graph("stack")
    x = g.input("x", (16, width))
    blocks = []
    for i in range(layers):
        h = g.gelu(f"l{i}.act", g.linear(f"l{i}.up", x, 4 * width))
        x = g.add(f"l{i}.res", g.linear(f"l{i}.down", h, width), x)
        blocks.append([f"l{i}.up", f"l{i}.act", f"l{i}.down", f"l{i}.res"])
    return g, blocks


def test_tie_records_instances_and_round_trips():
    g, blocks = _stack(3)
    g.tie(blocks[1:])
    assert g.tied == (tuple(tuple(b) for b in blocks[1:]),)
    again = taps.Graph.from_json(g.to_json())
    assert again == g
    assert again.tied == g.tied
    untied, _ = _stack(3)
    assert untied != g


def test_first_block_differs_from_the_others():
    # The first block reads the graph input (no gradient); the others read an activation.
    g, blocks = _stack(3)
    with pytest.raises(taps.GraphError, match=r"'l1.up' differs from 'l0.up'"):
        g.tie(blocks)


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([["l1.up"]], "at least two instances"),
        ([["l1.up", "l1.act"], ["l2.up"]], "of one length"),
        ([["l1.up"], ["nope"]], "unknown operator 'nope'"),
        ([["l1.up"], ["l1.up"]], "in two instances"),
        ([["l1.up"], ["l2.act"]], "differs from 'l1.up'"),
    ],
)
def test_bad_ties(instances, message):
    g, _ = _stack(3)
    with pytest.raises(taps.GraphError, match=message):
        g.tie(instances)
    assert g.tied == ()


def test_an_operator_is_in_one_tie_only():
    g, blocks = _stack(4)
    g.tie(blocks[1:3])
    with pytest.raises(taps.GraphError, match="in two instances or ties"):
        g.tie(blocks[2:])


def test_json_tied_field_is_checked():
    g, _ = _stack(3)
    doc = g.to_dict()
    doc["tied"] = [[["l1.up"], "l2.up"]]
    with pytest.raises(taps.GraphError, match=r"tied\[0\]: expected a list of lists"):
        taps.Graph.from_dict(doc)
    doc["tied"] = [[["l1.up"], ["l2.act"]]]
    with pytest.raises(taps.GraphError, match=r"tied\[0\]: tie: operator 'l2.act' differs"):
        taps.Graph.from_dict(doc)


def test_axis_order_is_kept_and_checked():
    g = taps.Graph()
    x = g.input("x", (4, 8))
    w = g.parameter("w", (8, 2))
    g.add_operator("mm", "einsum", [(x, "bi"), (w, "io")], "bo", axis_order="iob")
    assert g.op("mm").axes == ("i", "o", "b")
    assert taps.Graph.from_json(g.to_json()).op("mm").axes == ("i", "o", "b")
    with pytest.raises(taps.GraphError, match="is not an order of the axes"):
        g.add_operator("mm2", "einsum", [(x, "bi"), (w, "io")], "bo", axis_order="iobb")


def test_failed_builder_leaves_nothing_behind():
    g = taps.Graph()
    x = g.input("x", (4, 8, 8, 8))
    with pytest.raises(taps.GraphError):
        g.conv2d("c", x, 4, kernel=16)
    assert set(g.tensors) == {"x"} and g.ops == []
