"""The random values of a step (dropout's masks, stochastic depth's): each draw is a whole tensor
made from the run's seed and the draw's place in the step, so that every rank holding an element
holds the same value (tensor-parallel ranks must drop the same activations), each rank takes
its block of it, and a dense run of the module drawing in the same order (:func:`drawing`) draws
the very same values: the replay's numbers compare exactly with random ops in the step.

A draw is a call of ``dropout`` that drops something (``p > 0`` in training), attention
(``scaled_dot_product_attention``) with ``dropout_p > 0`` (its mask is over the attention
weights, and both runs compute it as :func:`attention`), ``bernoulli`` (``bernoulli_``) with a
probability given as a number, or ``rand`` (``rand_like``); the ``k``-th draw of a step, in
program order (which is the order the module calls them), takes generator seed
``seed * 7919 + k``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from taps._support.extras import require
from taps.errors import ExportError

#: Dropout, and in place (``nn.Dropout(inplace=True)``, as torchvision's classifiers have it).
DROPOUTS = ("dropout", "dropout_")

#: The operators (and functions of the module's code) that draw.
DRAWING = (
    *DROPOUTS,
    "scaled_dot_product_attention",
    "bernoulli",
    "bernoulli_",
    "rand",
    "rand_like",
)

#: Attention's arguments after ``query``, ``key`` and ``value``, with their defaults.
_ATTENTION = (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None))


def _dropout_args(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[float, bool]:
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    train = args[2] if len(args) > 2 else kwargs.get("train", kwargs.get("training", True))
    return float(p), bool(train)


def attention_args(args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Attention's mask, dropout probability, causality and scale, by name, from a call's
    arguments (``enable_gqa`` too when given)."""
    out = {name: kwargs.get(name, default) for name, default in _ATTENTION}
    out.update(zip([n for n, _ in _ATTENTION], args[3:]))
    if "enable_gqa" in kwargs:
        out["enable_gqa"] = kwargs["enable_gqa"]
    return out


def draws(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a call of ``name`` on ``args`` draws (a dropout that drops nothing does not)."""
    if name in DROPOUTS:
        p, train = _dropout_args(args, kwargs)
        return p > 0 and train
    if name == "scaled_dot_product_attention":
        return float(attention_args(args, kwargs)["dropout_p"]) > 0
    return name in DRAWING


def weights_shape(query: Any, key: Any) -> tuple[int, ...]:
    """The shape of attention's weights (what its dropout draws a mask for): the query's
    leading dims, its length and the key's."""
    return (*query.shape[:-1], key.shape[-2])


def attention(query: Any, key: Any, value: Any, keep: Any, **options: Any) -> Any:
    """``scaled_dot_product_attention`` written out, its dropout the scaled keep mask ``keep``
    (a draw of :func:`drawn`) on the weights: what the replay and the dense run both compute
    where attention drops something (torch's kernel draws its own mask)."""
    torch = require("torch", "torch", "the step's random values")
    mask, causal, scale = options.get("attn_mask"), options.get("is_causal"), options.get("scale")
    if options.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, -3)
        value = value.repeat_interleave(repeat, -3)
    scale = 1 / query.shape[-1] ** 0.5 if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale
    if causal:
        length, keys = scores.shape[-2:]
        lower = torch.ones(length, keys, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~lower, float("-inf"))
    if mask is not None:
        scores = (
            scores.masked_fill(~mask, float("-inf"))
            if mask.dtype == torch.bool
            else scores + mask.to(scores.dtype)
        )
    return (scores.softmax(-1) * keep.to(scores.dtype)) @ value


def drawn(
    name: str, args: Sequence[Any], kwargs: dict[str, Any], shape: Sequence[int], seed: int, k: int
) -> Any:
    """The ``k``-th draw of a step, whole (``shape``, float64 on the CPU): a dropout's scaled
    keep mask (``x`` times it is the dropout; attention's over its weights), a Bernoulli sample,
    or uniform values."""
    torch = require("torch", "torch", "the step's random values")
    gen = torch.Generator().manual_seed(seed * 7919 + k)
    u = torch.rand(tuple(shape), generator=gen, dtype=torch.float64)
    if name in (*DROPOUTS, "scaled_dot_product_attention"):
        p = (
            _dropout_args(args, kwargs)[0]
            if name in DROPOUTS
            else float(attention_args(args, kwargs)["dropout_p"])
        )
        return (u >= p).double() / (1 - p)
    if name.startswith("bernoulli"):
        q = args[1] if len(args) > 1 else kwargs.get("p")
        if not isinstance(q, (int, float)):
            raise ExportError(f"{name} with probabilities from a tensor is not replayed")
        return (u < q).double()
    return u


@contextmanager
def drawing(seed: int) -> Iterator[None]:
    """Inside, the module's own code draws the step's values (:func:`drawn`, in call order):
    the dense run that a replay seeded with ``seed`` is compared with."""
    torch = require("torch", "torch", "the step's random values")
    from torch.overrides import TorchFunctionMode

    count = [0]

    class Mode(TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name not in DRAWING or not draws(name, args, kwargs):
                return func(*args, **kwargs)
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            attends = name == "scaled_dot_product_attention"
            shape = (
                weights_shape(args[0], args[1])
                if attends
                else x.shape
                if x is not None
                else func(*args, **kwargs).shape
            )
            value = drawn(name, args, kwargs, shape, seed, count[0])
            count[0] += 1
            like = x if x is not None else torch.empty((), dtype=kwargs.get("dtype"))
            value = value.to(dtype=like.dtype, device=like.device)
            if attends:
                options = attention_args(args, kwargs)
                return attention(args[0], args[1], args[2], value, **options)
            if name == "dropout":
                return x * value
            if name == "dropout_" and x is not None:
                return x.mul_(value)
            if name == "bernoulli_" and x is not None:
                return x.copy_(value)
            return value

    with Mode():
        yield
