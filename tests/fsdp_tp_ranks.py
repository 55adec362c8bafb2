"""One gloo rank of tests/test_fsdp_torch.py's numbers check (run by
:func:`taps.verify.torch.ranks.run_ranks`): the module materialised once with seeded values,
then on each rank ``fully_shard_plan`` (FSDP over the data-parallel mesh dim, tensor parallelism
over the other) run forward and backward on the rank's batch; rank 0 compares the gathered
output and every parameter's gathered gradient with the dense module's and writes the errors."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import taps
from taps.export.fsdp import fully_shard_plan
from taps.verify.result import step_errors
from taps.verify.torch.values import cast_inputs, materialize, token_bound


def prepare(payload: tuple[Any, ...]) -> tuple[Any, ...]:
    """The plan, the dense module and the token ids with values, shared by every rank."""
    module, ids, plan_json, tmp = payload
    (values,) = cast_inputs([ids], torch.float32, "cpu", 0, token_bound(module))
    dense = materialize(module, torch.float32, "cpu", 0)
    return taps.Plan.from_json(plan_json), dense, values, tmp


def run_rank(rank: int, ranks: int, state: tuple[Any, ...]) -> None:
    """One rank's step (module doc); the batch split over mesh dim ``d1``."""
    plan, dense, ids, tmp = state
    dist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank, world_size=ranks
    )
    try:
        shape = taps.export.to_dtensor(plan).mesh
        mesh = init_device_mesh("cpu", shape.shape, mesh_dim_names=shape.axis_names)
        model = copy.deepcopy(dense)
        fully_shard_plan(model, plan, mesh)
        data = mesh["d1"]
        rows = ids.shape[0] // data.size()
        mine = slice(data.get_local_rank() * rows, (data.get_local_rank() + 1) * rows)
        with torch.no_grad():
            cotangent = torch.randn(dense(ids).shape, generator=torch.Generator().manual_seed(1))
        out = model(ids[mine])
        (out * cotangent[mine]).sum().backward()
        pieces = [torch.empty_like(out) for _ in range(data.size())]
        dist.all_gather(pieces, out.detach().contiguous(), group=data.get_group())
        got = {"output 0": torch.cat(pieces)}
        got.update({f"grad {n}": p.grad.full_tensor() for n, p in model.named_parameters()})
        if rank != 0:
            return
        want_out = dense(ids)
        # FSDP averages the gradients over the data-parallel ranks: the mean of their losses.
        ((want_out * cotangent).sum() / data.size()).backward()
        want = {"output 0": want_out, **{f"grad {n}": p.grad for n, p in dense.named_parameters()}}
        errors = step_errors(
            {k: v.detach().double().numpy() for k, v in got.items()},
            {k: v.detach().double().numpy() for k, v in want.items()},
        )
        with open(os.path.join(tmp, "errors.json"), "w") as f:
            json.dump(errors, f)
    finally:
        dist.destroy_process_group()
