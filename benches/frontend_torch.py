"""The PyTorch front end at scale: torchtitan's Llama 3 built from its config on the meta device
(no weights), exported, converted and searched.

    python benches/frontend_torch.py              # 8B: export + convert, search on 8 x 8 (80 GB)
    python benches/frontend_torch.py --nodes 128  # the same on 1024 devices
    python benches/frontend_torch.py --against REV  # also the search with taps at git REV
    python benches/frontend_torch.py --untied     # also the search without ties
    python benches/frontend_torch.py --rss 70B    # peak RSS of converting 70B (run on its own)
    python benches/frontend_torch.py --families   # export + convert each model family of the tests
    python benches/frontend_torch.py --sweep      # each family: converts, parameters, export, runs

Prints one line per measurement; times are wall clock on this machine. With ``--against`` the
tied search runs again in a fresh interpreter with the taps package of git revision REV (the code
before a change) on the same graph, and the ratio of the two search times is printed.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

import taps
from peak_memory import in_fresh_process, package_at
from taps.frontends.torch import convert, repeated_blocks

#: The search at ``--against`` gets this much address space (before the price, SCIP got the
#: attention block of 8B on 1024 devices whole: millions of variables).
AGAINST_MEMORY = 12 * 2**30


def llama3(flavor: str, layers: int | None = None) -> torch.nn.Module:
    """torchtitan's Llama 3 with SDPA attention (flex attention needs a block mask built on a
    real device), in bf16, on the meta device."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    config = llama3_configs[flavor](attn_backend="flex")
    if layers is not None:
        config.layers = config.layers[:layers]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    with torch.device("meta"):
        return config.build().to(torch.bfloat16)


def tied_llama3(flavor: str, batch: int, seq: int) -> taps.Graph:
    """:func:`llama3` exported on ``batch`` x ``seq`` tokens and converted, its blocks tied."""
    module = llama3(flavor)
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    conversion = convert(torch.export.export(module, (tokens,)), name=f"llama3-{flavor}")
    for instances in repeated_blocks(conversion, module):
        conversion.graph.tie(instances)
    return conversion.graph


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed_search(graph_json: str, nodes: int, per_node: int, memory: float) -> dict:
    """The tied search of a graph (as JSON, to cross into a fresh interpreter): its time and
    result."""
    graph = taps.Graph.from_json(graph_json)
    cluster = taps.Cluster(nodes, per_node, device_memory=memory)
    t0 = time.perf_counter()
    result = taps.search(graph, cluster)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cost": result.cost, "status": result.status, "gap": result.gap}


def families() -> None:
    """Export, convert and tie each family of the tests' factories: one line each, and the
    slowest conversion."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import torch_factories
    from test_frontend_models import MODELS

    worst = 0.0
    for name, _ in MODELS:
        module, inputs = getattr(torch_factories, name)()
        t0 = time.perf_counter()
        program = torch.export.export(module, tuple(inputs))
        t1 = time.perf_counter()
        conversion = convert(program, name=name)
        for instances in repeated_blocks(conversion, module):
            conversion.graph.tie(instances)
        t2 = time.perf_counter()
        worst = max(worst, t2 - t1)
        print(
            f"{name}: {len(conversion.graph.ops)} operators, export {t1 - t0:.2f} s, "
            f"convert + tie {t2 - t1:.2f} s",
            flush=True,
        )
    print(f"slowest conversion on top of torch.export: {worst:.2f} s")


def sweep(names: list[str]) -> None:
    """The new user's sweep (docs/frontends.md#the-model-families): per family of the tests,
    whether it converts with no operator left without a rule, its graph parameters equal the
    module's, the DTensor export of its plan on 1 x 4 devices names every parameter and buffer
    with a placement per mesh dim, and ``distribute_module`` runs its forward in each mode on
    the fake process group; a failure as its first line."""
    import warnings

    import torch.distributed as tdist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from taps.export import distribute_module, to_dtensor
    from taps.export.distribute import export_module

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import torch_factories
    from test_frontend_models import MODELS

    warnings.simplefilter("ignore")
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    counts = dict.fromkeys(("converts", "params", "export", "dtensor", "taps"), 0)
    for name in names or [m for m, _ in MODELS]:
        row: dict[str, str] = {}
        module, inputs = getattr(torch_factories, name)()
        module.train()
        try:
            exported = export_module(module, *inputs)
        except taps.TapsError as e:
            print(f"{name}: converts: {str(e).splitlines()[0]}", flush=True)
            continue
        graph = exported.conversion.graph
        row["converts"] = "yes"
        want = sum(p.numel() for p in module.parameters())
        row["params"] = "yes" if graph.num_parameters() == want else f"{graph.num_parameters()}"
        plan = taps.search(graph, taps.Cluster(1, 4)).plan
        dt = to_dtensor(plan, module)
        named = [*dict(module.named_parameters()), *dict(module.named_buffers())]
        bad = [n for n in named if len(dt.tensors.get(n, ())) != len(dt.mesh.shape)]
        row["export"] = "yes" if not bad else f"{len(bad)} unnamed"
        mesh = DeviceMesh(
            "cpu", torch.arange(4).reshape(dt.mesh.shape), mesh_dim_names=dt.mesh.axis_names
        )
        for mode in ("dtensor", "taps"):
            try:
                dm = distribute_module(
                    module, plan, *inputs, mesh=mesh, mode=mode, exported=exported
                )
                dm(*inputs)
                row[mode] = "yes"
            except Exception as e:  # a failure of the run is the sweep's finding
                row[mode] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        for k, v in row.items():
            counts[k] += v == "yes"
        print(f"{name}: " + "; ".join(f"{k}: {v}" for k, v in row.items()), flush=True)
    tdist.destroy_process_group()
    print(", ".join(f"{k} {v}" for k, v in counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="8B")
    parser.add_argument("--layers", type=int, default=None, help="keep the first N layers")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--memory", type=float, default=80e9, help="bytes per device (0: none)")
    parser.add_argument("--no-search", action="store_true")
    parser.add_argument("--untied", action="store_true", help="also search without the ties")
    parser.add_argument("--rss", metavar="FLAVOR", help="only convert FLAVOR and print peak RSS")
    parser.add_argument("--against", metavar="REV", help="also search with taps at git REV")
    parser.add_argument("--families", action="store_true", help="time each tested model family")
    parser.add_argument(
        "--sweep", nargs="*", metavar="FAMILY", help="check each family (default: all) end to end"
    )
    args = parser.parse_args()
    if args.families:
        families()
        return
    if args.sweep is not None:
        sweep(args.sweep)
        return
    flavor = args.rss or args.flavor
    t0 = time.perf_counter()
    module = llama3(flavor, args.layers)
    tokens = torch.zeros(args.batch, args.seq, dtype=torch.long, device="meta")
    t1 = time.perf_counter()
    program = torch.export.export(module, (tokens,))
    t2 = time.perf_counter()
    conversion = convert(program, name=f"llama3-{flavor}")
    graph = conversion.graph
    t3 = time.perf_counter()
    groups = repeated_blocks(conversion, module)
    for instances in groups:
        graph.tie(instances)
    t4 = time.perf_counter()
    params = sum(p.numel() for p in module.parameters())
    print(
        f"llama3-{flavor}: {params / 1e9:.2f}B parameters ({graph.num_parameters() / 1e9:.2f}B in "
        f"the graph), {len(graph.ops)} operators, ties {[len(g) for g in groups]}"
    )
    print(
        f"  build {t1 - t0:.2f} s, export {t2 - t1:.2f} s, convert {t3 - t2:.2f} s, "
        f"repeated blocks {t4 - t3:.2f} s; peak RSS {peak_rss_gib():.2f} GiB"
    )
    if args.rss or args.no_search:
        return
    memory = args.memory or math.inf  # 0: no limit
    cluster = taps.Cluster(args.nodes, args.devices_per_node, device_memory=memory)
    for tie in (True, False) if args.untied else (True,):
        t5 = time.perf_counter()
        result = taps.search(graph, cluster, tie=tie)
        t6 = time.perf_counter()
        limit = f"{memory / 1e9:g} GB" if math.isfinite(memory) else "no memory limit"
        print(
            f"  search ({'tied' if tie else 'untied'}) on {args.nodes} x {args.devices_per_node} "
            f"({limit}): {t6 - t5:.2f} s, status {result.status}, gap "
            f"{result.gap:g}, cost {result.cost * 1e3:.2f} ms, memory "
            f"{result.memory_per_device / 1e9:.1f} GB/device; stages "
            f"{', '.join(f'{k} {v:.2f}' for k, v in result.timings.items())}"
        )
        if tie:
            tied_seconds, tied_cost = t6 - t5, result.cost
            print(
                f"  end to end (tied): export + convert + search {t6 - t1:.2f} s, with the model "
                f"build {t6 - t0:.2f} s; peak RSS {peak_rss_gib():.2f} GiB"
            )
    if args.against:
        with package_at(args.against) as before:
            try:
                then, peak = in_fresh_process(
                    timed_search,
                    graph.to_json(),
                    args.nodes,
                    args.devices_per_node,
                    memory,
                    memory_limit=AGAINST_MEMORY,
                    package=before,
                )
            except (BrokenProcessPool, MemoryError):
                print(f"  search (tied) with taps at {args.against}: out of memory")
                return
        same = abs(then["cost"] - tied_cost) <= 1e-9 * abs(then["cost"])
        print(
            f"  search (tied) with taps at {args.against}: {then['seconds']:.2f} s (status "
            f"{then['status']}, gap {then['gap']:g}, {peak / 1024:.2f} GiB peak), "
            f"{then['seconds'] / tied_seconds:.1f}x today's time; same cost: {same}"
        )


if __name__ == "__main__":
    main()
