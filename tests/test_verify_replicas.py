"""Replicated strategies run on XLA (simulated CPU devices): every collective taps predicts for
them is compiled, with its group and bytes, and the results equal the unsharded run. This is the
check that the replicas of an operator reduce on their own (no gradient all_reduce over the
replica dims)."""

from __future__ import annotations

import pytest

import taps
from taps.verify import verify
from taps.verify.xla.devices import jax_with_devices
from test_replicas import _with_scalar_loss, megatron_mlp

jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs

CLUSTER = taps.Cluster(2, 4)

PLANS = {
    # Megatron's column-parallel fc1, replicated GELU, row-parallel fc2.
    "replicated gelu": {
        "fc1": taps.Strategy([1, 1, 1, 8], [-1, -1, -1, 0]),
        "gelu": taps.Strategy([1, 1, 1], [-1, -1, -1], [8]),
        "fc2": taps.Strategy([1, 1, 8, 1], [-1, -1, 0, -1]),
    },
    # fc2 row-parallel over 4 devices, 2 replicas inside each node: its forward all_reduce runs
    # inside each replica.
    "row-parallel fc2 on half the devices": {
        "fc1": taps.Strategy([1, 1, 1, 8], [-1, -1, -1, 0]),
        "gelu": taps.Strategy([1, 1, 8], [-1, -1, 0]),
        "fc2": taps.Strategy([1, 1, 4, 1], [-1, -1, 1, -1], [4, 2]),
    },
    # fc1 split over batch and columns on 4 devices, the replica dim between them: dW1 is
    # reduced over the batch dim only.
    "replica dim between the split dims": {
        "fc1": taps.Strategy([2, 1, 1, 2], [2, -1, -1, 0], [2, 2, 2]),
        "gelu": taps.Strategy([1, 1, 8], [-1, -1, 0]),
        "fc2": taps.Strategy([1, 1, 8, 1], [-1, -1, 0, -1]),
    },
}


@pytest.mark.parametrize("name", list(PLANS))
def test_replicated_plans_run_as_predicted(name):
    result = verify(taps.Plan(megatron_mlp(), CLUSTER, PLANS[name]))
    assert result.ok, result.mismatches
    assert result.max_error < 1e-4


@pytest.mark.parametrize("replicate", [False, True])
def test_searched_plan_with_a_scalar_loss_runs_as_predicted(replicate):
    """The loss has no axis to split: the default search replicates it, and XLA agrees."""
    found = taps.search(_with_scalar_loss(), CLUSTER, replicate=replicate)
    assert found.plan.strategies["loss"].replicas == 8
    result = verify(found.plan)
    assert result.ok, result.mismatches
