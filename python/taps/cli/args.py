"""What the commands share: the one-line-error parser, argument types, the cluster options, the
pricing options and model loading."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence

from rich.console import Console

from taps import models
from taps._core import DEVICES, PLANNERS, PRESETS, REPLICA_MODELS, Cluster, GraphError
from taps.errors import ArgumentError, PlanFileError
from taps.graph import Graph
from taps.graph.records import MAX_INT
from taps.plan import OPTIMIZERS, STEPS, Plan, Pricing, is_saved_plan
from taps.plan.pricing import Step


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # An argument may hold a line break; the message stays one line.
        one_line = message.replace("\r", "\\r").replace("\n", "\\n")
        sys.stderr.write(f"{self.prog}: error: {one_line}\n")
        raise SystemExit(2)


class CommandConsole(Console):
    """rich's console, but a reader that went away (``taps search ... | head``) is the
    BrokenPipeError the command line answers with exit code 2 (rich would exit with 1, the
    code of a verification that found a mismatch)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def ints(text: str) -> list[int]:
    """``"1024,1024"`` or ``"[1024, 1024]"`` -> ``[1024, 1024]``."""
    try:
        values = json.loads(text if text.strip().startswith("[") else f"[{text}]")
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers") from None
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers")
    if any(abs(v) > MAX_INT for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} holds an integer beyond 2**63")
    return values


def integer(text: str) -> int:
    """An integer that fits the core's 64 bits (the library says what else is wrong with it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if abs(value) > MAX_INT:
        raise argparse.ArgumentTypeError(f"{text!r} is beyond 2**63")
    return value


def matrix_map(text: str) -> tuple[list[int], list[int]]:
    """``"[2,8]:[1,0]"`` -> device matrix and tensor map."""
    matrix, sep, tensor_map = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not DEVICE_MATRIX:TENSOR_MAP, e.g. "[2,8]:[1,0]"'
        )
    return ints(matrix), ints(tensor_map)


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--nodes``, ``--devices-per-node``, ``--device``, the bandwidths and latencies (default:
    the device's preset's) and ``--replicas``, or ``--cluster`` for a preset or a TOML file."""
    v100 = Cluster(1, 1)
    p.add_argument("--nodes", type=integer, default=None, help="number of nodes (required)")
    p.add_argument(
        "--devices-per-node",
        type=integer,
        default=None,
        help="devices in one node (required without --cluster)",
    )
    p.add_argument(
        "--cluster",
        metavar="NAME|FILE.toml",
        default=None,
        help=f"a cluster preset ({', '.join(PRESETS)}) or a TOML file: its devices, bandwidths, "
        "latencies and replica model (docs/core.md); --nodes still says how many nodes",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help=f"the kind of device; the bandwidths, latencies and memory not given are its "
        f"preset's ({v100.device.name})",
    )
    p.add_argument(
        "--intra-bandwidth",
        type=positive("the intra-node bandwidth"),
        default=None,
        help=f"bytes/s inside a node ({v100.intra_bandwidth:g} on {v100.device.name})",
    )
    p.add_argument(
        "--inter-bandwidth",
        type=positive("the inter-node bandwidth"),
        default=None,
        help=f"bytes/s out of a node ({v100.inter_bandwidth:g} on {v100.device.name})",
    )
    p.add_argument(
        "--intra-latency",
        type=latency("the intra-node latency"),
        default=None,
        help=f"latency in seconds inside a node ({v100.levels[0][2]:g} on {v100.device.name})",
    )
    p.add_argument(
        "--inter-latency",
        type=latency("the inter-node latency"),
        default=None,
        help=f"latency in seconds across nodes ({v100.levels[1][2]:g} on {v100.device.name})",
    )
    p.add_argument(
        "--replicas",
        choices=REPLICA_MODELS,
        default=None,
        help=f"copies of a tensor send one transfer each out of a node (flat, as NCCL and XLA) "
        f"or share one (shared, the paper's model) ({v100.replicas}; with --cluster, the "
        "cluster's)",
    )


#: The options that describe a cluster's parts, which --cluster gives instead.
_CLUSTER_PARTS = (
    ("--devices-per-node", "devices_per_node"),
    ("--device", "device"),
    ("--intra-bandwidth", "intra_bandwidth"),
    ("--inter-bandwidth", "inter_bandwidth"),
    ("--intra-latency", "intra_latency"),
    ("--inter-latency", "inter_latency"),
)


def cluster(args: argparse.Namespace, memory: float | None = None) -> Cluster:
    """The cluster the cluster options describe, with ``memory`` bytes per device (default: its
    device's; infinite: no limit)."""
    if args.nodes is None:
        raise ArgumentError("--nodes is required")
    if args.cluster is None:
        if args.devices_per_node is None:
            raise ArgumentError("--devices-per-node is required (or a --cluster preset)")
        return Cluster(
            args.nodes,
            args.devices_per_node,
            args.intra_bandwidth,
            args.inter_bandwidth,
            memory,
            intra_latency=args.intra_latency,
            inter_latency=args.inter_latency,
            replicas=args.replicas or "flat",
            device=args.device or "v100",
        )
    given = [flag for flag, name in _CLUSTER_PARTS if getattr(args, name) is not None]
    if given:
        raise ArgumentError(
            f"--cluster gives the devices, bandwidths and latencies: leave out {', '.join(given)}"
        )
    preset = Cluster.preset(args.cluster, args.nodes)
    if memory is None and args.replicas is None:
        return preset
    return Cluster.hierarchy(
        preset.levels,
        memory if memory is not None else preset.device_memory or math.inf,
        args.replicas or preset.replicas,
        preset.device.name,
    )


def latency(what: str) -> Callable[[str], float]:
    """An argument type: a finite number of seconds, not negative, ``what`` naming it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(
                f"{what} must be a finite number of seconds, not negative, got {text!r}"
            )
        return value

    return parse


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def memory_size(text: str) -> float:
    """``"80GB"``, ``"16GiB"`` or ``"1.6e10"`` -> bytes; ``"inf"`` -> no limit (infinity)."""
    t = text.strip().upper()
    if t == "INF":
        return math.inf
    number = t.rstrip("KMGTIB")
    unit = t[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size such as 80GB, 16GiB or 1.6e10"
        ) from None
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(
            f"the memory size must be finite and at least 1 byte, got {text!r}"
        )
    return value


def positive(what: str, most: float = math.inf) -> Callable[[str], float]:
    """An argument type: a positive, finite number of at most ``most``, ``what`` naming it in
    the error."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(
                f"{what} must be a positive, finite number, got {text!r}"
            )
        if value > most:
            raise argparse.ArgumentTypeError(f"{what} must be at most {most:g}, got {text!r}")
        return value

    return parse


def attach_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``--memory -1GB`` as ``--memory=-1GB``: argparse takes a value that starts with a dash for
    an option (unless it looks like a plain negative number), and would only say "expected one
    argument"; joined, the value reaches its type, which says what is wrong with it."""
    takes_value: set[str] = set()
    options: set[str] = set()
    for p in _parsers(parser):
        for action in p._actions:
            options.update(action.option_strings)
            if action.nargs is None and action.option_strings:
                takes_value.update(action.option_strings)
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if (
            arg in takes_value
            and i + 1 < len(args)
            and args[i + 1].startswith("-")
            and args[i + 1] not in options
            and args[i + 1] != "--"
        ):
            out.append(f"{arg}={args[i + 1]}")
            i += 2
            continue
        if arg == "--":
            out += args[i:]
            break
        out.append(arg)
        i += 1
    return out


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and its subcommands' parsers."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def add_model_args(p: argparse.ArgumentParser, torch_metavar: str, torch_help: str) -> None:
    """The model a command works on: MODEL or ``--torch``, the cluster and ``--batch``."""
    p.add_argument(
        "model", metavar="MODEL", nargs="?", help="built-in model name or graph JSON file"
    )
    p.add_argument("--torch", metavar=torch_metavar, default=None, help=torch_help)
    add_cluster_args(p)
    p.add_argument("--batch", type=integer, default=None, help="batch size (model default)")


def add_memory_arg(p: argparse.ArgumentParser) -> None:
    """``--memory``: the device memory the search fits the plan in."""
    p.add_argument(
        "--memory",
        type=memory_size,
        default=None,
        help="device memory limit, e.g. 80GB or 16GiB, or inf for none (the device's)",
    )


def add_pricing_args(p: argparse.ArgumentParser, step: str) -> None:
    """What a plan is priced as: ``--step`` (default ``step``, said in its help), ``--planner``,
    ``--zero``, ``--fsdp``; left None when not given (:func:`pricing_of` fills them in)."""
    p.add_argument(
        "--step",
        choices=STEPS,
        default=None,
        help=f"what is priced: the whole training step, or forward, the paper's model ({step})",
    )
    p.add_argument(
        "--planner",
        choices=PLANNERS,
        default=None,
        help="the redistribution planner of every edge: paper (Algorithm 1, the default) or "
        "optimal (shortest plans, tens of times slower per edge)",
    )
    p.add_argument(
        "--zero",
        action="store_true",
        help="shard parameters' gradients and optimizer state over their data-parallel "
        "devices (ZeRO: reduce_scatter + all_gather, less memory)",
    )
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="let the search store any operator's parameters sharded over its data-parallel "
        "devices (FSDP / ZeRO-3: gathered before use, gradients reduce_scattered), where memory "
        "needs it",
    )
    p.add_argument(
        "--optimizer",
        choices=tuple(OPTIMIZERS),
        default=None,
        help="the optimizer whose fp32 state every parameter keeps: adam (2 moments, the "
        "default), sgd (momentum) or none",
    )
    p.add_argument(
        "--checkpoint",
        type=integer,
        default=None,
        metavar="N",
        help="activation checkpointing of every N-th layer (1: every layer): it keeps only its "
        "output and runs its forward again in the backward",
    )


def check_one_model(args: argparse.Namespace) -> None:
    """Refuse both or neither of MODEL and ``--torch``."""
    if (args.model is None) == (args.torch is None):
        raise GraphError("give either MODEL or --torch package.module:factory")
    # A built-in model is built at the batch asked for; a traced one has its inputs' own.
    if args.torch is not None and getattr(args, "batch", None) is not None:
        raise ArgumentError(
            "--batch sizes a built-in model; --torch's inputs fix the batch: leave it out"
        )


def _read(name: str) -> bytes:
    try:
        with open(name, "rb") as f:
            return f.read()
    except OSError as e:
        raise GraphError(f"cannot read {name!r}: {e.strerror}") from None
    except ValueError as e:  # a NUL in the path
        raise GraphError(f"cannot read {name!r}: {e}") from None


#: What a saved plan already says: its graph, cluster and pricing (flag, attribute).
_PLAN_HOLDS = (
    ("--nodes", "nodes"),
    ("--devices-per-node", "devices_per_node"),
    ("--cluster", "cluster"),
    ("--device", "device"),
    ("--intra-bandwidth", "intra_bandwidth"),
    ("--inter-bandwidth", "inter_bandwidth"),
    ("--intra-latency", "intra_latency"),
    ("--inter-latency", "inter_latency"),
    ("--replicas", "replicas"),
    ("--batch", "batch"),
    ("--memory", "memory"),
    ("--cost-model", "cost_model"),
    ("--step", "step"),
    ("--planner", "planner"),
    ("--zero", "zero"),
    ("--fsdp", "fsdp"),
    ("--optimizer", "optimizer"),
    ("--checkpoint", "checkpoint"),
    ("--time-limit", "time_limit"),
)


def refuse_for_saved_plan(args: argparse.Namespace) -> None:
    """A saved plan carries its graph, cluster and pricing: options that would describe another
    are refused, not silently ignored."""
    given = [flag for flag, name in _PLAN_HOLDS if getattr(args, name, None) not in (None, False)]
    if given:
        raise ArgumentError(
            f"a saved plan carries its graph, cluster and pricing: leave out {', '.join(given)}"
        )


def pricing_of(args: argparse.Namespace, step: Step = "training") -> Pricing:
    """The pricing the options give (``step`` when ``--step`` is not given)."""
    return Pricing(
        step=args.step or step,
        planner=args.planner or "paper",
        zero=args.zero,
        fsdp=args.fsdp,
        optimizer=args.optimizer or "adam",
        checkpoint=args.checkpoint or 0,
    )


def load_model(name: str, batch: int | None) -> Graph | Plan:
    """A built-in model by name, a graph JSON file, or a plan saved by ``taps search --save``
    (a JSON file too: read once, and told apart by its ``format``)."""
    if name.endswith(".json"):
        data = _read(name)
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            doc = None  # the graph reader says what is wrong with it
        if is_saved_plan(doc):
            try:
                return Plan.from_dict(doc)
            except PlanFileError as e:
                raise PlanFileError(f"{name}: {e}") from None
        if batch is not None:
            raise ArgumentError(
                f"--batch sizes a built-in model; graph file {name!r} fixes the batch: leave it out"
            )
        try:
            return Graph.from_json(data) if doc is None else Graph.from_dict(doc)
        except GraphError as e:
            raise GraphError(f"graph file {name!r}: {e}") from None
    if name.lower() in models.names() or name.lower().startswith("megatron-"):
        return models.by_name(name, batch)
    raise GraphError(
        f"unknown model {name!r}: expected a graph JSON file or one of {', '.join(models.names())}"
    )
