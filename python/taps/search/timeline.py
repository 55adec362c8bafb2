"""The forward and backward passes as engines run them: a compute stream that runs every
operator's forward or backward in turn, and a communication stream that reduces parameters'
gradients in buckets, each issued when its last gradient is ready (torch DDP's gradient buckets;
docs/search.md#the-step-time), and a gather stream that gathers the parameters stored sharded
(FSDP), each issued when the step before the one that needs it starts (FSDP2's prefetch of the
next all_gather during the current compute; docs/search.md#parameter-storage-sharding). Each
communication stream runs what it is given in the order it was issued. Only the part of the
communication that outlasts the compute stream, or that it waits for, is exposed."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

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
    """The two streams: ``compute_end`` when the compute stream finishes, ``end`` when both
    have, the buckets in the order they ran, and per step how long its compute waited for its
    gather (``waits``)."""

    compute_end: float
    end: float
    buckets: tuple[Bucket, ...]
    waits: tuple[float, ...] = ()

    @property
    def exposed(self) -> float:
        """The communication the compute stream does not hide: the waits for gathers and what
        runs after the compute stream has finished."""
        return self.end - self.compute_end + sum(self.waits)

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
    gathers: Sequence[float] = (),
) -> Timeline:
    """Run the backward: the compute stream takes ``durations`` in order; each bucket
    (:func:`buckets_of`) is issued when the step of its last gradient ends and runs on the
    communication stream, one at a time in the order issued, taking ``cost(group, bytes)``.
    ``gathers`` (seconds per step, 0 or missing: none) are the all_gathers a step's compute waits
    for, each issued when the step before it starts (the first at once), so that it runs while
    that step computes; they run one at a time on a stream of their own, as FSDP2 issues them
    (its all-gather stream), alongside the reductions (taken not to slow each other)."""
    closing: dict[int, list[tuple[Hashable, list[int]]]] = {}
    for group, members in buckets_of(gradients, bucket_bytes):
        closing.setdefault(gradients[members[-1]].step, []).append((group, members))
    gather = [*gathers, *[0.0] * (len(durations) - len(gathers))]
    clock = stream = 0.0
    # The gathers have their own stream (FSDP2's all-gather stream), one at a time.
    ready = [0.0] * len(durations)  # when each step's gather has arrived
    if gather and gather[0]:
        ready[0] = gathering = gather[0]
    else:
        gathering = 0.0
    waits: list[float] = []
    out = []
    for k, d in enumerate(durations):
        start = max(clock, ready[k])
        waits.append(start - clock)
        if k + 1 < len(durations) and gather[k + 1]:
            # The next step's gather, prefetched as this one starts.
            ready[k + 1] = gathering = max(gathering, start) + gather[k + 1]
        clock = start + d
        for group, members in closing.get(k, []):
            size = sum(gradients[i].bytes for i in members)
            begin = max(stream, clock)
            stream = begin + cost(group, size)
            out.append(Bucket(group, tuple(members), size, clock, begin, stream, 0.0))
    compute_end = clock
    buckets = tuple(replace(b, exposed=max(0.0, b.end - max(b.start, compute_end))) for b in out)
    return Timeline(compute_end, max(compute_end, stream), buckets, tuple(waits))
