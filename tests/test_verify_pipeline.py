"""A pipelined plan run on gloo (2 stages x 2 ranks, 1F1B): the loss and the gradients against the
dense module, the bytes between stages against taps' prediction and against the closed form of
the activation that crosses; wrong input is one line."""

from __future__ import annotations

import pytest
import torch

import taps
from pipelined import pipelined
from taps.cli import main
from taps.errors import VerifyError
from taps.verify.result import DIFFERS, OK
from taps.verify.torch.pipeline import _send_rows, predicted_sends, verify_pipeline

BATCH, WIDTH, HIDDEN = 8, 32, 64


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    )
    return module, torch.randn(BATCH, WIDTH)


def test_searched_plan_of_two_stages_of_two_ranks_on_gloo():
    module, x = _mlp()
    graph = taps.from_torch(module, x)
    ask = taps.Pipeline(stages=2, microbatches=2, schedule="1f1b", replicas=1)
    plan = taps.search(graph, taps.Cluster(1, 4), pipeline=ask).plan
    assert [s.devices for s in plan.stages] == [2, 2]
    result = verify_pipeline(module, [x], plan)
    assert result.ok, result.mismatches
    names = {f"grad {n}" for n, _ in module.named_parameters()}
    assert set(result.errors) == names | {"loss"}
    # Whatever the cut, one [BATCH, HIDDEN] activation crosses, float32, in 2 microbatches; each
    # of the 2 receiving ranks gets half of it per microbatch, the same back for its gradient.
    per_device = BATCH * HIDDEN * 4 // 2
    rows = [(r.phase, r.status, r.predicted_bytes, r.measured_bytes) for r in result.collectives]
    assert rows == [
        ("forward", OK, per_device, per_device),
        ("backward", OK, per_device, per_device),
    ]


def test_rows_tell_a_wrong_count():
    module, x = _mlp()
    graph = taps.from_torch(module, x)
    plan = pipelined(graph, taps.Cluster(1, 4), ["2"])
    assert predicted_sends(plan) == [BATCH * HIDDEN * 4]
    sent = {"forward": {"0": 1024}, "backward": {"1": 2048}, "unpriced": {"0": 64}}
    measured = [{"stages": [0], "sent": sent}, {"stages": [1], "sent": sent}]
    rows = _send_rows(plan, measured)
    assert [(r.phase, r.status) for r in rows] == [
        ("forward", OK),
        ("backward", DIFFERS),
        ("forward", "unpriced"),
    ]


def test_wrong_input_is_one_line(capsys):
    module, x = _mlp()
    graph = taps.from_torch(module, x)
    plain = taps.search(graph, taps.Cluster(1, 4)).plan
    with pytest.raises(VerifyError, match="no pipeline stages"):
        verify_pipeline(module, [x], plain)
    big = pipelined(graph, taps.Cluster(2, 8), ["2"])
    with pytest.raises(VerifyError, match="at most 8"):
        verify_pipeline(module, [x], big)
    assert main(["verify", "mlp", "--pipeline"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--engine torch" in err
