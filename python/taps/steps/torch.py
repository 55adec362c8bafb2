"""taps' steps as PyTorch functional collectives, on a rank's local block: each step one
collective over the ranks that differ only along its device dims, however many mesh dims those
span (DTensor's ``redistribute`` runs one collective per mesh dim).

A group of several mesh dims is the flattened sub-mesh of those dims, outermost first, so a
rank's position in it is its coordinate along the step's device dim in taps' order. The sums
taps prices as all_reduces come in two forms with autograd: :meth:`Steps.sum` (the forward
partial sum: summed forward, the gradient passed back unchanged) and :meth:`Steps.sum_grad`
(the gradient of an input replicated where its operator splits: passed forward, the gradient
summed). The training step's own backward (docs/verify.md) is :meth:`Steps.edge` (an edge's
forward plan, its backward plan on the gradient), :meth:`Steps.gradient_sync` (a parameter's
gradient all_reduce, or ZeRO's reduce_scatter and all_gather), :meth:`Steps.add_once` (an
addend on partial sums) and, for a parameter stored sharded (FSDP), :meth:`Steps.stored` (its
piece all-gathered, the gradient reduce-scattered) with :meth:`Steps.before_backward` (the
gather again before the operator's backward).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
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
            return _wait(funcol.reduce_scatter_single_autograd(x, "sum", op.tensor_dim, group))
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
            whole = _wait(funcol.all_gather_single_autograd(x.contiguous(), concat, group))
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

    def edge(
        self,
        x: Any,
        forward: Redistribution,
        backward: Redistribution | None,
        scope: Callable[[], AbstractContextManager[Any]],
    ) -> Any:
        """A block of ``forward``'s source taken by its steps to the target's block; backward,
        the gradient (in ``backward``'s source layout: the consumer's gradient, partial where it
        is summed) taken by ``backward``'s steps to the source's layout (zeros without one),
        inside ``scope()``."""
        return _training("edge").apply(x, self, forward, backward, scope)

    def gradient_sync(
        self,
        x: Any,
        axes: tuple[str, ...],
        zero: bool,
        scope: Callable[[], AbstractContextManager[Any]],
    ) -> Any:
        """``x`` unchanged; its gradient all_reduced over ``axes`` inside ``scope()``, or with
        ``zero`` reduce_scattered and all_gathered (flattened, padded to a multiple of the group
        as ZeRO implementations do)."""
        if not axes:
            return x
        return _training("sync").apply(x, self.group(axes), zero, scope)

    def piece(self, block: Any, axes: tuple[str, ...]) -> Any:
        """This rank's piece of ``block`` stored sharded (FSDP) over ``axes``: dim 0 padded with
        zeros to a multiple of the group, cut, the piece at the rank's place in the group."""
        group = self.group(axes)
        g = group.size()
        rows = -(-block.shape[0] // g)
        return _padded(block, rows * g).narrow(0, group.get_local_rank() * rows, rows)

    def stored(
        self,
        shard: Any,
        axes: tuple[str, ...],
        rows: int,
        scope: Callable[[], AbstractContextManager[Any]],
    ) -> Any:
        """The block of ``rows`` rows whose piece over ``axes`` is ``shard`` (:meth:`piece`),
        all-gathered; its gradient reduce-scattered (padded) to the piece. Both inside
        ``scope()``."""
        return _training("stored").apply(shard, self.group(axes), rows, scope)

    def gathered(self, shard: Any, axes: tuple[str, ...], rows: int) -> Any:
        """The block whose piece over ``axes`` is ``shard``, all-gathered (no gradient)."""
        return _gather(shard, 0, self.group(axes)).narrow(0, 0, rows)

    def before_backward(self, y: Any, fetch: Callable[[], None]) -> Any:
        """``y`` unchanged; ``fetch()`` runs when its gradient arrives, before the backward of
        what made it (FSDP's pre-backward gather)."""
        return _training("pre").apply(y, fetch)

    def add_once(self, y: Any, addend: Any, axes: tuple[str, ...]) -> Any:
        """``y + addend`` where the ranks along ``axes`` hold partial sums of ``y``: the addend
        on the first of each group only, so that the sum counts it once; its gradient is the
        output's on every rank."""
        if not axes:
            return y + addend
        return y + _training("once").apply(addend, self.group(axes))


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


def _zero_sync(grad: Any, group: Any) -> Any:
    """ZeRO's reduce_scatter of the flattened gradient and all_gather of the shards."""
    funcol = _funcol()
    flat = grad.reshape(-1)
    pad = -flat.numel() % group.size()
    if pad:
        flat = _torch().cat([flat, flat.new_zeros(pad)])
    shard = _wait(funcol.reduce_scatter_single(flat.contiguous(), "sum", 0, group))
    whole = _wait(funcol.all_gather_single(shard.contiguous(), 0, group))
    return whole[: grad.numel()].reshape(grad.shape)


def _padded(x: Any, rows: int) -> Any:
    """``x`` with zero rows appended along dim 0 up to ``rows``."""
    pad = rows - x.shape[0]
    return _torch().cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x


def _training(kind: str) -> Any:
    """The autograd functions of the training step (:meth:`Steps.edge`,
    :meth:`Steps.gradient_sync`, :meth:`Steps.add_once`), made once."""
    key = f"training {kind}"
    if key in _CACHE:
        return _CACHE[key]
    torch = _torch()
    Function = torch.autograd.Function

    class Edge(Function):  # type: ignore[misc,valid-type]
        @staticmethod
        def forward(
            ctx: Any, x: Any, steps: Steps, fwd: Redistribution, back: Any, scope: Any
        ) -> Any:
            ctx.steps, ctx.back, ctx.scope, ctx.shape = steps, back, scope, tuple(x.shape)
            out = steps.walk(x, fwd)
            return out.clone() if out._base is x or out is x else out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            if ctx.back is None:
                return grad.new_zeros(ctx.shape), None, None, None, None
            with ctx.scope():
                out = ctx.steps.walk(grad.contiguous(), ctx.back)
            return out.reshape(ctx.shape), None, None, None, None

    class Sync(Function):  # type: ignore[misc,valid-type]
        @staticmethod
        def forward(ctx: Any, x: Any, group: Any, zero: bool, scope: Any) -> Any:
            ctx.group, ctx.zero, ctx.scope = group, zero, scope
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            with ctx.scope():
                if ctx.zero:
                    out = _zero_sync(grad.contiguous(), ctx.group)
                else:
                    out = _all_reduce(grad, ctx.group)
            return out, None, None, None

    class Once(Function):  # type: ignore[misc,valid-type]
        @staticmethod
        def forward(ctx: Any, b: Any, group: Any) -> Any:
            return b.clone() if group.get_local_rank() == 0 else torch.zeros_like(b)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad, None

    class Stored(Function):  # type: ignore[misc,valid-type]
        @staticmethod
        def forward(ctx: Any, shard: Any, group: Any, rows: int, scope: Any) -> Any:
            ctx.group, ctx.scope = group, scope
            with scope():
                return _gather(shard, 0, group).narrow(0, 0, rows)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            group = ctx.group
            whole = _padded(grad, -(-grad.shape[0] // group.size()) * group.size())
            with ctx.scope():
                out = _wait(_funcol().reduce_scatter_single(whole.contiguous(), "sum", 0, group))
            return out, None, None, None

    class Pre(Function):  # type: ignore[misc,valid-type]
        @staticmethod
        def forward(ctx: Any, y: Any, fetch: Any) -> Any:
            ctx.fetch = fetch
            return y.view_as(y)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            ctx.fetch()
            return grad, None

    _CACHE.update(
        {
            "training edge": Edge,
            "training sync": Sync,
            "training once": Once,
            "training stored": Stored,
            "training pre": Pre,
        }
    )
    return _CACHE[key]
