"""A pipelined plan run on real PyTorch ranks: the module split and distributed by
:func:`taps.export.pipeline.to_pipeline`, one gloo process per rank of the plan's cluster on this
machine's CPU, one step of the plan's schedule (``torch.distributed.pipelining``) with a sum loss
against a seeded random target; the loss and every parameter's gradient compared with the dense
module run on the whole batch, and the bytes each stage hands the next (activations) and the
previous (their gradients), counted at the stages' send operations, against taps' prediction:
every tensor made before a cut and read after it, whole, once per microbatch each way
(:func:`taps.search.pipeline.crossing_bytes`).

The ranks are processes forked from one fresh Python process (:mod:`.ranks`); each writes what
it measured to a directory the caller reads.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from taps.errors import VerifyError
from taps.plan.plan import Plan
from taps.plan.stages import microbatched
from taps.search.pipeline import crossing_bytes
from taps.verify.result import (
    DIFFERS,
    OK,
    TOLERANCE,
    UNPRICED,
    CollectiveCheck,
    VerifyResult,
    relative_error,
)
from taps.verify.torch.ranks import run_ranks

#: The most gloo processes a pipelined run starts (one per rank of the plan).
MAX_RANKS = 8


def predicted_sends(plan: Plan) -> list[int]:
    """Per cut (before stage ``k + 1``), taps' bytes across it each way in one step: every tensor
    made before it and read after it, whole, on each microbatch of each copy."""
    assert plan.pipeline is not None and plan.pipeline.microbatches is not None
    assert plan.pipeline.replicas is not None
    parts = plan.pipeline.microbatches * plan.pipeline.replicas
    per = crossing_bytes(microbatched(plan.graph, parts), [s.operators for s in plan.stages])
    return [int(b) * parts for b in per[:-1]]


def check_pipelined(plan: Plan) -> None:
    """A :class:`VerifyError` unless ``plan`` is a pipelined plan a gloo run can take."""
    if not isinstance(plan, Plan):
        raise TypeError(f"verify_pipeline needs a taps.Plan, got {type(plan).__name__}")
    if not plan.stages:
        raise VerifyError("the plan has no pipeline stages (search it with pipeline=True)")
    if plan.cluster.num_devices > MAX_RANKS:
        raise VerifyError(
            f"a pipelined gloo run starts one process per rank: the plan has "
            f"{plan.cluster.num_devices}, at most {MAX_RANKS} run here"
        )
    if plan.pricing.zero:
        raise VerifyError("a pipelined run keeps whole parameters per stage: ZeRO is not run")


def verify_pipeline(module: Any, inputs: Sequence[Any], plan: Plan, seed: int = 0) -> VerifyResult:
    """Run pipelined ``plan`` of ``module`` (a plan of ``taps.from_torch(module, *inputs)``) on
    gloo, one process per rank, float32: the loss and every parameter's gradient against the
    dense module's, and the bytes sent between stages against taps' prediction (rows of kind
    ``send``: per cut and direction, bytes per receiving device over the step)."""
    check_pipelined(plan)
    ranks = plan.cluster.num_devices
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="taps-pipe-") as tmp:
        with open(os.path.join(tmp, "payload.pkl"), "wb") as f:
            pickle.dump((module, list(inputs), plan.to_json(), seed, tmp), f)
        run_ranks(__name__, tmp, ranks)
        measured = []
        for rank in range(ranks):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                measured.append(json.load(f))
    errors: dict[str, float] = {}
    for m in measured:
        errors.update(m["errors"])
    rows = _send_rows(plan, measured)
    timings = {"run": time.perf_counter() - t0}
    return VerifyResult.judged(
        rows,
        errors,
        TOLERANCE["float32"],
        "torch",
        ranks,
        plan.cluster.devices_per_node,
        timings,
    )


def _send_rows(plan: Plan, measured: list[dict[str, Any]]) -> list[CollectiveCheck]:
    """A row per cut and direction: taps' bytes per receiving device, and each device's."""
    size = plan.stages[0].devices
    rows = []
    for k, whole in enumerate(predicted_sends(plan)):
        for phase, sender, what in (
            ("forward", k, f"stage {k} -> {k + 1}: activations"),
            ("backward", k + 1, f"stage {k + 1} -> {k}: their gradients"),
        ):
            got = {m["sent"][phase].get(str(sender), 0) for m in measured if sender in m["stages"]}
            one = got.pop() if len(got) == 1 else None
            predicted = whole // size
            status = OK if one == predicted else DIFFERS
            rows.append(CollectiveCheck(status, "send", 2, predicted, one, phase, what))
        extra = max((m["sent"]["unpriced"].get(str(k), 0) for m in measured), default=0)
        if extra:
            what = f"stage {k} -> {k + 1}: tensors taken without gradient (no graph tensor)"
            rows.append(CollectiveCheck(UNPRICED, "send", 2, None, extra, "forward", what))
    return rows


def run_rank(rank: int, ranks: int, payload: tuple[Any, ...]) -> None:
    """One rank: the dense module and its stage of the pipeline run, what it measured written."""
    import torch
    import torch.distributed as tdist

    from taps.export.pipeline import to_pipeline
    from taps.verify.torch.values import cast_inputs, materialize, token_bound

    module, inputs, plan_json, seed, tmp = payload
    tdist.init_process_group(
        "gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank, world_size=ranks
    )
    plan = Plan.from_json(plan_json)
    dense = materialize(module, torch.float32, "cpu", seed)
    xs = cast_inputs(inputs, torch.float32, "cpu", seed, token_bound(module))
    out = dense(*xs)  # the dense step (the split runs a copy of the module)
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
    loss = (out * target).sum()
    loss.backward()
    want = {name: p.grad for name, p in dense.named_parameters() if p.grad is not None}

    run = to_pipeline(dense, plan, *xs).build(rank, loss_fn=_sum_loss)
    sent: dict[str, dict[str, int]] = {"forward": {}, "backward": {}, "unpriced": {}}
    for stage in run.stages:
        _count_sends(stage, sent)
    losses: list[Any] = []
    place = run.place
    first, last = 0 in place.stages, len(plan.stages) - 1 in place.stages
    args = xs if first else ()
    kwargs: dict[str, Any] = {}
    if last:
        kwargs = {"target": target, "losses": losses}
    run.schedule.step(*args, **kwargs)
    errors: dict[str, float] = {}
    if place.rank == 0:
        if last:
            got = float(sum(x.detach() for x in losses))
            errors["loss"] = relative_error(got, float(loss.detach()))
        for dm in run.modules:
            for name, p in dm.parameters.items():
                if p.grad is None:
                    continue
                g = p.grad.full_tensor().detach().double().numpy()
                errors[f"grad {name}"] = relative_error(g, want[name].double().numpy())
    else:
        for dm in run.modules:  # full_tensor is collective over the stage's ranks
            for p in dm.parameters.values():
                if p.grad is not None:
                    p.grad.full_tensor()
    with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
        json.dump({"stages": list(place.stages), "sent": sent, "errors": errors}, f)


def _sum_loss(output: Any, target: Any) -> Any:
    """The loss the run takes: the output against a random target, summed (microbatches add up
    to the whole batch's)."""
    return (output * target).sum()


def _count_sends(stage: Any, sent: dict[str, dict[str, int]]) -> None:
    """Count the bytes of every tensor ``stage`` sends, by direction, at its send operations."""
    key = str(stage.stage_index)

    def counted(get: Any, phase: str) -> Any:
        def ops(chunk: int) -> Any:
            out = get(chunk)
            n = sum(op.tensor.numel() * op.tensor.element_size() for op in out)
            sent[phase][key] = sent[phase].get(key, 0) + n
            return out

        return ops

    def forward(chunk: int) -> Any:
        out = stage_fwd(chunk)
        # Tensors the next stage takes no gradient for (a mask, positions) are no activation
        # taps prices: counted apart.
        grads = stage.submod.grads
        for i, op in enumerate(out):
            phase = "forward" if len(grads) != len(out) or grads[i] else "unpriced"
            sent[phase][key] = (
                sent[phase].get(key, 0) + op.tensor.numel() * op.tensor.element_size()
            )
        return out

    stage_fwd = stage.get_fwd_send_ops
    stage.get_fwd_send_ops = forward
    stage.get_bwd_send_ops = counted(stage.get_bwd_send_ops, "backward")
