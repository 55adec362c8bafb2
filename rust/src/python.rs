//! The PyO3 bindings: `taps._core`. Thin wrappers over the plain-Rust core; every error becomes
//! one class of the `taps.TapsError` hierarchy here and nowhere else.

// PyO3 extracts arguments as owned values and wants `PyResult` from methods that may fail in
// other builds; these lints argue against the signatures the bindings need.
#![allow(
    clippy::needless_pass_by_value,
    clippy::unnecessary_wraps,
    clippy::type_complexity
)]

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use numpy::ndarray::Array2;
use numpy::ndarray::Array3;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArray3, PyReadonlyArray2, PyReadonlyArray3};
use pyo3::create_exception;
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use crate::batch;
use crate::error::Error;
use crate::layout::Layout;
use crate::minplus;
use crate::plan::{self, CommOp, Objective, Planner, Redistribution};
use crate::strategies::{self, Strategy};
use crate::topology::{self, Cluster, CollectiveKind, CostModel, Replicas, PAPER};
use crate::unify as unification;

/// The extension's allocator, set here and not in the library so that a Rust user of the crate
/// keeps their own. The kernels, and the bindings that turn their numpy rows into strategies,
/// allocate many small short-lived vectors, for which mimalloc is faster than the system
/// allocator on the Python path of `allreduce_costs`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
            Error::Shape(m) => TapsError::new_err(m),
        }
    }
}

/// A number argument as the bindings take it: its value, or, for a Python number too large for
/// `T` (an int of 2**63 or more for an `i64`), its text. PyO3 would raise `OverflowError` while
/// extracting it, before the binding could say which argument is wrong; this way the binding
/// raises the `TapsError` of its domain naming the argument and the value.
enum Num<T> {
    Fits(T),
    TooLarge(String),
}

impl<'a, 'py, T: FromPyObject<'a, 'py>> FromPyObject<'a, 'py> for Num<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match T::extract(obj) {
            Ok(v) => Ok(Num::Fits(v)),
            Err(e) => {
                let e: PyErr = e.into();
                if e.is_instance_of::<PyOverflowError>(obj.py()) {
                    Ok(Num::TooLarge(too_large(&obj)))
                } else {
                    Err(e)
                }
            }
        }
    }
}

/// The text of a number too large for a machine type: its digits, or for a huge int its size
/// (Python refuses to print ints of more than a few thousand digits).
fn too_large(obj: &Bound<'_, PyAny>) -> String {
    let bits = obj
        .call_method0("bit_length")
        .and_then(|b| b.extract::<u64>());
    match bits {
        Ok(bits) if bits > 128 => format!("an int of {bits} bits"),
        _ => obj
            .str()
            .map_or_else(|_| "a number".to_string(), |s| s.to_string()),
    }
}

impl<T: fmt::Display> fmt::Display for Num<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Fits(v) => v.fmt(f),
            Num::TooLarge(text) => f.write_str(text),
        }
    }
}

/// The error kind of a binding's domain: a variant of [`Error`].
type Kind = fn(String) -> Error;

/// The range of a machine number, as an error message states it.
trait Range {
    const RANGE: &'static str;
}

impl Range for i64 {
    const RANGE: &'static str = "from -2**63 to 2**63 - 1";
}

impl Range for f64 {
    const RANGE: &'static str = "of at most about 1.8e308";
}

impl<T: Copy + Range> Num<T> {
    /// The value of argument `what`.
    fn get(&self, what: &str, kind: Kind) -> Result<T, Error> {
        match self {
            Num::Fits(v) => Ok(*v),
            Num::TooLarge(text) => Err(kind(format!(
                "{what} must be a number {}, got {text}",
                T::RANGE
            ))),
        }
    }
}

impl Num<i64> {
    /// The value of argument `what`, which must be `need` (a description of a non-negative value).
    fn unsigned(&self, what: &str, need: &str, kind: Kind) -> Result<u64, Error> {
        let v = self.get(what, kind)?;
        u64::try_from(v).map_err(|_| kind(format!("{what} must be {need}, got {v}")))
    }
}

/// `[a, b, ...]` of numbers as Python prints a list.
fn listed<T: fmt::Display>(values: &[Num<T>]) -> String {
    let items: Vec<String> = values.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// The values of list argument `what`.
fn signed_list(values: &[Num<i64>], what: &str, kind: Kind) -> Result<Vec<i64>, Error> {
    values
        .iter()
        .map(|v| match v {
            Num::Fits(v) => Ok(*v),
            Num::TooLarge(text) => Err(kind(format!(
                "{what} {}: entry {text} is not a number {}",
                listed(values),
                i64::RANGE
            ))),
        })
        .collect()
}

/// The values of list argument `what`, each of which must be `need` (non-negative).
fn unsigned_list(
    values: &[Num<i64>],
    what: &str,
    need: &str,
    kind: Kind,
) -> Result<Vec<u64>, Error> {
    signed_list(values, what, kind)?
        .into_iter()
        .map(|v| {
            u64::try_from(v).map_err(|_| {
                kind(format!(
                    "{what} {}: entry {v} is not {need}",
                    listed(values)
                ))
            })
        })
        .collect()
}

/// The strategy of `degrees` and `device_map` on `device_matrix` (Python's `Strategy(...)`), or
/// on one dim per split axis without one.
fn strategy(
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

/// The device dim argument `device_dim`, if given.
fn device_dim(k: Option<Num<i64>>, kind: Kind) -> Result<Option<usize>, Error> {
    k.map(|k| {
        let k = k.get("device_dim", kind)?;
        usize::try_from(k).map_err(|_| {
            kind(format!(
                "device_dim must be a device dim (0 innermost), got {k}"
            ))
        })
    })
    .transpose()
}

/// How a tensor is spread over the devices: its shape, the device matrix (outermost dim first,
/// device dim 0 innermost), the tensor map (per tensor dim, the device dim it is split along, or
/// -1) and the device dims `partial` along which the devices hold partial sums rather than copies.
/// See docs/conventions.md#layouts. Immutable, hashable, picklable.
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
        shape: Vec<Num<i64>>,
        device_matrix: Vec<Num<i64>>,
        tensor_map: Vec<Num<i64>>,
        partial: Vec<Num<i64>>,
    ) -> PyResult<Self> {
        let shape = unsigned_list(&shape, "shape", "a positive size", Error::Layout)?;
        let dm = unsigned_list(
            &device_matrix,
            "device matrix",
            "a positive power of two",
            Error::Layout,
        )?;
        let map = signed_list(&tensor_map, "tensor map", Error::Layout)?;
        let partial = signed_list(&partial, "partial", Error::Layout)?
            .into_iter()
            .map(|k| {
                usize::try_from(k).map_err(|_| {
                    Error::Layout(format!(
                        "partial {}: entry {k} is not a device dim (0 innermost)",
                        listed(&partial)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Layout::with_partial(shape, dm, map, partial)?.into())
    }

    /// The device dims along which the devices hold partial sums (ascending): the devices that
    /// differ only there hold addends whose sum is the tensor.
    #[getter]
    fn partial(&self) -> Vec<usize> {
        self.inner.partial().to_vec()
    }

    /// The global shape of the tensor.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.inner.shape().to_vec()
    }

    /// The device matrix, outermost dim first: the last entry is device dim 0.
    #[getter]
    fn device_matrix(&self) -> Vec<u64> {
        self.inner.device_matrix().to_vec()
    }

    /// Per tensor dim, the device dim it is split along (0 innermost), or -1 if it is whole.
    #[getter]
    fn tensor_map(&self) -> Vec<i64> {
        self.inner.tensor_map().to_vec()
    }

    /// The shape of the block each device holds.
    #[getter]
    fn shard_shape(&self) -> Vec<u64> {
        self.inner.shard_shape()
    }

    /// The number of devices: the product of the device matrix.
    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.num_devices()
    }

    /// Per tensor dim, the half-open `(start, stop)` range that `rank` holds.
    fn shard_index(&self, rank: Num<i64>) -> PyResult<Vec<(u64, u64)>> {
        let rank = rank.unsigned("rank", "a device rank (at least 0)", Error::Layout)?;
        Ok(self.inner.shard_index(rank)?)
    }

    /// `d_k`, the size of device dim `k` (0 innermost).
    fn device_dim_size(&self, k: Num<i64>) -> PyResult<u64> {
        let k = k.get("k", Error::Layout)?;
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

    /// The same tensor dims (size-1 dims dropped) with the device matrix cut only where a split or
    /// a partial dim needs it: layouts with equal compacted forms hold the same elements and get
    /// the same plans from Algorithm 1, so the search prices one of them for all.
    fn compacted(&self) -> PyLayout {
        unification::compacted(&self.inner).into()
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

/// A homogeneous cluster of `nodes` nodes with `devices_per_node` devices each; a node holds
/// consecutive ranks. Bandwidths in bytes per second, latencies in seconds per collective, memory
/// in bytes per device; `replicas` says whether copies of a tensor share one transfer out of a
/// node (`"shared"`, the paper's model) or send one each (`"flat"`). More levels (nodes in pods):
/// `Cluster.hierarchy`; named clusters: `Cluster.preset`. Immutable, picklable.
#[pyclass(frozen, eq, module = "taps", name = "Cluster")]
#[derive(Clone, PartialEq)]
pub struct PyCluster {
    inner: Cluster,
}

/// The argument `device_memory`, if given.
fn memory(device_memory: Option<Num<f64>>) -> Result<Option<f64>, Error> {
    device_memory
        .map(|m| m.get("device_memory", Error::Topology))
        .transpose()
}

#[pymethods]
impl PyCluster {
    #[new]
    #[pyo3(
        signature = (
            nodes,
            devices_per_node,
            intra_bandwidth=Num::Fits(PAPER.levels[0].1),
            inter_bandwidth=Num::Fits(PAPER.levels[1].1),
            device_memory=None,
            *,
            intra_latency=Num::Fits(0.0),
            inter_latency=Num::Fits(0.0),
            replicas="shared",
        ),
        text_signature = "(nodes, devices_per_node, intra_bandwidth=60e9, inter_bandwidth=6e9, device_memory=None, *, intra_latency=0.0, inter_latency=0.0, replicas='shared')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        nodes: Num<i64>,
        devices_per_node: Num<i64>,
        intra_bandwidth: Num<f64>,
        inter_bandwidth: Num<f64>,
        device_memory: Option<Num<f64>>,
        intra_latency: Num<f64>,
        inter_latency: Num<f64>,
        replicas: &str,
    ) -> PyResult<Self> {
        let positive = "a positive count";
        let kind = Error::Topology;
        Ok(PyCluster {
            inner: Cluster::hierarchy(
                &[
                    (
                        devices_per_node.unsigned("devices_per_node", positive, kind)?,
                        intra_bandwidth.get("intra_bandwidth", kind)?,
                        intra_latency.get("intra_latency", kind)?,
                    ),
                    (
                        nodes.unsigned("nodes", positive, kind)?,
                        inter_bandwidth.get("inter_bandwidth", kind)?,
                        inter_latency.get("inter_latency", kind)?,
                    ),
                ],
                memory(device_memory)?,
                Replicas::parse(replicas)?,
            )?,
        })
    }

    /// A cluster of nested levels, innermost first, each `(parts, bandwidth, latency)`: the
    /// devices per node, then the nodes per pod, ..., then the outermost units. Bandwidths in
    /// bytes per second out of one part of the level below, latencies in seconds per collective.
    /// With `nodes`, the outermost level holds as many units as the nodes fill (its parts are not
    /// read; one level is one node), as presets and cluster files are read.
    #[staticmethod]
    #[pyo3(signature = (levels, device_memory=None, replicas="shared", *, nodes=None))]
    fn hierarchy(
        levels: Vec<(Num<i64>, Num<f64>, Num<f64>)>,
        device_memory: Option<Num<f64>>,
        replicas: &str,
        nodes: Option<Num<i64>>,
    ) -> PyResult<Self> {
        let kind = Error::Topology;
        let levels = levels
            .iter()
            .enumerate()
            .map(|(j, (parts, bandwidth, latency))| {
                Ok((
                    parts.unsigned(&format!("the parts of level {j}"), "a positive count", kind)?,
                    bandwidth.get(&format!("the bandwidth of level {j}"), kind)?,
                    latency.get(&format!("the latency of level {j}"), kind)?,
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let (memory, replicas) = (memory(device_memory)?, Replicas::parse(replicas)?);
        let inner = match nodes {
            None => Cluster::hierarchy(&levels, memory, replicas)?,
            Some(n) => Cluster::filled(
                &levels,
                n.unsigned("nodes", "a positive count", kind)?,
                memory,
                replicas,
            )?,
        };
        Ok(PyCluster { inner })
    }

    /// The built-in cluster `name` (`"dgx-v100"`, `"dgx-h100"`) with `nodes` nodes, or the
    /// cluster of a TOML file (a name ending in `.toml`; docs/core.md).
    #[classmethod]
    #[pyo3(signature = (name, nodes=Num::Fits(1)), text_signature = "(name, nodes=1)")]
    fn preset(_cls: &Bound<'_, PyType>, name: &str, nodes: Num<i64>) -> PyResult<Self> {
        let nodes = nodes.unsigned("nodes", "a positive count", Error::Topology)?;
        Ok(PyCluster {
            inner: Cluster::preset(name, nodes)?,
        })
    }

    /// The levels as `hierarchy` takes them: `(parts, bandwidth, latency)`, innermost first.
    #[getter]
    fn levels(&self) -> Vec<(u64, f64, f64)> {
        self.inner.level_parts()
    }

    /// How copies of a tensor send it out of a node: `"shared"` (one transfer for all the
    /// copies, as the paper) or `"flat"` (one per copy, as NCCL).
    #[getter]
    fn replicas(&self) -> &'static str {
        self.inner.replicas().name()
    }

    /// The number of nodes.
    #[getter]
    fn nodes(&self) -> u64 {
        self.inner.nodes()
    }

    /// Devices per node.
    #[getter]
    fn devices_per_node(&self) -> u64 {
        self.inner.devices_per_node()
    }

    /// Bytes per second between two devices of one node.
    #[getter]
    fn intra_bandwidth(&self) -> f64 {
        self.inner.intra_bandwidth()
    }

    /// Bytes per second out of a node, shared by every group that crosses it at once.
    #[getter]
    fn inter_bandwidth(&self) -> f64 {
        self.inner.inter_bandwidth()
    }

    /// Bytes of memory per device, or None if unlimited.
    #[getter]
    fn device_memory(&self) -> Option<f64> {
        self.inner.device_memory()
    }

    /// The number of devices: nodes times devices per node.
    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.num_devices()
    }

    /// Seconds (topology model) or bytes per device (volume model) of a collective of `layout`:
    /// an `"all_reduce"` over the device dims the map does not use (no `device_dim`), or any
    /// other kind of `COLLECTIVE_KINDS` along `device_dim`.
    #[pyo3(
        signature = (layout, collective, device_dim=None, dtype_bytes=Num::Fits(2.0), model="topology"),
        text_signature = "($self, layout, collective, device_dim=None, dtype_bytes=2.0, model='topology')"
    )]
    fn collective_cost(
        &self,
        layout: &PyLayout,
        collective: &str,
        device_dim: Option<Num<i64>>,
        dtype_bytes: Num<f64>,
        model: &str,
    ) -> PyResult<f64> {
        Ok(self.inner.collective_cost(
            &layout.inner,
            CollectiveKind::parse(collective)?,
            self::device_dim(device_dim, Error::Topology)?,
            dtype_bytes.get("dtype_bytes", Error::Topology)?,
            CostModel::parse(model)?,
        )?)
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        let memory = c
            .device_memory()
            .map_or("None".to_string(), |m| format!("{m:e}"));
        let paper_like = c.levels().len() == 2
            && c.replicas() == Replicas::Shared
            && c.levels().iter().all(|l| l.latency == 0.0);
        if paper_like {
            format!(
                "Cluster(nodes={}, devices_per_node={}, intra_bandwidth={:e}, inter_bandwidth={:e}, device_memory={memory})",
                c.nodes(),
                c.devices_per_node(),
                c.intra_bandwidth(),
                c.inter_bandwidth()
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
                c.replicas().name()
            )
        }
    }

    fn __reduce__(
        slf: &Bound<'_, Self>,
    ) -> PyResult<(Py<PyAny>, (Vec<(u64, f64, f64)>, Option<f64>, &'static str))> {
        let c = &slf.get().inner;
        Ok((
            slf.get_type().getattr("hierarchy")?.unbind(),
            (c.level_parts(), c.device_memory(), c.replicas().name()),
        ))
    }
}

/// One step of a redistribution, with the layout it acts on: a slice, all_gather, all_to_all,
/// reduce_scatter or all_reduce along one device dim, or a collective_permute of whole blocks.
#[pyclass(frozen, eq, hash, module = "taps", name = "CommOp")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyCommOp {
    inner: CommOp,
}

#[pymethods]
impl PyCommOp {
    /// `"slice"`, `"all_gather"`, `"all_to_all"`, `"reduce_scatter"`, `"all_reduce"` or
    /// `"collective_permute"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind().name()
    }

    /// The device dim the op runs along (0 innermost; for a collective_permute, the innermost
    /// device dim it moves).
    #[getter]
    fn device_dim(&self) -> usize {
        self.inner.device_dim()
    }

    /// The tensor dim sliced, gathered (for an all_to_all, the one gathered) or split by a
    /// reduce_scatter; None for an all_reduce or a collective_permute.
    #[getter]
    fn tensor_dim(&self) -> Option<usize> {
        self.inner.tensor_dim()
    }

    /// For an all_to_all, the tensor dim that gets split; None otherwise.
    #[getter]
    fn to_tensor_dim(&self) -> Option<usize> {
        self.inner.to_tensor_dim()
    }

    /// Collective-permute only: per device dim `k`, the device dim that takes over its splits.
    #[getter]
    fn permutation(&self) -> Option<Vec<usize>> {
        self.inner.permutation().map(<[usize]>::to_vec)
    }

    /// The number of devices in each group: the size of the device dim (for a
    /// collective_permute, the product of the device dims it moves).
    #[getter]
    fn group_size(&self) -> u64 {
        self.inner.group_size()
    }

    /// Elements received per device (per receiving device, for a collective_permute).
    #[getter]
    fn volume(&self) -> u64 {
        self.inner.volume()
    }

    /// The layout before the op.
    #[getter]
    fn layout(&self) -> PyLayout {
        self.inner.layout().clone().into()
    }

    /// `ct` of this op on nodes of `devices_per_node` devices (0 for a slice).
    fn inter_node_groups(&self, devices_per_node: Num<i64>) -> PyResult<u64> {
        let l = devices_per_node.unsigned(
            "devices_per_node",
            "a positive power of two",
            Error::Topology,
        )?;
        Ok(self.inner.inter_node_groups(l)?)
    }

    /// Seconds (topology model) or bytes per device (volume model) of the op.
    #[pyo3(
        signature = (cluster, dtype_bytes=Num::Fits(2.0), model="topology"),
        text_signature = "($self, cluster, dtype_bytes=2.0, model='topology')"
    )]
    fn cost(&self, cluster: &PyCluster, dtype_bytes: Num<f64>, model: &str) -> PyResult<f64> {
        Ok(self.inner.cost(
            &cluster.inner,
            dtype_bytes.get("dtype_bytes", Error::Topology)?,
            CostModel::parse(model)?,
        )?)
    }

    fn __repr__(&self) -> String {
        let o = &self.inner;
        let on = match (o.permutation(), o.tensor_dim(), o.to_tensor_dim()) {
            (Some(p), _, _) => format!("permutation={p:?}"),
            (None, Some(i), Some(to)) => {
                format!("device_dim={}, tensor_dim={i} -> {to}", o.device_dim())
            }
            (None, Some(i), None) => format!("device_dim={}, tensor_dim={i}", o.device_dim()),
            (None, None, _) => format!("device_dim={}", o.device_dim()),
        };
        format!(
            "CommOp({}({on}), group_size={}, volume={})",
            o.kind().name(),
            o.group_size(),
            o.volume()
        )
    }
}

fn ops(list: &[CommOp]) -> Vec<PyCommOp> {
    list.iter().map(|o| PyCommOp { inner: o.clone() }).collect()
}

/// A redistribution plan: the unified layouts and the ops between them, with the fallback
/// gathers (prelude) and slices (epilogue) used when the two layouts do not unify as they are.
#[pyclass(frozen, eq, module = "taps", name = "Redistribution")]
#[derive(Clone, PartialEq, Eq)]
pub struct PyRedistribution {
    inner: Redistribution,
}

#[pymethods]
impl PyRedistribution {
    /// The source layout rewritten to the common device matrix and shape.
    #[getter]
    fn source(&self) -> PyLayout {
        self.inner.source.clone().into()
    }

    /// The target layout rewritten to the common device matrix and shape.
    #[getter]
    fn target(&self) -> PyLayout {
        self.inner.target.clone().into()
    }

    /// The ops from the unified source to the unified target.
    #[getter]
    fn ops(&self) -> Vec<PyCommOp> {
        ops(&self.inner.ops)
    }

    /// The all_gathers on the original source of the splits that block unification.
    #[getter]
    fn prelude(&self) -> Vec<PyCommOp> {
        ops(&self.inner.prelude)
    }

    /// The free slices onto the original target of the splits that block unification.
    #[getter]
    fn epilogue(&self) -> Vec<PyCommOp> {
        ops(&self.inner.epilogue)
    }

    /// Every step in order: prelude, ops, epilogue.
    #[getter]
    fn all_ops(&self) -> Vec<PyCommOp> {
        self.inner
            .all_ops()
            .map(|o| PyCommOp { inner: o.clone() })
            .collect()
    }

    /// Elements received per device over the whole plan.
    #[getter]
    fn volume(&self) -> PyResult<u64> {
        Ok(self.inner.volume()?)
    }

    /// Seconds (topology model) or bytes per device (volume model) of the whole plan.
    #[pyo3(
        signature = (cluster, dtype_bytes=Num::Fits(2.0), model="topology"),
        text_signature = "($self, cluster, dtype_bytes=2.0, model='topology')"
    )]
    fn cost(&self, cluster: &PyCluster, dtype_bytes: Num<f64>, model: &str) -> PyResult<f64> {
        Ok(self.inner.cost(
            &cluster.inner,
            dtype_bytes.get("dtype_bytes", Error::Topology)?,
            CostModel::parse(model)?,
        )?)
    }

    fn __repr__(&self) -> String {
        let steps: Vec<String> = self
            .inner
            .all_ops()
            .map(|o| PyCommOp { inner: o.clone() }.__repr__())
            .collect();
        let volume = self
            .inner
            .volume()
            .map_or_else(|_| "more than 2**64".into(), |v| v.to_string());
        format!(
            "Redistribution(volume={volume}, ops=[{}])",
            steps.join(", ")
        )
    }
}

/// A strategy of one operator: a power-of-two degree per partitionable axis, the device dim of
/// each split axis (-1 where the degree is 1), and the device matrix, whose dims no axis uses
/// replicate the operator (one dim per split axis if not given). Immutable, hashable, picklable.
#[pyclass(frozen, eq, hash, module = "taps", name = "Strategy")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyStrategy {
    inner: Strategy,
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

/// Rewrites two layouts of one tensor to one device matrix and one shape without moving an
/// element (docs/conventions.md#unification).
#[pyfunction]
fn unify(a: &PyLayout, b: &PyLayout) -> PyResult<(PyLayout, PyLayout)> {
    let (x, y) = unification::unify(&a.inner, &b.inner)?;
    Ok((x.into(), y.into()))
}

/// Plans the redistribution from layout `a` to layout `b` (docs/conventions.md#redistribution):
/// `planner="paper"` is the paper's Algorithm 1, `"optimal"` the cheapest plan, minimizing
/// seconds on `cluster` (elements received per device without one).
#[pyfunction]
#[pyo3(
    signature = (a, b, cluster=None, planner="paper", dtype_bytes=Num::Fits(2.0)),
    text_signature = "(a, b, cluster=None, planner='paper', dtype_bytes=2.0)"
)]
fn plan_redistribution(
    a: &PyLayout,
    b: &PyLayout,
    cluster: Option<&PyCluster>,
    planner: &str,
    dtype_bytes: Num<f64>,
) -> PyResult<PyRedistribution> {
    let planner = Planner::parse(planner)?;
    let dtype_bytes = dtype_bytes.get("dtype_bytes", Error::Topology)?;
    // Checked without a cluster too: an argument is valid or not whatever the others are.
    topology::check_dtype_bytes(dtype_bytes)?;
    let objective = cluster.map_or(Objective::Volume, |c| Objective::Seconds {
        cluster: &c.inner,
        dtype_bytes,
    });
    Ok(PyRedistribution {
        inner: plan::plan_redistribution(&a.inner, &b.inner, planner, objective)?,
    })
}

/// `ct`, the number of groups of a collective of `layout` that leave one node of
/// `devices_per_node` devices at once (0 if the groups stay inside a node;
/// docs/conventions.md#ct).
#[pyfunction]
#[pyo3(signature = (layout, collective, devices_per_node, device_dim=None))]
fn inter_node_groups(
    layout: &PyLayout,
    collective: &str,
    devices_per_node: Num<i64>,
    device_dim: Option<Num<i64>>,
) -> PyResult<u64> {
    let kind = Error::Topology;
    Ok(topology::inter_node_groups(
        &layout.inner,
        CollectiveKind::parse(collective)?,
        devices_per_node.unsigned("devices_per_node", "a positive power of two", kind)?,
        self::device_dim(device_dim, kind)?,
    )?)
}

/// Every strategy of `axis_sizes` on `num_devices` devices, in a fixed order; with `replicas`,
/// followed by those that split over fewer devices and replicate over the rest
/// (docs/conventions.md#strategies).
#[pyfunction]
#[pyo3(signature = (axis_sizes, num_devices, replicas=false))]
fn enumerate_strategies(
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

/// The matrix of redistribution costs from each source to each target, on all cores.
#[pyfunction]
#[pyo3(
    signature = (sources, targets, cluster, dtype_bytes=Num::Fits(2.0), model="topology", planner="paper"),
    text_signature = "(sources, targets, cluster, dtype_bytes=2.0, model='topology', planner='paper')"
)]
fn redistribution_costs<'py>(
    py: Python<'py>,
    sources: Vec<Bound<'py, PyLayout>>,
    targets: Vec<Bound<'py, PyLayout>>,
    cluster: &PyCluster,
    dtype_bytes: Num<f64>,
    model: &str,
    planner: &str,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let planner = Planner::parse(planner)?;
    let sources: Vec<Layout> = sources.iter().map(|l| l.get().inner.clone()).collect();
    let targets: Vec<Layout> = targets.iter().map(|l| l.get().inner.clone()).collect();
    let cluster = cluster.inner.clone();
    let dtype_bytes = dtype_bytes.get("dtype_bytes", Error::Topology)?;
    let model = CostModel::parse(model)?;
    let shape = (sources.len(), targets.len());
    let stop = AtomicBool::new(false);
    let run = || {
        batch::redistribution_costs_until(
            &sources,
            &targets,
            &cluster,
            dtype_bytes,
            model,
            planner,
            &stop,
        )
    };
    let costs = if planner == Planner::Paper {
        py.detach(run)?
    } else {
        // The optimal planner's batch can take minutes: it runs on a worker thread while this one
        // looks for Ctrl-C (only the main thread sees Python's signals), and stops it on one.
        std::thread::scope(|scope| {
            let worker = scope.spawn(run);
            while !worker.is_finished() {
                py.detach(|| std::thread::sleep(Duration::from_millis(10)));
                if let Err(interrupt) = py.check_signals() {
                    stop.store(true, Relaxed);
                    // The worker ends within milliseconds; its result is dropped.
                    drop(py.detach(|| worker.join()));
                    return Err(interrupt);
                }
            }
            Ok(worker.join().expect("the batch kernel does not panic")?)
        })?
    };
    let costs = costs.expect("nothing stopped the batch");
    let array = Array2::from_shape_vec(shape, costs).expect("one cost per pair");
    Ok(array.into_pyarray(py))
}

/// Per strategy (rows of `degrees` and `device_maps`, on the device matrices `device_matrices`,
/// one per row, or one dim per split axis if not given), the summed all_reduce cost of the
/// tensors (strategy axes, shape, dtype bytes) over the device dims each leaves unused inside a
/// replica, on all cores.
#[pyfunction]
#[pyo3(signature = (degrees, device_maps, tensors, cluster, model="topology", device_matrices=None))]
#[allow(clippy::too_many_arguments)]
fn allreduce_costs<'py>(
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
fn min_plus<'py>(
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
    m.add("COLLECTIVE_KINDS", PyTuple::new(py, CollectiveKind::NAMES)?)?;
    m.add("COST_MODELS", PyTuple::new(py, CostModel::NAMES)?)?;
    m.add("PLANNERS", PyTuple::new(py, Planner::NAMES)?)?;
    m.add("REPLICA_MODELS", PyTuple::new(py, Replicas::NAMES)?)?;
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
    m.add_function(wrap_pyfunction!(min_plus, m)?)?;
    Ok(())
}
