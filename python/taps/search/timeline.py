"""The backward pass as engines run it: a compute stream that runs every operator's backward in
turn, and a communication stream that reduces parameters' gradients in buckets, each issued when
its last gradient is ready (torch DDP's gradient buckets; docs/search.md#the-step-time). Only the
part of the reductions that outlasts the compute stream is exposed."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

#: Bytes of gradients per bucket: torch DDP's default ``bucket_cap_mb=25`` (MiB).
BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class Gradient:
    """One gradient to reduce: ready when step ``step`` of the compute stream ends, reduced over
    ``group`` (gradients of one group may share a bucket), ``bytes`` per device."""

    step: int
    group: Hashable
    bytes: float


@dataclass(frozen=True)
class Bucket:
    """Gradients reduced by one collective: their indices, bytes per device, when the last was
    ready (``issued``), when the communication stream ran it, and how much of it ran after the
    compute stream had finished (``exposed``)."""

    group: Hashable
    members: tuple[int, ...]
    bytes: float
    issued: float
    start: float
    end: float
    exposed: float

    @property
    def cost(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Timeline:
    """The backward's two streams: ``compute_end`` when the compute stream finishes, ``end`` when
    both have, and the buckets in the order they ran."""

    compute_end: float
    end: float
    buckets: tuple[Bucket, ...]

    @property
    def exposed(self) -> float:
        """The reductions' time not hidden behind the compute stream."""
        return self.end - self.compute_end

    @property
    def reductions(self) -> float:
        """The communication stream's busy time: every bucket's cost."""
        return sum(b.cost for b in self.buckets)


def buckets_of(
    gradients: Sequence[Gradient], bucket_bytes: float = BUCKET_BYTES
) -> list[tuple[Hashable, list[int]]]:
    """The gradients packed into buckets as DDP packs them: in the order they become ready, each
    group filling its own bucket, which closes once it holds ``bucket_bytes`` or more; the last
    bucket of each group takes what is left. Buckets are listed in the order they close."""
    order = sorted(range(len(gradients)), key=lambda i: gradients[i].step)
    filling: dict[Hashable, tuple[list[int], float]] = {}
    closed: list[tuple[float, Hashable, list[int]]] = []
    for i in order:
        g = gradients[i]
        members, size = filling.get(g.group, ([], 0.0))
        members.append(i)
        size += g.bytes
        if size >= bucket_bytes:
            closed.append((g.step, g.group, members))
            filling.pop(g.group, None)
        else:
            filling[g.group] = (members, size)
    for group, (members, _) in filling.items():
        closed.append((gradients[members[-1]].step, group, members))
    closed.sort(key=lambda c: c[0])  # stable: a group's own buckets stay in order
    return [(group, members) for _, group, members in closed]


def backward_timeline(
    durations: Sequence[float],
    gradients: Sequence[Gradient],
    cost: Callable[[Hashable, float], float],
    bucket_bytes: float = BUCKET_BYTES,
) -> Timeline:
    """Run the backward: the compute stream takes ``durations`` in order; each bucket
    (:func:`buckets_of`) is issued when the step of its last gradient ends and runs on the
    communication stream, one at a time in the order issued, taking ``cost(group, bytes)``."""
    ends: list[float] = []
    clock = 0.0
    for d in durations:
        clock += d
        ends.append(clock)
    compute_end = clock
    stream = 0.0
    out = []
    for group, members in buckets_of(gradients, bucket_bytes):
        size = sum(gradients[i].bytes for i in members)
        issued = ends[gradients[members[-1]].step]
        start = max(stream, issued)
        stream = start + cost(group, size)
        exposed = max(0.0, stream - max(start, compute_end))
        out.append(Bucket(group, tuple(members), size, issued, start, stream, exposed))
    return Timeline(compute_end, max(compute_end, stream), tuple(out))
