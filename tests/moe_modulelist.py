"""Mixtures of experts that keep each expert apart: an ``nn.ModuleList`` of expert MLPs and a
Python loop over them (docs/moe.md, "Per-expert modules").

No model of the installed transformers (5.24) or torchtitan (0.3) writes its experts so any
more: transformers stacks every MoE family's experts (its remaining per-expert modules, Switch
Transformers and NLLB-MoE, and the older Mixtral and OLMoE blocks, pick each expert's tokens with
``nonzero`` / ``torch.where``, shapes ``torch.export`` cannot trace), and torchtitan's experts are
``GroupedExperts`` only. These layers are written as users (and fairseq, DeepSpeed-MoE, Tutel)
write them, with static shapes:

- :class:`DenseLoopMoE`: every token through every expert, weighted by its routing weight (zero
  where the top-k did not choose it): the module's output is a dropless MoE's;
- :class:`CapacityLoopMoE`: GShard's one-hot dispatch with a capacity (slots by ``cumsum``),
  ``einsum`` of the tokens into ``[e, g, c, m]``, each expert on its slice, ``torch.stack`` and
  the combine ``einsum``; experts of two biased linears and GELU (fairseq's FFN);
- :class:`PickLoopMoE`: each expert's tokens picked by ``torch.where`` (data-dependent sizes).
"""

from __future__ import annotations

import torch
from torch import nn


class Expert(nn.Module):
    """A SwiGLU expert named as Mixtral's per-expert MLP was (``w1`` gate, ``w3`` up, ``w2``
    down)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class GeluExpert(nn.Module):
    """fairseq's and DeepSpeed-MoE's expert FFN: two linears with biases, GELU between."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class DenseLoopMoE(nn.Module):
    """Softmax router, top-k renormalised; each expert on every token, weighted."""

    def __init__(self, width: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(Expert(width, hidden) for _ in range(experts))

    def routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k's weights (renormalised) and experts per token."""
        weights, chosen = torch.topk(torch.softmax(self.gate(x), -1), self.top_k, dim=-1)
        return weights / weights.sum(-1, keepdim=True), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.routing(x)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            out = out + (weights * (chosen == i)).sum(-1, keepdim=True) * expert(x)
        return out


class CapacityLoopMoE(nn.Module):
    """GShard's form with a capacity factor of 1 (``ceil(k s / e)`` slots per expert and
    sequence, tokens past it dropped), its experts a loop over the list."""

    def __init__(self, width: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(GeluExpert(width, hidden) for _ in range(experts))

    def combine(self, x: torch.Tensor) -> torch.Tensor:
        """The combine weights ``[g, s, e, c]``: each token's top-k choices, in token order, to
        the next free slot of their expert."""
        g, s, _ = x.shape
        e = len(self.experts)
        c = -(-self.top_k * s // e)
        weights, chosen = torch.topk(torch.softmax(self.gate(x), -1), self.top_k, dim=-1)
        mask = nn.functional.one_hot(chosen, e).reshape(g, s * self.top_k, e)
        slot = (torch.cumsum(mask, dim=1) - 1) * mask
        kept = mask * (slot < c)
        where = nn.functional.one_hot(slot * kept, c) * kept[..., None]  # [g, s k, e, c]
        where = where.reshape(g, s, self.top_k, e, c).to(x.dtype)
        return torch.einsum("gskec,gsk->gsec", where, weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        combine = self.combine(x)
        tokens = torch.einsum("gsec,gsm->egcm", (combine != 0).to(x.dtype), x)
        out = torch.stack([expert(tokens[i]) for i, expert in enumerate(self.experts)])
        return torch.einsum("gsec,egcm->gsm", combine, out)


class PickLoopMoE(DenseLoopMoE):
    """The loop picking each expert's tokens (``torch.where``): sizes that depend on the data."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, m = x.shape
        x = x.reshape(-1, m)
        weights, chosen = self.routing(x)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == i)
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return out.reshape(b, t, m)


class Layer(nn.Module):
    """A pre-norm residual MoE sublayer (its block at ``mlp``, as in the models)."""

    def __init__(self, block: nn.Module, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    """Embedding, ``layers`` MoE sublayers of one kind, an output head."""

    def __init__(
        self,
        kind: type[nn.Module],
        layers: int = 1,
        width: int = 32,
        hidden: int = 48,
        experts: int = 4,
        top_k: int = 2,
        vocab: int = 100,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(
            Layer(kind(width, hidden, experts, top_k), width) for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
