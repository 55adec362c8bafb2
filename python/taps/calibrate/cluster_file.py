"""A cluster as the TOML file the core reads (docs/core.md): its device, memory, replica model
and levels, each number written to round-trip exactly."""

from __future__ import annotations

from taps._core import Cluster


def _number(x: float) -> str:
    """``x`` as TOML writes a float that reads back to the same bits."""
    return "inf" if x == float("inf") else repr(float(x))


def cluster_toml(cluster: Cluster, comment: str = "") -> str:
    """The TOML text of ``cluster``: ``Cluster.preset(path, cluster.nodes)`` on a file holding
    it gives back an equal cluster. ``comment`` (one line) heads the file."""
    memory = cluster.device_memory
    lines = [f"# {comment}"] if comment else []
    lines += [
        f'device = "{cluster.device.name}"',
        f"device_memory = {_number(float('inf') if memory is None else memory)}",
        f'replicas = "{cluster.replicas}"',
    ]
    last = len(cluster.levels) - 1
    for j, (parts, bandwidth, latency) in enumerate(cluster.levels):
        lines += ["", "[[levels]]"]
        # The outermost level's count comes from the nodes a reader asks for.
        if j < last or j == 0:
            lines.append(f"count = {parts}")
        lines += [f"bandwidth = {_number(bandwidth)}", f"latency = {_number(latency)}"]
    return "\n".join(lines) + "\n"
