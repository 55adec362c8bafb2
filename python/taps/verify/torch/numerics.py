"""A taps plan's numbers on real PyTorch ranks: the module distributed by
:func:`taps.export.distribute_module` (taps' steps replayed) on a few gloo processes on this
machine's CPU, run forward and backward, its output and every parameter's (and every input's)
gradient compared with the dense module run on the same values.

Each rank is a fresh Python process (``python -m taps.verify.torch.numerics DIR RANK RANKS``:
the module, the inputs and the plan are pickled in DIR; start-up is most of the time, so keep the
rank count small); rank 0 writes the errors to a file the caller reads.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from taps._core import Cluster
from taps.errors import VerifyError
from taps.export.distribute import distribute_module
from taps.plan.layouts import layouts_of
from taps.plan.plan import Plan
from taps.verify.result import relative_error
from taps.verify.torch.values import (
    backward,
    cast_inputs,
    materialize,
    replaying,
    token_bound,
    torch_dtype,
    user_specs,
)

#: The rank counts a numerics run takes (gloo processes on one machine).
RANKS = (4, 8)


def numerics_plan(plan: Plan, ranks: int) -> Plan:
    """The plan the numbers are checked on: ``plan`` when its cluster has ``ranks`` devices,
    else taps' plan for ``ranks`` devices on one node, with the same pricing."""
    if ranks not in RANKS:
        raise VerifyError(f"a numerics run takes {' or '.join(map(str, RANKS))} ranks, not {ranks}")
    if plan.cluster.num_devices == ranks:
        return plan
    from taps.search.searching import search

    return search(plan.graph, Cluster(1, ranks), plan.pricing).plan


def run_ranks(main: str, tmp: str, ranks: int) -> None:
    """Run ``python -m main tmp rank ranks`` for every rank at once and wait for them all; a rank
    that fails raises a VerifyError with the last line it printed."""
    # The module's class must import in the children as it does here.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", main, tmp, str(rank), str(ranks)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    failed = [(p.wait(), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in failed:
        if code:
            tail = (err.strip().splitlines() or ["no output"])[-1]
            raise VerifyError(f"a gloo rank failed: {tail.removeprefix('taps.errors.')}")


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


def _rank(rank: int, ranks: int, payload: tuple[Any, ...]) -> None:
    """One rank: the plan and the dense module run, the errors written by rank 0."""
    import torch
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh

    module, inputs, plan_json, dtype, seed, tmp = payload
    tdist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank, world_size=ranks
    )
    try:
        plan = Plan.from_json(plan_json)
        layouts = layouts_of(plan)
        tdtype = torch_dtype(dtype)
        dense = materialize(module, tdtype, "cpu", seed)
        xs = cast_inputs(inputs, tdtype, "cpu", seed, token_bound(module))
        mesh = init_device_mesh("cpu", layouts.mesh.shape, mesh_dim_names=layouts.mesh.axis_names)
        dist = distribute_module(dense, plan, *xs, mesh=mesh, mode="taps")
        specs = user_specs(dist)
        placed = [dist.distribute_input(s.arg.name, x) for s, x in zip(specs, xs)]
        outs = dist(*placed)
        cts = backward(dist, outs, seed)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        got = {f"output {i}": y.full_tensor() for i, y in enumerate(outs)}
        for name in [*dist.parameters, *(s.arg.name for s in specs)]:
            grad = dist.grad(name)
            if grad is not None:
                got[f"grad {name}"] = grad.full_tensor()
        # The dense run on the same values.
        refs = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
        want_outs = dense(*refs)
        want_outs = list(want_outs) if isinstance(want_outs, (list, tuple)) else [want_outs]
        pairs = [(y, c) for y, c in zip(want_outs, cts) if c is not None]
        torch.autograd.backward([y for y, _ in pairs], [c for _, c in pairs])
        want = {f"output {i}": y for i, y in enumerate(want_outs)}
        want.update({f"grad {k}": p.grad for k, p in dense.named_parameters()})
        want.update(
            {f"grad {s.arg.name}": x.grad for s, x in zip(specs, refs) if x.grad is not None}
        )
        errors = {
            k: relative_error(v.detach().double().numpy(), want[k].detach().double().numpy())
            for k, v in got.items()
        }
        if rank == 0:
            with open(os.path.join(tmp, "errors.json"), "w") as f:
                json.dump(errors, f)
    finally:
        tdist.destroy_process_group()


if __name__ == "__main__":
    with open(os.path.join(sys.argv[1], "payload.pkl"), "rb") as f, replaying():
        _rank(int(sys.argv[2]), int(sys.argv[3]), pickle.load(f))
