"""Type stubs of the Rust extension ``taps._core`` (see docs/core.md)."""

from collections.abc import Sequence
from typing import Any, Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "Cluster",
    "CommOp",
    "GraphError",
    "InfeasibleError",
    "Layout",
    "LayoutError",
    "Redistribution",
    "Strategy",
    "StrategyError",
    "TapsError",
    "TopologyError",
    "UnifyError",
    "allreduce_costs",
    "enumerate_strategies",
    "inter_node_groups",
    "plan_redistribution",
    "redistribution_costs",
    "unify",
]

# Names checked at run time (a bad one raises TopologyError): "all_reduce", "all_gather",
# "all_to_all", "reduce_scatter", "collective_permute"; "topology", "volume".
_Collective = str
_CostModel = str
_Planner = Literal["optimal", "paper"]

class TapsError(ValueError): ...
class LayoutError(TapsError): ...
class UnifyError(LayoutError): ...
class StrategyError(TapsError): ...
class TopologyError(TapsError): ...
class GraphError(TapsError): ...
class InfeasibleError(TapsError): ...

@final
class Layout:
    def __new__(
        cls,
        shape: Sequence[int],
        device_matrix: Sequence[int],
        tensor_map: Sequence[int],
        partial: Sequence[int] = ...,  # () at run time: no partial sums
    ) -> Layout: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def device_matrix(self) -> list[int]: ...
    @property
    def tensor_map(self) -> list[int]: ...
    @property
    def partial(self) -> list[int]:
        """The device dims along which the devices hold partial sums (ascending)."""
    @property
    def shard_shape(self) -> list[int]: ...
    @property
    def num_devices(self) -> int: ...
    def shard_index(self, rank: int) -> list[tuple[int, int]]: ...
    def device_dim_size(self, k: int) -> int: ...
    def normalized(self) -> Layout:
        """The canonical form, a reshape that moves nothing: two layouts of one tensor hold the
        same elements (and partial sums) on every rank iff their normal forms are equal."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(
        self,
    ) -> tuple[type[Layout], tuple[list[int], list[int], list[int], list[int]]]: ...

_Replicas = Literal["shared", "flat"]

@final
class Cluster:
    def __new__(
        cls,
        nodes: int,
        devices_per_node: int,
        # The paper's 60e9 and 6e9 at run time (the dgx-v100 preset, stated once in the core).
        intra_bandwidth: float = ...,
        inter_bandwidth: float = ...,
        device_memory: float | None = None,
        *,
        intra_latency: float = 0.0,
        inter_latency: float = 0.0,
        replicas: _Replicas = "shared",
    ) -> Cluster: ...
    @staticmethod
    def hierarchy(
        levels: Sequence[tuple[int, float, float]],
        device_memory: float | None = None,
        replicas: _Replicas = "shared",
    ) -> Cluster:
        """A cluster of nested levels, innermost first, each ``(parts, bandwidth, latency)``."""
    @classmethod
    def preset(cls, name: str, nodes: int = 1) -> Cluster:
        """The built-in cluster ``name`` ("dgx-v100", "dgx-h100") or a ``.toml`` file's."""
    @property
    def levels(self) -> list[tuple[int, float, float]]: ...
    @property
    def replicas(self) -> _Replicas: ...
    @property
    def nodes(self) -> int: ...
    @property
    def devices_per_node(self) -> int: ...
    @property
    def intra_bandwidth(self) -> float: ...
    @property
    def inter_bandwidth(self) -> float: ...
    @property
    def device_memory(self) -> float | None: ...
    @property
    def num_devices(self) -> int: ...
    def collective_cost(
        self,
        layout: Layout,
        collective: _Collective,
        device_dim: int | None = None,
        dtype_bytes: float = 2.0,
        model: _CostModel = "topology",
    ) -> float: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(
        self,
    ) -> tuple[Any, tuple[list[tuple[int, float, float]], float | None, str]]: ...

@final
class CommOp:
    @property
    def kind(
        self,
    ) -> Literal[
        "slice", "all_gather", "all_to_all", "reduce_scatter", "all_reduce", "collective_permute"
    ]: ...
    @property
    def device_dim(self) -> int: ...
    @property
    def tensor_dim(self) -> int | None: ...
    @property
    def to_tensor_dim(self) -> int | None: ...
    @property
    def permutation(self) -> list[int] | None:
        """Collective-permute only: per device dim, the device dim that takes over its splits."""
    @property
    def group_size(self) -> int: ...
    @property
    def volume(self) -> int: ...
    @property
    def layout(self) -> Layout: ...
    def inter_node_groups(self, devices_per_node: int) -> int: ...
    def cost(
        self, cluster: Cluster, dtype_bytes: float = 2.0, model: _CostModel = "topology"
    ) -> float: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Redistribution:
    @property
    def source(self) -> Layout: ...
    @property
    def target(self) -> Layout: ...
    @property
    def ops(self) -> list[CommOp]: ...
    @property
    def prelude(self) -> list[CommOp]: ...
    @property
    def epilogue(self) -> list[CommOp]: ...
    @property
    def all_ops(self) -> list[CommOp]: ...
    @property
    def volume(self) -> int: ...
    def cost(
        self, cluster: Cluster, dtype_bytes: float = 2.0, model: _CostModel = "topology"
    ) -> float: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class Strategy:
    def __new__(cls, degrees: Sequence[int], device_map: Sequence[int]) -> Strategy: ...
    @property
    def degrees(self) -> list[int]: ...
    @property
    def device_map(self) -> list[int]: ...
    @property
    def device_matrix(self) -> list[int]: ...
    @property
    def num_devices(self) -> int: ...
    def tensor_layout(self, axes: Sequence[int], shape: Sequence[int]) -> Layout: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Strategy], tuple[list[int], list[int]]]: ...

def unify(a: Layout, b: Layout) -> tuple[Layout, Layout]: ...
def plan_redistribution(
    a: Layout,
    b: Layout,
    cluster: Cluster | None = None,
    planner: _Planner = "paper",
    dtype_bytes: float = 2.0,
) -> Redistribution:
    """The plan from ``a`` to ``b``: Algorithm 1 (``"paper"``), or the cheapest plan between the
    canonical forms (``"optimal"``: seconds on ``cluster``, elements per device without one)."""

def inter_node_groups(
    layout: Layout, collective: _Collective, devices_per_node: int, device_dim: int | None = None
) -> int: ...
def enumerate_strategies(axis_sizes: Sequence[int], num_devices: int) -> list[Strategy]: ...
def redistribution_costs(
    sources: Sequence[Layout],
    targets: Sequence[Layout],
    cluster: Cluster,
    dtype_bytes: float = 2.0,
    model: _CostModel = "topology",
    planner: _Planner = "paper",
) -> npt.NDArray[np.float64]: ...
def allreduce_costs(
    degrees: npt.NDArray[np.int64],
    device_maps: npt.NDArray[np.int64],
    tensors: Sequence[tuple[Sequence[int], Sequence[int], float]],
    cluster: Cluster,
    model: _CostModel = "topology",
) -> npt.NDArray[np.float64]: ...
