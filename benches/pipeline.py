"""The stage search (docs/pipeline.md) on the models that need many nodes: GPT-3 175B (96
layers) on 128 x 8 DGX V100 and DGX H100 nodes, and Llama 3 70B (torchtitan, 80 layers) on
32 x 8 H100, against taps without pipelining and against the Megatron-LM recipe (tensor 8
inside a node, pipeline across nodes, data parallel on the rest), all priced by the same model.

    python benches/pipeline.py                  # every case
    python benches/pipeline.py --case gpt3-h100 # one of gpt3-v100, gpt3-h100, llama3-70b
    python benches/pipeline.py --no-flat        # without the search without pipelining

Prints per case: the pipelined search's seconds (one run, after the graph is built) and the
process's peak memory so far, the chosen pipeline ((pipeline, tensor, data) degrees,
microbatches, schedule) and step time, taps without pipelining, and the Megatron-LM recipe.
"""

from __future__ import annotations

import argparse
import resource
import time

import taps
from taps.plan.stages import Pipeline

#: GPT-3 175B as Megatron-LM trained it (Narayanan et al. 2021, table 1): global batch 1,536,
#: tensor 8, pipeline 16, microbatches of one sample; data parallel on the rest.
GPT3_BATCH, GPT3_PIPELINE = 1536, 16
#: Llama 3 70B: 256 sequences of 8,192 tokens per step (2M tokens), tensor 8, pipeline 4.
LLAMA_BATCH, LLAMA_SEQ, LLAMA_PIPELINE = 256, 8192, 4


def peak_gib() -> float:
    """The process's peak resident memory so far (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def gpt3() -> taps.Graph:
    """GPT-3 175B: 96 tied layers (taps.models.gpt), bf16."""
    return taps.models.gpt(
        hidden=12288, heads=96, seq=2048, batch=GPT3_BATCH, blocks=96, tie=True, name="gpt3-175B"
    )


def llama3_70b() -> taps.Graph:
    """torchtitan's Llama 3 70B exported on the meta device, its 80 blocks tied."""
    from frontend_torch import tied_llama3

    return tied_llama3("70B", LLAMA_BATCH, LLAMA_SEQ)


def degrees(plan: taps.Plan) -> tuple[int, int, int]:
    """(pipeline, tensor, data) of a pipelined plan: its device groups; in its first stage, the
    operator with the largest parameter: the split of its first input's leading (batch) axis
    times the copies is data, the rest tensor."""
    p = plan.pipeline
    stage = plan.stage_plans[0]
    graph = stage.graph

    def weight(op: taps.Operator) -> int:
        return max(
            (
                graph.tensors[o.tensor].numel
                for o in op.inputs
                if graph.root(o.tensor).kind == "parameter"
            ),
            default=0,
        )

    op = max(graph.ops, key=weight)
    s = stage.strategies[op.name]
    split = dict(zip(op.partitionable, s.degrees))
    data = split.get(op.inputs[0].dims[0], 1)
    tensor = s.num_devices // s.replicas // data
    return p.stages, tensor, data * p.replicas * s.replicas


def case(
    name: str, graph: taps.Graph, cluster: taps.Cluster, batch: int, pipe: int, flat: bool
) -> None:
    print(
        f"{name}: {len(graph.ops)} operators, {graph.num_parameters() / 1e9:.1f}B parameters, "
        f"batch {batch}; {cluster.nodes} x {cluster.devices_per_node} {cluster.device.name} "
        f"({cluster.num_devices:,} devices)"
    )
    t0 = time.perf_counter()
    found = taps.search(graph, cluster, pipeline=True)
    seconds = time.perf_counter() - t0
    p = found.plan.pipeline
    print(
        f"  pipelined search: {seconds:.2f} s ({found.unit_searches} unit searches), peak "
        f"memory so far {peak_gib():.2f} GiB"
    )
    print(
        f"  taps, pipelined: (pipeline, tensor, data) {degrees(found.plan)}, {p.schedule}, "
        f"{p.microbatches} microbatches, chunks {p.chunks}: step {found.step_time:.3f} s, "
        f"{found.memory_per_device / 1e9:.1f} GB per device"
    )
    if flat:
        t0 = time.perf_counter()
        whole = _fitting(lambda pricing: taps.search(graph, cluster, pricing))
        if whole is not None:
            result, how = whole
            print(
                f"  taps, not pipelined{how}: step {result.step.step_time:.3f} s, "
                f"{result.memory_per_device / 1e9:.1f} GB per device "
                f"(searched in {time.perf_counter() - t0:.1f} s)"
            )
    replicas = cluster.num_devices // (8 * pipe)
    spec = Pipeline(stages=pipe, replicas=replicas, schedule="1f1b", microbatches=batch // replicas)
    recipe = _fitting(lambda pricing: taps.search(graph, cluster, pricing, pipeline=spec))
    if recipe is not None:
        megatron, how = recipe
        print(
            f"  Megatron-LM recipe{how} (pipeline, tensor, data) {degrees(megatron.plan)}, 1f1b, "
            f"{spec.microbatches} microbatches: step {megatron.step_time:.3f} s, "
            f"{megatron.memory_per_device / 1e9:.1f} GB per device"
        )


def _fitting(run):  # type: ignore[no-untyped-def]
    """``run(pricing)`` under the default pricing, or with every layer's activations
    checkpointed when nothing fits without (as Megatron-LM recomputes them); prints the refusal
    when neither fits."""
    try:
        return run(taps.Pricing()), ""
    except taps.InfeasibleError as e:
        first = str(e)
    try:
        return run(taps.Pricing(checkpoint=1)), ", every layer checkpointed"
    except taps.InfeasibleError as e:
        print(f"    does not fit: {first}; checkpointed: {e}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("gpt3-v100", "gpt3-h100", "llama3-70b"), action="append")
    parser.add_argument("--no-flat", action="store_true")
    args = parser.parse_args()
    chosen = args.case or ["gpt3-v100", "gpt3-h100", "llama3-70b"]
    for name in chosen:
        if name.startswith("gpt3"):
            preset = "dgx-v100" if name.endswith("v100") else "dgx-h100"
            graph, cluster = gpt3(), taps.Cluster.preset(preset, 128)
            case(name, graph, cluster, GPT3_BATCH, GPT3_PIPELINE, not args.no_flat)
        else:
            graph, cluster = llama3_70b(), taps.Cluster.preset("dgx-h100", 32)
            case(name, graph, cluster, LLAMA_BATCH, LLAMA_PIPELINE, not args.no_flat)


if __name__ == "__main__":
    main()
