"""``taps import`` and ``taps search --torch``, in process."""

from __future__ import annotations

import json
import sys

import torch

import taps
from taps.cli import main
from taps.frontends import from_torch
from torch_factories import mlp


def test_import_writes_the_graph_of_a_factory(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    assert main(["import", "torch_factories:mlp", str(out)]) == 0
    assert taps.Graph.from_json(out.read_text()) == from_torch(*_pair(), name="mlp")
    assert "3 operators" in capsys.readouterr().out


def _pair():
    module, x = mlp()
    return module, x


def test_import_reads_a_saved_export(tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
    archive, out = tmp_path / "net.pt2", tmp_path / "net.json"
    torch.export.save(torch.export.export(module, (torch.randn(4, 8),)), str(archive))
    assert main(["import", str(archive), str(out)]) == 0
    assert [op.kind for op in taps.Graph.from_json(out.read_text()).ops] == ["linear", "relu"]


def test_import_errors_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "x.json"
    (tmp_path / "broken_module.py").write_text("def f(:\n", encoding="utf-8")
    (tmp_path / "exiting_module.py").write_text("import sys\nsys.exit(4)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for source, message in [
        ("no_such_module:f", "cannot import 'no_such_module'"),
        ("torch_factories:missing", "has no 'missing'"),
        ("torch_factories:not_a_pair", "must return (module, inputs)"),
        ("torch_factories", "is not package.module:factory"),
        # The user's code failing is theirs: one line, what it raised (not "a bug in taps").
        (
            "torch_factories:raises",
            "the factory torch_factories:raises raised ValueError: the config has no field",
        ),
        ("torch_factories:CONSTANT", "torch_factories:CONSTANT is not callable"),
        ("broken_module:f", "importing 'broken_module' raised SyntaxError"),
        # An exit in the user's code ends the conversion, not taps (it was exit 0, silent).
        ("exiting_module:f", "importing 'exiting_module' raised SystemExit: 4"),
        ("torch_factories:exits", "the factory torch_factories:exits raised SystemExit: 0"),
    ]:
        assert main(["import", source, str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not out.exists()


def test_search_takes_a_torch_factory(capsys, tmp_path):
    result = tmp_path / "r.json"
    code = main(
        ["search", "--torch", "torch_factories:mlp", "--nodes", "1", "--devices-per-node", "8",
         "--json", str(result)]
    )  # fmt: skip
    assert code == 0
    assert "mlp: topology search on 1 x 8 devices" in capsys.readouterr().out
    ops = {row["name"] for row in json.loads(result.read_text())["topology"]["operators"]}
    assert ops == {"0", "1", "2"}  # the Sequential's children
    assert main(["search", "mlp", "--torch", "torch_factories:mlp", "--nodes", "1",
                 "--devices-per-node", "8"]) == 2  # fmt: skip


def test_a_factory_beside_the_user_is_found_without_pythonpath(tmp_path, monkeypatch):
    # `taps search --torch mine:build` run in the directory that holds mine.py, as `python -m`
    # would find it; the directory goes last on the path (mine.py never shadows a package).
    (tmp_path / "mine_beside.py").write_text(
        "from torch_factories import mlp as build\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", str(tmp_path))])
    out = tmp_path / "g.json"
    assert main(["import", "mine_beside:build", str(out)]) == 0
    assert [op.name for op in taps.Graph.from_json(out.read_text()).ops] == ["0", "1", "2"]
    assert sys.path[-1] == str(tmp_path)
