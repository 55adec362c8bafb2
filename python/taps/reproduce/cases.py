"""The cases of the paper's evaluation: the comparison and its three sweeps (bandwidth ratio,
devices per node, Megatron batch), and the rows of the search-time table."""

from __future__ import annotations

import math
from dataclasses import dataclass

from taps import models
from taps._core import Cluster
from taps.graph import Graph

#: The paper's evaluation cluster: the dgx-v100 preset's bandwidths (60 and 6 GB/s), 8 devices per
#: node.
_PAPER = Cluster.preset("dgx-v100")
INTRA_BANDWIDTH = _PAPER.intra_bandwidth
INTER_BANDWIDTH = _PAPER.inter_bandwidth
DEVICES_PER_NODE = 8
#: The models of the comparison and the sweeps (the 1T layer runs on one node only).
MAIN_MODELS = ("alexnet", "megatron-1.7B", "megatron-3.6B")
#: Inter/intra bandwidth ratios of the bandwidth sweep (the comparison runs at 1/10).
BANDWIDTH_RATIOS = (1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64)
#: Devices per node of the devices sweep (the comparison runs at 8).
SWEEP_DEVICES_PER_NODE = (4, 16)
#: Megatron batches of the batch sweep (the comparison runs at the global batch).
MEGATRON_BATCHES = (1, 4, 16)
#: Relative float noise allowed between costs that are equal in exact arithmetic.
TOLERANCE = 1e-9


def paper_cluster(
    nodes: int,
    devices_per_node: int = DEVICES_PER_NODE,
    intra_bandwidth: float = INTRA_BANDWIDTH,
    inter_bandwidth: float = INTER_BANDWIDTH,
    device_memory: float = math.inf,
) -> Cluster:
    """A cluster as the paper models it: replicas sharing one transfer out of a node, no latency
    and no memory limit (the paper's search has none), unlike a ``Cluster``'s defaults."""
    return Cluster(
        nodes,
        devices_per_node,
        intra_bandwidth,
        inter_bandwidth,
        device_memory,
        intra_latency=0.0,
        inter_latency=0.0,
        replicas="shared",
    )


@dataclass(frozen=True)
class Case:
    """One (model, topology) of an experiment; ``sweep`` names the experiment."""

    sweep: str
    model: str
    batch: int
    nodes: int
    devices_per_node: int = DEVICES_PER_NODE
    intra_bandwidth: float = INTRA_BANDWIDTH
    inter_bandwidth: float = INTER_BANDWIDTH

    def cluster(self) -> Cluster:
        return paper_cluster(
            self.nodes, self.devices_per_node, self.intra_bandwidth, self.inter_bandwidth
        )

    def graph(self) -> Graph:
        return models.by_name(self.model, self.batch)

    @property
    def label(self) -> str:
        ratio = self.inter_bandwidth / self.intra_bandwidth
        return (
            f"{self.sweep}: {self.model} (batch {self.batch}) on {self.nodes} x "
            f"{self.devices_per_node}, inter/intra 1/{1 / ratio:g}"
        )


def _case(
    sweep: str,
    model: str,
    nodes: int,
    batch: int | None = None,
    devices_per_node: int = DEVICES_PER_NODE,
    inter_bandwidth: float = INTER_BANDWIDTH,
) -> Case:
    return Case(
        sweep,
        model,
        models.default_batch(model) if batch is None else batch,
        nodes,
        devices_per_node,
        INTRA_BANDWIDTH,
        inter_bandwidth,
    )


def experiment_cases(quick: bool = False) -> list[Case]:
    """Every (model, topology) of the three experiments; ``quick`` keeps a few small ones."""
    main_models = ("alexnet", "megatron-1.7B") if quick else MAIN_MODELS
    out = []
    for model in main_models:
        nodes = (1, 2) if quick else (1, 2, 4, 8, 16) if model == "alexnet" else (1, 2, 4, 8)
        out += [_case("comparison", model, n) for n in nodes]
    out.append(_case("comparison", "megatron-1T", 1))
    sweep_models = ("alexnet",) if quick else MAIN_MODELS
    sweep_nodes = (2,) if quick else (2, 4, 8)
    ratios = (BANDWIDTH_RATIOS[0], BANDWIDTH_RATIOS[-1]) if quick else BANDWIDTH_RATIOS
    for model in sweep_models:
        for n in sweep_nodes:
            out += [
                _case("bandwidth", model, n, inter_bandwidth=INTRA_BANDWIDTH * r) for r in ratios
            ]
    per_node = SWEEP_DEVICES_PER_NODE[:1] if quick else SWEEP_DEVICES_PER_NODE
    for model in sweep_models:
        for n in sweep_nodes:
            out += [_case("devices_per_node", model, n, devices_per_node=d) for d in per_node]
    batch_models = ("megatron-1.7B",) if quick else MAIN_MODELS[1:]
    batches = MEGATRON_BATCHES[1:2] if quick else MEGATRON_BATCHES
    for model in batch_models:
        for n in sweep_nodes:
            out += [_case("batch", model, n, batch=b) for b in batches]
    return out


@dataclass(frozen=True)
class TimingCase:
    """A row of the paper's search-time table."""

    label: str
    model: str
    nodes: int
    paper_aux_edges: str
    paper_seconds: float


TIMING_CASES = (
    TimingCase("AlexNet", "alexnet", 1, "> 3e3", 0.1),
    TimingCase("AlexNet", "alexnet", 2, "> 1e4", 0.2),
    TimingCase("AlexNet", "alexnet", 8, "> 5e4", 0.8),
    TimingCase("Megatron-LM 1.7B", "megatron-1.7B", 4, "> 3e4", 0.4),
    TimingCase("Megatron-LM 3.6B", "megatron-3.6B", 4, "> 3e4", 0.4),
    TimingCase("Megatron-LM 1T", "megatron-1T", 1, "> 4e3", 0.1),
)


def timing_cases(quick: bool = False) -> list[TimingCase]:
    return [c for c in TIMING_CASES if not quick or c.nodes * DEVICES_PER_NODE <= 16]
