"""The schedules' closed forms (taps.search.schedules) against a plain event simulation of each
schedule: every device runs its list of forwards and backwards in order, each as soon as its
device is free and its inputs have arrived (a second implementation, not the formula)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from taps.search.schedules import in_flight, step_time


def _orders(schedule: str, groups: int, chunks: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per device group, its (kind, stage, microbatch) in the order it runs them."""
    out = []
    for g in range(groups):
        if schedule == "gpipe":
            out.append([("F", g, j) for j in range(m)] + [("B", g, j) for j in range(m)])
            continue
        total = m * chunks

        def fwd(i: int, g: int = g) -> tuple[str, int, int]:
            chunk = (i // groups) % chunks
            return ("F", chunk * groups + g, (i // (groups * chunks)) * groups + i % groups)

        def bwd(i: int, g: int = g) -> tuple[str, int, int]:
            chunk = chunks - 1 - (i // groups) % chunks
            return ("B", chunk * groups + g, (i // (groups * chunks)) * groups + i % groups)

        if schedule == "1f1b":
            warm = min(groups - g - 1, m)
        else:
            warm = min(2 * (groups - g - 1) + (chunks - 1) * groups, total)
        seq = [fwd(i) for i in range(warm)]
        done_f, done_b = warm, 0
        while done_f < total:
            seq += [fwd(done_f), bwd(done_b)]
            done_f += 1
            done_b += 1
        seq += [bwd(i) for i in range(done_b, total)]
        out.append(seq)
    return out


def simulate(schedule, forward, backward, send, m, groups, chunks=1):
    """The step's end, and per device group the most microbatch-stages it holds at once."""
    stages = len(forward)
    orders = _orders(schedule, groups, chunks, m)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * groups
    at = [0] * groups
    held = [0] * groups
    peak = [0] * groups
    moved = True
    while moved:
        moved = False
        for g in range(groups):
            while at[g] < len(orders[g]):
                kind, k, j = orders[g][at[g]]
                if kind == "F":
                    ready = 0.0 if k == 0 else done.get(("F", k - 1, j))
                    if ready is None:
                        break
                    ready += send[k - 1] if k else 0.0
                    end = max(free[g], ready) + forward[k]
                    held[g] += 1
                    peak[g] = max(peak[g], held[g])
                else:
                    ready = done.get(("F", k, j)) if k == stages - 1 else done.get(("B", k + 1, j))
                    if ready is None:
                        break
                    ready += send[k] if k < stages - 1 else 0.0
                    end = max(free[g], ready) + backward[k]
                    held[g] -= 1
                done[(kind, k, j)] = end
                free[g] = end
                at[g] += 1
                moved = True
    assert all(at[g] == len(orders[g]) for g in range(groups)), "the schedule deadlocked"
    return max(free), peak


times = st.floats(0.1, 5.0)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 6), st.integers(1, 9))
def test_gpipe_is_exact_on_any_stages(data, stages, m):
    """GPipe's two flow shops: exact on stages of any times, sends included."""
    f = data.draw(st.lists(times, min_size=stages, max_size=stages))
    b = data.draw(st.lists(times, min_size=stages, max_size=stages))
    c = [*data.draw(st.lists(st.floats(0, 1), min_size=stages - 1, max_size=stages - 1)), 0.0]
    sim, peak = simulate("gpipe", f, b, c, m, stages)
    assert math.isclose(step_time("gpipe", f, b, c, m), sim, rel_tol=1e-9)
    assert peak == [in_flight("gpipe", k, stages, 1, m) for k in range(stages)]


@settings(max_examples=200, deadline=None)
@given(times, times, st.integers(1, 6), st.integers(1, 9))
def test_1f1b_is_exact_on_balanced_stages(f, b, stages, m):
    sim, peak = simulate("1f1b", [f] * stages, [b] * stages, [0.0] * stages, m, stages)
    assert math.isclose(step_time("1f1b", [f] * stages, [b] * stages, [0.0] * stages, m), sim)
    assert math.isclose(sim, (m + stages - 1) * (f + b))
    assert peak == [in_flight("1f1b", k, stages, 1, m) for k in range(stages)]


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 6), st.integers(1, 9))
def test_1f1b_on_unbalanced_stages_is_bounded(data, stages, m):
    """On stages of different times the closed form is GPipe's bound of one (forward + backward)
    per stage: never below the slowest stage's ``m`` microbatches, nor the simulation by more
    than the fill and drain."""
    f = data.draw(st.lists(times, min_size=stages, max_size=stages))
    b = data.draw(st.lists(times, min_size=stages, max_size=stages))
    zero = [0.0] * stages
    sim, peak = simulate("1f1b", f, b, zero, m, stages)
    closed = step_time("1f1b", f, b, zero, m)
    slowest = max(x + y for x, y in zip(f, b))
    assert sim >= m * slowest - 1e-9 and closed >= m * slowest - 1e-9
    assert abs(closed - sim) <= sum(f) + sum(b) + 1e-9
    assert peak == [in_flight("1f1b", k, stages, 1, m) for k in range(stages)]


@settings(max_examples=150, deadline=None)
@given(times, times, st.sampled_from([2, 4]), st.integers(2, 3), st.integers(1, 4))
def test_interleaved_is_exact_on_balanced_stages(f, b, groups, chunks, rounds):
    m = groups * rounds
    k = groups * chunks
    sim, peak = simulate("interleaved-1f1b", [f] * k, [b] * k, [0.0] * k, m, groups, chunks)
    closed = step_time("interleaved-1f1b", [f] * k, [b] * k, [0.0] * k, m, groups)
    assert math.isclose(closed, sim)
    assert math.isclose(sim, (m * chunks + groups - 1) * (f + b))
    for g in range(groups):
        shares = [in_flight("interleaved-1f1b", s, groups, chunks, m) for s in range(g, k, groups)]
        assert math.isclose(sum(shares), peak[g])


def test_the_bubble_shrinks_with_microbatches_and_chunks():
    one = step_time("1f1b", [1.0] * 4, [2.0] * 4, [0.0] * 4, 4)
    more = step_time("1f1b", [1.0] * 4, [2.0] * 4, [0.0] * 4, 16) / 4
    inter = step_time("interleaved-1f1b", [0.5] * 8, [1.0] * 8, [0.0] * 8, 4, 4)
    assert one == 21.0 and more == 14.25 and inter == 16.5
