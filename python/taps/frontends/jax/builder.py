"""The graph a jaxpr becomes, built in two passes: record operators and views over symbolic values,
then emit them through the public :class:`taps.Graph` API.

A jaxpr value is not always a graph tensor: a transpose, a broadcast or a squeeze only relabels the
dims of a tensor, so a :class:`JaxprValue` is a *source* tensor plus, for each of its dims, which
axis of the source it reads (or none: a broadcast dim). Operators read sources with axis labels, so
those relabellings cost nothing. Only a reshape needs the source's dims in a fixed row-major order;
an operator's output has no order of its own until a reshape asks for one, which is why emission
waits for the end: the reshape then becomes a view of the operator's output with no copy in between.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from taps._core import GraphError
from taps.graph import Graph


@dataclass(frozen=True)
class _Argument:
    """What makes an example argument's leaf a graph input or parameter."""

    name: str
    kind: str  # "input" or "parameter"
    dtype_bytes: int
    requires_grad: bool


@dataclass(eq=False)
class Source:
    """A graph tensor to be: an example argument, an operator's output or a view.

    Attributes:
        sizes: the size of each of its axes (its logical dims).
        order: the axes in the tensor's row-major dim order; ``None`` for an operator output that
            no reshape has read yet (any order will do, the identity at emission).
        tensor: the graph tensor's name, once it exists.
        argument: for an example argument's leaf (or one slice of it), its graph input or
            parameter.
        slices: for an argument, the slices a ``scan`` takes of it, by index along ``axis``.
    """

    sizes: tuple[int, ...]
    order: tuple[int, ...] | None = None
    tensor: str | None = None
    argument: _Argument | None = None
    slices: dict[int, Source] = field(default_factory=dict)
    axis: int = 0


@dataclass(frozen=True)
class JaxprValue:
    """A jaxpr value: ``source`` read through ``dims``, the source axis behind each of its dims
    (``None`` for a broadcast dim). A value with no source is a constant: it depends on no
    example argument (literals, iota, closed-over arrays), and operators drop it as an operand."""

    source: Source | None
    dims: tuple[int | None, ...]
    shape: tuple[int, ...]

    @property
    def constant(self) -> bool:
        return self.source is None


def constant(shape: tuple[int, ...]) -> JaxprValue:
    """A value that depends on no example argument."""
    return JaxprValue(None, (None,) * len(shape), shape)


@dataclass(frozen=True)
class _Operand:
    source: Source
    labels: tuple[str, ...]  # in the source's axis order
    whole: bool  # read as it is, by an elementwise operator of its shape: it may fuse


@dataclass(frozen=True)
class _OpRecord:
    name: str
    kind: str
    operands: tuple[_Operand, ...]
    output: Source
    out_labels: tuple[str, ...]  # in the output source's axis order
    sizes: dict[str, int]
    partitionable: tuple[str, ...]
    dtype_bytes: int
    fusible: bool
    saved: str = "output"


@dataclass(frozen=True)
class _ViewRecord:
    name: str
    base: Source
    output: Source


@dataclass
class JaxprGraphBuilder:
    """Records operators and views over :class:`JaxprValue` s; :meth:`emit` adds them to a graph.
    ``split_reductions`` (the rules' choice for reduced dims) and ``fuse`` (elementwise chains
    become one operator) are the options of :func:`taps.frontends.jax.convert.from_jax`."""

    graph: Graph
    split_reductions: bool = True
    fuse: bool = True
    _records: list[_OpRecord | _ViewRecord] = field(default_factory=list)
    _arguments: list[Source] = field(default_factory=list)
    _used: set[str] = field(default_factory=set)

    def unique(self, name: str) -> str:
        """``name``, or ``name.1``, ``name.2``, ... if taken (with its ``.out`` tensor)."""
        candidate, k = name, 0
        while candidate in self._used or f"{candidate}.out" in self._used:
            k += 1
            candidate = f"{name}.{k}"
        self._used.update((candidate, f"{candidate}.out"))
        return candidate

    def argument(
        self, name: str, shape: tuple[int, ...], dtype_bytes: int, kind: str, requires_grad: bool
    ) -> JaxprValue:
        """An example argument's leaf: a graph input or parameter (added by :meth:`emit`)."""
        if name in self._used:
            raise GraphError(
                f"two example arguments are both named {name!r}: rename the function's parameter "
                "or the pytree key"
            )
        self._used.add(name)
        identity = tuple(range(len(shape)))
        source = Source(
            tuple(shape), identity, argument=_Argument(name, kind, dtype_bytes, requires_grad)
        )
        self._arguments.append(source)
        return JaxprValue(source, identity, tuple(shape))

    def index(self, name: str, value: JaxprValue, i: int, dtype_bytes: int) -> JaxprValue:
        """``value[i]``, as a ``scan`` hands its body one slice of each stacked operand per step.
        A slice of an example argument is an argument of its own, ``name.i`` (so a stack of
        per-layer weights becomes per-layer parameters, which need no operator to read); a
        slice of anything else is an ``index`` operator, the stacked dim whole."""
        shape = value.shape[1:]
        axis = value.dims[0]
        if value.source is None:
            return constant(shape)
        source = value.source
        if axis is None:  # a broadcast along the scanned dim: every step reads the same
            return JaxprValue(source, value.dims[1:], shape)
        rest = tuple(d if d is None or d < axis else d - 1 for d in value.dims[1:])
        arg = source.argument
        if arg is not None and (not source.slices or source.axis == axis):
            source.axis = axis
            if i not in source.slices:
                sizes = source.sizes[:axis] + source.sizes[axis + 1 :]
                piece = _Argument(
                    self.unique(f"{arg.name}.{i}"), arg.kind, arg.dtype_bytes, arg.requires_grad
                )
                source.slices[i] = Source(sizes, tuple(range(len(sizes))), argument=piece)
            return JaxprValue(source.slices[i], rest, shape)
        labels = tuple(f"d{j}" for j in range(len(shape)))
        return self.op(name, "index", [(value, ("i", *labels))], labels, shape, dtype_bytes)

    def op(
        self,
        name: str,
        kind: str,
        inputs: list[tuple[JaxprValue, tuple[str, ...]]],
        out_labels: tuple[str, ...],
        out_shape: tuple[int, ...],
        dtype_bytes: int,
        partitionable: tuple[str, ...] | None = None,
        fusible: bool = False,
        saved: str = "output",
    ) -> JaxprValue:
        """An operator reading each input value with one label per value dim, writing a new tensor
        with ``out_labels``; ``partitionable=None`` means every label. Constant inputs are not
        operands, and an operand read twice is read once; an operator of constants only is a
        constant. Labels of size 1 are never split. ``fusible``: an elementwise operator, which
        :meth:`emit` may fuse with the elementwise operators that feed it; ``saved``: what the
        backward keeps of the output (``taps.graph.Operator.saved``)."""
        sizes = dict(zip(out_labels, out_shape))
        operands: dict[tuple[int, tuple[str, ...]], _Operand] = {}
        fresh = 0
        for value, labels in inputs:
            if value.source is None:
                continue
            by_axis = {a: label for a, label in zip(value.dims, labels) if a is not None}
            axis_labels = []
            for a, size in enumerate(value.source.sizes):
                if a in by_axis:
                    label = by_axis[a]
                else:  # a size-1 dim the value squeezed away
                    label, fresh = f"_{fresh}", fresh + 1
                sizes.setdefault(label, size)
                axis_labels.append(label)
            whole = value.dims == tuple(range(len(value.shape))) and value.shape == out_shape
            key = (id(value.source), tuple(axis_labels))
            operands[key] = _Operand(value.source, tuple(axis_labels), fusible and whole)
        if not operands:
            return constant(out_shape)
        used = {label for o in operands.values() for label in o.labels} | set(out_labels)
        sizes = {label: size for label, size in sizes.items() if label in used}
        wanted = sizes if partitionable is None else partitionable
        part = tuple(label for label in sizes if label in wanted and sizes[label] > 1)
        output = Source(tuple(out_shape))
        record = _OpRecord(
            self.unique(name),
            kind,
            tuple(operands.values()),
            output,
            out_labels,
            sizes,
            part,
            dtype_bytes,
            fusible,
            saved,
        )
        self._records.append(record)
        return JaxprValue(output, tuple(range(len(out_shape))), tuple(out_shape))

    @property
    def records(self) -> list[_OpRecord | _ViewRecord]:
        """The operators and views recorded so far, in recording (topological) order."""
        return list(self._records)

    def splice(
        self,
        start: int,
        removed: set[int],
        at: int,
        replaced: dict[int, Source],
        outputs: list[JaxprValue],
    ) -> list[JaxprValue]:
        """Replace a part of the records by the records made since record ``start``, put where
        record ``at`` was: the records whose ids are in ``removed`` go, readers of a source in
        ``replaced`` (by id) read its replacement, and reads of a removed record's other outputs
        are dropped (they depend on nothing kept: constants), a record left with no operand
        going too. Returns ``outputs`` (the function's) read the same way."""
        made, old = self._records[start:], self._records[:start]
        gone = {id(r.output) for r in old if id(r) in removed} - set(replaced)
        kept: list[_OpRecord | _ViewRecord] = []
        for i, record in enumerate(old):
            if i == at:
                kept.extend(made)
            if id(record) in removed:
                continue
            reads = (
                [record.base]
                if isinstance(record, _ViewRecord)
                else [o.source for o in record.operands]
            )
            if not any(id(x) in gone or id(x) in replaced for x in reads):
                kept.append(record)  # untouched: the same record
                continue
            if isinstance(record, _ViewRecord):
                if id(record.base) in gone:
                    gone.add(id(record.output))
                    continue
                base = replaced.get(id(record.base), record.base)
                kept.append(dataclasses.replace(record, base=base))
                continue
            operands = tuple(
                dataclasses.replace(o, source=replaced.get(id(o.source), o.source))
                for o in record.operands
                if id(o.source) not in gone
            )
            if not operands:
                gone.add(id(record.output))
                continue
            used = {label for o in operands for label in o.labels} | set(record.out_labels)
            kept.append(
                dataclasses.replace(
                    record,
                    operands=operands,
                    sizes={k: n for k, n in record.sizes.items() if k in used},
                    partitionable=tuple(k for k in record.partitionable if k in used),
                )
            )
        self._records = kept

        def read(v: JaxprValue) -> JaxprValue:
            if v.source is None or id(v.source) in gone:
                return constant(v.shape)
            return dataclasses.replace(v, source=replaced.get(id(v.source), v.source))

        return [read(v) for v in outputs]

    def copy(self, name: str, value: JaxprValue, dtype_bytes: int) -> JaxprValue:
        """Materialise ``value`` (a transpose or broadcast of its source) as a tensor of its own
        shape, in row-major order."""
        labels = tuple(f"d{i}" for i in range(len(value.shape)))
        out = self.op(name, "copy", [(value, labels)], labels, value.shape, dtype_bytes)
        assert out.source is not None
        out.source.order = tuple(range(len(value.shape)))
        return out

    def reshape(
        self, name: str, value: JaxprValue, shape: tuple[int, ...], dtype_bytes: int
    ) -> JaxprValue:
        """``value`` with another shape of the same element count: a relabelling when only size-1
        dims come or go, else a view of the source in the value's dim order (a copy first when the
        source is already fixed in another order or the value broadcasts)."""
        if value.source is None:
            return constant(shape)
        if [s for s in value.shape if s != 1] == [s for s in shape if s != 1]:
            kept = iter(a for a, s in zip(value.dims, value.shape) if s != 1)
            return JaxprValue(
                value.source, tuple(next(kept) if s != 1 else None for s in shape), shape
            )
        source = value.source
        wanted = [a for a, s in zip(value.dims, value.shape) if s != 1]
        axes = [a for a in wanted if a is not None]
        if len(axes) == len(wanted) and source.order is None:
            source.order = (*axes, *(a for a in range(len(source.sizes)) if a not in axes))
        elif len(axes) < len(wanted) or [a for a in source.order or () if a in axes] != axes:
            copied = self.copy(f"{name}.copy", value, dtype_bytes).source
            assert copied is not None
            source = copied
        view = Source(shape, tuple(range(len(shape))))
        self._records.append(_ViewRecord(self.unique(name), source, view))
        return JaxprValue(view, tuple(range(len(shape))), shape)

    def _fused(
        self, records: list[_OpRecord | _ViewRecord], outputs: list[JaxprValue]
    ) -> list[_OpRecord | _ViewRecord]:
        """The records with each elementwise operator fused into the elementwise operator that
        reads it, when that is its only reader (a compiler fuses such chains; fusing a tensor
        with more readers would recompute it for each). The fused operator reads the operands of
        both once, so a tensor the chain reads twice costs one edge."""
        readers: dict[int, set[int]] = {id(v.source): {-1} for v in outputs if v.source}
        for record in records:
            reads = (
                [record.base]
                if isinstance(record, _ViewRecord)
                else [o.source for o in record.operands]
            )
            for source in reads:
                readers.setdefault(id(source), set()).add(id(record))
        makers: dict[int, _OpRecord] = {}
        out: list[_OpRecord | _ViewRecord] = []
        absorbed: set[int] = set()
        for record in records:
            if isinstance(record, _ViewRecord) or not record.fusible:
                out.append(record)
                continue
            operands: dict[tuple[int, tuple[str, ...]], _Operand] = {}
            sizes, kinds = dict(record.sizes), [record.kind]
            for o in record.operands:
                maker = makers.pop(id(o.source), None)
                if maker is None or not o.whole or readers[id(o.source)] != {id(record)}:
                    if maker is not None:
                        makers[id(o.source)] = maker
                    operands.setdefault((id(o.source), o.labels), o)
                    continue
                absorbed.add(id(maker))
                rename = dict(zip(maker.out_labels, o.labels))
                for label, size in maker.sizes.items():
                    if label not in rename:
                        rename[label] = f"_f{len(sizes)}"
                    sizes.setdefault(rename[label], size)
                kinds = [*maker.kind.split("+"), *kinds]
                for m in maker.operands:
                    labels = tuple(rename[x] for x in m.labels)
                    operands.setdefault((id(m.source), labels), _Operand(m.source, labels, m.whole))
            if len(kinds) > 1:
                record = dataclasses.replace(
                    record,
                    kind="+".join(dict.fromkeys(kinds)),
                    operands=tuple(operands.values()),
                    sizes=sizes,
                )
            makers[id(record.output)] = record
            out.append(record)
        return [record for record in out if id(record) not in absorbed]

    def _live(
        self, records: list[_OpRecord | _ViewRecord], outputs: list[JaxprValue]
    ) -> tuple[list[_OpRecord | _ViewRecord], set[int]]:
        """The records whose output reaches the function's outputs, and the ids of every source
        they (or the outputs) read: computations that reach no output cost nothing."""
        live = {id(v.source) for v in outputs if v.source is not None}
        kept = []
        for record in reversed(records):
            if id(record.output) not in live:
                continue
            kept.append(record)
            if isinstance(record, _ViewRecord):
                live.add(id(record.base))
            else:
                live.update(id(o.source) for o in record.operands)
        return kept[::-1], live

    def _emit_arguments(self, live: set[int]) -> None:
        """Every example argument's leaf as an input or parameter, whether it is used or not (so
        the graph's parameters are the pytree's). A leaf a ``scan`` slices is its slices, unless
        it is also read whole: then the slices read are ``index`` operators reading it."""
        g = self.graph

        def add(source: Source) -> None:
            arg = source.argument
            assert arg is not None
            if arg.kind == "parameter":
                source.tensor = g.parameter(arg.name, source.sizes, arg.dtype_bytes).name
            else:
                source.tensor = g.input(
                    arg.name, source.sizes, arg.dtype_bytes, arg.requires_grad
                ).name

        def place(source: Source, made: bool) -> None:
            """Add ``source`` if it is read whole or not sliced (``made``: it is already an
            operator's output), then its slices."""
            if not made and (id(source) in live or not source.slices):
                add(source)
                made = True
            for _, piece in sorted(source.slices.items()):
                if made and (id(piece) in live or piece.slices):
                    assert piece.argument is not None and source.tensor is not None
                    labels = [f"d{j}" for j in range(len(piece.sizes))]
                    dims = [*labels]
                    dims.insert(source.axis, "i")
                    piece.tensor = g.add_operator(
                        piece.argument.name,
                        "index",
                        [(source.tensor, dims)],
                        labels,
                        [x for x, n in zip(labels, piece.sizes) if n > 1],
                    ).name
                place(piece, made)
            if not made and source.slices:  # a stack only its slices stand for: named as one
                assert source.argument is not None
                pieces = [p.argument.name for _, p in sorted(source.slices.items()) if p.argument]
                g.stack(source.argument.name, pieces, source.axis)

        for source in self._arguments:
            place(source, False)

    def emit(self, outputs: list[JaxprValue]) -> Graph:
        """Add the example arguments, then the recorded operators (elementwise chains fused,
        :meth:`_fused`) and views that reach ``outputs`` (the function's), to the graph in
        recording (topological) order."""
        g = self.graph
        records, live = self._live(self._records, outputs)
        if self.fuse:
            records, live = self._live(self._fused(records, outputs), outputs)
        self._emit_arguments(live)
        for record in records:
            out = record.output
            if out.order is None:
                out.order = tuple(range(len(out.sizes)))
            if isinstance(record, _ViewRecord):
                base = record.base
                assert base.tensor is not None
                out.tensor = g.reshape(record.name, base.tensor, out.sizes).name
                continue
            inputs = []
            for o in record.operands:
                assert o.source.tensor is not None and o.source.order is not None
                inputs.append((o.source.tensor, tuple(o.labels[a] for a in o.source.order)))
            out.tensor = g.add_operator(
                record.name,
                record.kind,
                inputs,
                tuple(record.out_labels[a] for a in out.order),
                record.partitionable,
                record.sizes,
                record.dtype_bytes,
                saved=record.saved,
            ).name
        g.share_parameters()
        return g
