//! The Python exception classes, and the one mapping of the core's [`Error`] onto them.

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::PyErr;

use crate::error::Error;

create_exception!(
    taps,
    TapsError,
    PyValueError,
    "Base class of every error taps raises."
);
create_exception!(
    taps,
    LayoutError,
    TapsError,
    "A malformed layout or two layouts of different tensors."
);
create_exception!(
    taps,
    UnifyError,
    LayoutError,
    "Two layouts that no rewrite can bring to one device matrix and shape."
);
create_exception!(
    taps,
    StrategyError,
    TapsError,
    "Bad input to strategy enumeration."
);
create_exception!(
    taps,
    TopologyError,
    TapsError,
    "A bad cluster, collective or cost model."
);
create_exception!(taps, GraphError, TapsError, "A malformed operator graph.");
create_exception!(
    taps,
    ResourceError,
    TapsError,
    "A search too large for its limits or for the memory it may use."
);
create_exception!(
    taps,
    InfeasibleError,
    TapsError,
    "A search with no feasible assignment, such as a memory limit nothing meets."
);

create_exception!(
    taps,
    TimeLimitError,
    TapsError,
    "A search whose time limit ran out before it had any assignment to return (while its cost\ntables were built, or with no assignment that fits the memory limit)."
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Layout(m) => LayoutError::new_err(m),
            Error::Unify(m) => UnifyError::new_err(m),
            Error::Strategy(m) => StrategyError::new_err(m),
            Error::Topology(m) => TopologyError::new_err(m),
            Error::Shape(m) => TapsError::new_err(m),
            Error::Memory(m) => ResourceError::new_err(m),
            Error::TimeLimit(m) => TimeLimitError::new_err(m),
        }
    }
}
