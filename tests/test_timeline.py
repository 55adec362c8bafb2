"""The backward's timeline (taps.search.timeline) against closed forms, and the search's additive
form of the overlap (taps.search.compute.overlapped_backward) against the timeline on random
chains: bounds, not equality."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taps.search.compute import overlapped_backward
from taps.search.timeline import BUCKET_BYTES, Gradient, backward_timeline, buckets_of


def _linear(group: object, size: float) -> float:
    """A reduction taking one second per byte (no latency)."""
    return size


def test_all_hidden() -> None:
    """Every reduction shorter than the next step's compute, the last step without gradients:
    nothing is exposed, and every bucket starts when it is issued."""
    durations = [3.0, 2.0, 4.0, 2.5]
    grads = [Gradient(k, "g", 2.0) for k in range(3)]
    t = backward_timeline(durations, grads, _linear, bucket_bytes=1.0)
    assert t.exposed == 0.0 and t.end == t.compute_end == sum(durations)
    assert [b.start for b in t.buckets] == [b.issued for b in t.buckets] == [3.0, 5.0, 9.0]


def test_none_hidden() -> None:
    """No compute: the step waits for every bucket, one after another."""
    grads = [Gradient(k, "g", float(k + 1)) for k in range(4)]
    t = backward_timeline([0.0] * 4, grads, _linear, bucket_bytes=1.0)
    assert t.exposed == pytest.approx(1 + 2 + 3 + 4)
    assert sum(b.exposed for b in t.buckets) == pytest.approx(t.exposed)


def test_one_bucket() -> None:
    """Everything in one bucket: issued when its last gradient is ready, exposed by what its
    reduction outlasts the compute left after that."""
    durations = [1.0, 1.0, 1.0, 5.0]
    grads = [Gradient(0, "g", 4.0), Gradient(2, "g", 3.0)]
    t = backward_timeline(durations, grads, _linear, bucket_bytes=1e9)
    (bucket,) = t.buckets
    assert bucket.members == (0, 1) and bucket.issued == 3.0
    assert t.exposed == pytest.approx(max(0.0, 7.0 - 5.0))


def test_buckets_as_ddp_packs_them() -> None:
    """In ready order, a bucket closing once it reaches the cap (25 MiB by default); groups fill
    their own buckets; a group's last bucket takes the rest."""
    mib = 1024 * 1024
    grads = [
        Gradient(0, "a", 20 * mib),
        Gradient(1, "b", 30 * mib),
        Gradient(2, "a", 10 * mib),
        Gradient(3, "a", 1 * mib),
        Gradient(3, "b", 1 * mib),
    ]
    assert 25 * mib == BUCKET_BYTES
    assert buckets_of(grads) == [("b", [1]), ("a", [0, 2]), ("a", [3]), ("b", [4])]


def _exposed_unbucketed(durations: list[float], reductions: list[float]) -> float:
    grads = [Gradient(k, "g", r) for k, r in enumerate(reductions) if r > 0]
    return backward_timeline(durations, grads, _linear, bucket_bytes=0.0).exposed


_chains = st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(_chains, st.floats(0, 40))
def test_additive_form_bounds_the_timeline(chain: list[tuple[float, float]], cap: float) -> None:
    """On a random chain (each operator's backward ``d`` and gradient reduction ``r``, in backward
    order), the additive form ``sum(max(d, r)) - sum(d)`` the search minimises bounds the
    timeline's exposed time from above up to one reduction (the longest ``min(d, r)``), never
    exceeds all the reductions, and bucketing only delays reductions (more exposed, never more
    than all of them)."""
    durations = [d for d, _ in chain]
    reductions = [r for _, r in chain]
    d, r = np.array(durations), np.array(reductions)
    additive = float(np.sum(overlapped_backward(d, r) - d))
    exposed = _exposed_unbucketed(durations, reductions)
    eps = 1e-9 * (1 + r.sum() + d.sum())
    assert exposed <= additive + float(np.max(np.minimum(d, r))) + eps
    assert additive <= r.sum() + eps and exposed <= r.sum() + eps
    assert exposed >= r[-1] - eps  # the last gradient has no compute left to hide behind
    grads = [Gradient(k, "g", x) for k, x in enumerate(reductions) if x > 0]
    bucketed = backward_timeline(durations, grads, _linear, bucket_bytes=cap).exposed
    assert exposed - eps <= bucketed <= r.sum() + eps
