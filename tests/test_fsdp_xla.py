"""XLA on the plan's sharded storage: the parameters placed as ``taps.export.to_jax`` stores them
(their first dim over the data-parallel mesh axes), read by every operator in the layout its
strategy computes with (``with_sharding_constraint``), their gradients returned as stored: the
all_gathers and reduce_scatters XLA's partitioner compiles are taps' gathers and reduce_scatters,
of the same group size and bytes."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

import taps
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


def _predicted(plan: taps.Plan) -> Counter:
    """taps' collectives by kind, group size and the whole tensor's bytes."""
    return Counter(
        (
            c.kind,
            math.prod(
                c.layout.device_dim_size(k)
                for k in range(len(c.layout.device_matrix))
                if k not in c.layout.tensor_map
            ),
            math.prod(c.layout.shard_shape) * c.dtype_bytes,
        )
        for r in taps.breakdown(plan)
        for c, _ in r.collectives
    )


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
    predicted = _predicted(plan)
    assert set(stored_groups(plan)) == {"fc1.weight", "fc2.weight"}
    gathers = {k: v for k, v in predicted.items() if k[0] == "all_gather"}
    scatters = {k: v for k, v in predicted.items() if k[0] == "reduce_scatter"}
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
    assert found == _predicted(plan)
    kept = _found(lowered.compile(), n)
    assert kept == {k: v // 2 if k[0] == "all_gather" else v for k, v in found.items()}
