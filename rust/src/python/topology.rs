//! The cluster and its cost model: the `Device` and `Cluster` classes and `inter_node_groups`.

use pyo3::prelude::*;
use pyo3::types::PyType;

use super::convert::{self, Level, Num};
use super::layout::PyLayout;
use crate::error::Error;
use crate::topology::{self, Cluster, CollectiveKind, CostModel, Device, Preset, Replicas};

/// A kind of device, by name (one of `DEVICES`): its dense fp16/bf16 matrix-multiply peak in
/// FLOP/s, memory bandwidth in bytes per second and memory in bytes, from its datasheet.
/// Immutable, picklable.
#[pyclass(frozen, eq, module = "taps", name = "Device")]
#[derive(Clone, PartialEq)]
pub struct PyDevice {
    inner: Device,
}

#[pymethods]
impl PyDevice {
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        Ok(PyDevice {
            inner: Device::parse(name)?,
        })
    }

    /// The kind's name, as `DEVICES` spells it.
    #[getter]
    fn name(&self) -> &'static str {
        self.inner.name
    }

    /// Dense fp16/bf16 matrix-multiply peak, FLOP per second.
    #[getter]
    fn peak_flops(&self) -> f64 {
        self.inner.peak_flops
    }

    /// Memory bandwidth, bytes per second.
    #[getter]
    fn memory_bandwidth(&self) -> f64 {
        self.inner.memory_bandwidth
    }

    /// Memory, bytes.
    #[getter]
    fn memory(&self) -> f64 {
        self.inner.memory
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.inner.name.hash(&mut h);
        h.finish()
    }

    fn __repr__(&self) -> String {
        let d = &self.inner;
        format!(
            "Device('{}', peak_flops={:e}, memory_bandwidth={:e}, memory={:e})",
            d.name, d.peak_flops, d.memory_bandwidth, d.memory
        )
    }

    fn __reduce__(slf: &Bound<'_, Self>) -> (Py<PyType>, (&'static str,)) {
        (slf.get_type().unbind(), (slf.get().inner.name,))
    }
}

/// A homogeneous cluster of `nodes` nodes with `devices_per_node` devices each; a node holds
/// consecutive ranks. Bandwidths in bytes per second, latencies in seconds per collective, memory
/// in bytes per device; `replicas` says whether copies of a tensor share one transfer out of a
/// node (`"shared"`, the paper's model) or send one each (`"flat"`); `device` names the kind of
/// device (one of `DEVICES`). More levels (nodes in pods):
/// `Cluster.hierarchy`; named clusters: `Cluster.preset`. Immutable, picklable.
#[pyclass(frozen, eq, module = "taps", name = "Cluster")]
#[derive(Clone, PartialEq)]
pub struct PyCluster {
    pub(super) inner: Cluster,
}

/// The memory limit `device_memory` gives a device of `device`'s kind: its kind's memory if
/// None, no limit if infinite.
fn memory(device: Device, device_memory: Option<Num<f64>>) -> Result<Option<f64>, Error> {
    let given = device_memory
        .map(|m| m.get("device_memory", Error::Topology))
        .transpose()?;
    Ok(topology::memory_limit(device, given))
}

/// The number `given`, or `default` if None.
fn or_default(given: Option<Num<f64>>, what: &str, default: f64) -> Result<f64, Error> {
    given.map_or(Ok(default), |v| v.get(what, Error::Topology))
}

#[pymethods]
impl PyCluster {
    #[new]
    #[pyo3(
        signature = (
            nodes,
            devices_per_node,
            intra_bandwidth=None,
            inter_bandwidth=None,
            device_memory=None,
            *,
            intra_latency=None,
            inter_latency=None,
            replicas="flat",
            device="v100",
        ),
        text_signature = "(nodes, devices_per_node, intra_bandwidth=None, inter_bandwidth=None, device_memory=None, *, intra_latency=None, inter_latency=None, replicas='flat', device='v100')"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        nodes: Num<i64>,
        devices_per_node: Num<i64>,
        intra_bandwidth: Option<Num<f64>>,
        inter_bandwidth: Option<Num<f64>>,
        device_memory: Option<Num<f64>>,
        intra_latency: Option<Num<f64>>,
        inter_latency: Option<Num<f64>>,
        replicas: &str,
        device: &str,
    ) -> PyResult<Self> {
        let positive = "a positive count";
        let kind = Error::Topology;
        let device = Device::parse(device)?;
        // What is not given is the device's preset's: its node level and its outermost one.
        let preset = Preset::of(device).levels;
        let (node, outer) = (preset[0], preset[preset.len() - 1]);
        Ok(PyCluster {
            inner: Cluster::hierarchy(
                &[
                    (
                        devices_per_node.unsigned("devices_per_node", positive, kind)?,
                        or_default(intra_bandwidth, "intra_bandwidth", node.1)?,
                        or_default(intra_latency, "intra_latency", node.2)?,
                    ),
                    (
                        nodes.unsigned("nodes", positive, kind)?,
                        or_default(inter_bandwidth, "inter_bandwidth", outer.1)?,
                        or_default(inter_latency, "inter_latency", outer.2)?,
                    ),
                ],
                memory(device, device_memory)?,
                Replicas::parse(replicas)?,
            )?
            .with_device(device),
        })
    }

    /// A cluster of nested levels, innermost first, each `(parts, bandwidth, latency)`: the
    /// devices per node, then the nodes per pod, ..., then the outermost units. Bandwidths in
    /// bytes per second out of one part of the level below, latencies in seconds per collective.
    /// With `nodes`, the outermost level holds as many units as the nodes fill (its parts are not
    /// read; one level is one node), as presets and cluster files are read. `device` names the
    /// kind of device (one of `DEVICES`); `device_memory` defaults to its memory (`math.inf`: no
    /// limit).
    #[staticmethod]
    #[pyo3(signature = (levels, device_memory=None, replicas="flat", device="v100", *, nodes=None))]
    fn hierarchy(
        levels: Vec<Level>,
        device_memory: Option<Num<f64>>,
        replicas: &str,
        device: &str,
        nodes: Option<Num<i64>>,
    ) -> PyResult<Self> {
        let kind = Error::Topology;
        let levels = levels
            .iter()
            .enumerate()
            .map(|(j, Level(parts, bandwidth, latency))| {
                Ok((
                    parts.unsigned(&format!("the parts of level {j}"), "a positive count", kind)?,
                    bandwidth.get(&format!("the bandwidth of level {j}"), kind)?,
                    latency.get(&format!("the latency of level {j}"), kind)?,
                ))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let device = Device::parse(device)?;
        let (memory, replicas) = (memory(device, device_memory)?, Replicas::parse(replicas)?);
        let inner = match nodes {
            None => Cluster::hierarchy(&levels, memory, replicas)?,
            Some(n) => Cluster::filled(
                &levels,
                n.unsigned("nodes", "a positive count", kind)?,
                memory,
                replicas,
            )?,
        };
        Ok(PyCluster {
            inner: inner.with_device(device),
        })
    }

    /// The built-in cluster `name` (one of `PRESETS`) with `nodes` nodes, or the cluster of a
    /// TOML file (a name ending in `.toml`; docs/core.md).
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

    /// The kind of device the cluster is made of.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice {
            inner: self.inner.device(),
        }
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

    /// Bytes of memory per device (its kind's unless told otherwise), or None if unlimited.
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
            .map_or("float('inf')".to_string(), |m| format!("{m:e}"));
        let (replicas, device) = (c.replicas().name(), c.device().name);
        if let [node, outer] = c.levels() {
            format!(
                "Cluster(nodes={}, devices_per_node={}, intra_bandwidth={:e}, inter_bandwidth={:e}, device_memory={memory}, intra_latency={:e}, inter_latency={:e}, replicas={replicas:?}, device={device:?})",
                c.nodes(),
                c.devices_per_node(),
                node.bandwidth,
                outer.bandwidth,
                node.latency,
                outer.latency,
            )
        } else {
            let levels: Vec<String> = c
                .level_parts()
                .iter()
                .map(|(n, b, l)| format!("({n}, {b:e}, {l:e})"))
                .collect();
            format!(
                "Cluster.hierarchy([{}], device_memory={memory}, replicas={replicas:?}, device={device:?})",
                levels.join(", "),
            )
        }
    }

    fn __reduce__(
        slf: &Bound<'_, Self>,
    ) -> PyResult<(
        Py<PyAny>,
        (Vec<(u64, f64, f64)>, f64, &'static str, &'static str),
    )> {
        let c = &slf.get().inner;
        Ok((
            slf.get_type().getattr("hierarchy")?.unbind(),
            (
                c.level_parts(),
                c.device_memory().unwrap_or(f64::INFINITY),
                c.replicas().name(),
                c.device().name,
            ),
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
