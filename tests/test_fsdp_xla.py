"""XLA on the plan's sharded storage: the parameters placed as ``taps.export.to_jax`` stores them
(their first dim over the data-parallel mesh axes), read by every operator in the layout its
strategy computes with (``with_sharding_constraint``), their gradients returned as stored: the
all_gathers and reduce_scatters XLA's partitioner compiles are taps' gathers and reduce_scatters,
of the same group size and bytes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import taps
from fsdp_collectives import fsdp_rows, predicted, stored_rows, tensor_split
from taps.export.storage import stored_groups
from taps.verify.xla import hlo
from taps.verify.xla.devices import jax_with_devices

jax = jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs
P = jax.sharding.PartitionSpec


def _graph() -> taps.Graph:
    g = taps.Graph(name="mlp")
    x = g.input("x", (16, 32), dtype_bytes=4)
    h = g.relu("act", g.linear("fc1", x, 64))
    g.linear("fc2", h, 32)
    return g


def _plan(devices: int) -> taps.Plan:
    """Data parallelism over every device (the batch split, the weights whole), every weight
    stored sharded."""
    g = _graph()
    split = taps.Strategy([devices, 1, 1], [0, -1, -1])
    strategies = {"fc1": split, "act": taps.Strategy([devices, 1], [0, -1]), "fc2": split}
    return taps.Plan(g, taps.Cluster(1, devices), strategies, taps.Pricing(fsdp=True))


def _found(compiled, n: int) -> Counter:
    """The compiled program's collectives by kind, group size and the whole tensor's bytes."""
    return Counter(
        (c.kind, c.group_size, c.in_bytes * (c.group_size if c.kind == "all_gather" else 1))
        for c in hlo.collectives(compiled.as_text(), n)
    )


def _inputs(specs, mesh):
    rng = np.random.default_rng(0)

    def put(value, spec):
        return jax.device_put(value.astype(np.float32), jax.sharding.NamedSharding(mesh, P(*spec)))

    params = {
        name: put(rng.standard_normal(shape), specs.tensors[f"{name}.weight"])
        for name, shape in (("fc1", (32, 64)), ("fc2", (64, 32)))
    }
    x = put(rng.standard_normal((16, 32)), specs.tensors["x"])
    ct = put(np.ones((16, 32)), specs.operators["fc2"]["output"])
    return params, x, ct


def test_xla_partitioner_gathers_the_stored_parameters_as_taps_prices():
    """GSPMD: the weights placed as stored, constrained to their readers' layouts. XLA gathers
    each once (it keeps the forward's gathered weight for the backward, FSDP2's
    ``reshard_after_forward=False``; taps prices a second gather before the backward) and
    reduces each gradient over the same group and bytes as taps' reduce_scatter: on the CPU
    backend as an all-reduce and a local slice (XLA's GPU compiler turns that pair into a
    reduce-scatter, its ReduceScatterCreator pass)."""
    n = 4
    plan = _plan(n)
    specs = taps.export.to_jax(plan)
    mesh = specs.jax_mesh()

    def sharding(spec):
        return jax.sharding.NamedSharding(mesh, P(*spec))

    def forward(params, x):
        h = x
        for name in ("fc1", "fc2"):
            w = jax.lax.with_sharding_constraint(
                params[name], sharding(specs.operators[name]["inputs"][1])
            )
            h = jax.lax.with_sharding_constraint(h @ w, sharding(specs.operators[name]["output"]))
            if name == "fc1":
                h = jax.nn.relu(h)
        return h

    def step(params, x, ct):
        _, pull = jax.vjp(lambda p: forward(p, x), params)
        return pull(ct)[0]

    params, x, ct = _inputs(specs, mesh)
    stored = {k: v.sharding for k, v in params.items()}
    found = _found(jax.jit(step, out_shardings=stored).lower(params, x, ct).compile(), n)
    want = predicted(plan)
    assert set(stored_groups(plan)) == {"fc1.weight", "fc2.weight"}
    gathers = {k: v for k, v in want.items() if k[0] == "all_gather"}
    scatters = {k: v for k, v in want.items() if k[0] == "reduce_scatter"}
    assert {k: v for k, v in found.items() if k[0] == "all_gather"} == {
        k: v // 2 for k, v in gathers.items()
    }
    assert {("reduce_scatter", *k[1:]): v for k, v in found.items() if k[0] == "all_reduce"} == (
        scatters
    )
    assert sum(found.values()) == sum(gathers.values()) // 2 + sum(scatters.values())


def test_a_replay_of_fsdp_issues_exactly_taps_collectives():
    """shard_map: each device holds its shards as stored, all-gathers a weight before it computes
    and again in the backward (the gather checkpointed, not kept: FSDP2's
    ``reshard_after_forward=True``); JAX's transpose of the gather reduce-scatters the gradient.
    The compiled collectives are taps' exactly, by kind, group size and bytes (XLA's CSE off)."""
    n = 4
    plan = _plan(n)
    specs = taps.export.to_jax(plan)
    mesh = specs.jax_mesh()
    (axis,) = specs.mesh.axis_names

    @jax.checkpoint  # the gathered weight is not kept: the backward gathers it again
    def linear(h, w):
        return h @ jax.lax.all_gather(w, axis, axis=0, tiled=True)

    def forward(params, x):
        h = x
        for name in ("fc1", "fc2"):
            h = linear(h, params[name])
            if name == "fc1":
                h = jax.nn.relu(h)
        return h

    def step(params, x, ct):
        # The output and the input's gradient too, so that XLA keeps every gather (FSDP2
        # gathers before each backward whether or not it reads the weight).
        out, pull = jax.vjp(forward, params, x)
        return out, pull(ct)

    params, x, ct = _inputs(specs, mesh)
    stored = {k: P(*specs.tensors[f"{k}.weight"]) for k in params}
    rows, out = P(*specs.tensors["x"]), P(*specs.operators["fc2"]["output"])
    body = jax.shard_map(
        step, mesh=mesh, in_specs=(stored, rows, out), out_specs=(out, (stored, rows))
    )
    lowered = jax.jit(body).lower(params, x, ct)
    # XLA's common-subexpression elimination merges the backward's gather into the forward's
    # (it keeps the gathered weight, memory being no concern to it); without it the program
    # runs FSDP2's default.
    found = _found(lowered.compile(compiler_options={"xla_disable_hlo_passes": "cse"}), n)
    assert found == predicted(plan)
    kept = _found(lowered.compile(), n)
    assert kept == {k: v // 2 if k[0] == "all_gather" else v for k, v in found.items()}


# --- taps verify ----------------------------------------------------------------------------------


def test_verify_replays_sharded_storage_exactly():
    """``taps.verify`` on the data-parallel plan: every weight gathered before the forward and
    the backward and its gradient reduce-scattered, each of the closed form's bytes ((g-1)/g of
    the weight per device, float32), every row matched, every device's shard of every gradient
    equal to the dense run's."""
    n = 4
    plan = _plan(n)
    result = taps.verify(plan)
    assert result.ok, result.mismatches
    assert fsdp_rows(result.collectives) == stored_rows(2)
    weight = {"fc1.weight": 32 * 64 * 4, "fc2.weight": 64 * 32 * 4}
    for c in result.collectives:
        tensor = c.what.rsplit(" of ", 1)[-1]
        assert c.measured_bytes == (n - 1) * weight[tensor] // n, c
    assert {k for k in result.errors if k.startswith("grad")} == {"grad fc1#1", "grad fc2#1"}
    assert 0 < result.max_error <= result.tolerance


@pytest.mark.parametrize(
    ("graph", "cluster", "fraction"),
    [
        (taps.models.mlp(), taps.Cluster(2, 4), 0.97),
        (taps.models.gpt(hidden=64, heads=4, seq=16, batch=8), taps.Cluster(2, 8), 0.9),
    ],
    ids=["mlp-2x4", "gpt-2x8"],
)
def test_verify_matches_searched_fsdp_plans(graph, cluster, fraction):
    """Plans a search shards under a memory limit below the unsharded plan's (here operators
    that are tensor-split too): ``taps.verify`` predicts and compiles their gathers and
    reduce_scatters one for one with everything else, and the numbers equal the dense run's."""
    plain = taps.search(graph, cluster)
    limit = fraction * plain.memory_per_device
    plan = taps.search(graph, cluster, taps.Pricing(fsdp=True), memory_limit=limit).plan
    stored = stored_groups(plan)
    assert stored and tensor_split(plan)
    result = taps.verify(plan)
    assert result.ok, result.mismatches
    assert fsdp_rows(result.collectives) == stored_rows(len(stored))
    assert result.max_error <= result.tolerance


def test_sharded_storage_is_replayed_in_the_training_step_only():
    plan = _plan(4)
    forward = plan.with_pricing(taps.Pricing(step="forward", fsdp=True))
    with pytest.raises(taps.VerifyError, match="training step only"):
        taps.verify(forward)


def test_a_block_the_group_does_not_divide_is_padded_as_fsdp_pads():
    """A weight of 30 rows stored over 4 devices: each holds 8 rows (FSDP2 pads dim 0 to a
    multiple of the group), so its gathers and reduce_scatter move the padded 32 rows' bytes,
    ``(g-1) * 8 * 64 * 4``, where taps prices the 30 rows'; the numbers are the dense run's."""
    n = 4
    g = taps.Graph(name="mlp")
    x = g.input("x", (16, 30), dtype_bytes=4)
    g.linear("fc1", x, 64)
    plan = taps.Plan(
        g,
        taps.Cluster(1, n),
        {"fc1": taps.Strategy([n, 1, 1], [0, -1, -1])},
        taps.Pricing(fsdp=True),
    )
    result = taps.verify(plan)
    fsdp = [c for c in result.collectives if c.what.endswith("of fc1.weight")]
    assert [c.status for c in fsdp] == ["differs"] * 3
    assert {(c.predicted_bytes, c.measured_bytes) for c in fsdp} == {
        ((n - 1) * 30 * 64 * 4 // n, (n - 1) * 8 * 64 * 4)
    }
    assert all(c.status == "ok" for c in result.collectives if c not in fsdp)
    assert result.max_error <= result.tolerance
