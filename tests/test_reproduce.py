"""``taps reproduce``: the invariants of the experiments on small instances, and the files the
command writes."""

from __future__ import annotations

import csv

import pytest

import taps
from taps.cli import main
from taps.reproduce import CSV_COLUMNS, FILES, TOLERANCE, Case, experiment_cases, run_case
from taps.reproduce.run import FULL_MODEL, PAPER_MODEL, full_cluster

SMALL = [
    Case("test", "mlp", 1024, 1, 4),
    Case("test", "mlp", 1024, 2, 2),
    Case("test", "mlp", 1024, 2, 4),
    Case("test", "mlp", 1024, 4, 2),
    Case("test", "alexnet", 16, 1, 4),
    Case("test", "alexnet", 16, 2, 2),
]
COSTS = (
    "topology_cost",
    "volume_cost_returned",
    "volume_cost_best_tie",
    "volume_cost_worst_tie",
    "topology_volume",
    "volume_volume",
)


def _at_most(a: float, b: float) -> bool:
    return a <= b * (1 + TOLERANCE)


@pytest.mark.parametrize("case", SMALL, ids=lambda c: f"{c.model}-{c.nodes}x{c.devices_per_node}")
def test_invariants(case):
    row = run_case(case)
    # Topology-aware search is never worse under its own model, and moves no fewer bytes than
    # the volume-optimal result.
    assert _at_most(row.cost_ratio, 1.0)
    assert _at_most(1.0, row.volume_ratio)
    assert _at_most(row.volume_cost_best_tie, row.volume_cost_returned)
    assert _at_most(row.volume_cost_returned, row.volume_cost_worst_tie)
    assert _at_most(row.topology_cost, row.volume_cost_best_tie)
    if case.nodes == 1:
        # One node: time is volume over one bandwidth, so every volume-optimal tie is optimal.
        for cost in (row.volume_cost_best_tie, row.volume_cost_worst_tie):
            assert row.topology_cost == pytest.approx(cost, rel=TOLERANCE)
    # The returned tie is what taps.search returns, priced from the plans, not the tables.
    comparison = taps.compare(case.graph(), case.cluster(), PAPER_MODEL)
    assert row.topology_cost == pytest.approx(comparison.topology.cost, rel=TOLERANCE)
    assert row.volume_cost_returned == pytest.approx(
        comparison.volume_under_topology, rel=TOLERANCE
    )
    assert row.volume_volume == pytest.approx(comparison.volume.cost, rel=TOLERANCE)


def test_full_model_column():
    """The full model's optimum is what taps.search finds on the flat-replica cluster by default,
    and the paper's plan priced from its plans (evaluate) under it costs no less."""
    case = Case("comparison", "mlp", 1024, 2, 4)
    row = run_case(case)
    assert row.full_cost is not None and row.full_cost_of_paper_plan is not None
    graph, flat = case.graph(), full_cluster(case.cluster())
    assert flat.replicas == "flat"
    assert row.full_cost == pytest.approx(taps.search(graph, flat, FULL_MODEL).cost, rel=TOLERANCE)
    paper = taps.search(graph, case.cluster(), PAPER_MODEL)
    assert row.topology_cost == pytest.approx(paper.cost, rel=TOLERANCE)
    priced = taps.evaluate(taps.Plan(graph, flat, paper.plan.strategies, FULL_MODEL))
    assert row.full_cost_of_paper_plan == pytest.approx(priced, rel=TOLERANCE)
    assert _at_most(row.full_cost, row.full_cost_of_paper_plan)
    assert row.full_saving is not None and row.full_saving > 0
    assert run_case(Case("test", "mlp", 1024, 2, 4)).full_cost is None


def test_topology_and_ties_matter_on_several_nodes():
    """The experiment measures something: on two nodes the topology-aware result is faster than
    every volume-optimal tie, and the ties differ."""
    faster = run_case(Case("test", "mlp", 1024, 2, 4))
    assert faster.cost_ratio < 0.9
    assert faster.volume_ratio > 1.1
    ties = run_case(Case("test", "mlp", 1024, 2, 2))
    assert ties.volume_cost_worst_tie > 1.1 * ties.volume_cost_best_tie


def test_costs_are_deterministic():
    case = Case("test", "alexnet", 16, 2, 2)
    first, second = run_case(case), run_case(case)
    assert [getattr(first, c) for c in COSTS] == [getattr(second, c) for c in COSTS]


def test_default_batches():
    assert taps.models.default_batch("alexnet") == taps.models.alexnet().tensors["images"].shape[0]
    assert taps.models.default_batch("megatron-1.7B") == 512
    assert taps.models.default_batch("megatron-1T") == 3072
    with pytest.raises(taps.GraphError):
        taps.models.default_batch("resnet")


def test_quick_command_writes_every_file(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--out", str(out)]) == 0
    assert "AlexNet on 2 x 8" in capsys.readouterr().out
    for name in FILES:
        assert (out / name).stat().st_size > 0, name
    for name in ("comparison.png", "ratio.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG"), name
    with (out / "results.csv").open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    cases = experiment_cases(quick=True)
    assert [(r["sweep"], r["model"], int(r["nodes"])) for r in rows] == [
        (c.sweep, c.model, c.nodes) for c in cases
    ]
    for r in rows:
        assert _at_most(float(r["cost_ratio"]), 1.0)
        assert _at_most(float(r["volume_cost_best_tie"]), float(r["volume_cost_returned"]))
        assert _at_most(float(r["volume_cost_returned"]), float(r["volume_cost_worst_tie"]))
        if r["nodes"] == "1":
            assert float(r["cost_ratio"]) == pytest.approx(1.0, rel=TOLERANCE)
    report = (out / "report.md").read_text(encoding="utf-8")
    for needle in (
        "## Headline",
        "## Comparison",
        "## Ratios",
        "## The full model",
        "## Search time",
        "< 100",
    ):
        assert needle in report


def test_quick_mode_is_small():
    for case in experiment_cases(quick=True):
        assert case.nodes * case.devices_per_node <= 16
    assert len(experiment_cases(quick=True)) < len(experiment_cases()) / 5


def test_unwritable_output_is_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["reproduce", "--quick", "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("taps reproduce: error: cannot create output directory")
    assert err.count("\n") == 1


def test_output_directory_that_is_a_file_is_named_so(tmp_path, capsys):
    # It said "File exists", as if the directory were the trouble.
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["reproduce", "--quick", "--out", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"taps reproduce: error: output directory {str(blocker)!r} is a file, not a directory\n"
    )
    assert blocker.read_text() == ""
