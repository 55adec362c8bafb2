"""The figure of a plan: its size, what it draws, and ``taps search --plot``."""

from __future__ import annotations

import math

import pytest
from matplotlib.image import imread

import taps
from taps.cli import main
from taps.report.plot import cost_split, figure_size, plan_figure, plot_plan


@pytest.fixture(scope="module")
def result() -> taps.SearchResult:
    return taps.search(taps.models.alexnet(), taps.Cluster(2, 8))


def test_png_has_the_documented_size_and_is_not_blank(result, tmp_path):
    path = tmp_path / "plan.png"
    plot_plan(result, path)
    image = imread(path)
    width, height = figure_size(len(result.plan.graph.ops))
    assert image.shape[:2] == (height, width)
    assert image.std() > 0.05  # something is drawn


def test_one_row_per_operator_one_segment_per_split(result):
    strategies, costs = plan_figure(result).axes[:2]
    names = [t.get_text() for t in strategies.get_yticklabels()]
    assert names == [row.name for row in result.breakdown]
    # A segment per split axis, each as wide as log2 of its degree: every row fills log2 N.
    splits = [d for row in result.breakdown for d in row.strategy.degrees if d > 1]
    segments = strategies.patches
    assert len(segments) == len(splits)
    assert sorted(p.get_width() for p in segments) == sorted(math.log2(d) for d in splits)
    labels = {t.get_text() for t in strategies.texts}
    for row in result.breakdown:
        op = result.plan.graph.op(row.name)
        for axis, d in zip(op.partitionable, row.strategy.degrees):
            if d > 1:
                assert f"{axis}\u00d7{d}" in labels
    # Three stacked bars per operator: the ends of the last ones are the operator totals (ms).
    ends = [p.get_x() + p.get_width() for p in costs.patches[-len(result.breakdown) :]]
    assert ends == pytest.approx([row.communication * 1e3 for row in result.breakdown])


def test_cost_split_adds_up_and_separates_nodes(result):
    split = cost_split(result)
    for (inside, across, redistribution), row in zip(split, result.breakdown):
        assert inside + across == pytest.approx(row.intra_cost)
        assert redistribution == row.incoming_cost
    # On one node nothing crosses a node boundary.
    single = taps.search(taps.models.alexnet(), taps.Cluster(1, 8))
    assert all(across == 0 for _, across, _ in cost_split(single))
    assert any(across > 0 for _, across, _ in split)


def test_search_plot_writes_the_png(tmp_path, capsys):
    path = tmp_path / "plan.png"
    argv = ["search", "mlp", "--nodes", "1", "--devices-per-node", "4", "--plot", str(path)]
    assert main(argv) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    assert imread(path).shape[:2] == figure_size(len(taps.models.mlp().ops))[::-1]
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]  # no temporary left behind


@pytest.mark.parametrize("name", ["plan.txt", "plan"])
def test_a_figure_file_of_no_format_is_refused_before_the_search(tmp_path, capsys, name):
    path = tmp_path / name
    argv = ["search", "mlp", "--nodes", "1", "--devices-per-node", "4", "--plot", str(path)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "a figure's file must end in a format matplotlib writes" in captured.err
    assert list(tmp_path.iterdir()) == []


def test_names_with_dollars_are_drawn_as_written(tmp_path):
    # matplotlib reads "$...$" as TeX and fails on most such names ("$x_$" is no formula).
    graph = taps.Graph(name="costs $x_$")
    graph.gelu("act$_$", graph.linear("lin$_", graph.input("x$", (8, 16)), 32))
    result = taps.search(graph, taps.Cluster(1, 4))
    path = tmp_path / "plan.svg"
    plot_plan(result, path)
    assert "lin$_" in path.read_text()
