"""The collectives a DTensor program runs, read as they are dispatched: kind, group, bytes, and the
edge or operator of the plan they serve.

DTensor issues every collective as one of PyTorch's functional collectives (``_c10d_functional``,
or ``_dtensor.shard_dim_alltoall`` for a shard-to-shard move); a dispatch mode sees each call with
its input and its process group's name, which gives the group's ranks and the bytes each device
puts in. Bytes received follow taps' volume model
(:func:`taps.verify.result.received_bytes`).

DTensor on a CPU mesh (gloo, or the fake process group with CPU or meta tensors) runs a
shard-to-shard move as an all-gather and a local chunk, gloo having no all-to-all; the recorder
notes that DTensor asked for an all-to-all there (what it runs on GPUs) and records one, with the
bytes an all-to-all of that block moves.

On one process of the fake process group only rank 0's group is seen; the others follow from the
device mesh (a DeviceMesh group is the ranks that differ only along some mesh dims).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from taps.export.distribute import Tracer
from taps.verify.result import Measured, received_bytes
from taps.verify.torch.values import import_torch

#: Per functional collective, its kind and the position of its process-group name argument.
_OPS = {
    "all_gather_into_tensor": ("all_gather", 2),
    "all_reduce": ("all_reduce", 2),
    "reduce_scatter_tensor": ("reduce_scatter", 3),
    "all_to_all_single": ("all_to_all", 3),
    "shard_dim_alltoall": ("all_to_all", 3),
}


def mesh_groups(group: Sequence[int], mesh_shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Every group of a mesh collective whose group holding rank 0 is ``group``: the ranks that
    share their coordinates along the mesh dims ``group`` does not vary."""
    n = int(np.prod(mesh_shape))
    coords = np.array(np.unravel_index(np.arange(n), tuple(mesh_shape))).T
    varying = {d for d in range(len(mesh_shape)) if len({coords[r][d] for r in group}) > 1}
    keep = [d for d in range(len(mesh_shape)) if d not in varying]
    out: dict[tuple[int, ...], list[int]] = {}
    for r in range(n):
        out.setdefault(tuple(coords[r][keep]), []).append(r)
    return tuple(sorted(tuple(g) for g in out.values()))


@cache
def _mark() -> Any:
    """The identity whose backward sets a recorder's scope (one class for every call)."""
    torch = import_torch()

    class Mark(torch.autograd.Function):  # type: ignore[misc,name-defined]
        @staticmethod
        def forward(ctx: Any, t: Any, recorder: Recorder, scope: str) -> Any:
            ctx.recorder, ctx.scope = recorder, scope
            return t.view_as(t)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            ctx.recorder.current = ctx.scope
            return grad, None, None

    return Mark


@dataclass
class Recorder(Tracer):
    """A :class:`~taps.export.distribute.Tracer` that records every collective with the scope
    (``"e<i>"`` for the redistribution of edge ``i``, ``"o<j>"`` for operator ``j``) and phase it
    runs in. In the backward pass the scope is the operator whose output gradient is being taken
    back (its own backward, its input redistributions' backward), set by :meth:`mark`.

    Attributes:
        edges: the edge index of each ``(consumer, slot)``; ``ops``: each operator's index.
        mesh_shape: to expand rank 0's group to all groups.
        measured: ``(scope, phase, collective)`` in the order they ran.
    """

    edges: dict[tuple[str, int], int]
    ops: dict[str, int]
    mesh_shape: tuple[int, ...]
    measured: list[tuple[str, str, Measured]] = field(default_factory=list)
    current: str = ""
    phase: str = "forward"
    in_all_to_all: int = 0

    @contextmanager
    def scope(self, kind: str, op: str, slot: int | None) -> Iterator[None]:
        before = self.current
        if kind == "edge" and (op, slot) in self.edges:
            self.current = f"e{self.edges[(op, slot)]}"  # type: ignore[index]
        elif kind == "op":
            self.current = f"o{self.ops[op]}"
        elif kind == "node":
            self.current = f"n:{op}"
        elif kind == "leaf":
            self.current = f"l:{op}#{slot}"
        try:
            yield
        finally:
            self.current = before

    def mark(self, x: Any, op: str) -> Any:
        """``x``, whose gradient sets the scope to operator ``op``'s as it flows back."""
        if not getattr(x, "requires_grad", False):
            return x
        return _mark().apply(x, self, f"o{self.ops[op]}")

    def record(self, name: str, args: Sequence[Any]) -> None:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group

        kind, where = _OPS[name]
        if self.in_all_to_all and kind == "all_gather":
            kind = "all_to_all"  # DTensor's shard-to-shard move on a CPU mesh (module doc)
        x = args[0]
        in_bytes = int(x.numel()) * int(x.element_size())
        ranks = tuple(sorted(dist.get_process_group_ranks(_resolve_process_group(args[where]))))
        g = len(ranks)
        self.measured.append(
            (
                self.current,
                self.phase,
                Measured(
                    kind,
                    f"{name}.{len(self.measured)}",
                    mesh_groups(ranks, self.mesh_shape),
                    g,
                    str(x.dtype).removeprefix("torch."),
                    in_bytes,
                    received_bytes(kind, in_bytes, g, int(x.element_size())),
                ),
            )
        )

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record every functional collective dispatched inside."""
        torch = import_torch()
        from torch.distributed.tensor import placement_types
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        wanted = {"_c10d_functional", "_dtensor", "_c10d_functional_autograd"}
        shard_to_shard = placement_types.shard_dim_alltoall

        def all_to_all(*args: Any, **kwargs: Any) -> Any:
            recorder.in_all_to_all += 1
            try:
                return shard_to_shard(*args, **kwargs)
            finally:
                recorder.in_all_to_all -= 1

        class Mode(TorchDispatchMode):  # type: ignore[misc]
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                packet = func._overloadpacket
                if packet.__name__ in _OPS and func.namespace in wanted:
                    recorder.record(packet.__name__, list(args) + list((kwargs or {}).values()))
                return func(*args, **(kwargs or {}))

        del torch
        placement_types.shard_dim_alltoall = all_to_all
        try:
            with Mode():
                yield
        finally:
            placement_types.shard_dim_alltoall = shard_to_shard
