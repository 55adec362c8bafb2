//! The core of taps: layouts, unification, the redistribution planner, the topology-aware cost
//! model, strategy enumeration, the batch cost kernels and the min-plus products of the search.
//! Plain Rust; the PyO3 bindings live in [`python`] behind the `python` feature.

pub mod error;
pub mod layout;
pub mod unify;

pub use error::{Error, Result};
pub use layout::Layout;
pub use unify::unify;
pub mod plan;
pub mod topology;

pub use plan::{plan_redistribution, CommOp, Objective, OpKind, Planner, Redistribution};
pub use topology::{inter_node_groups, Cluster, CollectiveKind, CostModel};
pub mod batch;
pub mod minplus;
pub mod strategies;

pub use batch::redistribution_costs;
pub use strategies::{enumerate_strategies, Strategy};

#[cfg(feature = "python")]
pub mod python;
