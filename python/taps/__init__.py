"""taps: topology-aware intra-operator parallelism strategy search (TAPS).

A model's :class:`Graph` and a :class:`Cluster` go into :func:`search`, whose result holds the
:class:`Plan` it chose (a strategy per operator and its :class:`Pricing`); :func:`evaluate` and
:func:`breakdown` price any plan, :mod:`taps.export` puts it on a framework's mesh and
:func:`verify` runs it. The layout, redistribution and cost core is Rust (``taps._core``);
docs/architecture.md maps the packages.
"""

from __future__ import annotations

import importlib

# Not typing's: importing typing would cost the command line's first milliseconds (see below);
# type checkers read this name as True.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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
        redistribution_bounds,
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
        TimeLimitError,
        VerifyError,
    )
    from taps.export.pipeline import to_jax_pipeline, to_pipeline
    from taps.frontends import from_jax, from_torch
    from taps.graph import Edge, Graph, Operand, Operator, Tensor
    from taps.plan import Plan, Pricing
    from taps.plan.candidates import strategies_for
    from taps.plan.stages import Pipeline, Stage
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

#: Where each public name lives. ``import taps`` imports none of them: each is imported on first
#: use (PEP 562), so the ``taps`` command takes charge of Ctrl-C before the heavy imports (numpy,
#: SCIP, rich) run, and a user who needs one part does not pay for the rest.
_HOMES = {
    "export": "taps.export",
    "models": "taps.models",
    "search": "taps.search",
    "verify": "taps.verify",
    "Cluster": "taps._core",
    "CommOp": "taps._core",
    "Device": "taps._core",
    "GraphError": "taps._core",
    "InfeasibleError": "taps._core",
    "Layout": "taps._core",
    "LayoutError": "taps._core",
    "Redistribution": "taps._core",
    "Strategy": "taps._core",
    "StrategyError": "taps._core",
    "TapsError": "taps._core",
    "TopologyError": "taps._core",
    "UnifyError": "taps._core",
    "enumerate_strategies": "taps._core",
    "inter_node_groups": "taps._core",
    "plan_redistribution": "taps._core",
    "redistribution_bounds": "taps._core",
    "redistribution_costs": "taps._core",
    "unify": "taps._core",
    "ArgumentError": "taps.errors",
    "ExportError": "taps.errors",
    "MissingExtraError": "taps.errors",
    "OutputError": "taps.errors",
    "PlanFileError": "taps.errors",
    "ResourceError": "taps.errors",
    "TimeLimitError": "taps.errors",
    "VerifyError": "taps.errors",
    "from_jax": "taps.frontends",
    "from_torch": "taps.frontends",
    "Edge": "taps.graph",
    "Graph": "taps.graph",
    "Operand": "taps.graph",
    "Operator": "taps.graph",
    "Tensor": "taps.graph",
    "Plan": "taps.plan",
    "Pricing": "taps.plan",
    "Pipeline": "taps.plan.stages",
    "Stage": "taps.plan.stages",
    "strategies_for": "taps.plan.candidates",
    "Comparison": "taps.search",
    "OpCost": "taps.search",
    "SearchResult": "taps.search",
    "breakdown": "taps.search",
    "compare": "taps.search",
    "evaluate": "taps.search",
    "StepTime": "taps.search",
    "step_time": "taps.search",
    "IlpOptions": "taps.solve",
    "to_jax_pipeline": "taps.export.pipeline",
    "to_pipeline": "taps.export.pipeline",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'taps' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if home == f"taps.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The public names only: the module's own helpers (importlib, TYPE_CHECKING, the table of
    # homes) are not part of the API.
    return sorted(__all__)


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
    "Pipeline",
    "Plan",
    "PlanFileError",
    "Pricing",
    "Redistribution",
    "ResourceError",
    "SearchResult",
    "Stage",
    "StepTime",
    "Strategy",
    "StrategyError",
    "TapsError",
    "Tensor",
    "TimeLimitError",
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
    "redistribution_bounds",
    "redistribution_costs",
    "search",
    "step_time",
    "strategies_for",
    "to_jax_pipeline",
    "to_pipeline",
    "unify",
    "verify",
]
