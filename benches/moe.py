"""Mixture-of-experts models from the module to a plan (docs/moe.md).

    python benches/moe.py                 # Mixtral 8x7B (32 layers) on 64 devices, DeepSeek-V3
                                          # (61 layers, 256 experts) on 256: export, convert, search
    python benches/moe.py --whole         # the same, every layer exported (not once and copied)
    python benches/moe.py --compare       # one layer of each on 8 x 8 DGX H100 and on the paper's
                                          # cluster: the searched plan against pure data and pure
                                          # tensor parallelism, priced by the same model

Targets: Mixtral from the module to a plan in at most 10 s, DeepSeek-V3 in at most 30 s, peak
memory under 2 GB. The models are transformers' built from their configs on the meta device in
bf16, a batch of ``--batch`` sequences of ``--seq`` tokens: by default Mixtral 64 x 4096 on 64
devices, DeepSeek-V3 16 x 4096 on 256 (all 61 layers on 256 devices, no pipeline: the unlimited
optimum needs 84 GB per device, over the H100's 80, so the memory-bound search decides it; 64
sequences need 119 GB at least, which the search refuses in one line; DeepSeek-V3 trains on
4096-token sequences, its 15,360-sequence batch over 2,048 GPUs in micro-batches, 1,920
sequences per 256 GPUs per step).
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import torch
import transformers

import taps
from taps.frontends.torch import from_torch
from taps.graph import MOE_DISPATCH
from taps.report.tables import experts_text
from taps.reproduce.cases import paper_cluster

#: Per model: config, model class, config changes, layers, DGX H100 nodes, default batch.
MODELS = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, {}, 32, 8, 64),
    # Every layer a mixture of experts (the released model's first three are dense).
    "deepseek-v3": (
        transformers.DeepseekV3Config,
        transformers.DeepseekV3ForCausalLM,
        {"first_k_dense_replace": 0},
        61,
        32,
        16,
    ),
}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def graph_of(name: str, layers: int, batch: int, seq: int, once: bool = True) -> taps.Graph:
    """The model's tied graph (``once``: its identical layers exported once and copied)."""
    config_cls, model_cls, extra, *_ = MODELS[name]
    config = config_cls(num_hidden_layers=layers, use_cache=False, **extra)
    with torch.device("meta"):
        model = model_cls(config).to(torch.bfloat16)
        ids = torch.zeros(batch, seq, dtype=torch.long)
    return from_torch(model, ids, name=name, once=once)


def _blocks(graph: taps.Graph) -> list[str]:
    return [op.name.removesuffix(f".{MOE_DISPATCH}") for op in graph.ops if op.kind == MOE_DISPATCH]


def restricted(graph: taps.Graph, keep) -> taps.Graph:
    """``graph`` with each operator's partitionable axes cut to those ``keep(op, axis)`` keeps."""
    data = graph.to_dict()
    for op in data["ops"]:
        op["partitionable"] = [a for a in op["partitionable"] if keep(op["name"], a)]
    return taps.Graph.from_dict(data)


def baselines(graph: taps.Graph) -> dict[str, taps.Graph]:
    """Pure data parallelism (only the batch's rows, sequences and token groups split) and pure
    tensor parallelism (only features, heads and the experts' hidden width split; the experts and
    the tokens whole)."""
    blocks = _blocks(graph)

    def data(name: str, axis: str) -> bool:
        return axis == "b" or (axis == "g" and any(name.startswith(p + ".") for p in blocks))

    def tensor(name: str, axis: str) -> bool:
        return not data(name, axis) and axis not in ("e", "s", "t", "c")

    return {"pure data": restricted(graph, data), "pure tensor": restricted(graph, tensor)}


def lifted(plan: taps.Plan, graph: taps.Graph, cluster: taps.Cluster) -> taps.Plan:
    """A restricted graph's plan as a plan of ``graph``: axes it could not split stay whole."""
    strategies = {}
    for op in graph.ops:
        small = plan.graph.op(op.name)
        s = plan.strategies[op.name]
        got = dict(zip(small.partitionable, zip(s.degrees, s.device_map)))
        pairs = [got.get(a, (1, -1)) for a in op.partitionable]
        strategies[op.name] = taps.Strategy(
            [d for d, _ in pairs], [m for _, m in pairs], s.device_matrix
        )
    return taps.Plan(graph, cluster, strategies, plan.pricing)


def compare(name: str, batch: int, seq: int) -> None:
    graph = graph_of(name, 1, batch, seq)
    for label, cluster in (
        ("8 x 8 DGX H100", taps.Cluster.preset("dgx-h100", 8)),
        ("the paper's cluster, 8 x 8", paper_cluster(8)),
    ):
        found = taps.search(graph, cluster)
        rows = [("searched", found.plan, found.memory_per_device)]
        for what, small in baselines(graph).items():
            try:
                res = taps.search(small, cluster)
            except taps.TapsError as e:
                rows.append((what, None, str(e).splitlines()[0]))
                continue
            rows.append((what, lifted(res.plan, graph, cluster), res.memory_per_device))
        print(f"\n{name}, one layer, batch {batch} x {seq}, on {label}:")
        for what, plan, memory in rows:
            if plan is None:
                print(f"  {what}: {memory}")
                continue
            step = taps.step_time(plan)
            print(
                f"  {what}: step {step.step_time * 1e3:.2f} ms (compute {step.compute * 1e3:.2f},"
                f" exposed {step.exposed * 1e3:.2f}), {memory / 2**30:.1f} GiB per device; "
                f"{experts_text(plan)}"
            )


def full(name: str, batch: int, seq: int, once: bool) -> None:
    layers, nodes = MODELS[name][3:5]
    load = os.getloadavg()[0]
    w0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    graph = graph_of(name, layers, batch, seq, once)
    cluster = taps.Cluster.preset("dgx-h100", nodes)
    w1, c1 = time.perf_counter(), time.process_time()
    try:
        result = taps.search(graph, cluster)
    except taps.TapsError as e:
        w2, c2 = time.perf_counter(), time.process_time()
        print(
            f"{name}: {layers} layers, batch {batch} x {seq}, {len(graph.ops)} operators, "
            f"{cluster.num_devices} devices: export + convert + tie {w1 - w0:.1f} s (CPU "
            f"{c1 - c0:.1f} s); the search stopped after {w2 - w1:.1f} s (CPU {c2 - c1:.1f} s): "
            f"{str(e).splitlines()[0]}; peak RSS {peak_rss_gib():.2f} GiB"
        )
        return
    w2, c2, m2 = time.perf_counter(), time.process_time(), time.thread_time()
    main_cpu = m2 - m0
    stages = ", ".join(
        f"{stage} {result.timings[stage]:.1f}"
        for stage in ("enumerate", "costs", "reduce", "build", "solve", "extract")
    )
    print(
        f"{name}: {layers} layers, batch {batch} x {seq}, {len(graph.ops)} operators, "
        f"{cluster.num_devices} devices: "
        f"export + convert + tie {w1 - w0:.1f} s (CPU {c1 - c0:.1f} s), search {w2 - w1:.1f} s "
        f"(CPU {c2 - c1:.1f} s; {stages}), module to plan {w2 - w0:.1f} s (CPU {c2 - c0:.1f} s: "
        f"{main_cpu:.1f} s on the main thread, {c2 - c0 - main_cpu:.1f} s in the Rust kernels' "
        f"threads, which run on every core: on an idle machine of {os.cpu_count()} cores about "
        f"{main_cpu + (c2 - c0 - main_cpu) / (os.cpu_count() or 1):.1f} s); {result.status}, "
        f"cost {result.cost!r}, "
        f"{result.memory_per_device / 2**30:.1f} GiB per device, step "
        f"{result.step.step_time * 1e3:.1f} ms; peak RSS {peak_rss_gib():.2f} GiB"
    )
    print(f"  {experts_text(result.plan)}")
    print(f"  load average {load:.1f} before, {os.getloadavg()[0]:.1f} after (1 minute)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--model", choices=sorted(MODELS), action="append")
    parser.add_argument("--batch", type=int, help="sequences (default: the model's, above)")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--whole", action="store_true", help="export every layer (not once)")
    args = parser.parse_args()
    for name in args.model or sorted(MODELS, reverse=True):
        batch = args.batch or MODELS[name][5]
        if args.compare:
            compare(name, args.batch or 64, args.seq)
        else:
            full(name, batch, args.seq, not args.whole)


if __name__ == "__main__":
    main()
