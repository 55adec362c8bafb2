//! The PyO3 bindings: `taps._core`. Thin wrappers over the plain-Rust core, one file per area of
//! it; every error becomes one class of the `taps.TapsError` hierarchy in `errors.rs` and nowhere
//! else. This file registers the module's names.

// PyO3 extracts arguments as owned values and wants `PyResult` from methods that may fail in
// other builds; these lints argue against the signatures the bindings need.
#![allow(
    clippy::needless_pass_by_value,
    clippy::unnecessary_wraps,
    clippy::type_complexity
)]

/// The extension's allocator, set here and not in the library so that a Rust user of the crate
/// keeps their own. The kernels, and the bindings that turn their numpy rows into strategies,
/// allocate many small short-lived vectors, for which mimalloc is faster than the system
/// allocator on the Python path of `allreduce_costs`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod batch;
mod convert;
mod cuts;
mod errors;
mod layout;
mod plan;
mod strategies;
mod topology;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::plan::Planner;
use crate::topology::{CollectiveKind, CostModel, Device, Replicas, PRESETS};
use errors::{
    GraphError, InfeasibleError, LayoutError, ResourceError, StrategyError, TapsError,
    TimeLimitError, TopologyError, UnifyError,
};

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
    m.add("ResourceError", py.get_type::<ResourceError>())?;
    m.add("TimeLimitError", py.get_type::<TimeLimitError>())?;
    m.add("COLLECTIVE_KINDS", PyTuple::new(py, CollectiveKind::NAMES)?)?;
    m.add("DEVICES", PyTuple::new(py, Device::NAMES)?)?;
    m.add("PRESETS", PyTuple::new(py, PRESETS.map(|p| p.name))?)?;
    m.add("COST_MODELS", PyTuple::new(py, CostModel::NAMES)?)?;
    m.add("PLANNERS", PyTuple::new(py, Planner::NAMES)?)?;
    m.add("REPLICA_MODELS", PyTuple::new(py, Replicas::NAMES)?)?;
    m.add_class::<layout::PyLayout>()?;
    m.add_class::<topology::PyDevice>()?;
    m.add_class::<topology::PyCluster>()?;
    m.add_class::<plan::PyCommOp>()?;
    m.add_class::<plan::PyRedistribution>()?;
    m.add_class::<strategies::PyStrategy>()?;
    m.add_function(wrap_pyfunction!(layout::unify, m)?)?;
    m.add_function(wrap_pyfunction!(layout::layout_classes, m)?)?;
    m.add_function(wrap_pyfunction!(plan::plan_redistribution, m)?)?;
    m.add_function(wrap_pyfunction!(topology::inter_node_groups, m)?)?;
    m.add_function(wrap_pyfunction!(strategies::enumerate_strategies, m)?)?;
    m.add_function(wrap_pyfunction!(strategies::tensor_layouts, m)?)?;
    m.add_function(wrap_pyfunction!(strategies::strategy_arrays, m)?)?;
    m.add_function(wrap_pyfunction!(batch::redistribution_costs, m)?)?;
    m.add_function(wrap_pyfunction!(batch::redistribution_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(batch::redistribution_pair_costs, m)?)?;
    m.add_function(wrap_pyfunction!(batch::redistribution_table_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(batch::redistribution_pair_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(batch::redistribution_pair_estimates, m)?)?;
    m.add_function(wrap_pyfunction!(batch::allreduce_costs, m)?)?;
    m.add_function(wrap_pyfunction!(batch::gathered_sum, m)?)?;
    m.add_function(wrap_pyfunction!(batch::min_plus, m)?)?;
    m.add_function(wrap_pyfunction!(batch::min_plus_one, m)?)?;
    m.add_function(wrap_pyfunction!(batch::first_equal, m)?)?;
    m.add_function(wrap_pyfunction!(batch::frontier_sum, m)?)?;
    m.add_function(wrap_pyfunction!(cuts::least_cuts, m)?)?;
    m.add_function(wrap_pyfunction!(cuts::least_bottleneck, m)?)?;
    Ok(())
}
