"""taps: topology-aware intra-operator parallelism strategy search (TAPS).

A model's :class:`Graph` and a :class:`Cluster` go into :func:`search`, whose result holds the
:class:`Plan` it chose (a strategy per operator and its :class:`Pricing`); :func:`evaluate` and
:func:`breakdown` price any plan, :mod:`taps.export` puts it on a framework's mesh and
:func:`verify` runs it. The layout, redistribution and cost core is Rust (``taps._core``);
docs/architecture.md maps the packages.
"""

from taps import export, models, search, verify
from taps._core import (
    Cluster,
    CommOp,
    Device,
    GraphError,
    InfeasibleError,
    Layout,
    LayoutError,
    Redistribution,
    Strategy,
    StrategyError,
    TapsError,
    TopologyError,
    UnifyError,
    enumerate_strategies,
    inter_node_groups,
    plan_redistribution,
    redistribution_costs,
    unify,
)
from taps.errors import (
    ArgumentError,
    ExportError,
    MissingExtraError,
    OutputError,
    PlanFileError,
    ResourceError,
    VerifyError,
)
from taps.frontends import from_jax, from_torch
from taps.graph import Edge, Graph, Operand, Operator, Tensor
from taps.plan import Plan, Pricing
from taps.plan.candidates import strategies_for
from taps.search import (
    Comparison,
    OpCost,
    SearchResult,
    StepTime,
    breakdown,
    compare,
    evaluate,
    step_time,
)
from taps.solve import IlpOptions

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Cluster",
    "CommOp",
    "Comparison",
    "Device",
    "Edge",
    "ExportError",
    "Graph",
    "GraphError",
    "IlpOptions",
    "InfeasibleError",
    "Layout",
    "LayoutError",
    "MissingExtraError",
    "OpCost",
    "Operand",
    "Operator",
    "OutputError",
    "Plan",
    "PlanFileError",
    "Pricing",
    "Redistribution",
    "ResourceError",
    "SearchResult",
    "StepTime",
    "Strategy",
    "StrategyError",
    "TapsError",
    "Tensor",
    "TopologyError",
    "UnifyError",
    "VerifyError",
    "__version__",
    "breakdown",
    "compare",
    "enumerate_strategies",
    "evaluate",
    "export",
    "from_jax",
    "from_torch",
    "inter_node_groups",
    "models",
    "plan_redistribution",
    "redistribution_costs",
    "search",
    "step_time",
    "strategies_for",
    "unify",
    "verify",
]
