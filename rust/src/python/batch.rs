//! The batch cost kernels: `redistribution_costs`, `redistribution_pair_costs`, the bounds
//! (`redistribution_bounds`, `redistribution_table_bounds`, `redistribution_pair_bounds`),
//! `redistribution_pair_estimates`,
//! `allreduce_costs`, `gathered_sum`, `min_plus` and `min_plus_one`, on all cores with the GIL
//! released, `first_equal` (one core, the GIL released) for the reductions' merges of equal
//! rows, and `frontier_sum` (one core) for the memory-limited search.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use numpy::ndarray::{Array2, Array3, ArrayView2, CowArray, Ix2};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArray3, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2,
    PyReadonlyArray3, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use super::convert::{signed_list, unsigned_list, Num};
use super::layout::PyLayout;
use super::strategies::strategy;
use super::topology::PyCluster;
use crate::batch;
use crate::error::Error;
use crate::gathered;
use crate::layout::Layout;
use crate::minplus;
use crate::pareto;
use crate::plan::Planner;
use crate::rows;
use crate::topology::{Cluster, CostModel};

/// The matrix of redistribution costs from each source to each target, on all cores; a
/// [`Error::TimeLimit`] if `time_limit` seconds pass first. With `out` (a writable float64
/// matrix of that shape whose rows are each contiguous: C order, or a block of rows and columns
/// of a C-ordered matrix), the costs are written there and `out` is returned: the search's memo
/// hands in its own matrix, or the block of it that is new, instead of copying the kernel's.
#[pyfunction]
#[pyo3(
    signature = (sources, targets, cluster, dtype_bytes=Num::Fits(2.0), model="topology", planner="paper", time_limit=None, out=None),
    text_signature = "(sources, targets, cluster, dtype_bytes=2.0, model='topology', planner='paper', time_limit=None, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn redistribution_costs<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    cluster: &PyCluster,
    dtype_bytes: Num<f64>,
    model: &str,
    planner: &str,
    time_limit: Option<Num<f64>>,
    out: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let planner = Planner::parse(planner)?;
    let (sources, targets) = (inners(&sources), inners(&targets));
    let cluster = cluster.inner.clone();
    let dtype_bytes = dtype_bytes.get("dtype_bytes", Error::Topology)?;
    let model = CostModel::parse(model)?;
    let time_limit = seconds(time_limit)?;
    let shape = (sources.len(), targets.len());
    let stop = AtomicBool::new(false);
    let what = || format!("{} x {} redistributions", shape.0, shape.1);
    let pairs = shape.0 * shape.1;
    // Without `out`, a matrix of its own: one path writes the costs either way.
    let array = match out {
        Some(out) => out_matrix(out, shape)?,
        None => PyArray2::zeros(py, [shape.0, shape.1], false),
    };
    {
        let mut writing = array.try_readwrite().map_err(|_| {
            Error::Shape("out must be a writable array, not borrowed elsewhere".to_string())
        })?;
        let mut view = writing.as_array_mut();
        let mut rows = view
            .rows_mut()
            .into_iter()
            .map(numpy::ndarray::ArrayBase::into_slice)
            .collect::<Option<Vec<&mut [f64]>>>()
            .ok_or_else(|| {
                Error::Shape("out's rows must each be contiguous (C order)".to_string())
            })?;
        let run = || {
            let done = batch::redistribution_costs_into(
                &sources,
                &targets,
                &cluster,
                dtype_bytes,
                model,
                planner,
                &stop,
                &mut rows,
            )?;
            Ok(done.then_some(()))
        };
        priced(py, &stop, planner, pairs, time_limit, what, run)?;
    }
    Ok(array)
}

/// `out` as a float64 matrix of `shape`, or an [`Error::Shape`] that says what it is instead.
fn out_matrix(
    out: Bound<'_, PyAny>,
    (rows, cols): (usize, usize),
) -> Result<Bound<'_, PyArray2<f64>>, Error> {
    let want = format!("out must be a float64 array of shape ({rows}, {cols})");
    let array = out.cast_into::<PyArray2<f64>>().map_err(|e| {
        let got = e.into_inner();
        let (dtype, ndim) = (got.getattr("dtype"), got.getattr("ndim"));
        match (dtype, ndim) {
            (Ok(dtype), Ok(ndim)) => Error::Shape(format!("{want}, got {dtype} of {ndim} dims")),
            _ => Error::Shape(format!("{want}, got {}", got.get_type())),
        }
    })?;
    if array.shape() != [rows, cols] {
        return Err(Error::Shape(format!("{want}, got {:?}", array.shape())));
    }
    Ok(array)
}

/// A time limit in seconds, if any: a non-negative number.
fn seconds(time_limit: Option<Num<f64>>) -> Result<Option<f64>, Error> {
    let time_limit = time_limit
        .map(|t| t.get("time_limit", Error::TimeLimit))
        .transpose()?;
    if let Some(t) = time_limit.filter(|t| t.is_nan() || *t < 0.0) {
        let message = format!("time_limit must be a non-negative number of seconds, got {t}");
        return Err(Error::TimeLimit(message));
    }
    Ok(time_limit)
}

/// The cost of each pair `(sources[k], targets[k])` of `dtype_bytes[k]` bytes per element
/// ([`batch::pair_costs_until`]): the pairs of many tensors in one watched call; a
/// [`Error::TimeLimit`] if `time_limit` seconds pass first.
#[pyfunction]
#[pyo3(
    signature = (sources, targets, dtype_bytes, cluster, model="topology", planner="paper", time_limit=None),
    text_signature = "(sources, targets, dtype_bytes, cluster, model='topology', planner='paper', time_limit=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn redistribution_pair_costs<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    dtype_bytes: Vec<Num<f64>>,
    cluster: &PyCluster,
    model: &str,
    planner: &str,
    time_limit: Option<Num<f64>>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let planner = Planner::parse(planner)?;
    let call = PairCall::of(&sources, &targets, &dtype_bytes, cluster, model, time_limit)?;
    let stop = AtomicBool::new(false);
    let run = || {
        let (s, t, b) = call.pairs();
        batch::pair_costs_until(s, t, b, &call.cluster, call.model, planner, &stop)
    };
    let n = call.sources.len();
    let what = || format!("{n} redistributions");
    let costs = priced(py, &stop, planner, n, call.time_limit, what, run)?;
    Ok(costs.into_pyarray(py))
}

/// The matrix of lower bounds on the optimal planner's costs, and the matrix of whether each is
/// that cost ([`batch::redistribution_bounds`]).
#[pyfunction]
#[pyo3(
    signature = (sources, targets, cluster, dtype_bytes=Num::Fits(2.0), model="topology"),
    text_signature = "(sources, targets, cluster, dtype_bytes=2.0, model='topology')"
)]
pub(super) fn redistribution_bounds<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    cluster: &PyCluster,
    dtype_bytes: Num<f64>,
    model: &str,
) -> PyResult<(Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<bool>>)> {
    let (sources, targets) = (inners(&sources), inners(&targets));
    let cluster = cluster.inner.clone();
    let dtype_bytes = dtype_bytes.get("dtype_bytes", Error::Topology)?;
    let model = CostModel::parse(model)?;
    let shape = (sources.len(), targets.len());
    let (bounds, exact) = py.detach(|| {
        batch::redistribution_bounds(&sources, &targets, &cluster, dtype_bytes, model)
    })?;
    let bounds = Array2::from_shape_vec(shape, bounds).expect("one bound per pair");
    let exact = Array2::from_shape_vec(shape, exact).expect("one flag per pair");
    Ok((bounds.into_pyarray(py), exact.into_pyarray(py)))
}

/// [`redistribution_bounds`]'s matrices, with `cheap` the cheaper and weaker bounds, and the
/// matrix of Algorithm 1's costs ([`batch::redistribution_table_bounds`]).
#[pyfunction]
#[pyo3(
    signature = (sources, targets, cluster, dtype_bytes=Num::Fits(2.0), model="topology", cheap=false),
    text_signature = "(sources, targets, cluster, dtype_bytes=2.0, model='topology', cheap=False)"
)]
#[allow(clippy::type_complexity)]
pub(super) fn redistribution_table_bounds<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    cluster: &PyCluster,
    dtype_bytes: Num<f64>,
    model: &str,
    cheap: bool,
) -> PyResult<(
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray2<bool>>,
    Bound<'py, PyArray2<f64>>,
)> {
    let (sources, targets) = (inners(&sources), inners(&targets));
    let cluster = cluster.inner.clone();
    let dtype_bytes = dtype_bytes.get("dtype_bytes", Error::Topology)?;
    let model = CostModel::parse(model)?;
    let shape = (sources.len(), targets.len());
    let table = py.detach(|| {
        batch::redistribution_table_bounds(&sources, &targets, &cluster, dtype_bytes, model, cheap)
    })?;
    let bounds = Array2::from_shape_vec(shape, table.bounds).expect("one bound per pair");
    let exact = Array2::from_shape_vec(shape, table.exact).expect("one flag per pair");
    let paper = Array2::from_shape_vec(shape, table.paper).expect("one cost per pair");
    Ok((
        bounds.into_pyarray(py),
        exact.into_pyarray(py),
        paper.into_pyarray(py),
    ))
}

/// The bound of each pair `(sources[k], targets[k])` of `dtype_bytes[k]` bytes per element and
/// whether it is exact, as [`redistribution_bounds`] gives them ([`batch::pair_bounds_until`]):
/// one watched call; a [`Error::TimeLimit`] if `time_limit` seconds pass first.
#[pyfunction]
#[pyo3(
    signature = (sources, targets, dtype_bytes, cluster, model="topology", time_limit=None),
    text_signature = "(sources, targets, dtype_bytes, cluster, model='topology', time_limit=None)"
)]
pub(super) fn redistribution_pair_bounds<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    dtype_bytes: Vec<Num<f64>>,
    cluster: &PyCluster,
    model: &str,
    time_limit: Option<Num<f64>>,
) -> PyResult<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<bool>>)> {
    let call = PairCall::of(&sources, &targets, &dtype_bytes, cluster, model, time_limit)?;
    let stop = AtomicBool::new(false);
    let run = || {
        let (s, t, b) = call.pairs();
        batch::pair_bounds_until(s, t, b, &call.cluster, call.model, &stop)
    };
    let n = call.sources.len();
    let what = || format!("the time limit ran out while bounding {n} redistributions");
    let found = watched(py, &stop, call.time_limit, what, run)??;
    let (bounds, exact) = found.expect("nothing stopped the batch");
    Ok((bounds.into_pyarray(py), exact.into_pyarray(py)))
}

/// The optimal planner's cost of each pair `(sources[k], targets[k])` of `dtype_bytes[k]` bytes
/// per element and true, or a lower bound on it and false where its search expands
/// `expansions[k]` layouts (`None`: no limit) without reaching the target
/// ([`batch::pair_estimates_until`]): one watched call; a [`Error::TimeLimit`] if `time_limit`
/// seconds pass first.
#[pyfunction]
#[pyo3(
    signature = (sources, targets, dtype_bytes, expansions, cluster, model="topology", time_limit=None),
    text_signature = "(sources, targets, dtype_bytes, expansions, cluster, model='topology', time_limit=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn redistribution_pair_estimates<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    dtype_bytes: Vec<Num<f64>>,
    expansions: Vec<Option<Num<i64>>>,
    cluster: &PyCluster,
    model: &str,
    time_limit: Option<Num<f64>>,
) -> PyResult<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<bool>>)> {
    let call = PairCall::of(&sources, &targets, &dtype_bytes, cluster, model, time_limit)?;
    let expansions = expansions
        .iter()
        .map(|e| {
            let count = e.as_ref().map(|e| {
                e.unsigned(
                    "expansions",
                    "a count of layouts (0 or more) or None",
                    Error::Shape,
                )
            });
            count
                .transpose()
                .map(|c| c.map(|c| usize::try_from(c).unwrap_or(usize::MAX)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let stop = AtomicBool::new(false);
    let run = || {
        let (s, t, b) = call.pairs();
        batch::pair_estimates_until(s, t, b, &expansions, &call.cluster, call.model, &stop)
    };
    let n = call.sources.len();
    let what = || format!("the time limit ran out while pricing {n} redistributions");
    let found = watched(py, &stop, call.time_limit, what, run)??;
    let (costs, exact) = found.expect("nothing stopped the batch");
    Ok((costs.into_pyarray(py), exact.into_pyarray(py)))
}

/// The arguments every pair binding takes, converted: the layouts copied (the work runs without
/// the GIL), each pair's element size, the cost model and the time limit checked.
struct PairCall {
    sources: Vec<Layout>,
    targets: Vec<Layout>,
    dtype_bytes: Vec<f64>,
    cluster: Cluster,
    model: CostModel,
    time_limit: Option<f64>,
}

impl PairCall {
    /// The sources, targets and element sizes, pair by pair.
    fn pairs(&self) -> (&[Layout], &[Layout], &[f64]) {
        (&self.sources, &self.targets, &self.dtype_bytes)
    }

    fn of(
        sources: &[Bound<'_, PyLayout>],
        targets: &[Bound<'_, PyLayout>],
        dtype_bytes: &[Num<f64>],
        cluster: &PyCluster,
        model: &str,
        time_limit: Option<Num<f64>>,
    ) -> PyResult<Self> {
        let dtype_bytes = dtype_bytes
            .iter()
            .map(|b| b.get("dtype_bytes", Error::Topology))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PairCall {
            sources: inners(sources),
            targets: inners(targets),
            dtype_bytes,
            cluster: cluster.inner.clone(),
            model: CostModel::parse(model)?,
            time_limit: seconds(time_limit)?,
        })
    }
}

/// The core's layouts of Python ones (copied: the work runs without the GIL).
fn inners(layouts: &[Bound<'_, PyLayout>]) -> Vec<Layout> {
    layouts.iter().map(|l| l.get().inner.clone()).collect()
}

/// Batches of Algorithm 1 with at most this many pairs take milliseconds: they run on this
/// thread, not a watched worker.
const WATCHED_PAIRS: usize = 4096;

/// The costs `run` prices for `pairs` layout pairs under `planner`: on this thread for a small
/// batch of Algorithm 1, else [`watched`] (the time limit's message names the batch by `what`).
fn priced<T: Send>(
    py: Python<'_>,
    stop: &AtomicBool,
    planner: Planner,
    pairs: usize,
    time_limit: Option<f64>,
    what: impl Fn() -> String,
    run: impl FnOnce() -> Result<Option<T>, Error> + Send,
) -> PyResult<T> {
    let costs = if planner == Planner::Paper && pairs <= WATCHED_PAIRS {
        py.detach(run)?
    } else {
        let what = || format!("the time limit ran out while pricing {}", what());
        watched(py, stop, time_limit, what, run)??
    };
    Ok(costs.expect("nothing stopped the batch"))
}

/// `work` on a thread of the pool while this one (the only thread that sees Python's signals)
/// waits for it, looking every 10 ms for Ctrl-C and at the clock: on either it sets `stop`, which
/// the work looks at often, and raises (`KeyboardInterrupt`, or [`Error::TimeLimit`] worded by
/// `what`) once the work has ended. A pool thread, not one started per call: the optimal
/// search's rounds make dozens of small calls, and starting a thread (which then handed its
/// parallel steps to the pool) was most of a call answered from the memo.
fn watched<T: Send>(
    py: Python<'_>,
    stop: &AtomicBool,
    time_limit: Option<f64>,
    what: impl Fn() -> String,
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    let start = Instant::now();
    let (done, mut result) = mpsc::channel();
    // The scope waits for the work before it returns, and raises the work's panic if it had one.
    let outcome = rayon::in_place_scope(|scope| {
        scope.spawn(move |_| {
            // The receiver outlives the work (the scope waits for it), so the send cannot fail.
            drop(done.send(work()));
        });
        loop {
            // The receiver is moved into the wait and back (it is not `Sync`).
            let (got, back) = py.detach(move || {
                let got = result.recv_timeout(Duration::from_millis(10));
                (got, result)
            });
            result = back;
            match got {
                Ok(value) => return Some(Ok(value)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // The work panicked: the scope raises it.
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
            let late = time_limit.is_some_and(|t| start.elapsed().as_secs_f64() > t);
            let interrupt = py.check_signals().err();
            if late || interrupt.is_some() {
                // The work ends within milliseconds (the scope waits for it); its result is
                // dropped.
                stop.store(true, Relaxed);
                return Some(Err(
                    interrupt.unwrap_or_else(|| Error::TimeLimit(what()).into())
                ));
            }
        }
    });
    // (The scope's own wait for the work holds the GIL: the work has sent its result, or, stopped,
    // ends within milliseconds.)
    outcome.expect("the scope raises the work's panic")
}

/// Per strategy (rows of `degrees` and `device_maps`, on the device matrices `device_matrices`,
/// one per row, or one dim per split axis if not given), the summed all_reduce cost of the
/// tensors (strategy axes, shape, dtype bytes) over the device dims each leaves unused inside a
/// replica, on all cores.
#[pyfunction]
#[pyo3(signature = (degrees, device_maps, tensors, cluster, model="topology", device_matrices=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn allreduce_costs<'py>(
    py: Python<'py>,
    degrees: PyReadonlyArray2<'py, i64>,
    device_maps: PyReadonlyArray2<'py, i64>,
    tensors: Vec<(Vec<Num<i64>>, Vec<Num<i64>>, Num<f64>)>,
    cluster: &PyCluster,
    model: &str,
    device_matrices: Option<Vec<Vec<Num<i64>>>>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    let (degrees, device_maps) = (degrees.as_array(), device_maps.as_array());
    if degrees.shape() != device_maps.shape() {
        return Err(Error::Strategy(format!(
            "degrees {:?} and device_maps {:?} must have one shape: strategies x axes",
            degrees.shape(),
            device_maps.shape()
        ))
        .into());
    }
    if let Some(m) = &device_matrices {
        if m.len() != degrees.nrows() {
            return Err(Error::Strategy(format!(
                "{} device matrices for {} strategies",
                m.len(),
                degrees.nrows()
            ))
            .into());
        }
    }
    let strategies = degrees
        .rows()
        .into_iter()
        .zip(device_maps.rows())
        .enumerate()
        .map(|(i, (d, m))| {
            let degrees = d
                .iter()
                .map(|&v| {
                    u64::try_from(v).map_err(|_| {
                        Error::Strategy(format!(
                            "degrees {d}: entry {v} is not a positive power of two"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            strategy(
                degrees,
                m.to_vec(),
                device_matrices.as_ref().map(|all| &all[i][..]),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tensors = tensors
        .into_iter()
        .map(|(axes, shape, bytes)| {
            Ok(batch::AxesTensor {
                axes: signed_list(&axes, "axes", Error::Layout)?,
                shape: unsigned_list(&shape, "shape", "a positive size", Error::Layout)?,
                dtype_bytes: bytes.get("dtype_bytes", Error::Topology)?,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let cluster = cluster.inner.clone();
    let model = CostModel::parse(model)?;
    let costs =
        py.detach(move || batch::allreduce_costs(&strategies, &tensors, &cluster, model))?;
    Ok(costs.into_pyarray(py))
}

/// The min-plus product `out[a, b] = min_k x[a, k] + y[k, b]` of costs with objectives on the
/// last axis, lexicographic (the first objective up to a relative `tie`), on all cores.
#[pyfunction]
pub(super) fn min_plus<'py>(
    py: Python<'py>,
    x: PyReadonlyArray3<'py, f64>,
    y: PyReadonlyArray3<'py, f64>,
    tie: f64,
) -> PyResult<Bound<'py, PyArray3<f64>>> {
    let (xs, ys) = (x.as_array().dim(), y.as_array().dim());
    let dims = minplus::Dims {
        rows: xs.0,
        inner: xs.1,
        cols: ys.1,
        objectives: xs.2,
    };
    if ys.0 != dims.inner || ys.2 != dims.objectives {
        return Err(Error::Shape(format!(
            "min-plus product of costs of shapes {xs:?} and {ys:?}: the inner sizes and the \
             objectives must match"
        ))
        .into());
    }
    let (x, y) = (x.as_slice()?, y.as_slice()?);
    let out = py.detach(move || minplus::min_plus(x, y, dims, tie))?;
    let array = Array3::from_shape_vec((dims.rows, dims.cols, dims.objectives), out)
        .expect("one entry per pair of rows and columns");
    Ok(array.into_pyarray(py))
}

/// The min-plus product `out[a, b] = min_k x[a, k] + y[k, b]` of one objective, on all cores,
/// `x[a, k] + shift[k]` in place of `x[a, k]` if `shift` is given: arrays in C or Fortran order
/// (a transposed view too) are read in place, others copied first.
#[pyfunction]
#[pyo3(signature = (x, y, shift=None))]
pub(super) fn min_plus_one<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f64>,
    y: PyReadonlyArray2<'py, f64>,
    shift: Option<PyReadonlyArray1<'py, f64>>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let (x, y) = (x.as_array(), y.as_array());
    let (x, y) = (in_place(&x), in_place(&y));
    let (xm, ym) = (matrix(&x), matrix(&y));
    let (rows, cols) = (xm.rows, ym.cols);
    let shift = shift.as_ref().map(|s| s.as_array().to_vec());
    let out = py.detach(move || minplus::min_plus_one(xm, shift.as_deref(), ym))?;
    let array = Array2::from_shape_vec((rows, cols), out).expect("one entry per row and column");
    Ok(array.into_pyarray(py))
}

/// Per row of a matrix, the index of the first row equal to it ([`rows::first_equal`]: entries
/// compared as numbers). Arrays in C or Fortran order are read in place, others copied first.
#[pyfunction]
pub(super) fn first_equal<'py>(
    py: Python<'py>,
    m: PyReadonlyArray2<'py, f64>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let m = m.as_array();
    let m = in_place(&m);
    let m = matrix(&m);
    let firsts = py.detach(move || rows::first_equal(&m));
    let firsts: Vec<i64> = firsts
        .into_iter()
        .map(|f| i64::try_from(f).expect("a row index fits in i64"))
        .collect();
    Ok(firsts.into_pyarray(py))
}

/// The sum of gathered matrices ([`gathered::gathered_sum`]): each term `(matrix, rows, cols,
/// transposed)` gives entry `(i, j)` its `matrix[rows[i], cols[j]]` (`[rows[j], cols[i]]` if
/// transposed), summed in the terms' order, on all cores. Matrices in C or Fortran order are read
/// in place, others copied first. With `out` (a writable C-order matrix apart from the terms'),
/// the sum is written there, or with `add` added to its entries ([`gathered::gathered_into`]),
/// and `out` returned.
#[pyfunction]
#[pyo3(signature = (terms, out=None, add=false))]
#[allow(clippy::type_complexity)]
pub(super) fn gathered_sum<'py>(
    py: Python<'py>,
    terms: Vec<(
        PyReadonlyArray2<'py, f64>,
        PyReadonlyArray1<'py, i64>,
        PyReadonlyArray1<'py, i64>,
        bool,
    )>,
    out: Option<Bound<'py, PyArray2<f64>>>,
    add: bool,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let views: Vec<_> = terms.iter().map(|t| t.0.as_array()).collect();
    let owned: Vec<_> = views.iter().map(in_place).collect();
    let position = |p: &PyReadonlyArray1<'py, i64>| {
        p.as_array()
            .iter()
            .map(|&x| usize::try_from(x))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| Error::Shape("a gathered term has a negative position".into()))
    };
    let positions = terms
        .iter()
        .map(|t| Ok((position(&t.1)?, position(&t.2)?)))
        .collect::<Result<Vec<_>, Error>>()?;
    let terms: Vec<gathered::Term<'_>> = owned
        .iter()
        .zip(&positions)
        .zip(&terms)
        .map(|((m, (rows, cols)), t)| gathered::Term {
            matrix: matrix(m),
            rows,
            cols,
            transposed: t.3,
        })
        .collect();
    let Some(out) = out else {
        if add {
            return Err(Error::Shape("gathered_sum adds to out: none given".into()).into());
        }
        let (rows, cols, sum) = py.detach(|| gathered::gathered_sum(&terms))?;
        let array =
            Array2::from_shape_vec((rows, cols), sum).expect("one entry per row and column");
        return Ok(array.into_pyarray(py));
    };
    {
        // Borrowed for writing while the terms' matrices are borrowed for reading: numpy's
        // borrow checker refuses a matrix that shares memory with one of them.
        let mut written = out.try_readwrite().map_err(|_| {
            Error::Shape("gathered_sum's out must be writable and apart from the terms".into())
        })?;
        let (rows, cols) = written.as_array().dim();
        let slice = written
            .as_slice_mut()
            .map_err(|_| Error::Shape("gathered_sum's out must be in C order".into()))?;
        py.detach(|| gathered::gathered_into(slice, rows, cols, &terms, add))?;
    }
    Ok(out)
}

/// `a` itself if its memory is one slice in C or Fortran order with strides of no sign, else a
/// copy in C order.
fn in_place<'a>(a: &ArrayView2<'a, f64>) -> CowArray<'a, f64, Ix2> {
    if a.strides().iter().all(|&s| s >= 0) && a.as_slice_memory_order().is_some() {
        CowArray::from(*a)
    } else {
        CowArray::from(a.as_standard_layout().to_owned())
    }
}

/// The kernel's view of an array [`in_place`] gave.
fn matrix<'a>(a: &'a CowArray<'_, f64, Ix2>) -> minplus::Matrix<'a> {
    let (rows, cols) = a.dim();
    let strides = a.strides();
    minplus::Matrix {
        data: a.as_slice_memory_order().expect("one slice"),
        rows,
        cols,
        strides: [strides[0] as usize, strides[1] as usize],
    }
}

/// The frontier of the sum of two (cost, memory) Pareto tables (levels ascending, one row of
/// costs per level), the levels that do not fit under `cap` left out: `(mems, costs)`.
#[pyfunction]
pub(super) fn frontier_sum<'py>(
    py: Python<'py>,
    a: PyReadonlyArray2<'py, f64>,
    ma: PyReadonlyArray1<'py, f64>,
    b: PyReadonlyArray2<'py, f64>,
    mb: PyReadonlyArray1<'py, f64>,
    cap: f64,
) -> PyResult<(Bound<'py, PyArray1<f64>>, Bound<'py, PyArray2<f64>>)> {
    let width = a.as_array().dim().1;
    if b.as_array().dim().1 != width {
        return Err(Error::Shape(format!(
            "frontier tables of {width} and {} entries per level",
            b.as_array().dim().1
        ))
        .into());
    }
    let (a, ma, b, mb) = (a.as_slice()?, ma.as_slice()?, b.as_slice()?, mb.as_slice()?);
    let out = py.detach(move || pareto::frontier_sum(a, ma, b, mb, width, cap))?;
    let levels = out.mems.len();
    let costs =
        Array2::from_shape_vec((levels, width), out.costs).expect("one row of costs per level");
    Ok((out.mems.into_pyarray(py), costs.into_pyarray(py)))
}
