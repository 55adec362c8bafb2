//! The topology-aware cost model (docs/conventions.md#topology-aware-cost): how many communication
//! groups of a node cross the node boundary at once (`ct`), the effective bandwidth that leaves
//! each, and the cost of a collective in seconds, or in bytes under the volume model.

use crate::error::{Error, Result};
use crate::layout::Layout;

/// A homogeneous cluster: `nodes` nodes of `devices_per_node` devices each. Validated once by
/// [`Cluster::new`]; the fields are read through accessors so that no cluster skips the checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    nodes: u64,
    devices_per_node: u64,
    intra_bandwidth: f64,
    inter_bandwidth: f64,
    device_memory: Option<f64>,
}

/// The kind of a collective the cost model prices. (A kind, not a collective: the Python
/// `taps.costs.Collective` record is one collective of an operator, with its tensor and layout.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    AllToAll,
}

impl CollectiveKind {
    /// Every kind, in the order of [`CollectiveKind::NAMES`].
    pub const ALL: [CollectiveKind; 3] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::AllToAll,
    ];

    /// The names callers use (Python, the CLI): the one list of them.
    pub const NAMES: [&'static str; 3] = ["all_reduce", "all_gather", "all_to_all"];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The kind named `name`, one of [`CollectiveKind::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "collective", &Self::NAMES).map(|i| Self::ALL[i])
    }
}

/// What a cost means: seconds on the cluster, or bytes moved per device on uniform links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CostModel {
    Topology,
    Volume,
}

impl CostModel {
    /// Every model, in the order of [`CostModel::NAMES`].
    pub const ALL: [CostModel; 2] = [CostModel::Topology, CostModel::Volume];

    /// The names callers use (Python, the CLI): the one list of them.
    pub const NAMES: [&'static str; 2] = ["topology", "volume"];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The model named `name`, one of [`CostModel::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "cost model", &Self::NAMES).map(|i| Self::ALL[i])
    }
}

/// The index of `name` in `names`, or an error listing them.
fn parse_name(name: &str, what: &str, names: &[&str]) -> Result<usize> {
    names.iter().position(|&n| n == name).ok_or_else(|| {
        let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        let (last, rest) = quoted.split_last().expect("names are not empty");
        Error::Topology(format!(
            "unknown {what} {name:?}: expected {} or {last}",
            rest.join(", ")
        ))
    })
}

/// Checks the bytes per element that every cost takes: positive and finite.
///
/// # Errors
/// [`Error::Topology`] otherwise.
pub fn check_dtype_bytes(dtype_bytes: f64) -> Result<()> {
    if dtype_bytes.is_finite() && dtype_bytes > 0.0 {
        Ok(())
    } else {
        Err(Error::Topology(format!(
            "dtype_bytes must be a positive number of bytes, got {dtype_bytes}"
        )))
    }
}

/// Checks a node size: `ct` assumes a node holds a power-of-two block of consecutive ranks.
///
/// # Errors
/// [`Error::Topology`] unless `devices_per_node` is a positive power of two.
pub fn check_devices_per_node(devices_per_node: u64) -> Result<()> {
    if devices_per_node.is_power_of_two() {
        Ok(())
    } else {
        Err(Error::Topology(format!(
            "devices_per_node must be a positive power of two, got {devices_per_node}"
        )))
    }
}

impl Cluster {
    /// # Errors
    /// [`Error::Topology`] unless the sizes are positive with a power-of-two device count and
    /// the bandwidths (and memory, if given) are positive and finite.
    pub fn new(
        nodes: u64,
        devices_per_node: u64,
        intra_bandwidth: f64,
        inter_bandwidth: f64,
        device_memory: Option<f64>,
    ) -> Result<Self> {
        if nodes == 0 || devices_per_node == 0 {
            return Err(Error::Topology(format!(
                "a cluster needs at least one node and one device per node, got {nodes} nodes of \
                 {devices_per_node}"
            )));
        }
        match nodes.checked_mul(devices_per_node) {
            Some(n) if n.is_power_of_two() => {}
            _ => {
                return Err(Error::Topology(format!(
                    "{nodes} nodes of {devices_per_node} devices: the device count must be a power \
                     of two"
                )))
            }
        }
        for (name, v) in [
            ("intra_bandwidth", intra_bandwidth),
            ("inter_bandwidth", inter_bandwidth),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::Topology(format!(
                    "{name} must be a positive number of bytes per second, got {v}"
                )));
            }
        }
        if let Some(m) = device_memory {
            if !(m.is_finite() && m > 0.0) {
                return Err(Error::Topology(format!(
                    "device_memory must be a positive number of bytes, got {m}"
                )));
            }
        }
        Ok(Cluster {
            nodes,
            devices_per_node,
            intra_bandwidth,
            inter_bandwidth,
            device_memory,
        })
    }

    #[must_use]
    pub fn nodes(&self) -> u64 {
        self.nodes
    }

    /// Devices per node: a node holds this many consecutive ranks.
    #[must_use]
    pub fn devices_per_node(&self) -> u64 {
        self.devices_per_node
    }

    /// Bytes per second between two devices of one node.
    #[must_use]
    pub fn intra_bandwidth(&self) -> f64 {
        self.intra_bandwidth
    }

    /// Bytes per second out of a node, shared by every group that crosses it.
    #[must_use]
    pub fn inter_bandwidth(&self) -> f64 {
        self.inter_bandwidth
    }

    /// Bytes of memory per device, if limited.
    #[must_use]
    pub fn device_memory(&self) -> Option<f64> {
        self.device_memory
    }

    #[must_use]
    pub fn num_devices(&self) -> u64 {
        self.nodes * self.devices_per_node
    }

    pub(crate) fn check(&self, layout: &Layout) -> Result<()> {
        if layout.num_devices() == self.num_devices() {
            Ok(())
        } else {
            Err(Error::Topology(format!(
                "the layout spans {} devices but the cluster has {} ({} nodes of {})",
                layout.num_devices(),
                self.num_devices(),
                self.nodes,
                self.devices_per_node
            )))
        }
    }

    /// The cost of a collective over `group` (device dims) of `layout`: seconds under
    /// [`CostModel::Topology`], bytes per device under [`CostModel::Volume`].
    ///
    /// # Errors
    /// [`Error::Topology`] if the layout is not on this cluster's devices, the group is invalid or
    /// `dtype_bytes` is not positive.
    pub fn collective_cost(
        &self,
        layout: &Layout,
        collective: CollectiveKind,
        device_dim: Option<usize>,
        dtype_bytes: f64,
        model: CostModel,
    ) -> Result<f64> {
        check_dtype_bytes(dtype_bytes)?;
        self.check(layout)?;
        let group = group_dims(layout, collective, device_dim)?;
        let size = group.iter().map(|&k| layout.dim_size(k)).product();
        Ok(self.priced(
            layout,
            collective,
            size,
            |k| group.contains(&k),
            dtype_bytes,
            model,
        ))
    }

    /// [`Cluster::collective_cost`] of an all_reduce, for a layout on this cluster's devices,
    /// without listing its group: the node-cost kernel's inner loop.
    pub(crate) fn allreduce_cost(
        &self,
        layout: &Layout,
        dtype_bytes: f64,
        model: CostModel,
    ) -> f64 {
        let unused = |k| !layout.uses(k);
        let size = (0..layout.num_device_dims())
            .filter(|&k| unused(k))
            .map(|k| layout.dim_size(k))
            .product();
        self.priced(
            layout,
            CollectiveKind::AllReduce,
            size,
            unused,
            dtype_bytes,
            model,
        )
    }

    /// The cost of a collective over the group of `size` devices whose device dims pass
    /// `in_group`.
    fn priced(
        &self,
        layout: &Layout,
        collective: CollectiveKind,
        size: u64,
        in_group: impl Fn(usize) -> bool,
        dtype_bytes: f64,
        model: CostModel,
    ) -> f64 {
        let bytes = collective_volume(layout, collective, size) * dtype_bytes;
        match model {
            CostModel::Volume => bytes,
            CostModel::Topology => self.seconds(layout, collective, in_group, bytes),
        }
    }

    /// Seconds to move `bytes` per device in a collective over the device dims that pass
    /// `in_group` (a test rather than a list, so that pricing allocates nothing); the group is
    /// valid.
    pub(crate) fn seconds(
        &self,
        layout: &Layout,
        collective: CollectiveKind,
        in_group: impl Fn(usize) -> bool,
        bytes: f64,
    ) -> f64 {
        if bytes == 0.0 {
            return 0.0;
        }
        let l = self.devices_per_node;
        let ct = groups_crossing(layout, &in_group, l);
        if ct == 0 {
            return bytes / self.intra_bandwidth;
        }
        let effective = self.inter_bandwidth / ct as f64;
        let factor = if collective == CollectiveKind::AllToAll {
            // Only the k(p-k) of the p(p-1) peer transfers that leave the node use the slow link.
            let p = (0..layout.num_device_dims())
                .filter(|&k| in_group(k))
                .map(|k| layout.dim_size(k))
                .product::<u64>() as f64;
            let k = extents(layout, l)
                .enumerate()
                .filter(|&(k, _)| in_group(k))
                .map(|(_, e)| e)
                .product::<u64>() as f64;
            k * (p - k) / (p - 1.0)
        } else {
            1.0
        };
        factor * bytes / effective
    }
}

/// `e_k`: how many distinct coordinates of device dim `k` one node of `l` consecutive ranks holds.
#[must_use]
pub fn extents_in_node(layout: &Layout, l: u64) -> Vec<u64> {
    extents(layout, l).collect()
}

/// [`extents_in_node`] without the vector, for the cost kernels.
fn extents(layout: &Layout, l: u64) -> impl Iterator<Item = u64> + '_ {
    let mut inner = 1u64;
    (0..layout.num_device_dims()).map(move |k| {
        let d = layout.dim_size(k);
        // `inner` is a power of two: `l / inner` as a shift.
        let e = d.min((l >> inner.trailing_zeros()).max(1));
        inner = inner.saturating_mul(d);
        e
    })
}

/// The device dims a collective runs over: the unused dims for an all_reduce of partial sums,
/// `device_dim` otherwise.
pub(crate) fn group_dims(
    layout: &Layout,
    collective: CollectiveKind,
    device_dim: Option<usize>,
) -> Result<Vec<usize>> {
    match (collective, device_dim) {
        (CollectiveKind::AllReduce, None) => Ok((0..layout.num_device_dims())
            .filter(|&k| !layout.uses(k))
            .collect()),
        (CollectiveKind::AllReduce, Some(_)) => Err(Error::Topology(
            "an all_reduce runs over the device dims the tensor map does not use; pass no device_dim"
                .into(),
        )),
        (_, None) => Err(Error::Topology(format!(
            "{collective:?} needs the device dim it runs along"
        ))),
        (_, Some(k)) if k >= layout.num_device_dims() => Err(Error::Topology(format!(
            "device dim {k} is not one of the {} dims of device matrix {:?}",
            layout.num_device_dims(),
            layout.device_matrix()
        ))),
        (_, Some(k)) => Ok(vec![k]),
    }
}

/// Elements received per device by a collective over a group of `size` devices of `layout`.
fn collective_volume(layout: &Layout, collective: CollectiveKind, size: u64) -> f64 {
    let g = size as f64;
    let s = layout.shard_size() as f64;
    match collective {
        CollectiveKind::AllReduce => 2.0 * (g - 1.0) / g * s,
        CollectiveKind::AllGather => (g - 1.0) * s,
        CollectiveKind::AllToAll => (g - 1.0) / g * s,
    }
}

/// `ct` for a valid group, the device dims that pass `in_group`: 0 if the group stays inside a
/// node, else the number of groups with distinct data that leave one node at once. Replicas
/// (device dims the map does not use) share one transfer, so only the used dims outside the group
/// count.
pub(crate) fn groups_crossing(layout: &Layout, in_group: impl Fn(usize) -> bool, l: u64) -> u64 {
    let mut inside = true;
    let mut ct = 1;
    for (k, e) in extents(layout, l).enumerate() {
        if in_group(k) {
            inside &= e == layout.dim_size(k);
        } else if layout.uses(k) {
            ct *= e;
        }
    }
    if inside {
        0
    } else {
        ct
    }
}

/// The exact `ct` (docs/conventions.md#ct) of a collective of `layout` on nodes of
/// `devices_per_node` devices.
///
/// # Errors
/// [`Error::Topology`] if `devices_per_node` is not a positive power of two or the group is
/// invalid.
pub fn inter_node_groups(
    layout: &Layout,
    collective: CollectiveKind,
    devices_per_node: u64,
    device_dim: Option<usize>,
) -> Result<u64> {
    check_devices_per_node(devices_per_node)?;
    let group = group_dims(layout, collective, device_dim)?;
    Ok(groups_crossing(
        layout,
        |k| group.contains(&k),
        devices_per_node,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dW of a MatMul with (d, r, c) = (8, 2, 2) on 32 devices, 8 per node, for the d dim
    /// outermost, innermost and in the middle: the paper's ct of 4, 0 and 2.
    #[test]
    fn paper_ct_example() {
        let cases = [
            (vec![8, 2, 2], vec![1, 0], 4),
            (vec![2, 2, 8], vec![2, 1], 0),
            (vec![2, 8, 2], vec![2, 0], 2),
        ];
        for (dm, map, ct) in cases {
            let dw = Layout::new(vec![64, 64], dm, map).unwrap();
            assert_eq!(
                inter_node_groups(&dw, CollectiveKind::AllReduce, 8, None).unwrap(),
                ct
            );
        }
    }

    /// Two 8-device nodes, groups (0, 8), (1, 9), ...: eight groups share the inter-node link.
    #[test]
    fn paper_bandwidth_example() {
        let cluster = Cluster::new(2, 8, 60e9, 12.5e9, None).unwrap();
        let t = Layout::new(vec![16, 16], vec![2, 8], vec![1, 0]).unwrap();
        let bytes = 16.0 * 2.0;
        let cost = cluster
            .collective_cost(
                &t,
                CollectiveKind::AllGather,
                Some(1),
                2.0,
                CostModel::Topology,
            )
            .unwrap();
        assert_eq!(
            inter_node_groups(&t, CollectiveKind::AllGather, 8, Some(1)).unwrap(),
            8
        );
        assert!((cost - bytes / 1.5625e9).abs() < 1e-15);
    }

    /// Every cost entry point rejects a dtype size that is not a positive number, with the one
    /// core error; the bindings add no check of their own.
    #[test]
    fn every_cost_rejects_bad_dtype_bytes() {
        use crate::batch::{allreduce_costs, redistribution_costs, AxesTensor};
        use crate::planner::plan_redistribution;
        use crate::strategies::Strategy;
        use std::slice::from_ref;

        let cluster = Cluster::new(2, 2, 60e9, 6e9, None).unwrap();
        let a = Layout::new(vec![8, 8], vec![4], vec![0, -1]).unwrap();
        let b = Layout::new(vec![8, 8], vec![4], vec![-1, 0]).unwrap();
        let plan = plan_redistribution(&a, &b).unwrap();
        let strategy = Strategy::new(vec![4], vec![0]).unwrap();
        let model = CostModel::Topology;
        for bad in [0.0, -2.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let tensor = AxesTensor {
                axes: vec![0],
                shape: vec![8],
                dtype_bytes: bad,
            };
            let results = [
                cluster.collective_cost(&a, CollectiveKind::AllReduce, None, bad, model),
                plan.cost(&cluster, bad, model),
                plan.ops[0].cost(&cluster, bad, model),
                redistribution_costs(from_ref(&a), from_ref(&b), &cluster, bad, model)
                    .map(|c| c[0]),
                allreduce_costs(from_ref(&strategy), &[tensor], &cluster, model).map(|c| c[0]),
            ];
            for r in results {
                match r {
                    Err(Error::Topology(m)) => assert!(m.contains("dtype_bytes"), "{m}"),
                    other => panic!("dtype_bytes {bad}: {other:?}"),
                }
            }
        }
        // A layout pair with no op is still checked: the answer must not depend on the plan.
        assert!(redistribution_costs(from_ref(&a), from_ref(&a), &cluster, 0.0, model).is_err());
    }

    /// `ct` has one rule whichever way it is asked for: a node size that is not a positive power
    /// of two is rejected by the free function and by a plan's ops alike (slices included), and
    /// both give the same `ct` otherwise.
    #[test]
    fn one_node_size_rule_for_both_ct_entry_points() {
        use crate::planner::{plan_redistribution, OpKind};

        let a = Layout::new(vec![16, 16, 16], vec![2, 4, 2], vec![0, 1, -1]).unwrap();
        let b = Layout::new(vec![16, 16, 16], vec![2, 4, 2], vec![-1, 2, 1]).unwrap();
        let plan = plan_redistribution(&a, &b).unwrap();
        assert!(plan.ops.iter().any(|op| op.kind == OpKind::Slice));
        assert!(plan.ops.iter().any(|op| op.kind != OpKind::Slice));
        for l in [0, 3, 6, 12, u64::MAX] {
            assert!(matches!(
                inter_node_groups(&a, CollectiveKind::AllReduce, l, None),
                Err(Error::Topology(_))
            ));
            for op in &plan.ops {
                assert!(matches!(op.inter_node_groups(l), Err(Error::Topology(_))));
            }
        }
        for l in [1, 2, 4, 8, 16, 32, 1 << 40] {
            for op in &plan.ops {
                let want = match op.kind.collective() {
                    Some(kind) => inter_node_groups(&op.layout, kind, l, Some(op.device_dim)),
                    None => Ok(0),
                };
                assert_eq!(op.inter_node_groups(l), want);
            }
        }
    }

    #[test]
    fn names_parse_back_and_others_are_rejected() {
        for kind in CollectiveKind::ALL {
            assert_eq!(CollectiveKind::parse(kind.name()), Ok(kind));
        }
        for model in CostModel::ALL {
            assert_eq!(CostModel::parse(model.name()), Ok(model));
        }
        let Err(Error::Topology(m)) = CostModel::parse("bytes") else {
            panic!("an unknown cost model parsed")
        };
        assert_eq!(
            m,
            r#"unknown cost model "bytes": expected "topology" or "volume""#
        );
        assert!(CollectiveKind::parse("broadcast").is_err());
    }

    #[test]
    fn rejects_bad_clusters() {
        assert!(Cluster::new(3, 8, 1.0, 1.0, None).is_err());
        assert!(Cluster::new(0, 8, 1.0, 1.0, None).is_err());
        assert!(Cluster::new(1, 8, 0.0, 1.0, None).is_err());
        assert!(Cluster::new(1, 8, 1.0, f64::NAN, None).is_err());
        assert!(Cluster::new(1, 8, 1.0, 1.0, Some(0.0)).is_err());
        assert!(Cluster::new(1 << 32, 1 << 32, 1.0, 1.0, None).is_err());
        let c = Cluster::new(2, 8, 60e9, 6e9, Some(1e9)).unwrap();
        let fields = (
            c.nodes(),
            c.devices_per_node(),
            c.intra_bandwidth(),
            c.inter_bandwidth(),
            c.device_memory(),
        );
        assert_eq!(fields, (2, 8, 60e9, 6e9, Some(1e9)));
    }
}
