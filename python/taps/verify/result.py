"""Predicted against measured collectives, one for one, and the verdict of a verification: the
records every engine fills in (:class:`Predicted`, :class:`Measured`), their pairing
(:func:`match`) and the result (:class:`VerifyResult`), with the numerics it is held to.

Bytes are per device received, the convention of taps' cost model (``s`` the bytes each device puts
in, ``g`` the group size): all-gather ``(g-1) s``, all-to-all and reduce-scatter ``(g-1)/g s``,
all-reduce ``2(g-1)/g s`` (ring) rounded up to whole elements (as taps prices it: a scalar's
all-reduce over 4 devices receives 2 elements, not 1.5), collective-permute ``s``.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from taps.errors import VerifyError
from taps.report.tables import as_text

#: Relative error allowed per dtype (float sums run in another order when sharded).
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}

#: A prediction matched by a collective of the same kind, groups and bytes.
OK = "ok"
#: Predicted, and the same scope has a collective of that kind with other groups or bytes.
DIFFERS = "differs"
#: Predicted, and nothing like it was compiled.
MISSING = "missing"
#: Compiled and not predicted.
UNEXPECTED = "unexpected"
#: Compiled in the backward pass of a redistribution, which taps' cost model leaves out.
UNPRICED = "unpriced"
#: Predicted on an edge that runs, up to this step, what another edge of the same tensor runs:
#: the compiler computes it once, taps prices it per edge.
SHARED = "shared"


@dataclass(frozen=True)
class Predicted:
    """A collective taps' plan says will run.

    Attributes:
        kind: ``"all_gather"``, ``"all_to_all"``, ``"all_reduce"``, ...
        groups: the groups of ranks, each sorted, sorted.
        bytes: bytes each device receives (taps' volume model at the run's element size).
        scope: the edge or operator it belongs to (``"e3"``, ``"o5"``).
        phase: ``"forward"`` or ``"backward"``.
        what: a readable description (the edge or tensor and why).
        same: predictions with one ``same`` key run one collective on the same data (edges that
            move one tensor between the same distributions): the compiler keeps one of them.
        seconds: taps' price of it on the plan's cluster (topology model, at the run's element
            size).
    """

    kind: str
    groups: tuple[tuple[int, ...], ...]
    bytes: int
    scope: str
    phase: str
    what: str
    same: Hashable | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class Measured:
    """A collective an engine ran.

    Attributes:
        kind: ``"all_gather"``, ``"all_reduce"``, ``"all_to_all"``, ``"reduce_scatter"``,
            ``"collective_permute"`` (or ``"collective_broadcast"``).
        name: the engine's name for it.
        groups: the groups of ranks as sorted tuples, sorted; for a collective-permute, the
            ``(source, target)`` pairs.
        group_size: ranks per group (2 for a collective-permute).
        dtype: the element type.
        in_bytes: bytes each device puts in.
        bytes: bytes each device receives (module doc).
    """

    kind: str
    name: str
    groups: tuple[tuple[int, ...], ...]
    group_size: int
    dtype: str
    in_bytes: int
    bytes: int


def received_bytes(kind: str, in_bytes: int, g: int, itemsize: int) -> int:
    """Bytes each device receives (module doc) for ``in_bytes`` put in by each of ``g``, in
    elements of ``itemsize`` bytes."""
    if kind == "all_gather":
        return (g - 1) * in_bytes
    if kind == "all_reduce":
        return -(-2 * (g - 1) * (in_bytes // itemsize) // g) * itemsize
    if kind in ("all_to_all", "reduce_scatter"):
        return (g - 1) * in_bytes // g
    return in_bytes


@dataclass(frozen=True)
class CollectiveCheck:
    """One row of the comparison."""

    status: str
    kind: str
    group_size: int
    predicted_bytes: int | None
    measured_bytes: int | None
    phase: str
    what: str
    hlo_name: str = ""
    inter_node_groups: int | None = None
    #: taps' price of the predicted collective on the plan's cluster.
    predicted_seconds: float | None = None
    #: The compiled collective's groups of ranks (its ``(source, target)`` pairs for a permute).
    measured_groups: tuple[tuple[int, ...], ...] | None = None


def inter_node_groups(groups: Iterable[Iterable[int]], devices_per_node: int | None) -> int | None:
    """How many groups span more than one node (taps' ``ct``)."""
    if devices_per_node is None:
        return None
    return sum(len({r // devices_per_node for r in g}) > 1 for g in groups)


def match(
    predicted: list[Predicted],
    measured: Sequence[tuple[str, str, Measured]],
    describe: dict[str, str],
    devices_per_node: int | None = None,
    unpriced: bool = True,
) -> list[CollectiveCheck]:
    """Pair each prediction with a compiled collective of the same scope and phase (``measured``
    holds ``(scope, phase, collective)``): first by kind, groups and bytes, then (``differs``) by
    kind alone. A prediction left over whose ``same`` key another matched prediction has (the
    compiler computed that collective once, for the other edge) is ``shared``. Leftover compiled
    collectives are ``unpriced`` when ``unpriced`` says taps leaves the backward pass of a
    redistribution out (the paper's model) and they are one (scope ``e...``), else
    ``unexpected``."""
    rows: list[CollectiveCheck] = []
    unmatched: list[Predicted] = []
    done: dict[Hashable, str] = {}  # the scope each ``same`` key was compiled for

    def row(
        status: str, p: Predicted | None, m: Measured | None, what: str, phase: str = ""
    ) -> None:
        rows.append(
            CollectiveCheck(
                status,
                (p or m).kind,  # type: ignore[union-attr]
                len(p.groups[0]) if p else m.group_size,  # type: ignore[union-attr]
                p.bytes if p else None,
                m.bytes if m else None,
                p.phase if p else phase,
                what,
                m.name if m else "",
                inter_node_groups(m.groups if m else p.groups, devices_per_node),  # type: ignore[union-attr]
                p.seconds if p else None,
                m.groups if m else None,
            )
        )

    # Indexed by what pairs them, in compiled order: the first free collective of a key is the
    # one a scan in that order would find (a model's step issues thousands).
    exact: dict[Hashable, deque[int]] = defaultdict(deque)
    loose: dict[Hashable, deque[int]] = defaultdict(deque)
    for i, (s, ph, c) in enumerate(measured):
        exact[(s, ph, c.kind, _hashable(c.groups), c.bytes)].append(i)
        loose[(s, ph, c.kind)].append(i)
    taken = [False] * len(measured)

    def take(queue: deque[int]) -> Measured | None:
        while queue and taken[queue[0]]:
            queue.popleft()
        if not queue:
            return None
        taken[queue[0]] = True
        return measured[queue.popleft()][2]

    for p in predicted:
        m = take(exact[(p.scope, p.phase, p.kind, _hashable(p.groups), p.bytes)])
        if m is None:
            unmatched.append(p)
        else:
            row(OK, p, m, p.what)
            if p.same is not None:
                done.setdefault(p.same, p.scope)
    for p in unmatched:
        m = take(loose[(p.scope, p.phase, p.kind)])
        twin = None if p.same is None else done.get(p.same)
        if m is None and twin is not None:
            row(SHARED, p, None, f"{p.what} (computed once, for {describe[twin]})")
        elif m is None:
            row(MISSING, p, None, p.what)
        else:
            row(DIFFERS, p, m, p.what)
    left = [x for i, x in enumerate(measured) if not taken[i]]
    for scope, phase, m in left:
        priced = not unpriced or phase != "backward" or not scope.startswith("e")
        status = UNEXPECTED if priced else UNPRICED
        row(status, None, m, describe.get(scope, "outside every edge and operator"), phase)
    return rows


def _hashable(groups: Iterable[Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(g) for g in groups)


@dataclass
class VerifyResult:
    """The verdict of running a plan on an engine.

    Attributes:
        ok: every predicted collective compiled as predicted, nothing unexpected compiled, and
            every result within ``tolerance`` of the unsharded run.
        max_error: the largest error of any output or gradient, relative to the largest magnitude
            of that tensor in the unsharded run (0 for exact data movement).
        tolerance: the bound ``max_error`` is held to.
        collectives: every predicted and every compiled collective, paired (:func:`match`).
        mismatches: one readable line per problem.
        engine, num_devices, devices_per_node: what ran it.
        timings: seconds of ``compile`` (building, tracing and compiling), ``run`` and
            ``reference`` (the unsharded run, and the comparison).
        errors: the relative error of every output (by tensor) and gradient (``grad op#slot``).
    """

    ok: bool
    max_error: float
    tolerance: float
    collectives: list[CollectiveCheck]
    mismatches: list[str]
    engine: str = "xla"
    num_devices: int = 0
    devices_per_node: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)

    @classmethod
    def judged(
        cls,
        rows: list[CollectiveCheck],
        errors: dict[str, float],
        tolerance: float,
        engine: str,
        num_devices: int,
        devices_per_node: int | None,
        timings: dict[str, float],
    ) -> VerifyResult:
        """The result of a comparison, with its verdict (:func:`verdict`)."""
        ok, max_error, lines = verdict(rows, errors, tolerance)
        return cls(
            ok,
            max_error,
            tolerance,
            rows,
            lines,
            engine,
            num_devices,
            devices_per_node,
            timings,
            errors,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "max_error": self.max_error,
            "tolerance": self.tolerance,
            "engine": self.engine,
            "num_devices": self.num_devices,
            "devices_per_node": self.devices_per_node,
            "collectives": [asdict(c) for c in self.collectives],
            "mismatches": list(self.mismatches),
            "errors": dict(self.errors),
            "timings": dict(self.timings),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyResult:
        """The result :meth:`to_dict` wrote."""
        fields = dict(data)
        fields["collectives"] = [
            CollectiveCheck(**{**c, "measured_groups": _groups(c["measured_groups"])})
            for c in data["collectives"]
        ]
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def table(self, title: str = "Verification") -> Table:
        """A rich table: predicted against measured per collective, then the verdict."""
        return result_table(self, title)


def _groups(groups: Any) -> tuple[tuple[int, ...], ...] | None:
    """Groups read back from JSON lists."""
    return None if groups is None else tuple(tuple(g) for g in groups)


def check_dtype(name: str) -> None:
    """A :class:`VerifyError` unless a verification runs in dtype ``name`` (one of
    :data:`TOLERANCE`)."""
    if name not in TOLERANCE:
        raise VerifyError(f"unknown dtype {name!r}: expected one of {sorted(TOLERANCE)}")


def relative_error(got: Any, want: Any, floor: float = 0.0) -> float:
    """The largest difference, relative to the largest magnitude of ``want`` or to ``floor``,
    whichever is larger (0 for equal)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = max(float(np.max(np.abs(want), initial=0.0)), floor) or 1.0
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


#: A gradient is compared at no less than this fraction of the step's largest gradient (see
#: :func:`step_errors`).
GRADIENT_FLOOR = 1e-2


def step_errors(got: dict[str, Any], want: dict[str, Any]) -> dict[str, float]:
    """Per result of a training step (outputs, and gradients keyed ``"grad ..."``), its
    :func:`relative_error` against the reference ``want``; a gradient's scale is at least
    :data:`GRADIENT_FLOOR` of the largest magnitude of any gradient of the step.

    Rounding leaves an absolute error of the order of the dtype's epsilon times the gradients
    flowing through the step, whatever the size of the result. A gradient that exact math makes
    zero is that noise alone (BERT's key bias: softmax ignores a shift shared by every key;
    MLP-Mixer's token-mixing output bias: every path from it passes a LayerNorm over the
    channels, which ignores a shift per token), so its error relative to its own magnitude is
    noise over noise (BERT's: 1.2e-6 either way, 0.3 epsilon of its largest gradient, 32).
    Against a hundredth of the largest gradient an error still fails beyond ``tolerance / 100``
    of it (1e-6 in float32, some thirty times that noise), so a real disagreement does not
    pass."""
    grads = [
        np.max(np.abs(np.asarray(v, dtype=np.float64)), initial=0.0)
        for k, v in want.items()
        if k.startswith("grad ")
    ]
    floor = GRADIENT_FLOOR * float(max(grads, default=0.0))
    return {
        k: relative_error(v, want[k], floor if k.startswith("grad ") else 0.0)
        for k, v in got.items()
    }


def verdict(
    rows: list[CollectiveCheck], errors: dict[str, float], tolerance: float
) -> tuple[bool, float, list[str]]:
    """``(ok, max_error, mismatches)`` of a comparison."""
    lines = []
    for r in rows:
        if r.status in (DIFFERS, MISSING, UNEXPECTED):
            lines.append(
                f"{r.status}: {r.phase} {r.kind} (group {r.group_size}) {r.what}: predicted "
                f"{r.predicted_bytes} B, compiled {r.measured_bytes} B"
            )
    max_error = max(errors.values(), default=0.0)
    for name, e in errors.items():
        if not e <= tolerance:
            lines.append(f"numerics: {name} is off by {e:.3g} (relative), more than {tolerance:g}")
    return not lines, max_error, lines


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def result_table(result: VerifyResult, title: str) -> Table:
    table = Table(title=as_text(title), title_justify="left")
    for name in ("phase", "collective", "group", "what", "predicted B", "measured B", "ct", ""):
        right = name in ("group", "predicted B", "measured B", "ct")
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    style = {OK: "green", UNPRICED: "yellow", SHARED: "yellow"}
    for c in result.collectives:
        table.add_row(
            c.phase,
            c.kind,
            str(c.group_size),
            as_text(c.what),
            _bytes(c.predicted_bytes),
            _bytes(c.measured_bytes),
            "-" if c.inter_node_groups is None else str(c.inter_node_groups),
            f"[{style.get(c.status, 'red')}]{c.status}[/]",
        )
    verdict_text = "[green]OK[/]" if result.ok else "[red]MISMATCH[/]"
    table.caption = (
        f"{verdict_text}  max error {result.max_error:.3g} (tolerance {result.tolerance:g})  "
        f"{result.num_devices} devices  "
        + "  ".join(f"{k} {v:.2f} s" for k, v in result.timings.items())
    )
    table.caption_justify = "left"
    return table
