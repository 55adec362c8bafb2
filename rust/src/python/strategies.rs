//! Strategies: the `Strategy` class, `enumerate_strategies`, `tensor_layouts` and
//! `strategy_arrays`.

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;

use super::convert::{signed_list, unsigned_list, Num};
use super::layout::PyLayout;
use crate::error::Error;
use crate::strategies::{self, Strategy};

/// The strategy of `degrees` and `device_map` on `device_matrix` (Python's `Strategy(...)`), or
/// on one dim per split axis without one.
pub(super) fn strategy(
    degrees: Vec<u64>,
    device_map: Vec<i64>,
    device_matrix: Option<&[Num<i64>]>,
) -> Result<Strategy, Error> {
    match device_matrix {
        None => Strategy::new(degrees, device_map),
        Some(m) => Strategy::with_device_matrix(
            degrees,
            device_map,
            unsigned_list(
                m,
                "device matrix",
                "a power of two of at least 2",
                Error::Strategy,
            )?,
        ),
    }
}

/// A strategy of one operator: a power-of-two degree per partitionable axis, the device dim of
/// each split axis (-1 where the degree is 1), and the device matrix, whose dims no axis uses
/// replicate the operator (one dim per split axis if not given). Immutable, hashable, picklable.
#[pyclass(frozen, eq, hash, module = "taps", name = "Strategy")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyStrategy {
    pub(super) inner: Strategy,
}

#[pymethods]
impl PyStrategy {
    #[new]
    #[pyo3(signature = (degrees, device_map, device_matrix=None))]
    fn new(
        degrees: Vec<Num<i64>>,
        device_map: Vec<Num<i64>>,
        device_matrix: Option<Vec<Num<i64>>>,
    ) -> PyResult<Self> {
        let kind = Error::Strategy;
        let degrees = unsigned_list(&degrees, "degrees", "a positive power of two", kind)?;
        let device_map = signed_list(&device_map, "device map", kind)?;
        let inner = strategy(degrees, device_map, device_matrix.as_deref())?;
        Ok(PyStrategy { inner })
    }

    /// Per axis, the number of blocks it is split into.
    #[getter]
    fn degrees(&self) -> Vec<u64> {
        self.inner.degrees().to_vec()
    }

    /// Per axis, the device dim it is split along (0 innermost), or -1 for degree 1.
    #[getter]
    fn device_map(&self) -> Vec<i64> {
        self.inner.device_map().to_vec()
    }

    /// The device matrix, outermost dim first: the split axes' dims and the replica dims.
    #[getter]
    fn device_matrix(&self) -> Vec<u64> {
        self.inner.device_matrix().to_vec()
    }

    /// The number of devices: the product of the device matrix.
    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.num_devices()
    }

    /// The number of copies of the operator: the product of the device dims no axis uses.
    #[getter]
    fn replicas(&self) -> u64 {
        self.inner.replicas()
    }

    /// The layout of a tensor whose dims are the strategy's axes `axes` (-1: a whole dim); with
    /// `per_replica`, the replicas' copies stacked along leading dims, one per replica dim.
    #[pyo3(signature = (axes, shape, per_replica=false))]
    fn tensor_layout(
        &self,
        axes: Vec<Num<i64>>,
        shape: Vec<Num<i64>>,
        per_replica: bool,
    ) -> PyResult<PyLayout> {
        let axes = signed_list(&axes, "axes", Error::Layout)?;
        let shape = unsigned_list(&shape, "shape", "a positive size", Error::Layout)?;
        Ok(self.inner.tensor_layout(&axes, &shape, per_replica)?.into())
    }

    fn __repr__(&self) -> String {
        let s = &self.inner;
        if s.replicas() == 1 {
            format!(
                "Strategy(degrees={:?}, device_map={:?})",
                s.degrees(),
                s.device_map()
            )
        } else {
            format!(
                "Strategy(degrees={:?}, device_map={:?}, device_matrix={:?})",
                s.degrees(),
                s.device_map(),
                s.device_matrix()
            )
        }
    }

    fn __reduce__(slf: &Bound<'_, Self>) -> PyResult<(Py<PyAny>, (Vec<u64>, Vec<i64>, Vec<u64>))> {
        let s = &slf.get().inner;
        Ok((
            slf.get_type().into_any().unbind(),
            (
                s.degrees().to_vec(),
                s.device_map().to_vec(),
                s.device_matrix().to_vec(),
            ),
        ))
    }
}

/// Every strategy of `axis_sizes` on `num_devices` devices, in a fixed order; with `replicas`,
/// followed by those that split over fewer devices and replicate over the rest
/// (docs/conventions.md#strategies).
#[pyfunction]
#[pyo3(signature = (axis_sizes, num_devices, replicas=false))]
pub(super) fn enumerate_strategies(
    axis_sizes: Vec<Num<i64>>,
    num_devices: Num<i64>,
    replicas: bool,
) -> PyResult<Vec<PyStrategy>> {
    let kind = Error::Strategy;
    let sizes = unsigned_list(&axis_sizes, "axis sizes", "a positive size", kind)?;
    let n = num_devices.unsigned("num_devices", "a positive power of two", kind)?;
    Ok(strategies::enumerate_strategies(&sizes, n, replicas)?
        .into_iter()
        .map(|inner| PyStrategy { inner })
        .collect())
}

/// `Strategy.tensor_layout(axes, shape)` of every strategy of `strategies`, in one call: the
/// candidates of an operator take one layout per operand and strategy (thousands per operator).
#[pyfunction]
pub(super) fn tensor_layouts(
    strategies: Vec<PyRef<'_, PyStrategy>>,
    axes: Vec<Num<i64>>,
    shape: Vec<Num<i64>>,
) -> PyResult<Vec<PyLayout>> {
    let axes = signed_list(&axes, "axes", Error::Layout)?;
    let shape = unsigned_list(&shape, "shape", "a positive size", Error::Layout)?;
    Ok(strategies
        .iter()
        .map(|s| {
            s.inner
                .tensor_layout(&axes, &shape, false)
                .map(PyLayout::from)
        })
        .collect::<Result<_, Error>>()?)
}

/// The degrees and the device map of every strategy of `strategies` (one operator's: one axis
/// count), as the rows of two arrays: what the batch kernels take, read in one call rather than
/// as a list per strategy and property (1.4 us a strategy through `numpy.array`).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(super) fn strategy_arrays<'py>(
    py: Python<'py>,
    strategies: Vec<PyRef<'py, PyStrategy>>,
) -> PyResult<(Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<i64>>)> {
    let axes = strategies.first().map_or(0, |s| s.inner.degrees().len());
    if let Some(s) = strategies.iter().find(|s| s.inner.degrees().len() != axes) {
        return Err(Error::Strategy(format!(
            "strategies of {axes} and of {} axes: one operator's have one count",
            s.inner.degrees().len()
        ))
        .into());
    }
    let mut degrees = Vec::with_capacity(strategies.len() * axes);
    let mut maps = Vec::with_capacity(strategies.len() * axes);
    for s in &strategies {
        degrees.extend(s.inner.degrees().iter().map(|&d| d as i64));
        maps.extend_from_slice(s.inner.device_map());
    }
    let rows = |v: Vec<i64>| {
        Array2::from_shape_vec((strategies.len(), axes), v)
            .expect("one row of `axes` entries per strategy")
            .into_pyarray(py)
    };
    Ok((rows(degrees), rows(maps)))
}
