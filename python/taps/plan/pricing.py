"""How a plan is priced: the cost model, the step, the redistribution planner, ZeRO, parameter
storage sharding (FSDP), whether compute is counted, and what training keeps per parameter
(weight, gradient, master copy, optimizer state) and reduces its gradients in. Every function
that prices a plan reads these choices from one :class:`Pricing` (docs/search.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from taps._core import COST_MODELS, PLANNERS
from taps._support.arguments import shown
from taps.errors import ArgumentError, LayoutError, TopologyError

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel
    from taps._core import _Planner as Planner

#: What a cost prices: the whole training step (docs/search.md#the-training-step) or the paper's
#: model, ``"forward"`` (forward redistributions, gradients all_reduced at the operators).
STEPS = ("training", "forward")
Step = Literal["training", "forward"]

#: The optimizers and how many fp32 numbers each keeps per parameter element: Adam its two
#: moments, SGD with momentum one, none (plain SGD, or no training state at all) nothing.
OPTIMIZERS = {"adam": 2, "sgd": 1, "none": 0}
Optimizer = Literal["adam", "sgd", "none"]

#: Bytes per element of a parameter's gradient, as training holds and reduces it: fp32, as
#: mixed-precision training does (torch DDP under autocast keeps fp32 parameters and gradients,
#: torchtitan's FSDP2 sets ``reduce_dtype=float32``, Megatron-LM accumulates ``main_grad`` in
#: fp32, JAX keeps fp32 parameters and reduces their gradients so).
GRADIENT_BYTES = 4


def check_cost_model(cost_model: object) -> None:
    """Refuse an unknown cost model before any work (the core's list is the one source)."""
    if cost_model not in COST_MODELS:
        raise TopologyError(
            f"unknown cost model {shown(cost_model)}: expected one of {', '.join(COST_MODELS)}"
        )


def check_step(step: object) -> None:
    """Refuse an unknown step before any work."""
    if step not in STEPS:
        raise TopologyError(f"unknown step {shown(step)}: expected one of {', '.join(STEPS)}")


def check_planner(planner: object) -> None:
    """Refuse an unknown planner before any work (the core's list is the one source)."""
    if planner not in PLANNERS:
        raise LayoutError(
            f"unknown planner {shown(planner)}: expected one of {', '.join(PLANNERS)}"
        )


@dataclass(frozen=True)
class Pricing:
    """Every choice that prices a plan.

    Attributes:
        cost_model: ``"topology"`` (seconds on the cluster, the default) or ``"volume"`` (bytes
            per device).
        step: ``"training"`` (the whole training step, the default) or ``"forward"`` (the
            paper's model).
        planner: how every edge is redistributed: ``"paper"`` (Algorithm 1, the default) or
            ``"optimal"`` (the shortest plan within a search budget).
        zero: parameters' gradients and optimizer state sharded over their data-parallel devices
            (ZeRO: reduce_scatter and all_gather).
        fsdp: parameter storage sharding (FSDP, ZeRO-3; docs/search.md#parameter-storage-sharding):
            the operators whose parameters are stored sharded over the devices their gradients
            are reduced over, all-gathered before the forward and again before the backward, their
            gradients reduce-scattered. ``False`` (the default): none; ``True``: every operator;
            a tuple of operator names: those. To :func:`taps.search` it says which operators
            *may* shard: the search picks per operator, and the plan it returns names those it
            sharded (``False`` if none).
        parameter_bytes: bytes per element of the weight a device keeps for the forward and
            backward (None, the default: the graph's ``dtype_bytes`` of the parameter).
        gradient_bytes: bytes per element of its gradient as it is held and reduced (4, the
            default: fp32, :data:`GRADIENT_BYTES`; None: as the weight, the paper's model).
        master_weights: an fp32 copy of every weight narrower than fp32, which the optimizer
            updates (mixed precision; the default).
        optimizer: ``"adam"`` (two fp32 moments per element, the default), ``"sgd"`` (SGD with
            momentum: one) or ``"none"``.
        compute: whether each operator's compute (a roofline, forward and backward) is counted,
            so that the objective is the step time; ``None`` (the default) counts it under the
            topology model, never under the volume model (bytes have no compute).
        checkpoint: activation checkpointing of every ``checkpoint``-th layer (the instances of
            the graph's ties; 1: every layer, 0: none, the default): a checkpointed layer keeps
            only what leaves it and runs its forward again in the backward
            (:mod:`taps.search.checkpointing`).

    The defaults on a bf16 or fp16 graph are mixed-precision Adam: 2 (weight) + 4 (fp32 gradient)
    + 4 (master copy) + 8 (moments) = 18 bytes per parameter element (:meth:`parameter_memory`),
    as Megatron-LM counts it; on an fp32 graph 4 + 4 + 8 = 16.
    """

    cost_model: CostModel = "topology"
    step: Step = "training"
    planner: Planner = "paper"
    zero: bool = False
    fsdp: bool | tuple[str, ...] = False
    parameter_bytes: int | None = None
    gradient_bytes: int | None = GRADIENT_BYTES
    master_weights: bool = True
    optimizer: Optimizer = "adam"
    compute: bool | None = None
    checkpoint: int = 0

    def __post_init__(self) -> None:
        check_cost_model(self.cost_model)
        check_step(self.step)
        check_planner(self.planner)
        for name in ("zero", "master_weights"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {shown(getattr(self, name))}")
        self._check_fsdp()
        for name in ("parameter_bytes", "gradient_bytes"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ArgumentError(
                    f"Pricing: {name} must be a positive int (bytes per element) or None, "
                    f"got {shown(value)}"
                )
        if not isinstance(self.checkpoint, int) or isinstance(self.checkpoint, bool):
            raise TypeError(f"checkpoint must be an int, got {shown(self.checkpoint)}")
        if self.checkpoint < 0:
            raise ArgumentError(
                f"Pricing: checkpoint must be 0 (none) or every how many layers, got "
                f"{shown(self.checkpoint)}"
            )
        if self.compute is not None and not isinstance(self.compute, bool):
            raise TypeError(f"compute must be True, False or None, got {shown(self.compute)}")
        if self.compute and self.cost_model == "volume":
            raise TopologyError("the volume model prices bytes: it cannot count compute")
        if not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZERS:
            raise ArgumentError(
                f"Pricing: unknown optimizer {shown(self.optimizer)}: expected one of "
                f"{', '.join(OPTIMIZERS)}"
            )

    def _check_fsdp(self) -> None:
        """``fsdp`` as True, False or the sorted tuple of its names (an empty one is False)."""
        value = self.fsdp
        if isinstance(value, bool):
            return
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise TypeError(
                f"fsdp must be True, False or operator names, got {type(value).__name__}"
            )
        names = tuple(value)
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise TypeError(f"fsdp: operator names must be strings, got {shown(bad[0])}")
        object.__setattr__(self, "fsdp", tuple(sorted(set(names))) or False)

    def shards(self, op_name: str) -> bool:
        """Whether operator ``op_name`` stores its parameters sharded (FSDP) under this pricing
        (for a search: may store them so)."""
        return self.fsdp is True or (isinstance(self.fsdp, tuple) and op_name in self.fsdp)

    @property
    def counts_compute(self) -> bool:
        """Whether compute is counted: ``compute``, or by default under the topology model."""
        return self.cost_model == "topology" if self.compute is None else self.compute

    def parameter_memory(self, dtype_bytes: int) -> tuple[float, float]:
        """Device memory per element of a parameter of ``dtype_bytes`` in the graph, as
        ``(weight, rest)``: the weight every device computing with it holds, and the gradient,
        master copy and optimizer state (what ZeRO shards over the data-parallel devices)."""
        weight = self.parameter_bytes or dtype_bytes
        gradient = self.gradient_bytes or weight
        master = 4 if self.master_weights and weight < 4 else 0
        return float(weight), float(gradient + master + 4 * OPTIMIZERS[self.optimizer])

    def to_dict(self) -> dict[str, Any]:
        """The choices as a JSON object."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Pricing:
        """The pricing of :meth:`to_dict`'s object; an unknown or missing key is refused."""
        fields = set(cls.__dataclass_fields__)
        if not isinstance(data, dict) or set(data) != fields:
            raise TopologyError(f"a pricing needs exactly the keys {', '.join(sorted(fields))}")
        fsdp = data["fsdp"]
        return cls(**{**data, "fsdp": tuple(fsdp) if isinstance(fsdp, list) else fsdp})
