"""How a plan is priced: the cost model, the step, the redistribution planner, ZeRO, the bytes a
parameter takes, whether compute is counted and the dtype gradients are reduced in. Every function
that prices a plan reads these choices from one :class:`Pricing` (docs/search.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from taps._core import COST_MODELS, PLANNERS
from taps._support.arguments import number
from taps.errors import LayoutError, TopologyError

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel
    from taps._core import _Planner as Planner

#: What a cost prices: the whole training step (docs/search.md#the-training-step) or the paper's
#: model, ``"forward"`` (forward redistributions, gradients all_reduced at the operators).
STEPS = ("training", "forward")
Step = Literal["training", "forward"]

#: Bytes of device memory per parameter: fp16 weight and gradient, fp32 master weight and the two
#: Adam moments (mixed-precision Adam).
BYTES_PER_PARAMETER = 16

#: Bytes per element of a parameter's gradient as it is reduced: fp32, as mixed-precision training
#: reduces it (torch DDP under autocast keeps fp32 parameters and gradients, torchtitan's FSDP2
#: sets ``reduce_dtype=float32``, JAX keeps fp32 parameters and reduces their gradients so).
GRADIENT_DTYPE_BYTES = 4


def check_cost_model(cost_model: object) -> None:
    """Refuse an unknown cost model before any work (the core's list is the one source)."""
    if cost_model not in COST_MODELS:
        raise TopologyError(
            f"unknown cost model {cost_model!r}: expected one of {', '.join(COST_MODELS)}"
        )


def check_step(step: object) -> None:
    """Refuse an unknown step before any work."""
    if step not in STEPS:
        raise TopologyError(f"unknown step {step!r}: expected one of {', '.join(STEPS)}")


def check_planner(planner: object) -> None:
    """Refuse an unknown planner before any work (the core's list is the one source)."""
    if planner not in PLANNERS:
        raise LayoutError(f"unknown planner {planner!r}: expected one of {', '.join(PLANNERS)}")


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
        bytes_per_parameter: device memory per parameter (weight, gradient, optimizer state).
        compute: whether each operator's compute (a roofline, forward and backward) is counted,
            so that the objective is the step time; ``None`` (the default) counts it under the
            topology model, never under the volume model (bytes have no compute).
        gradient_dtype_bytes: bytes per element a parameter's gradient is reduced in (4: fp32,
            mixed precision); ``None`` reduces it in the parameter's own dtype (the paper's model).
    """

    cost_model: CostModel = "topology"
    step: Step = "training"
    planner: Planner = "paper"
    zero: bool = False
    bytes_per_parameter: float = BYTES_PER_PARAMETER
    compute: bool | None = None
    gradient_dtype_bytes: int | None = GRADIENT_DTYPE_BYTES

    def __post_init__(self) -> None:
        check_cost_model(self.cost_model)
        check_step(self.step)
        check_planner(self.planner)
        if not isinstance(self.zero, bool):
            raise TypeError(f"zero must be True or False, got {self.zero!r}")
        number("Pricing", "bytes_per_parameter", self.bytes_per_parameter, positive=False)
        if self.compute not in (None, True, False):
            raise TypeError(f"compute must be True, False or None, got {self.compute!r}")
        if self.compute and self.cost_model == "volume":
            raise TopologyError("the volume model prices bytes: it cannot count compute")
        g = self.gradient_dtype_bytes
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise TopologyError(f"gradient_dtype_bytes must be a positive int or None, got {g!r}")

    @property
    def counts_compute(self) -> bool:
        """Whether compute is counted: ``compute``, or by default under the topology model."""
        return self.cost_model == "topology" if self.compute is None else self.compute

    def to_dict(self) -> dict[str, Any]:
        """The choices as a JSON object."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Pricing:
        """The pricing of :meth:`to_dict`'s object; an unknown or missing key is refused."""
        fields = set(cls.__dataclass_fields__)
        if not isinstance(data, dict) or set(data) != fields:
            raise TopologyError(f"a pricing needs exactly the keys {', '.join(sorted(fields))}")
        return cls(**data)
