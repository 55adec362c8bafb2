"""Fuzzing: arbitrary JSON and bytes at ``Graph.from_json``, arbitrary argument lists at the CLI.
Nothing may escape but a GraphError from the reader, and the exit codes 0 and 2 (with one line on
stderr for 2) from the CLI: no traceback, no internal error."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taps
import taps.cli.reproduce as cli_reproduce
import taps.cli.search as cli_search
from taps.cli import main

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
# Values that reach the interesting checks: sizes at and beyond 64 bits, zero, negative, names.
NASTY = st.sampled_from(
    [0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, 1.5, "", "x", "b", [], {}, None, True, [0], [2**63]]
)


def _documents() -> list[dict[str, Any]]:
    graph = taps.models.gpt(64, 4, 8, 2)
    mlp = taps.models.mlp(8, (8, 16, 8))
    return [json.loads(graph.to_json()), json.loads(mlp.to_json())]


DOCUMENTS = _documents()


def _paths(value: Any, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _replaced(doc: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replaced(doc[head], rest, new)}
    return [_replaced(v, rest, new) if i == head else v for i, v in enumerate(doc)]


def _read(text: str | bytes) -> None:
    try:
        taps.Graph.from_json(text)
    except taps.GraphError as e:
        assert str(e)
        assert "\n" not in str(e).strip()


@given(JSON)
def test_arbitrary_json_is_a_graph_or_a_graph_error(value):
    _read(json.dumps(value))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_a_graph_or_a_graph_error(data):
    _read(data)


@given(st.data())
def test_one_field_of_a_valid_graph_replaced(data):
    doc = data.draw(st.sampled_from(DOCUMENTS))
    path = data.draw(st.sampled_from(list(_paths(doc))))
    new = data.draw(NASTY | JSON)
    _read(json.dumps(_replaced(doc, path, new)))


@given(st.data())
def test_one_field_of_a_valid_graph_dropped(data):
    doc = data.draw(st.sampled_from(DOCUMENTS))
    path = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    holder = doc
    for key in path[:-1]:
        holder = holder[key]
    holder = holder.copy()
    del holder[path[-1]]
    _read(json.dumps(_replaced(doc, path[:-1], holder)))


# -- the command line -------------------------------------------------------------------------

WORDS = [
    "plan",
    "search",
    "reproduce",
    "--from",
    "--to",
    "--shape",
    "--target-shape",
    "--dtype-bytes",
    "--nodes",
    "--devices-per-node",
    "--intra-bandwidth",
    "--inter-bandwidth",
    "--batch",
    "--memory",
    "--cost-model",
    "--time-limit",
    "--collectives",
    "--json",
    "--plot",
    "--out",
    "--quick",
    "--version",
    "--",
    "-",
    "alexnet",
    "mlp",
    "gpt",
    "megatron-1.7B",
    "megatron-9B",
    "graph.json",
    "[2,8]:[1,0]",
    "[8,2]:[1,0]",
    "[2,8]:[1,1]",
    "[4]:[0]",
    "1024,1024",
    "[1024]",
    "[]",
    "1",
    "2",
    "8",
    "0",
    "-1",
    "-8",
    str(2**63),
    "nan",
    "inf",
    "-inf",
    "1e400",
    "80GB",
    "-1GB",
    "1KB",
    "both",
    "volume",
    "out.json",
    "/dev/full",
    "/no/such/dir/x",
    ".",
]
ARGUMENT = st.sampled_from(WORDS) | st.text(max_size=12) | st.integers().map(str)
ARGV = st.tuples(
    st.sampled_from(["redistribute", "plan", "search", "export", "reproduce", "--version"]),
    st.lists(ARGUMENT, max_size=14),
).map(lambda t: [t[0], *t[1]])


def _stub(*args: Any, **kwargs: Any) -> Any:
    # The work itself is tested elsewhere; here it would only make the fuzzing slow.
    raise taps.TapsError("stub")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "graph.json").write_text(taps.models.mlp(8, (8, 8)).to_json())
    monkeypatch.setattr(cli_search, "search", _stub)
    monkeypatch.setattr(cli_search, "compare", _stub)
    monkeypatch.setattr(cli_reproduce, "reproduce", _stub)
    return tmp_path


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=ARGV)
def test_any_argument_list_exits_0_or_2_with_one_line(workdir, capsys, argv):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: --help, --version and its own errors
        code = e.code
    _, err = capsys.readouterr()
    assert code in (0, 2), (argv, err)
    if code == 2:
        assert err.count("\n") == 1, (argv, err)
        assert "Traceback" not in err
    # Nothing but the graph file and what a run writes in full.
    assert all(not p.name.startswith(".") for p in workdir.iterdir()), os.listdir(workdir)


VALID = [
    [
        "plan",
        "--from",
        "[2,8]:[1,0]",
        "--to",
        "[8,2]:[1,0]",
        "--shape",
        "64,64",
        "--target-shape",
        "4096",
        "--nodes",
        "2",
        "--devices-per-node",
        "8",
        "--dtype-bytes",
        "2",
    ],
    [
        "search",
        "graph.json",
        "--nodes",
        "1",
        "--devices-per-node",
        "2",
        "--memory",
        "1GB",
        "--time-limit",
        "10",
        "--json",
        "out.json",
    ],
]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_value_of_a_valid_command_replaced(workdir, capsys, data):
    argv = list(data.draw(st.sampled_from(VALID)))
    values = [i for i, a in enumerate(argv) if i and not a.startswith("--")]
    for i in data.draw(st.lists(st.sampled_from(values), min_size=1, max_size=2)):
        argv[i] = data.draw(ARGUMENT)
    test_any_argument_list_exits_0_or_2_with_one_line.hypothesis.inner_test(workdir, capsys, argv)
