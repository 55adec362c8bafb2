"""The torch engine on plans with sharded storage (FSDP): real transformers models searched with
``fsdp=True`` under a memory limit below the unsharded plan's, their operators both tensor-split
and storage-sharded. On the fake process group every gather and reduce_scatter the replay issues
is one taps predicts for its operator (kind, groups, bytes, phase), with everything else; on 4
gloo ranks the output and every parameter's gradient equal the dense module's."""

from __future__ import annotations

import pytest

import taps
from fsdp_collectives import fsdp_rows, stored_rows, tensor_split
from taps.export.storage import stored_groups
from taps.verify import verify_torch
from taps.verify.torch.engine import collective_rows
from torch_models import gpt2, llama


def _sharded_plan(module, inputs, cluster: taps.Cluster, fraction: float = 0.9) -> taps.Plan:
    graph = taps.from_torch(module, inputs)
    limit = fraction * taps.search(graph, cluster).memory_per_device
    return taps.search(graph, cluster, taps.Pricing(fsdp=True), memory_limit=limit).plan


@pytest.mark.parametrize(
    ("factory", "fraction"), [(llama, 0.9), (gpt2, 0.85)], ids=["llama", "gpt2"]
)
def test_fake_process_group_issues_taps_gathers_and_scatters(factory, fraction):
    module, ids = factory()
    plan = _sharded_plan(module, ids, taps.Cluster(2, 8), fraction)
    stored = stored_groups(plan)
    assert stored and tensor_split(plan)
    rows, _ = collective_rows(module, [ids], plan)
    bad = [r for r in rows if r.status not in ("ok", "shared")]
    assert not bad, bad[:3]
    assert fsdp_rows(rows) == stored_rows(len(stored))


def test_gloo_numbers_equal_the_dense_module():
    """Llama's plan for 1 x 4 (its MLP down projections tensor-split and stored sharded) on 4
    gloo ranks: the output and every parameter's gradient (the sharded ones gathered from their
    pieces) equal the dense module's; the collectives on the fake process group all match."""
    module, ids = llama()
    plan = _sharded_plan(module, ids, taps.Cluster(1, 4))
    stored = stored_groups(plan)
    assert stored and tensor_split(plan)
    result = verify_torch(module, [ids], plan, numerics=4)
    assert result.ok, result.mismatches
    assert fsdp_rows(result.collectives) == stored_rows(len(stored))
    assert {f"grad {name}" for name in stored} <= set(result.errors)
    assert result.max_error <= result.tolerance


def test_sharded_storage_is_replayed_in_the_training_step_only():
    module, ids = llama()
    plan = _sharded_plan(module, ids, taps.Cluster(1, 4))
    forward = plan.with_pricing(taps.Pricing(step="forward", fsdp=plan.pricing.fsdp))
    with pytest.raises(taps.VerifyError, match="training step only"):
        verify_torch(module, [ids], forward)
