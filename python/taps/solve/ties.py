"""Tied repeats: one choice for every instance of a tie (:meth:`taps.Graph.tie`).

A model's identical layers are declared repeats of one block. Searching them tied gives operator
``i`` of every instance the same candidate, so the problem has the variables of one block, whatever
the depth, while every cost and every byte of memory of every instance is still counted: the
node costs and memory of an operator's instances add up on its representative (the operator of
the first instance), a pair cost between instances of two operators becomes a pair cost between
their representatives (copies of one pair cost merge into one, their costs added), and a pair
cost between two instances of one operator (the residual stream from layer ``l`` to ``l + 1``)
becomes a node cost: both ends take the same candidate. Each tied assignment costs exactly what it
costs untied; the tied optimum is the best assignment that repeats the block's choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from taps.solve.reductions import PairCost, Problem


@dataclass(frozen=True)
class Ties:
    """Which operator stands for which: ``representative[v]`` for every operator."""

    representative: dict[str, str]

    @classmethod
    def of(cls, operators: Sequence[str], tied: Sequence[Sequence[Sequence[str]]]) -> Ties:
        rep = {v: v for v in operators}
        for group in tied:
            for position, first in enumerate(group[0]):
                for instance in group[1:]:
                    rep[instance[position]] = first
        return cls(rep)

    def fold(self, problems: Sequence[Problem]) -> list[Problem]:
        """The problems over the representatives (one or two objectives, alike but for their
        costs)."""
        rep = self.representative
        first = problems[0]
        # Pair costs that are one table between the same representatives merge into one.
        groups: dict[tuple, list[int]] = {}
        selfs: list[int] = []
        for k, p in enumerate(first.pairs):
            u, w = rep[p.u], rep[p.w]
            if u == w:
                selfs.append(k)
            else:
                groups.setdefault((u, w, id(p.u_class), id(p.w_class)), []).append(k)
        out = []
        for problem in problems:
            node = self.fold_memory(problem.node_cost)
            for k in selfs:
                p = problem.pairs[k]
                node[rep[p.u]] = node[rep[p.u]] + p.cost[p.u_class, p.w_class]
            pairs = []
            for (u, w, _, _), ks in groups.items():
                p = problem.pairs[ks[0]]
                # Added one copy at a time, in order (what a sum over a stacked axis does, without
                # stacking every copy first).
                cost = np.array(p.cost, dtype=np.float64)
                for k in ks[1:]:
                    cost += problem.pairs[k].cost
                pairs.append(PairCost(u, w, p.u_class, p.w_class, cost))
            out.append(Problem(node, pairs))
        return out

    def fold_memory(self, per_op: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each representative's sum over the operators it stands for of a vector per operator
        and candidate (memory per device, or a node cost)."""
        out: dict[str, np.ndarray] = {}
        for v, m in per_op.items():
            r = self.representative[v]
            out[r] = out[r] + m if r in out else np.asarray(m, dtype=np.float64)
        return out

    def expand(self, choice: Mapping[str, int]) -> dict[str, int]:
        """Every operator's choice: its representative's."""
        return {v: choice[r] for v, r in self.representative.items()}
