"""The PyTorch front end: a model exported with ``torch.export`` as a taps graph.

- :mod:`.module`: the entry points: :func:`from_torch` (a ``torch.nn.Module``), :func:`load` (a
  saved archive), :func:`load_factory` and :func:`from_factory` (``package.module:factory``),
  :func:`export_program` (``torch.export`` as taps calls it);
- :mod:`.program`: :func:`convert`, the driver that turns an ``ExportedProgram``'s training IR
  into a :class:`Conversion` (the graph, and the :class:`Link` s from fx nodes to operators);
- :mod:`.rules`: one rule per ATen operator, one module per family;
- :mod:`.builder`: :class:`~.builder.AtenGraphBuilder`, which the rules build the graph through;
- :mod:`.blocks`: :func:`repeated_blocks`, the identical layers to tie.

torch itself is imported inside the calls (``pip install 'taps[torch]'``).
"""

from taps.frontends.torch.blocks import repeated_blocks
from taps.frontends.torch.module import (
    drop_cache,
    export_program,
    from_factory,
    from_torch,
    load,
    load_factory,
)
from taps.frontends.torch.program import Conversion, Link, convert

__all__ = [
    "Conversion",
    "Link",
    "convert",
    "drop_cache",
    "export_program",
    "from_factory",
    "from_torch",
    "load",
    "load_factory",
    "repeated_blocks",
]
