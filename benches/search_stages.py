"""The search, stage by stage, on the paper's search-time cases and beyond, against the plain
Alpa-style formulation (a binary per strategy pair, SCIP's defaults) on the same graphs in the
same run, and with each speed-up switched off in turn; all under the paper's model (the forward
step, Algorithm 1), which the paper timed (benches/planners.py times the training step).

Run: ``.venv/bin/python benches/search_stages.py`` (``--quick`` for the small cases only,
``--large`` adds the GPT layer on 1024 and 4096 devices; ``--build`` only times building and
solving the largest ILP the benchmarks make, one GPT-3 layer standing for 12 on 1024 devices
under 80 GB without the price on memory). Every taps configuration is run
``--repeat`` times after one warm-up run and its median run is reported; the plain formulation
runs once.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

import taps
from peak_memory import in_fresh_process
from taps.reproduce import DEVICES_PER_NODE, median_search, timing_cases
from taps.reproduce.run import PAPER_MODEL
from taps.search.searching import STAGES
from taps.search.tables import build_tables

PLAIN = taps.IlpOptions(
    formulation="pairwise", prune=False, presolve=True, warm_start=False, reduce=False
)
ABLATIONS = {
    "taps": taps.IlpOptions(),
    "no reductions": taps.IlpOptions(reduce=False),
    "no elimination": taps.IlpOptions(eliminate=False),
    "no pruning": taps.IlpOptions(prune=False),
    "no warm start": taps.IlpOptions(warm_start=False),
    "with presolve": taps.IlpOptions(presolve=True),
    "pairwise": taps.IlpOptions(formulation="pairwise"),
}
#: The plain formulation is given this long (the issue's cut-off).
PLAIN_LIMIT = 120.0


@dataclass
class Case:
    name: str
    graph: taps.Graph
    cluster: taps.Cluster
    paper_seconds: float | None


def dense_block(layers: int, batch: int, hidden: int) -> taps.Graph:
    """Every layer reads an elementwise mix of all earlier layers' outputs: the operators form a
    complete graph, which no exact reduction simplifies, so SCIP solves a real core."""
    g = taps.Graph(name=f"dense block ({layers} layers)")
    outs = [g.input("x", (batch, hidden), requires_grad=True)]
    for k in range(1, layers + 1):
        spec = ",".join(["ij"] * len(outs)) + "->ij"
        mixed = outs[0] if len(outs) == 1 else g.einsum(f"mix{k}", spec, *outs)
        outs.append(g.relu(f"act{k}", g.linear(f"fc{k}", mixed, hidden)))
    return g


def cases(quick: bool, large: bool) -> list[Case]:
    """The paper's search-time cases (those of ``taps reproduce``), then ours."""
    out = [
        Case(
            f"{t.label} {t.nodes * DEVICES_PER_NODE}",
            taps.models.by_name(t.model),
            taps.Cluster(t.nodes, DEVICES_PER_NODE),
            t.paper_seconds,
        )
        for t in timing_cases(quick)
    ]
    if not quick:
        out += [
            Case("Dense block 6 32", dense_block(6, 1024, 1024), taps.Cluster(4, 8), None),
            Case("Dense block 8 64", dense_block(8, 1024, 1024), taps.Cluster(8, 8), None),
        ]
    if large:
        gpt = taps.models.gpt(hidden=12288, heads=96, seq=2048, batch=16)
        out += [
            Case("GPT 12288 1024", gpt, taps.Cluster(128, 8), None),
            Case("GPT 12288 4096", gpt, taps.Cluster(512, 8), None),
        ]
    return out


def ilp_seconds(result: taps.SearchResult) -> float:
    """Everything after the cost tables: reductions, pruning, building and solving the ILP."""
    t = result.timings
    return t["reduce"] + t["build"] + t["solve"]


def _search(quick: bool, large: bool, index: int) -> None:
    case = cases(quick, large)[index]
    taps.search(case.graph, case.cluster, PAPER_MODEL)


def peak_rss_mib(quick: bool, large: bool, index: int) -> float:
    """The peak resident memory (MiB) of one case's search, in a fresh interpreter."""
    return in_fresh_process(_search, quick, large, index)[1]


def time_build() -> None:
    """The ILP of one GPT-3 layer standing for 12 (batch 1024) on 1024 devices under 80 GB
    without the price on memory, built and solved twice: the time of each."""
    graph = taps.models.gpt(12288, 96, 2048, 1024, layers=12)
    options = taps.IlpOptions(price=False)
    for _ in range(2):
        r = taps.search(graph, taps.Cluster(128, 8), memory_limit=80e9, options=options)
        print(
            f"build {r.timings['build']:.2f} s (pruning and model), solve "
            f"{r.timings['solve']:.2f} s: {r.ilp.binaries:,} binaries, {r.ilp.continuous:,} "
            f"continuous, {r.ilp.constraints:,} constraints"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the small cases only")
    parser.add_argument("--large", action="store_true", help="add GPT on 1024 and 4096 devices")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain formulation")
    parser.add_argument("--repeat", type=int, default=5, help="runs per taps configuration")
    parser.add_argument("--build", action="store_true", help="only the largest ILP, built twice")
    args = parser.parse_args()
    if args.build:
        time_build()
        return
    console = Console(width=250)

    stages = Table(title="taps.search by stage (seconds)", title_justify="left")
    for col in (
        "case",
        "|E_A|",
        "ops left",
        "binaries",
        "continuous",
        "constraints",
        *STAGES,
        "paper",
        "gap",
        "peak RSS MiB (own process)",
    ):
        stages.add_column(col, justify="left" if col == "case" else "right")
    versus = Table(
        title="Against the plain formulation and without each switch (end to end, s)",
        title_justify="left",
    )
    versus.add_column("case")
    for col in (
        "plain vars",
        "plain cons",
        "plain ILP",
        "plain total",
        *ABLATIONS,
        "costs shared / unshared",
        "ILP speed-up",
        "total speed-up",
        "smaller",
    ):
        versus.add_column(col, justify="right")

    for index, case in enumerate(cases(args.quick, args.large)):
        results = {}
        # The quick run measures taps only.
        for label, options in list(ABLATIONS.items())[: 1 if args.quick else None]:
            results[label] = median_search(case.graph, case.cluster, options, args.repeat)
            if label == "taps":
                r = results[label]
                t = r.timings
                stages.add_row(
                    case.name,
                    f"{r.num_aux_edges:,}",
                    f"{r.ilp.operators} of {len(case.graph.ops)}",
                    f"{r.ilp.binaries:,}",
                    f"{r.ilp.continuous:,}",
                    f"{r.ilp.constraints:,}",
                    *(f"{t[k]:.3f}" for k in STAGES),
                    ""
                    if case.paper_seconds is None
                    else f"< {case.paper_seconds} ({case.paper_seconds / t['total']:.0f}x)",
                    f"{r.gap:.1%}",
                    f"{peak_rss_mib(args.quick, args.large, index):.0f}",
                )
        taps_result = results["taps"]
        row = [case.name]
        if args.no_plain:
            row += ["", "", "", ""]
            ilp_speed, speed, smaller = "", "", ""
        else:
            t0 = time.perf_counter()
            plain = taps.search(
                case.graph, case.cluster, PAPER_MODEL, options=PLAIN, time_limit=PLAIN_LIMIT
            )
            plain_time = time.perf_counter() - t0
            done = plain.status == "optimal"
            plain_ilp = ilp_seconds(plain)
            row += [
                f"{plain.ilp.variables:,}",
                f"{plain.ilp.constraints:,}",
                f"{plain_ilp:.2f}",
                f"{plain_time:.2f}" + ("" if done else " (limit)"),
            ]
            mark = "" if done else "+"
            ilp_speed = f"{plain_ilp / ilp_seconds(taps_result):.0f}x{mark}"
            speed = f"{plain_time / taps_result.timings['total']:.0f}x{mark}"
            smaller = (
                f"{plain.ilp.variables / taps_result.ilp.variables:.0f}x"
                if taps_result.ilp.variables
                else "no ILP left"
            )
            assert not done or abs(plain.cost - taps_result.cost) <= 1e-9 * plain.cost
        row += [f"{results[k].timings['total']:.3f}" if k in results else "" for k in ABLATIONS]
        unshared = build_tables(case.graph, case.cluster, PAPER_MODEL, share=False)
        shared = taps_result.timings["costs"]
        row += [f"{shared:.3f} / {unshared.timings['costs']:.3f}", ilp_speed, speed, smaller]
        versus.add_row(*row)
        console.print(f"done: {case.name}")
    console.print(stages)
    console.print(versus)


if __name__ == "__main__":
    main()
