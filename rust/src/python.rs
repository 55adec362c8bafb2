//! The PyO3 bindings: `taps._core`. Thin wrappers over the plain-Rust core; every error becomes
//! one class of the `taps.TapsError` hierarchy here and nowhere else.

// PyO3 extracts arguments as owned values and wants `PyResult` from methods that may fail in
// other builds; these lints argue against the signatures the bindings need.
#![allow(
    clippy::needless_pass_by_value,
    clippy::unnecessary_wraps,
    clippy::type_complexity
)]

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray2};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::batch;
use crate::error::Error;
use crate::layout::Layout;
use crate::planner::{self, CommOp, Objective, Planner, Redistribution};
use crate::strategies::{self, Strategy};
use crate::topology::{self, Cluster, Collective, CostModel, Replicas, PAPER};
use crate::unify as unification;

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
    InfeasibleError,
    TapsError,
    "A search with no feasible assignment, such as a memory limit nothing meets."
);

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Layout(m) => LayoutError::new_err(m),
            Error::Unify(m) => UnifyError::new_err(m),
            Error::Strategy(m) => StrategyError::new_err(m),
            Error::Topology(m) => TopologyError::new_err(m),
        }
    }
}

fn unsigned(values: &[i64], what: &str, error: fn(String) -> Error) -> Result<Vec<u64>, Error> {
    values
        .iter()
        .map(|&v| {
            u64::try_from(v).map_err(|_| error(format!("{what} {values:?}: entry {v} is negative")))
        })
        .collect()
}

fn dtype(bytes: f64) -> Result<f64, Error> {
    if bytes.is_finite() && bytes > 0.0 {
        Ok(bytes)
    } else {
        Err(Error::Topology(format!(
            "dtype_bytes must be positive, got {bytes}"
        )))
    }
}

fn device_dim(k: Option<i64>) -> Result<Option<usize>, Error> {
    k.map(|k| {
        usize::try_from(k)
            .map_err(|_| Error::Topology(format!("device dim {k} is negative: dims count from 0")))
    })
    .transpose()
}

/// How a tensor is spread over the devices (SPEC section 1). Immutable.
#[pyclass(frozen, eq, hash, module = "taps", name = "Layout")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyLayout {
    inner: Layout,
}

impl From<Layout> for PyLayout {
    fn from(inner: Layout) -> Self {
        PyLayout { inner }
    }
}

#[pymethods]
impl PyLayout {
    #[new]
    #[pyo3(signature = (shape, device_matrix, tensor_map, partial=Vec::new()))]
    fn new(
        shape: Vec<i64>,
        device_matrix: Vec<i64>,
        tensor_map: Vec<i64>,
        partial: Vec<i64>,
    ) -> PyResult<Self> {
        let shape = unsigned(&shape, "shape", Error::Layout)?;
        let dm = device_matrix
            .iter()
            .map(|&d| {
                u64::try_from(d).map_err(|_| {
                    Error::Layout(format!(
                        "device matrix {device_matrix:?}: entry {d} is not a positive power of two"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let partial = partial
            .iter()
            .map(|&k| {
                usize::try_from(k).map_err(|_| {
                    Error::Layout(format!("partial {partial:?}: device dim {k} is negative"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Layout::with_partial(shape, dm, tensor_map, partial)?.into())
    }

    /// The device dims along which the devices hold partial sums (ascending).
    #[getter]
    fn partial(&self) -> Vec<usize> {
        self.inner.partial().to_vec()
    }

    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.inner.shape().to_vec()
    }

    #[getter]
    fn device_matrix(&self) -> Vec<u64> {
        self.inner.device_matrix().to_vec()
    }

    #[getter]
    fn tensor_map(&self) -> Vec<i64> {
        self.inner.tensor_map().to_vec()
    }

    #[getter]
    fn shard_shape(&self) -> Vec<u64> {
        self.inner.shard_shape()
    }

    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.num_devices()
    }

    /// Per tensor dim, the half-open `(start, stop)` range that `rank` holds.
    fn shard_index(&self, rank: i64) -> PyResult<Vec<(u64, u64)>> {
        let rank =
            u64::try_from(rank).map_err(|_| Error::Layout(format!("rank {rank} is negative")))?;
        Ok(self.inner.shard_index(rank)?)
    }

    /// `d_k`, the size of device dim `k` (0 innermost).
    fn device_dim_size(&self, k: i64) -> PyResult<u64> {
        match usize::try_from(k) {
            Ok(k) if k < self.inner.num_device_dims() => Ok(self.inner.dim_size(k)),
            _ => Err(Error::Layout(format!(
                "device dim {k} is not one of the {} dims of {:?}",
                self.inner.num_device_dims(),
                self.inner.device_matrix()
            ))
            .into()),
        }
    }

    /// The canonical form, a reshape that moves nothing: two layouts of one tensor hold the same
    /// elements (and partial sums) on every rank iff their normal forms are equal.
    fn normalized(&self) -> PyLayout {
        unification::normalized(&self.inner).into()
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        let partial = if l.partial().is_empty() {
            String::new()
        } else {
            format!(", partial={:?}", l.partial())
        };
        format!(
            "Layout(shape={:?}, device_matrix={:?}, tensor_map={:?}{partial})",
            l.shape(),
            l.device_matrix(),
            l.tensor_map()
        )
    }

    fn __reduce__(
        slf: &Bound<'_, Self>,
    ) -> PyResult<(Py<PyAny>, (Vec<u64>, Vec<u64>, Vec<i64>, Vec<usize>))> {
        let l = &slf.get().inner;
        Ok((
            slf.get_type().into_any().unbind(),
            (
                l.shape().to_vec(),
                l.device_matrix().to_vec(),
                l.tensor_map().to_vec(),
                l.partial().to_vec(),
            ),
        ))
    }
}

/// A homogeneous cluster of `nodes` nodes with `devices_per_node` devices each.
#[pyclass(frozen, eq, module = "taps", name = "Cluster")]
#[derive(Clone, PartialEq)]
pub struct PyCluster {
    inner: Cluster,
}

fn count(v: i64, what: &str) -> Result<u64, Error> {
    u64::try_from(v).map_err(|_| {
        Error::Topology(format!(
            "a cluster needs a positive number of {what}, got {v}"
        ))
    })
}

#[pymethods]
impl PyCluster {
    #[new]
    #[pyo3(signature = (
        nodes,
        devices_per_node,
        intra_bandwidth=PAPER.levels[0].1,
        inter_bandwidth=PAPER.levels[1].1,
        device_memory=None,
        *,
        intra_latency=0.0,
        inter_latency=0.0,
        replicas="shared",
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        nodes: i64,
        devices_per_node: i64,
        intra_bandwidth: f64,
        inter_bandwidth: f64,
        device_memory: Option<f64>,
        intra_latency: f64,
        inter_latency: f64,
        replicas: &str,
    ) -> PyResult<Self> {
        let (Ok(n), Ok(l)) = (u64::try_from(nodes), u64::try_from(devices_per_node)) else {
            return Err(Error::Topology(format!(
                "a cluster needs a positive number of nodes and devices per node, got {nodes} \
                 nodes of {devices_per_node}"
            ))
            .into());
        };
        Ok(PyCluster {
            inner: Cluster::hierarchy(
                &[
                    (l, intra_bandwidth, intra_latency),
                    (n, inter_bandwidth, inter_latency),
                ],
                device_memory,
                Replicas::parse(replicas)?,
            )?,
        })
    }

    /// A cluster of nested levels, innermost first, each `(parts, bandwidth, latency)`: the
    /// devices per node, then the nodes per pod, ..., then the outermost units.
    #[staticmethod]
    #[pyo3(signature = (levels, device_memory=None, replicas="shared"))]
    fn hierarchy(
        levels: Vec<(i64, f64, f64)>,
        device_memory: Option<f64>,
        replicas: &str,
    ) -> PyResult<Self> {
        let levels = levels
            .into_iter()
            .map(|(c, b, l)| Ok((count(c, "parts per level")?, b, l)))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(PyCluster {
            inner: Cluster::hierarchy(&levels, device_memory, Replicas::parse(replicas)?)?,
        })
    }

    /// The built-in cluster `name` (`"dgx-v100"`, `"dgx-h100"`) with `nodes` nodes, or the
    /// cluster of a TOML file (a name ending in `.toml`, read by `taps.cluster_presets`).
    #[classmethod]
    #[pyo3(signature = (name, nodes=1))]
    fn preset(cls: &Bound<'_, pyo3::types::PyType>, name: &str, nodes: i64) -> PyResult<Py<PyAny>> {
        let py = cls.py();
        let is_file = std::path::Path::new(name)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
        if is_file {
            let module = py.import("taps.cluster_presets")?;
            return Ok(module.call_method1("from_toml", (name, nodes))?.unbind());
        }
        let cluster = PyCluster {
            inner: Cluster::preset(name, count(nodes, "nodes")?)?,
        };
        Ok(Py::new(py, cluster)?.into_any())
    }

    /// The levels as `hierarchy` takes them.
    #[getter]
    fn levels(&self) -> Vec<(u64, f64, f64)> {
        self.inner.level_parts()
    }

    #[getter]
    fn replicas(&self) -> &'static str {
        self.inner.replicas.name()
    }

    #[getter]
    fn nodes(&self) -> u64 {
        self.inner.nodes
    }

    #[getter]
    fn devices_per_node(&self) -> u64 {
        self.inner.devices_per_node
    }

    #[getter]
    fn intra_bandwidth(&self) -> f64 {
        self.inner.intra_bandwidth
    }

    #[getter]
    fn inter_bandwidth(&self) -> f64 {
        self.inner.inter_bandwidth
    }

    #[getter]
    fn device_memory(&self) -> Option<f64> {
        self.inner.device_memory
    }

    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.num_devices()
    }

    /// Seconds (topology model) or bytes per device (volume model) of a collective of `layout`.
    #[pyo3(signature = (layout, collective, device_dim=None, dtype_bytes=2.0, model="topology"))]
    fn collective_cost(
        &self,
        layout: &PyLayout,
        collective: &str,
        device_dim: Option<i64>,
        dtype_bytes: f64,
        model: &str,
    ) -> PyResult<f64> {
        Ok(self.inner.collective_cost(
            &layout.inner,
            Collective::parse(collective)?,
            self::device_dim(device_dim)?,
            dtype(dtype_bytes)?,
            CostModel::parse(model)?,
        )?)
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        let memory = c
            .device_memory
            .map_or("None".to_string(), |m| format!("{m:e}"));
        let paper_like = c.levels.len() == 2
            && c.replicas == Replicas::Shared
            && c.levels.iter().all(|l| l.latency == 0.0);
        if paper_like {
            format!(
                "Cluster(nodes={}, devices_per_node={}, intra_bandwidth={:e}, inter_bandwidth={:e}, device_memory={memory})",
                c.nodes, c.devices_per_node, c.intra_bandwidth, c.inter_bandwidth
            )
        } else {
            let levels: Vec<String> = c
                .level_parts()
                .iter()
                .map(|(n, b, l)| format!("({n}, {b:e}, {l:e})"))
                .collect();
            format!(
                "Cluster.hierarchy([{}], device_memory={memory}, replicas={:?})",
                levels.join(", "),
                c.replicas.name()
            )
        }
    }

    fn __reduce__(
        slf: &Bound<'_, Self>,
    ) -> PyResult<(Py<PyAny>, (Vec<(u64, f64, f64)>, Option<f64>, &'static str))> {
        let c = &slf.get().inner;
        Ok((
            slf.get_type().getattr("hierarchy")?.unbind(),
            (c.level_parts(), c.device_memory, c.replicas.name()),
        ))
    }
}

/// One step of a redistribution.
#[pyclass(frozen, eq, hash, module = "taps", name = "CommOp")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyCommOp {
    inner: CommOp,
}

#[pymethods]
impl PyCommOp {
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind.name()
    }

    #[getter]
    fn device_dim(&self) -> usize {
        self.inner.device_dim
    }

    #[getter]
    fn tensor_dim(&self) -> Option<usize> {
        self.inner.tensor_dim
    }

    #[getter]
    fn to_tensor_dim(&self) -> Option<usize> {
        self.inner.to_tensor_dim
    }

    /// Collective-permute only: for each device dim, the device dim that takes over its splits.
    #[getter]
    fn permutation(&self) -> Option<Vec<usize>> {
        self.inner.permutation.clone()
    }

    #[getter]
    fn group_size(&self) -> u64 {
        self.inner.group_size
    }

    #[getter]
    fn volume(&self) -> u64 {
        self.inner.volume
    }

    #[getter]
    fn layout(&self) -> PyLayout {
        self.inner.layout.clone().into()
    }

    /// `ct` of this op on nodes of `devices_per_node` devices (0 for a slice).
    fn inter_node_groups(&self, devices_per_node: i64) -> PyResult<u64> {
        match u64::try_from(devices_per_node) {
            Ok(l) if l.is_power_of_two() => Ok(self.inner.inter_node_groups(l)),
            _ => Err(Error::Topology(format!(
                "devices_per_node must be a positive power of two, got {devices_per_node}"
            ))
            .into()),
        }
    }

    #[pyo3(signature = (cluster, dtype_bytes=2.0, model="topology"))]
    fn cost(&self, cluster: &PyCluster, dtype_bytes: f64, model: &str) -> PyResult<f64> {
        Ok(self.inner.cost(
            &cluster.inner,
            dtype(dtype_bytes)?,
            CostModel::parse(model)?,
        )?)
    }

    fn __repr__(&self) -> String {
        let o = &self.inner;
        let on = match (&o.permutation, o.tensor_dim, o.to_tensor_dim) {
            (Some(p), _, _) => format!("permutation={p:?}"),
            (None, Some(i), Some(to)) => {
                format!("device_dim={}, tensor_dim={i} -> {to}", o.device_dim)
            }
            (None, Some(i), None) => format!("device_dim={}, tensor_dim={i}", o.device_dim),
            (None, None, _) => format!("device_dim={}", o.device_dim),
        };
        format!(
            "CommOp({}({on}), group_size={}, volume={})",
            o.kind.name(),
            o.group_size,
            o.volume
        )
    }
}

fn ops(list: &[CommOp]) -> Vec<PyCommOp> {
    list.iter().map(|o| PyCommOp { inner: o.clone() }).collect()
}

/// A redistribution plan: the unified layouts and the ops between them.
#[pyclass(frozen, eq, module = "taps", name = "Redistribution")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyRedistribution {
    inner: Redistribution,
}

#[pymethods]
impl PyRedistribution {
    #[getter]
    fn source(&self) -> PyLayout {
        self.inner.source.clone().into()
    }

    #[getter]
    fn target(&self) -> PyLayout {
        self.inner.target.clone().into()
    }

    #[getter]
    fn ops(&self) -> Vec<PyCommOp> {
        ops(&self.inner.ops)
    }

    #[getter]
    fn prelude(&self) -> Vec<PyCommOp> {
        ops(&self.inner.prelude)
    }

    #[getter]
    fn epilogue(&self) -> Vec<PyCommOp> {
        ops(&self.inner.epilogue)
    }

    #[getter]
    fn all_ops(&self) -> Vec<PyCommOp> {
        self.inner
            .all_ops()
            .map(|o| PyCommOp { inner: o.clone() })
            .collect()
    }

    /// Elements received per device over the whole plan.
    #[getter]
    fn volume(&self) -> u64 {
        self.inner.volume()
    }

    /// Seconds (topology model) or bytes per device (volume model) of the whole plan.
    #[pyo3(signature = (cluster, dtype_bytes=2.0, model="topology"))]
    fn cost(&self, cluster: &PyCluster, dtype_bytes: f64, model: &str) -> PyResult<f64> {
        Ok(self.inner.cost(
            &cluster.inner,
            dtype(dtype_bytes)?,
            CostModel::parse(model)?,
        )?)
    }

    fn __repr__(&self) -> String {
        let steps: Vec<String> = self
            .inner
            .all_ops()
            .map(|o| PyCommOp { inner: o.clone() }.__repr__())
            .collect();
        format!(
            "Redistribution(volume={}, ops=[{}])",
            self.inner.volume(),
            steps.join(", ")
        )
    }
}

/// Degrees and device dims for the partitionable axes of one operator.
#[pyclass(frozen, eq, hash, module = "taps", name = "Strategy")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyStrategy {
    inner: Strategy,
}

#[pymethods]
impl PyStrategy {
    #[new]
    fn new(degrees: Vec<i64>, device_map: Vec<i64>) -> PyResult<Self> {
        Ok(PyStrategy {
            inner: Strategy::new(unsigned(&degrees, "degrees", Error::Strategy)?, device_map)?,
        })
    }

    #[getter]
    fn degrees(&self) -> Vec<u64> {
        self.inner.degrees.clone()
    }

    #[getter]
    fn device_map(&self) -> Vec<i64> {
        self.inner.device_map.clone()
    }

    #[getter]
    fn device_matrix(&self) -> Vec<u64> {
        self.inner.device_matrix()
    }

    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.degrees.iter().product()
    }

    /// The layout of a tensor whose dims are the strategy's axes `axes` (-1: a whole dim).
    fn tensor_layout(&self, axes: Vec<i64>, shape: Vec<i64>) -> PyResult<PyLayout> {
        let shape = unsigned(&shape, "shape", Error::Layout)?;
        Ok(self.inner.tensor_layout(&axes, shape)?.into())
    }

    fn __repr__(&self) -> String {
        format!(
            "Strategy(degrees={:?}, device_map={:?})",
            self.inner.degrees, self.inner.device_map
        )
    }

    fn __reduce__(slf: &Bound<'_, Self>) -> PyResult<(Py<PyAny>, (Vec<u64>, Vec<i64>))> {
        let s = &slf.get().inner;
        Ok((
            slf.get_type().into_any().unbind(),
            (s.degrees.clone(), s.device_map.clone()),
        ))
    }
}

/// Rewrites two layouts of one tensor to one device matrix and one shape (SPEC section 2).
#[pyfunction]
fn unify(a: &PyLayout, b: &PyLayout) -> PyResult<(PyLayout, PyLayout)> {
    let (x, y) = unification::unify(&a.inner, &b.inner)?;
    Ok((x.into(), y.into()))
}

/// Plans the redistribution from layout `a` to layout `b`: the optimal planner minimizes seconds
/// on `cluster` (elements per device without one), the paper's is Algorithm 1.
#[pyfunction]
#[pyo3(signature = (a, b, cluster=None, planner="paper", dtype_bytes=2.0))]
fn plan_redistribution(
    a: &PyLayout,
    b: &PyLayout,
    cluster: Option<&PyCluster>,
    planner: &str,
    dtype_bytes: f64,
) -> PyResult<PyRedistribution> {
    let planner = Planner::parse(planner)?;
    let dtype_bytes = dtype(dtype_bytes)?;
    let objective = cluster.map_or(Objective::Volume, |c| Objective::Seconds {
        cluster: &c.inner,
        dtype_bytes,
    });
    Ok(PyRedistribution {
        inner: planner::plan_redistribution(&a.inner, &b.inner, planner, objective)?,
    })
}

/// The exact `ct` of SPEC section 6.
#[pyfunction]
#[pyo3(signature = (layout, collective, devices_per_node, device_dim=None))]
fn inter_node_groups(
    layout: &PyLayout,
    collective: &str,
    devices_per_node: i64,
    device_dim: Option<i64>,
) -> PyResult<u64> {
    let l = u64::try_from(devices_per_node).map_err(|_| {
        Error::Topology(format!(
            "devices_per_node must be a positive power of two, got {devices_per_node}"
        ))
    })?;
    Ok(topology::inter_node_groups(
        &layout.inner,
        Collective::parse(collective)?,
        l,
        self::device_dim(device_dim)?,
    )?)
}

/// Every strategy of `axis_sizes` on `num_devices` devices (SPEC section 4), in a fixed order.
#[pyfunction]
fn enumerate_strategies(axis_sizes: Vec<i64>, num_devices: i64) -> PyResult<Vec<PyStrategy>> {
    let sizes = unsigned(&axis_sizes, "axis sizes", Error::Strategy)?;
    let n = u64::try_from(num_devices).map_err(|_| {
        Error::Strategy(format!(
            "the device count must be a power of two, got {num_devices}"
        ))
    })?;
    Ok(strategies::enumerate_strategies(&sizes, n)?
        .into_iter()
        .map(|inner| PyStrategy { inner })
        .collect())
}

/// The matrix of redistribution costs from each source to each target, on all cores.
#[pyfunction]
#[pyo3(signature = (sources, targets, cluster, dtype_bytes=2.0, model="topology", planner="paper"))]
fn redistribution_costs<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    cluster: &PyCluster,
    dtype_bytes: f64,
    model: &str,
    planner: &str,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let planner = Planner::parse(planner)?;
    let sources: Vec<Layout> = sources.iter().map(|l| l.get().inner.clone()).collect();
    let targets: Vec<Layout> = targets.iter().map(|l| l.get().inner.clone()).collect();
    let cluster = cluster.inner.clone();
    let dtype_bytes = dtype(dtype_bytes)?;
    let model = CostModel::parse(model)?;
    let shape = (sources.len(), targets.len());
    let costs = py.detach(move || {
        batch::redistribution_costs(&sources, &targets, &cluster, dtype_bytes, model, planner)
    })?;
    let array = Array2::from_shape_vec(shape, costs).expect("one cost per pair");
    Ok(array.into_pyarray(py))
}

/// Per strategy (rows of `degrees` and `device_maps`), the summed all_reduce cost of the tensors
/// (strategy axes, shape, dtype bytes) over the device dims each leaves unused, on all cores.
#[pyfunction]
#[pyo3(signature = (degrees, device_maps, tensors, cluster, model="topology"))]
fn allreduce_costs<'py>(
    py: Python<'py>,
    degrees: PyReadonlyArray2<'py, i64>,
    device_maps: PyReadonlyArray2<'py, i64>,
    tensors: Vec<(Vec<i64>, Vec<i64>, f64)>,
    cluster: &PyCluster,
    model: &str,
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
    let strategies = degrees
        .rows()
        .into_iter()
        .zip(device_maps.rows())
        .map(|(d, m)| {
            // Straight from the row (a copy only if it is not contiguous).
            let degrees = match d.as_slice() {
                Some(row) => unsigned(row, "degrees", Error::Strategy)?,
                None => unsigned(&d.to_vec(), "degrees", Error::Strategy)?,
            };
            Strategy::new(degrees, m.to_vec())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tensors = tensors
        .into_iter()
        .map(|(axes, shape, bytes)| {
            Ok(batch::AxesTensor {
                axes,
                shape: unsigned(&shape, "shape", Error::Layout)?,
                dtype_bytes: dtype(bytes)?,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let cluster = cluster.inner.clone();
    let model = CostModel::parse(model)?;
    let costs =
        py.detach(move || batch::allreduce_costs(&strategies, &tensors, &cluster, model))?;
    Ok(costs.into_pyarray(py))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TapsError", py.get_type::<TapsError>())?;
    m.add("LayoutError", py.get_type::<LayoutError>())?;
    m.add("UnifyError", py.get_type::<UnifyError>())?;
    m.add("StrategyError", py.get_type::<StrategyError>())?;
    m.add("TopologyError", py.get_type::<TopologyError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("InfeasibleError", py.get_type::<InfeasibleError>())?;
    m.add_class::<PyLayout>()?;
    m.add_class::<PyCluster>()?;
    m.add_class::<PyCommOp>()?;
    m.add_class::<PyRedistribution>()?;
    m.add_class::<PyStrategy>()?;
    m.add_function(wrap_pyfunction!(unify, m)?)?;
    m.add_function(wrap_pyfunction!(plan_redistribution, m)?)?;
    m.add_function(wrap_pyfunction!(inter_node_groups, m)?)?;
    m.add_function(wrap_pyfunction!(enumerate_strategies, m)?)?;
    m.add_function(wrap_pyfunction!(redistribution_costs, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_costs, m)?)?;
    Ok(())
}
