"""Rules for ATen views and relabellings: reshapes are views of the graph tensor, transposes
and complex views relabel its dims; none makes an operator."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import Context, Unsupported, norm_dim, tensor_arg


def view(cx: Context) -> AtenValue:
    """``view``, ``reshape``, ``flatten``, ``squeeze``, ...: a view of the graph tensor (the node's
    output shape), no operator."""
    return cx.b.reshape(tensor_arg(cx, 0, "self"), cx.shapes[0], cx.path, cx.kind)


def transpose(cx: Context) -> AtenValue:
    """``transpose``, ``swapaxes``, ``swapdims``: two dims swapped, a relabelling."""
    v = tensor_arg(cx, 0, "self")
    n = len(v.shape)
    a, c = norm_dim(cx.args[1], n), norm_dim(cx.args[2], n)
    dims = list(range(n))
    dims[a], dims[c] = dims[c], dims[a]
    return cx.b.permute(v, dims)


def t(cx: Context) -> AtenValue:
    """``t``, ``numpy_T``: the dims reversed, a relabelling."""
    v = tensor_arg(cx, 0, "self")
    return cx.b.permute(v, list(range(len(v.shape)))[::-1])


def permute(cx: Context) -> AtenValue:
    """``permute``: the dims reordered, a relabelling."""
    return cx.b.permute(tensor_arg(cx, 0, "self"), cx.args[1])


def movedim(cx: Context) -> AtenValue:
    """``movedim``: dims moved to new positions, the others in order; a relabelling."""
    v = tensor_arg(cx, 0, "self")
    n = len(v.shape)
    src, dst = cx.args[1], cx.args[2]
    src = [src] if isinstance(src, int) else list(src)
    dst = [dst] if isinstance(dst, int) else list(dst)
    src, dst = [norm_dim(d, n) for d in src], [norm_dim(d, n) for d in dst]
    rest = iter(d for d in range(n) if d not in src)
    placed = dict(zip(dst, src))
    return cx.b.permute(v, [placed[i] if i in placed else next(rest) for i in range(n)])


def view_as_complex(cx: Context) -> AtenValue:
    """``view_as_complex``: the last dim (real, imaginary) becomes hidden."""
    v = tensor_arg(cx, 0, "self")
    return AtenValue(v.tensor, v.shape[:-1], v.perm[:-1], v.dtype_bytes, v.hidden + v.perm[-1:])


def view_as_real(cx: Context) -> AtenValue:
    """``view_as_real``: the hidden (real, imaginary) dim becomes the last dim again."""
    v = tensor_arg(cx, 0, "self")
    if len(v.hidden) != 1:
        raise Unsupported("view_as_real of a tensor that is not complex")
    return AtenValue(v.tensor, (*v.shape, 2), v.perm + v.hidden, v.dtype_bytes)
