"""Tiny mixture-of-experts layers in the GShard form (docs/export.md#expert-weights), with the
parameters of real MoE modules: transformers' Mixtral block and torchtitan's MoE. Each loads
the real module's state dict and computes its output from the routing the real module chooses,
given as fixed routing tensors (the dispatch mask ``gsec``): the top-k of the router's scores
in token order, up to a capacity per expert and group (:func:`route`).

Per layer: g token groups, s tokens per group, e experts, c capacity, m model width, h expert
hidden width; router ``gsm,me->gse``; dispatch ``gsec,gsm->egcm``; experts ``egcm,ehm->egch``
(gate, up), SiLU and product, ``egch,emh->egcm`` (down); combine ``gsec,egcm->gsm``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import taps


def route(scores: torch.Tensor, k: int, capacity: int) -> torch.Tensor:
    """The GShard dispatch mask ``[g, s, e, c]`` of router scores ``[g, s, e]``: each token to
    its ``k`` best experts (ties to the lower index), slots taken in token order, choice by
    choice; a token past an expert's ``capacity`` is dropped there."""
    g, s, e = scores.shape
    top = scores.topk(k, dim=-1).indices
    mask = torch.zeros(g, s, e, capacity)
    for gi in range(g):
        used = [0] * e
        for si in range(s):
            for j in range(k):
                ei = int(top[gi, si, j])
                if used[ei] < capacity:
                    mask[gi, si, ei, used[ei]] = 1.0
                    used[ei] += 1
    return mask


def _experts(xe: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
    """The experts on their dispatched tokens ``egcm``: SiLU-gated, weights as ``[e, h, m]``
    (gate, up) and ``[e, m, h]`` (down)."""
    h = nn.functional.silu(torch.einsum("egcm,ehm->egch", xe, gate))
    h = h * torch.einsum("egcm,ehm->egch", xe, up)
    return torch.einsum("egch,emh->egcm", h, down)


class MixtralGShard(nn.Module):
    """transformers' ``MixtralSparseMoeBlock`` (softmax router, top-k weights renormalised,
    ``experts.gate_up_proj [e, 2h, m]`` fused, ``experts.down_proj [e, m, h]``)."""

    def __init__(self, experts: int, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * hidden, width))
        self.experts.down_proj = nn.Parameter(torch.randn(experts, width, hidden))

    def forward(self, x: torch.Tensor, dispatch: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1)
        weights = torch.einsum("gse,gsec->gsec", probs, dispatch)
        combine = weights / weights.sum(dim=(2, 3), keepdim=True)
        xe = torch.einsum("gsec,gsm->egcm", dispatch, x)
        gate, up = self.experts.gate_up_proj.chunk(2, dim=1)
        return torch.einsum(
            "gsec,egcm->gsm", combine, _experts(xe, gate, up, self.experts.down_proj)
        )


class TitanGShard(nn.Module):
    """torchtitan's ``MoE`` (softmax router without renormalisation, ``w1``/``w3`` ``[e, h, m]``
    and ``w2`` ``[e, m, h]`` stacked, no shared experts); with ``norm`` its ``route_norm``, the
    top-k weights renormalised."""

    def __init__(self, experts: int, width: int, hidden: int, norm: bool = False) -> None:
        super().__init__()
        self.norm = norm
        self.router = nn.Module()
        self.router.gate = nn.Linear(width, experts, bias=False)
        self.routed_experts = nn.Module()
        inner = self.routed_experts.inner_experts = nn.Module()
        inner.w1_EFD = nn.Parameter(torch.randn(experts, hidden, width) / width**0.5)
        inner.w2_EDF = nn.Parameter(torch.randn(experts, width, hidden) / hidden**0.5)
        inner.w3_EFD = nn.Parameter(torch.randn(experts, hidden, width) / width**0.5)

    def forward(self, x: torch.Tensor, dispatch: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router.gate(x), dim=-1)
        combine = torch.einsum("gse,gsec->gsec", probs, dispatch)
        if self.norm:
            combine = combine / combine.sum(dim=(2, 3), keepdim=True)
        xe = torch.einsum("gsec,gsm->egcm", dispatch, x)
        inner = self.routed_experts.inner_experts
        return torch.einsum(
            "gsec,egcm->gsm", combine, _experts(xe, inner.w1_EFD, inner.w3_EFD, inner.w2_EDF)
        )


def mixtral_block(experts: int = 4, width: int = 8, hidden: int = 16, top_k: int = 2) -> nn.Module:
    """transformers' Mixtral sparse MoE block from a tiny config, weights drawn at random."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(
        hidden_size=width,
        intermediate_size=hidden,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
    )
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config)
    for p in block.parameters():
        nn.init.normal_(p, std=0.5)
    return block.eval()


def titan_moe(experts: int = 4, width: int = 8, hidden: int = 16, top_k: int = 2) -> nn.Module:
    """torchtitan's MoE layer from a tiny config (softmax scores, no shared experts, no load
    balancing bias), weights drawn at random."""
    from torchtitan.models.common.linear import Linear
    from torchtitan.models.common.moe import (
        GroupedExperts,
        MoE,
        RoutedExperts,
        TokenChoiceTopKRouter,
    )
    from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher

    config = MoE.Config(
        num_experts=experts,
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(dim=width, hidden_dim=hidden, num_experts=experts),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=experts, top_k=top_k),
        ),
        router=TokenChoiceTopKRouter.Config(
            num_experts=experts,
            gate=Linear.Config(in_features=width, out_features=experts, bias=False),
            top_k=top_k,
            score_func="softmax",
        ),
        load_balance_coeff=None,
    )
    torch.manual_seed(0)
    moe = config.build()
    for p in moe.parameters():
        nn.init.normal_(p, std=0.5)
    return moe


def _expert_ops(graph: taps.Graph) -> list[str]:
    """The operators between dispatch (the first making ``egcm``) and combine (the last
    operator): the experts."""
    names = [op.name for op in graph.ops]
    start = next(i for i, op in enumerate(graph.ops) if op.output.dims[0] == "e")
    return names[start + 1 : -1]


def gshard_plan(graph: taps.Graph, cluster: taps.Cluster, ep: int) -> taps.Plan:
    """GShard's plan: token groups split over every device, the experts over ``ep`` devices
    (device dim 0, the innermost ranks) and their token groups over the rest (an operator on
    expert weights alone, a fused weight's split, is replicated there)."""
    n = cluster.num_devices
    experts = set(_expert_ops(graph))
    strategies = {}
    for op in graph.ops:
        rest = len(op.partitionable) - (2 if op.name in experts else 1)
        if op.name in experts and len(graph.tensors[op.output.tensor].shape) == 3:
            matrix = [n // ep, ep] if ep < n else [n]
            strategies[op.name] = taps.Strategy(
                [ep] + [1] * (rest + 1), [0] + [-1] * (rest + 1), matrix
            )
        elif op.name in experts:
            strategies[op.name] = taps.Strategy(
                [ep, n // ep] + [1] * rest, [0, 1 if ep < n else -1] + [-1] * rest
            )
        else:
            strategies[op.name] = taps.Strategy([n] + [1] * rest, [0] + [-1] * rest)
    return taps.Plan(graph, cluster, strategies)


def moe_graph(
    groups: int = 8,
    tokens: int = 4,
    experts: int = 8,
    capacity: int = 1,
    width: int = 8,
    hidden: int = 16,
) -> taps.Graph:
    """A GShard layer as taps' MoE operators (``moe_route``, ``moe_dispatch``, ``moe_expert``,
    ``swiglu``, ``moe_combine``, as the torch front end makes them), with torchtitan's parameter
    names, built with the graph builders."""
    from taps.graph import MOE_COMBINE, MOE_DISPATCH, MOE_EXPERT, MOE_ROUTE

    g = taps.Graph("moe")
    x = g.input("x", (groups, tokens, width), requires_grad=True)
    gate = g.parameter("router.gate.weight", (experts, width))
    probs = g.softmax("router.softmax", g.einsum("router", "gsm,em->gse", x, gate))
    route = g.add_operator(
        "route", MOE_ROUTE, [(probs, "gse")], "gsec", "g", {"c": capacity}, saved="none"
    )
    h = g.einsum("dispatch", "gsec,gsm->egcm", route, x, kind=MOE_DISPATCH, partitionable="ge")
    inner = "routed_experts.inner_experts"
    w1 = g.parameter(f"{inner}.w1_EFD", (experts, hidden, width))
    w2 = g.parameter(f"{inner}.w2_EDF", (experts, width, hidden))
    w3 = g.parameter(f"{inner}.w3_EFD", (experts, hidden, width))
    up = [
        g.einsum(f"experts.{w}", "egcm,ehm->egch", h, t, kind=MOE_EXPERT, partitionable="egh")
        for w, t in (("w1", w1), ("w3", w3))
    ]
    act = g.add_operator("experts.act", "swiglu", [(t, "egch") for t in up], "egch", "egh")
    down = g.einsum("experts.w2", "egch,emh->egcm", act, w2, kind=MOE_EXPERT, partitionable="egh")
    g.einsum("combine", "gsec,egcm->gsm", route, down, kind=MOE_COMBINE, partitionable="ge")
    return g


def assert_experts_held(
    placements: Any, name: str, layout: taps.Layout, stacked: torch.Tensor, experts: list
) -> None:
    """On every rank of the fake process group in turn: the experts
    :func:`taps.export.experts.distribute_experts` gives it (``experts[i]`` expert ``i``'s own
    weight) are its block of the stacked weight ``name`` in ``layout``, each holding what DTensor
    places of the stacked weight ``stacked`` there."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from taps.export.dtensor import placement_objects
    from taps.export.experts import distribute_experts

    mesh, n = placements.mesh, layout.num_devices
    for rank in range(n):
        tdist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)
        try:
            dm = DeviceMesh(
                "cpu", torch.arange(n).reshape(mesh.shape), mesh_dim_names=mesh.axis_names
            )
            whole = distribute_tensor(
                stacked, dm, placement_objects(placements.tensors[name]), src_data_rank=None
            ).to_local()
            held = distribute_experts(experts, placements, name, dm)
            (start, stop), *_ = layout.shard_index(rank)
            assert sorted(held) == list(range(start, stop))
            for i, t in held.items():
                local = t.to_local() if hasattr(t, "to_local") else t
                assert torch.equal(local, whole[i - start])
        finally:
            tdist.destroy_process_group()
