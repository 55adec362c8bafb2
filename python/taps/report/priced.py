"""A plan with what it costs, the one value every report reads: a search result is one, and a
saved plan becomes one by pricing it once (:meth:`PricedPlan.of`)."""

from __future__ import annotations

from dataclasses import dataclass

from taps.plan.plan import Plan
from taps.search.evaluate import OpCost, StepTime, breakdown
from taps.search.searching import SearchResult


@dataclass(frozen=True)
class PricedPlan:
    """A plan, its breakdown (:func:`taps.breakdown`) and their total cost."""

    plan: Plan
    breakdown: list[OpCost]
    cost: float

    @property
    def step(self) -> StepTime:
        """The plan's step: compute, communication, exposed communication and step time."""
        return StepTime.of(self.breakdown)

    @classmethod
    def of(cls, plan: Plan) -> PricedPlan:
        """``plan`` priced under its own pricing."""
        rows = breakdown(plan)
        return cls(plan, rows, sum(r.total for r in rows))


#: What the tables and figures take: a search result, or a plan priced once.
Priced = SearchResult | PricedPlan
