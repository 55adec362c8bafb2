"""Type stubs of the Rust extension ``taps._core`` (see docs/core.md and docs/conventions.md)."""

from collections.abc import Callable, Sequence
from typing import Final, Literal, TypeAlias, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "COLLECTIVE_KINDS",
    "COST_MODELS",
    "DEVICES",
    "PLANNERS",
    "PRESETS",
    "REPLICA_MODELS",
    "Cluster",
    "CommOp",
    "Device",
    "GraphError",
    "InfeasibleError",
    "Layout",
    "LayoutError",
    "Redistribution",
    "ResourceError",
    "Strategy",
    "StrategyError",
    "TapsError",
    "TimeLimitError",
    "TopologyError",
    "UnifyError",
    "allreduce_costs",
    "enumerate_strategies",
    "first_equal",
    "frontier_sum",
    "gathered_sum",
    "inter_node_groups",
    "layout_classes",
    "least_bottleneck",
    "least_cuts",
    "min_plus",
    "min_plus_one",
    "plan_redistribution",
    "redistribution_bounds",
    "redistribution_costs",
    "redistribution_pair_bounds",
    "redistribution_pair_costs",
    "redistribution_pair_estimates",
    "redistribution_table_bounds",
    "strategy_arrays",
    "tensor_layouts",
    "unify",
]

# The names the core accepts; any other string raises TopologyError (LayoutError for a planner)
# at run time.
_CollectiveKind: TypeAlias = Literal[
    "all_reduce", "all_gather", "all_to_all", "reduce_scatter", "collective_permute"
]
_CostModel: TypeAlias = Literal["topology", "volume"]
_Planner: TypeAlias = Literal["optimal", "paper"]
_Replicas: TypeAlias = Literal["shared", "flat"]
_DeviceKind: TypeAlias = Literal["v100", "a100", "h100", "h200", "b200", "tpu-v5p"]
_Preset: TypeAlias = Literal["dgx-v100", "dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "tpu-v5p"]
_OpKind: TypeAlias = Literal[
    "slice", "all_gather", "all_to_all", "reduce_scatter", "all_reduce", "collective_permute"
]

COLLECTIVE_KINDS: Final[tuple[_CollectiveKind, ...]]
"""The collective names the cost functions accept, from the core's enum (the one list of them)."""
COST_MODELS: Final[tuple[_CostModel, ...]]
"""The cost model names the cost functions accept, from the core's enum (the one list of them)."""
PLANNERS: Final[tuple[_Planner, ...]]
"""The redistribution planner names, from the core's enum (the one list of them)."""
REPLICA_MODELS: Final[tuple[_Replicas, ...]]
"""The replica model names a cluster accepts, from the core's enum (the one list of them)."""
DEVICES: Final[tuple[_DeviceKind, ...]]
"""The device kinds a cluster may be made of, from the core's table (the one list of them)."""
PRESETS: Final[tuple[_Preset, ...]]
"""The built-in clusters `Cluster.preset` takes, one per device kind (the one list of them)."""

class TapsError(ValueError):
    """Base class of every error taps raises."""

class LayoutError(TapsError):
    """A malformed layout or two layouts of different tensors."""

class UnifyError(LayoutError):
    """Two layouts that no rewrite can bring to one device matrix and shape."""

class StrategyError(TapsError):
    """Bad input to strategy enumeration."""

class TopologyError(TapsError):
    """A bad cluster, collective or cost model."""

class GraphError(TapsError):
    """A malformed operator graph."""

class InfeasibleError(TapsError):
    """A search with no feasible assignment, such as a memory limit nothing meets."""

class ResourceError(TapsError):
    """A search too large for its limits or for the memory it may use."""

class TimeLimitError(TapsError):
    """A search whose time limit ran out before it had any assignment to return (while its cost
    tables were built, or with no assignment that fits the memory limit)."""

@final
class Layout:
    """How a tensor is spread over the devices: its shape, the device matrix (outermost dim first,
    device dim 0 innermost), the tensor map (per tensor dim, the device dim it is split along, or
    -1) and the device dims `partial` along which the devices hold partial sums rather than copies.
    See docs/conventions.md#layouts. Immutable, hashable, picklable."""

    def __new__(
        cls,
        shape: Sequence[int],
        device_matrix: Sequence[int],
        tensor_map: Sequence[int],
        partial: Sequence[int] = ...,  # () at run time: no partial sums
    ) -> Layout: ...
    @property
    def shape(self) -> list[int]:
        """The global shape of the tensor."""
    @property
    def device_matrix(self) -> list[int]:
        """The device matrix, outermost dim first: the last entry is device dim 0."""
    @property
    def tensor_map(self) -> list[int]:
        """Per tensor dim, the device dim it is split along (0 innermost), or -1 if it is whole."""
    @property
    def partial(self) -> list[int]:
        """The device dims along which the devices hold partial sums (ascending): the devices that
        differ only there hold addends whose sum is the tensor."""
    @property
    def shard_shape(self) -> list[int]:
        """The shape of the block each device holds."""
    @property
    def num_devices(self) -> int:
        """The number of devices: the product of the device matrix."""
    def shard_index(self, rank: int) -> list[tuple[int, int]]:
        """Per tensor dim, the half-open `(start, stop)` range that `rank` holds."""
    def device_dim_size(self, k: int) -> int:
        """`d_k`, the size of device dim `k` (0 innermost)."""
    def normalized(self) -> Layout:
        """The canonical form, a reshape that moves nothing: two layouts of one tensor hold the
        same elements (and partial sums) on every rank iff their normal forms are equal."""
    def compacted(self) -> Layout:
        """The same tensor dims (size-1 dims dropped) with the device matrix cut only where a
        split or a partial dim needs it: layouts with equal compacted forms hold the same elements
        and get the same plans from Algorithm 1, so the search prices one of them for all."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(
        self,
    ) -> tuple[type[Layout], tuple[list[int], list[int], list[int], list[int]]]: ...

@final
class Device:
    """A kind of device, by name (one of `DEVICES`): its dense fp16/bf16 matrix-multiply peak in
    FLOP/s, memory bandwidth in bytes per second and memory in bytes, from its datasheet.
    Immutable, picklable."""

    def __new__(cls, name: _DeviceKind) -> Device: ...
    @property
    def name(self) -> _DeviceKind:
        """The kind's name, as `DEVICES` spells it."""
    @property
    def peak_flops(self) -> float:
        """Dense fp16/bf16 matrix-multiply peak, FLOP per second."""
    @property
    def memory_bandwidth(self) -> float:
        """Memory bandwidth, bytes per second."""
    @property
    def memory(self) -> float:
        """Memory, bytes."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Device], tuple[_DeviceKind]]: ...

@final
class Cluster:
    """A homogeneous cluster of `nodes` nodes with `devices_per_node` devices each; a node holds
    consecutive ranks. Bandwidths in bytes per second, latencies in seconds per collective, memory
    in bytes per device; `replicas` says whether copies of a tensor share one transfer out of a
    node (`"shared"`, the paper's model) or send one each (`"flat"`, as NCCL and XLA: the
    default); `device` names the kind of device (one of `DEVICES`). A bandwidth or latency not
    given is the device's preset's (its node level, its outermost level); `device_memory` not
    given is the device's memory, `math.inf` no limit. More levels (nodes in pods):
    `Cluster.hierarchy`; named clusters: `Cluster.preset`. Immutable, picklable."""

    def __new__(
        cls,
        nodes: int,
        devices_per_node: int,
        intra_bandwidth: float | None = None,
        inter_bandwidth: float | None = None,
        device_memory: float | None = None,
        *,
        intra_latency: float | None = None,
        inter_latency: float | None = None,
        replicas: _Replicas = "flat",
        device: _DeviceKind = "v100",
    ) -> Cluster: ...
    @staticmethod
    def hierarchy(
        levels: Sequence[Sequence[float]],
        device_memory: float | None = None,
        replicas: _Replicas = "flat",
        device: _DeviceKind = "v100",
        *,
        nodes: int | None = None,
    ) -> Cluster:
        """A cluster of nested levels, innermost first, each `(parts, bandwidth, latency)`: the
        devices per node, then the nodes per pod, ..., then the outermost units. Bandwidths in
        bytes per second out of one part of the level below, latencies in seconds per collective.
        With `nodes`, the outermost level holds as many units as the nodes fill (its parts are not
        read; one level is one node), as presets and cluster files are read. `device` names the
        kind of device (one of `DEVICES`); `device_memory` defaults to its memory (`math.inf`: no
        limit)."""
    @classmethod
    def preset(cls, name: str, nodes: int = 1) -> Cluster:
        """The built-in cluster `name` (one of `PRESETS`) with `nodes` nodes, or the cluster of a
        TOML file (a name ending in `.toml`; docs/core.md)."""
    @property
    def levels(self) -> list[tuple[int, float, float]]:
        """The levels as `hierarchy` takes them: `(parts, bandwidth, latency)`, innermost first."""
    @property
    def replicas(self) -> _Replicas:
        """How copies of a tensor send it out of a node: `"shared"` (one transfer for all the
        copies, as the paper) or `"flat"` (one per copy, as NCCL)."""
    @property
    def device(self) -> Device:
        """The kind of device the cluster is made of."""
    @property
    def nodes(self) -> int:
        """The number of nodes."""
    @property
    def devices_per_node(self) -> int:
        """Devices per node."""
    @property
    def intra_bandwidth(self) -> float:
        """Bytes per second between two devices of one node."""
    @property
    def inter_bandwidth(self) -> float:
        """Bytes per second out of a node, shared by every group that crosses it at once."""
    @property
    def device_memory(self) -> float | None:
        """Bytes of memory per device (its kind's unless told otherwise), or None if unlimited."""
    @property
    def num_devices(self) -> int:
        """The number of devices: nodes times devices per node."""
    def collective_cost(
        self,
        layout: Layout,
        collective: _CollectiveKind,
        device_dim: int | None = None,
        dtype_bytes: float = 2.0,
        model: _CostModel = "topology",
    ) -> float:
        """Seconds (topology model) or bytes per device (volume model) of a collective of
        `layout`: an `"all_reduce"` over the device dims the map does not use (no `device_dim`),
        or any other kind of `COLLECTIVE_KINDS` along `device_dim` but `"collective_permute"`
        (priced by its pairs, as a plan's step: `CommOp.cost`)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(
        self,
    ) -> tuple[
        Callable[..., Cluster],
        tuple[list[tuple[int, float, float]], float, _Replicas, _DeviceKind],
    ]: ...

@final
class CommOp:
    """One step of a redistribution, with the layout it acts on: a slice, all_gather, all_to_all,
    reduce_scatter or all_reduce along one device dim, or a collective_permute of whole blocks.
    Immutable, hashable, picklable."""

    @property
    def kind(self) -> _OpKind:
        """`"slice"`, `"all_gather"`, `"all_to_all"`, `"reduce_scatter"`, `"all_reduce"` or
        `"collective_permute"`."""
    @property
    def device_dim(self) -> int:
        """The device dim the op runs along (0 innermost; for a collective_permute, the innermost
        device dim it moves)."""
    @property
    def tensor_dim(self) -> int | None:
        """The tensor dim sliced, gathered (for an all_to_all, the one gathered) or split by a
        reduce_scatter; None for an all_reduce or a collective_permute."""
    @property
    def to_tensor_dim(self) -> int | None:
        """For an all_to_all, the tensor dim that gets split; None otherwise."""
    @property
    def permutation(self) -> list[int] | None:
        """Collective-permute only: per device dim `k`, the device dim that takes over its
        splits."""
    @property
    def group_size(self) -> int:
        """The number of devices in each group: the size of the device dim (for a
        collective_permute, the product of the device dims it moves)."""
    @property
    def volume(self) -> int:
        """Elements received per device (per receiving device, for a collective_permute)."""
    @property
    def layout(self) -> Layout:
        """The layout before the op."""
    def inter_node_groups(self, devices_per_node: int) -> int:
        """`ct` of this op on nodes of `devices_per_node` devices (0 for a slice)."""
    def cost(
        self, cluster: Cluster, dtype_bytes: float = 2.0, model: _CostModel = "topology"
    ) -> float:
        """Seconds (topology model) or bytes per device (volume model) of the op."""
    @classmethod
    def _from_parts(
        cls,
        kind: _OpKind,
        device_dim: int,
        tensor_dim: int | None,
        to_tensor_dim: int | None,
        permutation: list[int] | None,
        layout: Layout,
    ) -> CommOp:
        """The op of these parts, checked (what unpickling calls)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(
        self,
    ) -> tuple[
        Callable[..., CommOp],
        tuple[_OpKind, int, int | None, int | None, list[int] | None, Layout],
    ]: ...

@final
class Redistribution:
    """A redistribution plan: the unified layouts and the ops between them, with the fallback
    gathers (prelude) and slices (epilogue) used when the two layouts do not unify as they are.
    Immutable, picklable."""

    @property
    def source(self) -> Layout:
        """The source layout rewritten to the common device matrix and shape."""
    @property
    def target(self) -> Layout:
        """The target layout rewritten to the common device matrix and shape."""
    @property
    def ops(self) -> list[CommOp]:
        """The ops from the unified source to the unified target."""
    @property
    def prelude(self) -> list[CommOp]:
        """The all_gathers on the original source of the splits that block unification."""
    @property
    def epilogue(self) -> list[CommOp]:
        """The free slices onto the original target of the splits that block unification."""
    @property
    def all_ops(self) -> list[CommOp]:
        """Every step in order: prelude, ops, epilogue."""
    @property
    def volume(self) -> int:
        """Elements received per device over the whole plan."""
    def cost(
        self, cluster: Cluster, dtype_bytes: float = 2.0, model: _CostModel = "topology"
    ) -> float:
        """Seconds (topology model) or bytes per device (volume model) of the whole plan."""
    @classmethod
    def _from_parts(
        cls,
        source: Layout,
        target: Layout,
        ops: list[CommOp],
        prelude: list[CommOp],
        epilogue: list[CommOp],
    ) -> Redistribution:
        """The plan of these parts (what unpickling calls; each op was checked by its own)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(
        self,
    ) -> tuple[
        Callable[..., Redistribution],
        tuple[Layout, Layout, list[CommOp], list[CommOp], list[CommOp]],
    ]: ...

@final
class Strategy:
    """A strategy of one operator: a power-of-two degree per partitionable axis, the device dim of
    each split axis (-1 where the degree is 1), and the device matrix, whose dims no axis uses
    replicate the operator (one dim per split axis if not given). Immutable, hashable, picklable."""

    def __new__(
        cls,
        degrees: Sequence[int],
        device_map: Sequence[int],
        device_matrix: Sequence[int] | None = None,
    ) -> Strategy: ...
    @property
    def degrees(self) -> list[int]:
        """Per axis, the number of blocks it is split into."""
    @property
    def device_map(self) -> list[int]:
        """Per axis, the device dim it is split along (0 innermost), or -1 for degree 1."""
    @property
    def device_matrix(self) -> list[int]:
        """The device matrix, outermost dim first: the split axes' dims and the replica dims."""
    @property
    def num_devices(self) -> int:
        """The number of devices: the product of the device matrix."""
    @property
    def replicas(self) -> int:
        """The number of copies of the operator: the product of the device dims no axis uses."""
    def tensor_layout(
        self, axes: Sequence[int], shape: Sequence[int], per_replica: bool = False
    ) -> Layout:
        """The layout of a tensor whose dims are the strategy's axes `axes` (-1: a whole dim); with
        `per_replica`, the replicas' copies stacked along leading dims, one per replica dim."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Strategy], tuple[list[int], list[int], list[int]]]: ...

def tensor_layouts(
    strategies: Sequence[Strategy], axes: Sequence[int], shape: Sequence[int]
) -> list[Layout]:
    """:meth:`Strategy.tensor_layout` ``(axes, shape)`` of every strategy of ``strategies``, in
    one call."""

def strategy_arrays(
    strategies: Sequence[Strategy],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The degrees and the device map of every strategy of ``strategies`` (one operator's: one
    axis count) as the rows of two arrays, in one call. Raises StrategyError for strategies of
    different axis counts."""

def unify(a: Layout, b: Layout) -> tuple[Layout, Layout]:
    """Rewrites two layouts of one tensor to one device matrix and one shape without moving an
    element (docs/conventions.md#unification)."""

def layout_classes(
    forward: Sequence[Layout],
    backward: Sequence[Layout] | None = None,
    forward_partial: npt.NDArray[np.int64] | None = None,
    backward_partial: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.int64], list[Layout], list[Layout] | None]:
    """The layout classes of one end of an edge in the search's tables: candidates whose layouts
    (``forward``, and with ``backward`` their gradients', one per candidate) have equal compacted
    forms (:meth:`Layout.compacted`) in each direction share a class. A direction's ``*_partial``
    (candidates x k: device dims, or -1 for none) gives each candidate's layout partial sums along
    its row's dims first (a row with none: the layout as it is). Returns each candidate's class
    (numbered in the order first met) and per class its compacted forward layout and gradient
    (None without ``backward``). Raises TapsError when ``backward`` or a direction's rows do not
    fit the candidates, LayoutError when a row's dims do not fit its layout."""

def plan_redistribution(
    a: Layout,
    b: Layout,
    cluster: Cluster | None = None,
    planner: _Planner = "paper",
    dtype_bytes: float = 2.0,
) -> Redistribution:
    """Plans the redistribution from layout `a` to layout `b` (docs/conventions.md#redistribution):
    `planner="paper"` is the paper's Algorithm 1, `"optimal"` the cheapest plan, minimizing
    seconds on `cluster` (elements received per device without one)."""

def inter_node_groups(
    layout: Layout,
    collective: _CollectiveKind,
    devices_per_node: int,
    device_dim: int | None = None,
) -> int:
    """`ct`, the number of groups of a collective of `layout` that leave one node of
    `devices_per_node` devices at once (0 if the groups stay inside a node;
    docs/conventions.md#ct)."""

def enumerate_strategies(
    axis_sizes: Sequence[int], num_devices: int, replicas: bool = False
) -> list[Strategy]:
    """Every strategy of `axis_sizes` on `num_devices` devices, in a fixed order; with `replicas`,
    followed by those that split over fewer devices and replicate over the rest
    (docs/conventions.md#strategies)."""

def redistribution_costs(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    cluster: Cluster,
    dtype_bytes: float = 2.0,
    model: _CostModel = "topology",
    planner: _Planner = "paper",
    time_limit: float | None = None,
    out: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """The matrix of redistribution costs from each source to each target, on all cores.

    With ``out`` (a writable float64 array of that shape whose rows are each contiguous: C
    order, or a block of rows and columns of a C-ordered matrix) the costs are written there
    and ``out`` is returned; any other ``out`` raises TapsError.

    Raises TimeLimitError if ``time_limit`` seconds pass first (``out`` is then partly
    written); Ctrl-C stops it within milliseconds."""

def redistribution_pair_costs(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    dtype_bytes: Sequence[float],
    cluster: Cluster,
    model: _CostModel = "topology",
    planner: _Planner = "paper",
    time_limit: float | None = None,
) -> npt.NDArray[np.float64]:
    """The cost of each pair ``(sources[k], targets[k])`` of ``dtype_bytes[k]`` bytes per
    element, as ``redistribution_costs`` prices it: pairs of many tensors in one call, on all
    cores.

    Raises TimeLimitError if ``time_limit`` seconds pass first; Ctrl-C stops it within
    milliseconds."""

def redistribution_bounds(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    cluster: Cluster,
    dtype_bytes: float = 2.0,
    model: _CostModel = "topology",
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """The matrix of lower bounds on the optimal planner's costs from each source to each
    target, without its searches: Algorithm 1's cost, or the search's bound at the source if
    less; and the matrix of whether each bound is the optimal planner's cost (nothing to move,
    or the search's bound exceeds Algorithm 1's cost). Topology model only."""

def redistribution_table_bounds(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    cluster: Cluster,
    dtype_bytes: float = 2.0,
    model: _CostModel = "topology",
    cheap: bool = False,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
    """``redistribution_bounds``'s two matrices and the matrix of Algorithm 1's costs (the
    ``"paper"`` planner's), which it works out first.

    With ``cheap``, weaker bounds for a fraction of the work: the search's bound at the source
    without the terms that need each pair's own bounds per device dim (the shard's growth, the
    last op, the elements entering a unit and the splits' removals only), with no memo. Each is
    at most the bound without ``cheap`` (so at most the optimal planner's cost), and exact
    (Algorithm 1's cost) only where that one is. Algorithm 1's cost is then worked out only
    where the bound may exceed it: elsewhere the bound is one on every plan, exact where nothing
    moves, and the cost NaN. Topology model only."""

def redistribution_pair_bounds(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    dtype_bytes: Sequence[float],
    cluster: Cluster,
    model: _CostModel = "topology",
    time_limit: float | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """The bound of each pair ``(sources[k], targets[k])`` of ``dtype_bytes[k]`` bytes per
    element and whether it is exact, as ``redistribution_bounds`` (and
    ``redistribution_table_bounds`` without ``cheap``) give them, bit for bit: pairs of many
    tensors in one call, on all cores, on the bounds' memos. Topology model only.

    Raises TimeLimitError if ``time_limit`` seconds pass first; Ctrl-C stops it within
    milliseconds."""

def redistribution_pair_estimates(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    dtype_bytes: Sequence[float],
    expansions: Sequence[int | None],
    cluster: Cluster,
    model: _CostModel = "topology",
    time_limit: float | None = None,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Per pair ``(sources[k], targets[k])`` of ``dtype_bytes[k]`` bytes per element, its cost
    under the optimal planner (``redistribution_pair_costs``' bit for bit) and True; or, where
    the pair's search expands ``expansions[k]`` layouts (None: no limit) without reaching the
    target, a lower bound on that cost and False: the least estimate the search left, at least
    ``redistribution_pair_bounds``' bound and at most Algorithm 1's cost. A search that ends
    is remembered, one stopped short is not. Topology model only.

    Raises TimeLimitError if ``time_limit`` seconds pass first; Ctrl-C stops it within
    milliseconds."""

def allreduce_costs(
    degrees: npt.NDArray[np.int64],
    device_maps: npt.NDArray[np.int64],
    tensors: Sequence[tuple[Sequence[int], Sequence[int], float]],
    cluster: Cluster,
    model: _CostModel = "topology",
    device_matrices: Sequence[Sequence[int]] | None = None,
) -> npt.NDArray[np.float64]:
    """Per strategy (rows of `degrees` and `device_maps`, on the device matrices `device_matrices`,
    one per row, or one dim per split axis if not given), the summed all_reduce cost of the
    tensors (strategy axes, shape, dtype bytes) over the device dims each leaves unused inside a
    replica, on all cores."""

def gathered_sum(
    terms: Sequence[
        tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64], bool]
    ],
    out: npt.NDArray[np.float64] | None = None,
    add: bool = False,
) -> npt.NDArray[np.float64]:
    """The sum of gathered matrices: each term ``(matrix, rows, cols, transposed)`` gives entry
    ``(i, j)`` its ``matrix[rows[i], cols[j]]`` (``matrix[rows[j], cols[i]]`` if transposed),
    summed in the terms' order from the first (not from 0), in one pass over the result on all
    cores. Matrices in C or Fortran order are read in place, others copied first. With ``out``
    (a writable C-order matrix of the sum's shape that shares no memory with the terms'
    matrices) the sum is written there, whatever it held, or with ``add`` added to its entries
    (``out[i, j] + terms...``, in that order), and ``out`` is returned. Raises TapsError when
    there is no term (and no ``add``), the terms' shapes differ (or differ from ``out``'s), a
    position lies outside its matrix, or ``out`` is missing for ``add``, read-only, not in C
    order or shares memory with a term's matrix."""

def min_plus(
    x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], tie: float
) -> npt.NDArray[np.float64]:
    """The min-plus product ``out[a, b] = min_k x[a, k] + y[k, b]`` of C-contiguous costs
    ``x (rows, inner, objectives)`` and ``y (inner, cols, objectives)``, on all cores. With one
    objective the least sum (NaN if any is); with more, the first objective decides up to a
    relative ``tie`` (``p <= least + tie * abs(least)``), then the second, the first ``k`` of
    equals, and the entry is that ``k``'s sums: numpy's ``minimum``/``min``/``argmin`` to the bit.
    Raises TapsError when the shapes do not fit together or ``inner`` is 0."""

def min_plus_one(
    x: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    shift: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """The min-plus product ``out[a, b] = min_k x[a, k] + y[k, b]`` of ``x (rows, inner)`` and
    ``y (inner, cols)``, one objective, on all cores: the sums in order of ``k``, numpy's
    ``minimum`` of them to the bit (NaN if any is). With ``shift (inner,)``, ``x`` is read as
    ``x + shift`` (numpy's sum to the bit, added as ``x`` is packed: no copy of it). Arrays in C
    or Fortran order (a transposed view too) are read in place, others copied first. Raises
    TapsError when the inner sizes differ or are 0."""

def first_equal(m: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Per row of ``m (rows, cols)``, the index of the first row equal to it (itself if none
    before it is), entries compared as numbers: -0.0 equals 0.0, a row holding NaN equals no
    other. One pass over the matrix, read in place in C or Fortran order (others copied first)."""

def frontier_sum(
    a: npt.NDArray[np.float64],
    ma: npt.NDArray[np.float64],
    b: npt.NDArray[np.float64],
    mb: npt.NDArray[np.float64],
    cap: float,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The frontier of the sum of two (cost, memory) Pareto tables: ``a`` of shape
    ``(len(ma), width)`` and ``b`` of ``(len(mb), width)``, C-contiguous, one row of costs per
    memory level, levels ascending. Every pair of levels with ``mb[j] <= cap - ma[i]`` is added
    (memories and costs); sums of equal memory are merged by their least cost per entry; a cost
    is kept only where it is below the entry's cost at every lower level (``inf`` elsewhere), and
    levels left with no finite cost go. Returns ``(mems, costs)``; raises TapsError when the
    shapes do not fit together or the levels do not ascend."""

def least_cuts(
    times: npt.NDArray[np.float64],
    edge: npt.NDArray[np.float64],
    parameters: npt.NDArray[np.float64],
    activations: npt.NDArray[np.float64],
    flights: npt.NDArray[np.float64],
    buffer: float,
    limit: float,
    bound: float,
) -> list[int] | None:
    """The cut points ``0 = c_0 < ... < c_K = n`` of a chain of ``n`` units into ``K =
    len(flights)`` stages of least total ``times[a, b]`` (C-contiguous over the ``n + 1`` cut
    points, ``inf`` unless ``b > a``) plus ``edge[b]`` after every stage but the last, whose
    stages all fit (stage ``k`` over ``a..b``: ``parameters[a, b] + flights[k] *
    activations[a, b] + buffer <= limit``) and take at most ``bound``; ``None`` if none. Among
    equal totals, the first start of each stage (numpy's ``argmin``). Raises TapsError when the
    shapes do not fit."""

def least_bottleneck(
    times: npt.NDArray[np.float64],
    edge: npt.NDArray[np.float64],
    parameters: npt.NDArray[np.float64],
    activations: npt.NDArray[np.float64],
    flights: npt.NDArray[np.float64],
    buffer: float,
    limit: float,
) -> float:
    """The least, over every cut of the chain of :func:`least_cuts` whose stages all fit, of the
    slowest stage's ``times[a, b]``; ``inf`` if no cut fits. Raises TapsError when the shapes do
    not fit."""
