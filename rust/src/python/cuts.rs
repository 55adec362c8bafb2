//! The stage search's programmes over cuts: `least_cuts` and `least_bottleneck`, with the GIL
//! released.

use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use crate::cuts::{self, Chain};

/// The cut points of least total time whose stages all fit and take at most `bound`, or
/// `None`.
#[pyfunction]
#[pyo3(signature = (times, edge, parameters, activations, flights, buffer, limit, bound))]
#[allow(clippy::too_many_arguments)] // the chain's arrays, as Python holds them
pub(super) fn least_cuts(
    py: Python<'_>,
    times: PyReadonlyArray2<'_, f64>,
    edge: PyReadonlyArray1<'_, f64>,
    parameters: PyReadonlyArray2<'_, f64>,
    activations: PyReadonlyArray2<'_, f64>,
    flights: PyReadonlyArray1<'_, f64>,
    buffer: f64,
    limit: f64,
    bound: f64,
) -> PyResult<Option<Vec<usize>>> {
    let chain = Chain {
        times: times.as_slice()?,
        edge: edge.as_slice()?,
        parameters: parameters.as_slice()?,
        activations: activations.as_slice()?,
        flights: flights.as_slice()?,
        buffer,
        limit,
    };
    Ok(py.detach(move || cuts::least_cuts(&chain, bound))?)
}

/// The least slowest stage's time over every cut whose stages all fit; `inf` if none.
#[pyfunction]
#[pyo3(signature = (times, edge, parameters, activations, flights, buffer, limit))]
#[allow(clippy::too_many_arguments)] // the chain's arrays, as Python holds them
pub(super) fn least_bottleneck(
    py: Python<'_>,
    times: PyReadonlyArray2<'_, f64>,
    edge: PyReadonlyArray1<'_, f64>,
    parameters: PyReadonlyArray2<'_, f64>,
    activations: PyReadonlyArray2<'_, f64>,
    flights: PyReadonlyArray1<'_, f64>,
    buffer: f64,
    limit: f64,
) -> PyResult<f64> {
    let chain = Chain {
        times: times.as_slice()?,
        edge: edge.as_slice()?,
        parameters: parameters.as_slice()?,
        activations: activations.as_slice()?,
        flights: flights.as_slice()?,
        buffer,
        limit,
    };
    Ok(py.detach(move || cuts::least_bottleneck(&chain))?)
}
