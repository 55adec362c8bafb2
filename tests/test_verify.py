"""taps.verify on XLA with simulated CPU devices: random redistributions and whole plans run as
taps plans them, every compiled collective matched with the prediction, results exact (data
movement) or equal to the unsharded run (arithmetic)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from strategies_gen import layout_pairs, to_layout
from taps.verify import compare_gspmd, verify, verify_redistribution, verify_redistributions
from taps.verify.result import OK, SHARED, UNPRICED
from taps.verify.xla.devices import jax_with_devices
from taps.verify.xla.replay import _in_fresh_process

jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs


def _check(results, pairs):
    for r, (a, b) in zip(results, pairs):
        assert r.ok, (a, b, r.mismatches)
        assert r.max_error == 0.0
        plan = taps.plan_redistribution(a, b)
        moved = [op for op in plan.all_ops if op.kind != "slice"]
        assert len(r.collectives) == len(moved)
        assert all(c.predicted_bytes == c.measured_bytes for c in r.collectives)


def _moves_data(spec) -> bool:
    """A pair whose plan communicates (identity and slice-only plans prove little here)."""
    plan = taps.plan_redistribution(to_layout(spec[0]), to_layout(spec[1]))
    return any(op.kind != "slice" for op in plan.all_ops)


@settings(max_examples=2)
@given(st.lists(layout_pairs(log2=3).filter(_moves_data), min_size=50, max_size=50))
def test_random_redistributions_on_8_devices(specs):
    """100 random redistributions that communicate (reshapes and fallbacks included), in two
    compiled programs."""
    pairs = [(to_layout(a), to_layout(b)) for a, b in specs]
    _check(verify_redistributions(pairs, devices_per_node=4), pairs)


@settings(max_examples=2)
@given(st.lists(layout_pairs(log2=4).filter(_moves_data), min_size=50, max_size=50))
def test_random_redistributions_on_16_devices(specs):
    pairs = [(to_layout(a), to_layout(b)) for a, b in specs]
    _check(verify_redistributions(pairs, devices_per_node=8), pairs)


def test_optimal_plans_on_16_devices():
    """The optimal planner's plans run on XLA as planned: a collective_permute (a 4 x 4 mesh
    swapping its dims; a replicated dim sliced along the device dim the target uses for the
    other, then a collective_permute, issue 23's case), plans between canonical forms (one
    distribution written two ways), and the plan's collectives compile as predicted, bytes
    included."""
    pairs = [
        (taps.Layout([16, 16], [4, 4], [1, 0]), taps.Layout([16, 16], [4, 4], [0, 1])),
        (
            taps.Layout([64, 4, 8, 16], [4, 4], [-1, 1, 0, -1]),
            taps.Layout([64, 32, 16], [16], [0, -1, -1]),
        ),
        (taps.Layout([16, 48], [8, 2], [0, -1]), taps.Layout([16, 48], [16], [0, -1])),
        (taps.Layout([256, 1024], [4, 4], [0, -1]), taps.Layout([256, 1024], [4, 4], [1, 0])),
    ]
    plans = [taps.plan_redistribution(a, b, planner="optimal") for a, b in pairs]
    assert [op.kind for op in plans[0].all_ops] == ["collective_permute"]
    assert [op.kind for op in plans[3].all_ops] == ["slice", "collective_permute"]
    assert plans[3].volume == 16_384
    results = verify_redistributions(pairs, devices_per_node=8, planner="optimal")
    for r, plan, (a, b) in zip(results, plans, pairs):
        assert r.ok, (a, b, r.mismatches)
        assert r.max_error == 0.0
        moved = [op for op in plan.all_ops if op.kind != "slice"]
        assert len(r.collectives) == len(moved)
        assert all(c.predicted_bytes == c.measured_bytes for c in r.collectives)


def test_one_redistribution_and_its_json():
    a = taps.Layout([16, 16], [2, 8], [1, 0])
    b = taps.Layout([16, 16], [8, 2], [0, 1])
    r = verify_redistribution(a, b, devices_per_node=8)
    assert r.ok
    doc = json.loads(r.to_json())
    assert doc["ok"] is True and doc["max_error"] == 0.0
    assert {c["kind"] for c in doc["collectives"]} <= {"all_gather", "all_to_all"}
    assert sum(c["measured_bytes"] for c in doc["collectives"]) == round(
        taps.plan_redistribution(a, b).cost(taps.Cluster(2, 8), 4, "volume")
    )


def test_a_wrong_prediction_is_caught(monkeypatch):
    """The check can fail: predictions with the wrong bytes are flagged."""
    import taps.verify.xla.replay as replay

    real = replay.predicted_steps

    def doubled(*args):
        return [
            p.__class__(p.kind, p.groups, 2 * p.bytes, p.scope, p.phase, p.what)
            for p in real(*args)
        ]

    monkeypatch.setattr(replay, "predicted_steps", doubled)
    r = verify_redistribution(taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0]))
    assert not r.ok
    assert r.mismatches and r.mismatches[0].startswith("differs: forward all_to_all")


FORWARD = taps.Pricing(step="forward")


def test_mlp_plan_verifies_on_16_devices():
    """The paper's model (``step="forward"``): JAX's own backward pass, its redistributions
    unpriced."""
    g = taps.models.mlp(batch=64, sizes=(32, 64, 64, 32))
    r = verify(taps.search(g, taps.Cluster(2, 8), FORWARD).plan)
    assert r.ok, r.mismatches
    assert any(c.status == UNPRICED for c in r.collectives)
    assert r.max_error < 1e-5
    statuses = {c.status for c in r.collectives}
    assert statuses <= {OK, UNPRICED}
    # Every gradient all_reduce of taps' node costs compiled as predicted.
    grads = [c for c in r.collectives if c.what.startswith("gradient")]
    assert grads and all(c.status == OK for c in grads)


def test_gpt_layer_verifies_on_16_devices():
    g = taps.models.gpt(hidden=64, heads=4, seq=16, batch=8)
    cluster = taps.Cluster(2, 8)
    r = taps.verify(taps.search(g, cluster, FORWARD).plan)
    assert r.ok, r.mismatches
    assert {c.status for c in r.collectives} == {OK, UNPRICED, SHARED}
    assert sum(c.status == OK for c in r.collectives) > 20


@settings(max_examples=3)
@given(st.data())
def test_random_strategies_of_an_mlp_verify(data):
    """Not only the search's choice: any assignment runs as taps prices it."""
    g = taps.models.mlp(batch=32, sizes=(16, 32, 16))
    cluster = taps.Cluster(2, 4)
    strategies = {
        op.name: data.draw(st.sampled_from(taps.strategies_for(g, op.name, cluster)))
        for op in g.ops
    }
    r = verify(taps.Plan(g, cluster, strategies, FORWARD))
    assert r.ok, (strategies, r.mismatches)


def test_bias_gradient_is_priced_over_too_many_devices():
    """A finding, kept as a test: taps prices a bias gradient as partial over every split axis the
    bias lacks, but the bias is added after the forward partial sums, so its gradient is partial
    over the batch axes only. XLA's all_reduce is smaller than taps' prediction in the paper's
    model; the training step prices it right."""
    g = taps.Graph("bias")
    g.linear("fc1", g.input("x", (32, 16)), 32, bias=True)
    cluster, s = taps.Cluster(1, 8), {"fc1": taps.Strategy([2, 2, 2], [2, 1, 0])}
    for step, status, predicted in (("forward", "differs", 96), ("training", "ok", 64)):
        r = verify(taps.Plan(g, cluster, s, taps.Pricing(step=step)))
        bias = [c for c in r.collectives if c.what == "gradient of fc1.bias"]
        assert [(c.status, c.predicted_bytes, c.measured_bytes) for c in bias] == [
            (status, predicted, 64)
        ]
        assert r.max_error < 1e-5


def test_a_process_whose_jax_has_too_few_devices_verifies_in_a_fresh_one():
    """JAX started with 2 devices; an 8-device plan is verified by a child process, which gets
    the whole cluster (a preset's latencies, by which the optimal planner plans)."""
    script = """
import jax, taps
from taps.verify import verify
assert jax.device_count() == 2
g = taps.models.mlp(batch=64, sizes=(32, 64, 32))
r = verify(taps.search(g, taps.Cluster.preset("dgx-h100"), taps.Pricing(planner="optimal")).plan)
print(r.ok, r.num_devices, len(r.collectives))
"""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    ok, devices, count = done.stdout.split()
    assert (ok, devices) == ("True", "8") and int(count) > 0


def test_a_fresh_process_says_why_it_failed():
    """The child's error comes back as the parent's one-line VerifyError."""
    g = taps.models.mlp(batch=16, sizes=(8, 8))
    plan = taps.search(g, taps.Cluster(1, 4)).plan
    with pytest.raises(taps.VerifyError, match="unknown dtype 'int8'"):
        _in_fresh_process(plan, "int8", 0)


@pytest.mark.parametrize("who", [verify, taps.verify, compare_gspmd])
def test_anything_but_a_plan_is_a_type_error(who):
    """A search result (not its ``.plan``), or a graph, is refused in one line."""
    g = taps.models.mlp(batch=16, sizes=(8, 8))
    found = taps.search(g, taps.Cluster(1, 4))
    for wrong in (found, g):
        with pytest.raises(TypeError, match=r"takes a taps\.Plan .*, got") as e:
            who(wrong)
        assert "\n" not in str(e.value)


def test_operators_the_model_runs_twice_on_one_value_are_one_value():
    """``values``: two operators of one kind, axes and operands (T5's position bias masked
    again by every layer) are one value, whose equal redistributions XLA computes once
    (``shared``; the whole T5 in tests/test_verify_models.py); any difference in kind or
    operand, or an operand that is itself another value, keeps them apart."""
    import torch

    from taps.frontends import from_torch
    from taps.verify.prediction import values

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            first, again, other = torch.relu(x), torch.relu(x), torch.tanh(x)
            return self.a(first) + self.b(again) + self.a(other) + self.b(torch.relu(other))

    g = from_torch(Twice(), torch.randn(8, 16))
    value = values(g)
    by_kind: dict[str, list[str]] = {}
    for op in g.ops:
        by_kind.setdefault(op.kind, []).append(op.name)
    relu_x, relu_x_again, relu_other = by_kind["relu"]
    assert value[relu_x] == value[relu_x_again] != value[relu_other]
    assert len({value[n] for n in by_kind["linear"]}) == 4  # other weights or other inputs


def test_values_of_a_deep_residual_stream_are_small_keys():
    """A residual stream reaches each layer's output by two paths: as nested tuples its value
    doubled at every layer, and hashing the prediction's keys of a 12-layer ViT never ended.
    Each value is a number; 48 residual layers give 48 distinct adds."""
    import torch

    from taps.frontends import from_torch
    from taps.verify.prediction import values

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.linear(x))

    g = from_torch(torch.nn.Sequential(*(Residual() for _ in range(48))), torch.randn(4, 8))
    value = values(g)
    assert all(isinstance(v, int) for v in value.values())
    adds = [value[op.name] for op in g.ops if op.kind == "add"]
    assert len(adds) == len(set(adds)) == 48
