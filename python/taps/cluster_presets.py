"""Clusters from TOML files, for ``Cluster.preset("file.toml", nodes)`` (docs/core.md).

A file lists the levels of the cluster innermost first, as ``Cluster.hierarchy`` takes them::

    device_memory = 80e9      # bytes per device, optional
    replicas = "flat"         # "shared" (the paper) or "flat" (NCCL, XLA), default "shared"

    [[levels]]                # the node
    count = 8                 # devices per node
    bandwidth = 450e9         # bytes per second between two devices of a node
    latency = 5e-6            # seconds per collective inside a node, default 0

    [[levels]]                # the outermost level: its count comes from ``nodes``
    bandwidth = 400e9
    latency = 1e-5

Levels between the first and the last (pods, racks) give ``count``, their parts of the level
below; ``nodes`` must fill whole units of them. The built-in presets live in the Rust core.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from taps._core import REPLICA_MODELS, Cluster, TopologyError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _number(table: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TopologyError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)


def from_toml(path: str | Path, nodes: int = 1) -> Cluster:
    """The cluster of the TOML file ``path`` with ``nodes`` nodes."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise TopologyError(f"cannot read cluster file {str(path)!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise TopologyError(f"cluster file {str(path)!r} is not valid TOML: {e}") from None
    levels = data.get("levels")
    if not isinstance(levels, list) or not levels or not all(isinstance(t, dict) for t in levels):
        raise TopologyError(f"{path}: expected one [[levels]] table per level, innermost first")
    parts: list[tuple[int, float, float]] = []
    for j, table in enumerate(levels):
        where = f"{path}: level {j}"
        # The outermost level's count comes from ``nodes`` (Cluster.hierarchy fills it).
        count = 1
        if j < len(levels) - 1 or j == 0:
            raw = table.get("count")
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise TopologyError(f"{where}: count must be a whole number, got {raw!r}")
            count = raw
        parts.append(
            (count, _number(table, "bandwidth", where), _number(table, "latency", where, 0))
        )
    memory = data.get("device_memory")
    if memory is not None:
        memory = _number(data, "device_memory", str(path))
    replicas = data.get("replicas", "shared")
    if replicas not in REPLICA_MODELS:
        expected = " or ".join(f'"{r}"' for r in REPLICA_MODELS)
        raise TopologyError(f"{path}: replicas must be {expected}, got {replicas!r}")
    try:
        return Cluster.hierarchy(parts, memory, replicas, nodes=nodes)
    except TopologyError as e:
        raise TopologyError(f"{path}: {e}") from None
