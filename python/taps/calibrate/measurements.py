"""Measured collective times: one collective of a group of devices (so many nodes, so many devices
of each), its size in bytes as nccl-tests counts it, and the seconds it took. Read from a CSV file
or from the table nccl-tests prints (docs/calibrate.md)."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Literal, cast

from taps._core import COLLECTIVE_KINDS
from taps._support.limits import check_memory
from taps.errors import CalibrationError

#: The collectives a measurement may time: those nccl-tests times and the core prices by a group.
Kind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
KINDS: tuple[Kind, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
assert set(KINDS) <= set(COLLECTIVE_KINDS)
#: Bytes per character of a measurements file while it is read and fitted (measured: 12 for
#: reading a CSV file of 200,000 rows, 14.5 for the whole of ``taps calibrate`` on 2,000,000).
TEXT_BYTES = 16
#: The columns of a measurements CSV file, in any order (others are ignored).
COLUMNS = ("collective", "nodes", "devices_per_node", "bytes", "seconds")
#: What a measured collective can be: bytes up to a pebibyte, a picosecond to 11 days (times at
#: the edges of floating point, a subnormal or 1e308 s, leave the least squares nothing to fit).
MAX_BYTES = 2**50
MIN_SECONDS, MAX_SECONDS = 1e-12, 1e6


@dataclass(frozen=True)
class Measurement:
    """One timed collective over ``nodes`` nodes with ``devices_per_node`` of their devices each
    (one group, alone on those nodes): ``bytes`` as nccl-tests' size column counts them (the whole
    buffer of an all_reduce, the gathered output of an all_gather, the input of a reduce_scatter,
    one device's send buffer of an all_to_all) and ``seconds`` it took."""

    collective: Kind
    nodes: int
    devices_per_node: int
    bytes: int
    seconds: float

    def __post_init__(self) -> None:
        if self.collective not in KINDS:
            raise CalibrationError(
                f"unknown collective {self.collective!r}: expected one of {', '.join(KINDS)}"
            )
        for what, n in (("nodes", self.nodes), ("devices_per_node", self.devices_per_node)):
            if n < 1 or n & (n - 1):
                raise CalibrationError(f"{what} must be a power of two, got {n}")
        if self.nodes * self.devices_per_node < 2:
            raise CalibrationError("a collective needs a group of at least 2 devices")
        if not 1 <= self.bytes <= MAX_BYTES:
            raise CalibrationError(
                f"bytes must be a positive count of at most 2**50, got {self.bytes}"
            )
        if not (math.isfinite(self.seconds) and MIN_SECONDS <= self.seconds <= MAX_SECONDS):
            raise CalibrationError(
                f"seconds must be a positive time of a measured collective (1e-12 to 1e6 s), "
                f"got {self.seconds}"
            )


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CalibrationError(f"{what} must be a whole number, got {text!r}") from None


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CalibrationError(f"{what} must be a number, got {text!r}") from None


def _check_size(text: str, name: str) -> None:
    """Refuse, before its rows are read, a file whose measurements would not fit in memory."""
    check_memory(
        f"the {len(text):,} characters of {name}",
        TEXT_BYTES * len(text),
        "calibrate from fewer measurements",
    )


def read_csv(text: str, name: str) -> list[Measurement]:
    """The measurements of the CSV ``text`` of the file ``name``: a header naming at least
    :data:`COLUMNS`, then one measurement a row. A bad file raises :class:`CalibrationError`
    naming the file and line."""
    _check_size(text, name)
    rows = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (rows.fieldnames or [])]
    if missing:
        raise CalibrationError(
            f"{name}: expected a CSV header with the columns {', '.join(COLUMNS)}; missing "
            f"{', '.join(missing)}"
        )
    out = []
    for row in rows:
        try:
            if any(row[c] is None for c in COLUMNS):
                raise CalibrationError("too few values")
            out.append(
                Measurement(
                    cast(Kind, row["collective"].strip()),
                    _integer(row["nodes"], "nodes"),
                    _integer(row["devices_per_node"], "devices_per_node"),
                    _integer(row["bytes"], "bytes"),
                    _number(row["seconds"], "seconds"),
                )
            )
        except CalibrationError as e:
            raise CalibrationError(f"{name}, line {rows.line_num}: {e}") from None
    if not out:
        raise CalibrationError(f"{name}: no measurements")
    return out


def read_nccl_tests(
    text: str, name: str, collective: Kind, nodes: int, devices_per_node: int
) -> list[Measurement]:
    """The measurements of nccl-tests' output ``text`` (e.g. ``all_reduce_perf -b 8 -e 1G -f
    2``) of the file ``name``, run on ``nodes`` nodes with ``devices_per_node`` devices each: one
    a row of its table (size in bytes, then count, type, redop, root, and the out-of-place time
    in microseconds, which is taken). Comment lines (``#``) and others are skipped."""
    _check_size(text, name)
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#") or not fields[0].isdigit():
            continue
        if len(fields) < 6:
            raise CalibrationError(
                f"{name}, line {number}: expected size, count, type, redop, root and time, got "
                f"{line.strip()!r}"
            )
        try:
            out.append(
                Measurement(
                    collective,
                    nodes,
                    devices_per_node,
                    _integer(fields[0], "the size"),
                    _number(fields[5], "the time") * 1e-6,
                )
            )
        except CalibrationError as e:
            raise CalibrationError(f"{name}, line {number}: {e}") from None
    if not out:
        raise CalibrationError(f"{name}: no nccl-tests result rows (size, count, type, ...)")
    return out
