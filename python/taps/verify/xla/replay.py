"""Exact replay: taps' own plan, step by step, under ``shard_map`` on XLA.

The graph becomes JAX code, one operator at a time (:mod:`.operators`), each edge's input
redistributed by exactly the steps taps plans (:mod:`taps.steps.jax`). The step replayed is the
one the plan is priced for (``plan.pricing.step``, as in :func:`taps.search`):

- ``"training"`` (the default): the whole training step (:mod:`.training`), forward and backward
  by taps' own plans: partial sums flowing into the edges that sum them, every edge's backward
  plan on the gradient, the gradient all_reduces (ZeRO: reduce_scatter and all_gather); JAX only
  differentiates local blocks. Every compiled collective must be one of taps' predictions;
- ``"forward"``: the paper's model, each forward partial sum all_reduced at its operator and JAX's
  own backward pass (:mod:`.program`); what XLA compiles for the backward of a redistribution is
  listed as ``unpriced``.

The step is compiled, and every collective of the optimized HLO is paired with a predicted one
(:func:`taps.verify.result.match`). Outputs and gradients are compared with the same program run
unsharded.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from taps._core import Cluster, Layout, plan_redistribution
from taps.errors import VerifyError
from taps.export.jax import jax_mesh, layout_spec, named_sharding
from taps.plan.mesh import mesh_for_redistributions
from taps.plan.plan import Plan
from taps.steps.jax import redistribute
from taps.verify.footprint import check_xla, check_xla_layouts
from taps.verify.prediction import check_plan, predicted_steps
from taps.verify.result import TOLERANCE, VerifyResult, match, relative_error
from taps.verify.xla import training
from taps.verify.xla.devices import have_devices, jax_with_devices
from taps.verify.xla.program import GraphProgram, measured, run_dtype

if TYPE_CHECKING:
    from taps._core import _Planner

#: XLA passes that merge collectives (one launch for several): off, so that each of taps' steps
#: is one compiled collective. They change launches, not bytes or groups.
COMPILER_OPTIONS = {
    "xla_disable_hlo_passes": "cpu-all-reduce-combiner,all-reduce-combiner,all-gather-combiner,"
    "reduce-scatter-combiner,all-to-all-combiner,collective-permute-combiner"
}


def verify(
    plan: Plan,
    dtype: str = "float32",
    seed: int = 0,
    values: Mapping[str, Any] | None = None,
) -> VerifyResult:
    """Run ``plan`` on ``plan.cluster.num_devices`` XLA devices exactly as taps plans it, and
    compare with taps' predictions and with the unsharded run (module doc). The plan's pricing
    says what runs: in the training step, its planner plans every edge (minimising what its cost
    model measures, as the search did) and ZeRO shards parameters' gradients; in the forward
    step, the paper's model with JAX's own backward pass. If JAX already started with fewer
    devices, the verification runs in a fresh process (:mod:`.fresh`). ``values``: the values of
    some parameters or inputs by name (a fixed routing mask), the others seeded random."""
    check_plan(plan, "verify", seed)
    if values is not None and not isinstance(values, Mapping):
        raise TypeError(
            f"verify: values must map tensor names to arrays, got {type(values).__name__}"
        )
    leaves = {n for n, t in plan.graph.tensors.items() if t.kind in ("parameter", "input")}
    unknown = sorted(set(values or ()) - leaves)
    if unknown:
        raise VerifyError(f"values given for {unknown}, which are no parameters or inputs")
    step = plan.pricing.step
    if plan.pricing.zero and step != "training":
        raise VerifyError("ZeRO (zero=True) is replayed in the training step only")
    if plan.pricing.fsdp and step != "training":
        raise VerifyError("sharded storage (fsdp) is replayed in the training step only")
    check_xla(plan, dtype)
    if not have_devices(plan.cluster.num_devices):
        return _in_fresh_process(plan, dtype, seed, values)
    t0 = time.perf_counter()
    prog = GraphProgram(plan, dtype, seed, values)
    jax = prog.jax
    args = prog.placed()
    in_specs = (prog.specs_of(prog.diff), prog.specs_of(prog.fixed))
    if step == "training":
        stacked = prog.stacked_spec()
        fn = jax.shard_map(
            training.training_step(prog),
            mesh=prog.jmesh,
            in_specs=(*in_specs, prog.out_specs),
            out_specs=(
                {op.name: stacked for op in plan.graph.ops},
                {k: stacked for k in prog.diff},
            ),
            check_vma=False,
        )
    else:
        fn = prog.train(
            jax.shard_map(
                lambda d, f: prog.body(d, f, "shard_map"),
                mesh=prog.jmesh,
                in_specs=in_specs,
                out_specs=prog.out_specs,
            )
        )
    options = dict(COMPILER_OPTIONS)
    if prog.stored:
        # CSE would merge the gather before the backward into the forward's (keeping the
        # gathered parameter, FSDP's reshard_after_forward=False); taps prices both.
        options["xla_disable_hlo_passes"] += ",cse"
    compiled = jax.jit(fn).lower(*args).compile(compiler_options=options)
    t1 = time.perf_counter()
    outs, grads = compiled(*args)
    jax.block_until_ready((outs, grads))
    t2 = time.perf_counter()
    check = training.errors if step == "training" else GraphProgram.errors
    errors = check(prog, outs, grads)
    per_node = plan.cluster.devices_per_node
    rows = match(
        prog.predicted(),
        measured(compiled.as_text(), prog.mesh.num_devices),
        prog.describe,
        per_node,
        unpriced=step == "forward",
    )
    return VerifyResult.judged(
        rows,
        errors,
        TOLERANCE[dtype],
        "xla",
        prog.mesh.num_devices,
        per_node,
        {"compile": t1 - t0, "run": t2 - t1, "reference": time.perf_counter() - t2},
    )


def _in_fresh_process(
    plan: Plan, dtype: str, seed: int, values: Mapping[str, Any] | None = None
) -> VerifyResult:
    """:func:`verify` run by ``python -m taps.verify.xla.fresh`` (the plan's JSON on stdin, the
    given values in an ``.npz`` file)."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the child asks for its own device count
    with tempfile.TemporaryDirectory(prefix="taps-values-") as tmp:
        path = os.path.join(tmp, "values.npz")
        arrays = {k: np.asarray(v) for k, v in (values or {}).items()}
        np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
        done = subprocess.run(
            [sys.executable, "-m", "taps.verify.xla.fresh", dtype, str(seed), path],
            input=plan.to_json(),
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VerifyError(f"verification in a fresh process failed: {tail}") from None
    if "error" in data:
        raise VerifyError(data["error"])
    return VerifyResult.from_dict(data)


def verify_redistributions(
    pairs: Sequence[tuple[Layout, Layout]],
    devices_per_node: int | None = None,
    dtype: str = "float32",
    planner: _Planner = "paper",
) -> list[VerifyResult]:
    """Verify many redistributions (all on one device count) in one compiled program, as
    ``planner`` plans them: each device's block after the plan must equal its block of the target
    exactly, and every collective must compile as predicted. One result per pair."""
    if not pairs:
        return []
    t0 = time.perf_counter()
    n = pairs[0][0].num_devices
    check_xla_layouts([x for pair in pairs for x in pair], dtype)
    plans = [plan_redistribution(a, b, planner=planner) for a, b in pairs]
    mesh = mesh_for_redistributions([x for a, b in pairs for x in (a, b)], plans, n)
    jax = jax_with_devices(n)
    P = jax.sharding.PartitionSpec
    dt = run_dtype(dtype)
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
        jax.device_put(x, named_sharding(jmesh, layout_spec(mesh, a)))
        for x, (a, _) in zip(fulls, pairs)
    ]
    compiled = jax.jit(fn).lower(xs).compile(compiler_options=COMPILER_OPTIONS)
    t1 = time.perf_counter()
    outs = compiled(xs)
    jax.block_until_ready(outs)
    t2 = time.perf_counter()
    compiled_collectives = measured(compiled.as_text(), n)
    rank = {d: r for r, d in enumerate(jmesh.devices.reshape(-1))}
    results = []
    for i, ((a, b), plan, out, full) in enumerate(zip(pairs, plans, outs, fulls)):
        # A source with partial sums holds the whole tensor as every addend, so the sums the plan
        # takes come to the tensor times the devices they add up.
        summed = math.prod(a.device_dim_size(k) for k in a.partial) // math.prod(
            b.device_dim_size(k) for k in b.partial
        )
        want = full.reshape(b.shape) * summed
        error = 0.0
        for shard in out.addressable_shards:
            block = tuple(slice(lo, hi) for lo, hi in b.shard_index(rank[shard.device]))
            error = max(error, relative_error(shard.data, want[block]))
        scope = f"e{i}"
        what = "redistribution"
        rows = match(
            predicted_steps(plan, one_node, dt.itemsize, scope, what),
            [m for m in compiled_collectives if m[0] == scope],
            {scope: what},
            devices_per_node,
        )
        results.append(
            VerifyResult.judged(
                rows,
                {"target blocks": error},
                0.0,
                "xla",
                n,
                devices_per_node,
                {"compile": t1 - t0, "run": t2 - t1},
            )
        )
    stray = [m for m in compiled_collectives if not m[0]]
    if stray:
        raise VerifyError(f"compiled collectives outside every redistribution: {stray}")
    return results


def verify_redistribution(
    source: Layout,
    target: Layout,
    devices_per_node: int | None = None,
    dtype: str = "float32",
    planner: _Planner = "paper",
) -> VerifyResult:
    """Verify the plan from ``source`` to ``target`` (see :func:`verify_redistributions`)."""
    return verify_redistributions([(source, target)], devices_per_node, dtype, planner)[0]
