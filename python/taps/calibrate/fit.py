"""Fit a cluster's per-level latency and bandwidth to measured collective times by least squares.

The core prices a collective linearly in each level's latency and in the inverse of each level's
bandwidth, so a measurement's predicted time is ``sum_j a_j * latency_j + b_j / bandwidth_j``. The
coefficients come from the core itself (``Cluster.collective_cost`` on unit clusters: one level's
latency 1 s, or its bandwidth 1 B/s, the rest free), not from a copy of its formulas. The fit
minimises the relative errors (a 1 KiB and a 1 GiB measurement weigh alike) with every latency and
inverse bandwidth not negative, exactly: every set of unknowns held at zero is tried."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from taps._core import Cluster, Layout
from taps.calibrate.measurements import Measurement
from taps.errors import CalibrationError

#: The bandwidth of a level that is free in a unit cluster: its transfers take no time.
_FREE = 1e300


@dataclass(frozen=True)
class Fit:
    """The fitted ``cluster`` (the base cluster's structure, device and nodes), how many
    measurements determined each level (a level none reached keeps the base's numbers), each
    measurement's predicted seconds, and the root mean square of the relative errors."""

    cluster: Cluster
    measured: tuple[int, ...]
    measurements: tuple[Measurement, ...]
    predicted: tuple[float, ...]
    relative_rms: float

    def to_dict(self) -> dict[str, object]:
        """The fit as JSON: per level its numbers, then per measurement its prediction."""
        return {
            "device": self.cluster.device.name,
            "levels": [
                {"parts": parts, "bandwidth": bandwidth, "latency": latency, "measured": n}
                for (parts, bandwidth, latency), n in zip(
                    self.cluster.levels, self.measured, strict=True
                )
            ],
            "relative_rms": self.relative_rms,
            "measurements": [
                {
                    "collective": m.collective,
                    "nodes": m.nodes,
                    "devices_per_node": m.devices_per_node,
                    "bytes": m.bytes,
                    "seconds": m.seconds,
                    "predicted": p,
                }
                for m, p in zip(self.measurements, self.predicted, strict=True)
            ],
        }


def _group_levels(
    base: Sequence[tuple[int, float, float]], m: Measurement
) -> list[tuple[int, float, float]]:
    """The levels of the smallest cluster of ``base``'s structure that holds ``m``'s group and
    nothing else: its devices of each node, then the levels its nodes reach (a group of nodes
    within one unit of a level stops there)."""
    if m.devices_per_node > base[0][0]:
        raise CalibrationError(
            f"a group of {m.devices_per_node} devices per node does not fit nodes of {base[0][0]}"
        )
    levels = [(m.devices_per_node, *base[0][1:])]
    remaining = m.nodes
    for j, (count, bandwidth, latency) in enumerate(base[1:], 1):
        if remaining == 1:
            break
        last = j == len(base) - 1
        if last or remaining <= count:
            levels.append((remaining, bandwidth, latency))
            remaining = 1
            break
        if remaining % count:
            raise CalibrationError(
                f"a group of {m.nodes} nodes does not fill units of {count} at level {j}"
            )
        levels.append((count, bandwidth, latency))
        remaining //= count
    if remaining != 1:
        raise CalibrationError(f"a group of {m.nodes} nodes needs a cluster of more than one node")
    return levels


def _seconds(levels: list[tuple[int, float, float]], m: Measurement) -> float:
    """The core's price of ``m`` alone on a cluster of ``levels`` holding just its group (one
    transfer per copy: the group is every device)."""
    cluster = Cluster.hierarchy(levels, math.inf, "flat")
    g = m.nodes * m.devices_per_node
    if m.collective in ("all_reduce", "reduce_scatter"):
        layout, dim, dtype = Layout([m.bytes], [g], [-1]), 0, 1.0
    elif m.collective == "all_gather":
        # Each device holds a g-th of the gathered bytes.
        layout, dim, dtype = Layout([m.bytes * g], [g], [0]), 0, 1.0 / g
    else:  # all_to_all: each device sends its whole buffer of `bytes`
        layout, dim, dtype = Layout([m.bytes * g], [g], [0]), 0, 1.0
    if m.collective == "all_reduce":
        return cluster.collective_cost(layout, "all_reduce", dtype_bytes=dtype)
    return cluster.collective_cost(layout, m.collective, dim, dtype)


def coefficients(base: Sequence[tuple[int, float, float]], m: Measurement) -> np.ndarray:
    """The row ``[a_0, ..., a_L, b_0, ..., b_L]`` of ``m``: its seconds per second of each
    level's latency, then per second-per-byte of each level's inverse bandwidth."""
    levels = _group_levels(base, m)
    n = len(base)
    row = np.zeros(2 * n)

    def unit(j: int, latency: bool) -> list[tuple[int, float, float]]:
        return [
            (parts, 1.0 if i == j and not latency else _FREE, 1.0 if i == j and latency else 0.0)
            for i, (parts, _, _) in enumerate(levels)
        ]

    free = _seconds(unit(-1, True), m)
    for j in range(len(levels)):
        row[j] = _seconds(unit(j, True), m) - free
        row[n + j] = _seconds(unit(j, False), m) - free
    return row


def _nonnegative_least_squares(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``x >= 0`` minimising ``|a x - t|``: the best unconstrained solution over every set of
    unknowns left free (the others at zero) that is not negative (a handful of unknowns)."""
    best, best_residual = np.zeros(a.shape[1]), float(np.sum(t**2))
    columns = range(a.shape[1])
    for size in range(1, a.shape[1] + 1):
        for free in itertools.combinations(columns, size):
            x_free = np.linalg.lstsq(a[:, free], t, rcond=None)[0]
            if np.any(x_free < 0):
                continue
            x = np.zeros(a.shape[1])
            x[list(free)] = x_free
            residual = float(np.sum((a @ x - t) ** 2))
            if residual < best_residual:
                best, best_residual = x, residual
    return best


def fit(measurements: Sequence[Measurement], base: Cluster) -> Fit:
    """The latency and bandwidth of every level of ``base`` that ``measurements`` reach, fitted
    (the others kept); raises :class:`CalibrationError` if a reached level's bandwidth is not
    determined (its transfers cost nothing in the fit: measure larger messages)."""
    if not measurements:
        raise CalibrationError("no measurements to fit")
    parts = base.levels
    n = len(parts)
    rows = np.array([coefficients(parts, m) for m in measurements])
    seconds = np.array([m.seconds for m in measurements])
    measured = tuple(int(np.count_nonzero(rows[:, j] + rows[:, n + j])) for j in range(n))
    reached = [j for j in range(n) if measured[j]] + [n + j for j in range(n) if measured[j]]
    weighted = rows[:, reached] / seconds[:, None]
    x = np.zeros(2 * n)
    x[reached] = _nonnegative_least_squares(weighted, np.ones(len(measurements)))
    levels = []
    for j, (count, bandwidth, latency) in enumerate(parts):
        if measured[j]:
            if x[n + j] <= 0:
                raise CalibrationError(
                    f"the measurements do not determine the bandwidth of level {j}: their "
                    "transfers fit in no time (measure larger messages)"
                )
            bandwidth, latency = 1.0 / x[n + j], float(x[j])
        levels.append((count, bandwidth, latency))
    # The fitted numbers on the base's structure, then the base's nodes.
    memory = math.inf if base.device_memory is None else base.device_memory
    cluster = Cluster.hierarchy(levels, memory, base.replicas, base.device.name, nodes=base.nodes)
    predicted = rows @ np.concatenate([[lvl[2] for lvl in levels], [1 / lvl[1] for lvl in levels]])
    errors = predicted / seconds - 1.0
    return Fit(
        cluster=cluster,
        measured=measured,
        measurements=tuple(measurements),
        predicted=tuple(float(p) for p in predicted),
        relative_rms=float(np.sqrt(np.mean(errors**2))),
    )
