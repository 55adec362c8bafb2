"""``taps search``: the strategy of every operator of a model."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from rich.console import Console

from taps import models
from taps._core import COST_MODELS
from taps._support.outputs import Outputs
from taps.cli.args import (
    add_memory_arg,
    add_model_args,
    add_pricing_args,
    check_one_model,
    cluster,
    integer,
    load_model,
    positive,
    pricing_of,
    refuse_for_saved_plan,
)
from taps.errors import ArgumentError
from taps.graph import Graph
from taps.plan import Plan
from taps.plan.stages import SCHEDULES, Pipeline
from taps.report.plot import check_available, plot_plan, plot_stages
from taps.report.priced import Priced, PricedPlan
from taps.report.tables import (
    collectives_table,
    comparison_table,
    experts_text,
    pipeline_dict,
    result_dict,
    stages_table,
    strategy_table,
)
from taps.search.pipeline import PipelineResult, pipeline_step
from taps.search.searching import Comparison, compare, search


def run(args: argparse.Namespace, console: Console) -> None:
    if args.plot:
        check_available(args.plot)
    framework, export_path = args.export or ("", None)
    if export_path is not None:
        from taps.export import check_framework

        check_framework(framework)
    # Checked (a temporary file made beside each) before the search, written after it.
    with Outputs(args.json, args.plot, export_path, args.save) as outputs:
        check_one_model(args)
        if args.torch is not None:
            from taps.cli.imports import read_torch

            source: Graph | Plan = read_torch(args.torch, "error")
        else:
            source = load_model(args.model, args.batch)
        pipelined = _pipeline_of(args)
        if args.collectives and (
            pipelined is not None or (isinstance(source, Plan) and source.stages)
        ):
            raise ArgumentError(
                "--collectives lists one intra-operator plan's collectives, a pipelined plan's "
                "stages have one each: leave it out"
            )
        if isinstance(source, Plan) and source.stages:
            refuse_for_saved_plan(args)
            output = _pipelined(args, outputs, source, pipeline_step(source), export_path)
        elif pipelined is not None:
            if isinstance(source, Plan):
                raise ArgumentError("a saved plan is reported as it is: leave out --pipeline")
            if args.cost_model not in (None, "topology") or args.time_limit is not None:
                raise ArgumentError(
                    "--pipeline prices steps in seconds on the topology model, without "
                    "--time-limit: leave out --cost-model and --time-limit"
                )
            c = cluster(args, args.memory)
            found = search(source, c, pricing_of(args), pipeline=pipelined)
            assert isinstance(found, PipelineResult)
            output = _pipelined(args, outputs, found.plan, found.step_time, export_path)
        else:
            output = _intra(args, outputs, source, export_path)
        outputs.commit()
    for item in output:
        console.print(item, markup=False if isinstance(item, str) else None)  # paths: text


def _pipeline_of(args: argparse.Namespace) -> Pipeline | None:
    """The pipeline the flags ask for (``None``: no ``--pipeline``)."""
    fixed = [args.stages, args.microbatches, args.schedule]
    if not args.pipeline:
        if any(x is not None for x in fixed):
            raise ArgumentError("--stages, --microbatches and --schedule need --pipeline")
        return None
    return Pipeline(stages=args.stages, microbatches=args.microbatches, schedule=args.schedule)


def _pipelined(
    args: argparse.Namespace,
    outputs: Outputs,
    plan: Plan,
    step_time: float,
    export_path: str | None,
) -> list[Any]:
    """The stages table and the files of a pipelined plan."""
    output: list[Any] = [stages_table(plan, step_time)]
    if args.json:
        outputs[args.json].write_json(pipeline_dict(plan, step_time))
        output.append(f"wrote {args.json}")
    if args.save:
        outputs[args.save].write_text(plan.to_json())
        output.append(f"wrote {args.save}")
    if args.plot:
        with outputs[args.plot].writing():
            plot_stages(plan, outputs[args.plot].temp)
        output.append(f"wrote {args.plot}")
    if export_path is not None:
        from taps.export import export

        outputs[export_path].write_text(export(plan, args.export[0]).to_json())
        output.append(f"wrote {export_path}")
    return output


def _intra(
    args: argparse.Namespace,
    outputs: Outputs,
    source: Graph | Plan,
    export_path: str | None,
) -> list[Any]:
    """The strategy table and the files of an intra-operator plan (searched or saved)."""
    framework = args.export[0] if args.export else ""
    comparison: Comparison | None = None
    if isinstance(source, Plan):
        refuse_for_saved_plan(args)
        # A saved plan is reported as it is: priced once, nothing searched again.
        results: list[Priced] = [PricedPlan.of(source)]
    else:
        c = cluster(args, args.memory)
        pricing = pricing_of(args)
        if args.cost_model == "both":
            comparison = compare(source, c, pricing, time_limit=args.time_limit)
            found = [comparison.topology, comparison.volume]
        else:
            pricing = replace(pricing, cost_model=args.cost_model or "topology")
            found = [search(source, c, pricing, time_limit=args.time_limit)]
        results = list(found)
    # Everything is built before anything is printed or written; the first plan (the
    # topology-aware one under --cost-model both) is the one saved, drawn and exported.
    output: list[Any] = []
    for result in results:
        output.append(strategy_table(result))
        experts = experts_text(result.plan)
        if experts is not None:
            output.append(experts)
        if args.collectives:
            output.append(collectives_table(result))
    if comparison is not None:
        output.append(comparison_table(comparison))
    if args.json:
        outputs[args.json].write_json(_json(results, comparison))
        output.append(f"wrote {args.json}")
    if args.save:
        outputs[args.save].write_text(results[0].plan.to_json())
        output.append(f"wrote {args.save}")
    if args.plot:
        with outputs[args.plot].writing():
            plot_plan(results[0], outputs[args.plot].temp)
        output.append(f"wrote {args.plot}")
    if export_path is not None:
        from taps.export import export

        outputs[export_path].write_text(export(results[0].plan, framework).to_json())
        output.append(f"wrote {export_path}")
    return output


def _json(results: list[Priced], comparison: Comparison | None) -> dict[str, Any]:
    data: dict[str, Any] = {r.plan.pricing.cost_model: result_dict(r) for r in results}
    if comparison is not None:
        data["comparison"] = {
            "volume_under_topology": comparison.volume_under_topology,
            "topology_under_volume": comparison.topology_under_volume,
            "saving_percent": comparison.saving,
        }
    return data


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps search`` to the CLI."""
    p = subparsers.add_parser(
        "search",
        help="search the strategy of every operator of a model",
        description="Search the best intra-operator strategy of every operator of MODEL on a "
        f"cluster. MODEL is one of {', '.join(models.names())} (megatron-1T too), a graph "
        "JSON file, or a plan saved with --save (reported, drawn and exported as it is, without "
        "searching again); gpt is one GPT-3 layer (hidden 12288, 96 heads, sequence 2048).",
    )
    add_model_args(
        p,
        "SOURCE",
        "search a PyTorch model instead: package.module:factory (returning (module, inputs)) or "
        "a torch.export archive .pt2; needs pip install 'taps[torch]'",
    )
    add_memory_arg(p)
    p.add_argument(
        "--cost-model",
        choices=(*COST_MODELS, "both"),
        default=None,
        help="what the search minimises; both compares the two (topology)",
    )
    add_pricing_args(p, "training")
    p.add_argument(
        "--time-limit",
        type=positive("the time limit (seconds)"),
        default=None,
        metavar="SECONDS",
        help="bound the whole search; SCIP then returns its best plan and gap (none)",
    )
    p.add_argument(
        "--collectives",
        action="store_true",
        help="also list every collective of the chosen strategies",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the result(s) as JSON")
    p.add_argument(
        "--save",
        metavar="FILE",
        default=None,
        help="save the (topology-aware) plan as JSON, for taps verify, taps export and taps "
        "search without searching again",
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="draw every operator's strategy and cost into FILE (PNG; needs taps[plot])",
    )
    p.add_argument(
        "--export",
        nargs=2,
        metavar=("jax|dtensor", "FILE"),
        default=None,
        help="write the (topology-aware) plan as a JAX or DTensor sharding plan (JSON)",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="search pipeline stages too: cuts, sub-clusters, microbatches and schedule, each "
        "stage planned by the intra-operator search (docs/pipeline.md)",
    )
    p.add_argument(
        "--stages",
        type=integer,
        default=None,
        metavar="N",
        help="with --pipeline: N device groups (a power of two; searched if not given)",
    )
    p.add_argument(
        "--microbatches",
        type=integer,
        default=None,
        metavar="M",
        help="with --pipeline: M microbatches per step (searched if not given)",
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="with --pipeline: the pipeline schedule (searched if not given)",
    )
    p.set_defaults(run=run)
