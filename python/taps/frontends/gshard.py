"""The GShard form of a mixture-of-experts block (docs/moe.md), made by any front end.

A front end finds the block in its own representation (the torch front end by module structure,
:mod:`taps.frontends.torch.moe`; the JAX front end in the jaxpr, :mod:`taps.frontends.jax.moe`)
and hands :func:`gshard` its tokens ``gsm``, the router's scores ``gse`` and the experts' stacked
weights; the operators are the same whichever framework wrote the model:

- ``moe_route`` ``gse -> gsec``: the combine weights from the router's scores (top-k and the
  model's normalisation); the dispatch mask is where they are not zero;
- ``moe_dispatch`` ``gsec,gsm -> egcm``: each expert's tokens gathered;
- ``moe_expert`` ``egcm,efm -> egcf`` (gate and up), the gated activation (``swiglu`` ...),
  ``moe_expert`` ``egch,emh -> egcm`` (down);
- ``moe_combine`` ``gsec,egcm -> gsm``: the experts' outputs weighted back to their tokens;
- an ``add`` per other token-sized tensor the block adds to them (shared experts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from taps._core import GraphError
from taps.graph import MOE_COMBINE, MOE_DISPATCH, MOE_EXPERT, MOE_ROUTE, Operator

#: The gated activation operator made for the experts' activation (``silu``, ``gelu``, ``relu``).
GLU_KINDS = {"silu": "swiglu", "gelu": "geglu", "relu": "reglu"}


def fused_pair(op: Operator) -> tuple[int, list[str]]:
    """Of a gated activation with one operand (a fused gate-up projection): the position of
    its operand's axis of size 2 (gate first, then up) and the operand's other axes, in order."""
    dims, out = op.inputs[0].dims, op.output.dims
    (pair,) = [i for i, d in enumerate(dims) if d not in out]
    return pair, [d for d in dims if d in out]


class OperatorBuilder(Protocol):
    """What :func:`gshard` needs of a front end's builder: its values have a ``shape``."""

    def op(
        self,
        kind: str,
        path: str,
        inputs: Sequence[tuple[Any, Sequence[str]]],
        out_shape: Sequence[int],
        out_labels: Sequence[str],
        dtype_bytes: int,
        partitionable: Sequence[str] | None = None,
        *,
        addends: Sequence[tuple[Any, Sequence[str]]] = (),
        saved: str = "output",
    ) -> Any:
        """An operator reading ``inputs`` (a value and a label per dim) into a new value;
        ``addends`` are added after the contraction (the experts' biases)."""

    def reshape(self, v: Any, shape: Sequence[int], path: str, label: str) -> Any:
        """``v`` with another shape of the same element count."""


@dataclass(frozen=True)
class Experts:
    """A block's routed experts as a front end read them.

    Attributes:
        path: where the block is (the dispatch and combine are named by it).
        router: where the router's top-k is (the routing tensor is named by it).
        weights: the experts' stacked weights in order of use, ``(path, value)`` (``path``
            names the projection's operator): gate and up then down, a fused gate-up then down,
            or up then down.
        activation: the experts' activation (``silu``, ``gelu``, ``relu``).
        num_experts, top_k, capacity: ``e``, ``k`` and ``c`` (slots per expert and group).
        out_first: how a weight whose two other dims are both the model width (``h == m``) is
            read: ``(expert, out, in)`` (``F.linear``'s order) or else ``(expert, in, out)``
            (``x @ w``, JAX's).
        biases: per weight, its experts' stacked bias ``(e, out)`` (GPT-OSS's), or ``None``;
            empty for none at all.
    """

    path: str
    router: str
    weights: tuple[tuple[str, Any], ...]
    activation: str
    num_experts: int
    top_k: int
    capacity: int
    out_first: bool
    biases: tuple[Any | None, ...] = ()


def gshard(
    b: OperatorBuilder,
    block: Experts,
    tokens: Any,
    scores: Sequence[Any],
    extras: Sequence[Any],
    dtype_bytes: int,
    score_bytes: int,
) -> Any:
    """The block's operators from ``tokens`` (shape ``(g, s, m)``), the router's ``scores``
    (each ``(g, s, e)``, read by ``moe_route``) and ``extras`` (each ``(g, s, m)``, added to the
    combine); returns the block's output ``(g, s, m)``."""
    if not scores:
        raise GraphError(f"the mixture-of-experts block {block.path} has no router scores")
    groups, seq, width = tokens.shape
    experts, capacity = block.num_experts, block.capacity
    gse = [(v, ("g", "s", "e")) for v in scores]
    route = b.op(
        MOE_ROUTE,
        block.router,
        gse,
        (groups, seq, experts, capacity),
        ("g", "s", "e", "c"),
        score_bytes,
        partitionable="g",
        saved="none",
    )
    h = b.op(
        MOE_DISPATCH,
        block.path,
        [(route, "gsec"), (tokens, "gsm")],
        (experts, groups, capacity, width),
        "egcm",
        dtype_bytes,
        partitionable="ge",
    )
    h = _experts(b, block, h, width, dtype_bytes)
    out = b.op(
        MOE_COMBINE,
        block.path,
        [(route, "gsec"), (h, "egcm")],
        (groups, seq, width),
        "gsm",
        dtype_bytes,
        partitionable="ge",
    )
    for extra in extras:
        out = b.op("add", block.path, [(out, "gsm"), (extra, "gsm")], out.shape, "gsm", dtype_bytes)
    return out


def weight_labels(
    shape: tuple[int, ...], width: int, other: str, into: str, out_first: bool
) -> list[str]:
    """Labels of a stacked expert weight: ``e`` its first dim, ``m`` the model's width,
    ``other`` the remaining one. When both are the model's width, ``out_first`` tells the order
    (:attr:`Experts.out_first`); ``into`` is the label of its output (``m`` for the down
    projection)."""
    rest = list(shape[1:])
    if rest.count(width) == 2:
        into_other = "m" if into != "m" else other
        return ["e", into, into_other] if out_first else ["e", into_other, into]
    if rest.count(width) != 1:
        raise GraphError(
            f"expert weight of shape {list(shape)}: none of its dims is the model width {width}"
        )
    return ["e", *("m" if d == width else other for d in rest)]


def _experts(b: OperatorBuilder, block: Experts, h: Any, width: int, dtype: int) -> Any:
    """The experts' MLP on the dispatched tokens ``h`` (``egcm``): gate and up (one fused
    weight or two), the activation, down."""
    if len(block.weights) not in (2, 3):
        raise GraphError(
            f"the mixture-of-experts block {block.path} has {len(block.weights)} stacked expert "
            "weights (2 or 3 expected: up or gate and up, then down)"
        )
    e, g, c, _ = h.shape
    *ins, (down_path, down) = block.weights
    *in_biases, down_bias = block.biases or (None,) * len(block.weights)

    def project(path: str, w: Any, x: Any, x_labels: str, out: str, bias: Any) -> Any:
        labels = weight_labels(
            tuple(w.shape), width, out if x_labels[-1] == "m" else "h", out, block.out_first
        )
        size = next(d for d, lab in zip(w.shape, labels) if lab == out) if out != "m" else width
        # Tensor parallelism inside the experts as Megatron-LM's MLP: gate and up split by
        # their outputs, down by its inputs; the capacity and the model width stay whole.
        return b.op(
            MOE_EXPERT,
            path,
            [(x, x_labels), (w, labels)],
            (e, g, c, size),
            f"egc{out}",
            dtype,
            partitionable=("e", "g", "h" if out == "m" else out),
            addends=[(bias, ("e", out))] if bias is not None else [],
        )

    act = block.activation
    inner = next((d for d in down.shape[1:] if d != width), width)
    if len(ins) == 2:  # gate and up apart (torchtitan's w1 and w3)
        (gk, gw), (uk, uw) = ins
        gate = project(gk, gw, h, "egcm", "h", in_biases[0])
        up = project(uk, uw, h, "egcm", "h", in_biases[1])
        hidden = b.op(
            GLU_KINDS[act],
            block.path,
            [(gate, "egch"), (up, "egch")],
            gate.shape,
            "egch",
            dtype,
            partitionable="egh",
        )
    else:
        key, w = ins[0]
        fused = project(key, w, h, "egcm", "f", in_biases[0])
        if fused.shape[-1] == 2 * inner:  # gate and up in one weight, gate first
            pair = b.reshape(fused, (e, g, c, 2, inner), block.path, "gate_up")
            hidden = b.op(
                GLU_KINDS[act],
                block.path,
                [(pair, "egcth")],
                (e, g, c, inner),
                "egch",
                dtype,
                partitionable="egh",
            )
        else:  # no gate: up, the activation
            hidden = b.op(
                act, block.path, [(fused, "egch")], fused.shape, "egch", dtype, partitionable="egh"
            )
    return project(down_path, down, hidden, "egch", "m", down_bias)
