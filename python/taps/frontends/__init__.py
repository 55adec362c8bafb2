"""Real models in: a PyTorch module (torch.export) or a JAX function (its jaxpr) as a taps graph.

One package per framework:

- :mod:`taps.frontends.torch`: ``torch.export`` a module and convert its training IR
  (``module.py`` the entry points, ``program.py`` the driver, ``rules/`` one rule per ATen
  operator in a module per family, ``builder.py`` the graph builder, ``blocks.py`` the repeated
  blocks to tie);
- :mod:`taps.frontends.jax`: trace a function and convert its jaxpr (``convert.py`` the driver,
  ``rules.py`` one rule per primitive, ``builder.py`` the graph builder).

The frameworks are optional extras, imported only inside the calls: importing taps imports
neither torch nor jax.
"""

from typing import Any

from taps.frontends.jax import from_jax
from taps.graph import Graph


def from_torch(module: Any, *example_inputs: Any, **options: Any) -> Graph:
    """The graph of a ``torch.nn.Module`` called on ``example_inputs``; see
    :func:`taps.frontends.torch.from_torch` (``pip install 'taps[torch]'``)."""
    from taps.frontends import torch as frontend

    return frontend.from_torch(module, *example_inputs, **options)


__all__ = ["from_jax", "from_torch"]
