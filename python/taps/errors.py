"""Every error taps raises, in one place: ``TapsError`` (a ``ValueError``) and its subclasses.

The core's errors are defined in Rust (``taps._core``) and re-exported here; the ones raised only
by the Python package are defined here. Catch :class:`TapsError` for any of them.
"""

from taps._core import (
    GraphError,
    InfeasibleError,
    LayoutError,
    ResourceError,
    StrategyError,
    TapsError,
    TimeLimitError,
    TopologyError,
    UnifyError,
)


class ArgumentError(TapsError):
    """A number argument out of its range: NaN, infinite, negative or too large."""


class OutputError(TapsError):
    """An output file that cannot be written where asked."""


class MissingExtraError(TapsError):
    """An optional dependency is not installed; the message names the extra to install."""


class CalibrationError(TapsError):
    """Measurements that cannot be read, or that do not determine a cluster."""


class ExportError(TapsError):
    """A plan that cannot be put on a framework's mesh, or a missing framework."""


class PlanFileError(TapsError):
    """A saved plan that cannot be read: not a plan, another version, or a graph that does not
    match its strategies."""


class VerifyError(TapsError):
    """A plan the engine cannot run, a missing engine, or too few devices."""


__all__ = [
    "ArgumentError",
    "CalibrationError",
    "ExportError",
    "GraphError",
    "InfeasibleError",
    "LayoutError",
    "MissingExtraError",
    "OutputError",
    "PlanFileError",
    "ResourceError",
    "StrategyError",
    "TapsError",
    "TimeLimitError",
    "TopologyError",
    "UnifyError",
    "VerifyError",
]
