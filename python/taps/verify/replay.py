"""Exact replay: taps' own plan, step by step, under ``shard_map`` on XLA.

The graph becomes JAX code, one operator at a time (:mod:`.operators`), each edge's input
redistributed by exactly the steps taps plans (:mod:`.steps`), each forward partial sum
summed by the all_reduce taps prices. The program is differentiated (``jax.vjp``), compiled, and
every collective of the optimized HLO is paired with a predicted one (:mod:`.result`): the
forward collectives of every edge and operator, and the gradient all_reduces of every operator.
The backward pass of a redistribution is not in taps' cost model; what XLA compiles for it is
listed as ``unpriced``. Outputs and gradients are compared with the same program run unsharded.

Every edge and operator runs in its own ``jax.named_scope`` (``taps_e<i>``, ``taps_o<j>``), which
XLA keeps in each instruction's ``op_name``: that is how a compiled collective is traced to the
edge or operator it serves, and ``transpose(`` in the name marks the backward pass.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from taps._core import Cluster, CommOp, Layout, Redistribution, Strategy, plan_redistribution
from taps.costs import intra_collectives
from taps.export.jax import import_jax, jax_mesh, layout_spec
from taps.export.layouts import plan_layouts
from taps.export.mesh import Mesh, mesh_for
from taps.graph import Graph

from . import hlo
from .devices import VerifyError, jax_with_devices
from .operators import compute
from .result import Predicted, VerifyResult, match, verdict
from .steps import step

#: Relative error allowed per dtype (float sums run in another order when sharded).
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}

#: XLA passes that merge collectives (one launch for several): off, so that each of taps' steps
#: is one compiled collective. They change launches, not bytes or groups.
COMPILER_OPTIONS = {
    "xla_disable_hlo_passes": "cpu-all-reduce-combiner,all-reduce-combiner,all-gather-combiner,"
    "reduce-scatter-combiner,all-to-all-combiner,collective-permute-combiner"
}

_SCOPE = re.compile(r"taps_([eo]\d+)")


def layout_groups(layout: Layout, device_dims: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The groups of ranks that differ only in ``device_dims`` of ``layout``, from the rank
    coordinates (``c_k = (r // (d_0 ... d_{k-1})) mod d_k``), sorted."""
    sizes = layout.device_matrix[::-1]
    strides = [math.prod(sizes[:k]) for k in range(len(sizes))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(layout.num_devices):
        key = tuple((r // strides[k]) % sizes[k] for k in range(len(sizes)) if k not in device_dims)
        groups.setdefault(key, []).append(r)
    return tuple(sorted(tuple(g) for g in groups.values()))


def _unused_dims(layout: Layout) -> list[int]:
    return [k for k in range(len(layout.device_matrix)) if k not in layout.tensor_map]


def _volume_bytes(cluster: Cluster, op: CommOp, itemsize: int) -> int:
    return round(op.cost(cluster, itemsize, "volume"))


def redistribute(x: Any, plan: Redistribution, target: Layout, mesh: Mesh) -> Any:
    """A device's block of the plan's source, taken to its block of ``target`` by the plan's
    steps (prelude on the source's shape, the unified steps, epilogue on the target's)."""
    jnp = import_jax().numpy

    def run(x: Any, op: CommOp) -> Any:
        return step(op.kind).run(x, op, mesh.axes(op.layout, op.device_dim))

    for op in plan.prelude:
        x = run(x, op)
    x = jnp.reshape(x, plan.source.shard_shape)
    for op in plan.ops:
        x = run(x, op)
    x = jnp.reshape(x, (plan.epilogue[0].layout if plan.epilogue else target).shard_shape)
    for op in plan.epilogue:
        x = run(x, op)
    return x


def predicted_steps(
    plan: Redistribution, cluster: Cluster, itemsize: int, scope: str, what: str
) -> list[Predicted]:
    """The collectives of a plan's steps (slices are free and compile to none)."""
    return [
        Predicted(
            step(op.kind).hlo_kind or "",
            layout_groups(op.layout, [op.device_dim]),
            _volume_bytes(cluster, op, itemsize),
            scope,
            "forward",
            f"{what}: {op.kind} of dim {op.tensor_dim}"
            + (f" to dim {op.to_tensor_dim}" if op.to_tensor_dim is not None else ""),
        )
        for op in plan.all_ops
        if step(op.kind).hlo_kind is not None
    ]


def _measured(text: str, n: int) -> list[tuple[str, str, hlo.HloCollective]]:
    out = []
    for c in hlo.collectives(text, n):
        scopes = _SCOPE.findall(c.op_name)
        phase = "backward" if "transpose(" in c.op_name else "forward"
        out.append((scopes[-1] if scopes else "", phase, c))
    return out


def _relative_error(got: Any, want: Any) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(want), initial=0.0)) or 1.0
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


def _dtype(name: str) -> Any:
    if name not in TOLERANCE:
        raise VerifyError(f"unknown dtype {name!r}: expected one of {sorted(TOLERANCE)}")
    return import_jax().numpy.dtype(name)


def verify_graph(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    dtype: str = "float32",
    seed: int = 0,
) -> VerifyResult:
    """Run ``graph`` under ``strategies`` on ``cluster.num_devices`` XLA devices exactly as taps
    plans it, and compare with taps' predictions and with the unsharded run (module doc)."""
    t0 = time.perf_counter()
    layouts = plan_layouts(graph, strategies, cluster)
    mesh = layouts.mesh
    n = mesh.num_devices
    jax = jax_with_devices(n)
    jnp = jax.numpy
    P = jax.sharding.PartitionSpec
    dt = _dtype(dtype)
    itemsize = dt.itemsize
    jmesh = jax_mesh(mesh)
    one_node = Cluster(1, n)

    edges = {(e.consumer, e.slot): (i, e, plan) for i, (e, plan) in enumerate(layouts.plans)}
    describe = {
        f"e{i}": f"edge {e.producer} -> {e.consumer}" for i, (e, _) in enumerate(layouts.plans)
    }
    rng = np.random.default_rng(seed)
    roots: dict[str, np.ndarray] = {}
    diff: dict[str, Any] = {}
    fixed: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    predicted: list[Predicted] = []
    for j, op in enumerate(graph.ops):
        describe[f"o{j}"] = f"operator {op.name}"
        for slot, o in enumerate(op.inputs):
            root = graph.root(o.tensor)
            if root.kind == "activation":
                continue
            if root.name not in roots:
                scale = 1 / math.sqrt(root.shape[0]) if len(root.shape) > 1 else 1.0
                roots[root.name] = (rng.standard_normal(root.shape) * scale).astype(dt)
            key = f"{op.name}#{slot}"
            specs[key] = P(*layout_spec(mesh, layouts.inputs[op.name][slot]))
            value = roots[root.name].reshape(graph.tensors[o.tensor].shape)
            (diff if root.requires_grad else fixed)[key] = value
        for c in intra_collectives(graph, op, strategies[op.name]):
            cost = one_node.collective_cost(c.layout, "all_reduce", None, itemsize, "volume")
            predicted.append(
                Predicted(
                    "all_reduce",
                    layout_groups(c.layout, _unused_dims(c.layout)),
                    round(cost),
                    f"o{j}",
                    "forward" if c.reason == "forward partial sum" else "backward",
                    f"{c.reason} of {c.tensor}",
                )
            )
    for i, (_, plan) in enumerate(layouts.plans):
        predicted += predicted_steps(plan, one_node, itemsize, f"e{i}", describe[f"e{i}"])

    def body(d: dict[str, Any], f: dict[str, Any], sharded: bool) -> dict[str, Any]:
        vals: dict[str, Any] = {}
        for j, op in enumerate(graph.ops):
            xs = []
            for slot, o in enumerate(op.inputs):
                key = f"{op.name}#{slot}"
                if key in d or key in f:
                    xs.append(d[key] if key in d else f[key])
                    continue
                i, e, plan = edges[(op.name, slot)]
                x = vals[e.producer]
                with jax.named_scope(f"taps_e{i}"):
                    if sharded:
                        xs.append(redistribute(x, plan, layouts.inputs[op.name][slot], mesh))
                    else:
                        xs.append(jnp.reshape(x, graph.tensors[o.tensor].shape))
            forward = [
                c
                for c in intra_collectives(graph, op, strategies[op.name])
                if c.reason == "forward partial sum"
            ]
            axes = mesh.unused_axes(forward[0].layout) if sharded and forward else ()

            def reduce(y: Any, axes: tuple[str, ...] = axes) -> Any:
                return step("all_reduce").run(y, None, axes) if axes else y

            with jax.named_scope(f"taps_o{j}"):
                vals[op.name] = compute(op, xs, reduce)
        return vals

    out_specs = {op.name: P(*layout_spec(mesh, layouts.outputs[op.name])) for op in graph.ops}
    sharded = jax.shard_map(
        lambda d, f: body(d, f, True),
        mesh=jmesh,
        in_specs=({k: specs[k] for k in diff}, {k: specs[k] for k in fixed}),
        out_specs=out_specs,
    )
    cts = {
        op.name: (rng.standard_normal(graph.tensors[op.output.tensor].shape)).astype(dt)
        for op in graph.ops
    }

    def train(fn: Any) -> Any:
        def run(d: Any, f: Any, ct: Any) -> Any:
            outs, pull = jax.vjp(lambda d: fn(d, f), d)
            return outs, pull(ct)[0]

        return run

    def put(values: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        return {
            k: jax.device_put(v, jax.sharding.NamedSharding(jmesh, spec[k]))
            for k, v in values.items()
        }

    args = (put(diff, specs), put(fixed, specs), put(cts, out_specs))
    compiled = jax.jit(train(sharded)).lower(*args).compile(compiler_options=COMPILER_OPTIONS)
    t1 = time.perf_counter()
    outs, grads = compiled(*args)
    jax.block_until_ready((outs, grads))
    t2 = time.perf_counter()
    ref_outs, ref_grads = jax.jit(train(lambda d, f: body(d, f, False)))(diff, fixed, cts)

    errors = {f"{graph.op(k).output.tensor}": _relative_error(outs[k], ref_outs[k]) for k in outs}
    errors.update({f"grad {k}": _relative_error(grads[k], ref_grads[k]) for k in grads})
    # Edges that take one tensor to one layout compute the same blocks: XLA keeps one.
    first: dict[tuple[str, Layout], str] = {}
    shared = {}
    for i, (e, _) in enumerate(layouts.plans):
        same = (e.producer, layouts.inputs[e.consumer][e.slot])
        if first.setdefault(same, f"e{i}") != f"e{i}":
            shared[f"e{i}"] = first[same]
    rows = match(
        predicted, _measured(compiled.as_text(), n), describe, cluster.devices_per_node, shared
    )
    tol = TOLERANCE[dtype]
    ok, max_error, lines = verdict(rows, errors, tol)
    return VerifyResult(
        ok,
        max_error,
        tol,
        rows,
        lines,
        "xla",
        n,
        cluster.devices_per_node,
        {"compile": t1 - t0, "run": t2 - t1, "reference": time.perf_counter() - t2},
        errors,
    )


def verify_redistributions(
    pairs: Sequence[tuple[Layout, Layout]],
    devices_per_node: int | None = None,
    dtype: str = "float32",
) -> list[VerifyResult]:
    """Verify many redistributions (all on one device count) in one compiled program: each
    device's block after the plan must equal its block of the target exactly, and every
    collective must compile as predicted. One result per pair."""
    if not pairs:
        return []
    t0 = time.perf_counter()
    n = pairs[0][0].num_devices
    plans = [plan_redistribution(a, b) for a, b in pairs]
    every = [x for a, b in pairs for x in (a, b)]
    for plan in plans:
        every += [plan.source, plan.target, *(op.layout for op in plan.all_ops)]
    mesh = mesh_for(every, n)
    jax = jax_with_devices(n)
    P = jax.sharding.PartitionSpec
    dt = _dtype(dtype)
    jmesh = jax_mesh(mesh)
    one_node = Cluster(1, n)

    def body(xs: list[Any]) -> list[Any]:
        out = []
        for i, ((_, b), plan) in enumerate(zip(pairs, plans)):
            with jax.named_scope(f"taps_e{i}"):
                out.append(redistribute(xs[i], plan, b, mesh))
        return out

    fn = jax.shard_map(
        body,
        mesh=jmesh,
        in_specs=([P(*layout_spec(mesh, a)) for a, _ in pairs],),
        out_specs=[P(*layout_spec(mesh, b)) for _, b in pairs],
    )
    # Element i holds the number i: any misplaced element shows (exact below 2**24).
    fulls = [np.arange(math.prod(a.shape)).reshape(a.shape).astype(dt) for a, _ in pairs]
    xs = [
        jax.device_put(x, jax.sharding.NamedSharding(jmesh, P(*layout_spec(mesh, a))))
        for x, (a, _) in zip(fulls, pairs)
    ]
    compiled = jax.jit(fn).lower(xs).compile(compiler_options=COMPILER_OPTIONS)
    t1 = time.perf_counter()
    outs = compiled(xs)
    jax.block_until_ready(outs)
    t2 = time.perf_counter()
    measured = _measured(compiled.as_text(), n)
    rank = {d: r for r, d in enumerate(jmesh.devices.reshape(-1))}
    results = []
    for i, ((_, b), plan, out, full) in enumerate(zip(pairs, plans, outs, fulls)):
        want = full.reshape(b.shape)
        error = 0.0
        for shard in out.addressable_shards:
            block = tuple(slice(lo, hi) for lo, hi in b.shard_index(rank[shard.device]))
            error = max(error, _relative_error(shard.data, want[block]))
        scope = f"e{i}"
        what = "redistribution"
        rows = match(
            predicted_steps(plan, one_node, dt.itemsize, scope, what),
            [m for m in measured if m[0] == scope],
            {scope: what},
            devices_per_node,
        )
        ok, max_error, lines = verdict(rows, {"target blocks": error}, 0.0)
        results.append(
            VerifyResult(
                ok,
                max_error,
                0.0,
                rows,
                lines,
                "xla",
                n,
                devices_per_node,
                {"compile": t1 - t0, "run": t2 - t1},
                {"target blocks": error},
            )
        )
    stray = [m for m in measured if not m[0]]
    if stray:
        raise VerifyError(f"compiled collectives outside every redistribution: {stray}")
    return results


def verify_redistribution(
    source: Layout, target: Layout, devices_per_node: int | None = None, dtype: str = "float32"
) -> VerifyResult:
    """Verify the plan from ``source`` to ``target`` (see :func:`verify_redistributions`)."""
    return verify_redistributions([(source, target)], devices_per_node, dtype)[0]
