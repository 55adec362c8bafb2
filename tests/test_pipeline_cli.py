"""``taps search --pipeline``: the stages table, the saved plan read back, the figure, and bad
input refused in one line (exit 2)."""

from __future__ import annotations

import json

import pytest

import taps
from taps.cli import main


def _taps(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_pipeline_search_prints_saves_and_draws(tmp_path, capsys):
    saved, figure, record = tmp_path / "p.json", tmp_path / "p.png", tmp_path / "r.json"
    code, out, _ = _taps(
        capsys,
        "search", "mlp", "--nodes", "2", "--devices-per-node", "4", "--pipeline",
        "--stages", "2", "--schedule", "1f1b", "--microbatches", "8",
        "--save", str(saved), "--plot", str(figure), "--json", str(record),
    )  # fmt: skip
    assert code == 0
    assert "stage" in out and "1f1b, 8 microbatches; step time" in out
    plan = taps.Plan.load(saved)
    assert [s.index for s in plan.stages] == [0, 1]
    assert plan.pipeline.microbatches == 8 and plan.pipeline.schedule == "1f1b"
    assert figure.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(record.read_text())
    assert data["pipeline"]["stages"] == 2 and len(data["stages"]) == 2
    # The saved plan is reported as it is, with the same step time.
    code, again, _ = _taps(capsys, "search", str(saved))
    assert code == 0
    step = next(line for line in out.splitlines() if "step time" in line)
    assert step.strip() in again


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stages", "2"], "need --pipeline"),
        (["--pipeline", "--stages", "3"], "power of two"),
        (["--pipeline", "--microbatches", "0"], "must be positive"),
        (["--pipeline", "--cost-model", "volume"], "leave out --cost-model"),
    ],
)
def test_bad_pipeline_flags_are_one_line(capsys, argv, message):
    code, _, err = _taps(capsys, "search", "mlp", "--nodes", "1", "--devices-per-node", "4", *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1
