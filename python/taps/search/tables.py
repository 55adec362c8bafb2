"""The cost tables the solver decides on: every operator's candidates with their node costs and
memory, and every edge's redistribution costs between the layout classes of its two ends, computed
once per distinct operator and edge (docs/search.md)."""

from __future__ import annotations

import mmap
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from taps._core import (
    Cluster,
    Layout,
    Strategy,
    allreduce_costs,
    gathered_sum,
    layout_classes,
    redistribution_costs,
    redistribution_pair_bounds,
    redistribution_pair_costs,
    redistribution_pair_estimates,
    redistribution_table_bounds,
)
from taps._support.deadline import check, left
from taps.graph import Edge, Graph, Operator
from taps.plan.candidates import Candidate, candidates, partial_dims, strategy_arrays
from taps.plan.pricing import Pricing
from taps.search.checkpointing import checkpointing
from taps.search.compute import compute_times, overlapped_backward, roofline_of
from taps.search.prices import (
    all_reduce_operands,
    apart_operands,
    copies_of,
    intra_collectives,
    is_parameter_gradient,
    memories,
    partial_flows,
    reduced_operands,
)
from taps.solve.reductions import (
    Memo,
    PairCost,
    Problem,
    Products,
    pair_min_marginals,
    reduce,
)
from taps.solve.ties import Ties

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel
    from taps._core import _Planner as Planner


@dataclass
class OpTable:
    """The candidates of one operator with their node costs and memory; ``sharded`` marks the
    candidates that store the operator's parameters sharded (FSDP: a strategy's twin, same
    layouts, docs/search.md#parameter-storage-sharding)."""

    op: Operator
    candidates: list[Candidate]
    node_cost: np.ndarray
    memory: np.ndarray
    sharded: np.ndarray

    @property
    def strategies(self) -> list[Strategy]:
        return [c.strategy for c in self.candidates]


@dataclass
class EdgeTable:
    """One graph edge: each producer strategy's output layout class, each consumer strategy's
    input layout class, and the cost of every class pair. Strategies that give a tensor the same
    distribution share a class, so the ILP needs one flow variable per class pair."""

    edge: Edge
    source_class: np.ndarray
    target_class: np.ndarray
    cost: np.ndarray

    @property
    def num_aux_edges(self) -> int:
        """The paper's count: one auxiliary edge per pair of strategies."""
        return len(self.source_class) * len(self.target_class)


@dataclass
class CostTables:
    """Everything the solver needs, computed once per graph, cluster and pricing: the
    :class:`taps.solve.Instance` the search decides."""

    graph: Graph
    cluster: Cluster
    pricing: Pricing
    ops: dict[str, OpTable]
    edges: list[EdgeTable]
    timings: dict[str, float] = field(default_factory=dict)
    #: Bounded tables (:func:`build_tables`): prices exactly the next direction of each edge
    #: cost an assignment uses that is still a bound (the forward first; on large tables both,
    #: and spare pairs, :func:`_refine`), True if there was one. Its spare pairs' reductions
    #: take their min-plus products by the :class:`Products` given (the rounds' solves': the
    #: tables they reduce are the solve's, but for the pairs just priced).
    refine: Callable[[Mapping[str, int], Products | None], bool] | None = None

    @property
    def num_aux_edges(self) -> int:
        return sum(e.num_aux_edges for e in self.edges)

    @property
    def memory_per_op(self) -> dict[str, np.ndarray]:
        """Each operator's memory per device for each candidate (one layer)."""
        return {name: t.memory for name, t in self.ops.items()}

    @property
    def layers(self) -> int:
        return self.graph.layers

    @property
    def tied(self) -> Sequence[Sequence[Sequence[str]]]:
        return self.graph.tied

    def problem(self) -> Problem:
        """The tables as the problem the solver decides: a pair cost per edge."""
        return _problem(self.ops, self.edges)

    def evaluate(self, choice: Mapping[str, int]) -> float:
        """The objective of one assignment (op name -> index into its candidates)."""
        return self.problem().evaluate(choice)

    def strategies(self, choice: Mapping[str, int]) -> dict[str, Strategy]:
        """The strategies of one assignment."""
        return {name: self.ops[name].strategies[i] for name, i in choice.items()}

    def sharded(self, choice: Mapping[str, int]) -> tuple[str, ...]:
        """The operators of one assignment that store their parameters sharded (FSDP)."""
        return tuple(name for name, i in choice.items() if self.ops[name].sharded[i])

    def pricing_of(self, choice: Mapping[str, int]) -> Pricing:
        """The pricing of one assignment's plan: the search's, ``fsdp`` naming the operators the
        assignment shards (docs/plan.md)."""
        return replace(self.pricing, fsdp=self.sharded(choice))


def _problem(ops: Mapping[str, OpTable], edges: Sequence[EdgeTable]) -> Problem:
    """Operators' and edges' tables as the problem the solver decides: a pair cost per edge."""
    return Problem(
        {name: t.node_cost for name, t in ops.items()},
        [
            PairCost(e.edge.producer, e.edge.consumer, e.source_class, e.target_class, e.cost)
            for e in edges
        ],
    )


def _dearer(
    edges: Sequence[EdgeTable],
    bounds: Mapping[int, _Bound],
    choice: Mapping[str, int],
    paper: Callable[[list[Layout], list[Layout], list[float]], np.ndarray],
) -> float:
    """How much more than the tables' bounds the assignment ``choice`` costs at most: up to
    Algorithm 1's cost in each direction still a bound, worked out (by one call of ``paper``
    per assignment) where the tables left it unknown (NaN: the cheap bounds need it only for
    the pairs an assignment takes)."""
    taken = [
        (
            bounds[id(e.cost)],
            int(e.source_class[choice[e.edge.producer]]),
            int(e.target_class[choice[e.edge.consumer]]),
        )
        for e in edges
    ]
    index: dict[tuple[Layout, Layout, float], int] = {}
    todo = [
        (b, direction, i, j, _at(index, s, t, b.dtype))
        for b, i, j in taken
        for direction, s, t in b.inexact(i, j)
        if np.isnan(b.upper[direction][i, j])
    ]
    if todo:
        costs = _priced(index, paper)
        for b, direction, i, j, k in todo:
            b.upper[direction][i, j] = costs[k]
    return sum(b.dearer(i, j) for b, i, j in taken)


def _classes(
    forward: Sequence[Layout],
    backward: Sequence[Layout] | None,
    forward_partial: np.ndarray | None = None,
    backward_partial: np.ndarray | None = None,
) -> tuple[np.ndarray, _End]:
    """Group the candidates of one end of an edge by the distributions they give the tensor (the
    ``forward`` layout, and in the training step the gradient's, ``backward``; a direction's
    ``*_partial``, :func:`taps.plan.candidates.partial_dims`, gives its layouts partial sums), each
    written as Algorithm 1 plans it (the compacted form: the canonical form would also merge
    tensor dims, which changes the paper's plans). In one call of the core
    (:func:`taps._core.layout_classes`): compacting and hashing some 100,000 layouts one by one
    was most of the tables' Python, and building the 23,000 (timm_swin) to 42,000 (jax_llama)
    partial ones much of the rest."""
    cls, ahead, back = layout_classes(forward, backward, forward_partial, backward_partial)
    return cls, _End.of(ahead, back)


#: Prices by source layout and target layout, a matrix per plane, with the row of each source
#: layout and the column of each target layout. Plane 0 is the price; with bounds, plane 1 is 1.0
#: where a bound is not the pair's exact cost (0.0 where it is).
_Matrix = tuple[list[np.ndarray], dict[Layout, int], dict[Layout, int]]

#: Where the pairs of some sources and targets lie in one plane of a :class:`_Priced` matrix:
#: the plane, the row of each source and the column of each target.
_Term = tuple[np.ndarray, np.ndarray, np.ndarray]


class _Side(list[Layout]):
    """The layouts of one end's classes in one direction: the sources or the targets of a
    matrix of :class:`_Priced`. An end serves many edges: its set (whose hash Python keeps) and
    its positions in each matrix read back are worked out once."""

    @cached_property
    def set(self) -> frozenset[Layout]:
        return frozenset(self)

    @cached_property
    def _positions(self) -> dict[int, np.ndarray]:
        return {}

    @cached_property
    def where(self) -> dict[Layout, list[int]]:
        """The positions holding each layout."""
        out: dict[Layout, list[int]] = {}
        for k, x in enumerate(self):
            out.setdefault(x, []).append(k)
        return out

    def positions(self, index: dict[Layout, int]) -> np.ndarray:
        """Each layout's entry in ``index`` (a matrix's rows or columns). ``index`` lives as
        long as its matrix, so its identity keys it."""
        if id(index) not in self._positions:
            self._positions[id(index)] = np.fromiter(
                map(index.__getitem__, self), dtype=np.int64, count=len(self)
            )
        return self._positions[id(index)]


class _End(list[tuple[Layout, ...]]):
    """The layout classes of one end of an edge (:func:`_classes`), each direction's layouts a
    :class:`_Side` made once."""

    @classmethod
    def of(cls, forward: list[Layout], backward: list[Layout] | None) -> _End:
        """The classes whose forward layouts are ``forward`` and gradients' ``backward``: its
        sides are these lists."""
        end = cls(zip(forward, backward) if backward is not None else ((x,) for x in forward))
        end.sides = _Side(forward), None if backward is None else _Side(backward)
        return end

    @cached_property
    def sides(self) -> tuple[_Side, _Side | None]:
        return _Side(r[0] for r in self), _Side(r[1] for r in self) if self[0][1:] else None


def _as_side(layouts: Sequence[Layout]) -> _Side:
    return layouts if isinstance(layouts, _Side) else _Side(layouts)


def _side(rows: Sequence[tuple[Layout, ...]], k: int) -> _Side:
    """The ``k``-th layout of every row: an end's own :class:`_Side`, or one made for a block
    of its rows."""
    side = rows.sides[k] if isinstance(rows, _End) else None
    return side if side is not None else _Side(r[k] for r in rows)


def _fresh(rows: int, cols: int) -> np.ndarray:
    """An uninitialised ``rows`` x ``cols`` float64 matrix (C order) in anonymous pages of its
    own, mapped in at once. Not ``np.empty``: numpy asks the kernel to back large arrays with
    huge pages, and under the kernel's default ``defrag=madvise`` their first touch may wait for
    memory to be compacted; with the pages faulted in one call the memo's largest blocks, written
    once and then only read, cost a third of the CPU (docs/performance.md)."""
    if not hasattr(mmap, "MAP_ANONYMOUS") or rows * cols == 0:
        return np.empty((rows, cols))  # Windows maps no anonymous pages; mmap refuses 0 bytes
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    pages = mmap.mmap(-1, rows * cols * 8, flags=flags)
    return np.frombuffer(pages, dtype=np.float64).reshape(rows, cols)


class _Stopped(Exception):
    """The other thread of :func:`_alongside` stopped: this one's work is dropped."""


class _Jobs:
    """The memo's work on its matrices (the kernel's pricing, blocks read from earlier matrices),
    in the order it is handed in. ``threaded``: run by another thread (:func:`_alongside`), which
    :meth:`wait` waits for; else each job runs as it is handed in."""

    def __init__(self, threaded: bool = False) -> None:
        self._queue: queue.SimpleQueue[Callable[[], object] | None] | None = (
            queue.SimpleQueue() if threaded else None
        )
        self._ran = threading.Condition()
        self._handed = self._done = 0
        #: By ``id`` of each matrix a job reads or writes, the count of jobs handed in up to the
        #: last such job.
        self._last: dict[int, int] = {}
        self._stopped = False

    def put(self, job: Callable[[], object], arrays: Sequence[np.ndarray]) -> None:
        """Run ``job``, which reads or writes ``arrays`` (whole matrices, not views)."""
        if self._queue is None:
            job()
            return
        if self._stopped:
            raise _Stopped
        self._handed += 1
        for a in arrays:
            self._last[id(a)] = self._handed
        self._queue.put(job)

    def wait(self, arrays: Sequence[np.ndarray]) -> None:
        """Until every job handed in that reads or writes ``arrays`` has run."""
        need = max((self._last.get(id(a), 0) for a in arrays), default=0)
        with self._ran:
            while self._done < need and not self._stopped:
                self._ran.wait()
        if self._stopped:
            raise _Stopped

    def close(self) -> None:
        """No more jobs: :meth:`run` returns once it has run those handed in."""
        if self._queue is not None:
            self._queue.put(None)

    def stop(self) -> None:
        """Drop the jobs not yet run; :meth:`put` and :meth:`wait` raise :class:`_Stopped`."""
        with self._ran:
            self._stopped = True
            self._ran.notify_all()

    def run(self) -> None:
        """Run the jobs handed in, in order, until :meth:`close`."""
        assert self._queue is not None
        while (job := self._queue.get()) is not None:
            if not self._stopped:
                job()
            with self._ran:
                self._done += 1
                self._ran.notify_all()


_T = TypeVar("_T")
_P = TypeVar("_P")


def _alongside(work: Callable[[_Jobs], _T]) -> _T:
    """``work`` run on a thread of its own, handing its jobs to this one, which runs them as they
    come: the kernel's calls, which release the GIL and take every core, stay on the thread that
    sees Ctrl-C (their watch stops them at once), while the Python around them (the next edges'
    classes and blocks, the sums of the edges priced) takes the core a call leaves idle
    (docs/performance.md)."""
    jobs = _Jobs(threaded=True)
    out: dict[str, Any] = {}

    def side() -> None:
        try:
            out["value"] = work(jobs)
        except _Stopped:
            pass  # this thread stopped: it raises its own error
        except BaseException as e:  # raised on the caller's thread, the jobs left dropped
            out["error"] = e
            jobs.stop()
        finally:
            jobs.close()

    thread = threading.Thread(target=side, name="taps-tables", daemon=True)
    thread.start()
    try:
        jobs.run()
    except BaseException:
        jobs.stop()
        raise
    finally:
        thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


#: With bounds, what the planes of a matrix of :class:`_Priced` hold per pair: its bound, 1.0
#: where that is not its exact cost, Algorithm 1's cost (NaN where the cheap bounds left it
#: out), and 1.0 where the bound is the cheap one (a kernel call of at least
#: :data:`CHEAP_PAIRS` pairs).
_PLANES = ("bound", "inexact", "paper", "cheap")

#: A bound call of at least this many pairs gives them cheap bounds (the full bound where a
#: pair can matter: :func:`_tighten`); a smaller one the full bound at once. The cheap bounds'
#: extra rounds cost the paper's smallest case (AlexNet on 8 devices, every call) more than the
#: full bounds did; on AlexNet 16's larger calls (up to 1,521 pairs) Algorithm 1's costs, which
#: only the full bounds need for every pair, cost more (142.5 M instructions against 150.7 M at
#: 2,048). AlexNet 64's calls have up to 8,649 pairs, GPT-3's layer's up to 37,947.
CHEAP_PAIRS = 1_024


class _Priced:
    """``redistribution_costs`` computed once per pair of layouts, in whatever order an edge lists
    them: the kernel prices each pair on its own, so the matrix of the sets in the order first
    asked for, read at the rows and columns of another order or of sets inside them (a
    :data:`_Term`: the edge's one pass, :func:`_gathered`, reads it), is the same matrix. Sets that
    share layouts with sets priced before (the linear layers of torchvision's Swin against two
    consumers of one input: 10% of its 4.3 million pairs) get that block from their matrix and
    the rest from the kernel. (The sets are keyed as frozensets and read back through a row and a
    column per layout: hashing the layouts is far cheaper than sorting them by their fields.)"""

    def __init__(self, bounds: bool = False, jobs: _Jobs | None = None) -> None:
        self._memo: dict[Any, _Matrix] = {}
        #: The keys of ``_memo`` by the shapes of their layouts and the bytes per element: only
        #: layouts of one tensor can be equal.
        self._near: dict[Any, list[Any]] = {}
        #: Lower bounds on the optimal planner's costs instead (``redistribution_table_bounds``,
        #: the planes of :data:`_PLANES`).
        self._bounds = bounds
        #: Where the matrices are filled: at once, or by the thread of :func:`_alongside` (the
        #: matrices returned are filled once :meth:`_Jobs.wait` for them returns).
        self.jobs = jobs if jobs is not None else _Jobs()

    def __call__(
        self,
        sources: Sequence[Layout],
        targets: Sequence[Layout],
        cluster: Cluster,
        dtype: float,
        cost_model: CostModel,
        planner: Planner,
        deadline: float | None,
    ) -> _Term:
        sources, targets = _as_side(sources), _as_side(targets)
        key = (sources.set, targets.set, dtype)
        if key not in self._memo:

            def kernel(s: Sequence[Layout], t: Sequence[Layout], out: list[np.ndarray]) -> None:
                if self._bounds:
                    cheap = len(s) * len(t) >= CHEAP_PAIRS
                    bound, exact, paper = redistribution_table_bounds(
                        s, t, cluster, dtype, cost_model, cheap=cheap
                    )
                    planes = [bound, ~exact, paper, ~exact if cheap else False]
                    for plane, priced in zip(out, planes, strict=True):
                        plane[...] = priced
                    return
                # The kernel watches the time left itself: one large edge can take longer; it
                # writes straight into ``out`` (no copy of its matrix).
                redistribution_costs(
                    s,
                    t,
                    cluster,
                    dtype,
                    cost_model,
                    planner,
                    time_limit=left(deadline),
                    out=out[0],
                )

            near = self._near.setdefault(
                (tuple(sources[0].shape), tuple(targets[0].shape), dtype), []
            )
            self._memo[key] = self._block(sources, targets, near, kernel)
            near.append(key)
        return self._read(key, sources, targets, 0)

    def reader(self, dtype: float, plane: int) -> Callable[[list[Layout], list[Layout]], _Term]:
        """With bounds, what reads plane ``plane`` (:data:`_PLANES`) of sets priced before."""

        def read(sources: list[Layout], targets: list[Layout]) -> _Term:
            s, t = _as_side(sources), _as_side(targets)
            return self._read((s.set, t.set, dtype), s, t, plane)

        return read

    def _read(self, key: Any, sources: _Side, targets: _Side, plane: int) -> _Term:
        planes, row, col = self._memo[key]
        return planes[plane], sources.positions(row), targets.positions(col)

    def _block(
        self,
        sources: _Side,
        targets: _Side,
        near: list[Any],
        kernel: Callable[[Sequence[Layout], Sequence[Layout], list[np.ndarray]], None],
    ) -> _Matrix:
        """The matrix of ``sources`` by ``targets``: the largest block of their pairs an earlier
        matrix of ``near`` holds read from it, the rest priced into the new matrix's blocks by
        ``kernel`` (the rows outside it against every target, then its rows against the targets
        outside it), each a job of :attr:`jobs`."""
        srcs, dsts = list(dict.fromkeys(sources)), list(dict.fromkeys(targets))
        # The first matrix sharing the most pairs; one that cannot share more than the best so
        # far (its sets' sizes bound its block) is not intersected.
        shared, earlier = 0, None
        for k in near:
            if min(len(k[0]), len(srcs)) * min(len(k[1]), len(dsts)) > shared:
                pairs = len(k[0] & sources.set) * len(k[1] & targets.set)
                if pairs > shared:
                    shared, earlier = pairs, k
        planes_count = len(_PLANES) if self._bounds else 1
        if earlier is None:
            # (Zeros, as the kernel's own matrices were: their pages are first touched by the
            # kernel's threads.)
            planes = [np.zeros((len(srcs), len(dsts))) for _ in range(planes_count)]
            self.jobs.put(lambda: kernel(srcs, dsts, planes), planes)
            return planes, _numbered(srcs), _numbered(dsts)
        old, old_row, old_col = self._memo[earlier]
        rows = [x for x in srcs if x in old_row]
        cols = [y for y in dsts if y in old_col]
        if len(rows) == len(srcs) and len(cols) == len(dsts):
            # Sets inside sets priced before: their matrix as it is.
            return self._memo[earlier]
        new_rows = [x for x in srcs if x not in old_row]
        new_cols = [y for y in dsts if y not in old_col]
        srcs, dsts = rows + new_rows, cols + new_cols
        planes = [_fresh(len(srcs), len(dsts)) for _ in old]
        shared_block = np.ix_([old_row[x] for x in rows], [old_col[y] for y in cols])

        def read_shared() -> None:
            for plane, before in zip(planes, old, strict=True):
                plane[: len(rows), : len(cols)] = before[shared_block]

        self.jobs.put(read_shared, [*planes, *old])
        if new_rows:
            below = [plane[len(rows) :] for plane in planes]
            self.jobs.put(lambda: kernel(new_rows, dsts, below), planes)
        if new_cols:
            right = [plane[: len(rows), len(cols) :] for plane in planes]
            self.jobs.put(lambda: kernel(rows, new_cols, right), planes)
        return planes, _numbered(srcs), _numbered(dsts)


def _numbered(layouts: list[Layout]) -> dict[Layout, int]:
    """Each of ``layouts`` (distinct) by its position."""
    return dict(zip(layouts, range(len(layouts))))


def _directions(
    price: Callable[[list[Layout], list[Layout]], _Term],
    src: Sequence[tuple[Layout, ...]],
    dst: Sequence[tuple[Layout, ...]],
    backward: bool,
) -> list[tuple[_Term, bool]]:
    """An edge's terms between its ends' layout classes, one per direction, each with whether it
    is read transposed: ``price`` from each source's layout to each target's, and in the
    training step the gradient's way back (transposed: a row per source class)."""
    out = [(price(_side(src, 0), _side(dst, 0)), False)]
    if backward:
        out.append((price(_side(dst, 1), _side(src, 1)), True))
    return out


#: Sums of this many bytes or more are written into pages of their own (:func:`_fresh`): the
#: allocator backs those of the core with huge pages, whose first touch cost jax_llama's edges
#: twice what the pages mapped in at once do (docs/performance.md).
_FRESH_BYTES = 1 << 22


def _gathered(terms: list[tuple[_Term, bool]]) -> np.ndarray:
    """The matrix of ``terms`` summed in order (:data:`_Term` s, each with whether it is read
    transposed): every entry gathered from the memo's matrices and summed in one pass
    (:func:`taps._core.gathered_sum`)."""
    (_, rows, cols), transposed = terms[0]
    shape = (len(cols), len(rows)) if transposed else (len(rows), len(cols))
    out = _fresh(*shape) if shape[0] * shape[1] * 8 >= _FRESH_BYTES else None
    return gathered_sum([(*term, back) for term, back in terms], out)


def _edge_costs(sums: list[list[tuple[_Term, bool]]], jobs: _Jobs) -> list[np.ndarray]:
    """Each edge's cost matrix between its ends' layout classes, from its directions' terms
    (:func:`_directions`) summed in order, the forward first (:func:`_gathered`), once every edge
    is handed to the memo (each once ``jobs``, the memo's, has filled its matrices): an edge whose
    first term reads a whole matrix of the memo in its own order, which no later edge reads, is
    summed into that matrix in place. Each entry is the same sum to the bit; jax_llama's edges
    would write 250 MB of new matrices, and first touching that memory was most of what their
    sums cost."""
    last = {id(term[0]): k for k, terms in enumerate(sums) for term, _ in terms}
    out = []
    for k, terms in enumerate(sums):
        jobs.wait([term[0] for term, _ in terms])
        (matrix, rows, cols), transposed = terms[0]
        if (
            not transposed
            and last[id(matrix)] == k
            and all(term[0] is not matrix for term, _ in terms[1:])
            and matrix.flags.c_contiguous
            and matrix.flags.writeable
            and _whole(rows, len(matrix))
            and _whole(cols, matrix.shape[1])
        ):
            rest = [(*term, back) for term, back in terms[1:]]
            out.append(gathered_sum(rest, matrix, add=True) if rest else matrix)
        else:
            out.append(_gathered(terms))
    return out


def _bound_parts(
    jobs: _Jobs,
    backward: bool,
    terms: list[tuple[_Term, bool]],
    planes: list[list[tuple[_Term, bool]]],
) -> tuple[list[np.ndarray], ...]:
    """Per direction, what a :class:`_Bound` holds past its cost matrix, read off the memo's
    planes once ``jobs`` has priced them: the bounds (``terms``), whether each is exact, and
    Algorithm 1's costs and the cheap flags (``planes``, :data:`_PLANES` 1 to 3); a direction
    the edge lacks (not ``backward``) is exact at 0."""
    jobs.wait([term[0] for term, _ in terms] + [t[0] for p in planes for t, _ in p])
    parts = [_gathered([d]) for d in terms]
    inexact, upper, cheap = ([_gathered([d]) for d in p] for p in planes)
    known = [m == 0 for m in inexact]
    flags = [m != 0 for m in cheap]
    if not backward:
        parts.append(np.zeros_like(parts[0]))
        known.append(np.ones(parts[0].shape, dtype=bool))
        upper.append(np.zeros_like(parts[0]))
        flags.append(np.zeros(parts[0].shape, dtype=bool))
    return parts, known, upper, flags


def _whole(positions: np.ndarray, n: int) -> bool:
    """Whether ``positions`` are 0, 1, ..., ``n - 1``: every row (or column) in its own order."""
    return len(positions) == n and bool((positions == np.arange(n)).all())


@dataclass
class _Bound:
    """An edge's cost matrix of lower bounds on the optimal planner's costs (its forward's plus,
    in the training step, its backward's), cheap at first, full where they can matter
    (:func:`_tighten`), made exact one direction of a class pair at a time (:func:`_refine`)."""

    cost: np.ndarray
    src: list[tuple[Layout, ...]]
    dst: list[tuple[Layout, ...]]
    backward: bool
    #: The bytes per element of the edge's tensor.
    dtype: float
    #: Per direction (forward, then backward: 0 and exact outside the training step), the cost
    #: or bound of each class pair, and whether it is exact: at first where the bound is (nothing
    #: to move, or Algorithm 1's cost where the search's bound exceeds it).
    parts: list[np.ndarray]
    exact: list[np.ndarray]
    #: Per direction, Algorithm 1's cost of each class pair (at least the optimal planner's); NaN
    #: where the cheap bounds did not need it, until an assignment takes it (:func:`_dearer`).
    upper: list[np.ndarray]
    #: Per direction, whether each class pair's bound is the cheap one (:func:`_tighten`).
    cheap: list[np.ndarray]

    def inexact(self, i: int, j: int) -> list[tuple[int, Layout, Layout]]:
        """The directions of class pair ``(i, j)`` still bounds, the forward first, each with
        its layouts (source, target)."""
        out = []
        if not self.exact[0][i, j]:
            out.append((0, self.src[i][0], self.dst[j][0]))
        if not self.exact[1][i, j]:
            out.append((1, self.dst[j][1], self.src[i][1]))
        return out

    def settle(
        self,
        direction: int,
        i: int | np.ndarray,
        j: int | np.ndarray,
        cost: float | np.ndarray,
        exact: bool | np.ndarray = True,
    ) -> None:
        """Direction ``direction`` of class pair ``(i, j)`` (or of pairs, arrays) costs ``cost``
        exactly (or, where not ``exact``, at least ``cost``: the full bound in place of the
        cheap one)."""
        self.parts[direction][i, j] = cost
        self.exact[direction][i, j] = exact
        self.cheap[direction][i, j] = False
        # Added as the full tables add them: the forward cost, then the backward.
        self.cost[i, j] = self.parts[0][i, j] + self.parts[1][i, j]

    def ends(self) -> list[tuple[_Side, _Side]]:
        """Per direction, the layouts of its sources (the rows of the forward, the columns of
        the backward: the targets' gradients) and of its targets."""
        ends = [(_side(self.src, 0), _side(self.dst, 0))]
        if self.backward:
            ends.append((_side(self.dst, 1), _side(self.src, 1)))
        return ends

    def dearer(self, i: int, j: int) -> float:
        """How much more than its bound class pair ``(i, j)`` costs at most: up to Algorithm 1's
        cost in a direction not exact."""
        return sum(
            0.0 if e[i, j] else float(u[i, j] - p[i, j])
            for p, e, u in zip(self.parts, self.exact, self.upper, strict=True)
        )


class _Places:
    """Where each directed layout pair lies in some bounds' matrices: every entry holding it,
    in each direction (worked out once per search: a priced pair settles them all,
    :func:`_settle`)."""

    def __init__(self, bounds: Iterable[_Bound]) -> None:
        #: Per source layout and bytes per element: each bound and direction holding it, the
        #: rows (or columns) holding it, and the direction's targets.
        self._at: dict[tuple[Layout, float], list[tuple[_Bound, int, list[int], _Side]]] = {}
        for b in bounds:
            for direction, (sources, targets) in enumerate(b.ends()):
                for layout, at in sources.where.items():
                    held = (b, direction, at, targets)
                    self._at.setdefault((layout, b.dtype), []).append(held)

    def of(self, s: Layout, t: Layout, dtype: float) -> Iterator[tuple[_Bound, int, int, int]]:
        """Every entry of directed pair ``s -> t`` of ``dtype`` bytes per element: its bound,
        direction, row and column (a few: scalars, not arrays, are the cheaper)."""
        for b, direction, at, targets in self._at.get((s, dtype), ()):
            other = targets.where.get(t)
            if other is None:
                continue
            rows, cols = (at, other) if direction == 0 else (other, at)
            for i in rows:
                for j in cols:
                    yield b, direction, i, j


#: The optimal search's rounds price one more directed pair per this many entries of the edges'
#: tables (:func:`_refine`'s ``spare``), if that comes to :data:`MIN_SPARE` or more (tables of at
#: least 640,000 entries: a model family, not the paper's cases, whose rounds are as before): on
#: Gemma 2's 6.5 million entries a round's solve and its spare pairs' min-marginals take about
#: 0.7 s, as long as pricing some 1,500 pairs, and about 2,600 spare pairs a round took the
#: fewest CPU seconds (docs/performance.md).
ENTRIES_PER_SPARE_PAIR = 2_500
MIN_SPARE = 256

#: Lazy bounds: the tables start from cheap bounds, and a round whose assignment took one gives
#: the full bound to the pairs whose min-marginal is within this part of the tables' optimum
#: above it (and under the upper bound): those the next solves would pick (:func:`_tighten`).
#: GPT-3's layer on 1,024 devices: 133 of 192,421 pairs, and the same 12 rounds as on full
#: bounds (docs/performance.md).
LAZY_BAND = 0.01

#: The most directed class pairs one round gives the full bound (:func:`_tighten`), those of least
#: min-marginal first. Where compute dominates the step, the band holds nearly every pair: timm's
#: Swin on 8 x 8 put 17.5 million in one round's call, whose lists and memos ran 24 GB out.
#: Gemma 2's rounds give at most 48,015.
TIGHTEN_PAIRS = 1 << 16

#: The layouts the search of a pair the rounds price for the first time may expand: past them,
#: the least estimate the search left bounds the pair, and the next round searches it to the
#: end only if its assignment picks the pair again. Of AlexNet 64's 173 pairs priced, 160 were
#: dropped once priced, their searches most of the pricing; a bound nearer their cost drops
#: most of them too. Searches that stop short and then run in full took the fewest
#: instructions there at 512 (docs/performance.md: 128 to 2,048 measured, and stopping at 256,
#: then 4x as many each time).
FIRST_EXPANSIONS = 512

#: A class pair of a :class:`_Bound`: the bound and the pair's source and target classes.
_ClassPair = tuple[_Bound, int, int]


#: What prices the pairs a round picks: per directed layout pair and bytes per element, its cost
#: and True, or a lower bound on it and False where its search stopped short (the first time a
#: pair is priced: :data:`FIRST_EXPANSIONS`).
_Estimate = Callable[[list[Layout], list[Layout], list[float]], tuple[np.ndarray, np.ndarray]]


def _refine(
    chosen: list[tuple[_Bound, set[tuple[int, int]]]],
    price: _Estimate,
    spare: int = 0,
    nearest: Callable[[], list[_ClassPair]] | None = None,
    places: _Places | None = None,
) -> bool:
    """Price the chosen class pairs not yet exact by one call of ``price`` (one watched call of
    the optimal planner per round, not one per edge and direction); True if there was one.
    Without ``spare``, the next direction of each (the forward first, the backward once the
    assignment picks the pair again: most pairs priced are dropped after their first
    direction). With ``spare``, both directions (the assignment is then priced exactly, but for
    searches stopped short); then, by a second call, the next direction of each class pair
    ``nearest`` gives once those are priced (at most ``spare``, each still a bound): where a
    solve costs more than pricing many pairs, the pairs the next rounds would pick are priced in
    this one. A pair priced settles every entry of it in ``places`` too (:func:`_settle`; the
    chosen bounds' if None)."""
    todo = [
        (b, i, j, *step)
        for b, pairs in chosen
        for i, j in sorted(pairs)
        for step in b.inexact(i, j)[: 2 if spare else 1]
    ]
    if not todo:
        return False
    if places is None:
        places = _Places(b for b, _ in chosen)
    _settle(todo, price, places)
    if nearest is not None:
        more = [(b, i, j, *b.inexact(i, j)[0]) for b, i, j in nearest()[:spare]]
        if more:
            _settle(more, price, places)
    return True


def _least(
    problem: Problem,
    edges: list[EdgeTable],
    choice: Mapping[str, int],
    tied: Sequence[Sequence[Sequence[str]]] = (),
    products: Products | None = None,
) -> dict[int, np.ndarray]:
    """Per distinct cost matrix of the ``edges`` (by id), the min-marginal of each class pair:
    the least cost of an assignment taking it, on the tables as they are. ``problem`` is the
    tables' (:meth:`CostTables.problem`) on the ``edges``. The min-marginals are those of the
    tied repeats (``tied``) taking one set of choices, as the solve takes them, with the
    operators the reductions leave to the solver at their candidate of ``choice``
    (:func:`taps.solve.reductions.pair_min_marginals` needs a problem the reductions take
    whole). The two reductions take their min-plus products by ``products`` (a fresh memo if
    None), which then keeps theirs for the next round
    (:meth:`taps.solve.reductions.Products.next_round`)."""
    if products is None:
        products = Products()
    ties = Ties.of(list(problem.node_cost), tied) if tied else None
    folded = ties.fold([problem])[0] if ties is not None else problem
    rep = ties.representative if ties is not None else {v: v for v in problem.node_cost}
    order = list(folded.node_cost)
    # The problem with the solver's operators fixed is this one elsewhere: its reductions
    # take this one's eliminations of the same arrays (``first`` alive meanwhile).
    memo: Memo = {}
    first = reduce([folded], order, products=products, memo=memo)
    core = first.cores[0]
    solver = {v: choice[v] for p in core.pairs for v in (p.u, p.w)}
    passed = pair_min_marginals(folded.fixed(solver), order, products, memo)
    products.next_round()  # before the pairs are priced (in place)
    if passed is None:
        return {}
    nodes, marginals = passed
    # A folded pair cost keeps the class arrays of the edges it stands for (Ties.fold).
    index = {(p.u, p.w, id(p.u_class), id(p.w_class)): k for k, p in enumerate(folded.pairs)}
    least: dict[int, np.ndarray] = {}
    for e in edges:
        u, w = rep[e.edge.producer], rep[e.edge.consumer]
        if u == w:
            # Both ends are one operator's candidate: its min-marginal at their classes.
            m = np.full(e.cost.shape, np.inf)
            own = np.array([solver[u]]) if u in solver else np.arange(len(folded.node_cost[u]))
            np.minimum.at(m, (e.source_class[own], e.target_class[own]), nodes[u])
        else:
            m = marginals[index[(u, w, id(e.source_class), id(e.target_class))]]
        k = id(e.cost)
        least[k] = m if k not in least else np.minimum(least[k], m)
    return least


def _least_first(values: np.ndarray, count: int) -> np.ndarray:
    """The positions of the ``count`` least of ``values`` (at least 1, at most their number),
    least first, ties by position: a partition to the cut (linear: there can be millions), then
    a sort of those at most at it."""
    cut = np.partition(values, count - 1)[count - 1]
    under = np.flatnonzero(values <= cut)
    return under[np.lexsort((under, values[under]))][:count]


def _nearest(
    least: Mapping[int, np.ndarray], bounds: Mapping[int, _Bound], upper: float, count: int
) -> list[_ClassPair]:
    """The ``count`` class pairs still bounds (in a direction) of least min-marginal (``least``,
    :func:`_least`) under ``upper`` (the cost of an assignment priced exactly: a pair whose
    least completion costs more is in no optimum), least first, ties in the edges' order and by
    row: the pairs of the cheapest assignments on the tables as they are, which the next rounds
    would pick."""
    keys = list(least)
    if not keys or count == 0:
        return []
    starts = np.cumsum([0] + [least[k].size for k in keys])
    # The pairs still bounds under ``upper``: their min-marginals and their places among the
    # edges' entries in turn (the rest, inf, left out of the passes below).
    kept = [(~(bounds[k].exact[0] & bounds[k].exact[1]) & (least[k] < upper)).ravel() for k in keys]
    value = np.concatenate([least[k].ravel()[m] for k, m in zip(keys, kept, strict=True)])
    place = np.concatenate([np.flatnonzero(m) + s for m, s in zip(kept, starts[:-1], strict=True)])
    count = min(count, len(value))
    if count == 0:
        return []
    picked = place[_least_first(value, count)]
    out = []
    for x in picked.tolist():
        n = int(np.searchsorted(starts, x, side="right")) - 1
        b = bounds[keys[n]]
        i, j = divmod(x - int(starts[n]), b.cost.shape[1])
        out.append((b, i, j))
    return out


def _tighten(
    least: Mapping[int, np.ndarray],
    bounds: Mapping[int, _Bound],
    upper: float,
    price: _Estimate,
) -> None:
    """The full bound, by one call of ``price`` (per directed layout pair and bytes per element,
    its bound and whether that is its exact cost), in place of the cheap one of every direction
    of a class pair whose min-marginal (``least``, :func:`_least`) is under ``upper`` (the cost
    of some assignment at most): those that can be in an optimum, so that the next solves do
    not pick them for a bound far below their cost; at most :data:`TIGHTEN_PAIRS` of them, least
    min-marginal first (ties in the order of ``least``, the forward first, then by row). Which
    pairs get it changes no result, only how many rounds there are."""
    found = []
    for k, m in least.items():
        b = bounds[k]
        under = m < upper
        for direction in (0, 1):
            rows, cols = np.nonzero(under & b.cheap[direction])
            if len(rows):
                found.append((b, direction, rows, cols, m[rows, cols]))
    if not found:
        return
    values = np.concatenate([f[4] for f in found])
    if len(values) > TIGHTEN_PAIRS:
        kept = np.zeros(len(values), dtype=bool)
        kept[_least_first(values, TIGHTEN_PAIRS)] = True
    else:
        kept = np.ones(len(values), dtype=bool)
    todo, start = [], 0
    for b, direction, rows, cols, _ in found:
        keep = kept[start : start + len(rows)]
        start += len(rows)
        if not keep.any():
            continue
        rows, cols = rows[keep], cols[keep]
        ends = zip(rows.tolist(), cols.tolist(), strict=True)
        if direction == 0:
            pairs = [(b.src[i][0], b.dst[j][0]) for i, j in ends]
        else:
            pairs = [(b.dst[j][1], b.src[i][1]) for i, j in ends]
        todo.append((b, direction, rows, cols, pairs))
    index: dict[tuple[Layout, Layout, float], int] = {}
    at = [np.array([_at(index, s, t, b.dtype) for s, t in pairs]) for b, _, _, _, pairs in todo]
    bound, exact = _priced(index, price)
    for (b, direction, rows, cols, _), where in zip(todo, at, strict=True):
        b.settle(direction, rows, cols, bound[where], exact[where])


def _settle(
    todo: list[tuple[_Bound, int, int, int, Layout, Layout]], price: _Estimate, places: _Places
) -> None:
    """Price every direction of ``todo`` by one call of ``price``: its cost, or a bound no lower
    than the one it had where the search stopped short; and so every other entry of the same
    pair in ``places`` (other edges, and class pairs of one edge that differ in the other
    direction): else a later solve picks it at its old bound, and a round goes on pricing it
    again (AlexNet 64: 14 of 174 pairs)."""
    index: dict[tuple[Layout, Layout, float], int] = {}
    for b, _, _, _, s, t in todo:
        _at(index, s, t, b.dtype)
    costs, exact = _priced(index, price)
    for (s, t, dtype), k in index.items():
        cost, known = float(costs[k]), bool(exact[k])
        for b, direction, i, j in places.of(s, t, dtype):
            # An exact entry stays; a bound only rises.
            if not b.exact[direction][i, j]:
                was = float(b.parts[direction][i, j])
                b.settle(direction, i, j, cost if known else max(was, cost), known)


def _at(index: dict[tuple[Layout, Layout, float], int], s: Layout, t: Layout, dtype: float) -> int:
    """The position of directed pair ``s -> t`` of ``dtype`` bytes per element in ``index``,
    added if new: each distinct pair is priced once (edges of one tensor meet the same pairs)."""
    return index.setdefault((s, t, dtype), len(index))


def _priced(index: dict[tuple[Layout, Layout, float], int], price: Callable[..., _P]) -> _P:
    """``price`` of the pairs of ``index`` (:func:`_at`), in its order, by one call."""
    keys = list(index)
    return price([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys])


def _reductions(
    graph: Graph,
    op: Operator,
    arrays: tuple[np.ndarray, np.ndarray, list[list[int]]],
    step: Any,
    flowing: bool,
    cluster: Cluster,
    cost_model: CostModel,
    parameters: bool,
    gradient_bytes: int | None,
) -> np.ndarray:
    """Per candidate, the all_reduces of :func:`taps.search.prices.reduced_operands`: of
    parameters' gradients (``parameters``, in ``gradient_bytes`` per element) or of the rest;
    ``arrays`` are the candidates' :func:`taps.plan.candidates.strategy_arrays`."""
    degrees, maps, matrices = arrays
    operands = all_reduce_operands(graph, op, step, flowing, gradient_bytes, parameters)
    costs = allreduce_costs(degrees, maps, operands, cluster, cost_model, matrices)
    kept = sorted(
        {
            op.partitionable.index(a)
            for r in reduced_operands(graph, op, step, flowing)
            if is_parameter_gradient(graph, r) == parameters
            for a in r[2]
        }
    )
    if kept:
        # Addends' gradients keep some axes apart, as leading dims of their degree: the
        # candidates of one degree on every such axis are priced together. The kernel sums
        # each candidate's operands from 0 in order, as a loop over them would.
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, key in enumerate(map(tuple, degrees[:, kept].tolist())):
            groups.setdefault(key, []).append(i)
        apart = np.zeros(len(degrees))
        for rows in groups.values():
            tensors = apart_operands(
                graph, op, degrees[rows[0]].tolist(), step, flowing, gradient_bytes, parameters
            )
            apart[rows] = allreduce_costs(
                degrees[rows], maps[rows], tensors, cluster, cost_model, [matrices[i] for i in rows]
            )
        costs += apart
    return costs


def _stores(graph: Graph, op: Operator, candidate: Candidate, step: Any, flowing: bool) -> bool:
    """Whether ``candidate`` reduces a parameter's gradient over some devices: its parameters
    can then be stored sharded over them (FSDP)."""
    return any(c.parameter for c in intra_collectives(graph, op, candidate, step, flowing))


def build_tables(
    graph: Graph,
    cluster: Cluster,
    pricing: Pricing = Pricing(),
    share: bool = True,
    replicas: bool = False,
    deadline: float | None = None,
    bounded: bool = False,
) -> CostTables:
    """Enumerate candidates and compute node costs, memory and edge costs for the search.

    ``pricing.step`` says what is priced (docs/search.md): ``"training"`` (partial sums flowing to
    the consumer, every edge's backward redistribution, the gradients of parameters and inputs at
    their operators) or ``"forward"`` (the paper's model); ``pricing.planner`` plans the edges;
    ``pricing.zero`` shards parameters' gradients and optimizer state (ZeRO). With
    ``pricing.counts_compute`` a node cost is the step time the operator adds: its forward and
    backward compute (:mod:`taps.search.compute`), its collectives, and its parameters' gradient
    reductions overlapping its backward (:func:`taps.search.compute.overlapped_backward`).
    With ``pricing.fsdp``, every candidate of an operator it allows whose strategy reduces a
    parameter's gradient over some devices has a twin storing the parameters sharded over them
    (FSDP, :func:`taps.search.prices.sharded_storage`): its gathers priced whole, its
    reduce_scatter overlapping the backward as above, and less memory
    (:func:`taps.search.prices.memory`).

    Operators of one signature (:meth:`Graph.signature`: the repeated layers of a model) share one
    candidate list, node cost and memory vector, and edges between operators of the same two
    signatures share one cost matrix, so the tables cost what the distinct operators do, whatever
    the depth. ``share=False`` computes every operator and edge on its own (for the benchmark).
    ``replicas`` also enumerates the strategies over fewer devices
    (:func:`taps.plan.candidates.strategies`). ``deadline`` (a ``time.perf_counter()`` value) is
    checked before every distinct operator and edge is priced: past it,
    :class:`taps.errors.TimeLimitError`.

    ``bounded`` (the optimal planner under the topology model) prices every edge first at a
    lower bound on its cost (Algorithm 1's, or the search's bound at the source if less, with no
    search): :attr:`CostTables.refine` then makes the pairs an assignment uses exact, a
    direction a round (on large tables both, and spare pairs: :func:`_refine`;
    :func:`taps.search.searching.search` solves until its assignment's pairs are all exact,
    docs/search.md)."""
    cost_model, step, planner = pricing.cost_model, pricing.step, pricing.planner
    bounded = bounded and planner == "optimal" and cost_model == "topology"
    n = cluster.num_devices
    grads = pricing.gradient_bytes
    device = roofline_of(cluster) if pricing.counts_compute else None
    timings = {"enumerate": 0.0, "costs": 0.0}
    flows = partial_flows(graph, step)
    training = step == "training"
    checkpointed = checkpointing(graph, pricing.checkpoint)
    kept, again = checkpointed.kept, checkpointed.recomputed
    copies = copies_of(graph)

    def key_of(op: Operator) -> Any:
        if not share:
            return op.name
        # Checkpointing keeps another share of some outputs and runs some forwards again; sharded
        # storage's gathered weights are spread over the operator's copies.
        shards = pricing.shards(op.name) and copies[op.name]
        if not training:
            return (graph.signature(op.name), kept[op.name], again[op.name], shards)
        # The training step also depends on whether the output's partial sums flow and on which
        # inputs have a producer (their gradients go back on the edge).
        made = tuple(graph.root(o.tensor).producer is not None for o in op.inputs)
        return (
            graph.signature(op.name),
            kept[op.name],
            again[op.name],
            shards,
            op.name in flows,
            made,
        )

    signature = {op.name: key_of(op) for op in graph.ops}
    enumerated: dict[Any, Any] = {}  # the strategies and operand layouts of candidates()
    distinct: dict[Any, OpTable] = {}
    #: Per distinct operator, its candidates' degrees and device maps: where their partial
    #: outputs and gradients hold partial sums.
    splits: dict[Any, tuple[np.ndarray, np.ndarray]] = {}
    ops: dict[str, OpTable] = {}
    for op in graph.ops:
        key = signature[op.name]
        if key not in distinct:
            check(deadline, f"pricing the candidates of operator {op.name!r}")
            t0 = time.perf_counter()
            cands = candidates(op, n, replicas, enumerated)
            t1 = time.perf_counter()
            flowing = op.name in flows
            arrays = strategy_arrays(cands)
            degrees, maps = arrays[0], arrays[1]
            # Parameters' gradient reductions (param) apart from the rest (other): with compute
            # counted they overlap the backward.
            at = (graph, op, arrays, step, flowing, cluster, cost_model)
            other = _reductions(*at, False, grads)
            param = _reductions(*at, True, grads)
            fwd = bwd = np.zeros(len(cands))
            if device is None:
                node = other + param
            else:
                fwd, bwd = compute_times(graph, op, degrees, *device)
                fwd = fwd * (1 + again[op.name])  # a checkpointed layer runs its forward again
                node = other + fwd + overlapped_backward(bwd, param)
            mem = memories(graph, op, degrees, pricing, kept[op.name])
            sharded = np.zeros(len(cands), dtype=bool)
            twins = (
                [i for i, c in enumerate(cands) if _stores(graph, op, c, step, flowing)]
                if pricing.shards(op.name)
                else []
            )
            if twins:
                # The all_reduce of a weight is its two gathers (each half an all_reduce), the
                # gradient's is a reduce_scatter and half its all_reduce. The gathers are priced
                # whole: how much of them the prefetch hides depends on the operator before
                # (the timeline's), so sharding is chosen where memory needs it.
                gathers = _reductions(*at, True, pricing.parameter_bytes)[twins]
                scatter = param[twins] / 2
                if device is None:
                    twin_node = other[twins] + gathers + scatter
                else:
                    twin_node = (
                        other[twins]
                        + fwd[twins]
                        + gathers
                        + overlapped_backward(bwd[twins], scatter)
                    )
                twin_mem = memories(
                    graph, op, degrees[twins], pricing, kept[op.name], True, copies[op.name]
                )
                cands = cands + [cands[i] for i in twins]
                node = np.concatenate([node, twin_node])
                mem = np.concatenate([mem, twin_mem])
                sharded = np.concatenate([sharded, np.ones(len(twins), dtype=bool)])
                every = [*range(len(degrees)), *twins]  # the twins' strategies are their own
                degrees, maps = degrees[every], maps[every]
            distinct[key] = OpTable(op, cands, node, mem, sharded)
            splits[key] = (degrees, maps)
            timings["enumerate"] += t1 - t0
            timings["costs"] += time.perf_counter() - t1
        shared = distinct[key]
        ops[op.name] = shared if shared.op is op else replace(shared, op=op)
    t0 = time.perf_counter()

    def edge_tables(jobs: _Jobs) -> tuple[list[EdgeTable], dict[int, _Bound]]:
        cache: dict[Any, tuple[np.ndarray, np.ndarray, int]] = {}
        # Different operators can still give a tensor the same layout classes at both ends, and
        # one direction of an edge can be another edge's (the gradient of a softmax's input is
        # priced from the classes its output is priced to): each distinct matrix's terms, summed
        # once all are handed to the memo (_edge_costs).
        by_layouts: dict[Any, int] = {}
        sums: list[list[tuple[_Term, bool]]] = []
        priced = _Priced(bounded, jobs)
        #: With bounds, per distinct matrix what the rest of its _Bound is read from
        #: (_bound_parts).
        partly: list[tuple[Any, ...]] = []
        ends: dict[Any, tuple[np.ndarray, list[tuple[Layout, ...]]]] = {}
        keys: list[Any] = []
        for edge in graph.edges:
            key = (signature[edge.producer], signature[edge.consumer], edge.slot)
            if key not in cache:
                check(deadline, f"pricing the redistributions of tensor {edge.tensor!r}")
                backward = training and graph.takes_gradient(graph.op(edge.consumer), edge.slot)
                flowing = edge.producer in flows
                # An end's classes serve every edge from (or into the same slot of) an operator of
                # its signature, whose candidates are the same list.
                out = ("out", signature[edge.producer], flowing, backward)
                if out not in ends:
                    made = ops[edge.producer].candidates
                    outputs = [c.output for c in made]
                    ends[out] = _classes(
                        outputs,
                        outputs if backward else None,
                        partial_dims(
                            made[0].op, *splits[signature[edge.producer]], made[0].op.contracted
                        )
                        if flowing
                        else None,
                    )
                into = ("in", signature[edge.consumer], edge.slot, backward)
                if into not in ends:
                    taken = ops[edge.consumer].candidates
                    inputs = [c.inputs[edge.slot] for c in taken]
                    ends[into] = _classes(
                        inputs,
                        inputs if backward else None,
                        None,
                        partial_dims(
                            taken[0].op,
                            *splits[signature[edge.consumer]],
                            taken[0].op.input_gradient_axes[edge.slot],
                        )
                        if backward
                        else None,
                    )
                (src_cls, src), (dst_cls, dst) = ends[out], ends[into]
                dtype = graph.tensors[edge.tensor].dtype_bytes
                layouts = (tuple(src), tuple(dst), dtype)
                if layouts not in by_layouts:
                    how = (cluster, dtype, cost_model, planner, deadline)

                    def costs(s: list[Layout], t: list[Layout], how: tuple = how) -> _Term:
                        return priced(s, t, *how)

                    by_layouts[layouts] = len(sums)
                    sums.append(_directions(costs, src, dst, backward))
                    if bounded:
                        # The other planes' terms, read once the memo has priced them.
                        planes = [
                            _directions(priced.reader(dtype, k), src, dst, backward)
                            for k in (1, 2, 3)
                        ]
                        partly.append((src, dst, backward, dtype, sums[-1], planes))
                cache[key] = (src_cls, dst_cls, by_layouts[layouts])
            keys.append(key)
        # Copies, read before _edge_costs may sum into the memo's matrices.
        rests = [
            (src, dst, backward, dtype, *_bound_parts(jobs, backward, terms, planes))
            for src, dst, backward, dtype, terms, planes in partly
        ]
        summed = _edge_costs(sums, jobs)
        edges = [
            EdgeTable(edge, *cache[key][:2], summed[cache[key][2]])
            for edge, key in zip(graph.edges, keys, strict=True)
        ]
        bounds = (
            {id(cost): _Bound(cost, *rest) for cost, rest in zip(summed, rests, strict=True)}
            if bounded
            else {}
        )
        return edges, bounds

    edges, bounds = _alongside(edge_tables)
    timings["costs"] += time.perf_counter() - t0

    # A round's solve takes time in proportion to the edges' entries (reduced afresh), a pair's
    # pricing about the same whatever the tables: where a solve costs many pairs, each round
    # prices more (_refine's spare; a count, not a time, so that the same input gives the same
    # pairs and plan).
    spare = sum(e.cost.size for e in edges) // ENTRIES_PER_SPARE_PAIR
    spare = spare if spare >= MIN_SPARE else 0
    best = np.inf  # the least cost of an assignment the rounds priced exactly
    places = _Places(bounds.values())  # the bounds' entries by pair

    def refine(choice: Mapping[str, int], products: Products | None = None) -> bool:
        pairs: dict[int, set[tuple[int, int]]] = {}
        for e in edges:
            i = int(e.source_class[choice[e.edge.producer]])
            j = int(e.target_class[choice[e.edge.consumer]])
            pairs.setdefault(id(e.cost), set()).add((i, j))
        # Every edge's pairs priced at once: one call (two with spare) and one solve per round.
        chosen = [(bounds[k], p) for k, p in pairs.items()]
        # A cheap bound chosen misled the solve: the pairs near it get their full bounds.
        misled = any(b.cheap[d][i, j] for b, p in chosen for i, j in p for d in (0, 1))

        def nearest() -> list[_ClassPair]:
            # (Once the assignment's pairs are priced: first the full bounds near a cheap one.)
            nonlocal best
            if not spare and not misled:
                return []
            problem = _problem(ops, edges)
            # At most what the assignment costs: exact where priced, else Algorithm 1's.
            best = min(best, problem.evaluate(choice) + _dearer(edges, bounds, choice, paper))
            least = _least(problem, edges, choice, graph.tied, products)
            if misled and least:
                # The pairs within a band above the tables' optimum: those the next solves
                # would pick; the band climbs with the optimum round by round.
                floor = min(float(m.min()) for m in least.values())
                _tighten(least, bounds, min(best, floor + LAZY_BAND * abs(floor)), tight)
            return _nearest(least, bounds, best, spare)

        return _refine(chosen, estimated, spare, nearest, places)

    def paper(s: list[Layout], t: list[Layout], dtypes: list[float]) -> np.ndarray:
        return redistribution_pair_costs(
            s, t, dtypes, cluster, cost_model, "paper", time_limit=left(deadline)
        )

    def tight(
        s: list[Layout], t: list[Layout], dtypes: list[float]
    ) -> tuple[np.ndarray, np.ndarray]:
        return redistribution_pair_bounds(
            s, t, dtypes, cluster, cost_model, time_limit=left(deadline)
        )

    # A pair's first search stops after FIRST_EXPANSIONS layouts, a pair priced again is
    # searched to the end (the pairs of this search, each with its bytes per element).
    searched: set[tuple[Layout, Layout, float]] = set()

    def estimated(
        s: list[Layout], t: list[Layout], dtypes: list[float]
    ) -> tuple[np.ndarray, np.ndarray]:
        pairs = list(zip(s, t, dtypes, strict=True))
        expansions = [None if p in searched else FIRST_EXPANSIONS for p in pairs]
        searched.update(pairs)
        return redistribution_pair_estimates(
            s, t, dtypes, expansions, cluster, cost_model, time_limit=left(deadline)
        )

    return CostTables(graph, cluster, pricing, ops, edges, timings, refine if bounded else None)
