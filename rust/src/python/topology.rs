//! The cluster and its cost model: the `Cluster` class and `inter_node_groups`.

use pyo3::prelude::*;
use pyo3::types::PyType;

use super::convert::{self, Num};
use super::layout::PyLayout;
use crate::error::Error;
use crate::topology::{self, Cluster, CollectiveKind, CostModel, Replicas, PAPER};

/// A homogeneous cluster of `nodes` nodes with `devices_per_node` devices each; a node holds
/// consecutive ranks. Bandwidths in bytes per second, latencies in seconds per collective, memory
/// in bytes per device; `replicas` says whether copies of a tensor share one transfer out of a
/// node (`"shared"`, the paper's model) or send one each (`"flat"`). More levels (nodes in pods):
/// `Cluster.hierarchy`; named clusters: `Cluster.preset`. Immutable, picklable.
#[pyclass(frozen, eq, module = "taps", name = "Cluster")]
#[derive(Clone, PartialEq)]
pub struct PyCluster {
    pub(super) inner: Cluster,
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
    /// other kind of `COLLECTIVE_KINDS` along `device_dim` but `"collective_permute"` (priced by
    /// its pairs, as a plan's step: `CommOp.cost`).
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
            convert::device_dim(device_dim, Error::Topology)?,
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

/// `ct`, the number of groups of a collective of `layout` that leave one node of
/// `devices_per_node` devices at once (0 if the groups stay inside a node;
/// docs/conventions.md#ct).
#[pyfunction]
#[pyo3(signature = (layout, collective, devices_per_node, device_dim=None))]
pub(super) fn inter_node_groups(
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
        convert::device_dim(device_dim, kind)?,
    )?)
}
