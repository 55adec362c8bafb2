"""The Plan: checked when made, saved and read back exactly, refused with one line when it does
not hold together; and the CLI's saved plans (search --save, search/export of a saved plan)."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taps
from graphs_gen import CLUSTERS, small_graphs
from taps import Cluster, Plan, PlanFileError, Pricing, Strategy
from taps.cli import main
from taps.plan.plan import same_graph


def _random_plan(graph: taps.Graph, cluster: Cluster, seed: int, pricing: Pricing) -> Plan:
    rng = random.Random(seed)
    strategies = {
        op.name: rng.choice(taps.strategies_for(graph, op.name, cluster, replicas=True))
        for op in graph.ops
    }
    return Plan(graph, cluster, strategies, pricing)


PRICINGS = st.builds(
    Pricing,
    cost_model=st.sampled_from(["topology", "volume"]),
    step=st.sampled_from(["training", "forward"]),
    planner=st.just("paper"),
    zero=st.booleans(),
    parameter_bytes=st.sampled_from([None, 2, 4]),
    gradient_bytes=st.sampled_from([None, 4]),
    master_weights=st.booleans(),
    optimizer=st.sampled_from(["adam", "sgd", "none"]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(CLUSTERS), st.integers(0, 2**32 - 1), PRICINGS)
def test_a_saved_plan_reads_back_equal_and_prices_the_same(graph, shape, seed, pricing):
    """Any plan (random strategies, replicas too, any pricing) on any cluster: the JSON reads
    back to an equal plan, with the same strategies in the same order and the same cost to the
    last bit."""
    plan = _random_plan(graph, Cluster(*shape), seed, pricing)
    back = Plan.from_json(plan.to_json())
    assert back == plan
    assert list(back.strategies.items()) == list(plan.strategies.items())
    assert back.pricing == pricing and back.cluster == plan.cluster
    assert same_graph(back.graph, graph)
    assert taps.evaluate(back) == taps.evaluate(plan)


def test_a_searched_plan_round_trips_through_a_file(tmp_path):
    # No memory limit: the file, not what fits, is under test.
    cluster = Cluster(2, 8, 450e9, 50e9, math.inf, device="h100")
    result = taps.search(taps.models.by_name("gpt", 8), cluster, Pricing(zero=True))
    path = tmp_path / "plan.json"
    result.plan.save(path)
    back = Plan.load(path)
    assert back == result.plan
    assert taps.evaluate(back) == taps.evaluate(result.plan)
    # The search sums its tables in another order: equal to rounding.
    assert taps.evaluate(back) == pytest.approx(result.cost, rel=1e-12)
    assert json.loads(path.read_text())["version"] == taps.plan.VERSION


def test_plans_differ_when_anything_differs():
    graph, cluster = taps.models.mlp(), Cluster(1, 4)
    plan = taps.search(graph, cluster).plan
    assert plan != plan.with_pricing(Pricing(cost_model="volume"))
    other = dict(plan.strategies)
    name = next(iter(other))
    choices = taps.strategies_for(graph, name, cluster)
    other[name] = next(s for s in choices if s != other[name])
    assert plan != Plan(graph, cluster, other, plan.pricing)


@pytest.fixture(scope="module")
def saved() -> dict:
    return taps.search(taps.models.mlp(), Cluster(1, 4)).plan.to_dict()


def _refused(data: object, match: str) -> None:
    with pytest.raises(PlanFileError, match=match) as e:
        Plan.from_json(json.dumps(data))
    assert "\n" not in str(e.value)


def test_another_version_is_refused(saved):
    _refused({**saved, "version": 4}, "format version 4: this taps reads version 3")
    _refused({**saved, "version": 2}, "format version 2: this taps reads version 3")
    # Version 1 priced memory by one bytes_per_parameter, which names no dtype or optimizer.
    _refused({**saved, "version": 1}, "format version 1: this taps reads version 3")


def test_what_is_not_a_plan_is_refused(saved):
    _refused(saved["graph"], "not a saved taps plan")
    _refused([1, 2], "not a saved taps plan")
    with pytest.raises(PlanFileError, match="not JSON"):
        Plan.from_json(b"\xff\xfe")
    _refused({k: v for k, v in saved.items() if k != "pricing"}, "the plan has no pricing")


def test_a_changed_graph_is_refused(saved):
    changed = json.loads(json.dumps(saved))
    changed["graph"]["name"] = "something else"
    _refused(changed, "graph was changed after it was saved")


def test_a_plan_of_another_graph_is_refused(saved):
    plan = Plan.from_dict(saved)
    with pytest.raises(PlanFileError, match="not the graph"):
        Plan.from_dict(saved, graph=taps.models.alexnet())
    assert Plan.from_dict(saved, graph=plan.graph) == plan


def test_strategies_that_do_not_fit_the_saved_graph_are_refused(saved):
    broken = json.loads(json.dumps(saved))
    name = next(iter(broken["strategies"]))
    broken["strategies"][name]["degrees"] = [1]
    broken["strategies"][name]["device_map"] = [-1]
    broken["strategies"][name]["device_matrix"] = [4]
    _refused(broken, "does not hold together: operator")


def test_strategies_of_another_graph_are_refused():
    """An operator of the same name in another graph: its strategy splits other axes."""
    cluster = Cluster(1, 4)
    a = taps.Graph("a")
    x = a.input("x", [8, 16])
    a.linear("fc", x, 32)
    b = taps.Graph("b")
    y = b.input("y", [8, 16])
    b.relu("fc", y)
    theirs = taps.search(a, cluster).plan.strategies
    with pytest.raises(taps.StrategyError, match="a strategy of another graph"):
        Plan(b, cluster, theirs)
    with pytest.raises(taps.GraphError, match="does not have: 'extra'"):
        Plan(a, cluster, {**theirs, "extra": Strategy([4], [0])})
    with pytest.raises(taps.StrategyError, match="no strategy for 1 operator"):
        Plan(a, cluster, {})
    with pytest.raises(taps.StrategyError, match="spans 4 devices, the cluster 8"):
        Plan(a, Cluster(2, 4), theirs)
    with pytest.raises(TypeError, match=r"expected a taps\.Plan"):
        taps.export.to_jax("mlp")  # type: ignore[arg-type]


def test_a_plan_is_read_only(saved):
    plan = Plan.from_dict(saved)
    with pytest.raises(TypeError):
        plan.strategies["x"] = Strategy([1], [-1])  # type: ignore[index]


# -- the CLI -----------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    return main([str(a) for a in argv])


def test_search_saves_a_plan_that_search_and_export_read_without_searching(
    tmp_path, capsys, monkeypatch
):
    plan, first, again = tmp_path / "plan.json", tmp_path / "a.json", tmp_path / "b.json"
    fresh_export, saved_export = tmp_path / "fresh.json", tmp_path / "saved.json"
    argv = ["search", "mlp", "--nodes", "2", "--devices-per-node", "4"]
    assert _cli(*argv, "--save", plan, "--json", first, "--export", "jax", fresh_export) == 0
    capsys.readouterr()

    def no_search(*args, **kwargs):
        raise AssertionError("a saved plan was searched again")

    monkeypatch.setattr("taps.cli.search.search", no_search)
    monkeypatch.setattr("taps.cli.search.compare", no_search)
    assert _cli("search", plan, "--json", again) == 0
    assert "saved plan" in capsys.readouterr().out
    before, after = json.loads(first.read_text())["topology"], json.loads(again.read_text())
    # The search's cost sums its tables, the saved plan's its breakdown: equal to rounding.
    assert after["topology"]["cost"] == pytest.approx(before["cost"], rel=1e-12)
    assert after["topology"]["operators"] == before["operators"]
    assert _cli("export", plan, "--to", "jax", saved_export) == 0
    assert saved_export.read_text() == fresh_export.read_text()


def test_cli_refuses_a_bad_saved_plan_in_one_line(tmp_path, capsys, saved):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**saved, "version": 7}))
    assert _cli("search", path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "format version 7" in err
    path.write_text(json.dumps(saved))
    assert _cli("search", path, "--nodes", "2") == 2
    assert (
        "a saved plan carries its graph, cluster and pricing: leave out --nodes"
        in capsys.readouterr().err
    )
    graph = tmp_path / "graph.json"
    graph.write_text(taps.models.mlp().to_json())
    assert _cli("export", graph, "--to", "jax", tmp_path / "out.json") == 2
    assert "not a plan saved by taps search --save" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_redistribute_and_its_old_name(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--from", "[2,8]:[1,0]", "--to", "[8,2]:[1,0]", "--shape", "1024,1024"]
    cluster = ["--nodes", "2", "--devices-per-node", "8"]
    assert _cli("redistribute", *argv, *cluster, "--json", out) == 0
    new = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert set(doc["planners"]) == {"paper", "optimal"}
    assert doc["planners"]["optimal"]["cost"] <= doc["planners"]["paper"]["cost"]
    assert _cli("plan", *argv, *cluster) == 0
    old = capsys.readouterr()
    assert old.err == "taps plan is now taps redistribute (the old name still works)\n"
    assert old.out == new.rsplit("wrote", 1)[0]


def test_verify_runs_a_saved_plan_as_it_was_saved(tmp_path, capsys, monkeypatch):
    """The plan saved under the optimal planner and ZeRO is what runs: every collective XLA
    compiles is one taps predicted for that pricing, and nothing is searched again."""
    path, out = tmp_path / "plan.json", tmp_path / "verify.json"
    graph = taps.models.mlp(batch=64, sizes=(32, 64, 32))
    plan = taps.search(graph, Cluster(2, 2), Pricing(planner="optimal", zero=True)).plan
    plan.save(path)

    def no_search(*args, **kwargs):
        raise AssertionError("a saved plan was searched again")

    monkeypatch.setattr("taps.cli.verify.search", no_search)
    assert _cli("verify", path, "--json", out) == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["collectives"]
    assert _cli("verify", path, "--planner", "paper") == 2
    assert "leave out --planner" in capsys.readouterr().err
