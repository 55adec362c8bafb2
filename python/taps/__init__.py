"""taps: topology-aware intra-operator parallelism strategy search (TAPS).

The layout, redistribution and cost core is Rust (``taps._core``); the graph model, the ILP search,
reports and the CLI are Python. See ``docs/`` for the conventions and every public name.
"""

from taps import export, models, verify
from taps._core import (
    Cluster,
    CommOp,
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
from taps.checks import ArgumentError
from taps.costs import OpCost, breakdown, evaluate, strategies_for
from taps.extras import MissingExtraError
from taps.frontends import from_jax, from_torch
from taps.graph import Edge, Graph, Operand, Operator, Tensor
from taps.ilp import IlpOptions
from taps.limits import ResourceError
from taps.outputs import OutputError
from taps.search import Comparison, SearchResult, compare, search

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Cluster",
    "CommOp",
    "Comparison",
    "Edge",
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
    "Redistribution",
    "ResourceError",
    "SearchResult",
    "Strategy",
    "StrategyError",
    "TapsError",
    "Tensor",
    "TopologyError",
    "UnifyError",
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
    "strategies_for",
    "unify",
    "verify",
]
