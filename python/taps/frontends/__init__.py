"""Real models in: a PyTorch module (torch.export) or a JAX function (its jaxpr) as a taps graph.

One module per framework (``jax.py`` with its primitive rules in ``jax_rules.py`` and its graph
builder in ``jax_builder.py``); the frameworks are optional extras, imported only inside the
calls.
"""

from taps.frontends.jax import from_jax

__all__ = ["from_jax"]
