//! The topology-aware cost model (SPEC section 6): how many communication groups of a node cross
//! the node boundary at once (`ct`), the effective bandwidth that leaves each, and the cost of a
//! collective in seconds, or in bytes under the volume model.

use crate::error::{Error, Result};
use crate::layout::Layout;

/// A homogeneous cluster: `nodes` nodes of `devices_per_node` devices each.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub nodes: u64,
    pub devices_per_node: u64,
    /// Bytes per second between two devices of one node.
    pub intra_bandwidth: f64,
    /// Bytes per second out of a node, shared by every group that crosses it.
    pub inter_bandwidth: f64,
    /// Bytes of memory per device, if limited.
    pub device_memory: Option<f64>,
}

/// The collectives the cost model prices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    AllGather,
    AllToAll,
    ReduceScatter,
    CollectivePermute,
}

impl Collective {
    /// # Errors
    /// [`Error::Topology`] for a name other than `all_reduce`, `all_gather`, `all_to_all`,
    /// `reduce_scatter`, `collective_permute`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "all_reduce" => Ok(Collective::AllReduce),
            "all_gather" => Ok(Collective::AllGather),
            "all_to_all" => Ok(Collective::AllToAll),
            "reduce_scatter" => Ok(Collective::ReduceScatter),
            "collective_permute" => Ok(Collective::CollectivePermute),
            _ => Err(Error::Topology(format!(
                "unknown collective {name:?}: expected \"all_reduce\", \"all_gather\", \
                 \"all_to_all\", \"reduce_scatter\" or \"collective_permute\""
            ))),
        }
    }
}

/// What a cost means: seconds on the cluster, or bytes moved per device on uniform links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CostModel {
    Topology,
    Volume,
}

impl CostModel {
    /// # Errors
    /// [`Error::Topology`] for a name other than `topology` or `volume`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "topology" => Ok(CostModel::Topology),
            "volume" => Ok(CostModel::Volume),
            _ => Err(Error::Topology(format!(
                "unknown cost model {name:?}: expected \"topology\" or \"volume\""
            ))),
        }
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
    /// [`Error::Topology`] if the layout is not on this cluster's devices or the group is invalid.
    pub fn collective_cost(
        &self,
        layout: &Layout,
        collective: Collective,
        device_dim: Option<usize>,
        dtype_bytes: f64,
        model: CostModel,
    ) -> Result<f64> {
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
            Collective::AllReduce,
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
        collective: Collective,
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
        collective: Collective,
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
        let factor = if collective == Collective::AllToAll {
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

impl Cluster {
    /// A lower bound on the seconds of a collective moving `bytes` per device over a group that
    /// holds device dim `k` of `layout`: over the intra-node link if the dim stays inside a
    /// node, else over the whole inter-node bandwidth of a node.
    pub(crate) fn least_seconds(&self, layout: &Layout, k: usize, bytes: f64) -> f64 {
        let inside = extents(layout, self.devices_per_node)
            .nth(k)
            .is_some_and(|e| e == layout.dim_size(k));
        if inside {
            bytes / self.intra_bandwidth.max(self.inter_bandwidth)
        } else {
            bytes / self.inter_bandwidth
        }
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
    collective: Collective,
    device_dim: Option<usize>,
) -> Result<Vec<usize>> {
    match (collective, device_dim) {
        (Collective::AllReduce, None) => Ok((0..layout.num_device_dims())
            .filter(|&k| !layout.uses(k))
            .collect()),
        (Collective::AllReduce, Some(_)) => Err(Error::Topology(
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
fn collective_volume(layout: &Layout, collective: Collective, size: u64) -> f64 {
    let g = size as f64;
    let s = layout.shard_size() as f64;
    match collective {
        Collective::AllReduce => 2.0 * (g - 1.0) / g * s,
        Collective::AllGather => (g - 1.0) * s,
        Collective::AllToAll | Collective::ReduceScatter => (g - 1.0) / g * s,
        Collective::CollectivePermute => s,
    }
}

/// `ct` for a valid group, the device dims that pass `in_group`: 0 if the group stays inside a
/// node, else the number of groups with distinct data that leave one node at once. Replicas
/// (device dims that neither split the tensor nor hold partial sums) share one transfer, so only
/// the other dims outside the group count.
pub(crate) fn groups_crossing(layout: &Layout, in_group: impl Fn(usize) -> bool, l: u64) -> u64 {
    let mut inside = true;
    let mut ct = 1;
    for (k, e) in extents(layout, l).enumerate() {
        if in_group(k) {
            inside &= e == layout.dim_size(k);
        } else if layout.distinct_along(k) {
            ct *= e;
        }
    }
    if inside {
        0
    } else {
        ct
    }
}

/// The exact `ct` of SPEC section 6 for a collective of `layout` on nodes of `devices_per_node`.
///
/// # Errors
/// [`Error::Topology`] if `devices_per_node` is not a positive power of two or the group is
/// invalid.
pub fn inter_node_groups(
    layout: &Layout,
    collective: Collective,
    devices_per_node: u64,
    device_dim: Option<usize>,
) -> Result<u64> {
    if !devices_per_node.is_power_of_two() {
        return Err(Error::Topology(format!(
            "devices_per_node must be a positive power of two, got {devices_per_node}"
        )));
    }
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
                inter_node_groups(&dw, Collective::AllReduce, 8, None).unwrap(),
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
            .collective_cost(&t, Collective::AllGather, Some(1), 2.0, CostModel::Topology)
            .unwrap();
        assert_eq!(
            inter_node_groups(&t, Collective::AllGather, 8, Some(1)).unwrap(),
            8
        );
        assert!((cost - bytes / 1.5625e9).abs() < 1e-15);
    }

    #[test]
    fn rejects_bad_clusters() {
        assert!(Cluster::new(3, 8, 1.0, 1.0, None).is_err());
        assert!(Cluster::new(0, 8, 1.0, 1.0, None).is_err());
        assert!(Cluster::new(1, 8, 0.0, 1.0, None).is_err());
        assert!(Cluster::new(1, 8, 1.0, f64::NAN, None).is_err());
    }
}
