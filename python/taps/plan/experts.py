"""Expert parallelism in a plan: how its mixture-of-experts operators (docs/moe.md) split the
experts, where the expert-parallel group sits in the cluster, and what data and tensor
parallelism surround it."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from taps.graph import MOE_EXPERT
from taps.plan.plan import Plan


@dataclass(frozen=True)
class ExpertSplit:
    """How one expert operator is split.

    Attributes:
        expert: the expert-parallel degree (the expert axis ``e``'s).
        data: the data-parallel degree around it (the token groups ``g``).
        tensor: the tensor-parallel degree inside each expert (its hidden axis).
        span: devices one expert-parallel group spans, from its first to its last rank
            (its stride times its degree; 1 when the experts are whole).
        stride: rank distance between neighbours of the group.
        devices_per_node: the cluster's.
    """

    expert: int
    data: int
    tensor: int
    span: int
    stride: int
    devices_per_node: int

    @property
    def level(self) -> str:
        """Where the expert-parallel group sits: inside a node, or across nodes (with how many
        of its devices per node)."""
        if self.expert == 1:
            return "none"
        if self.span <= self.devices_per_node:
            return "inside a node"
        per_node = max(1, self.devices_per_node // self.stride)
        return f"across {self.expert // per_node} nodes, {per_node} per node"


def _split(plan: Plan, name: str) -> ExpertSplit:
    op = plan.graph.op(name)
    s = plan.strategies[name]
    degree = dict(zip(op.partitionable, s.degrees))
    dims = dict(zip(op.partitionable, s.device_map))
    matrix = s.device_matrix  # outermost first; device dim 0 is the last entry
    expert, stride = degree.get("e", 1), 1
    if expert > 1:
        stride = math.prod(matrix[len(matrix) - 1 - k] for k in range(dims["e"]))
    hidden = [a for a in op.partitionable if a not in ("e", "g")]
    return ExpertSplit(
        expert,
        degree.get("g", 1),
        math.prod(degree[a] for a in hidden),
        stride * expert,
        stride,
        plan.cluster.devices_per_node,
    )


def expert_splits(plan: Plan) -> Counter[ExpertSplit]:
    """The splits of the plan's expert operators, with how many operators have each (empty for
    a plan without experts)."""
    return Counter(_split(plan, op.name) for op in plan.graph.ops if op.kind == MOE_EXPERT)
