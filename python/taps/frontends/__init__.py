"""Front ends: models written in a framework, read into a :class:`taps.Graph`.

Each framework is an optional extra, imported only when its front end is called:
``from_torch`` (``pip install 'taps[torch]'``, :mod:`taps.frontends.torch`) and ``from_jax``
(``pip install 'taps[jax]'``, :mod:`taps.frontends.jax`).
"""

from __future__ import annotations

import importlib
from typing import Any

from taps._core import TapsError
from taps.graph import Graph


def from_torch(module: Any, *example_inputs: Any, **options: Any) -> Graph:
    """The graph of a ``torch.nn.Module`` called on ``example_inputs``; see
    :func:`taps.frontends.torch.from_torch`."""
    from taps.frontends import torch as frontend

    return frontend.from_torch(module, *example_inputs, **options)


# -- JAX: the JAX front end lives in taps.frontends.jax (another module's owner) --------------
def from_jax(fn: Any, *example_args: Any, **options: Any) -> Graph:
    """The graph of a JAX function called on ``example_args``; see
    ``taps.frontends.jax.from_jax``."""
    try:
        frontend = importlib.import_module("taps.frontends.jax")
    except ModuleNotFoundError as e:
        if e.name != "taps.frontends.jax":
            raise
        raise TapsError("this taps has no JAX front end (taps.frontends.jax)") from None
    result: Graph = frontend.from_jax(fn, *example_args, **options)
    return result


__all__ = ["from_jax", "from_torch"]
