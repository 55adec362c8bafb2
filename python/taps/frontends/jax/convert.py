"""``taps.from_jax``: a taps graph from a JAX function, through its jaxpr.

The function is traced with :func:`jax.make_jaxpr` on ``jax.ShapeDtypeStruct`` arguments, so no
array is allocated; each equation goes through its primitive's rule
(:mod:`taps.frontends.jax.rules`) and calls (``jit``, ``custom_jvp_call``, ...) are inlined.
docs/frontends.md ("JAX") has the details.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from taps._core import GraphError
from taps._support.extras import require
from taps.frontends.jax import moe
from taps.frontends.jax.builder import JaxprGraphBuilder, JaxprValue, constant
from taps.frontends.jax.rules import RULES, stack, unsupported
from taps.graph import Graph

#: Primitives whose equation runs an inner jaxpr on its operands, inlined; the parameter that
#: holds the jaxpr.
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}

UNKNOWN = ("error", "replicate")


def _import_jax() -> Any:
    jax = require("jax", "jax", "from_jax")
    require("jax.extend", "jax", "from_jax")  # Literal, to tell constants from variables
    return jax


def from_jax(
    fn: Callable[..., Any],
    *example_args: Any,
    params_argnums: int | Sequence[int] = (0,),
    grad_argnums: int | Sequence[int] = (),
    unknown: str = "error",
    split_reductions: bool = True,
    fuse: bool = True,
    name: str | None = None,
    layers: int = 1,
) -> Graph:
    """The taps graph of ``fn(*example_args)``, read from its jaxpr.

    ``example_args`` are pytrees of arrays or ``jax.ShapeDtypeStruct`` (only shapes and dtypes are
    read: nothing is allocated). The leaves of the arguments in ``params_argnums`` (default: the
    first, as in ``apply(params, x)``) are parameters, named by their pytree key path
    (``layers.0.wq``; with several parameter arguments, prefixed by the argument's name); the other
    leaves are inputs, named by the argument's name and key path. ``grad_argnums`` are input
    arguments whose gradient flows back (a layer's input standing for the previous layer's output).

    Operators are named by the ``jax.named_scope`` (and inlined function) they sit in and their
    primitive, ``attn/dot_general``, with ``.1``, ``.2``, ... for repeats. A primitive with no rule
    raises :class:`taps.GraphError` listing every unsupported primitive and where it is;
    ``unknown="replicate"`` keeps such operators whole instead (no axis may be split).

    A reduction (``reduce_sum``, ``reduce_max``, ...) may split the dims it reduces, leaving
    partial results that an all_reduce combines; ``split_reductions=False`` keeps them whole, as
    ``taps.models`` does for layer norm and softmax. ``fuse`` makes a chain of elementwise
    primitives one operator (as XLA fuses them), so a tensor the chain reads twice is not
    redistributed twice; its kind lists the primitives (``mul+erfc``).
    ``name`` and ``layers`` are the graph's (``name`` defaults to the function's name).
    """
    jax = _import_jax()
    if unknown not in UNKNOWN:
        raise GraphError(f"unknown must be 'error' or 'replicate', got {unknown!r}")
    fn_name = _name(fn)
    params = _argnums("params_argnums", params_argnums, len(example_args))
    grads = _argnums("grad_argnums", grad_argnums, len(example_args))
    both = sorted(set(params) & set(grads))
    if both:
        raise GraphError(f"arguments {both} are in both params_argnums and grad_argnums")

    def spec(leaf: Any) -> Any:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            return jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype)
        return leaf

    args = jax.tree_util.tree_map(spec, tuple(example_args))
    try:
        closed = jax.make_jaxpr(fn)(*args)
    except Exception as e:  # the user's function failed to trace: say why in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"tracing {fn_name} failed: {type(e).__name__}: {first}") from None

    b = JaxprGraphBuilder(Graph(name or fn_name, layers), split_reductions, fuse)
    arg_names = _arg_names(fn, len(example_args))
    leaves = jax.tree_util.tree_flatten_with_path(args)[0]
    values = []
    for (path, _), var in zip(leaves, closed.jaxpr.invars):
        argnum = path[0].idx
        aval = var.aval
        shape, dtype_bytes = tuple(int(d) for d in aval.shape), int(aval.dtype.itemsize)
        if argnum in params:
            prefix = arg_names[argnum] if len(params) > 1 or not path[1:] else ""
            leaf = leaf_name(prefix, path[1:])
            values.append(b.argument(leaf, shape, dtype_bytes, "parameter", True))
        else:
            leaf = leaf_name(arg_names[argnum], path[1:])
            values.append(b.argument(leaf, shape, dtype_bytes, "input", argnum in grads))

    converter = _Converter(b, jax)
    outputs = converter.run(closed.jaxpr, _consts(closed), values, "")
    # Mixture-of-experts blocks become the GShard form's operators (docs/moe.md), their top-k,
    # sorts and cumsums (which have no rule) with them.
    outputs = moe.rewrite(b, outputs)
    missing = converter.missing()
    if missing and unknown == "error":
        where = "; ".join(f"{prim} at {', '.join(places)}" for prim, places in missing.items())
        raise GraphError(
            f"{fn_name}: no rule for {len(missing)} primitive(s): {where} "
            "(unknown='replicate' keeps them whole)"
        )
    return b.emit(outputs)


def leaf_name(prefix: str, path: Sequence[Any]) -> str:
    """The graph's name of the leaf at key ``path`` of an argument: ``prefix`` (the argument's
    name; empty for the only parameter argument) and the path's keys, joined by dots."""
    import jax

    sub = jax.tree_util.keystr(tuple(path), simple=True, separator=".")
    return ".".join(p for p in (prefix, sub) if p)


def _name(fn: Callable[..., Any]) -> str:
    """The function's name, through ``functools.partial``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def _argnums(option: str, value: int | Sequence[int], count: int) -> tuple[int, ...]:
    if not isinstance(value, (int, Sequence)) or isinstance(value, str):
        raise TypeError(f"from_jax: {option} must be an int or a sequence of ints, got {value!r}")
    nums = (value,) if isinstance(value, int) else tuple(value)
    bad = [n for n in nums if not isinstance(n, int) or not -count <= n < count]
    if bad:
        raise GraphError(f"{option}: {bad} are not positions of the {count} example argument(s)")
    return tuple(n % count for n in nums)


def _arg_names(fn: Callable[..., Any], count: int) -> list[str]:
    """The function's names for its first ``count`` positional parameters (``arg<i>`` where it
    has none, as for ``*args``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(count)]
    named = [
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return [named[i] if i < len(named) else f"arg{i}" for i in range(count)]


def _scope(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def _consts(closed: Any) -> list[JaxprValue]:
    """The values of a closed jaxpr's constants (arrays it closed over): constants."""
    return [constant(tuple(getattr(c, "shape", ()))) for c in getattr(closed, "consts", ())]


class _Converter:
    """Walks a jaxpr, inlining calls and unrolling scans, and records every equation through its
    rule; the operators of primitives with no rule are kept whole (:meth:`missing`)."""

    def __init__(self, b: JaxprGraphBuilder, jax: Any) -> None:
        self.b, self.jax = b, jax
        self.unsupported: list[tuple[str, str, list[JaxprValue]]] = []

    def missing(self) -> dict[str, list[str]]:
        """The primitives with no rule whose operators are still recorded (primitive ->
        where)."""
        made = {id(r.output) for r in self.b.records}
        out: dict[str, list[str]] = {}
        for prim, where, values in self.unsupported:
            if any(id(v.source) in made for v in values):
                places = out.setdefault(prim, [])
                if where not in places:
                    places.append(where)
        return out

    def run(
        self, jaxpr: Any, consts: list[JaxprValue], args: list[JaxprValue], scope: str
    ) -> list[JaxprValue]:
        """Record the operators of ``jaxpr`` applied to ``args``; returns its output values."""
        env: dict[Any, JaxprValue] = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        literal = self.jax.extend.core.Literal

        def read(atom: Any) -> JaxprValue:
            if isinstance(atom, literal):
                return constant(tuple(getattr(atom.aval, "shape", ())))
            return env[atom]

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            prim = eqn.primitive.name
            where = _scope(scope, str(eqn.source_info.name_stack))
            if prim in _CALLS:
                inner = eqn.params[_CALLS[prim]]
                body = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr or an open Jaxpr
                called = _scope(where, str(eqn.params.get("name", "")))
                outs = self.run(body, _consts(inner), ins, called)
            elif prim == "scan":
                outs = self.unroll(eqn, ins, where)
            elif all(v.constant for v in ins) and (prim in RULES or not eqn.effects):
                outs = [constant(tuple(v.aval.shape)) for v in eqn.outvars]
            else:
                name = _scope(where, prim)
                result = RULES[prim](self.b, eqn, ins, name) if prim in RULES else None
                if result is None:
                    result = unsupported(self.b, eqn, ins, name)
                    self.unsupported.append((prim, where or "top level", result))
                outs = result
            env.update(zip(eqn.outvars, outs))
        return [read(a) for a in jaxpr.outvars]

    def unroll(self, eqn: Any, ins: list[JaxprValue], scope: str) -> list[JaxprValue]:
        """A ``scan``, one copy of its body per step under ``scan.<step>``: each step reads one
        slice of every stacked operand (:meth:`JaxprGraphBuilder.index`) and the carry of the step
        before; the per-step outputs are stacked by a ``stack`` operator."""
        p = eqn.params
        body = p["jaxpr"]
        n_fixed, n_carry = p["num_consts"], p["num_carry"]
        fixed, carry = ins[:n_fixed], ins[n_fixed : n_fixed + n_carry]
        stacked = list(zip(ins[n_fixed + n_carry :], eqn.invars[n_fixed + n_carry :]))
        steps = range(p["length"])
        per_step: list[list[JaxprValue]] = []
        for step in reversed(steps) if p["reverse"] else steps:
            where = _scope(scope, f"scan.{step}")
            xs = [
                self.b.index(f"{where}/index", v, step, int(var.aval.dtype.itemsize))
                for v, var in stacked
            ]
            outs = self.run(body.jaxpr, _consts(body), [*fixed, *carry, *xs], where)
            carry = outs[:n_carry]
            per_step.append(outs[n_carry:])
        if p["reverse"]:
            per_step.reverse()
        name = _scope(scope, "scan/stack")
        ys = [
            stack(self.b, [step[k] for step in per_step], name, eqn, n_carry + k)
            for k in range(len(eqn.outvars) - n_carry)
        ]
        return [*carry, *ys]
