"""``taps verify``, ``taps plan --verify`` and ``taps search --export`` end to end."""

from __future__ import annotations

import dataclasses
import json

import taps
from taps.cli import main
from taps.verify.xla.devices import jax_with_devices

jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs


def _mlp(tmp_path):
    path = tmp_path / "mlp.json"
    path.write_text(taps.models.mlp(batch=64, sizes=(32, 64, 64, 32)).to_json())
    return str(path)


def test_verify_a_model(tmp_path, capsys):
    out = tmp_path / "v.json"
    argv = ["verify", _mlp(tmp_path), "--nodes", "2", "--devices-per-node", "8"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and doc["num_devices"] == 16
    assert all(
        c["predicted_bytes"] == c["measured_bytes"]
        for c in doc["collectives"]
        if c["status"] == "ok"
    )
    assert "OK" in capsys.readouterr().out


def test_verify_exits_1_on_a_mismatch(tmp_path, capsys, monkeypatch):
    """Predictions off by a factor of two: every collective differs, the exit code is 1."""
    from taps.verify.xla.program import GraphProgram

    real = GraphProgram.predicted

    def doubled(self):
        return [dataclasses.replace(p, bytes=2 * p.bytes) for p in real(self)]

    monkeypatch.setattr(GraphProgram, "predicted", doubled)
    out = tmp_path / "v.json"
    argv = ["verify", _mlp(tmp_path), "--nodes", "2", "--devices-per-node", "8"]
    assert main([*argv, "--json", str(out)]) == 1
    assert "differs: forward" in capsys.readouterr().out
    assert json.loads(out.read_text())["ok"] is False


def test_plan_verify(capsys):
    argv = ["plan", "--from", "[2,8]:[1,0]", "--to", "[8,2]:[1,0]", "--shape", "64,64"]
    assert main([*argv, "--nodes", "2", "--devices-per-node", "8", "--verify"]) == 0
    assert "OK" in capsys.readouterr().out


def test_plan_verify_runs_the_plan_it_prints(capsys):
    """The optimal planner's collective_permute is what runs, not Algorithm 1's plan."""
    argv = ["plan", "--from", "[16,2]:[1,0,-1]", "--to", "[16,2]:[0,1,-1]", "--shape", "96,32,96"]
    assert (
        main([*argv, "--nodes", "4", "--devices-per-node", "8", "--planner", "optimal", "--verify"])
        == 0
    )
    out = capsys.readouterr().out
    assert "optimal planner, verified on XLA" in out
    assert "Algorithm 1" not in out and "collective_permute" in out


def test_search_export(tmp_path):
    path = tmp_path / "plan.json"
    argv = ["search", "mlp", "--batch", "64", "--nodes", "2", "--devices-per-node", "4"]
    assert main([*argv, "--export", "jax", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["format"] == "taps.export.jax" and "fc1.weight" in doc["tensors"]
    assert main([*argv, "--export", "dtensor", str(path)]) == 0
    assert json.loads(path.read_text())["format"] == "taps.export.dtensor"


def test_search_export_bad_framework(tmp_path, capsys):
    path = tmp_path / "plan.json"
    argv = ["search", "mlp", "--nodes", "1", "--devices-per-node", "4"]
    assert main([*argv, "--export", "flax", str(path)]) == 2
    assert "unknown framework 'flax'" in capsys.readouterr().err
    assert not path.exists()


def test_verify_searches_under_a_memory_limit_with_sharded_storage(tmp_path, capsys):
    """``--fsdp --memory``: the plan searched under the limit stores a parameter sharded, and its
    gathers and reduce_scatter are verified with everything else."""
    out = tmp_path / "v.json"
    argv = ["verify", _mlp(tmp_path), "--nodes", "2", "--devices-per-node", "8"]
    assert main([*argv, "--fsdp", "--memory", "13.8kB", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    fsdp = [
        c for c in doc["collectives"] if c["what"].startswith(("forward gather", "backward gather"))
    ]
    assert doc["ok"] is True and len(fsdp) == 2
    assert all(c["status"] == "ok" for c in doc["collectives"])
