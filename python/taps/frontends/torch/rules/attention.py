"""The rule for ATen's ``scaled_dot_product_attention``: the three operators of attention."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import Context, Unsupported, lead, tensor_arg


def sdpa(cx: Context) -> AtenValue:
    """``scaled_dot_product_attention``: ``scores``, ``softmax`` and ``context`` operators.

    Three operators as taps.models.gpt builds them: ``scores`` (q k^T), ``softmax`` over the
    keys and ``context`` (probabilities times v); batch, heads and query sequence partitionable,
    the head dim and key sequence whole. With grouped-query attention the heads are (kv heads,
    queries per kv head). A mask that is not a constant is an input of ``scores``.

    The kernels behind it on a GPU (flash and memory-efficient attention, with or without a
    mask) never store the scores: the backward keeps only the output and the logsumexp per
    query row and recomputes the rest, so ``scores`` keeps nothing and ``softmax`` keeps its
    rows (:attr:`taps.graph.Operator.saved`)."""
    q, k, v = (tensor_arg(cx, i, n) for i, n in enumerate(("query", "key", "value")))
    mask = cx.arg(3, "attn_mask")
    b = cx.b
    *batch_shape, heads, _, _ = q.shape
    kv_heads = k.shape[-3]
    batch = lead(len(batch_shape))
    if heads == kv_heads:
        head, kv_head, split = ["n"], ["n"], [heads]
    else:
        head, kv_head, split = ["g", "r"], ["g"], [kv_heads, heads // kv_heads]
        q = b.reshape(q, (*batch_shape, *split, *q.shape[-2:]), cx.path, "grouped")
    hs = len(head)
    q_l = [*batch, *head, "s", "d"]
    k_l = [*batch, *kv_head, "t", "d"]
    v_l = [*batch, *kv_head, "t", "e"]
    scores_l = [*batch, *head, "s", "t"]
    scores_shape = (*batch_shape, *split, q.shape[-2], k.shape[-2])
    part = [*batch, *head, "s"]
    inputs = [(q, q_l), (k, k_l)]
    if isinstance(mask, AtenValue) and not mask.constant:
        m = mask if heads == kv_heads else b.reshape(mask, mask.shape, cx.path, "mask")
        out_full = dict(zip(scores_l, scores_shape))
        labels = [*batch, "n", "s", "t"] if hs == 1 else None
        if labels is None or len(m.shape) > len(labels):
            raise Unsupported("an attention mask with grouped-query attention")
        offset = len(labels) - len(m.shape)
        inputs.append(
            (
                m,
                [
                    lab if m.shape[i] == out_full.get(lab, 0) else f"one{i + offset}"
                    for i, lab in enumerate(labels[offset:])
                ],
            )
        )
    dtype = cx.dtypes[0]
    scores = b.op("scores", cx.path, inputs, scores_shape, scores_l, dtype, part, saved="none")
    probs = b.op(
        "softmax", cx.path, [(scores, scores_l)], scores_shape, scores_l, dtype, part, saved="rows"
    )
    out_shape = (*batch_shape, *split, q.shape[-2], v.shape[-1])
    out_l = [*batch, *head, "s", "e"]
    order = cx.order()
    if order is not None and hs == 2:  # the framework's heads dim is two axes here
        nb = len(batch)
        order = [o + (o > nb) for o in order]
        order.insert(order.index(nb) + 1, nb + 1)
    ctx = b.op(
        "context", cx.path, [(probs, scores_l), (v, v_l)], out_shape, out_l, dtype, part, order
    )
    if hs == 2:
        return b.reshape(ctx, cx.shapes[0], cx.path, "heads")
    return ctx
