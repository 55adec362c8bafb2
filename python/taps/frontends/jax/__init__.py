"""The JAX front end: a JAX function as a taps graph, read from its jaxpr.

- :mod:`.convert`: :func:`from_jax`, which traces the function and walks its jaxpr (calls
  inlined, scans unrolled);
- :mod:`.rules`: one rule per JAX primitive;
- :mod:`.builder`: :class:`~.builder.JaxprGraphBuilder`, which records the rules' operators over
  jaxpr values and emits them into the graph.

jax itself is imported inside the calls (``pip install 'taps[jax]'``).
"""

from taps.frontends.jax.convert import from_jax

__all__ = ["from_jax"]
