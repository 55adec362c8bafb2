"""``taps redistribute``: the redistribution of one tensor between two layouts, priced
(``taps plan`` is its former name, kept as an alias that says so)."""

from __future__ import annotations

import argparse
from typing import Any, Literal

from rich.console import Console

from taps._core import Layout, plan_redistribution
from taps._support.outputs import Outputs
from taps._support.quiet import note
from taps.cli.args import add_cluster_args, cluster, ints, matrix_map, positive
from taps.report.tables import layout_dict, layout_text, plan_table, redistribution_dict

PLANNERS: tuple[Literal["paper"], Literal["optimal"]] = ("paper", "optimal")
TITLES = {"paper": "Algorithm 1 (the paper's planner)", "optimal": "optimal planner"}


def run(args: argparse.Namespace, console: Console) -> int:
    with Outputs(args.json) as outputs:
        code = _run(args, console, outputs)
        outputs.commit()
    if args.json:
        console.print(f"wrote {args.json}", markup=False)
    if args.command == "plan":
        # Said once the work is done, so that an error stays one line.
        note("taps plan is now taps redistribute (the old name still works)")
    return code


def _run(args: argparse.Namespace, console: Console, outputs: Outputs) -> int:
    (dm_a, map_a), (dm_b, map_b) = args.source, args.target
    c = cluster(args)
    a = Layout(args.shape, dm_a, map_a)
    b = Layout(args.shape if args.target_shape is None else args.target_shape, dm_b, map_b)
    planners = tuple(p for p in PLANNERS if args.planner in (p, "both"))
    plans = {p: plan_redistribution(a, b, c, p, args.dtype_bytes) for p in planners}
    first = plans[planners[0]]
    # All of it built before any is printed: a late error leaves no partial output.
    output: list[Any] = [
        f"from    {layout_text(a)}",
        f"to      {layout_text(b)}",
        f"unified {layout_text(first.source)}",
        f"        {layout_text(first.target)}",
    ]
    output += [
        plan_table(plan, c, args.dtype_bytes, f"Redistribution, {TITLES[p]}")
        for p, plan in plans.items()
    ]
    if len(plans) == 2:
        paper, best = (plans[p].cost(c, args.dtype_bytes) for p in PLANNERS)
        saving = 0.0 if paper == 0 else 100 * (1 - best / paper)
        output.append(f"optimal planner: {saving:.1f}% less time than Algorithm 1")
    doc: dict[str, object] = {
        "source": layout_dict(first.source),
        "target": layout_dict(first.target),
        "planners": {
            p: redistribution_dict(plan, c, args.dtype_bytes) for p, plan in plans.items()
        },
    }
    code = 0
    verified = {}
    if args.verify:
        from taps.verify import verify_redistribution

        # Every plan printed is the plan run; all run before anything is printed.
        for p in planners:
            verified[p] = verify_redistribution(a, b, c.devices_per_node, planner=p)
            doc["planners"][p]["verified"] = verified[p].to_dict()  # type: ignore[index]
    for item in output:
        console.print(item, markup=False if isinstance(item, str) else None)  # paths: text
    if verified:
        from taps.cli.verify import report

        for p, result in verified.items():
            code = max(code, report(result, console, f"{TITLES[p]}, verified on XLA"))
    if args.json:
        outputs[args.json].write_json(doc)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps redistribute`` (and its former name ``taps plan``) to the CLI."""
    p = subparsers.add_parser(
        "redistribute",
        aliases=["plan"],
        help="plan the redistribution of one tensor between two layouts (alias: plan)",
        description="Plan the redistribution of a tensor between two layouts and price it.",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=matrix_map,
        required=True,
        metavar="DM:MAP",
        help='source device matrix and tensor map, e.g. "[2,8]:[1,0]"',
    )
    p.add_argument(
        "--to",
        dest="target",
        type=matrix_map,
        required=True,
        metavar="DM:MAP",
        help="target device matrix and tensor map",
    )
    p.add_argument("--shape", type=ints, required=True, help="tensor shape, e.g. 1024,1024")
    p.add_argument(
        "--target-shape",
        type=ints,
        default=None,
        help="the consumer's shape if it reshapes the tensor (same element count)",
    )
    p.add_argument(
        "--dtype-bytes",
        # (An element of more bytes than any dtype only makes the prices overflow.)
        type=positive("bytes per element", most=1024),
        default=2,
        help="bytes per element (2)",
    )
    p.add_argument(
        "--planner",
        choices=(*PLANNERS, "both"),
        default="both",
        help="Algorithm 1 of the paper, the optimal planner (a shortest path over layouts, "
        "docs/core.md), or both (both)",
    )
    add_cluster_args(p)
    p.add_argument(
        "--verify",
        action="store_true",
        help="also run the plan on simulated XLA devices and check it (exit code 1 on mismatch)",
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="write the layouts and plans as JSON"
    )
    p.set_defaults(run=run)
