"""taps' steps as PyTorch functional collectives, on a rank's local block: each step one
collective over the ranks that differ only along its device dims, however many mesh dims those
span (DTensor's ``redistribute`` runs one collective per mesh dim).

A group of several mesh dims is the flattened sub-mesh of those dims, outermost first, so a
rank's position in it is its coordinate along the step's device dim in taps' order. The sums
taps prices as all_reduces come in two forms with autograd: :meth:`Steps.sum` (the forward
partial sum: summed forward, the gradient passed back unchanged) and :meth:`Steps.sum_grad`
(the gradient of an input replicated where its operator splits: passed forward, the gradient
summed).
"""

from __future__ import annotations

from typing import Any

from taps._core import CommOp, Redistribution
from taps.errors import ExportError
from taps.plan.mesh import Mesh


def _funcol() -> Any:
    import torch.distributed._functional_collectives as funcol

    return funcol


def _wait(x: Any) -> Any:
    return _funcol().wait_tensor(x) if hasattr(x, "elem") else x


class Steps:
    """Collectives over groups of mesh dims of ``device_mesh`` (a torch ``DeviceMesh`` of
    ``mesh.shape``)."""

    def __init__(self, mesh: Mesh, device_mesh: Any) -> None:
        self.mesh, self.device_mesh = mesh, device_mesh
        self._groups: dict[tuple[str, ...], Any] = {}

    def group(self, axes: tuple[str, ...]) -> Any:
        """The 1-D mesh over ``axes`` (flattened when several)."""
        if axes not in self._groups:
            sub = self.device_mesh[axes]
            self._groups[axes] = sub._flatten() if len(axes) > 1 else sub
        return self._groups[axes]

    def step_axes(self, op: CommOp) -> tuple[str, ...]:
        return self.mesh.group_axes(op.layout, [op.device_dim])

    def run(self, x: Any, op: CommOp) -> Any:
        """One redistribution step on a local block in ``op.layout``'s shard shape."""
        axes = self.step_axes(op)
        group = self.group(axes)
        funcol = _funcol()
        if op.kind == "slice":
            return _autograd("slice").apply(x, op.tensor_dim, group)
        if op.kind == "all_gather":
            return _autograd("all_gather").apply(x, op.tensor_dim, group)
        if op.kind == "all_to_all":
            return self.all_to_all(x, op.to_tensor_dim, op.tensor_dim, group)  # type: ignore[arg-type]
        if op.kind == "reduce_scatter":
            return _wait(funcol.reduce_scatter_tensor_autograd(x, "sum", op.tensor_dim, group))
        if op.kind == "all_reduce":
            return self.sum(x, axes)
        raise ExportError(f"no PyTorch form for the step kind {op.kind!r}")

    def all_to_all(self, x: Any, split: int, concat: int, group: Any) -> Any:
        """Split ``x`` along ``split`` into one block per rank, send block ``i`` to rank ``i``,
        and concatenate what arrives along ``concat``."""
        torch, funcol = _torch(), _funcol()
        g = group.size()
        if x.device.type == "cpu":
            # gloo has no all-to-all: gather, then keep this rank's block.
            whole = _wait(funcol.all_gather_tensor_autograd(x.contiguous(), concat, group))
            return _block(whole, split, group).contiguous()
        blocks = torch.stack(x.chunk(g, dim=split))
        out = _wait(funcol.all_to_all_single_autograd(blocks.contiguous(), None, None, group))
        return torch.cat(list(out.unbind(0)), dim=concat)

    def walk(self, x: Any, plan: Redistribution) -> Any:
        """A local block of the plan's source (in its shard shape, graph dim order) taken by
        every step of the plan to its block of the target (in the target's shard shape)."""
        for op in plan.all_ops:
            x = self.run(x.reshape(op.layout.shard_shape), op)
        return x.reshape(plan.target.shard_shape)

    def sum(self, x: Any, axes: tuple[str, ...]) -> Any:
        """``x`` summed over ``axes`` (the gradient passes back unchanged)."""
        return _sum_forward().apply(x, self.group(axes)) if axes else x

    def sum_grad(self, x: Any, axes: tuple[str, ...]) -> Any:
        """``x`` unchanged, its gradient summed over ``axes``."""
        return _sum_backward().apply(x, self.group(axes)) if axes else x


def _torch() -> Any:
    import torch

    return torch


def _all_reduce(x: Any, group: Any) -> Any:
    return _wait(_funcol().all_reduce(x.contiguous(), "sum", group))


def _block(x: Any, dim: int, group: Any) -> Any:
    """This rank's block of ``x`` split along ``dim`` over ``group``."""
    size = x.shape[dim] // group.size()
    return x.narrow(dim, group.get_local_rank() * size, size)


def _gather(x: Any, dim: int, group: Any) -> Any:
    return _wait(_funcol().all_gather_single(x.contiguous(), dim, group))


_CACHE: dict[str, Any] = {}


def _autograd(kind: str) -> Any:
    """A slice whose gradient is all-gathered and an all-gather whose gradient is sliced: the
    gathered block is the same on every rank of the group, and so is its gradient (as JAX's
    replicated all-gather); a sliced block's gradient is every rank's piece of the whole."""
    if kind not in _CACHE:
        torch = _torch()
        forward, backward = (_block, _gather) if kind == "slice" else (_gather, _block)

        class Step(torch.autograd.Function):  # type: ignore[misc,name-defined]
            @staticmethod
            def forward(ctx: Any, x: Any, dim: int, group: Any) -> Any:
                ctx.dim, ctx.group = dim, group
                return forward(x, dim, group).contiguous()

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return backward(grad, ctx.dim, ctx.group).contiguous(), None, None

        _CACHE[kind] = Step
    return _CACHE[kind]


def _sum_forward() -> Any:
    if "forward" not in _CACHE:
        torch = _torch()

        class SumForward(torch.autograd.Function):  # type: ignore[misc,name-defined]
            @staticmethod
            def forward(ctx: Any, x: Any, group: Any) -> Any:
                return _all_reduce(x, group)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad, None

        _CACHE["forward"] = SumForward
    return _CACHE["forward"]


def _sum_backward() -> Any:
    if "backward" not in _CACHE:
        torch = _torch()

        class SumBackward(torch.autograd.Function):  # type: ignore[misc,name-defined]
            @staticmethod
            def forward(ctx: Any, x: Any, group: Any) -> Any:
                ctx.group = group
                return x.view_as(x)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return _all_reduce(grad, ctx.group), None

        _CACHE["backward"] = SumBackward
    return _CACHE["backward"]
