"""The cost tables' per-operator shortcuts against the per-candidate computations they replace,
bit for bit: the memory of every candidate at once (``prices.memories`` against ``memory``), the
all_reduces of addends' gradients that keep axes apart priced by the kernel a degree group at a
time (``tables._reductions`` against the collectives one candidate at a time), and the edge
classes' compacting shortcut (``tables._classes`` against every layout compacted). On a real
torch module: biases (addends), fused attention (outputs kept as rows or not at all), a frozen
weight and a tied embedding (a shared parameter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import taps
from taps.frontends.torch import from_torch
from taps.plan.candidates import (
    Candidate,
    candidates,
    partial_dims,
    split_dims,
    strategy_arrays,
)
from taps.search.checkpointing import checkpointing
from taps.search.prices import (
    all_reduce_operands,
    collective_of,
    copies_of,
    is_parameter_gradient,
    memories,
    memory,
    partial_flows,
    reduced_operands,
)
from taps.search.tables import _classes, _reductions

CLUSTER = taps.Cluster(2, 4)
PRICINGS = [
    taps.Pricing(),
    taps.Pricing(zero=True, checkpoint=1),
    taps.Pricing(fsdp=True, parameter_bytes=2, gradient_bytes=4),
    taps.Pricing(step="forward", zero=True, fsdp=True),
]


class _Block(torch.nn.Module):
    """An embedding tied to the head, a frozen projection, biased linears and SDPA."""

    def __init__(self, vocab: int = 64, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.frozen = torch.nn.Linear(hidden, hidden)
        self.frozen.weight.requires_grad_(False)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(ids))
        b, s, h = x.shape
        q, k, v = (
            t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(self.frozen(y.transpose(1, 2).reshape(b, s, h)) + x)


@pytest.fixture(scope="module")
def graph() -> taps.Graph:
    return from_torch(_Block(), torch.zeros(2, 16, dtype=torch.long), tie=False)


def test_the_module_has_every_case(graph):
    """The graph holds what the shortcuts must get right: a shared parameter, outputs kept as
    rows and not at all, a frozen weight, and addends whose gradients keep axes apart."""
    assert {op.kind for op in graph.ops} >= {"share"}
    assert {op.saved for op in graph.ops} == {"output", "rows", "none"}
    assert any(not t.requires_grad for t in graph.tensors.values() if t.kind == "parameter")
    assert any(r[2] for op in graph.ops for r in reduced_operands(graph, op, "training"))


@pytest.mark.parametrize("replicas", [False, True])
@pytest.mark.parametrize("pricing", PRICINGS)
def test_memories_are_memory_of_each_candidate(graph, pricing, replicas):
    """Every operator's candidates at once, plain and sharded (FSDP's twins, with copies),
    checkpointed or not: each entry is ``memory`` of its candidate to the bit."""
    kept = checkpointing(graph, pricing.checkpoint).kept
    copies = copies_of(graph)
    for op in graph.ops:
        cands = candidates(op, CLUSTER.num_devices, replicas)
        degrees = np.array([c.strategy.degrees for c in cands], dtype=np.int64)
        for sharded in (False, True):
            for share in (kept[op.name], 0.5):
                got = memories(graph, op, degrees, pricing, share, sharded, copies[op.name] + 2)
                want = [
                    memory(graph, op, c, pricing, share, sharded, copies[op.name] + 2)
                    for c in cands
                ]
                assert got.tobytes() == np.array(want).tobytes(), (op.name, sharded)


def test_memories_of_sizes_beyond_64_bits():
    """A shard's bytes that overflow 64-bit integers are multiplied out in Python's."""
    g = taps.Graph(name="huge")
    x = g.input("x", (2**40, 2**20), dtype_bytes=2**10)
    g.relu("act", x)
    op = g.op("act")
    degrees = np.array([c.strategy.degrees for c in candidates(op, 8)], dtype=np.int64)
    want = [memory(g, op, c) for c in candidates(op, 8)]
    assert memories(g, op, degrees).tobytes() == np.array(want).tobytes()
    assert max(want) == float(2**60 // 8 * 2**10)  # beyond 2**63


@pytest.mark.parametrize("replicas", [False, True])
@pytest.mark.parametrize("step", ["training", "forward"])
def test_reductions_are_the_collectives_of_each_candidate(graph, step, replicas):
    """The kernel's all_reduces, then the addends' gradients that keep axes apart summed one
    candidate at a time from their collectives (as the tables did before pricing them a degree
    group at a time): the same costs to the bit."""
    flows = partial_flows(graph, step)
    apart = 0
    for op in graph.ops:
        cands = candidates(op, CLUSTER.num_devices, replicas)
        flowing = op.name in flows
        for parameters in (False, True):
            for grads in (None, 4):
                arrays = strategy_arrays(cands)
                got = _reductions(
                    graph, op, arrays, step, flowing, CLUSTER, "topology", parameters, grads
                )
                degrees, maps, matrices = arrays
                operands = all_reduce_operands(graph, op, step, flowing, grads, parameters)
                want = taps._core.allreduce_costs(
                    degrees, maps, operands, CLUSTER, "topology", matrices
                )
                kept = [
                    r
                    for r in reduced_operands(graph, op, step, flowing)
                    if r[2] and is_parameter_gradient(graph, r) == parameters
                ]
                apart += len(kept)
                want += np.array(
                    [
                        sum(
                            col.cost(CLUSTER, "topology")
                            for r in kept
                            if (col := collective_of(graph, op, c.strategy, r, False, grads))
                        )
                        for c in cands
                    ]
                )
                assert got.tobytes() == want.tobytes(), (op.name, parameters, grads)
    assert apart > 0 if step == "training" else apart == 0


def test_classes_compact_each_layout(graph):
    """The classes of every input end of the module's operators, with a gradient that is the
    input itself compacted once: the same classes and rows as every layout compacted."""
    for op in graph.ops:
        cands = candidates(op, CLUSTER.num_devices)
        for slot in range(len(op.inputs)):
            forward = [c.inputs[slot] for c in cands]
            backward = [c.gradient(slot) for c in cands]
            index: dict[tuple[taps.Layout, ...], int] = {}
            want = [
                index.setdefault((a.compacted(), b.compacted()), len(index))
                for a, b in zip(forward, backward)
            ]
            cls, rows = _classes(forward, backward)
            assert cls.tolist() == want and rows == list(index)
            cls, rows = _classes(forward, None)
            assert rows == list(dict.fromkeys((a.compacted(),) for a in forward))


@pytest.mark.parametrize("replicas", [False, True])
def test_candidates_of_one_memo_are_each_operators_own(graph, replicas):
    """Every operator's candidates through one memo shared by all of them (operators of the
    same sizes share strategies, operands of the same axes and shape share layouts): equal to
    those it enumerates on its own and to ``Candidate.of`` each strategy, and the shared layouts
    the same objects."""
    memo: dict = {}
    shared = 0
    for op in graph.ops:
        before = len(memo)
        found = candidates(op, CLUSTER.num_devices, replicas, memo)
        shared += len(memo) == before
        assert found == candidates(op, CLUSTER.num_devices, replicas)
        assert found == [Candidate.of(op, c.strategy) for c in found]
        assert all(c.op is op for c in found)
    assert shared > 0


def test_operators_axes_worked_out_once_are_their_own(graph):
    """The contracted axes and every input's gradient axes, cached on the operator, are those
    worked out from its operands."""
    for op in graph.ops:
        used = {d for o in op.inputs for d in o.dims}
        assert op.contracted == tuple(a for a in op.axes if a in used and a not in op.output.dims)
        assert op.input_gradient_axes == tuple(op.gradient_axes(o) for o in op.inputs)
        assert op.contracted is op.contracted


@pytest.mark.parametrize("replicas", [False, True])
def test_partial_dims_give_each_candidates_partial_layouts(graph, replicas):
    """The rows of :func:`partial_dims` are each candidate's split dims (:func:`split_dims`,
    padded), and an end's classes with the partial output or an input's gradients built from
    them in the core are those of each candidate's own (:attr:`Candidate.partial_output`,
    :meth:`Candidate.gradient`) compacted one by one, some holding partial sums."""

    def plain(forward, backward):
        index: dict[tuple[taps.Layout, ...], int] = {}
        cls = [
            index.setdefault((a.compacted(), b.compacted()), len(index))
            for a, b in zip(forward, backward)
        ]
        return cls, list(index)

    partial = 0
    for op in graph.ops:
        cands = candidates(op, CLUSTER.num_devices, replicas)
        degrees, maps, _ = strategy_arrays(cands)
        for axes in (op.contracted, op.partitionable, *op.input_gradient_axes):
            rows = partial_dims(op, degrees, maps, axes).tolist()
            want = [split_dims(op, c.strategy, axes) for c in cands]
            assert [sorted(k for k in row if k >= 0) for row in rows] == want
        outputs = [c.output for c in cands]
        flowing = [c.partial_output for c in cands]
        cls, rows = _classes(outputs, outputs, partial_dims(op, degrees, maps, op.contracted))
        assert (cls.tolist(), list(rows)) == plain(flowing, outputs)
        partial += sum(bool(x.partial) for x in flowing)
        for slot, axes in enumerate(op.input_gradient_axes):
            inputs = [c.inputs[slot] for c in cands]
            grads = [c.gradient(slot) for c in cands]
            cls, rows = _classes(inputs, inputs, None, partial_dims(op, degrees, maps, axes))
            assert (cls.tolist(), list(rows)) == plain(inputs, grads)
            partial += sum(bool(x.partial) for x in grads)
    assert partial > 0
