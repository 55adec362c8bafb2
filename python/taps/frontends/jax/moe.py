"""Mixture-of-experts blocks of a jaxpr, found in the recorded operators and made the GShard
form's operators (:mod:`taps.frontends.gshard`, docs/moe.md "JAX").

A jaxpr has no modules, so a block is found by its data flow, from each ``top_k`` (or
``approx_top_k``) on:

- ``e`` is the width the top-k chooses from; the experts' weights are the parameters of rank 3
  whose first dim is ``e``;
- the router is the nearest ``dot_general`` above the top-k; what it multiplies with a
  parameter are the block's tokens;
- the block's output is the first operator after the top-k that depends on the experts'
  weights and on every top-k output the model reads (its indices and, when read, its values)
  and has the tokens' shape (a combine einsum, a ``segment_sum``);
- its *routed part* is every operator the output depends on that depends on the top-k or the
  experts' weights: one-hot masks, ``cumsum`` slots, ``argsort``, gathers, einsums or
  ``ragged_dot`` s of the experts, scatters. It is replaced by the GShard operators, made where
  the output was. What it reads from outside is told apart by size: the tokens, the router's
  scores (``e`` per token, read by ``moe_route``), other token-sized tensors (added to the
  combine).

The capacity ``c`` is the model's: the tokens the routed part first makes of the tokens
(a GShard dispatch's ``egcm``, a sorted dispatch's ``k`` copies of each token) per expert and
group, at most the group's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from taps._core import GraphError
from taps.frontends.gshard import Experts, gshard
from taps.frontends.jax.builder import JaxprGraphBuilder, JaxprValue, Source

#: The primitives of a router's choice of experts.
TOP_K = ("top_k", "approx_top_k")

#: The experts' activation by the primitives the jaxpr spells it with, in the order asked.
_ACTIVATIONS = (
    ("logistic", "silu"),
    ("erf", "gelu"),
    ("erfc", "gelu"),
    ("tanh", "gelu"),
    ("max", "relu"),
)


class _Ops:
    """The builder as :func:`gshard` calls it: operators named ``<path>/<kind>``."""

    def __init__(self, b: JaxprGraphBuilder, dtype_bytes: int) -> None:
        self.b, self.dtype_bytes = b, dtype_bytes

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
    ) -> JaxprValue:
        """An operator of the GShard form (without addends: a JAX block's experts' biases are
        not recognised)."""
        if addends:
            raise GraphError(f"{path}: the JAX front end reads no experts' biases")
        return self.b.op(
            f"{path}/{kind}" if path else kind,
            kind,
            [(v, tuple(labels)) for v, labels in inputs],
            tuple(out_labels),
            tuple(out_shape),
            dtype_bytes,
            None if partitionable is None else tuple(partitionable),
            saved=saved,
        )

    def reshape(self, v: JaxprValue, shape: Sequence[int], path: str, label: str) -> JaxprValue:
        """``v`` in another shape (a view)."""
        return self.b.reshape(f"{path}/{label}", v, tuple(shape), self.dtype_bytes)


def rewrite(b: JaxprGraphBuilder, outputs: list[JaxprValue]) -> list[JaxprValue]:
    """Replace every mixture-of-experts block recorded in ``b`` by its GShard operators;
    returns the function's ``outputs`` read after the change. A top-k with no experts' weights
    after it is left as it is."""
    seen: set[int] = set()
    while True:
        records = b.records
        at = next(
            (
                i
                for i, r in enumerate(records)
                if getattr(r, "kind", "") in TOP_K and id(r) not in seen
            ),
            None,
        )
        if at is None:
            return outputs
        seen.add(id(records[at]))
        made = _Block(records, at).replace(b, outputs)
        if made is not None:
            outputs = made


def _whole(source: Source) -> JaxprValue:
    return JaxprValue(source, tuple(range(len(source.sizes))), source.sizes)


def _scope(name: str) -> str:
    return name.rpartition("/")[0]


class _Block:
    """The analysis of the block of the top-k at ``records[at]``."""

    def __init__(self, records: list[Any], at: int) -> None:
        self.records, self.at = records, at
        self.maker = {id(r.output): i for i, r in enumerate(records)}

    def reads(self, record: Any) -> list[Source]:
        """The sources ``record`` reads."""
        return [record.base] if hasattr(record, "base") else [o.source for o in record.operands]

    def root(self, source: Source) -> Source:
        """``source`` through the views it is made by."""
        while id(source) in self.maker and hasattr(self.records[self.maker[id(source)]], "base"):
            source = self.records[self.maker[id(source)]].base
        return source

    def dtype_bytes(self, source: Source) -> int:
        """Bytes per element of a source (of its root: views keep the dtype)."""
        source = self.root(source)
        if source.argument is not None:
            return source.argument.dtype_bytes
        return int(self.records[self.maker[id(source)]].dtype_bytes)

    def cone(self, starts: set[int], first: int) -> set[int]:
        """Ids of the sources that depend on the sources ``starts``, from record ``first``."""
        out = set(starts)
        for r in self.records[first:]:
            if any(id(s) in out for s in self.reads(r)):
                out.add(id(r.output))
        return out

    def router_tokens(self, topk: Any) -> Source:
        """The tokens: what the nearest ``dot_general`` above the top-k multiplies with a
        parameter."""
        todo, done = list(self.reads(topk)), set()
        while todo:
            source = todo.pop(0)
            if id(source) in done or id(source) not in self.maker:
                continue
            done.add(id(source))
            record = self.records[self.maker[id(source)]]
            if getattr(record, "kind", "") == "dot_general":
                roots = [self.root(s) for s in self.reads(record)]
                params = [r for r in roots if r.argument and r.argument.kind == "parameter"]
                rest = [r for r in roots if r not in params]
                if params and len(rest) == 1:
                    return rest[0]
            todo.extend(self.reads(record))
        raise GraphError(
            f"the top-k {topk.name} reads no router (a dot_general of the tokens and a weight)"
        )

    def replace(self, b: JaxprGraphBuilder, outputs: list[JaxprValue]) -> list[JaxprValue] | None:
        """Make the block's operators and splice them in (:meth:`JaxprGraphBuilder.splice`);
        None when the top-k has no experts' weights after it."""
        records, topk = self.records, self.records[self.at]
        n = len(topk.out_labels)
        experts = topk.sizes.get(f"x0_{n - 1}")
        k = topk.sizes[topk.out_labels[-1]]
        if experts is None:
            return None
        weights = {
            id(s): s
            for r in records
            for s in map(self.root, self.reads(r))
            if s.argument is not None
            and s.argument.kind == "parameter"
            and len(s.sizes) == 3
            and s.sizes[0] == experts
        }
        if not weights:
            return None
        # Every top-k reading what this one reads is one routing (values and indices).
        starts = {
            id(r.output)
            for r in records[self.at :]
            if getattr(r, "kind", "") in TOP_K and r.operands == topk.operands
        }
        routing = self.cone(starts, self.at)
        # The block's experts read what the routing made (an earlier block's experts do not).
        weights = {
            id(w): w
            for r in records[self.at :]
            if any(id(s) in routing for s in self.reads(r))
            for w in map(self.root, self.reads(r))
            if id(w) in weights
        }
        expert_cone = self.cone(set(weights), 0)
        tokens = self.router_tokens(topk)
        token_shapes = {tuple(d for d in tokens.sizes if d != 1)} | {
            tuple(d for d in r.output.sizes if d != 1)
            for r in records
            if hasattr(r, "base") and self.root(r.base) is tokens
        }
        # The output depends on every top-k output the model reads: a token-sized tensor of the
        # experts before their routing weights apply (top-1) is not yet the output.
        read = {id(s) for r in records for s in self.reads(r)}
        needed = {i for i in starts if i in read}
        last = next(
            (
                i
                for i, r in enumerate(records[self.at :], self.at)
                if id(r.output) in routing
                and id(r.output) in expert_cone
                and tuple(d for d in r.output.sizes if d != 1) in token_shapes
                and needed <= {id(records[j].output) for j in self.ancestors(i)}
            ),
            None,
        )
        if last is None:
            return None
        routed = self.ancestors(last) & {
            i for i, r in enumerate(records) if id(r.output) in routing | expert_cone
        }
        return self.emit(b, outputs, sorted(routed), last, tokens, weights, experts, k)

    def ancestors(self, last: int) -> set[int]:
        """Indices of the records record ``last`` depends on, itself included."""
        out, todo = set(), [last]
        while todo:
            i = todo.pop()
            if i in out:
                continue
            out.add(i)
            todo.extend(
                self.maker[id(s)] for s in self.reads(self.records[i]) if id(s) in self.maker
            )
        return out

    def emit(
        self,
        b: JaxprGraphBuilder,
        outputs: list[JaxprValue],
        routed: list[int],
        last: int,
        tokens: Source,
        weights: dict[int, Source],
        experts: int,
        k: int,
    ) -> list[JaxprValue]:
        """The GShard operators of the routed records (indices, in order) ending at ``last``."""
        records = self.records
        members = {id(records[i].output) for i in routed}
        lead, width = tokens.sizes[:-1], tokens.sizes[-1]
        groups = lead[0] if len(lead) >= 2 else 1
        seq = math.prod(lead) // groups
        path = _common(records[i].name for i in routed) or "moe"
        scores: dict[int, Source] = {}
        extras: dict[int, Source] = {}
        used: dict[int, int] = {}  # expert weight id -> first routed record reading it
        capacity = None
        for i in routed:
            for s in self.reads(records[i]):
                if id(s) in members:
                    continue
                root = self.root(s)
                if id(root) in weights:
                    used.setdefault(id(root), i)
                    continue
                if root is tokens:
                    if capacity is None:
                        size = math.prod(records[i].output.sizes)
                        capacity = min(seq, max(1, math.ceil(size / (width * experts * groups))))
                    continue
                size = math.prod(root.sizes)
                if size == groups * seq * experts and root.sizes[-1] == experts:
                    scores.setdefault(id(root), root)
                elif size == groups * seq * width and root.sizes[-1] == width:
                    extras.setdefault(id(root), root)
                else:
                    what = (
                        root.argument.name if root.argument else records[self.maker[id(root)]].name
                    )
                    raise GraphError(
                        f"the mixture-of-experts block {path}: its routed part reads {what} of "
                        f"shape {list(root.sizes)}, neither its tokens, its router's scores nor "
                        "its experts' weights"
                    )
        ordered = sorted(used, key=used.__getitem__)
        expert_cone = self.cone(set(ordered), 0)
        kinds = {records[i].kind for i in routed if id(records[i].output) in expert_cone}
        activation = next((act for prim, act in _ACTIVATIONS if prim in kinds), "silu")
        topk = records[self.at]
        dtype = self.dtype_bytes(tokens)
        ops = _Ops(b, dtype)
        start = len(b.records)
        block = Experts(
            path,
            _scope(topk.name) or path,
            tuple((path, _whole(weights[w])) for w in ordered),
            activation,
            experts,
            k,
            capacity or math.ceil(k * seq / experts),
            out_first=False,
        )
        x = ops.reshape(_whole(tokens), (groups, seq, width), path, "tokens")
        gse = [
            ops.reshape(_whole(s), (groups, seq, experts), block.router, "scores")
            for s in scores.values()
        ]
        shared = [
            ops.reshape(_whole(s), (groups, seq, width), path, "shared") for s in extras.values()
        ]
        score_bytes = self.dtype_bytes(next(iter(scores.values()))) if scores else dtype
        out = gshard(ops, block, x, gse, shared, dtype, score_bytes)
        end = records[last].output
        if end.order not in (None, tuple(range(len(end.sizes)))):
            raise GraphError(
                f"the mixture-of-experts block {path}: its output {records[last].name} is read "
                "in another dim order than it is made in"
            )
        made = ops.reshape(out, end.sizes, path, "output")
        if (
            made.dims != tuple(range(len(end.sizes)))
            or made.source is None
            or made.source.sizes != end.sizes
        ):
            made = b.copy(f"{path}/output", made, dtype)
        assert made.source is not None
        removed = {id(records[i]) for i in routed}
        return b.splice(start, removed, last, {id(end): made.source}, outputs)


def _common(names: Any) -> str:
    """The longest scope (``a/b``) all ``names`` sit in."""
    scopes = [_scope(n).split("/") for n in names]
    if not scopes:
        return ""
    prefix = scopes[0]
    for s in scopes[1:]:
        while s[: len(prefix)] != prefix:
            prefix = prefix[:-1]
    return "/".join(p for p in prefix if p)
