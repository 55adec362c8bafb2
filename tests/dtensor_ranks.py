"""A ``MAIN`` for :func:`taps.verify.torch.ranks.run_ranks` in the tests: a model family of
``tests/torch_factories.py`` given seeded values, distributed by ``distribute_module`` in
``mode="dtensor"`` (DTensor does every redistribution and runs every node) on gloo ranks, its
forward outputs (every tensor the module returns) compared by rank 0 with the dense module's."""

from __future__ import annotations

import json
import os
from typing import Any

import taps
import torch_factories
from taps.export import distribute_module, to_dtensor
from taps.export.distribute import export_module
from taps.frontends import from_torch
from taps.verify.result import relative_error
from taps.verify.torch.values import cast_inputs, materialize, token_bound


def prepare(payload: tuple[str, str]) -> tuple[Any, ...]:
    """The dense module (eval mode: BatchNorm by its running statistics, which every rank
    holds whole) and its inputs with values (images, token ids), its export and taps' plan for
    4 devices."""
    import torch

    factory, tmp = payload
    module, inputs = getattr(torch_factories, factory)()
    dense = materialize(module, torch.float32, "cpu", 0).eval()
    xs = tuple(cast_inputs(inputs, torch.float32, "cpu", 1, token_bound(dense)))
    plan = taps.search(from_torch(dense, *xs), taps.Cluster(1, 4)).plan
    return dense, xs, export_module(dense, *xs), plan, tmp


def run_rank(rank: int, ranks: int, state: tuple[Any, ...]) -> None:
    """One rank runs the distributed forward; rank 0 writes its error against the dense one."""
    import torch
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    dense, xs, exported, plan, tmp = state
    tdist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank, world_size=ranks
    )
    try:
        shape = to_dtensor(plan).mesh
        mesh = init_device_mesh("cpu", shape.shape, mesh_dim_names=shape.axis_names)
        dm = distribute_module(dense, plan, *xs, mesh=mesh, mode="dtensor", exported=exported)
        with torch.no_grad():
            got = dm(*xs)
            got = [
                x.full_tensor() if isinstance(x, DTensor) else x
                for x in (got if isinstance(got, list) else [got])
            ]
            want = tree_leaves(dense(*xs))
        if rank == 0:
            assert len(got) == len(want), (len(got), len(want))
            errors = [relative_error(g.numpy(), w.numpy()) for g, w in zip(got, want)]
            with open(os.path.join(tmp, "errors.json"), "w") as f:
                json.dump({"output": max(errors)}, f)
    finally:
        tdist.destroy_process_group()
