"""The export of pipelined plans: cuts mapped to module boundaries (against a brute force over
every module, and against torch.distributed.pipelining's own split of real transformers and
torchvision models), each stage's placements, the JAX meshes per stage, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import taps
from pipelined import llama8, pipelined
from taps.errors import ExportError
from taps.export.pipeline import (
    Cut,
    module_cuts,
    to_dtensor_pipeline,
    to_jax_pipeline,
    to_pipeline,
)
from taps.plan.stages import Pipeline
from taps.verify.torch.values import materialize

# -- the cut against a brute force ----------------------------------------------------------


@st.composite
def _modules(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """A random module tree run in order: each module makes some operators of its own
    (``path.kind_i``) before, between and after its children's calls."""
    paths: list[str] = []
    ops: list[str] = []

    def run(path: str, depth: int) -> None:
        children = draw(st.integers(0, 3 if depth < 3 else 0))
        for c in range(children + 1):
            for _ in range(draw(st.integers(0, 2))):
                ops.append(f"{path}.op{len(ops)}" if path else f"op{len(ops)}")
            if c < children:
                child = f"{path}.m{c}" if path else f"m{c}"
                paths.append(child)
                run(child, depth + 1)

    run("", 0)
    return paths, ops


def _brute(ops: list[str], paths: list[str], starts: list[int]) -> tuple[Cut, ...] | None:
    """Every module's operator indices; for each cut the outermost module that opens the next
    stage, else the outermost that closes the previous; ``None`` when a cut has neither."""
    owned = {
        m: [i for i, o in enumerate(ops) if o.rsplit(".", 1)[0] == m or o.startswith(m + ".")]
        for m in paths
    }
    bounds = [0, *starts, len(ops)]
    out = []
    for k in range(1, len(bounds) - 1):
        begin, start, end = bounds[k - 1], bounds[k], bounds[k + 1]
        by_depth = sorted(paths, key=lambda m: m.count("."))
        opens = [m for m in by_depth if owned[m] and owned[m][0] == start and owned[m][-1] < end]
        opens = [m for m in opens if ops[start].startswith(m + ".")]
        closes = [m for m in by_depth if owned[m] and owned[m][-1] == start - 1]
        closes = [m for m in closes if owned[m][0] >= begin and ops[start - 1].startswith(m + ".")]
        if opens:
            out.append(Cut(k, opens[0], "beginning"))
        elif closes:
            out.append(Cut(k, closes[0], "end"))
        else:
            return None
    return tuple(out)


@given(_modules(), st.data())
def test_module_cuts_match_a_brute_force(tree: tuple[list[str], list[str]], data: st.DataObject):
    paths, ops = tree
    if len(ops) < 2:
        return
    starts = sorted(data.draw(st.sets(st.integers(1, len(ops) - 1), min_size=1, max_size=3)))
    want = _brute(ops, paths, starts)
    if want is None:
        with pytest.raises(ExportError, match="falls inside"):
            module_cuts(ops, starts, paths)
    else:
        assert module_cuts(ops, starts, paths) == want


# -- real models --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, torch.Tensor, taps.Graph]:
    module, x = llama8()
    return module, x, taps.from_torch(module, x)


def _check_split(module: torch.nn.Module, x: torch.Tensor, plan: taps.Plan) -> None:
    """Each stage module makes exactly its stage's operators, and the stages run one after the
    other give the module's output (torch's split, checked against taps' cuts)."""
    pp = to_pipeline(module, plan, x)
    for k, stage in enumerate(plan.stages):
        graph = taps.from_torch(pp.stage_module(k), *pp.stage_inputs[k], tie=False)
        assert [op.name for op in graph.ops] == list(stage.operators)
    # Seeded values for every parameter and buffer: to_empty alone leaves the buffers (the
    # rotary tables) as whatever memory held, NaN at times.
    real = materialize(module, torch.float32, "cpu", seed=0)
    with torch.no_grad():
        pp = to_pipeline(real, plan, x)
        got = dict(zip(pp.routes[0].received, pp.stage_inputs[0]))
        for k, route in enumerate(pp.routes):
            out = pp.stage_module(k)(*(got[n] for n in route.reads))
            got.update(zip(route.makes, out if isinstance(out, tuple) else (out,)))
        want = real(x[: x.shape[0] // (plan.pipeline.microbatches * plan.pipeline.replicas)])
    torch.testing.assert_close(got[pp.routes[-1].carries[0]], want)


def test_llama_split_at_a_layer(llama):
    module, x, graph = llama
    plan = pipelined(graph, taps.Cluster(1, 4), ["model.layers.1.input_layernorm.pow"])
    pp = to_pipeline(module, plan, x)
    assert pp.cuts == (Cut(1, "model.layers.1", "beginning"),)
    assert pp.schedule_class == "Schedule1F1B"
    _check_split(module, x, plan)


def test_llama_split_after_a_block_ends(llama):
    # The residual add after the attention is the block's own: the cut opens no module, but the
    # attention closes exactly before it.
    module, x, graph = llama
    plan = pipelined(graph, taps.Cluster(1, 4), ["model.layers.0.add"])
    pp = to_pipeline(module, plan, x)
    assert pp.cuts == (Cut(1, "model.layers.0.self_attn", "end"),)
    _check_split(module, x, plan)


def test_searched_plan_exports(llama):
    module, x, graph = llama
    ask = Pipeline(stages=2, microbatches=2, schedule="1f1b", replicas=1)
    plan = taps.search(graph, taps.Cluster(1, 4), pipeline=ask).plan
    pp = to_pipeline(module, plan, x)
    assert len(pp.cuts) == 1
    for k, p in enumerate(pp.placements):
        assert p == taps.export.to_dtensor(plan.stage_plans[k])
        assert p.mesh.num_devices == 2
    doc = json.loads(pp.to_json())
    assert doc["format"] == "taps.export.pipeline"
    assert doc["schedule_class"] == "Schedule1F1B"
    assert [s["ranks"] for s in doc["stages"]] == [[[0, 1]], [[2, 3]]]
    assert doc["stages"][1]["split"] == {"module": pp.cuts[0].module, "point": pp.cuts[0].point}
    assert doc == {**to_dtensor_pipeline(plan).to_dict(), "stages": doc["stages"]}


def test_resnet_split_at_a_stage():
    import torchvision

    with torch.device("meta"):
        module = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 32, 32, device="meta")
    graph = taps.from_torch(module, x)
    plan = pipelined(graph, taps.Cluster(1, 4), ["layer3.0.conv1"], schedule="gpipe")
    pp = to_pipeline(module, plan, x)
    assert pp.cuts == (Cut(1, "layer3", "beginning"),)
    assert pp.schedule_class == "ScheduleGPipe"
    for k, stage in enumerate(plan.stages):
        sub = taps.from_torch(pp.stage_module(k), *pp.stage_inputs[k], tie=False)
        assert [op.name for op in sub.ops] == list(stage.operators)
    # A cut between a block's residual add and the ReLU it calls a second time is inside it.
    bad = pipelined(graph, taps.Cluster(1, 4), ["layer1.0.relu.relu_2"])
    with pytest.raises(ExportError, match=r"inside module 'layer1\.0'"):
        to_pipeline(module, bad, x)


def test_interleaved_schedule_and_replicas(llama):
    module, x, graph = llama
    starts = [
        "model.layers.0.self_attn.q_proj",
        "model.layers.1.input_layernorm.pow",
        "model.layers.1.self_attn.q_proj",
    ]
    plan = pipelined(
        graph, taps.Cluster(1, 8), starts, schedule="interleaved-1f1b", replicas=2, chunks=2
    )
    pp = to_pipeline(module, plan, x)
    assert [c.module for c in pp.cuts] == [
        "model.layers.0.self_attn",
        "model.layers.1.input_layernorm",  # layer 1 is cut again: its norm alone opens the stage
        "model.layers.1.self_attn",
    ]
    assert pp.schedule_class == "ScheduleInterleaved1F1B"
    # Copy 1 is 4 ranks on; stage 2 runs on group 0 again (the interleaved chunks).
    assert pp.ranks(2, replica=1) == range(4, 6)
    assert pp.place(5).stages == (0, 2) and pp.place(5).replica == 1
    assert pp.pipeline_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert pp.replica_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    _check_split(module, x, plan)


# -- JAX ------------------------------------------------------------------------------------


def test_jax_mesh_and_shardings_per_stage(llama):
    import jax

    _, _, graph = llama
    plan = pipelined(graph, taps.Cluster(1, 4), ["model.layers.1.input_layernorm.pow"])
    jp = to_jax_pipeline(plan)
    for k, stage_plan in enumerate(plan.stage_plans):
        assert jp.shardings[k] == taps.export.to_jax(stage_plan)
        mesh = jp.jax_mesh(k)
        assert list(mesh.devices.flat) == jax.devices()[2 * k : 2 * k + 2]
    name = "model.layers.1.mlp.up_proj.weight"
    sharding = jp.sharding(1, name)
    shape = graph.tensors[name].shape
    blocks = sharding.devices_indices_map(shape)
    assert set(blocks) == set(jax.devices()[2:4])
    whole = np.zeros(shape)
    for index in blocks.values():
        whole[index] += 1
    # Every element is held by as many devices as the spec leaves the tensor whole over.
    assert whole.min() == whole.max() >= 1
    assert json.loads(jp.to_json())["framework"] == "jax"


# -- errors -----------------------------------------------------------------------------------


def test_errors_are_one_line(llama):
    module, x, graph = llama
    plain = taps.search(graph, taps.Cluster(1, 4)).plan
    with pytest.raises(ExportError, match="no pipeline stages"):
        to_pipeline(module, plain, x)
    with pytest.raises(ExportError, match="no pipeline stages"):
        to_jax_pipeline(plain)
    inside = pipelined(graph, taps.Cluster(1, 4), ["model.layers.1.input_layernorm.mean"])
    with pytest.raises(
        ExportError, match=r"inside module 'model\.layers\.1\.input_layernorm'"
    ) as e:
        to_pipeline(module, inside, x)
    assert "\n" not in str(e.value)
    plan = pipelined(graph, taps.Cluster(1, 4), ["model.layers.1.input_layernorm.pow"])
    with pytest.raises(ExportError, match="does not split into 2 microbatches"):
        to_pipeline(module, plan, x[:3])
    with pytest.raises(ExportError, match=r"torch\.nn\.Module"):
        to_pipeline(object(), plan, x)
    # The module on another batch: split the same way, the same operator names.
    with pytest.raises(ExportError, match="another batch") as e:
        to_pipeline(module, plan, torch.cat([x, x]))
    assert "\n" not in str(e.value)
    with pytest.raises(ExportError, match="no stage 2"):
        to_jax_pipeline(plan).ranks(2)


def test_cli_exports_a_saved_pipelined_plan(llama, tmp_path):
    from taps.cli import main

    _, _, graph = llama
    plan = pipelined(graph, taps.Cluster(1, 4), ["model.layers.1.input_layernorm.pow"])
    saved = tmp_path / "plan.json"
    plan.save(saved)
    for framework in ("dtensor", "jax"):
        out = tmp_path / f"{framework}.json"
        assert main(["export", str(saved), "--to", framework, str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["format"] == "taps.export.pipeline" and doc["framework"] == framework
        assert [s["ranks"] for s in doc["stages"]] == [[[0, 1]], [[2, 3]]]
        key = "dtensor" if framework == "dtensor" else "jax"
        assert doc["stages"][1][key]["mesh"]["shape"] == [2]
