//! Redistribution plans: the `CommOp` and `Redistribution` classes and `plan_redistribution`.

use pyo3::prelude::*;
use pyo3::types::PyType;

use super::convert::Num;
use super::layout::PyLayout;
use super::topology::PyCluster;
use crate::error::Error;
use crate::plan::{self, CommOp, Objective, OpKind, Planner, Redistribution};
use crate::topology::{self, CostModel};

/// One step of a redistribution, with the layout it acts on: a slice, all_gather, all_to_all,
/// reduce_scatter or all_reduce along one device dim, or a collective_permute of whole blocks.
/// Immutable, hashable, picklable.
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
        let (dtype_bytes, model) = cost_args(dtype_bytes, model)?;
        Ok(self.inner.cost(&cluster.inner, dtype_bytes, model)?)
    }

    /// The op of these parts, checked (what unpickling calls).
    #[classmethod]
    #[pyo3(signature = (kind, device_dim, tensor_dim, to_tensor_dim, permutation, layout))]
    fn _from_parts(
        _cls: &Bound<'_, PyType>,
        kind: &str,
        device_dim: usize,
        tensor_dim: Option<usize>,
        to_tensor_dim: Option<usize>,
        permutation: Option<Vec<usize>>,
        layout: &PyLayout,
    ) -> PyResult<Self> {
        Ok(PyCommOp {
            inner: CommOp::from_parts(
                OpKind::parse(kind)?,
                device_dim,
                tensor_dim,
                to_tensor_dim,
                permutation,
                layout.inner.clone(),
            )?,
        })
    }

    fn __reduce__(slf: &Bound<'_, Self>) -> PyResult<(Py<PyAny>, CommOpParts)> {
        let o = &slf.get().inner;
        Ok((
            slf.get_type().getattr("_from_parts")?.unbind(),
            (
                o.kind().name(),
                o.device_dim(),
                o.tensor_dim(),
                o.to_tensor_dim(),
                o.permutation().map(<[usize]>::to_vec),
                o.layout().clone().into(),
            ),
        ))
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

/// What a pickled op holds: `CommOp._from_parts`'s arguments.
type CommOpParts = (
    &'static str,
    usize,
    Option<usize>,
    Option<usize>,
    Option<Vec<usize>>,
    PyLayout,
);

fn ops(list: &[CommOp]) -> Vec<PyCommOp> {
    list.iter().map(|o| PyCommOp { inner: o.clone() }).collect()
}

/// A redistribution plan: the unified layouts and the ops between them, with the fallback
/// gathers (prelude) and slices (epilogue) used when the two layouts do not unify as they are.
/// Immutable, picklable.
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
        let (dtype_bytes, model) = cost_args(dtype_bytes, model)?;
        Ok(self.inner.cost(&cluster.inner, dtype_bytes, model)?)
    }

    /// The plan of these parts (what unpickling calls; each op was checked by its own).
    #[classmethod]
    fn _from_parts(
        _cls: &Bound<'_, PyType>,
        source: &PyLayout,
        target: &PyLayout,
        ops: Vec<PyRef<'_, PyCommOp>>,
        prelude: Vec<PyRef<'_, PyCommOp>>,
        epilogue: Vec<PyRef<'_, PyCommOp>>,
    ) -> Self {
        let inner = |list: Vec<PyRef<'_, PyCommOp>>| list.iter().map(|o| o.inner.clone()).collect();
        PyRedistribution {
            inner: Redistribution {
                source: source.inner.clone(),
                target: target.inner.clone(),
                ops: inner(ops),
                prelude: inner(prelude),
                epilogue: inner(epilogue),
            },
        }
    }

    fn __reduce__(
        slf: &Bound<'_, Self>,
    ) -> PyResult<(
        Py<PyAny>,
        (
            PyLayout,
            PyLayout,
            Vec<PyCommOp>,
            Vec<PyCommOp>,
            Vec<PyCommOp>,
        ),
    )> {
        let r = &slf.get().inner;
        Ok((
            slf.get_type().getattr("_from_parts")?.unbind(),
            (
                r.source.clone().into(),
                r.target.clone().into(),
                ops(&r.ops),
                ops(&r.prelude),
                ops(&r.epilogue),
            ),
        ))
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

/// Plans the redistribution from layout `a` to layout `b` (docs/conventions.md#redistribution):
/// `planner="paper"` is the paper's Algorithm 1, `"optimal"` the cheapest plan, minimizing
/// seconds on `cluster` (elements received per device without one).
#[pyfunction]
#[pyo3(
    signature = (a, b, cluster=None, planner="paper", dtype_bytes=Num::Fits(2.0)),
    text_signature = "(a, b, cluster=None, planner='paper', dtype_bytes=2.0)"
)]
pub(super) fn plan_redistribution(
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

/// The element size and the cost model of a `cost(cluster, dtype_bytes, model)` call, checked.
fn cost_args(dtype_bytes: Num<f64>, model: &str) -> PyResult<(f64, CostModel)> {
    Ok((
        dtype_bytes.get("dtype_bytes", Error::Topology)?,
        CostModel::parse(model)?,
    ))
}
