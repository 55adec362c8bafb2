"""The graph model: operators, validation, topological order, views and the JSON round trip."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from taps.graph import conv_output_size
from taps.plan.candidates import operand_axis_indices


def closed_form(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def assert_topological(g: taps.Graph) -> None:
    position = {op.name: i for i, op in enumerate(g.ops)}
    for e in g.edges:
        assert position[e.producer] < position[e.consumer], e


# -- operators --------------------------------------------------------------------------------


def test_linear_shapes_axes_and_parameters():
    g = taps.Graph()
    x = g.input("x", (8, 16, 32))
    y = g.linear("fc", x, 64, bias=True)
    op = g.op("fc")
    assert y.shape == (8, 16, 64) and y.kind == "activation" and y.producer == "fc"
    assert y.name == "fc.out" == op.output_tensor
    assert op.axes == ("b", "s", "in", "out") and op.partitionable == op.axes
    assert op.axis_sizes == (8, 16, 32, 64) and op.partitionable_sizes == (8, 16, 32, 64)
    assert op.contracted == ("in",)
    assert op.input_tensors == ("x", "fc.weight", "fc.bias")
    assert g.tensors["fc.weight"].shape == (32, 64) and g.tensors["fc.bias"].shape == (64,)
    assert g.tensors["fc.weight"].kind == "parameter" and g.tensors["fc.weight"].requires_grad
    assert operand_axis_indices(op, op.inputs[1]) == [2, 3]
    assert operand_axis_indices(op, op.output) == [0, 1, 3]


def test_linear_makes_every_leading_dim_an_axis():
    g = taps.Graph()
    g.linear("fc", g.input("x", (2, 3, 4, 5, 6, 7)), 8)
    op = g.op("fc")
    assert op.axes == ("d0", "d1", "d2", "d3", "d4", "in", "out")
    assert op.partitionable == op.axes and g.tensors["fc.out"].shape == (2, 3, 4, 5, 6, 8)


@pytest.mark.parametrize(("h", "k", "s", "p"), [(224, 11, 4, 2), (27, 5, 1, 2), (13, 3, 1, 1)])
def test_conv_output_is_the_closed_form(h, k, s, p):
    g = taps.Graph()
    y = g.conv2d("c", g.input("x", (2, 3, h, h)), 8, k, s, p)
    assert y.shape == (2, 8, closed_form(h, k, s, p), closed_form(h, k, s, p))
    assert conv_output_size(h, k, s, p) == closed_form(h, k, s, p)
    op = g.op("c")
    assert op.axes == ("b", "ci", "hi", "wi", "co", "kh", "kw", "ho", "wo")
    assert op.partitionable == ("b", "ci", "co")
    assert op.contracted == ("ci", "hi", "wi", "kh", "kw")
    # Spatial dims stay whole: their operand entries are -1.
    assert operand_axis_indices(op, op.inputs[0]) == [0, 1, -1, -1]
    assert operand_axis_indices(op, op.inputs[1]) == [2, 1, -1, -1]
    assert operand_axis_indices(op, op.output) == [0, 2, -1, -1]
    assert g.tensors["c.weight"].shape == (8, 3, k, k)


def test_conv_takes_pairs_bias_and_a_folded_pool():
    g = taps.Graph()
    x = g.input("x", (2, 3, 32, 20))
    y = g.conv2d("c", x, 4, kernel=(5, 3), stride=(2, 1), padding=(1, 0), bias=True)
    assert y.shape == (2, 4, closed_form(32, 5, 2, 1), closed_form(20, 3, 1, 0))
    assert g.tensors["c.weight"].shape == (4, 3, 5, 3) and g.tensors["c.bias"].shape == (4,)
    assert g.op("c").inputs[2].dims == ("co",)
    z = g.conv2d("folded", x, 4, 3, pool=(3, 2))
    assert z.shape == (2, 4, closed_form(30, 3, 2), closed_form(18, 3, 2))


def test_grouped_conv_reads_the_channels_per_group():
    g = taps.Graph()
    x = g.input("x", (2, 6, 8, 8))
    y = g.conv2d("c", x, 9, 3, bias=True, groups=3)
    assert y.shape == (2, 9, 6, 6) and y.name == "c.channels"
    assert g.tensors["c.weight"].shape == (9, 2, 3, 3)
    op = g.op("c")
    assert [g.tensors[o.tensor].shape for o in op.inputs] == [
        (2, 3, 2, 8, 8),
        (3, 3, 2, 3, 3),
        (3, 3),
    ]
    assert op.partitionable == ("b", "g", "ci", "co") and op.contracted == (
        "ci",
        "hi",
        "wi",
        "kh",
        "kw",
    )
    assert g.num_parameters() == 9 * 2 * 9 + 9
    for bad in (0, 4, 2.0):
        with pytest.raises(taps.GraphError, match="groups must be a positive int dividing"):
            g.conv2d(f"bad{bad}", x, 9, 3, groups=bad)
    assert "bad4" not in g.tensors and "bad4.weight" not in g.tensors  # nothing left behind


def test_pool_shapes_and_axes():
    g = taps.Graph()
    x = g.input("x", (4, 8, 55, 55))
    assert g.pool("p", x, 3, 2).shape == (4, 8, 27, 27)
    assert g.pool("q", x, 5).shape == (4, 8, 11, 11)  # stride defaults to the kernel
    op = g.op("p")
    assert op.partitionable == ("b", "c") and op.contracted == ("hi", "wi")


def test_matmul_forms():
    g = taps.Graph()
    a = g.input("a", (4, 6, 8))
    b3 = g.input("b3", (4, 8, 10))
    m = g.input("m", (8, 10))
    assert g.matmul("batched", a, b3).shape == (4, 6, 10)
    assert g.op("batched").axes == ("b", "i", "k", "j")
    assert g.op("batched").inputs[1].dims == ("b", "k", "j")
    assert g.matmul("broadcast", a, m).shape == (4, 6, 10)
    assert g.op("broadcast").inputs[1].dims == ("k", "j")
    assert g.batch_matmul("bmm", a, b3).shape == (4, 6, 10)
    assert g.op("bmm").contracted == ("k",)
    with pytest.raises(taps.GraphError, match="batch_matmul needs"):
        g.batch_matmul("bad", a, m)
    with pytest.raises(taps.GraphError, match="matmul needs"):
        g.matmul("bad", m, g.input("v", (10,)))


def test_elementwise_ops_share_every_axis():
    g = taps.Graph()
    a, b = g.input("a", (2, 3, 4)), g.input("b", (2, 3, 4))
    for kind, y in [
        ("add", g.add("s", a, b)),
        ("mul", g.mul("p", a, b)),
        ("relu", g.relu("r", a)),
        ("gelu", g.gelu("ge", a)),
    ]:
        op = g.op(y.producer)
        assert op.kind == kind and y.shape == (2, 3, 4)
        assert op.axes == op.partitionable == ("b", "s", "h") and op.contracted == ()


def test_layernorm_softmax_keep_their_axis_whole():
    g = taps.Graph()
    x = g.input("x", (4, 8, 16))
    g.layernorm("ln", x)
    g.softmax("sm", x, axis=1)
    assert g.op("ln").partitionable == ("b", "s")
    assert g.tensors["ln.gamma"].shape == g.tensors["ln.beta"].shape == (16,)
    assert g.op("sm").partitionable == ("b", "h")
    assert operand_axis_indices(g.op("sm"), g.op("sm").inputs[0]) == [0, -1, 1]
    with pytest.raises(taps.GraphError, match="out of range"):
        g.softmax("bad", x, axis=3)


def test_embedding_splits_vocab_as_a_contraction():
    g = taps.Graph()
    ids = g.input("ids", (4, 8), dtype_bytes=4)
    y = g.embedding("emb", ids, vocab=1000, hidden=64)
    assert y.shape == (4, 8, 64) and y.dtype_bytes == 2
    assert g.tensors["emb.table"].shape == (1000, 64)
    assert g.op("emb").axes == ("b", "s", "v", "h")
    assert g.op("emb").contracted == ("v",)


def test_einsum_axes_follow_first_appearance_and_partitionable_is_ordered():
    g = taps.Graph()
    x, w = g.input("x", (2, 3, 5)), g.parameter("w", (5, 7))
    y = g.einsum("e", "bsi,io->bos", x, w, partitionable=["o", "b"])
    op = g.op("e")
    assert y.shape == (2, 7, 3)
    assert op.axes == ("b", "s", "i", "o") and op.axis_sizes == (2, 3, 5, 7)
    assert op.partitionable == ("b", "o") and op.partitionable_sizes == (2, 7)
    assert operand_axis_indices(op, op.inputs[0]) == [0, -1, -1]
    assert operand_axis_indices(op, op.output) == [0, 1, -1]


def test_operand_axis_indices_give_each_tensor_its_layout():
    """Through the core: the layout a strategy gives each operand splits every dim by the degree
    of its axis (1 for a whole axis)."""
    g = taps.Graph()
    x, w = g.input("x", (8, 4, 16)), g.parameter("w", (16, 8))
    g.einsum("e", "bsi,io->bso", x, w, partitionable="bio")
    op = g.op("e")
    for strategy in taps.enumerate_strategies(list(op.partitionable_sizes), 8):
        degree = dict(zip(op.partitionable, strategy.degrees))
        for operand in (*op.inputs, op.output):
            shape = [op.axis_size(d) for d in operand.dims]
            layout = strategy.tensor_layout(operand_axis_indices(op, operand), shape)
            assert layout.shard_shape == [
                s // degree.get(d, 1) for d, s in zip(operand.dims, shape)
            ]


def test_requires_grad_flows_from_parameters_and_marked_inputs():
    g = taps.Graph()
    data = g.input("data", (4, 8))
    assert not g.relu("r", data).requires_grad
    assert not g.reshape("flat", "r.out", (32,)).requires_grad
    assert g.linear("fc", data, 8).requires_grad  # the weight needs a gradient
    prev = g.input("prev", (4, 8), requires_grad=True)
    assert g.gelu("act", prev).requires_grad
    assert g.reshape("v", prev, (2, 16)).requires_grad


def test_a_failed_helper_leaves_nothing_behind():
    g = taps.Graph()
    x = g.input("x", (4, 8))
    before = dict(g.tensors)
    with pytest.raises(taps.GraphError, match="already used"):
        g.linear("x", x, 4, bias=True)  # the operator name clashes after the weight is made
    with pytest.raises(taps.GraphError, match="already used"):
        g.layernorm("x", x)
    assert g.tensors == before and g.ops == []


# -- views and edges --------------------------------------------------------------------------


def test_views_make_edges_that_change_shape():
    g = taps.Graph()
    x = g.input("x", (4, 8, 6))
    y = g.linear("fc", x, 6)
    flat = g.reshape("flat", y, (32, 6))
    assert flat.kind == "view" and flat.base == "fc.out" and flat.producer is None
    g.relu("act", flat)
    [edge] = g.edges
    assert (edge.producer, edge.consumer, edge.slot, edge.tensor) == ("fc", "act", 0, "fc.out")
    assert edge.producer_shape == (4, 8, 6) and edge.consumer_shape == (32, 6)
    with pytest.raises(taps.GraphError, match="holds"):
        g.reshape("bad", y, (5, 5))


def test_edges_through_view_chains_and_repeated_inputs():
    g = taps.Graph()
    x = g.input("x", (4, 6))
    a = g.relu("a", x)  # from an input: no edge
    v2 = g.view("v2", g.view("v1", a, (24,)), (2, 12))
    assert g.root("v2") == a and g.root("x").name == "x"
    g.add("sq", v2, v2)
    g.add("w", g.view("pv", g.parameter("p", (24,)), (2, 12)), v2)  # a parameter view: no edge
    assert [(e.producer, e.consumer, e.slot) for e in g.edges] == [
        ("a", "sq", 0),
        ("a", "sq", 1),
        ("a", "w", 1),
    ]
    assert {(e.tensor, e.producer_shape, e.consumer_shape) for e in g.edges} == {
        ("a.out", (4, 6), (2, 12))
    }


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g, x: g.einsum("e", "bi,io->bo", x), "2 operands"),
        (lambda g, x: g.einsum("e", "bij->bi", x), "3 axes"),
        (lambda g, x: g.einsum("e", "bi,bi->bo", x, x), "appear in no input"),
        (lambda g, x: g.einsum("e", "bi,ib->bi", x, x), "axis 'i' has size 8 in one operand"),
        (lambda g, x: g.einsum("e", "bb->b", g.input("sq", (4, 4))), "repeats an axis"),
        (lambda g, x: g.einsum("e", "bi->bb", x), "output repeats an axis"),
        (lambda g, x: g.einsum("e", "bi->bi", "nope"), "unknown tensor 'nope'"),
        (lambda g, x: g.einsum("e", "bi->bi", x, partitionable=["z"]), "partitionable"),
        (lambda g, x: g.einsum("x", "bi->bi", x), "already used"),
        (lambda g, x: g.einsum("e", "b1->b", x), "not an einsum spec"),
        (lambda g, x: g.einsum("e", "bi", x), "not an einsum spec"),
        (lambda g, x: g.einsum("e", "->"), "at least one input"),
        (lambda g, x: g.input("neg", (4, -1)), "positive ints"),
        (lambda g, x: g.input("zero", (4, 0)), "positive ints"),
        (lambda g, x: g.input("", (4,)), "non-empty"),
        (lambda g, x: g.parameter("p", (4,), dtype_bytes=0), "dtype_bytes"),
        (lambda g, x: g.add("e", x, g.input("y", (4, 4))), "one shape"),
        (lambda g, x: g.conv2d("c", x, 8, 3), r"\(b, c, h, w\) input"),
        (lambda g, x: g.conv2d("c", g.input("i", (1, 3, 4, 4)), 8, 5), "does not fit"),
        (lambda g, x: g.conv2d("c", g.input("i", (1, 3, 4, 4)), 8, 0), "kernel must be"),
        (lambda g, x: g.pool("p", g.input("i", (1, 3, 4, 4)), 3, 0), "stride must be"),
        (lambda g, x: g.add_operator("o", "k", [(x, "bi")], "bz", axis_sizes={"z": 0}), "size"),
        (
            lambda g, x: g.add_operator("o", "k", [(x, "bi")], "b", axis_sizes={"q": 2}),
            "no operand",
        ),
        (lambda g, x: g.op("nothing"), "unknown operator"),
        (lambda g, x: taps.Graph(layers=0), "layers"),
    ],
)
def test_validation_errors_name_the_problem(build, message):
    g = taps.Graph()
    x = g.input("x", (4, 8))
    with pytest.raises(taps.GraphError, match=message):
        build(g, x)


def test_graph_error_is_a_value_error():
    assert issubclass(taps.GraphError, taps.TapsError) and issubclass(taps.GraphError, ValueError)


# -- JSON -------------------------------------------------------------------------------------


def _doc(graph: taps.Graph) -> dict:
    return json.loads(graph.to_json())


def _small() -> dict:
    """mlp(64, (8, 16, 8)) plus a view: tensors x, fc1.weight, fc2.weight, flat; ops fc1, act1,
    fc2, sink."""
    g = taps.models.mlp(batch=64, sizes=(8, 16, 8))
    g.relu("sink", g.reshape("flat", "fc2.out", (512,)))
    return _doc(g)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("ops"), r"^ops: missing$"),
        (lambda d: d.update(version=2), r"^version: this taps reads version 1, got 2$"),
        (lambda d: d.update(version="1"), r"^version: expected int"),
        (lambda d: d.update(format="onnx"), r"^format: expected 'taps.graph'"),
        (lambda d: d.update(layers="3"), r"^layers: expected int"),
        (lambda d: d.update(layers=0), r"^layers: must be a positive int"),
        (lambda d: d.update(extra=1), r"^top level: unknown field 'extra'$"),
        (lambda d: d.update(tensors={}), r"^tensors: expected list"),
        (lambda d: d["tensors"].__setitem__(1, 5), r"^tensors\[1\]: expected an object, got int"),
        (
            lambda d: d["tensors"][0].update(shape=[4, "8"]),
            r"^tensors\[0\]\.shape\[1\]: expected int",
        ),
        (lambda d: d["tensors"][0].update(shape=[4, True]), r"^tensors\[0\]\.shape\[1\]"),
        (lambda d: d["tensors"][0].update(shape=[4, 0]), r"^tensors\[0\]: .*positive ints"),
        (lambda d: d["tensors"][0].update(kind="weird"), r"^tensors\[0\]\.kind: expected"),
        (lambda d: d["tensors"][0].update(kind="activation"), r"operators make them"),
        (lambda d: d["tensors"][0].pop("dtype_bytes"), r"^tensors\[0\]\.dtype_bytes: missing$"),
        (lambda d: d["tensors"][0].pop("requires_grad"), r"^tensors\[0\]\.requires_grad: missing"),
        (lambda d: d["tensors"][0].update(requires_grad=1), r"^tensors\[0\]\.requires_grad: expec"),
        (lambda d: d["tensors"][1].update(base="x"), r"^tensors\[1\]: unknown field 'base'"),
        (lambda d: d["tensors"][1].update(requires_grad=0), r"^tensors\[1\]\.requires_grad: exp"),
        (lambda d: d["tensors"][1].update(name="x"), r"^tensors\[1\]: name 'x' is already used"),
        (lambda d: d["tensors"][3].update(base="h9"), r"^tensors\[3\]\.base: unknown tensor 'h9'$"),
        (lambda d: d["tensors"][3].update(shape=[500]), r"^tensors\[3\]: view 'flat': shape"),
        (lambda d: d["tensors"][3].update(dtype_bytes=4), r"^tensors\[3\]\.dtype_bytes: view"),
        (
            lambda d: d["ops"][1]["inputs"][0].update(tensor="h9"),
            r"^ops\[1\]\.inputs\[0\]\.tensor: unknown tensor 'h9'$",
        ),
        (
            lambda d: d["ops"][1]["inputs"].__setitem__(0, []),
            r"^ops\[1\]\.inputs\[0\]: expected an",
        ),
        (
            lambda d: d["ops"][0].update(axes=[["b", 64]]),
            r"^ops\[0\]\.inputs\[0\]\.dims: axis 'in'",
        ),
        (lambda d: d["ops"][0]["axes"].__setitem__(0, ["b", 3]), r"^ops\[0\]: .*'b'.* 3"),
        (lambda d: d["ops"][0]["axes"].__setitem__(1, ["in"]), r"^ops\[0\]\.axes\[1\]: expected"),
        (lambda d: d["ops"][0]["axes"].append(["b", 64]), r"^ops\[0\]\.axes\[3\]: axis 'b' is li"),
        (lambda d: d["ops"][0]["axes"].append(["z", 2]), r"^ops\[0\]: .*axes \['z'\] belong to no"),
        (lambda d: d["ops"][0].update(partitionable=["q"]), r"^ops\[0\]: .*partitionable axes"),
        (lambda d: d["ops"][0].update(partitionable=[1]), r"^ops\[0\]\.partitionable\[0\]: expe"),
        (lambda d: d["ops"][0].update(inputs="x"), r"^ops\[0\]\.inputs: expected list"),
        (lambda d: d["ops"][0].update(inputs=[]), r"^ops\[0\]: .*at least one input"),
        (lambda d: d["ops"][0].update(kind=""), r"^ops\[0\]: .*kind must be"),
        (lambda d: d["ops"][0].update(partitionible=[]), r"^ops\[0\]: unknown field 'partitionib"),
        (lambda d: d["ops"][0]["output"].pop("dims"), r"^ops\[0\]\.output\.dims: missing$"),
        (lambda d: d["ops"][0]["output"].update(dtype_bytes=0), r"^ops\[0\]: .*dtype_bytes"),
        (lambda d: d["ops"][0]["output"].update(dims=["b", "x"]), r"^ops\[0\]\.output\.dims: axis"),
        (lambda d: d["ops"][2].update(name="fc1"), r"^ops\[2\]: name 'fc1' is already used"),
    ],
)
def test_bad_json_names_the_field(edit, message):
    d = _small()
    edit(d)
    with pytest.raises(taps.GraphError, match=message):
        taps.Graph.from_json(json.dumps(d))


def test_the_unedited_document_loads():
    d = _small()
    g = taps.Graph.from_json(json.dumps(d))
    assert [op.name for op in g.ops] == ["fc1", "act1", "fc2", "sink"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        ("[]", "top level: expected an object, got list"),
        ("null", "top level: expected an object"),
        ('{"format": "taps.graph"}', "^version: missing"),
    ],
)
def test_invalid_json_and_wrong_top_level(text, message):
    with pytest.raises(taps.GraphError, match=message):
        taps.Graph.from_json(text)


def test_cycle_is_detected_and_names_only_its_operators():
    d = _doc(taps.models.mlp(batch=64, sizes=(8, 16, 8, 8)))
    # fc1 reads fc2's output: fc1 -> act1 -> fc2 -> fc1; act2 and fc3 hang off the cycle.
    d["ops"][0]["inputs"][0]["tensor"] = "fc2.out"
    d["ops"][0]["axes"] = [["b", 64], ["in", 8], ["out", 16]]
    with pytest.raises(taps.GraphError) as info:
        taps.Graph.from_json(json.dumps(d))
    assert str(info.value) == "ops: the graph has a cycle: 'fc1' -> 'act1' -> 'fc2' -> 'fc1'"


def test_cycle_through_a_view_and_a_cycle_of_views():
    d = _small()
    # fc1 reads the view of fc2's output.
    d["ops"][0]["inputs"][0]["tensor"] = "flat2"
    d["tensors"].append(
        {"name": "flat2", "kind": "view", "shape": [64, 8], "dtype_bytes": 2, "base": "fc2.out"}
    )
    with pytest.raises(taps.GraphError, match=r"cycle: 'fc1' -> 'act1' -> 'fc2' -> view 'flat2'"):
        taps.Graph.from_json(json.dumps(d))
    d = _small()
    d["tensors"] += [
        {"name": "u", "kind": "view", "shape": [4], "dtype_bytes": 2, "base": "w"},
        {"name": "w", "kind": "view", "shape": [2, 2], "dtype_bytes": 2, "base": "u"},
    ]
    with pytest.raises(taps.GraphError, match=r"cycle: view 'u' -> view 'w' -> view 'u'$"):
        taps.Graph.from_json(json.dumps(d))


def test_json_order_does_not_matter():
    g = taps.models.mlp(batch=64, sizes=(8, 16, 16, 8))
    d = _doc(g)
    d["ops"].reverse()
    d["tensors"].reverse()
    back = taps.Graph.from_json(json.dumps(d))
    # Sorted topologically again: the chain comes back in its only order.
    assert back == g and [op.name for op in back.ops] == [op.name for op in g.ops]


def test_round_trip_keeps_the_order_around_views():
    # 'late' reads a view, which the reader can only add once 'first' exists; 'other' is ready
    # from the start but must not overtake it.
    g = taps.Graph()
    x = g.input("x", (4, 6))
    first = g.relu("first", x)
    g.relu("late", g.reshape("flat", first, (24,)))
    g.relu("other", x)
    back = taps.Graph.from_json(g.to_json())
    assert [op.name for op in back.ops] == ["first", "late", "other"]


def test_the_files_axis_order_is_kept():
    d = _small()
    d["ops"][0]["axes"] = [["out", 16], ["b", 64], ["in", 8]]
    d["ops"][0]["partitionable"] = ["in", "out"]
    op = taps.Graph.from_json(json.dumps(d)).op("fc1")
    assert op.axes == ("out", "b", "in") and op.axis_sizes == (16, 64, 8)
    assert op.partitionable == ("out", "in")
    assert operand_axis_indices(op, op.inputs[0]) == [-1, 1]


def test_to_json_writes_one_line_per_entry():
    g = taps.models.alexnet()
    text = g.to_json()
    lines = text.splitlines()
    assert len(lines) == 4 + 2 + len(_doc(g)["tensors"]) + len(g.ops) + 4
    assert json.loads(text)["format"] == "taps.graph" and json.loads(text)["version"] == 1
    empty = taps.Graph(name="empty", layers=3)
    assert taps.Graph.from_json(empty.to_json()) == empty
    assert '"tensors": []' in empty.to_json()


@pytest.mark.parametrize(
    "graph",
    [
        taps.models.alexnet(),
        taps.models.alexnet(elementwise=True, bias=True),
        taps.models.megatron("1.7B"),
        taps.models.gpt(64, 4, 16, 2, dtype_bytes=4),
        taps.models.mlp(),
    ],
    ids=["alexnet", "alexnet-elementwise", "megatron", "gpt", "mlp"],
)
def test_builtin_models_round_trip(graph):
    back = taps.Graph.from_json(graph.to_json())
    assert back == graph
    assert back.edges == graph.edges and back.ops == graph.ops
    assert_topological(graph)


def test_graph_equality_sees_differences():
    def build(part: str = "bo", layers: int = 1, name: str = "g") -> taps.Graph:
        g = taps.Graph(name, layers)
        g.einsum(
            "e", "bi,io->bo", g.input("x", (4, 8)), g.parameter("w", (8, 2)), partitionable=part
        )
        return g

    assert build() == build()
    assert build() != build(part="b")
    assert build() != build(layers=2)
    assert build() != build(name="h")
    assert taps.models.mlp(batch=64) != taps.models.mlp(batch=32)
    assert build() != "not a graph"


# -- random graphs ----------------------------------------------------------------------------


@st.composite
def random_graphs(draw) -> taps.Graph:
    """Chains, branches (any live tensor may be read again) and joins (two-input einsums and
    adds) of einsum operators, with views between them."""
    g = taps.Graph(name=draw(st.text(min_size=1, max_size=5)), layers=draw(st.integers(1, 4)))
    sizes = st.sampled_from([2, 4, 6])
    live = [g.input("x", (draw(sizes), draw(sizes)), draw(st.sampled_from([2, 4])))]
    if draw(st.booleans()):
        live.append(g.input("y", live[0].shape, requires_grad=draw(st.booleans())))
    for k in range(draw(st.integers(1, 8))):
        src = draw(st.sampled_from(live))
        kind = draw(st.sampled_from(["linear", "gelu", "add", "view", "einsum", "join"]))
        if kind == "linear":
            live.append(g.linear(f"l{k}", src, draw(sizes), bias=draw(st.booleans())))
        elif kind == "gelu":
            live.append(g.gelu(f"g{k}", src))
        elif kind == "add":
            other = draw(st.sampled_from([t for t in live if t.shape == src.shape]))
            live.append(g.add(f"a{k}", src, other))
        elif kind == "view":
            live.append(g.reshape(f"v{k}", src, (math.prod(src.shape),)))
        elif kind == "einsum" and len(src.shape) == 2:
            w = g.parameter(f"w{k}", (src.shape[1], draw(sizes)))
            part = draw(st.sets(st.sampled_from("bio")))
            live.append(g.einsum(f"e{k}", "bi,io->bo", src, w, partitionable=part))
        elif kind == "join":
            # Contract the last dim of src with the first dim of any tensor of that size.
            partners = [t for t in live if len(t.shape) == 2 and t.shape[0] == src.shape[-1]]
            if partners and len(src.shape) <= 2:
                other = draw(st.sampled_from(partners))
                lhs = "ab"[: len(src.shape) - 1] + "k"
                live.append(g.einsum(f"j{k}", f"{lhs},kz->{lhs[:-1]}z", src, other))
    return g


@settings(max_examples=150, deadline=None)
@given(random_graphs())
def test_random_graphs_round_trip(graph):
    back = taps.Graph.from_json(graph.to_json())
    assert back == graph
    assert back.edges == graph.edges
    assert_topological(back)


@settings(max_examples=60, deadline=None)
@given(random_graphs(), st.randoms(use_true_random=False))
def test_shuffled_ops_come_back_in_topological_order(graph, rnd):
    d = _doc(graph)
    rnd.shuffle(d["ops"])
    back = taps.Graph.from_json(json.dumps(d))
    assert back.tensors == graph.tensors
    assert sorted(back.ops, key=lambda op: op.name) == sorted(graph.ops, key=lambda op: op.name)
    assert_topological(back)


def test_stacks_name_slices_and_round_trip():
    Graph = taps.Graph
    g = Graph("stacked")
    for i in range(3):
        g.parameter(f"w.{i}", (4, 8))
    g.stack("w", ["w.0", "w.1", "w.2"], axis=1)
    assert g.stacks == {"w": (("w.0", "w.1", "w.2"), 1)} and g.stack_shape("w") == (4, 3, 8)
    g.parameter("v.0.0", (2,))
    g.parameter("v.0.1", (2,))
    g.stack("v.0", ["v.0.0", "v.0.1"])
    g.stack("v", ["v.0"])  # a stack of stacks (nested scans)
    assert g.stack_shape("v") == (1, 2, 2)
    assert Graph.from_json(g.to_json()) == g
    assert json.loads(g.to_json())["stacks"][0] == {
        "name": "w",
        "pieces": ["w.0", "w.1", "w.2"],
        "axis": 1,
    }


@pytest.mark.parametrize(
    ("name", "pieces", "axis", "message"),
    [
        ("w", ["w.0"], 0, "already used"),
        ("s", [], 0, "at least one piece"),
        ("s", ["w.0", "x"], 0, "shapes"),
        ("s", ["w.0"], 3, "axis 3"),
        ("s", ["y.out"], 0, "no parameter, input or stack"),
        ("s", ["nope"], 0, "unknown tensor"),
    ],
)
def test_bad_stacks_are_refused(name, pieces, axis, message):
    Graph, GraphError = taps.Graph, taps.GraphError
    g = Graph()
    g.parameter("w.0", (4, 8))
    g.parameter("w", (1,))
    x = g.input("x", (8,))
    g.relu("y", x)
    with pytest.raises(GraphError, match=message):
        g.stack(name, pieces, axis)
    assert g.stacks == {}
    with pytest.raises(GraphError, match="stacks\\[0\\]"):
        Graph.from_dict({**g.to_dict(), "stacks": [{"name": name, "pieces": pieces, "axis": axis}]})
