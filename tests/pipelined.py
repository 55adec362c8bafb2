"""Pipelined plans with the cuts a test chooses: each stage planned by taps' intra-operator
search over its sub-graph on a microbatch, on its sub-cluster (as the stage search plans the
stages it picks); and a small Llama on a batch a pipeline splits."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import taps
from taps.plan.stages import Pipeline, Stage, microbatched, stage_graph, sub_cluster
from torch_models import VOCAB, llama


def llama8(layers: int = 2) -> tuple[torch.nn.Module, torch.Tensor]:
    """The Llama of ``torch_models`` on 8 sequences (2 microbatches of 4 split over 2 ranks)."""
    module, _ = llama(layers)
    return module, torch.randint(0, VOCAB, (8, 16), generator=torch.Generator().manual_seed(0))


def pipelined(
    graph: taps.Graph,
    cluster: taps.Cluster,
    starts: Sequence[str],
    microbatches: int = 2,
    schedule: str = "1f1b",
    replicas: int = 1,
    chunks: int = 1,
) -> taps.Plan:
    """The plan of ``graph`` cut before each operator of ``starts`` into stages, ``chunks`` per
    device group of ``cluster.num_devices / (replicas * groups)`` devices of one node."""
    names = [op.name for op in graph.ops]
    bounds = [0, *(names.index(s) for s in starts), len(names)]
    groups = (len(bounds) - 1) // chunks
    size = cluster.num_devices // (replicas * groups)
    sub = sub_cluster(cluster, 1, size)
    micro = microbatched(graph, replicas * microbatches)
    stages, strategies = [], {}
    for k in range(len(bounds) - 1):
        ops = tuple(names[bounds[k] : bounds[k + 1]])
        found = taps.search(stage_graph(micro, ops), sub).plan
        strategies.update(found.strategies)
        stages.append(Stage(k, k % groups, ops, (k % groups) * size, sub, 0.0, 0.0, 0.0, 0.0, 1))
    pipe = Pipeline(groups, microbatches, schedule, replicas, chunks)
    return taps.Plan(graph, cluster, strategies, taps.Pricing(), tuple(stages), pipe)
