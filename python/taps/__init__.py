"""taps: topology-aware intra-operator parallelism strategy search (TAPS).

The layout, redistribution and cost core is Rust (``taps._core``); the graph model, the ILP search,
reports and the CLI are Python. See ``docs/`` for the conventions and every public name.
"""

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

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "CommOp",
    "GraphError",
    "InfeasibleError",
    "Layout",
    "LayoutError",
    "Redistribution",
    "Strategy",
    "StrategyError",
    "TapsError",
    "TopologyError",
    "UnifyError",
    "__version__",
    "enumerate_strategies",
    "inter_node_groups",
    "plan_redistribution",
    "redistribution_costs",
    "unify",
]
