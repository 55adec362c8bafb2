"""Steady pieces: connected sets of operators whose memory is the same for every candidate, with at
most two operators around them, eliminated exactly before the memory-limited search.

Under a memory limit only steady operators may be eliminated whatever the limit (their choice
moves no memory), and the series and leaf reductions take them one at a time, when they have one or
two neighbours. A piece of several steady operators joined to the rest through at most two
operators ``a`` and ``b`` is a generalised series step: variable elimination of the piece
(:meth:`taps.solve.elimination.Elimination.part`) leaves one pair cost between ``a`` and ``b``,
the least cost of the piece for each pair of their choices, and the problem stays one of node
and pair costs that the reductions, the price on memory and the Pareto frontiers take. DeepSeek-V3's
rotary embedding (the ``sub`` and ``add`` of 1,303 candidates on 256 devices, each joined to the
two slices and their ``cat``) is such a piece between the query's projection and the attention's
context: eliminated once here (2e9 additions, a few seconds), not once per price of memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Literal

from taps.solve.elimination import MAX_WORK, WORK_PER_FLOW, Part, elimination_order
from taps.solve.problem import Problem

#: A component of steady operators with more than two operators around it is searched for
#: pieces (every pair of its operators and those around it taken as the two the piece may
#: touch) only up to this many operators with those around it: 32 * 31 / 2 pairs, a walk each.
MAX_COMPONENT = 32


@dataclass
class Pieces:
    """The problem left once the steady pieces are eliminated, and how to complete its
    choices."""

    problem: Problem
    parts: list[Part] = field(default_factory=list)

    @property
    def eliminated(self) -> int:
        return sum(len(part.steps) for part in self.parts)

    def expand(self, choice: dict[str, int]) -> dict[str, int]:
        """The best choice of every operator given a choice of the problem left's."""
        for part in reversed(self.parts):
            choice = part.expand(choice)
        return choice


def _components(
    members: Collection[str], near: dict[str, set[str]], position: dict[str, int]
) -> Iterator[set[str]]:
    """The connected components of ``members``, in the order of their first operator."""
    left = set(members)
    for v in sorted(left, key=position.__getitem__):
        if v not in left:
            continue
        part, todo = {v}, [v]
        left.discard(v)
        while todo:
            for u in near[todo.pop()] & left:
                left.discard(u)
                part.add(u)
                todo.append(u)
        yield part


def _around(piece: Collection[str], near: dict[str, set[str]]) -> set[str]:
    return set().union(*(near[v] for v in piece)).difference(piece)


def _pieces(
    component: set[str], near: dict[str, set[str]], position: dict[str, int]
) -> Iterator[set[str]]:
    """The pieces of a component of steady operators: connected sets of at least two of them with
    one or two operators around them (the component itself, or what is left of it apart from
    two of its operators or those around it)."""
    around = _around(component, near)
    if len(component) < 2:
        return
    if len(around) <= 2:
        if around:
            yield component
        return
    if len(component) + len(around) > MAX_COMPONENT:
        return
    for pair in itertools.combinations(sorted(component | around, key=position.__getitem__), 2):
        if not component.intersection(pair):
            continue  # the component itself, with more than two around it
        for piece in _components(component - set(pair), near, position):
            if len(piece) > 1 and 0 < len(_around(piece, near)) <= 2:
                yield piece


def _eliminated(
    problem: Problem, piece: frozenset[str], around: set[str], deadline: float | None
) -> tuple[Problem, Part] | Literal[False] | None:
    """``problem`` with ``piece`` eliminated (the steps that choose its operators apart), if its
    elimination fits the budget (False if not; None if ``deadline`` passes first)."""
    inside = [p for p in problem.pairs if p.u in piece or p.w in piece]
    names = [v for v in problem.node_cost if v in piece or v in around]
    local = Problem({v: problem.node_cost[v] for v in names}, inside)
    flows = sum(p.cost.size for p in inside)
    elimination = elimination_order(
        local, max_work=max(MAX_WORK, WORK_PER_FLOW * flows), keep=around
    )
    if elimination is None:
        return False
    part = elimination.part(deadline)
    if part is None:
        return None
    node = {
        v: part.problem.node_cost.get(v, c) for v, c in problem.node_cost.items() if v not in piece
    }
    pairs = [p for p in problem.pairs if not (p.u in piece or p.w in piece)]
    return Problem(node, pairs + part.problem.pairs), part


def eliminate_pieces(
    problem: Problem, steady: Collection[str], deadline: float | None = None
) -> Pieces | None:
    """The steady pieces of ``problem`` eliminated, in each component of steady operators the
    largest first (ties in the problem's operator order) until none is left whose elimination
    fits the budget (its estimated work at most
    :data:`taps.solve.elimination.WORK_PER_FLOW` per flow of its pair costs, or
    :data:`taps.solve.elimination.MAX_WORK`); None if ``deadline`` passes first."""
    position = {v: k for k, v in enumerate(problem.node_cost)}
    near: dict[str, set[str]] = {v: set() for v in problem.node_cost}
    for p in problem.pairs:
        if p.u != p.w:
            near[p.u].add(p.w)
            near[p.w].add(p.u)
    pieces = Pieces(problem)
    members = set(steady) & problem.node_cost.keys()
    # Joining two operators around a piece never joins two components of steady operators:
    # each component's pieces are found apart.
    for component in list(_components(members, near, position)):
        refused: set[frozenset[str]] = set()
        while True:
            found = {frozenset(c) for c in _pieces(component, near, position)} - refused
            ranked = sorted(found, key=lambda c: (-len(c), min(position[v] for v in c)))
            for piece in ranked:
                around = _around(piece, near)
                done = _eliminated(pieces.problem, piece, around, deadline)
                if done is None:
                    return None
                if done is False:
                    refused.add(piece)
                    continue
                pieces.problem, part = done
                pieces.parts.append(part)
                component -= piece
                for v in piece:
                    for u in near.pop(v):
                        near.get(u, set()).discard(v)
                if len(around) == 2:
                    a, b = around
                    near[a].add(b)
                    near[b].add(a)
                break
            else:
                break
    return pieces
