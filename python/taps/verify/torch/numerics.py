"""A taps plan's numbers on real PyTorch ranks: the module distributed by
:func:`taps.export.distribute_module` (taps' steps replayed) on a few gloo processes on this
machine's CPU, run forward and backward, its output and every parameter's (and every input's)
gradient compared with the dense module run on the same values.

The ranks are processes forked from one fresh Python process (:mod:`.ranks`): the module, the
inputs and the plan are pickled in a directory, the module given its values and exported there
once; rank 0 writes the errors to a file the caller reads.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from taps._core import Cluster
from taps._support.arguments import shown
from taps.errors import VerifyError
from taps.export.distribute import distribute_module, export_module
from taps.export.draws import drawing
from taps.export.experts import stacked_parameters
from taps.plan.layouts import layouts_of
from taps.plan.plan import Plan
from taps.verify.result import step_errors
from taps.verify.torch import moe
from taps.verify.torch.ranks import run_ranks
from taps.verify.torch.values import (
    backward,
    cast_inputs,
    materialize,
    placed_inputs,
    token_bound,
    torch_dtype,
    user_specs,
)

#: The rank counts a numerics run takes (gloo processes on one machine).
RANKS = (4, 8)


def check_ranks(where: str, ranks: object) -> None:
    """Refuse, before any work, a numerics run on a rank count other than :data:`RANKS`."""
    if not isinstance(ranks, int) or isinstance(ranks, bool):
        raise TypeError(f"{where}: the numerics' ranks must be an int, got {type(ranks).__name__}")
    if ranks not in RANKS:
        raise VerifyError(
            f"{where}: a numerics run takes {' or '.join(map(str, RANKS))} ranks, not "
            f"{shown(ranks)}"
        )


def numerics_plan(plan: Plan, ranks: int) -> Plan:
    """The plan the numbers are checked on: ``plan`` when its cluster has ``ranks`` devices,
    else taps' plan for ``ranks`` devices on one node, with the same pricing."""
    check_ranks("numerics_plan", ranks)
    if plan.cluster.num_devices == ranks:
        return plan
    from taps.search.searching import search

    return search(plan.graph, Cluster(1, ranks), plan.pricing).plan


def gloo_errors(
    module: Any,
    inputs: Sequence[Any],
    plan: Plan,
    ranks: int = 4,
    dtype: str = "float32",
    seed: int = 0,
) -> dict[str, float]:
    """Per output (``"output i"``) and per gradient (``"grad name"``), the error relative to the
    dense module, from ``ranks`` gloo processes running taps' plan for them."""
    small = numerics_plan(plan, ranks)
    with tempfile.TemporaryDirectory(prefix="taps-gloo-") as tmp:
        payload = (module, list(inputs), small.to_json(), dtype, seed, tmp)
        with open(os.path.join(tmp, "payload.pkl"), "wb") as f:
            pickle.dump(payload, f)
        run_ranks(__name__, tmp, ranks)
        with open(os.path.join(tmp, "errors.json")) as f:
            return dict(json.load(f))


def batch_parts(module: Any, plan: Plan) -> dict[str, int]:
    """Per BatchNorm of ``module`` in training mode whose batch ``plan`` splits: into how many
    parts. Each device normalises its part by its own statistics (data parallelism without
    ``SyncBatchNorm``, as the front end's rule prices it)."""
    import torch

    layouts = layouts_of(plan)
    mesh = layouts.mesh
    size = dict(zip(mesh.axis_names, mesh.shape))
    names = {op.name for op in plan.graph.ops if op.kind == "batchnorm"}
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training and name in names:
            parts = math.prod(size[a] for a in mesh.dim_axes(layouts.outputs[name])[0])
            if parts > 1:
                out[name] = parts
    return out


@contextlib.contextmanager
def statistics_per_part(module: Any, parts: dict[str, int]) -> Iterator[None]:
    """The dense ``module`` with each BatchNorm of ``parts`` run by its own forward on each of
    its batch's ``parts[name]`` equal blocks apart (what each device of the plan computes), the
    blocks' results joined: the reference a plan that splits a BatchNorm's batch is checked
    against."""
    import torch

    def by_parts(m: Any, count: int, x: Any) -> Any:
        return torch.cat([type(m).forward(m, block) for block in x.chunk(count)])

    patched = []
    for name, count in parts.items():
        m = module.get_submodule(name)
        m.forward = functools.partial(by_parts, m, count)
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def prepare(payload: tuple[Any, ...]) -> tuple[Any, ...]:
    """What every rank shares, made once before they fork (:mod:`.ranks`): the plan, the dense
    module and the inputs with their values, and the module's export."""
    module, inputs, plan_json, dtype, seed, tmp = payload
    tdtype = torch_dtype(dtype)
    dense = materialize(module, tdtype, "cpu", seed)
    xs = cast_inputs(inputs, tdtype, "cpu", seed, token_bound(module))
    return Plan.from_json(plan_json), dense, xs, export_module(dense, *xs), seed, tmp


def run_rank(rank: int, ranks: int, state: tuple[Any, ...]) -> None:
    """One rank: the plan and (rank 0) the dense module run, the errors written by rank 0."""
    import torch
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh

    plan, dense, xs, exported, seed, tmp = state
    tdist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank, world_size=ranks
    )
    layouts = layouts_of(plan)
    mesh = init_device_mesh("cpu", layouts.mesh.shape, mesh_dim_names=layouts.mesh.axis_names)
    dist = distribute_module(dense, plan, *xs, mesh=mesh, mode="taps", exported=exported, seed=seed)
    moe.install(dist, exported)
    specs = user_specs(dist)
    placed = placed_inputs(dist, xs)
    outs = dist(*placed)
    cts = backward(dist, outs, seed)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    # Whole results are gathered by every rank (a collective); rank 0 compares them.
    got = {f"output {i}": y.full_tensor() for i, y in enumerate(outs)}
    for name in [*dist.parameters, *(s.arg.name for s in specs)]:
        grad = dist.grad(name)
        if grad is not None:
            got[f"grad {name}"] = grad.full_tensor()
    if rank != 0:
        return
    # The dense run on the same values.
    refs = [
        x.detach().clone().requires_grad_(x.requires_grad)
        if isinstance(x, torch.Tensor)
        else x  # an absent mask
        for x in xs
    ]
    # The replay's random values (dropout's masks); BatchNorm's statistics per device.
    with drawing(seed), statistics_per_part(dense, batch_parts(dense, plan)):
        if moe.has_blocks(plan.graph):  # the experts' routing fixed as the replay's
            want_outs = moe.dense_run(exported, dense, refs)
        else:
            want_outs = dense(*refs)
    # Flattened as the exported program's outputs are (a model output's fields in order).
    want_outs = torch.utils._pytree.tree_leaves(want_outs)
    pairs = [(y, c) for y, c in zip(want_outs, cts) if c is not None]
    torch.autograd.backward([y for y, _ in pairs], [c for _, c in pairs])
    want = {f"output {i}": y for i, y in enumerate(want_outs)}
    grads = {k: p.grad for k, p in dense.named_parameters()}  # experts' as the graph's
    want.update({f"grad {k}": g for k, g in stacked_parameters(grads, plan.graph).items()})
    want.update(
        {
            f"grad {s.arg.name}": x.grad
            for s, x in zip(specs, refs)
            if getattr(x, "grad", None) is not None
        }
    )
    errors = step_errors(
        {k: v.detach().double().numpy() for k, v in got.items()},
        {k: v.detach().double().numpy() for k, v in want.items() if v is not None},
    )
    with open(os.path.join(tmp, "errors.json"), "w") as f:
        json.dump(errors, f)
