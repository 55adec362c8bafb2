"""The PyTorch front end's graph builder: what the ATen rules build before anything is named.
Torch tensors are labelled views of graph tensors, and records of inputs, parameters, views and
operators become a :class:`Graph` once every name is known.

A torch tensor is an :class:`AtenValue`: a graph tensor seen through a permutation of its dims
(a transpose is a relabelling, not an operator) and maybe with dims torch does not see
(the real and imaginary parts of a complex tensor). A constant (computed the same way on every
device from no data, such as a causal mask or rotary tables) has no graph tensor at all.

Records are kept until the end because a later operator can change an earlier one: a split of a
fused projection's output into heads factors that projection's output axis (see
:meth:`AtenGraphBuilder.factor`), and names depend on how many operators a module makes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from taps._core import GraphError
from taps.graph import Graph


@dataclass(frozen=True)
class AtenValue:
    """A torch tensor as the graph sees it.

    Attributes:
        tensor: the id of its graph tensor (a :class:`TensorRecord`), or ``None`` for a constant.
        shape: the framework's shape.
        perm: for each framework dim, the dim of the graph tensor that holds it.
        dtype_bytes: bytes per element of the graph tensor.
        hidden: graph tensor dims the framework does not see (a complex tensor's real/imaginary
            pair), in order.
        hint: a name for a constant, should it ever need a graph tensor.
    """

    tensor: int | None
    shape: tuple[int, ...]
    perm: tuple[int, ...]
    dtype_bytes: int
    hidden: tuple[int, ...] = ()
    hint: str = "constant"

    @property
    def constant(self) -> bool:
        return self.tensor is None


def constant(shape: Sequence[int], dtype_bytes: int, hint: str = "constant") -> AtenValue:
    """A value computed on every device from no data: it needs no graph tensor."""
    shape = tuple(shape)
    return AtenValue(None, shape, tuple(range(len(shape))), dtype_bytes, hint=hint)


@dataclass
class TensorRecord:
    """A graph tensor to be: an input, parameter, view or operator output."""

    kind: str
    shape: tuple[int, ...]
    dtype_bytes: int
    path: str = ""
    label: str = ""  # what a generated name says (a view's op, an input's placeholder)
    name: str | None = None  # fixed names: parameters (state_dict keys), inputs
    base: int | None = None
    requires_grad: bool = False


@dataclass
class OpRecord:
    """An operator to be; ``pre`` and ``post`` are views added right before and after it (made
    when its output axis is factored after the fact)."""

    kind: str
    path: str
    inputs: list[tuple[int, tuple[str, ...]]]
    output: int
    out_dims: tuple[str, ...]
    partitionable: tuple[str, ...]
    axis_sizes: dict[str, int]
    dtype_bytes: int
    pre: list[int] = field(default_factory=list)
    post: list[int] = field(default_factory=list)
    #: How many of the last inputs are addends (a bias: ``Graph.add_operator(addends=...)``).
    addends: int = 0
    #: What the backward keeps of the output (``taps.graph.Operator.saved``).
    saved: str = "output"


def groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The dims of two shapes of one element count that a row-major reshape maps onto each
    other: minimal (dims of ``a``, dims of ``b``) pairs with equal products, in order; dims of
    size 1 belong to none."""
    ai = [i for i, s in enumerate(a) if s != 1]
    bi = [j for j, s in enumerate(b) if s != 1]
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(ai) and j < len(bi):
        src, dst = [ai[i]], [bi[j]]
        pa, pb = a[ai[i]], b[bi[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(ai):
                src.append(ai[i])
                pa *= a[ai[i]]
                i += 1
            elif pb < pa and j < len(bi):
                dst.append(bi[j])
                pb *= b[bi[j]]
                j += 1
            else:
                raise GraphError(f"cannot reshape {list(a)} to {list(b)}")
        out.append((src, dst))
    if i < len(ai) or j < len(bi):
        raise GraphError(f"cannot reshape {list(a)} to {list(b)}")
    return out


class AtenGraphBuilder:
    """Collects the records of the ATen rules; :meth:`build` names them and makes the graph."""

    def __init__(self) -> None:
        self.tensors: list[TensorRecord] = []
        self.ops: list[OpRecord] = []
        self.order: list[tuple[str, int]] = []  # ("tensor" | "op", id) in creation order

    # -- records ----------------------------------------------------------------------------

    def _tensor(self, rec: TensorRecord, listed: bool = True) -> int:
        self.tensors.append(rec)
        tid = len(self.tensors) - 1
        if listed:
            self.order.append(("tensor", tid))
        return tid

    def shape(self, tid: int) -> tuple[int, ...]:
        """The shape of graph tensor ``tid``."""
        return self.tensors[tid].shape

    def input(
        self, name: str, shape: Sequence[int], dtype_bytes: int, requires_grad: bool = False
    ) -> AtenValue:
        """A graph input (a user input of the exported program)."""
        shape = tuple(shape)
        tid = self._tensor(
            TensorRecord("input", shape, dtype_bytes, name=name, requires_grad=requires_grad)
        )
        return AtenValue(tid, shape, tuple(range(len(shape))), dtype_bytes)

    def parameter(
        self, name: str, shape: Sequence[int], dtype_bytes: int, requires_grad: bool = True
    ) -> AtenValue:
        """A parameter, named by its ``state_dict`` key (``requires_grad=False``: frozen)."""
        shape = tuple(shape)
        tid = self._tensor(
            TensorRecord("parameter", shape, dtype_bytes, name=name, requires_grad=requires_grad)
        )
        return AtenValue(tid, shape, tuple(range(len(shape))), dtype_bytes)

    def materialize(self, v: AtenValue, path: str) -> AtenValue:
        """A constant as a graph input (when an operator other than an elementwise one reads
        it); named after what made it."""
        if not v.constant:
            return v
        # A buffer keeps its name (its state_dict key); other constants are named after the
        # module that reads them.
        where = path if v.hint == "constant" else ""
        tid = self._tensor(TensorRecord("input", v.shape, v.dtype_bytes, where, v.hint))
        return replace(v, tensor=tid, perm=tuple(range(len(v.shape))))

    def _view(self, base: int, shape: tuple[int, ...], path: str, label: str) -> int:
        rec = self.tensors[base]
        return self._tensor(TensorRecord("view", shape, rec.dtype_bytes, path, label, base=base))

    def root(self, tid: int) -> int:
        """The graph tensor that ``tid`` views (itself if it is no view)."""
        while self.tensors[tid].base is not None:
            tid = self.tensors[tid].base  # type: ignore[assignment]
        return tid

    def producer(self, tid: int) -> OpRecord | None:
        """The operator whose output is ``tid``'s root, if any."""
        root = self.root(tid)
        for op in reversed(self.ops):
            if op.output == root:
                return op
        return None

    # -- operators --------------------------------------------------------------------------

    def operand(
        self, v: AtenValue, labels: Sequence[str], path: str
    ) -> tuple[int, tuple[str, ...]]:
        """The graph operand of ``v`` read with one axis label per framework dim; hidden dims
        get the labels ``ri0``, ``ri1``, ..."""
        v = self.materialize(v, path)
        assert v.tensor is not None
        if len(labels) != len(v.shape):
            raise GraphError(f"{path}: {len(labels)} labels for a rank-{len(v.shape)} tensor")
        dims: list[str] = [""] * len(self.shape(v.tensor))
        for i, label in enumerate(labels):
            dims[v.perm[i]] = label
        for k, h in enumerate(v.hidden):
            dims[h] = f"ri{k}"
        return v.tensor, tuple(dims)

    def op(
        self,
        kind: str,
        path: str,
        inputs: Sequence[tuple[AtenValue, Sequence[str]]],
        out_shape: Sequence[int],
        out_labels: Sequence[str],
        dtype_bytes: int,
        partitionable: Sequence[str] | None = None,
        order: Sequence[int] | None = None,
        hidden: Sequence[int] = (),
        addends: Sequence[tuple[AtenValue, Sequence[str]]] = (),
        saved: str = "output",
    ) -> AtenValue:
        """An operator reading ``inputs`` (each a value and a label per framework dim) and
        making a tensor of framework shape ``out_shape`` labelled ``out_labels``; ``addends``
        are inputs added after the contraction (a bias), over output labels; ``saved`` is what
        the backward keeps of the output (``taps.graph.Operator.saved``).

        ``partitionable`` defaults to every label; labels of size 1 never are. ``order`` lays
        the output's graph dims out in that order of framework dims (so a transpose that follows
        costs nothing); ``hidden`` adds trailing dims of those sizes the framework does not see
        (labelled ``ri0``, ...).

        A tensor with no elements (a dim of size 0: Phi-3's rotary slice past the head dim)
        holds no data: as an output it is a constant, as an operand it is left out."""
        out_shape = tuple(out_shape)
        if 0 in out_shape:
            return constant(out_shape, dtype_bytes)
        inputs = [(v, labels) for v, labels in inputs if 0 not in v.shape]
        addends = [(v, labels) for v, labels in addends if 0 not in v.shape]
        operands = [self.operand(v, labels, path) for v, labels in [*inputs, *addends]]
        order = tuple(range(len(out_shape))) if order is None else tuple(order)
        hidden_labels = [f"ri{k}" for k in range(len(hidden))]
        sizes = dict(zip(out_labels, out_shape))
        sizes.update(zip(hidden_labels, hidden))
        out_dims = tuple(out_labels[i] for i in order) + tuple(hidden_labels)
        known: dict[str, int] = {}
        for tid, dims in operands:
            known.update(zip(dims, self.shape(tid)))
        part_labels = [*out_labels, *known] if partitionable is None else partitionable
        part = tuple(
            dict.fromkeys(
                label
                for label in part_labels
                if known.get(label, sizes.get(label, 1)) > 1 and not label.startswith("ri")
            )
        )
        out_graph_shape = tuple(sizes[d] for d in out_dims)
        tid = self._tensor(TensorRecord("activation", out_graph_shape, dtype_bytes, path), False)
        self.ops.append(
            OpRecord(
                kind,
                path,
                operands,
                tid,
                out_dims,
                part,
                {d: sizes[d] for d in out_dims if d not in known},
                dtype_bytes,
                addends=len(addends),
                saved=saved,
            )
        )
        self.order.append(("op", len(self.ops) - 1))
        perm = tuple(order.index(i) for i in range(len(out_shape)))
        hidden_dims = tuple(range(len(out_shape), len(out_dims)))
        return AtenValue(tid, out_shape, perm, dtype_bytes, hidden_dims)

    # -- views ------------------------------------------------------------------------------

    def reshape(self, v: AtenValue, shape: Sequence[int], path: str, label: str) -> AtenValue:
        """``v`` with framework shape ``shape`` (same element count): a view of its graph tensor
        when the reshape only merges or splits dims that lie in one order in the graph tensor,
        else a copy in the framework's order first (a ``transpose`` operator)."""
        shape = tuple(shape)
        if v.constant:
            return replace(v, shape=shape, perm=tuple(range(len(shape))))
        if v.hidden:
            # The hidden dims trail the framework's: reshape with them, then hide them again.
            full = replace(
                v, shape=v.shape + (2,) * len(v.hidden), perm=v.perm + v.hidden, hidden=()
            )
            out = self.reshape(full, shape + (2,) * len(v.hidden), path, label)
            n = len(shape)
            return replace(out, shape=shape, perm=out.perm[:n], hidden=out.perm[n:])
        made = self._permuted_view(v, shape, path, label)
        if made is not None:
            return made
        copy = self.op(
            "transpose",
            path,
            [(v, [f"d{i}" for i in range(len(v.shape))])],
            v.shape,
            [f"d{i}" for i in range(len(v.shape))],
            v.dtype_bytes,
        )
        made = self._permuted_view(copy, shape, path, label)
        assert made is not None  # the copy is in framework order
        return made

    def _permuted_view(
        self, v: AtenValue, shape: tuple[int, ...], path: str, label: str
    ) -> AtenValue | None:
        assert v.tensor is not None
        pairs = groups(v.shape, shape)
        graph_shape = self.shape(v.tensor)
        for src, _ in pairs:
            # The group's dims must follow each other in the graph tensor (dims of size 1
            # between them do not matter to a row-major reshape).
            pos = [v.perm[i] for i in src]
            if any(
                q <= p or any(graph_shape[k] != 1 for k in range(p + 1, q))
                for p, q in itertools.pairwise(pos)
            ):
                return None
        dsts = [list(dst) for _, dst in pairs]
        # Dims of size 1 join the group of the dim before them (the first group if none).
        for j, size in enumerate(shape):
            if size == 1:
                before = [g for g, dst in enumerate(dsts) if dst and min(dst) < j]
                target = max(before, key=lambda g: max(d for d in dsts[g] if d < j), default=0)
                if dsts:
                    dsts[target].append(j)
                else:
                    dsts.append([j])
        starts = [v.perm[src[0]] for src, _ in pairs] or [0]
        layout = [sorted(dsts[g]) for g in sorted(range(len(dsts)), key=lambda g: starts[g])]
        taps_order = [j for dst in layout for j in dst]
        new_shape = tuple(shape[j] for j in taps_order)
        perm = tuple(taps_order.index(j) for j in range(len(shape)))
        tid = v.tensor
        if new_shape != self.shape(tid):
            tid = self._view(tid, new_shape, path, label)
        return AtenValue(tid, shape, perm, v.dtype_bytes)

    def permute(self, v: AtenValue, dims: Sequence[int]) -> AtenValue:
        """``v.permute(dims)``: a relabelling, no operator."""
        dims = [d % len(v.shape) for d in dims] if v.shape else []
        return replace(
            v, shape=tuple(v.shape[d] for d in dims), perm=tuple(v.perm[d] for d in dims)
        )

    # -- factoring --------------------------------------------------------------------------

    def factor(self, v: AtenValue, dim: int, path: str) -> None:
        """Let framework dim ``dim`` of ``v`` be an axis of the operator that made it.

        When ``v`` views an operator's output and ``dim`` is one piece of an output dim that the
        views split (the heads of a fused QKV projection, ``(3h) -> (3, h)``), that output dim
        becomes one axis per piece in the operator, with views of its operands to match. A
        strategy can then split a projection by heads, as Megatron-LM does for a fused QKV
        weight by storing its columns head by head. The axis of ``dim`` itself (q, k or v)
        stays whole: whatever splits the tensor along it reads it whole."""
        if v.constant or v.hidden:
            return
        assert v.tensor is not None
        op = self.producer(v.tensor)
        if op is None:
            return
        root = op.output
        pieces = next(
            (
                (src, dst)
                for src, dst in groups(self.shape(root), self.shape(v.tensor))
                if v.perm[dim] in dst
            ),
            None,
        )
        # Only an operator's last output dim (its features: a projection's out axis) is
        # factored; a split of rows or batch needs no new axis.
        last = len(self.shape(root)) - 1
        if pieces is None or pieces[0] != [last] or len(pieces[1]) < 2:
            return
        r, sizes = pieces[0][0], [self.shape(v.tensor)[j] for j in pieces[1]]
        label = op.out_dims[r]
        taken = {d for _, dims in op.inputs for d in dims} | set(op.out_dims)
        new = []
        for k in range(len(sizes)):
            name = f"{label}{k}"
            while name in taken:
                name += "'"
            taken.add(name)
            new.append(name)

        def split(dims: tuple[str, ...], shape: tuple[int, ...]) -> tuple[tuple[str, ...], tuple]:
            q = dims.index(label)
            return (
                dims[:q] + tuple(new) + dims[q + 1 :],
                shape[:q] + tuple(sizes) + shape[q + 1 :],
            )

        inputs = []
        for tid, dims in op.inputs:
            if label in dims:
                dims, shape = split(dims, self.shape(tid))
                tid = self._tensor(
                    TensorRecord(
                        "view", shape, self.tensors[tid].dtype_bytes, op.path, "factored", base=tid
                    ),
                    listed=False,
                )
                op.pre.append(tid)
            inputs.append((tid, dims))
        out_dims, out_shape = split(op.out_dims, self.shape(root))
        out = self._tensor(TensorRecord("activation", out_shape, op.dtype_bytes, op.path), False)
        old = self.tensors[root]
        self.tensors[root] = replace(old, kind="view", base=out, label="unfactored")
        op.inputs, op.output, op.out_dims = inputs, out, out_dims
        op.post.insert(0, root)
        if label in op.partitionable:
            # The piece being split off stays whole: its reader keeps it whole anyway.
            whole = new[pieces[1].index(v.perm[dim])]
            i = op.partitionable.index(label)
            op.partitionable = (
                op.partitionable[:i]
                + tuple(n for n, s in zip(new, sizes) if s > 1 and n != whole)
                + op.partitionable[i + 1 :]
            )
        if label in op.axis_sizes:
            del op.axis_sizes[label]
            op.axis_sizes.update(zip(new, sizes))

    # -- the graph --------------------------------------------------------------------------

    def build(self, name: str) -> tuple[Graph, list[str]]:
        """The graph, and the name of each operator record in record order.

        Parameters and inputs keep their names. An operator is named after its module path when
        it is the only one that module makes, else ``path.kind``; views and constants
        ``path.label``; clashes get ``_2``, ``_3``, ... (a name and its ``.out`` are both
        checked)."""
        g = Graph(name=name)
        count = Counter(op.path for op in self.ops)
        used = {rec.name for rec in self.tensors if rec.name is not None}

        def fresh(path: str, label: str, single: bool = False) -> str:
            base = path if single and path else f"{path}.{label}" if path else label
            candidate, k = base, 2
            while candidate in used or f"{candidate}.out" in used:
                candidate, k = f"{base}_{k}", k + 1
            used.update((candidate, f"{candidate}.out"))
            return candidate

        names: dict[int, str] = {}
        op_names = [""] * len(self.ops)

        def tensor(tid: int) -> None:
            rec = self.tensors[tid]
            if rec.kind == "parameter":
                assert rec.name is not None
                names[tid] = g.parameter(
                    rec.name, rec.shape, rec.dtype_bytes, rec.requires_grad
                ).name
            elif rec.kind == "input":
                label = rec.name or fresh(rec.path, rec.label)
                names[tid] = g.input(label, rec.shape, rec.dtype_bytes, rec.requires_grad).name
            else:
                assert rec.base is not None
                names[tid] = g.reshape(fresh(rec.path, rec.label), names[rec.base], rec.shape).name

        for what, i in self.order:
            if what == "tensor":
                tensor(i)
                continue
            op = self.ops[i]
            for tid in op.pre:
                tensor(tid)
            op_names[i] = fresh(op.path, op.kind, single=count[op.path] == 1)
            operands = [(names[tid], dims) for tid, dims in op.inputs]
            factors = len(operands) - op.addends
            names[op.output] = g.add_operator(
                op_names[i],
                op.kind,
                operands[:factors],
                op.out_dims,
                op.partitionable,
                op.axis_sizes,
                op.dtype_bytes,
                addends=operands[factors:],
                saved=op.saved,
            ).name
            for tid in op.post:
                tensor(tid)
        return g, op_names
