//! The core of taps: layouts, unification, the redistribution planners, the topology-aware cost
//! model, strategy enumeration, the batch cost kernels, the gathered sums of the cost tables, the
//! min-plus products of the search, the sums of its memory-limited frontiers and the stage
//! search's programmes over cuts.
//! Plain Rust; the PyO3 bindings live in [`python`] behind the `python` feature.

pub mod batch;
pub mod classes;
pub mod cuts;
pub mod error;
pub mod gathered;
pub mod layout;
pub mod minplus;
pub mod pareto;
pub mod plan;
pub mod rows;
pub mod strategies;
pub mod topology;
pub mod unify;

#[cfg(feature = "python")]
pub mod python;

pub use batch::{redistribution_bounds, redistribution_costs};
pub use error::{Error, Result};
pub use layout::Layout;
pub use plan::{plan_redistribution, CommOp, Objective, OpKind, Planner, Redistribution};
pub use strategies::{enumerate_strategies, Strategy};
pub use topology::{inter_node_groups, Cluster, CollectiveKind, CostModel};
pub use unify::unify;
