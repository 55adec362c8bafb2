"""The command line: output of ``taps redistribute`` and ``taps search``, and one-line errors."""

from __future__ import annotations

import json

import pytest

import taps
from taps.cli import main

PLAN = [
    "plan",
    "--from",
    "[2,8]:[1,0]",
    "--to",
    "[8,2]:[1,0]",
    "--shape",
    "1024,1024",
    "--nodes",
    "2",
    "--devices-per-node",
    "8",
]


def test_plan_prints_unified_layouts_and_ops(capsys):
    assert main([*PLAN, "--planner", "paper"]) == 0
    out = capsys.readouterr().out
    assert "device matrix [2, 4, 2]  map [2, -1, 1, 0]" in out
    assert "device matrix [2, 4, 2]  map [2, 1, 0, -1]" in out
    plan = taps.plan_redistribution(
        taps.Layout([1024, 1024], [2, 8], [1, 0]), taps.Layout([1024, 1024], [8, 2], [1, 0])
    )
    assert out.count("all_to_all") == len(plan.ops)
    assert f"{plan.volume:,} elements per device" in out


def test_plan_prints_both_planners(capsys):
    argv = [
        "redistribute",
        "--from",
        "[16,2]:[1,0,-1]",
        "--to",
        "[16,2]:[0,1,-1]",
        "--shape",
        "96,32,96",
    ]
    assert main([*argv, "--nodes", "4", "--devices-per-node", "8"]) == 0
    out = capsys.readouterr().out
    a = taps.Layout([96, 32, 96], [16, 2], [1, 0, -1])
    b = taps.Layout([96, 32, 96], [16, 2], [0, 1, -1])
    cluster = taps.Cluster(4, 8)
    paper = taps.plan_redistribution(a, b, cluster, "paper")
    best = taps.plan_redistribution(a, b, cluster, "optimal")
    assert "Algorithm 1" in out and "optimal planner" in out and "collective_permute" in out
    assert f"{paper.volume:,} elements per device" in out
    assert f"{best.volume:,} elements per device" in out
    saving = 100 * (1 - best.cost(cluster) / paper.cost(cluster))
    assert f"optimal planner: {saving:.1f}% less time than Algorithm 1" in out


def test_cluster_presets_on_the_command_line(capsys, tmp_path):
    argv = ["redistribute", "--from", "[2,8]:[1,0]", "--to", "[8,2]:[1,0]", "--shape", "64,64"]
    assert main([*argv, "--nodes", "2", "--cluster", "dgx-h100", "--planner", "paper"]) == 0
    h100 = capsys.readouterr().out
    assert main([*argv, "--nodes", "2", "--devices-per-node", "8", "--planner", "paper"]) == 0
    v100 = capsys.readouterr().out
    assert h100 != v100  # other bandwidths and latencies
    assert main([*argv, "--nodes", "2", "--cluster", "dgx-h100", "--devices-per-node", "8"]) == 2
    assert "--cluster gives the devices" in capsys.readouterr().err
    assert main([*argv, "--nodes", "2"]) == 2
    assert "--devices-per-node is required" in capsys.readouterr().err
    assert main([*argv, "--nodes", "2", "--cluster", "no-such-preset"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cluster_options_build_the_cluster_a_library_user_gets():
    from taps.cli.args import cluster
    from taps.cli.parser import build_parser

    def built(*options: str) -> taps.Cluster:
        return cluster(build_parser().parse_args(["search", "mlp", *options]))

    assert built("--nodes", "2", "--devices-per-node", "8") == taps.Cluster(2, 8)
    h100 = built("--nodes", "2", "--devices-per-node", "8", "--device", "h100")
    assert h100 == taps.Cluster.preset("dgx-h100", 2)
    paper = built(
        "--nodes",
        "2",
        "--devices-per-node",
        "8",
        "--replicas",
        "shared",
        "--intra-latency",
        "0",
        "--inter-latency",
        "0",
    )
    assert paper == taps.Cluster(2, 8, replicas="shared", intra_latency=0.0, inter_latency=0.0)
    shared = built("--nodes", "2", "--cluster", "dgx-h100", "--replicas", "shared")
    assert (shared.replicas, shared.levels) == ("shared", h100.levels)
    assert shared.device == h100.device
    with pytest.raises(taps.TapsError, match="leave out --device"):
        built("--nodes", "2", "--cluster", "dgx-h100", "--device", "a100")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "plan",
                "--from",
                "[2,8",
                "--to",
                "[8,2]:[1,0]",
                "--shape",
                "8,8",
                "--nodes",
                "2",
                "--devices-per-node",
                "8",
            ],
            "is not DEVICE_MATRIX:TENSOR_MAP",
        ),
        (PLAN[:-1], "expected one argument"),
        (
            [*PLAN[:2], "[3,8]:[1,0]", *PLAN[3:]],
            "not a positive power of two",
        ),
        (["search", "resnet", "--nodes", "1", "--devices-per-node", "2"], "unknown model"),
        (["search", "mlp", "--nodes", "3", "--devices-per-node", "8"], "power of two"),
        (
            ["search", "mlp", "--nodes", "1", "--devices-per-node", "2", "--memory", "1KB"],
            "smallest needs",
        ),
        (
            ["search", "mlp", "--nodes", "1", "--devices-per-node", "2", "--memory", "lots"],
            "not a memory size",
        ),
        (
            ["search", "missing.json", "--nodes", "1", "--devices-per-node", "2"],
            "cannot read",
        ),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        code = main(argv)
        raise SystemExit(code)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_search_table_and_json(tmp_path, capsys):
    path = tmp_path / "graph.json"
    graph = taps.models.mlp(batch=64, sizes=(64, 256, 64))
    path.write_text(graph.to_json())
    out_json = tmp_path / "result.json"
    argv = [
        "search",
        str(path),
        "--nodes",
        "2",
        "--devices-per-node",
        "4",
        "--cost-model",
        "both",
        "--collectives",
        "--json",
        str(out_json),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for op in graph.ops:
        assert op.name in out
    assert "saving" in out and "Collectives" in out
    data = json.loads(out_json.read_text())
    cluster = taps.Cluster(2, 4)
    topo = taps.search(graph, cluster)
    assert data["topology"]["cost"] == pytest.approx(topo.cost)
    assert [o["name"] for o in data["topology"]["operators"]] == [op.name for op in graph.ops]
    assert data["comparison"]["saving_percent"] >= -1e-7


def test_builtin_model_with_batch(capsys):
    assert (
        main(
            [
                "search",
                "alexnet",
                "--batch",
                "16",
                "--nodes",
                "1",
                "--devices-per-node",
                "2",
                "--cost-model",
                "volume",
            ]
        )
        == 0
    )
    assert "alexnet(batch=16)" in capsys.readouterr().out


def test_an_argument_holding_a_line_break_is_still_one_line(capsys):
    """Found by the fuzz test: argparse quotes an unrecognised argument as it is."""
    with pytest.raises(SystemExit) as e:
        main(["search", "mlp", "\n"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err == "taps: error: unrecognized arguments: \\n\n"


def test_names_are_printed_as_text_not_markup(tmp_path, capsys):
    """Operator and tensor names, and file names, are whatever the model says: "[/]" would end
    rich's markup and "[b]" start a style."""
    g = taps.Graph("[i]net")
    x = g.input("x", (8, 16))
    h = g.relu("[/]", x)
    g.relu("[b]act", h)
    path = tmp_path / "[red]g.json"
    path.write_text(g.to_json(), encoding="utf-8")
    argv = ["search", str(path), "--nodes", "1", "--devices-per-node", "2", "--collectives"]
    assert main([*argv, "--json", str(tmp_path / "[b].json")]) == 0
    out = capsys.readouterr().out
    for text in ("[i]net", "│ [/] ", "│ [b]act ", "[b].json"):
        assert text in out


def test_axis_and_graph_names_are_text_in_every_table(tmp_path, capsys):
    """An axis named "[/]" ended in an internal error (MarkupError) in the strategy column, as a
    graph named so did in the pipeline's stages table; an escape sequence in a name reached the
    terminal as it was (here: clearing the screen)."""
    doc = taps.models.mlp(8, (8, 16, 8)).to_json().replace('"out"', '"[/]"')
    doc = doc.replace('"fc2"', '"\\u001b[2Jfc2"').replace('"mlp(', '"[/]mlp(')
    path = tmp_path / "g.json"
    path.write_text(doc, encoding="utf-8")
    argv = ["search", str(path), "--nodes", "2", "--devices-per-node", "2", "--memory", "1MB"]
    assert main([*argv, "--collectives"]) == 0
    out = capsys.readouterr().out
    assert "[/]=" in out and "│ \\x1b[2Jfc2 " in out and "\x1b" not in out
    assert main([*argv, "--pipeline"]) == 0
    assert capsys.readouterr().out.startswith("[/]mlp(")
