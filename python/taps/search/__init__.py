"""The search: the plan that minimises a step's communication on a cluster.

:func:`search` builds the cost tables (:mod:`.tables`: every operator's candidates priced by
:mod:`.prices`, every edge's redistributions), hands them to :func:`taps.solve.solve`, and returns
a :class:`SearchResult` whose ``plan`` is the chosen :class:`taps.Plan`; :func:`compare` runs both
cost models; :func:`evaluate` and :func:`breakdown` (:mod:`.evaluate`) price any plan.

``taps.search(...)`` calls :func:`search`, while ``taps.search.tables`` and the rest stay
reachable as the package's modules (as ``taps.verify``).
"""

import sys
import types

from taps.search.evaluate import Incoming, OpCost, StepTime, breakdown, evaluate, step_time
from taps.search.searching import STAGES, Comparison, SearchResult, compare, search

__all__ = [
    "STAGES",
    "Comparison",
    "Incoming",
    "OpCost",
    "SearchResult",
    "StepTime",
    "breakdown",
    "compare",
    "evaluate",
    "search",
    "step_time",
]


class _CallableModule(types.ModuleType):
    """``taps.search(...)`` runs :func:`search`; the package's modules stay its attributes."""

    __call__ = staticmethod(search)


sys.modules[__name__].__class__ = _CallableModule
