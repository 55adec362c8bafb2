"""Real models in: a PyTorch module (torch.export) or a JAX function (its jaxpr) as a taps graph.

One module per framework (``torch.py`` with its ATen rules in ``aten_rules.py`` and its builder
in ``builder.py``; ``jax.py`` with its primitive rules in ``jax_rules.py`` and its graph
builder in ``jax_builder.py``); the frameworks are optional extras, imported only inside the
calls.
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
