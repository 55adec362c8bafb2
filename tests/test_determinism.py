"""Same input, same output: ``taps search --json`` gives the same strategies, costs and JSON (less
the timings) across runs, Rayon thread counts and hash seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benches"))
from graphs_gen import skip_ladder
from search_stages import dense_block

ENVIRONMENTS = [
    {"RAYON_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
    {"RAYON_NUM_THREADS": "2", "PYTHONHASHSEED": "1"},
    {"RAYON_NUM_THREADS": "2", "PYTHONHASHSEED": "4242"},
]


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k != "timings"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _search(argv: list[str], out: Path, env: dict[str, str]) -> dict[str, Any]:
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from taps.cli import run; run()",
            "search",
            *argv,
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, **env},
        timeout=300,
    )
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "model",
    ["alexnet", "dense", "ladder", "optimal"],
    ids=[
        "alexnet-reductions-decide-all",
        "dense-block-scip-solves-a-core",
        "skip-ladder-elimination-decides-a-core",
        "alexnet-optimal-planner-one-search-per-pattern",
    ],
)
def test_same_json_across_runs_threads_and_hash_seeds(model, tmp_path):
    if model in ("dense", "ladder"):
        # Every layer reads every earlier one: no exact reduction applies, and the core is too
        # dense for variable elimination, so SCIP decides. The skip ladder's core is eliminated.
        graph = dense_block(8, 1024, 1024) if model == "dense" else skip_ladder(10, 3, 256, 256)
        path = tmp_path / f"{model}.json"
        path.write_text(graph.to_json())
        argv = [str(path), "--nodes", "4", "--devices-per-node", "8"]
    else:
        argv = ["alexnet", "--nodes", "2", "--devices-per-node", "8"]
    if model == "optimal":
        # The optimal planner's searches run in parallel, one per pattern of layout pairs.
        argv += ["--planner", "optimal"]
    argv += ["--cost-model", "both"]
    runs = [_search(argv, tmp_path / f"run{i}.json", env) for i, env in enumerate(ENVIRONMENTS)]
    first = _without_timings(runs[0])
    if model == "dense":
        assert first["topology"]["ilp"]["operators"] > 0  # SCIP had work to do
    if model == "ladder":
        assert first["topology"]["ilp"]["operators"] == 0
        assert first["topology"]["ilp"]["eliminated"] == 40
    for run in runs[1:]:
        assert _without_timings(run) == first
    # The timings were there, and are all that was left out.
    assert all("timings" in run["topology"] for run in runs)


#: Runs the jobs named on the command line in that order in one process and prints, per job, what
#: it chose: a search's plan and cost with the optimal planner, or the optimal plans (their ops)
#: of pairs of one pattern at several sizes on a cluster with latencies, where the cheapest path
#: changes with the size.
_JOBS = """
import json, sys
import taps

cluster = taps.Cluster(2, 4, intra_latency=2e-5, inter_latency=5e-4, device_memory=float("inf"))
graphs = {
    "alexnet": lambda: taps.models.by_name("alexnet"),
    "gpt": lambda: taps.models.gpt(hidden=256, heads=4, seq=128, batch=8),
}
PATTERNS = [
    (([-1, 0, 1], []), [-1, 0, 2]),
    (([-1, 0, -1], [1]), [-1, -1, 1]),
    (([-1, 0, 1], [2]), [-1, 2, -1]),
    (([-1, 1, 2], []), [-1, 0, -1]),
]

def pairs(sizes):
    out = []
    for (src, partial), tgt in PATTERNS:
        for m in sizes:
            a = taps.Layout([m, 4, 2], [2, 2, 2], src, partial=partial)
            b = taps.Layout([m, 4, 2], [2, 2, 2], tgt)
            plan = taps.plan_redistribution(a, b, cluster, planner="optimal")
            out.append([repr(op) for op in plan.ops])
    return out

out = {}
for job in sys.argv[1:]:
    kind, name = job.split(":")
    if kind == "search":
        r = taps.search(graphs[name](), cluster, taps.Pricing(planner="optimal"))
        out[job] = [r.cost.hex(), r.plan.to_json()]
    else:
        out[job] = pairs([int(m) for m in name.split(",")])
print(json.dumps(out))
"""


def _jobs(order: list[str]) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-c", _JOBS, *order], check=True, capture_output=True, text=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_optimal_plans_whatever_ran_before():
    """The optimal planner remembers the paths it found (within one process): what it returns for
    an input is the same whatever was planned before it, in whatever order. Two searches and
    pairs of one pattern at sizes between, and at the ends of, sizes planned earlier."""
    jobs = ["search:alexnet", "search:gpt", "pairs:64,4096", "pairs:256,1024", "pairs:512"]
    forward = _jobs(jobs)
    backward = _jobs(jobs[::-1])
    alone = {job: _jobs([job])[job] for job in ("pairs:512", "search:gpt")}
    assert forward == backward
    for job, got in alone.items():
        assert forward[job] == got
    # Some pattern's cheapest plan changes between the sizes (latency against bandwidth).
    ends = forward["pairs:64,4096"]
    assert any(ends[2 * p] != ends[2 * p + 1] for p in range(len(ends) // 2))
