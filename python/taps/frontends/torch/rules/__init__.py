"""The op-rule table of the PyTorch front end: one rule per ATen operator of the training IR
(``torch.export``'s default graph), keyed by the operator's name without its overload.

The rules live in one module per family (aliases, views, pointwise, contractions, convolution,
norms, attention, reductions, splits, joins, indexing, scans, moves, creation), written in the
vocabulary of :mod:`._context`; this module assembles :data:`RULES`. docs/frontends.md documents
what each operator becomes. A node whose tensor arguments are all constants never reaches a rule:
its output is a constant too.
"""

from __future__ import annotations

from collections.abc import Sequence

from taps.frontends.torch.rules import (
    aliases,
    attention,
    contractions,
    convolution,
    creation,
    indexing,
    joins,
    moves,
    norms,
    pointwise,
    reductions,
    scans,
    splits,
    views,
)
from taps.frontends.torch.rules._context import Context, Rule, Unsupported, flat


def _table(rules: Sequence[tuple[Rule, Sequence[str]]]) -> dict[str, Rule]:
    return {name: rule for rule, names in rules for name in names}


#: ATen operator name (without overload) -> rule. Anything else has no rule.
RULES: dict[str, Rule] = _table(
    [
        (
            aliases.free,
            [
                "clone",
                "contiguous",
                "detach",
                "alias",
                "lift_fresh_copy",
                "dropout",
                "feature_dropout",
                "alpha_dropout",
                "_to_copy",
                "to",
                "type_as",
                "_assert_tensor_metadata",
            ],
        ),
        (aliases.native_dropout, ["native_dropout"]),
        (aliases.copy, ["copy"]),
        (aliases.no_value, ["_assert_scalar", "sym_constrain_range_for_size", "_assert_async"]),
        (
            views.view,
            [
                "view",
                "reshape",
                "_unsafe_view",
                "flatten",
                "unflatten",
                "squeeze",
                "unsqueeze",
                "view_as",
                "reshape_as",
            ],
        ),
        (views.transpose, ["transpose", "swapaxes", "swapdims"]),
        (views.t, ["t", "numpy_T"]),
        (views.permute, ["permute"]),
        (views.movedim, ["movedim"]),
        (views.view_as_complex, ["view_as_complex"]),
        (views.view_as_real, ["view_as_real"]),
        (pointwise.pointwise, [*pointwise.UNARY, *pointwise.BINARY]),
        (pointwise.triangle, ["triu", "tril"]),
        (contractions.linear, ["linear"]),
        (contractions.mm, ["mm"]),
        (contractions.addmm, ["addmm"]),
        (contractions.bmm, ["bmm"]),
        (contractions.baddbmm, ["baddbmm"]),
        (contractions.matmul, ["matmul"]),
        (contractions.einsum, ["einsum"]),
        (contractions.embedding, ["embedding"]),
        (convolution.conv, ["conv1d", "conv2d", "conv3d", "convolution"]),
        (
            convolution.pool,
            [
                f"{kind}{k}d{suffix}"
                for k in (1, 2, 3)
                for kind, suffix in [
                    ("max_pool", ""),
                    ("avg_pool", ""),
                    ("adaptive_avg_pool", ""),
                    ("adaptive_max_pool", ""),
                    ("max_pool", "_with_indices"),
                ]
            ],
        ),
        (norms.layer_norm, ["layer_norm"]),
        (norms.rms_norm, ["rms_norm"]),
        (norms.group_norm, ["group_norm"]),
        (
            norms.batch_norm,
            [
                "batch_norm",
                "_native_batch_norm_legit_functional",
                "_native_batch_norm_legit_no_training",
            ],
        ),
        (norms.softmax, ["softmax", "_softmax", "log_softmax", "_log_softmax"]),
        (attention.sdpa, ["scaled_dot_product_attention"]),
        (
            reductions.reduction,
            [
                "sum",
                "mean",
                "amax",
                "amin",
                "max",
                "min",
                "var",
                "std",
                "prod",
                "logsumexp",
                "norm",
            ],
        ),
        (splits.split, ["split", "split_with_sizes"]),
        (splits.chunk, ["chunk"]),
        (splits.unbind, ["unbind"]),
        (splits.select, ["select"]),
        (splits.slice_, ["slice", "narrow"]),
        (splits.getitem, ["getitem"]),
        (joins.cat, ["cat", "concat", "concatenate"]),
        (joins.stack, ["stack"]),
        (joins.expand, ["expand", "expand_as", "broadcast_to"]),
        (indexing.index, ["index"]),
        (indexing.index_select, ["index_select"]),
        (indexing.gather, ["gather"]),
        (indexing.index_put, ["index_put"]),
        (indexing.index_add, ["index_add"]),
        (indexing.scatter, ["scatter", "scatter_add", "scatter_reduce"]),
        (scans.scan, ["cumsum", "cumprod", "logcumsumexp"]),
        (scans.sort, ["sort", "argsort"]),
        (scans.topk, ["topk"]),
        (scans.arg_reduction, ["argmax", "argmin"]),
        (moves.pad, ["pad", "constant_pad_nd"]),
        (moves.roll, ["roll"]),
        (moves.repeat, ["repeat"]),
        (moves.repeat_interleave, ["repeat_interleave"]),
        (
            creation.created,
            [
                *creation.SHAPED,
                "rand_like",
                "randn_like",
                "randint_like",
                "fill",
                "zero",
            ],
        ),
        (creation.bernoulli, ["bernoulli"]),
    ]
)

__all__ = ["RULES", "Context", "Rule", "Unsupported", "flat"]
