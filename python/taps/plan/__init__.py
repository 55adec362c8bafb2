"""The plan: what taps decides and everything the rest of taps reads from it.

:class:`Plan` (:mod:`.plan`) is a strategy for every operator of a graph on a cluster with its
:class:`Pricing` (:mod:`.pricing`), saved and read back exactly. :mod:`.candidates` gives the
layout a strategy gives every operand of an operator (its inputs, its output, the output's partial
sums and the inputs' gradients) and plans the redistributions between them; :mod:`.layouts` holds
every tensor's layout under a plan, and :mod:`.mesh` the coarsest device mesh they all fit;
:mod:`.experts` how a plan splits a mixture of experts (expert parallelism and its place).
"""

from taps.plan.plan import FORMAT, VERSION, Plan, is_saved_plan
from taps.plan.pricing import OPTIMIZERS, STEPS, Pricing

__all__ = [
    "FORMAT",
    "OPTIMIZERS",
    "STEPS",
    "VERSION",
    "Plan",
    "Pricing",
    "is_saved_plan",
]
