"""The problem every solver of :mod:`taps.solve` reads, and what they return: node costs and pair
costs over operators' candidates (:class:`Problem`), a memory limit over them
(:class:`MemoryLimit`), the pipeline's switches (:class:`IlpOptions`) and its answer
(:class:`IlpSolution`). :class:`Instance` is what :func:`taps.solve.solve` takes: anything that
gives its problem, its memory and its tied repeats (the search's cost tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from taps.errors import TapsError


@dataclass
class PairCost:
    """A cost between the choices of operators ``u`` and ``w``: ``cost[u_class[i], w_class[j]]``
    for candidate ``i`` of ``u`` and ``j`` of ``w``."""

    u: str
    w: str
    u_class: np.ndarray
    w_class: np.ndarray
    cost: np.ndarray

    def oriented(self, u: str) -> PairCost:
        """The same cost with ``u`` as its first end."""
        if self.u == u:
            return self
        return PairCost(self.w, self.u, self.w_class, self.u_class, np.swapaxes(self.cost, 0, 1))

    def other(self, v: str) -> str:
        return self.w if self.u == v else self.u


@dataclass
class Problem:
    """Choose one candidate per operator minimising the node costs plus the pair costs."""

    node_cost: dict[str, np.ndarray]
    pairs: list[PairCost]

    def evaluate(self, choice: Mapping[str, int]) -> float:
        """The cost of one assignment (operator name -> index into its candidates)."""
        total = sum(float(c[choice[v]]) for v, c in self.node_cost.items())
        for p in self.pairs:
            total += float(p.cost[p.u_class[choice[p.u]], p.w_class[choice[p.w]]])
        return total

    def fixed(self, one: Mapping[str, int]) -> Problem:
        """This problem with each operator of ``one`` left only that candidate. Every other
        array is this problem's own object, so a reduction that shares its memo of eliminations
        with one of this problem (:func:`taps.solve.reductions.reduce`) takes them away from the
        fixed operators."""
        pick = {v: np.array([i]) for v, i in one.items()}
        return Problem(
            {v: c[pick[v]] if v in pick else c for v, c in self.node_cost.items()},
            [
                PairCost(
                    p.u,
                    p.w,
                    p.u_class[pick[p.u]] if p.u in pick else p.u_class,
                    p.w_class[pick[p.w]] if p.w in pick else p.w_class,
                    p.cost,
                )
                for p in self.pairs
            ],
        )


class Instance(Protocol):
    """What :func:`taps.solve.solve` decides: a problem, each operator's memory per candidate (one
    layer), how many layers the memory counts, and the tied repeats (groups of instances, each a
    sequence of operator names in the same order)."""

    def problem(self) -> Problem: ...

    @property
    def memory_per_op(self) -> Mapping[str, np.ndarray]: ...

    @property
    def layers(self) -> int: ...

    @property
    def tied(self) -> Sequence[Sequence[Sequence[str]]]: ...


@dataclass(frozen=True)
class MemoryLimit:
    """Memory per device of every candidate of every operator (one layer), the layers, and the
    limit per device."""

    per_op: dict[str, np.ndarray]
    layers: int
    limit: float

    def of(self, choice: dict[str, int]) -> float:
        """The memory per device of one assignment."""
        return self.layers * sum(float(self.per_op[n][i]) for n, i in choice.items())


@dataclass(frozen=True)
class IlpOptions:
    """Switches of the ILP; every setting finds the same optimum. The search benchmark
    (``benches/search_stages.py``) shows what each buys."""

    #: "grouped": a continuous flow per pair of layout classes of an edge (conventions.md#the-ilp);
    #: "pairwise": the plain Alpa-style formulation, a binary per pair of strategies.
    formulation: str = "grouped"
    #: Drop dominated candidates first (exact, see taps.solve.prune).
    prune: bool = True
    #: SCIP's presolve: off by default, it costs far more than it saves on these models
    #: (AlexNet on 32 devices: 5.8 s with it, 0.13 s without).
    presolve: bool = False
    #: Hand SCIP a first assignment (each operator's cheapest candidate on its own).
    warm_start: bool = True
    #: Eliminate operators exactly before SCIP (taps.solve.reductions): fixed, leaf and series
    #: operators, parallel edges merged; SCIP solves the core left, and is not called when nothing
    #: joins the operators left. Under a binding memory limit only operators whose memory does
    #: not depend on their candidate go.
    reduce: bool = True
    #: Solve the core the reductions leave (a graph that is not series-parallel) by exact
    #: variable elimination (taps.solve.elimination) when its tables fit a budget, without SCIP.
    #: Single objective without a binding memory limit only. Needs ``reduce``.
    eliminate: bool = True
    #: Under a binding memory limit, price memory (taps.solve.memory_price) before SCIP:
    #: series-parallel problems are decided by the reductions when the price closes the gap,
    #: otherwise it prunes candidates exactly and gives SCIP its first assignment. Needs ``reduce``.
    price: bool = True

    def __post_init__(self) -> None:
        if self.formulation not in ("grouped", "pairwise"):
            raise TapsError(
                f"formulation must be 'grouped' or 'pairwise', got {self.formulation!r}"
            )


@dataclass(frozen=True)
class IlpSize:
    """What SCIP was handed."""

    binaries: int
    continuous: int
    constraints: int
    #: Operators in the ILP, and operators decided before it (taps.solve.reductions).
    operators: int
    eliminated: int = 0

    @property
    def variables(self) -> int:
        return self.binaries + self.continuous


@dataclass(frozen=True)
class IlpSolution:
    choice: dict[str, int]
    status: str
    gap: float
    solve_time: float
    build_time: float
    reduce_time: float
    size: IlpSize
