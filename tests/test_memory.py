"""Memory as engines use it: what each operator's backward keeps (fused attention keeps no
scores), what training keeps per parameter, and the one-line refusal when nothing fits."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

import taps
from taps import Cluster, Pricing
from taps.frontends.torch import from_torch
from taps.plan.candidates import candidates
from taps.search.checkpointing import checkpointing
from taps.search.prices import memory
from taps.search.tables import build_tables
from taps.solve.pipeline import largest_needs, smallest_memory


class _Attention(torch.nn.Module):
    """Projections and SDPA, as a model's attention block runs it."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _saved_by_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
    """The tensors torch's SDPA keeps for its backward (its real kernel, on this CPU)."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return saved


def test_sdpa_keeps_what_torchs_kernel_saves():
    """The attention rule's operators keep, on one device, exactly the bytes torch's fused
    kernel saves beyond its inputs q, k and v (the output and the fp32 logsumexp per row); no
    tensor of seq x seq elements is saved by either."""
    b, s, hidden, heads = 2, 64, 32, 4
    module = _Attention(hidden, heads)
    g = from_torch(module, torch.zeros(b, s, hidden), tie=False)
    attention = [op for op in g.ops if op.kind in ("scores", "softmax", "context")]
    assert {op.kind: op.saved for op in attention} == {
        "scores": "none",
        "softmax": "rows",
        "context": "output",
    }
    one = Cluster(1, 1)
    taps_bytes = sum(memory(g, op, candidates(op, 1)[0]) for op in attention)

    q, k, v = (torch.randn(b, heads, s, hidden // heads, requires_grad=True) for _ in range(3))
    saved = _saved_by_torch(q, k, v)
    inputs = {id(t) for t in (q, k, v)}
    torch_bytes = sum(t.numel() * t.element_size() for t in saved if id(t) not in inputs)
    assert torch_bytes == taps_bytes
    assert all(tuple(t.shape[-2:]) != (s, s) for t in saved)
    assert taps.search(g, one).memory_per_device > 0


def test_the_gpt_layers_attention_keeps_rows_not_scores():
    """Closed form, every candidate: the scores keep nothing, the softmax 4 bytes per row of its
    shard; unfused, both keep their whole shard."""
    fused = taps.models.gpt(hidden=64, heads=4, seq=32, batch=8)
    unfused = taps.models.gpt(hidden=64, heads=4, seq=32, batch=8, fused_attention=False)
    for cand in candidates(fused.op("scores"), 8):
        assert memory(fused, fused.op("scores"), cand) == 0
    for cand in candidates(fused.op("softmax"), 8):
        # Every axis but the normalised one (the last) is partitionable.
        rows = 8 * 4 * 32 / math.prod(cand.strategy.degrees)
        assert memory(fused, fused.op("softmax"), cand) == rows * 4
        assert memory(unfused, unfused.op("softmax"), cand) == rows * 32 * 2
    cluster = Cluster(2, 4)
    assert smallest_memory(build_tables(fused, cluster)) < smallest_memory(
        build_tables(unfused, cluster)
    )


def test_saved_is_in_the_json_form_and_old_files_read_as_output():
    g = taps.models.gpt(hidden=64, heads=4, seq=32, batch=8)
    doc = g.to_dict()
    by_name = {op["name"]: op for op in doc["ops"]}
    assert by_name["scores"]["output"]["saved"] == "none"
    assert by_name["softmax"]["output"]["saved"] == "rows"
    assert "saved" not in by_name["fc1"]["output"]  # the default is not written
    assert taps.Graph.from_json(g.to_json()) == g
    # A file written before the marker: every output kept.
    for op in doc["ops"]:
        op["output"].pop("saved", None)
    old = taps.Graph.from_dict(doc)
    assert {op.saved for op in old.ops} == {"output"}
    assert old == taps.models.gpt(hidden=64, heads=4, seq=32, batch=8, fused_attention=False)
    doc["ops"][0]["output"]["saved"] = "some"
    with pytest.raises(taps.GraphError, match=r"ops\[0\]\.output\.saved: expected one of") as e:
        taps.Graph.from_json(json.dumps(doc))
    assert "\n" not in str(e.value)


def test_saved_is_part_of_the_signature():
    a, b = taps.Graph(), taps.Graph()
    for g, saved in ((a, "output"), (b, "none")):
        g.einsum("e", "bi,io->bo", g.input("x", (8, 4)), g.parameter("w", (4, 4)), saved=saved)
    assert a.signature("e") != b.signature("e")
    with pytest.raises(taps.GraphError, match="saved must be one of output, rows, none"):
        a.add_operator("r", "relu", [("x", "bi")], "bi", saved="x")


@pytest.mark.parametrize(
    ("pricing", "dtype", "weight", "rest"),
    [
        (Pricing(), 2, 2, 4 + 4 + 8),  # mixed-precision Adam, fp32 gradients: 18 bytes
        (Pricing(), 4, 4, 4 + 8),  # fp32 Adam: no master copy, 16 bytes
        (Pricing(optimizer="sgd"), 2, 2, 4 + 4 + 4),
        (Pricing(optimizer="none", master_weights=False), 2, 2, 4),
        (Pricing(gradient_bytes=None), 2, 2, 2 + 4 + 8),  # gradients as the weight: 16 bytes
        (Pricing(parameter_bytes=4), 2, 4, 4 + 8),  # fp32 weights, bf16 only in the graph
    ],
)
def test_parameter_memory_is_weight_gradient_master_and_state(pricing, dtype, weight, rest):
    assert pricing.parameter_memory(dtype) == (weight, rest)


def test_memory_counts_the_optimizer_and_zero_shards_all_but_the_weight():
    g = taps.Graph(name="m")
    g.linear("fc", g.input("x", (8, 16)), 32)
    op = g.op("fc")
    for cand in candidates(op, 4):
        deg = dict(zip(op.partitionable, cand.strategy.degrees))
        weight = 16 * 32 / (deg[op.partitionable[1]] * deg[op.partitionable[2]])
        out = 8 * 32 / (deg[op.partitionable[0]] * deg[op.partitionable[2]]) * 2
        dp = deg[op.partitionable[0]]  # the weight's gradient is summed over the batch
        assert memory(g, op, cand, Pricing(optimizer="sgd")) == weight * 14 + out
        assert memory(g, op, cand, Pricing(zero=True)) == weight * (2 + 16 / dp) + out


def test_nothing_fits_names_the_layers_and_the_largest_operators():
    """Four tied blocks standing for 3 layers each: 12 layers, and the operators needing the
    most memory counted over their four instances."""
    g = taps.models.gpt(hidden=64, heads=4, seq=32, batch=8, layers=3, blocks=4, tie=True)
    cluster = Cluster(1, 4)
    tables = build_tables(g, cluster)
    need = smallest_memory(tables)
    least = {name: float(t.memory.min()) for name, t in tables.ops.items()}
    per_position = {
        name: 3 * sum(least[f"h{i}.{name}"] for i in range(4))
        for name in (op.name.partition(".")[2] for op in g.ops if op.name.startswith("h0."))
    }
    top = sorted(per_position, key=lambda n: -per_position[n])[:3]
    assert [(n, c) for n, c, _ in largest_needs(tables)] == [(f"h0.{n}", 4) for n in top]
    with pytest.raises(taps.InfeasibleError) as e:
        taps.search(g, cluster, memory_limit=need / 2)
    message = str(e.value)
    assert "\n" not in message
    assert f"the smallest needs {need:,.0f} bytes for 12 layer(s)" in message
    assert re.search(rf"'h0\.{re.escape(top[0])}' x4 {per_position[top[0]]:,.0f}", message)
    assert math.isclose(sum(per_position.values()), need, rel_tol=1e-12)


def _peak_by_schedule(graph: taps.Graph, every: int) -> float:
    """A second, plain account of checkpointing on one device: list the model's layers (tie
    instances in order, each graph copy after the other), and walk the backward from the last
    layer to the first; while a checkpointed layer runs its backward its forward's activations
    are held again. The peak over that walk, plus what lies outside the layers."""
    one = {op.name: memory(graph, op, candidates(op, 1)[0]) for op in graph.ops}
    params = {op.name: memory(graph, op, candidates(op, 1)[0], Pricing(), 0.0) for op in graph.ops}
    instances = [list(i) for group in graph.tied for i in group] or [[o.name for o in graph.ops]]
    layers = [inst for _ in range(graph.layers) for inst in instances]
    marked = [i % every == 0 for i in range(len(layers))]
    consumers: dict[str, set[str]] = {}
    for e in graph.edges:
        consumers.setdefault(e.tensor, set()).add(e.consumer)

    def leaves(name: str, inst: list[str]) -> bool:
        used = consumers.get(graph.op(name).output.tensor, set())
        return not used or not used <= set(inst)

    in_layers = {n for inst in instances for n in inst}
    outside = graph.layers * sum(one[n] for n in one if n not in in_layers)
    weights = sum(params[n] for inst in layers for n in inst)
    held = [
        sum(one[n] - params[n] for n in inst if not m or leaves(n, inst))
        for inst, m in zip(layers, marked)
    ]
    again = [
        sum(one[n] - params[n] for n in inst if not leaves(n, inst)) if m else 0.0
        for inst, m in zip(layers, marked)
    ]
    return outside + weights + sum(held) + max(again)


@pytest.mark.parametrize("blocks", [1, 3, 4])
@pytest.mark.parametrize("copies", [1, 2])
@pytest.mark.parametrize("every", [1, 2, 3])
def test_checkpointing_keeps_the_schedules_peak(blocks, copies, every):
    g = taps.models.gpt(
        hidden=32, heads=2, seq=16, batch=2, layers=copies, blocks=blocks, tie=blocks > 1
    )
    one = Cluster(1, 1)
    tables = build_tables(g, one, Pricing(checkpoint=every))
    assert smallest_memory(tables) == pytest.approx(_peak_by_schedule(g, every), rel=1e-12)
    layers = copies * blocks
    marked = len(range(0, layers, every))
    # One checkpointed layer holds its activations again while it recomputes: no saving.
    plain = smallest_memory(build_tables(g, one))
    assert smallest_memory(tables) < plain if marked > 1 else smallest_memory(tables) == plain
    recomputed = checkpointing(g, every).recomputed
    assert copies * sum(recomputed.values()) == pytest.approx(marked * len(g.ops) / blocks)


def test_checkpointing_is_refused_below_zero_and_saved_with_the_plan():
    with pytest.raises(taps.ArgumentError, match="checkpoint must be 0"):
        Pricing(checkpoint=-1)
    g = taps.models.gpt(hidden=32, heads=2, seq=16, batch=2, blocks=2, tie=True)
    plan = taps.search(g, Cluster(1, 2), Pricing(checkpoint=1, optimizer="sgd")).plan
    assert taps.Plan.from_json(plan.to_json()).pricing == plan.pricing


def test_the_command_line_states_optimizer_and_checkpointing(tmp_path, capsys):
    from taps.cli import main

    path = tmp_path / "plan.json"
    argv = ["search", "gpt", "--nodes", "1", "--devices-per-node", "2", "--batch", "2"]
    argv += ["--memory", "inf"]  # 96 GPT-3 layers fit no two devices: the flags are under test
    assert main([*argv, "--optimizer", "sgd", "--checkpoint", "2", "--save", str(path)]) == 0
    pricing = taps.Plan.load(path).pricing
    assert (pricing.optimizer, pricing.checkpoint) == ("sgd", 2)
    # A saved plan carries them: giving them again is refused in one line.
    assert main(["search", str(path), "--checkpoint", "1"]) == 2
    assert "leave out --checkpoint" in capsys.readouterr().err
    assert main([*argv, "--checkpoint", "-1"]) == 2
    assert "checkpoint must be 0" in capsys.readouterr().err


def _frozen_pair(frozen: bool) -> taps.Graph:
    g = taps.Graph(name="m")
    x = g.input("x", (8, 16))
    w = g.parameter("w", (16, 32), requires_grad=not frozen)
    g.einsum("fc", "bi,io->bo", x, w)
    return g


def test_a_frozen_parameter_holds_its_weight_alone_and_reduces_no_gradient():
    """A frozen weight (a fine-tune's base) costs its bf16 shard and nothing else: the trained
    one 2 + 4 + 4 + 8 = 18 bytes an element (weight, fp32 gradient, master copy, Adam's two
    moments); and its data-parallel plan issues no gradient all_reduce."""
    trained, frozen = _frozen_pair(False), _frozen_pair(True)
    op = frozen.op("fc")
    assert not frozen.tensors["w"].requires_grad and not frozen.tensors["fc.out"].requires_grad
    for cand in candidates(op, 4):
        deg = dict(zip(op.partitionable, cand.strategy.degrees))
        shard = 16 * 32 / (deg["i"] * deg["o"])
        out = 8 * 32 / (deg["b"] * deg["o"]) * 2
        assert memory(frozen, op, cand) == shard * 2 + out
        assert memory(trained, op, cand) == shard * 18 + out
    dp = {"fc": taps.Strategy([4, 1, 1], [0, -1, -1])}

    def reasons(g: taps.Graph) -> list[str]:
        rows = taps.breakdown(taps.Plan(g, Cluster(1, 4), dp))
        return [c.reason for row in rows for c, _ in row.collectives]

    assert reasons(trained) == ["gradient"] and reasons(frozen) == []


def test_a_frozen_parameter_is_kept_in_the_json_form_and_old_files_read_as_trained():
    frozen = _frozen_pair(True)
    doc = json.loads(frozen.to_json())
    (w,) = [t for t in doc["tensors"] if t["name"] == "w"]
    assert w["requires_grad"] is False
    assert taps.Graph.from_json(frozen.to_json()) == frozen
    del w["requires_grad"]
    assert taps.Graph.from_json(json.dumps(doc)) == _frozen_pair(False)
    w["requires_grad"] = "no"
    with pytest.raises(taps.GraphError, match=r"tensors\[1\]\.requires_grad: expected bool"):
        taps.Graph.from_json(json.dumps(doc))
