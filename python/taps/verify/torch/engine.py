"""A taps plan run on PyTorch DTensor: the module distributed by
:func:`taps.export.distribute_module` (``mode="taps"``), run forward and backward on the fake
process group at the plan's full world size in this process (meta tensors: nothing is computed,
every collective is dispatched), each collective read as it is dispatched (:mod:`.collectives`)
and paired with taps' prediction; and, for the numbers, the same on a few gloo ranks
(:mod:`.numerics`).

What runs is the plan's step, as on XLA (docs/verify.md): in the training step taps' forward and
backward plans edge by edge, flowing partial sums and gradient all_reduces (ZeRO's reduce_scatter
and all_gather), every collective predicted; in the paper's model autograd takes gradients back
through the forward steps, and those backward collectives are ``unpriced``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from taps.errors import VerifyError
from taps.export.distribute import distribute_module, export_module
from taps.plan.plan import Plan
from taps.search.evaluate import step_layouts
from taps.verify.footprint import check_gloo
from taps.verify.prediction import check_plan, describe_scopes, predicted_collectives
from taps.verify.result import (
    TOLERANCE,
    UNEXPECTED,
    UNPRICED,
    CollectiveCheck,
    VerifyResult,
    match,
)
from taps.verify.torch import moe
from taps.verify.torch.collectives import Recorder
from taps.verify.torch.numerics import check_ranks, gloo_errors
from taps.verify.torch.values import (
    backward,
    cast_inputs,
    import_torch,
    materialize,
    placed_inputs,
    replaying,
    token_bound,
    torch_dtype,
)


def collective_rows(
    module: Any,
    inputs: Sequence[Any],
    plan: Plan,
    dtype: str = "float32",
    seed: int = 0,
    mode: str = "taps",
) -> tuple[list[CollectiveCheck], dict[str, float]]:
    """Run the plan on the fake process group (meta tensors) and pair every dispatched collective
    with taps' prediction; also the times (``compile`` = distributing, ``run``)."""
    torch = import_torch()
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if tdist.is_initialized():
        raise VerifyError(
            "the fake-process-group run needs this process without a process group (one is "
            "initialised already)"
        )
    t0 = time.perf_counter()
    graph = plan.graph
    step = step_layouts(plan)
    layouts = step.layouts
    tdtype = torch_dtype(dtype)
    grid = layouts.mesh
    n = grid.num_devices
    with replaying():
        tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
        try:
            from torch.distributed.device_mesh import DeviceMesh

            # A CPU mesh holding meta tensors: nothing is computed.
            mesh = DeviceMesh(
                "cpu", torch.arange(n).reshape(grid.shape), mesh_dim_names=grid.axis_names
            )
            dense = materialize(module, tdtype, "meta", seed)
            xs = cast_inputs(inputs, tdtype, "meta", seed, token_bound(module))
            exported = export_module(dense, *xs)
            dist = distribute_module(
                dense, plan, *xs, mesh=mesh, mode=mode, exported=exported, seed=seed
            )
            moe.install(dist, exported)
            recorder = Recorder(
                {(e.consumer, e.slot): i for i, (e, _) in enumerate(layouts.redistributions)},
                {op.name: j for j, op in enumerate(graph.ops)},
                tuple(grid.shape),
            )
            dist.tracer = recorder
            placed = placed_inputs(dist, xs)
            t1 = time.perf_counter()
            with recorder.recording():
                outs = dist(*placed)
                recorder.phase = "backward"
                backward(dist, outs, seed)
            t2 = time.perf_counter()
        finally:
            tdist.destroy_process_group()
    describe = describe_scopes(layouts)
    predicted = predicted_collectives(
        layouts,
        step.intra,
        tdtype.itemsize,
        describe,
        step.backward,
        integer_sizes(dist.program, dist.conversion),
    )
    # A node that makes several operators (attention: scores, softmax, context) runs backward as
    # one torch operator, in the scope of the operator that makes its output.
    index = recorder.ops
    inner = {}
    for links in dist.conversion.links.values():
        out = [f"o{index[li.op]}" for li in links if li.slot is None]
        inner.update({f"o{index[li.op]}": out[0] for li in links if out})
    predicted = [
        dataclasses.replace(p, scope=inner.get(p.scope, p.scope)) if p.phase == "backward" else p
        for p in predicted
    ]
    for scope, _, _ in recorder.measured:
        if scope.startswith("n:"):
            describe[scope] = f"node {scope[2:]} (DTensor's own)"
        elif scope.startswith("l:"):
            describe[scope] = f"a leaf placed for {scope[2:]} (taps: no edge)"
    paper = plan.pricing.step != "training"
    rows = match(
        predicted, recorder.measured, describe, plan.cluster.devices_per_node, unpriced=paper
    )
    if paper:
        rows = [_backward_status(r) for r in rows]
    return rows, {"compile": t1 - t0, "run": t2 - t1}


def integer_sizes(program: Any, conversion: Any) -> dict[object, int]:
    """The element sizes of what the module holds as integers (position ids: the run keeps
    them so, floating tensors take the run's dtype): by graph tensor, an operator's output; by
    ``(operator, slot)``, what an edge carries into the operator. ``program`` is the module's
    export, ``conversion`` the front end's conversion of it."""
    from taps.export.distribute import _leaves

    graph = conversion.graph
    out: dict[object, int] = {}

    def integer(val: Any) -> bool:
        return hasattr(val, "is_floating_point") and not val.is_floating_point()

    for node in program.graph.nodes:
        args = _leaves([*node.args, *node.kwargs.values()])
        for link in conversion.links.get(node.name, []):
            val = node.meta.get("val") if link.slot is None else args[link.arg].meta.get("val")
            if not integer(val):
                continue
            if link.slot is None:
                out[graph.op(link.op).output.tensor] = val.dtype.itemsize
            else:
                out[(link.op, link.slot)] = val.dtype.itemsize
    return out


def _backward_status(row: CollectiveCheck) -> CollectiveCheck:
    """In the paper's model, a backward collective taps did not predict (the backward of a
    redistribution), and the placing of a parameter or input for a second reader, are
    ``unpriced`` (module doc)."""
    if row.status == UNEXPECTED and (row.phase == "backward" or "(taps: no edge)" in row.what):
        return dataclasses.replace(row, status=UNPRICED)
    return row


def verify_torch(
    module: Any,
    inputs: Sequence[Any],
    plan: Plan,
    dtype: str = "float32",
    seed: int = 0,
    numerics: int | None = 4,
) -> VerifyResult:
    """Verify ``plan`` of ``module`` (a plan of ``taps.from_torch(module, *inputs)``) on PyTorch
    DTensor: collectives on the fake process group at the full world size, and, with
    ``numerics`` (4 or 8), the outputs and gradients on that many gloo ranks under taps' plan for
    them (the same plan when the world is that size; else the plan :func:`taps.search` finds for
    ``numerics`` devices on one node) against the dense module."""
    check_plan(plan, "verify_torch", seed)
    if numerics is not None:
        check_ranks("verify_torch", numerics)
    if not isinstance(module, import_torch().nn.Module):
        raise TypeError(
            f"verify_torch: module must be a torch.nn.Module, got {type(module).__name__}"
        )
    if not isinstance(inputs, Sequence) or isinstance(inputs, str):
        raise TypeError(
            f"verify_torch: inputs must be a list or tuple of the example inputs, got "
            f"{type(inputs).__name__}"
        )
    if plan.pricing.zero and plan.pricing.step != "training":
        raise VerifyError("ZeRO (zero=True) is replayed in the training step only")
    if plan.pricing.fsdp and plan.pricing.step != "training":
        raise VerifyError("sharded storage (fsdp) is replayed in the training step only")
    if numerics is not None:
        check_gloo(plan, numerics, dtype)
    rows, timings = collective_rows(module, inputs, plan, dtype, seed)
    errors: dict[str, float] = {}
    if numerics is not None:
        t = time.perf_counter()
        errors = gloo_errors(module, inputs, plan, numerics, dtype, seed)
        timings["numerics"] = time.perf_counter() - t
    return VerifyResult.judged(
        rows,
        errors,
        TOLERANCE[dtype],
        "torch",
        plan.cluster.num_devices,
        plan.cluster.devices_per_node,
        timings,
    )
