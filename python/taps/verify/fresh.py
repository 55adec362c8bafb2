"""Verification in a fresh process, for a process whose JAX started with too few devices.

``python -m taps.verify.fresh`` reads a plan as JSON on stdin (the graph's JSON document, the
cluster, each operator's strategy, the dtype, the seed, the step, the planner and ZeRO), verifies
it, and writes the result's JSON on stdout; an error is ``{"error": message}`` and exit code 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

from taps._core import Cluster, Strategy, TapsError
from taps.errors import VerifyError
from taps.graph import Graph
from taps.verify.devices import simulate_cpu_devices
from taps.verify.result import VerifyResult


def verify_in_fresh_process(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    dtype: str,
    seed: int,
    step: str = "training",
    planner: str = "paper",
    zero: bool = False,
    cost_model: str = "topology",
) -> VerifyResult:
    """:func:`taps.verify.verify_graph` run by ``python -m taps.verify.fresh``."""
    payload = {
        "graph": graph.to_dict(),
        # Every level, latencies and the replica model: the optimal planner plans by them.
        "cluster": [cluster.levels, cluster.device_memory, cluster.replicas],
        "strategies": {k: [s.degrees, s.device_map] for k, s in strategies.items()},
        "dtype": dtype,
        "seed": seed,
        "step": step,
        "planner": planner,
        "zero": zero,
        "cost_model": cost_model,
    }
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the child asks for its own device count
    done = subprocess.run(
        [sys.executable, "-m", "taps.verify.fresh"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VerifyError(f"verification in a fresh process failed: {tail}") from None
    if "error" in data:
        raise VerifyError(data["error"])
    return VerifyResult.from_dict(data)


def main() -> int:
    data = json.loads(sys.stdin.read())
    levels, memory, replicas = data["cluster"]
    cluster = Cluster.hierarchy([tuple(level) for level in levels], memory, replicas)
    simulate_cpu_devices(cluster.num_devices)
    from taps.verify.replay import verify_graph

    try:
        result = verify_graph(
            Graph.from_dict(data["graph"]),
            cluster,
            {k: Strategy(d, m) for k, (d, m) in data["strategies"].items()},
            data["dtype"],
            data["seed"],
            data["step"],
            data["planner"],
            data["zero"],
            data["cost_model"],
        )
    except TapsError as e:
        sys.stdout.write(json.dumps({"error": str(e)}))
        return 2
    sys.stdout.write(result.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
