//! The stage search's programmes over cuts: `least_cuts` and `least_bottleneck`, with the GIL
//! released.

use numpy::{PyReadonlyArray2, PyReadonlyArray3};
use pyo3::prelude::*;

use crate::cuts;
use crate::error::Error;

/// The matrices' stage count and cut points, checked square and alike.
fn sizes(
    what: &str,
    stacked: (usize, usize, usize),
    times: (usize, usize),
) -> PyResult<(usize, usize)> {
    let (stages, rows, cols) = stacked;
    if rows != cols || times != (rows, cols) {
        return Err(Error::Shape(format!(
            "{what}: the stages' matrices ({rows} x {cols}) and the times ({} x {}) must be \
             one square size",
            times.0, times.1
        ))
        .into());
    }
    Ok((stages, rows))
}

/// The cut points of least total `paid[k, a, b]` whose stages all take at most `bound` by
/// `times[a, b]`, or `None`.
#[pyfunction]
pub(super) fn least_cuts(
    py: Python<'_>,
    paid: PyReadonlyArray3<'_, f64>,
    times: PyReadonlyArray2<'_, f64>,
    bound: f64,
) -> PyResult<Option<Vec<usize>>> {
    let (stages, points) = sizes("least_cuts", paid.as_array().dim(), times.as_array().dim())?;
    let (paid, times) = (paid.as_slice()?, times.as_slice()?);
    Ok(py.detach(move || cuts::least_cuts(paid, times, stages, points, bound))?)
}

/// The least slowest stage's `times[a, b]` over every cut whose stages all fit
/// (`fits[k, a, b]`); `inf` if none.
#[pyfunction]
pub(super) fn least_bottleneck(
    py: Python<'_>,
    fits: PyReadonlyArray3<'_, bool>,
    times: PyReadonlyArray2<'_, f64>,
) -> PyResult<f64> {
    let (stages, points) = sizes(
        "least_bottleneck",
        fits.as_array().dim(),
        times.as_array().dim(),
    )?;
    let (fits, times) = (fits.as_slice()?, times.as_slice()?);
    Ok(py.detach(move || cuts::least_bottleneck(fits, times, stages, points))?)
}
