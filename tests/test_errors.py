"""The one rule for errors (docs/errors.md): TypeError for a wrong type, a TapsError (a ValueError)
for a bad value, naming the argument and the value; in the CLI one line and exit code 2 for bad
input and failed reads or writes, 130 for Ctrl-C, 70 and a bug-report line for anything else, and
no output file unless all of it is written. Also the limits: candidates counted before they are
enumerated, searches too large for the memory refused, the time limit over the whole search."""

from __future__ import annotations

import json
import math
import pickle
import time
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import taps
import taps.cli.search as cli_search
from taps._support import limits
from taps._support.limits import candidate_count
from taps.cli import main
from taps.errors import ArgumentError, ResourceError, TimeLimitError
from taps.report.tables import result_dict
from taps.search.tables import build_tables
from taps.solve.pipeline import IlpOptions, solve
from taps.solve.problem import PairCost, Problem

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def alexnet() -> taps.Graph:
    return taps.models.alexnet()


CLUSTER = taps.Cluster(2, 8)


# -- the library ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["memory_limit", "time_limit"])
@pytest.mark.parametrize("value", [NAN, -1.0, INF, -INF])
@pytest.mark.parametrize("function", [taps.search, taps.compare])
def test_search_refuses_nan_negative_and_infinite_limits(alexnet, function, name, value):
    with pytest.raises(ArgumentError, match=f"{name} must be a finite") as e:
        function(alexnet, CLUSTER, **{name: value})
    assert isinstance(e.value, taps.TapsError)
    assert isinstance(e.value, ValueError)
    assert function.__name__.rpartition(".")[2] in str(e.value)


@pytest.mark.parametrize("value", [1e-300, 0.5])
def test_search_refuses_a_memory_limit_below_one_byte(alexnet, value):
    """Shown as "0 bytes" in the infeasibility message, it would read as a bug in taps."""
    with pytest.raises(ArgumentError, match=r"memory_limit must be at least 1 byte, got"):
        taps.search(alexnet, CLUSTER, memory_limit=value)


@pytest.mark.parametrize("value", [NAN, -1, 0, 2.0, INF, True])
@pytest.mark.parametrize("name", ["parameter_bytes", "gradient_bytes"])
def test_pricing_refuses_element_sizes_that_are_not_positive_ints(name, value):
    with pytest.raises(ArgumentError, match=f"Pricing: {name} must be a positive int"):
        taps.Pricing(**{name: value})


def test_pricing_refuses_an_unknown_optimizer():
    with pytest.raises(ArgumentError, match="unknown optimizer 'lamb': expected one of adam"):
        taps.Pricing(optimizer="lamb")  # type: ignore[arg-type]


def test_nan_memory_limit_no_longer_gives_a_wrong_optimum(alexnet):
    """The bug of the issue: NaN compared false everywhere and the search reported 6.03 ms as
    optimal where the optimum is 1.04 ms; a huge finite limit is the unconstrained search."""
    with pytest.raises(ArgumentError):
        taps.search(alexnet, CLUSTER, memory_limit=NAN)
    free = taps.search(alexnet, CLUSTER)
    assert taps.search(alexnet, CLUSTER, memory_limit=1e30).cost == free.cost


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"memory_limit": "80GB"}, "memory_limit must be a number"),
        ({"time_limit": True}, "time_limit must be a number"),
        ({"options": {"reduce": False}}, "options must be an IlpOptions"),
    ],
)
def test_search_refuses_wrong_types(alexnet, kwargs, match):
    with pytest.raises(TypeError, match=match):
        taps.search(alexnet, CLUSTER, **kwargs)


def test_pricing_refuses_wrong_types():
    with pytest.raises(TypeError, match="master_weights must be True or False"):
        taps.Pricing(master_weights=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="zero must be True or False"):
        taps.Pricing(zero=1)
    with pytest.raises(TypeError, match=r"pricing must be a taps\.Pricing"):
        taps.search(taps.models.mlp(), CLUSTER, "volume")


def test_search_refuses_what_is_not_a_graph_or_cluster(alexnet):
    with pytest.raises(TypeError, match=r"graph must be a taps\.Graph"):
        taps.search("alexnet", CLUSTER)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cluster must be a taps\.Cluster"):
        taps.compare(alexnet, (2, 8))  # type: ignore[arg-type]


def test_no_optimizer_state_is_allowed(alexnet):
    pricing = taps.Pricing(master_weights=False, optimizer="none")
    assert taps.search(alexnet, CLUSTER, pricing).status == "optimal"


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: taps.models.gpt(64, 4, 8, 2**70), "batch must be a positive int below 2\\*\\*63"),
        (lambda: taps.models.gpt(64, 4, 2**40, 2**30), "batch \\* heads \\* seq \\* seq"),
        (lambda: taps.models.gpt(64, 4, 8, 2, layers=0), "layers must be a positive int"),
        (lambda: taps.models.alexnet(batch=2**63), "batch must be a positive int"),
        (lambda: taps.models.mlp(sizes=(8, -1)), "sizes\\[1\\]"),
        (lambda: taps.models.megatron("1.7B", batch=-4), "batch must be a positive int"),
    ],
)
def test_model_sizes_are_refused_up_front(build, match):
    with pytest.raises(taps.GraphError, match=match):
        build()


def test_model_size_of_a_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="gpt: batch must be an int, got str"):
        taps.models.gpt(64, 4, 8, "2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="alexnet: batch must be an int, got float"):
        taps.models.alexnet(batch=2.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [[2**63], [2**62, 4], [2**40, 2**40]])
def test_graph_shapes_must_fit_64_bits(shape):
    with pytest.raises(taps.GraphError, match="below 2\\*\\*63"):
        taps.Graph().input("x", shape)


def test_json_nested_too_deeply_is_a_graph_error():
    with pytest.raises(taps.GraphError, match="nested too deeply"):
        taps.Graph.from_json("[" * 200_000 + "]" * 200_000)


def test_json_that_is_not_utf8_is_a_graph_error():
    with pytest.raises(taps.GraphError, match="not JSON"):
        taps.Graph.from_json(b'{"name": "\xff\xfe\xfa"}')


# -- limits -----------------------------------------------------------------------------------


def _closed_form(p: int, n: int) -> int:
    """Axes every power of two divides: i of p axes split, ordered on the device matrix, their
    exponents a composition of n into i parts."""
    if n == 0:
        return 1
    return sum(
        math.factorial(i) * math.comb(p, i) * math.comb(n - 1, i - 1)
        for i in range(1, min(p, n) + 1)
    )


@given(
    st.lists(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 64, 96, 1000]), max_size=5),
    st.integers(0, 6),
)
def test_candidate_count_is_the_number_enumerated(sizes, n):
    assert candidate_count(sizes, 2**n) == len(taps.enumerate_strategies(sizes, 2**n))


@given(st.integers(0, 9), st.integers(0, 14))
def test_candidate_count_matches_the_closed_form(p, n):
    assert candidate_count([2**20] * p, 2**n) == _closed_form(p, n)


def _wide(axes: int, size: int = 128) -> taps.Graph:
    g = taps.Graph("wide")
    x = g.input("x", [size] * axes)
    names = "abcdefgh"[:axes]
    g.add_operator("op", "einsum", [(x, list(names))], list(names))
    return g


def test_eight_axes_on_8192_devices_are_refused_before_enumerating():
    """The issue's SIGABRT: 88 million candidates would take tens of GiB; counting takes
    microseconds."""
    t0 = time.perf_counter()
    with pytest.raises(ResourceError, match="88,507,888 candidate strategies") as e:
        taps.search(_wide(8), taps.Cluster(1024, 8))
    assert time.perf_counter() - t0 < 1.0
    assert "GiB" in str(e.value)
    with pytest.raises(ResourceError):
        taps.strategies_for(_wide(8), "op", taps.Cluster(1024, 8))


def test_search_larger_than_the_memory_is_refused_with_the_estimate(alexnet, monkeypatch):
    candidates = sum(len(taps.strategies_for(alexnet, op.name, CLUSTER)) for op in alexnet.ops)
    # The training step (the default) prices every edge both ways: its pairs count twice.
    pairs = 2 * taps.search(alexnet, CLUSTER).num_aux_edges
    need = limits.table_bytes(candidates, pairs)
    monkeypatch.setattr(limits, "available_memory", lambda reserved=0: need - 1)
    with pytest.raises(ResourceError, match=f"{candidates:,} candidate strategies, {pairs:,}"):
        taps.search(alexnet, CLUSTER)
    with pytest.raises(ResourceError, match="GiB available"):
        taps.compare(alexnet, CLUSTER)
    monkeypatch.setattr(limits, "available_memory", lambda reserved=0: need)
    assert taps.search(alexnet, CLUSTER).status == "optimal"


def test_available_memory_is_known_here():
    have = limits.available_memory()
    assert have is None or have > 0
    # Never more than the machine's, whatever a container allows.
    machine = limits._meminfo_available()
    if machine is not None:
        assert have is not None
        # Two reads of a number other processes change: allow what moved between them.
        assert have <= machine + 256 * 2**20


def _needs_scip() -> tuple[taps.Graph, IlpOptions]:
    # Without the exact reductions SCIP decides every operator.
    return taps.models.alexnet(), IlpOptions(reduce=False)


def test_time_limit_that_runs_out_in_the_cost_tables_is_one_clean_error():
    """The tables are checked between operators and edges: a limit that passes while they are
    built has no assignment to return."""
    graph, options = _needs_scip()
    with pytest.raises(TimeLimitError, match="time limit ran out while pricing") as e:
        taps.search(graph, CLUSTER, time_limit=1e-9, options=options)
    assert isinstance(e.value, taps.TapsError)


@pytest.mark.parametrize("reduce", [True, False])
def test_time_limit_that_runs_out_before_scip_returns_its_first_assignment(reduce):
    """The reductions, the pruning and the ILP build check the limit too: past it, the solve
    returns SCIP's first assignment (each operator's cheapest candidate), a plan the search
    prices as any other."""
    graph = taps.models.alexnet()
    tables = build_tables(graph, CLUSTER)
    result = solve(tables, CLUSTER.device_memory, 1e-9, IlpOptions(reduce=reduce))
    assert result.status == "timelimit" and result.gap == INF
    assert result.choice == {n: int(np.argmin(t.node_cost)) for n, t in tables.ops.items()}
    plan = taps.Plan(graph, CLUSTER, tables.strategies(result.choice))
    assert tables.evaluate(result.choice) == pytest.approx(taps.evaluate(plan), rel=1e-9)
    timed = type(taps.search(graph, CLUSTER))(
        **{**taps.search(graph, CLUSTER).__dict__, "status": result.status, "gap": result.gap}
    )
    data = json.loads(json.dumps(result_dict(timed), allow_nan=False))
    assert data["status"] == "timelimit" and data["gap"] is None


@dataclass
class _Instance:
    """A problem of two operators joined by one pair cost, as :func:`solve` takes it."""

    memory_per_op: dict[str, np.ndarray]
    layers: int = 1
    tied: tuple = ()

    def problem(self) -> Problem:
        pair = PairCost("a", "b", np.array([0, 1]), np.array([0]), np.array([[0.0], [1.0]]))
        return Problem({"a": np.array([1.0, 2.0]), "b": np.array([1.0])}, [pair])


def test_time_limit_with_no_first_assignment_that_fits_is_one_clean_error():
    """The cheapest candidate of ``a`` needs 10 bytes, the other 1: under a limit of 5 the solve
    finds the second in time, and out of time it has nothing that fits to return."""
    instance = _Instance({"a": np.array([10.0, 1.0]), "b": np.array([1.0])})
    assert solve(instance, 5.0).choice == {"a": 1, "b": 0}
    with pytest.raises(TimeLimitError, match="fits the memory limit of 5 bytes"):
        solve(instance, 5.0, 1e-9)
    assert solve(instance, 11.0, 1e-9).choice == {"a": 0, "b": 0}


def test_compare_shares_its_time_limit_between_both_searches(alexnet):
    comparison = taps.compare(alexnet, CLUSTER, time_limit=30)
    assert comparison.topology.status == comparison.volume.status == "optimal"


def test_unknown_gap_is_null_in_json(alexnet):
    result = taps.search(alexnet, CLUSTER)
    unknown = result_dict(type(result)(**{**result.__dict__, "gap": INF}))
    assert unknown["gap"] is None
    json.dumps(unknown, allow_nan=False)


# -- the command line -------------------------------------------------------------------------

SEARCH = ["search", "alexnet", "--nodes", "2", "--devices-per-node", "8"]
REDISTRIBUTE = [
    *("redistribute", "--from", "[2,8]:[1,0]", "--to", "[8,2]:[1,0]", "--shape", "64,64"),
    *("--nodes", "2", "--devices-per-node", "8"),
]


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*SEARCH, "--memory", "-1GB"], "memory size must be finite and at least 1 byte"),
        ([*SEARCH, "--memory", "nan"], "memory size must be finite and at least 1 byte"),
        ([*SEARCH, "--memory", "1e-300"], "memory size must be finite and at least 1 byte"),
        ([*SEARCH, "--time-limit", "-1"], "time limit (seconds) must be a positive"),
        ([*SEARCH, "--time-limit", "nan"], "time limit (seconds) must be a positive"),
        ([*SEARCH, "--time-limit", "inf"], "time limit (seconds) must be a positive"),
        ([*SEARCH, "--time-limit", "-inf"], "time limit (seconds) must be a positive"),
        ([*SEARCH, "--inter-bandwidth", "-6e9"], "inter-node bandwidth must be a positive"),
        (
            [
                "plan",
                "--from",
                "[2,8]:[1,0]",
                "--to",
                "[8,2]:[1,0]",
                "--shape",
                "1024,99999999999999999999999",
                "--nodes",
                "2",
                "--devices-per-node",
                "8",
            ],
            "beyond 2**63",
        ),
        (
            ["search", "gpt", "--nodes", "1", "--devices-per-node", "2", "--batch", str(2**70)],
            f"--batch: '{2**70}' is beyond 2**63",
        ),
        (
            ["search", "gpt", "--nodes", "1", "--devices-per-node", "2", "--batch", "0"],
            "gpt: batch must be a positive int below 2**63, got 0",
        ),
        ([*SEARCH[:2], "--nodes", str(2**63), "--devices-per-node", "8"], "beyond 2**63"),
        # An element's bytes beyond any dtype's made the price infinite (and the JSON fail);
        # an empty target shape was read as none given.
        (
            [*REDISTRIBUTE, "--dtype-bytes", "1e308"],
            "bytes per element must be at most 1024, got '1e308'",
        ),
        ([*REDISTRIBUTE, "--target-shape="], "shape [] has 0 dims"),
        ([*SEARCH, "--json", "/no/such/dir/x.json"], "No such file or directory"),
        ([*SEARCH, "--json", "/dev/full"], "not a regular file"),
        ([*SEARCH, "--plot", "/no/such/dir/plan.png"], "No such file or directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    # Output paths and values are checked before the work: no search may start.
    monkeypatch.setattr(cli_search, "search", _no_search)
    monkeypatch.setattr(cli_search, "compare", _no_search)
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert message in err


def _no_search(*args, **kwargs):
    raise AssertionError("the search ran before the arguments were checked")


def test_output_that_is_a_directory_is_refused_first(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_search, "search", _no_search)
    code, out, err = _run([*SEARCH, "--json", str(tmp_path)], capsys)
    assert (code, out) == (2, "")
    assert "is a directory" in err


def test_version(capsys):
    code, out, _ = _run(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"taps {taps.__version__}"


def test_search_help_lists_every_built_in_model(capsys):
    code, out, _ = _run(["search", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    for name in taps.models.names():
        assert name in text
    assert "gpt" in taps.models.names()


@pytest.mark.parametrize(
    "content",
    [
        b'{"format": "taps.graph", "name": "\xff\xfe"}',
        b"[" * 200_000 + b"]" * 200_000,
        b"\x00\x01",
        b"",
    ],
    ids=["not-utf8", "nested", "binary", "empty"],
)
def test_bad_graph_files_are_one_line(tmp_path, content, capsys):
    path = tmp_path / "g.json"
    path.write_bytes(content)
    code, out, err = _run(["search", str(path), "--nodes", "1", "--devices-per-node", "2"], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert str(path) in err


def test_batch_of_a_graph_file_or_a_traced_model_is_refused(tmp_path, capsys, monkeypatch):
    # --batch sizes a built-in model only; it was ignored without a word for the others.
    monkeypatch.setattr(cli_search, "search", _no_search)
    path = tmp_path / "g.json"
    path.write_text(taps.models.mlp().to_json())
    cluster = ["--nodes", "1", "--devices-per-node", "2", "--batch", "4"]
    for argv in (["search", str(path)], ["search", "--torch", "no_such_module:f"]):
        code, out, err = _run([*argv, *cluster], capsys)
        assert (code, out) == (2, "")
        assert err.count("\n") == 1
        assert "--batch sizes a built-in model" in err


def test_collectives_of_a_pipeline_are_refused_before_the_search(capsys, monkeypatch):
    # They were left out of the report without a word.
    monkeypatch.setattr(cli_search, "search", _no_search)
    code, out, err = _run([*SEARCH, "--pipeline", "--collectives"], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "--collectives lists one intra-operator plan" in err


def test_graph_file_that_is_a_directory_is_one_line(tmp_path, capsys):
    folder = tmp_path / "dir.json"
    folder.mkdir()
    code, _, err = _run(["search", str(folder), "--nodes", "1", "--devices-per-node", "2"], capsys)
    assert code == 2
    assert "cannot read" in err


def test_redistribute_prints_nothing_before_a_late_error(capsys, monkeypatch):
    import taps.cli.redistribute as cli_redistribute

    def failing_table(*args, **kwargs):
        raise taps.TopologyError("late")

    monkeypatch.setattr(cli_redistribute, "plan_table", failing_table)
    argv = ["redistribute", "--from", "[2,8]:[1,0]", "--to", "[8,2]:[1,0]", "--shape", "64,64"]
    code, out, err = _run([*argv, "--nodes", "2", "--devices-per-node", "8"], capsys)
    assert (code, out) == (2, "")
    assert err == "taps redistribute: error: late\n"


def test_internal_error_is_one_line_asking_for_a_report(capsys, monkeypatch):
    monkeypatch.setattr(cli_search, "search", lambda *a, **k: {}["boom"])
    monkeypatch.delenv("TAPS_DEBUG", raising=False)
    code, _, err = _run(SEARCH, capsys)
    assert code == 70
    assert err.count("\n") == 1
    assert "internal error (KeyError" in err
    assert "please report" in err
    assert "Traceback" not in err
    monkeypatch.setenv("TAPS_DEBUG", "1")
    code, _, err = _run(SEARCH, capsys)
    assert code == 70
    assert "Traceback" in err


def test_ctrl_c_is_one_line_exit_130_and_no_output_file(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        # The temporary file exists while the search runs...
        assert [p.name for p in tmp_path.iterdir()] != []
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_search, "search", interrupted)
    out_file = tmp_path / "result.json"
    code, out, err = _run([*SEARCH, "--json", str(out_file)], capsys)
    assert (code, out, err) == (130, "", "taps search: interrupted\n")
    # ...and nothing is left of it.
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_file(tmp_path, capsys, monkeypatch):
    out_file = tmp_path / "result.json"
    out_file.write_text("old")

    def failing_plot(result, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(cli_search, "plot_plan", failing_plot)
    argv = ["search", "mlp", "--nodes", "1", "--devices-per-node", "2"]
    code, out, err = _run(
        [*argv, "--json", str(out_file), "--plot", str(tmp_path / "p.png")], capsys
    )
    assert (code, out) == (2, "")
    assert "No space left on device" in err
    assert out_file.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_json_output_is_valid_json_with_status_and_gap(tmp_path, capsys):
    out_file = tmp_path / "r.json"
    argv = ["search", "mlp", "--nodes", "1", "--devices-per-node", "2", "--json", str(out_file)]
    code, _, _ = _run(argv, capsys)
    assert code == 0
    data = json.loads(out_file.read_text(), parse_constant=_no_constant)
    assert data["topology"]["status"] == "optimal"
    assert data["topology"]["gap"] == 0


def _no_constant(name):
    raise AssertionError(f"{name} is not JSON")


def test_two_outputs_to_one_file_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_search, "search", _no_search)
    same = str(tmp_path / "out.png")
    code, out, err = _run([*SEARCH, "--json", same, "--plot", same], capsys)
    assert (code, out) == (2, "")
    assert "same file" in err
    assert list(tmp_path.iterdir()) == []


def test_time_limit_that_runs_out_in_the_cost_tables_is_one_line_and_exit_2(capsys):
    code, out, err = _run([*SEARCH, "--time-limit", "1e-9"], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "the time limit ran out while pricing" in err


def test_measurements_larger_than_the_memory_are_refused_before_their_rows(monkeypatch):
    # 2,000,000 rows of a 68 MB CSV file under 1 GiB of address space used to be read for 27 s
    # until "out of memory" (997 MiB resident at the peak with room): refused before any row.
    from taps.calibrate import read_csv, read_nccl_tests
    from taps.calibrate.measurements import TEXT_BYTES

    text = "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,1024,1e-05\n"
    monkeypatch.setattr(limits, "available_memory", lambda reserved=0: TEXT_BYTES * len(text) - 1)
    with pytest.raises(ResourceError, match=r"the 74 characters of m.csv would need about"):
        read_csv(text, "m.csv")
    with pytest.raises(ResourceError, match="calibrate from fewer measurements"):
        read_nccl_tests(text, "n.txt", "all_reduce", 1, 8)
    monkeypatch.setattr(limits, "available_memory", lambda reserved=0: TEXT_BYTES * len(text))
    assert len(read_csv(text, "m.csv")) == 1


# -- a new user's misuse of the API (issue 25, docs/errors.md) -------------------------------

MLP = taps.models.mlp(8, (8, 16, 8))
SMALL = taps.Cluster(1, 4)
HUGE = 10**5000  # more digits than Python prints


@pytest.fixture(scope="module")
def small_plan() -> taps.Plan:
    return taps.search(MLP, SMALL).plan


@pytest.fixture(scope="module")
def pipelined() -> taps.Plan:
    graph = taps.models.gpt(hidden=32, heads=2, seq=8, batch=4, blocks=2, tie=True)
    spec = taps.Pipeline(stages=2, microbatches=2, schedule="1f1b")
    return taps.search(graph, taps.Cluster(1, 2), pipeline=spec).plan


def test_plans_pickle(small_plan, pipelined):
    for plan in (small_plan, pipelined):
        copy = pickle.loads(pickle.dumps(plan))
        assert copy == plan
    assert taps.evaluate(pickle.loads(pickle.dumps(small_plan))) == taps.evaluate(small_plan)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: taps.Plan(MLP, SMALL, dict(p.strategies), taps.Pricing(), None), "stages must"),
        (lambda p: taps.Plan(MLP, SMALL, dict(p.strategies), pipeline="1f1b"), "pipeline must"),
        (lambda p: taps.Plan.from_json(p.to_json(), graph="mlp"), "graph must be a taps.Graph"),
        (lambda p: p.save(None), "path must be"),
        (lambda p: taps.strategies_for("mlp", "fc1", SMALL), "graph must be a taps.Graph"),
        (lambda p: taps.strategies_for(MLP, "fc1", 4), "cluster must be a taps.Cluster"),
        (lambda p: taps.export.export("mlp", "jax"), "plan must be a taps.Plan"),
        (lambda p: taps.export.to_dtensor(p, "module"), "module must be a torch.nn.Module"),
        (lambda p: taps.search(MLP, SMALL, tie="no"), "tie must be True or False"),
        (lambda p: taps.search(MLP, SMALL, replicate=None), "replicate must be True or False"),
        (lambda p: taps.search(MLP, SMALL, pipeline=True, options={}), "options must be"),
        (lambda p: taps.Pricing(compute=1), "compute must be True, False or None"),
        (lambda p: taps.Pricing(compute=np.True_), "compute must be True, False or None"),
        (lambda p: taps.models.mlp(8, None), "sizes must be a tuple"),
        (lambda p: taps.models.megatron(None), "name must be a str"),
        (lambda p: taps.verify.verify(p, seed="1"), "seed must be an int"),
        (lambda p: taps.verify.verify(p, values="x"), "values must map"),
    ],
)
def test_wrong_types_name_the_argument(small_plan, call, match):
    """Each was an AttributeError, a StopIteration or a TypeError from inside taps or numpy
    that named no argument (or, for ``compute``, accepted and then failed to save as JSON)."""
    with pytest.raises(TypeError, match=match) as e:
        call(small_plan)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: taps.Pricing(optimizer=["adam"]), ArgumentError, "unknown optimizer"),
        (lambda: taps.search(MLP, SMALL, memory_limit=2**2000), ArgumentError, "2001 bits"),
        (lambda: taps.search(MLP, SMALL, time_limit=-HUGE), ArgumentError, "16610 bits"),
        (lambda: taps.Pricing(checkpoint=-HUGE), ArgumentError, "16610 bits"),
        (lambda: taps.Pricing(parameter_bytes=-HUGE), ArgumentError, "16610 bits"),
        (lambda: taps.Pipeline(microbatches=HUGE), ArgumentError, "below 2\\*\\*63"),
        (lambda: taps.Graph().input("x", [HUGE]), taps.GraphError, "16610 bits"),
        (lambda: taps.models.gpt(64, 4, 8, HUGE), taps.GraphError, "16610 bits"),
        (lambda: taps.Graph.from_json('{"a": ' + "9" * 5000 + "}"), taps.GraphError, "too long"),
        (lambda: taps.Plan.from_json('{"a": ' + "9" * 5000 + "}"), taps.PlanFileError, "too long"),
    ],
)
def test_bad_values_are_one_line(call, error, match):
    """Before: TypeError (unhashable), OverflowError, or Python's ValueError refusing to print
    an int of more than 4,300 digits from inside the message meant to name it."""
    with pytest.raises(error, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_fsdp_names_of_another_graph_are_refused_by_the_search():
    """A search's fsdp tuple of names the graph lacks used to be dropped silently."""
    for run in (taps.search, taps.compare):
        with pytest.raises(taps.GraphError, match=r"fsdp names operators .* 'fc9'"):
            run(MLP, SMALL, taps.Pricing(fsdp=("fc1", "fc9")))
    assert taps.search(MLP, SMALL, taps.Pricing(fsdp=("fc1",))).status == "optimal"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"time_limit": 1e-9}, "time_limit"),
        ({"options": IlpOptions(reduce=False)}, "options"),
        ({"tie": False}, "tie=False"),
        ({"replicate": True}, "replicate=True"),
        ({"pricing": taps.Pricing(cost_model="volume")}, "cost_model='volume'"),
    ],
)
def test_a_pipeline_search_refuses_what_it_would_ignore(kwargs, named):
    """Each was accepted and ignored: a pipeline's units are searched with their own settings,
    in seconds (the CLI refuses --time-limit and --cost-model with --pipeline the same way)."""
    graph = taps.models.gpt(hidden=32, heads=2, seq=8, batch=4, blocks=2, tie=True)
    with pytest.raises(ArgumentError, match=f"leave out {named}"):
        taps.search(graph, taps.Cluster(1, 2), pipeline=True, **kwargs)


def test_a_pipelined_plan_given_to_the_whole_cluster_exports_says_what_to_use(pipelined):
    """Before: "Layout(...) spans 2 devices, not 2" from inside the mesh, or the same from
    verify."""
    for export in (taps.export.to_jax, taps.export.to_dtensor):
        with pytest.raises(taps.ExportError, match="2 pipeline stages: export it with"):
            export(pipelined)
    with pytest.raises(taps.VerifyError, match="verify_pipeline"):
        taps.verify.verify(pipelined)


def test_verify_refuses_a_seed_numpy_would_reject(small_plan):
    """-1 was numpy's ValueError "expected non-negative integer"; checked before JAX starts."""
    for seed in (-1, 2**64, HUGE):
        with pytest.raises(taps.VerifyError, match="seed must be from 0 to 2\\*\\*64 - 1"):
            taps.verify.verify(small_plan, seed=seed)


def test_front_ends_and_torch_verify_name_wrong_types(small_plan):
    """Each was an AttributeError or a TypeError from inside taps (``kwargs.values``, iterating
    None) or a VerifyError quoting "'NoneType' object has no attribute 'named_parameters'"."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    import jax.numpy as jnp

    with pytest.raises(TypeError, match="from_torch: kwargs must map"):
        taps.from_torch(torch.nn.Linear(8, 8), torch.zeros(2, 8), kwargs="x")
    with pytest.raises(TypeError, match="from_jax: params_argnums must be an int or a sequence"):
        taps.from_jax(lambda w, x: x @ w, jnp.zeros((8, 8)), jnp.zeros((2, 8)), params_argnums=None)
    with pytest.raises(TypeError, match=r"verify_torch: module must be a torch\.nn\.Module"):
        taps.verify.verify_torch(None, [torch.zeros(8, 8)], small_plan)
    with pytest.raises(TypeError, match="verify_torch: inputs must be a list or tuple"):
        taps.verify.verify_torch(torch.nn.Linear(8, 8), torch.zeros(8, 8), small_plan)


# -- what the last sweep left (issue 25, branch h-small25) ------------------------------------


def test_a_pipelined_plan_of_another_same_named_graph_is_refused(pipelined):
    """Before: accepted, the stages' times and memory those of the graph they were searched on."""
    p = pipelined
    other = taps.models.gpt(
        hidden=32, heads=2, seq=8, batch=8, blocks=2, tie=True, name=p.graph.name
    )
    with pytest.raises(taps.GraphError, match="stage 0 was priced on another graph") as e:
        taps.Plan(other, p.cluster, dict(p.strategies), p.pricing, p.stages, p.pipeline)
    assert "\n" not in str(e.value)
    # An equal graph (read back from its JSON) is the same graph.
    again = taps.Graph.from_json(p.graph.to_json())
    assert taps.Plan(again, p.cluster, dict(p.strategies), p.pricing, p.stages, p.pipeline) == p
    assert pickle.loads(pickle.dumps(p)) == p == taps.Plan.from_json(p.to_json())


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: taps.Plan.load(None), "Plan.load: path must be a str or a path, got NoneType"),
        (lambda: taps.Plan.from_json(1), "Plan.from_json: text must be a str or bytes, got int"),
        (lambda: taps.Graph.from_json({}), "Graph.from_json: text must be a str or bytes"),
    ],
)
def test_files_and_texts_of_a_wrong_type_name_the_function(call, match):
    """Before: Python's "expected str, bytes or os.PathLike object, not NoneType" or json's
    "the JSON object must be str, bytes or bytearray", naming no function."""
    with pytest.raises(TypeError, match=match):
        call()
