"""A taps plan run on PyTorch DTensor: the module distributed by
:func:`taps.export.distribute_module`, run forward and backward on the fake process group at the
plan's full world size in this process (meta tensors: nothing is computed, every collective is
dispatched), each collective read as it is dispatched (:mod:`.torch_collectives`) and paired with
taps' prediction; and, for the numbers, the same on a few gloo ranks (:mod:`.torch_numerics`).

What DTensor does that taps' plan does not say is listed, as for XLA (docs/verify.md): DTensor
plans each redistribution itself (one collective per mesh dim, where taps may move several mesh
dims in one), and its sharding propagation may add collectives inside an operator's node. In the
backward pass DTensor takes each gradient back through the inverse of the forward
redistributions, summing partial gradients on the way (a reduce-scatter where taps prices an
all_reduce and a backward redistribution): backward collectives that are not taps' predicted
gradient all_reduces are ``unpriced``, and the parameter gradients are reduced to the
parameters' placements at the end, which is where taps' gradient all_reduces of parameters run.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from taps._core import Cluster, Strategy
from taps._support.extras import require
from taps.errors import VerifyError
from taps.export import DTensorPlan, plan_layouts
from taps.export.distribute import DistributedModule, distribute_module
from taps.graph import Graph
from taps.verify.program import (
    TOLERANCE,
    describe_scopes,
    operator_collectives,
    predicted_collectives,
)
from taps.verify.result import UNEXPECTED, UNPRICED, CollectiveCheck, VerifyResult, match
from taps.verify.torch_collectives import Recorder

if TYPE_CHECKING:
    from taps.search.searching import SearchResult


def import_torch() -> Any:
    """``torch``, or a ``MissingExtraError`` naming the extra."""
    return require("torch", "torch", "verifying a plan on PyTorch")


def torch_dtype(name: str) -> Any:
    if name not in TOLERANCE:
        raise VerifyError(f"unknown dtype {name!r}: expected one of {sorted(TOLERANCE)}")
    return getattr(import_torch(), name)


def cast_inputs(inputs: Sequence[Any], dtype: Any, device: str, seed: int) -> list[Any]:
    """Floating inputs as ``dtype`` on ``device`` (meta inputs get seeded random values);
    ``requires_grad`` kept."""
    torch = import_torch()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        if not x.is_floating_point():
            raise VerifyError(f"the torch engine takes floating inputs only, got {x.dtype}")
        value = torch.randn(x.shape, generator=gen) if x.is_meta else x.detach().cpu()
        out.append(value.to(device=device, dtype=dtype).requires_grad_(x.requires_grad))
    return out


def materialize(module: Any, dtype: Any, device: str, seed: int) -> Any:
    """A copy of ``module`` in ``dtype`` on ``device``; a module on the meta device gets seeded
    random values (``1/sqrt(fan-in)`` scale) for every parameter and buffer."""
    torch = import_torch()
    module = copy.deepcopy(module)
    if device == "meta":
        return module.to(device="meta", dtype=dtype)
    if any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
        module = module.to_empty(device=device)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                if t.is_floating_point():
                    scale = 1 / t.shape[-1] ** 0.5 if t.dim() > 1 else 1.0
                    t.copy_(torch.randn(t.shape, generator=gen) * scale)
    return module.to(device=device, dtype=dtype)


def backward(dist: DistributedModule, outs: Any, seed: int) -> list[Any]:
    """Backward from every output with a random cotangent in the output's placements; the
    whole cotangents, in output order (``None`` for an output without a gradient)."""
    torch = import_torch()
    dtensor = require("torch.distributed.tensor", "torch", "verifying a plan on PyTorch")
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    gen = torch.Generator().manual_seed(seed + 1)
    tensors: list[Any] = []
    cts: list[Any] = []
    fulls: list[Any] = []
    for y in outs:
        if not isinstance(y, dtensor.DTensor) or not y.requires_grad:
            fulls.append(None)
            continue
        full = torch.randn(y.shape, generator=gen).to(device=y.device.type, dtype=y.dtype)
        fulls.append(full)
        if any(p.is_partial() for p in y.placements):
            y = y.redistribute(
                dist.mesh, [dtensor.Replicate() if p.is_partial() else p for p in y.placements]
            )
        cts.append(
            dtensor.distribute_tensor(full, dist.mesh, list(y.placements), src_data_rank=None)
        )
        tensors.append(y)
    if tensors:
        torch.autograd.backward(tensors, cts)
    return fulls


def collective_rows(
    module: Any,
    inputs: Sequence[Any],
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
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
    layouts = plan_layouts(graph, strategies, cluster)
    plan = DTensorPlan.from_layouts(layouts)
    tdtype = torch_dtype(dtype)
    n = layouts.mesh.num_devices
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
    try:
        from torch.distributed.device_mesh import DeviceMesh

        # A CPU mesh holding meta tensors: nothing is computed.
        mesh = DeviceMesh(
            "cpu", torch.arange(n).reshape(plan.mesh.shape), mesh_dim_names=plan.mesh.axis_names
        )
        dense = materialize(module, tdtype, "meta", seed)
        xs = cast_inputs(inputs, tdtype, "meta", seed)
        dist = distribute_module(dense, layouts, *xs, mesh=mesh, mode=mode)
        recorder = Recorder(
            {(e.consumer, e.slot): i for i, (e, _) in enumerate(layouts.plans)},
            {op.name: j for j, op in enumerate(graph.ops)},
            tuple(plan.mesh.shape),
        )
        dist.tracer = recorder
        placed = [dist.distribute_input(s.arg.name, x) for s, x in zip(_user_specs(dist), xs)]
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
        layouts, operator_collectives(graph, strategies), tdtype.itemsize, describe
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
    rows = match(predicted, recorder.measured, describe, cluster.devices_per_node)
    return [_backward_status(r) for r in rows], {"compile": t1 - t0, "run": t2 - t1}


def _user_specs(dist: DistributedModule) -> list[Any]:
    return [s for s in dist.program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]


def _backward_status(row: CollectiveCheck) -> CollectiveCheck:
    """A backward collective taps did not predict (the backward of a redistribution), and the
    placing of a parameter or input for a second reader, are ``unpriced`` (module doc)."""
    if row.status == UNEXPECTED and (row.phase == "backward" or "(taps: no edge)" in row.what):
        return dataclasses.replace(row, status=UNPRICED)
    return row


def verify_torch(
    module: Any,
    inputs: Sequence[Any],
    source: SearchResult | Graph,
    cluster: Cluster | None = None,
    strategies: Mapping[str, Strategy] | None = None,
    dtype: str = "float32",
    seed: int = 0,
    numerics: int | None = 4,
) -> VerifyResult:
    """Verify a plan of ``module`` (``taps.from_torch(module, *inputs)`` searched: a search
    result, or the graph with ``cluster`` and ``strategies``) on PyTorch DTensor: collectives on
    the fake process group at the full world size, and, with ``numerics`` (4 to 8), the outputs
    and gradients on that many gloo ranks under taps' plan for them (the same plan when the
    world is that size; else the plan :func:`taps.search` finds for ``numerics`` devices on one
    node) against the dense module."""
    if isinstance(source, Graph):
        if cluster is None or strategies is None:
            raise VerifyError("verifying a graph needs its cluster and strategies")
        graph = source
    else:
        graph, cluster, strategies = source.graph, source.cluster, source.strategies
    rows, timings = collective_rows(module, inputs, graph, cluster, strategies, dtype, seed)
    errors: dict[str, float] = {}
    if numerics is not None:
        from taps.verify.torch_numerics import gloo_errors

        t = time.perf_counter()
        errors = gloo_errors(module, inputs, graph, cluster, strategies, numerics, dtype, seed)
        timings["numerics"] = time.perf_counter() - t
    return VerifyResult.judged(
        rows,
        errors,
        TOLERANCE[dtype],
        "torch",
        cluster.num_devices,
        cluster.devices_per_node,
        timings,
    )
