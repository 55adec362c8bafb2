//! The topology-aware cost model (docs/conventions.md#topology-aware-cost), on a cluster of nested
//! levels (GPUs in a node, nodes in a pod, ...), each with the bandwidth out of one of its parts
//! and a latency per collective: how many communication groups of a part cross its boundary at
//! once (`ct`), the effective bandwidth that leaves each, and the cost of a collective in seconds,
//! or in bytes under the volume model. The kinds of device (`device.rs`), the cluster
//! (`cluster.rs`), the built-in ones (`presets.rs`) and those of TOML files (`file.rs`) come
//! first; the cost model (`cost.rs`) prices on them.

mod cluster;
mod cost;
mod device;
mod file;
mod presets;

pub use cluster::{memory_limit, Cluster, Level, Replicas};
pub(crate) use cost::{all_reduce_volume, groups_crossing, rank_bits, MatrixRates};
pub use cost::{
    check_devices_per_node, check_dtype_bytes, extents_in_node, inter_node_groups, CollectiveKind,
    CostModel,
};
pub use device::{Device, DEVICES};
pub use presets::{Preset, PRESETS};
