"""taps' plan against the compiler's own: the graph as whole-tensor JAX code with taps' layouts as
sharding constraints on every operator input and output, partitioned by XLA (Shardy or GSPMD),
compared with taps' predictions edge by edge and operator by operator. JAX differentiates the
program itself; taps' side is priced as the search priced the plan (its ``Pricing``: the step, the
planner of every edge, the cost model), and both sides in seconds on the plan's cluster: taps'
steps by taps' cost model, XLA's collectives by the same model from their groups
(:mod:`.pricing`).

Where the two differ is the evidence the cost model is judged by: per edge or operator and pass,
the bytes each device receives under taps' plan and under XLA's, and how many of them cross nodes
(collectives with a group that spans two nodes), the collectives XLA chose, and XLA's
"involuntary full rematerialization" warnings (a resharding XLA could only do by gathering the
whole tensor), read from its log while it compiles.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from taps.plan.plan import Plan
from taps.plan.pricing import Pricing
from taps.report.tables import as_text, format_seconds
from taps.verify.footprint import check_xla
from taps.verify.prediction import check_plan
from taps.verify.result import TOLERANCE, inter_node_groups
from taps.verify.xla.pricing import collective_seconds
from taps.verify.xla.program import GraphProgram, measured
from taps.verify.xla.replay import COMPILER_OPTIONS

_REMAT = "Involuntary full rematerialization"


@contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """The process's stderr (file descriptor 2, where XLA logs) while the block runs."""
    lines: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines += tmp.read().decode(errors="replace").splitlines()


@dataclass(frozen=True)
class Traffic:
    """The communication of one edge or operator in one pass, under taps' plan and XLA's.

    Bytes are per device; ``*_cross_node_bytes`` count the collectives with a group that spans
    nodes."""

    scope: str
    what: str
    phase: str
    taps_bytes: int
    xla_bytes: int
    taps_cross_node_bytes: int
    xla_cross_node_bytes: int
    taps_collectives: str
    xla_collectives: str
    rematerialized: bool
    taps_seconds: float = 0.0
    xla_seconds: float = 0.0

    @property
    def differs(self) -> bool:
        return (self.taps_bytes, self.taps_cross_node_bytes) != (
            self.xla_bytes,
            self.xla_cross_node_bytes,
        )


@dataclass
class GspmdReport:
    """XLA's partitioning of a plan against taps' (module doc).

    Attributes:
        rows: one :class:`Traffic` per edge or operator and pass with any communication.
        warnings: XLA's involuntary-rematerialization log lines.
        max_error: the largest relative error of XLA's outputs and gradients against the
            unsharded run.
        taps_bytes, xla_bytes: totals per device over the training step (in the forward
            model, backward redistributions, which taps leaves out, are in ``xla_bytes``).
        taps_seconds, xla_seconds: the same in seconds on the plan's cluster.
        step: the step taps' side is priced in (the plan's pricing).
    """

    rows: list[Traffic]
    warnings: list[str]
    max_error: float
    tolerance: float
    num_devices: int
    devices_per_node: int
    timings: dict[str, float] = field(default_factory=dict)
    step: str = "training"

    @property
    def taps_bytes(self) -> int:
        return sum(r.taps_bytes for r in self.rows)

    @property
    def xla_bytes(self) -> int:
        return sum(r.xla_bytes for r in self.rows)

    @property
    def taps_seconds(self) -> float:
        return math.fsum(r.taps_seconds for r in self.rows)

    @property
    def xla_seconds(self) -> float:
        return math.fsum(r.xla_seconds for r in self.rows)

    def _unpriced(self, r: Traffic) -> bool:
        return self.step == "forward" and r.phase == "backward" and r.scope[0] == "e"

    @property
    def xla_unpriced_bytes(self) -> int:
        """XLA's bytes for the backward pass of redistributions, which taps' forward model does
        not price (0 in the training step)."""
        return sum(r.xla_bytes for r in self.rows if self._unpriced(r))

    @property
    def xla_unpriced_seconds(self) -> float:
        """:attr:`xla_unpriced_bytes` in seconds."""
        return math.fsum(r.xla_seconds for r in self.rows if self._unpriced(r))

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": "xla-partitioner",
            "num_devices": self.num_devices,
            "devices_per_node": self.devices_per_node,
            "max_error": self.max_error,
            "tolerance": self.tolerance,
            "taps_bytes": self.taps_bytes,
            "xla_bytes": self.xla_bytes,
            "xla_unpriced_bytes": self.xla_unpriced_bytes,
            "step": self.step,
            "taps_seconds": self.taps_seconds,
            "xla_seconds": self.xla_seconds,
            "xla_unpriced_seconds": self.xla_unpriced_seconds,
            "rows": [{**asdict(r), "differs": r.differs} for r in self.rows],
            "warnings": list(self.warnings),
            "timings": dict(self.timings),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def table(self, title: str = "taps against XLA's partitioner") -> Table:
        table = Table(title=title, title_justify="left")
        names = ("phase", "what", "taps B", "XLA B", "taps x-node B", "XLA x-node B")
        for name in (*names, "taps s", "XLA s", "XLA"):
            right = name.endswith(("B", " s"))
            table.add_column(name, justify="right" if right else "left", overflow="fold")
        for r in self.rows:
            mark = "[red]" if r.differs else ""
            end = "[/]" if r.differs else ""
            table.add_row(
                r.phase,
                as_text(r.what) + (" [red](full remat)[/]" if r.rematerialized else ""),
                f"{r.taps_bytes:,}",
                f"{mark}{r.xla_bytes:,}{end}",
                f"{r.taps_cross_node_bytes:,}",
                f"{mark}{r.xla_cross_node_bytes:,}{end}",
                format_seconds(r.taps_seconds),
                format_seconds(r.xla_seconds),
                r.xla_collectives,
            )
        priced = self.xla_seconds - self.xla_unpriced_seconds
        table.caption = (
            f"per device: taps {self.taps_bytes:,} B in {format_seconds(self.taps_seconds)} "
            f"({self.step} step), XLA {self.xla_bytes - self.xla_unpriced_bytes:,} B in "
            f"{format_seconds(priced)} on the same steps and "
            f"{self.xla_unpriced_bytes:,} B for backward redistributions taps does not price; "
            f"{len(self.warnings)} rematerialization warnings; max error {self.max_error:.3g}"
        )
        table.caption_justify = "left"
        return table


def _summary(items: list[tuple[str, int]]) -> str:
    counts: dict[tuple[str, int], int] = {}
    for kind, g in items:
        counts[(kind, g)] = counts.get((kind, g), 0) + 1
    return ", ".join(
        f"{kind} g{g}" + (f" x{n}" if n > 1 else "") for (kind, g), n in sorted(counts.items())
    )


def compare_gspmd(plan: Plan, dtype: str = "float32", seed: int = 0) -> GspmdReport:
    """Compile the plan's training step with XLA's partitioner and compare (module doc)."""
    check_plan(plan, "compare_gspmd")
    check_xla(plan, dtype)
    t0 = time.perf_counter()
    # The program: whole-tensor code under taps' layouts, differentiated by JAX (the forward
    # model's program). taps' side: the plan as its search priced it.
    forward = plan.with_pricing(Pricing(step="forward"))
    prog = GraphProgram(forward, dtype, seed)
    priced = prog if plan.pricing == forward.pricing else GraphProgram(plan, dtype, seed)
    graph, cluster = plan.graph, plan.cluster
    jax = prog.jax
    args = prog.placed()
    fn = prog.train(lambda d, f: prog.body(d, f, "gspmd"))
    out_shardings = (
        {k: prog.sharding(s) for k, s in prog.out_specs.items()},
        {k: prog.sharding(s) for k, s in prog.specs_of(prog.diff).items()},
    )
    lowered = jax.jit(fn, out_shardings=out_shardings).lower(*args)
    with _captured_stderr() as log:
        compiled = lowered.compile(compiler_options=COMPILER_OPTIONS)
    t1 = time.perf_counter()
    outs, grads = compiled(*args)
    jax.block_until_ready((outs, grads))
    errors = prog.errors(outs, grads)
    warnings = [line for line in log if _REMAT in line]
    # A warning names the constraint it could not reach: an edge's, or an operator's output,
    # which is the resharding on the edges out of that operator.
    remat_scopes = set()
    for line in warnings:
        for scope in re.findall(r"taps_([eo]\d+)", line):
            if scope.startswith("e"):
                remat_scopes.add(scope)
                continue
            producer = graph.ops[int(scope[1:])].name
            remat_scopes.update(
                f"e{i}"
                for i, (e, _) in enumerate(prog.layouts.redistributions)
                if e.producer == producer
            )
    L = cluster.devices_per_node
    rows: dict[tuple[str, str], dict[str, Any]] = {}

    def row(scope: str, phase: str) -> dict[str, Any]:
        return rows.setdefault(
            (scope, phase),
            {"taps": [], "xla": [], "tb": 0, "xb": 0, "tx": 0, "xx": 0, "ts": [], "xs": []},
        )

    for p in priced.predicted():
        r = row(p.scope, p.phase)
        r["taps"].append((p.kind, len(p.groups[0])))
        r["tb"] += p.bytes
        r["tx"] += p.bytes if inter_node_groups(p.groups, L) else 0
        r["ts"].append(p.seconds or 0.0)
    for scope, phase, c in measured(compiled.as_text(), prog.mesh.num_devices):
        r = row(scope, phase)
        r["xla"].append((c.kind, c.group_size))
        r["xb"] += c.bytes
        r["xx"] += c.bytes if inter_node_groups(c.groups, L) else 0
        r["xs"].append(collective_seconds(cluster, c))
    order = {s: i for i, s in enumerate(prog.describe)}
    traffic = [
        Traffic(
            scope,
            prog.describe.get(scope, "outside every edge and operator"),
            phase,
            r["tb"],
            r["xb"],
            r["tx"],
            r["xx"],
            _summary(r["taps"]),
            _summary(r["xla"]),
            scope in remat_scopes,
            math.fsum(r["ts"]),
            math.fsum(r["xs"]),
        )
        for (scope, phase), r in sorted(
            rows.items(), key=lambda kv: (kv[0][1] != "forward", order.get(kv[0][0], -1))
        )
    ]
    return GspmdReport(
        traffic,
        warnings,
        max(errors.values(), default=0.0),
        TOLERANCE[dtype],
        prog.mesh.num_devices,
        L,
        {"compile": t1 - t0, "run": time.perf_counter() - t1},
        plan.pricing.step,
    )
