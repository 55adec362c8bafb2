"""``taps verify``: search a model's plan, then run it on an engine and check it against taps'
prediction (exit code 1 on any mismatch)."""

from __future__ import annotations

import argparse

from rich.console import Console

from taps import models
from taps._support.outputs import Outputs
from taps.cli.args import (
    add_memory_arg,
    add_model_args,
    add_pricing_args,
    check_one_model,
    cluster,
    integer,
    load_model,
    pricing_of,
    refuse_for_saved_plan,
)
from taps.graph import Graph
from taps.plan import Plan
from taps.search.searching import search
from taps.verify import VerifyError, VerifyResult, compare_gspmd, verify, verify_torch
from taps.verify.footprint import check_xla
from taps.verify.result import TOLERANCE
from taps.verify.torch.numerics import check_ranks
from taps.verify.torch.pipeline import verify_pipeline

ENGINES = ("xla", "torch")


def report(result: VerifyResult, console: Console, title: str) -> int:
    """Print a verification; the exit code: 1 if it failed."""
    console.print(result.table(title))
    for line in result.mismatches:
        console.print(line, style="red", markup=False)
    return 0 if result.ok else 1


def run(args: argparse.Namespace, console: Console) -> int:
    if args.engine not in ENGINES:
        raise VerifyError(f"unknown engine {args.engine!r}: expected {' or '.join(ENGINES)}")
    check_one_model(args)
    if args.engine == "torch" and args.torch is None:
        raise VerifyError(
            "the torch engine runs a torch module: give --torch package.module:factory "
            "(built-in models and graph JSON files have none)"
        )
    if args.pipeline and args.engine != "torch":
        raise VerifyError("--pipeline runs on --engine torch (the stages on gloo ranks)")
    if args.gloo is not None and (args.engine != "torch" or args.pipeline):
        raise VerifyError(
            "--gloo sets the gloo ranks of the torch engine's numerics: leave it out with "
            f"{'--pipeline' if args.pipeline else '--engine xla'}"
        )
    if args.gloo:  # 0 skips the numerics
        check_ranks("--gloo", args.gloo)
    if args.gspmd and args.engine != "xla":
        raise VerifyError("--gspmd compares with XLA's partitioner: it needs --engine xla")
    # Checked (a temporary file made beside it) before the work, written after it.
    with Outputs(args.json) as outputs:
        module: object = None
        inputs: tuple[object, ...] = ()
        if args.torch is not None:
            from taps.frontends.torch import from_torch, load_factory

            module, inputs = load_factory(args.torch)
            source: Graph | Plan = from_torch(module, *inputs, name=args.torch.partition(":")[2])
        else:
            source = load_model(args.model, args.batch)
        if isinstance(source, Plan):
            refuse_for_saved_plan(args)
            plan = source  # run as it was saved: not searched again
        else:
            pricing = pricing_of(args, "training")
            on = cluster(args, args.memory)
            plan = search(source, on, pricing, pipeline=args.pipeline).plan
        against = None
        if plan.stages:  # a pipelined plan runs its schedule on gloo, one process per rank
            if args.engine != "torch" or args.gspmd or module is None:
                raise VerifyError(
                    "a pipelined plan runs on --engine torch --torch FACTORY (its stages on gloo "
                    "ranks), without --gspmd"
                )
            verified = verify_pipeline(module, inputs, plan)
        elif args.engine == "torch":
            verified = verify_torch(
                module,
                inputs,
                plan,
                dtype=args.dtype,
                numerics=4 if args.gloo is None else args.gloo or None,
            )
        else:
            if args.gspmd:  # both programs, before the first starts
                check_xla(plan, args.dtype, programs=2)
            verified = verify(plan, args.dtype)
            if args.gspmd:
                against = compare_gspmd(plan, args.dtype)
        if args.json:
            outputs[args.json].write_text(verified.to_json())
        outputs.commit()
    if against is not None:
        console.print(against.table())
    c = plan.cluster
    code = report(verified, console, f"{plan.graph.name} on {c.nodes} x {c.devices_per_node}")
    if args.json:
        console.print(f"wrote {args.json}", markup=False)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps verify`` to the CLI."""
    p = subparsers.add_parser(
        "verify",
        help="run a model's plan on an engine and check it against taps' prediction",
        description="Search the plan of MODEL (or of a PyTorch module), or read a plan saved by "
        "taps search --save (MODEL a saved plan's JSON file: run as it is), run it exactly as taps "
        "plans it, and compare every collective with taps' prediction and the results with an "
        "unsharded run. Engines: xla (simulated XLA CPU devices; MODEL is one of "
        f"{', '.join(models.names())}, a graph JSON file, or --torch) and torch (DTensor on the "
        "fake process group at the full world size, and the numbers on a few gloo ranks; needs "
        "--torch). --step training (the default) runs the whole training step with taps' own "
        "forward and backward plans; --step forward the paper's model, with the engine's own "
        "backward pass. Exit code 1 on any mismatch.",
    )
    add_model_args(
        p,
        "FACTORY",
        "a PyTorch model instead: package.module:factory returning (module, inputs); needs "
        "pip install 'taps[torch]'",
    )
    p.add_argument("--engine", default="xla", help=f"the engine: {' or '.join(ENGINES)} (xla)")
    add_memory_arg(p)
    add_pricing_args(p, "training")
    p.add_argument(
        "--gloo",
        type=integer,
        default=None,
        help="torch engine: gloo ranks for the numerics, 4 or 8; 0 skips them (4)",
    )
    p.add_argument(
        "--dtype", choices=sorted(TOLERANCE), default="float32", help="element type (float32)"
    )
    p.add_argument(
        "--gspmd",
        action="store_true",
        help="also compare with XLA's own partitioning of taps' layouts",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="torch engine: search pipeline stages too and run the plan's schedule on gloo, one "
        "rank per device (at most 8): loss, gradients and the bytes between stages",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the verification as JSON")
    p.set_defaults(run=run)
