"""The graph model: operators, validation, topological order, views and the JSON round trip."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def test_linear_shapes_axes_and_parameters():
    g = taps.Graph()
    x = g.input("x", (8, 16, 32))
    y = g.linear("fc", x, 64, bias=True)
    op = g.op("fc")
    assert y.shape == (8, 16, 64) and y.kind == "activation" and y.producer == "fc"
    assert op.axes == ("b", "s", "in", "out") and op.partitionable == op.axes
    assert op.contracted == ("in",)
    assert g.tensors["fc.weight"].shape == (32, 64) and g.tensors["fc.bias"].shape == (64,)
    assert op.operand_axis_indices(op.inputs[1]) == [2, 3]
    assert op.operand_axis_indices(op.output) == [0, 1, 3]


@pytest.mark.parametrize(("h", "k", "s", "p"), [(224, 11, 4, 2), (27, 5, 1, 2), (13, 3, 1, 1)])
def test_conv_output_is_the_closed_form(h, k, s, p):
    g = taps.Graph()
    y = g.conv2d("c", g.input("x", (2, 3, h, h)), 8, k, s, p)
    assert y.shape == (2, 8, conv_out(h, k, s, p), conv_out(h, k, s, p))
    op = g.op("c")
    assert op.partitionable == ("b", "ci", "co")
    assert set(op.contracted) >= {"ci", "kh", "kw"}
    # Spatial dims stay whole: their operand entries are -1.
    assert op.operand_axis_indices(op.inputs[0]) == [0, 1, -1, -1]


def test_layernorm_softmax_keep_their_axis_whole():
    g = taps.Graph()
    x = g.input("x", (4, 8, 16))
    g.layernorm("ln", x)
    g.softmax("sm", x, axis=1)
    assert g.op("ln").partitionable == ("b", "s")
    assert g.op("sm").partitionable == ("b", "h")


def test_embedding_splits_vocab_as_a_contraction():
    g = taps.Graph()
    ids = g.input("ids", (4, 8), dtype_bytes=4)
    y = g.embedding("emb", ids, vocab=1000, hidden=64)
    assert y.shape == (4, 8, 64)
    assert g.op("emb").contracted == ("v",)


def test_views_make_edges_that_change_shape():
    g = taps.Graph()
    x = g.input("x", (4, 8, 6))
    y = g.linear("fc", x, 6)
    flat = g.reshape("flat", y, (32, 6))
    g.relu("act", flat)
    [edge] = g.edges
    assert (edge.producer, edge.consumer, edge.slot, edge.tensor) == ("fc", "act", 0, "fc.out")
    assert edge.producer_shape == (4, 8, 6) and edge.consumer_shape == (32, 6)
    with pytest.raises(taps.GraphError, match="holds"):
        g.reshape("bad", y, (5, 5))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g, x: g.einsum("e", "bi,io->bo", x), "2 operands"),
        (lambda g, x: g.einsum("e", "bij->bi", x), "3 axes"),
        (lambda g, x: g.einsum("e", "bi,bi->bo", x, x), "appear in no input"),
        (lambda g, x: g.einsum("e", "bi,ib->bi", x, x), "axis 'i' has size 8 in one operand"),
        (lambda g, x: g.einsum("e", "bb->b", g.input("sq", (4, 4))), "repeats an axis"),
        (lambda g, x: g.einsum("e", "bi->bi", "nope"), "unknown tensor 'nope'"),
        (lambda g, x: g.einsum("e", "bi->bi", x, partitionable=["z"]), "partitionable"),
        (lambda g, x: g.einsum("x", "bi->bi", x), "already used"),
        (lambda g, x: g.einsum("e", "b1->b", x), "not an einsum spec"),
        (lambda g, x: g.input("neg", (4, -1)), "positive ints"),
        (lambda g, x: g.add("e", x, g.input("y", (4, 4))), "one shape"),
    ],
)
def test_validation_errors_name_the_problem(build, message):
    g = taps.Graph()
    x = g.input("x", (4, 8))
    with pytest.raises(taps.GraphError, match=message):
        build(g, x)


def _doc(graph: taps.Graph) -> dict:
    return json.loads(graph.to_json())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("ops"), r"^ops: missing"),
        (lambda d: d.update(version=2), r"^version: this taps reads version 1"),
        (lambda d: d.update(format="onnx"), r"^format: expected"),
        (lambda d: d.update(layers="3"), r"^layers: expected int"),
        (lambda d: d["tensors"][0].update(shape=[4, "8"]), r"^tensors\[0\]\.shape"),
        (lambda d: d["tensors"][0].update(kind="weird"), r"^tensors\[0\]: kind"),
        (lambda d: d["tensors"][0].pop("dtype_bytes"), r"^tensors\[0\]\.dtype_bytes: missing"),
        (
            lambda d: d["ops"][1]["inputs"][0].update(tensor="h9"),
            r"^ops\[1\]\.inputs\[0\]\.tensor: unknown tensor 'h9'",
        ),
        (lambda d: d["ops"][0].update(axes=[["b", 64]]), r"^ops\[0\]: axes: no size"),
        (lambda d: d["ops"][0]["axes"].__setitem__(0, ["b", 3]), r"^ops\[0\]"),
        (lambda d: d["ops"][0].update(inputs="x"), r"^ops\[0\]\.inputs: expected list"),
        (lambda d: d["ops"][0]["output"].pop("dims"), r"^ops\[0\]\.output\.dims: missing"),
    ],
)
def test_bad_json_names_the_field(edit, message):
    d = _doc(taps.models.mlp(batch=64, sizes=(8, 16, 8)))
    edit(d)
    with pytest.raises(taps.GraphError, match=message):
        taps.Graph.from_json(json.dumps(d))


def test_invalid_json_and_wrong_top_level():
    with pytest.raises(taps.GraphError, match="not JSON"):
        taps.Graph.from_json("{")
    with pytest.raises(taps.GraphError, match="top level: expected an object"):
        taps.Graph.from_json("[]")


def test_cycle_is_detected_and_named():
    d = _doc(taps.models.mlp(batch=64, sizes=(8, 16, 8)))
    # fc1 reads fc2's output: fc1 -> act1 -> fc2 -> fc1.
    d["ops"][0]["inputs"][0]["tensor"] = "fc2.out"
    d["ops"][0]["axes"] = [["b", 64], ["in", 8], ["out", 16]]
    with pytest.raises(taps.GraphError, match=r"cycle through \['fc1', 'act1', 'fc2'\]"):
        taps.Graph.from_json(json.dumps(d))


def test_json_order_does_not_matter():
    g = taps.models.mlp(batch=64, sizes=(8, 16, 16, 8))
    d = _doc(g)
    d["ops"].reverse()
    back = taps.Graph.from_json(json.dumps(d))
    # Sorted topologically again: the chain comes back in its only order.
    assert back == g and [op.name for op in back.ops] == [op.name for op in g.ops]


@pytest.mark.parametrize(
    "graph",
    [
        taps.models.alexnet(),
        taps.models.alexnet(elementwise=True),
        taps.models.megatron("1.7B"),
        taps.models.mlp(),
    ],
    ids=["alexnet", "alexnet-elementwise", "megatron", "mlp"],
)
def test_builtin_models_round_trip(graph):
    assert taps.Graph.from_json(graph.to_json()) == graph


@st.composite
def random_graphs(draw) -> taps.Graph:
    g = taps.Graph(name=draw(st.text(min_size=1, max_size=5)), layers=draw(st.integers(1, 4)))
    live = [g.input("x", (draw(st.sampled_from([2, 4, 6])), 8))]
    for k in range(draw(st.integers(1, 6))):
        src = draw(st.sampled_from(live))
        kind = draw(st.sampled_from(["linear", "gelu", "add", "view", "einsum"]))
        if kind == "linear":
            live.append(g.linear(f"l{k}", src, draw(st.sampled_from([4, 8]))))
        elif kind == "gelu":
            live.append(g.gelu(f"g{k}", src))
        elif kind == "add":
            live.append(
                g.add(
                    f"a{k}", src, draw(st.sampled_from([t for t in live if t.shape == src.shape]))
                )
            )
        elif kind == "view":
            live.append(g.reshape(f"v{k}", src, (math.prod(src.shape),)))
        elif len(src.shape) == 2:
            w = g.parameter(f"w{k}", (src.shape[1], 4))
            live.append(g.einsum(f"e{k}", "bi,io->bo", src, w, partitionable="bo"))
    return g


@settings(max_examples=50, deadline=None)
@given(random_graphs())
def test_random_graphs_round_trip(graph):
    back = taps.Graph.from_json(graph.to_json())
    assert back == graph
    assert back.edges == graph.edges


def test_graph_equality_sees_differences():
    a = taps.models.mlp(batch=64, sizes=(8, 16, 8))
    b = taps.models.mlp(batch=32, sizes=(8, 16, 8))
    assert a != b
    assert a == taps.models.mlp(batch=64, sizes=(8, 16, 8))
