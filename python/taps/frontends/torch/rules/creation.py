"""Rules for ATen creation and random operators: values made from a shape alone (``new_zeros``,
``zeros_like``, ``fill``, ``new_empty``, ...) and random masks (``bernoulli(x, p)``, as stochastic
depth draws them). They read no data of their tensor argument, so they are constants: computed on
every device, no communication, no gradient. A creation operator with no tensor argument
(``arange``, ``full``, ``zeros``) is a constant before any rule runs."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import Context, elementwise, lead

#: Operators whose output depends on their tensor argument's shape and dtype only, not on its
#: values (the replay runs them on a stand-in: docs/export.md).
SHAPED = (
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
    "new_empty_strided",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
)


def created(cx: Context) -> AtenValue:
    """``new_zeros``, ``zeros_like``, ``new_empty``, ``fill`` with a number, ...: a constant of
    the node's shape. ``fill`` with a graph tensor's value is an ``expand`` of that value."""
    value = cx.arg(1, "value")
    if cx.kind == "fill" and isinstance(value, AtenValue) and not value.constant:
        labels = lead(len(cx.shapes[0]))
        return cx.b.op("expand", cx.path, [(value, [])], cx.shapes[0], labels, cx.dtypes[0])
    return constant(cx.shapes[0], cx.dtypes[0])


def bernoulli(cx: Context) -> AtenValue:
    """``bernoulli(x, p)`` and ``x.bernoulli_(p)`` with a number ``p``: a random mask of ``x``'s
    shape, a constant. Drawn with probabilities from a graph tensor (``bernoulli(probs)``,
    ``x.bernoulli_(probs)``): an elementwise ``bernoulli`` of them."""
    p = cx.arg(1, "p")
    probs = p if isinstance(p, AtenValue) else cx.args[0] if p is None else None
    if isinstance(probs, AtenValue) and not probs.constant:
        return elementwise(cx, "bernoulli", [probs])
    return constant(cx.shapes[0], cx.dtypes[0])
