"""Pipeline schedules in closed form: the step time of a pipeline of stages, bubble included, and
the microbatches whose activations each stage holds at once (docs/pipeline.md#schedules).

Stage ``k`` of ``K`` takes ``forward[k]`` and ``backward[k]`` seconds per microbatch and
``send[k]`` seconds to hand its activations to stage ``k + 1`` (as long for their gradients
back); a send delays the microbatch it carries, not the stages (it overlaps their compute).
``groups`` device groups run the stages, group ``g`` stages ``g, g + groups, ...`` (more than one
only under the interleaved schedule).

- **GPipe**: every stage runs every forward, then every backward. Each phase is a flow shop of
  identical jobs, so its time is exact: the sum over stages plus ``M - 1`` times the slowest.
- **1F1B** (PipeDream-flush, Megatron-LM's default): after a warm-up of ``groups - g - 1``
  forwards, group ``g`` alternates one forward and one backward. Its time is GPipe's bound on one
  (forward + backward) per stage: exact on stages of one time without sends (Narayanan et al.
  2021), the bubble ``(K - 1)`` stage times.
- **Interleaved 1F1B** (Megatron-LM's virtual pipeline, ``chunks`` stages per group): ``M``
  microbatches (a multiple of ``groups``) through the slowest group, plus a bubble of
  ``groups - 1`` stage times: ``(M * chunks + groups - 1)`` stage times, exact on stages of one
  time without sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from taps.errors import ArgumentError
from taps.plan.stages import SCHEDULES


def _checked(
    schedule: str, forward: Sequence[float], backward: Sequence[float], send: Sequence[float]
) -> None:
    if schedule not in SCHEDULES:
        raise ArgumentError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not forward or len(forward) != len(backward) or len(send) != len(forward):
        raise ArgumentError("a pipeline needs one forward, backward and send time per stage")


def step_time(
    schedule: str,
    forward: Sequence[float],
    backward: Sequence[float],
    send: Sequence[float],
    microbatches: int,
    groups: int | None = None,
) -> float:
    """Seconds of one step of ``microbatches`` through the stages under ``schedule`` (the module
    docstring gives the forms); ``groups`` defaults to one per stage."""
    _checked(schedule, forward, backward, send)
    m = microbatches
    stages = len(forward)
    groups = stages if groups is None else groups
    sends = 2 * sum(send[:-1])
    if schedule == "gpipe":
        return sum(forward) + sum(backward) + sends + (m - 1) * (max(forward) + max(backward))
    whole = [f + b for f, b in zip(forward, backward)]
    if schedule == "1f1b":
        return sum(whole) + sends + (m - 1) * max(whole)
    per_group = [sum(whole[g::groups]) for g in range(groups)]
    hops = sends * (groups - 1) / max(stages - 1, 1)
    return m * max(per_group) + (groups - 1) * max(whole) + hops


def in_flight(schedule: str, stage: int, groups: int, chunks: int, microbatches: int) -> float:
    """Microbatches whose activations stage ``stage`` holds at its peak under ``schedule``: under
    GPipe all of them; under 1F1B those of its warm-up and the one it runs, ``groups - stage``;
    interleaved, its group's warm-up (Megatron-LM's ``2 (groups - g - 1) + (chunks - 1) groups``
    chunk forwards) and one more, shared by the group's ``chunks`` stages (a fraction, as one
    chunk's activations are of the group's)."""
    if schedule == "gpipe":
        return float(microbatches)
    group = stage % groups
    if schedule == "1f1b":
        return float(min(groups - group, microbatches))
    warm = 2 * (groups - group - 1) + (chunks - 1) * groups + 1
    return min(warm, microbatches * chunks) / chunks
