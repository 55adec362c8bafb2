//! The topology-aware cost model: a cluster as nested levels (GPUs in a node, nodes in a pod,
//! ...), each with the bandwidth out of one of its parts and a latency per collective; how many
//! communication groups of a part cross its boundary at once (`ct`), the effective bandwidth
//! that leaves each, and the cost of a collective in seconds, or in bytes under the volume model.

use crate::error::{Error, Result};
use crate::layout::Layout;

/// A homogeneous cluster: `nodes` nodes of `devices_per_node` devices each, nested in
/// [`Level`]s.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub nodes: u64,
    pub devices_per_node: u64,
    /// Bytes per second between two devices of one node (the innermost level's bandwidth).
    pub intra_bandwidth: f64,
    /// Bytes per second out of a node, shared by every group that crosses it (the next level's).
    pub inter_bandwidth: f64,
    /// Bytes of memory per device, if limited.
    pub device_memory: Option<f64>,
    /// Innermost first: the node, then every level above it, the last holding every device.
    pub levels: Vec<Level>,
    pub replicas: Replicas,
}

/// One level of a cluster: units of `devices` consecutive devices (a node, a pod, ...). Traffic
/// that stays inside one unit but leaves a unit of the level below flows at `bandwidth` bytes
/// per second out of each unit below, shared by the groups that cross it (for the innermost
/// level: between two devices); each collective that crosses only up to this level also waits
/// `latency` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    pub devices: u64,
    pub bandwidth: f64,
    pub latency: f64,
}

/// How copies of a tensor on several devices of a node send it out of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Replicas {
    /// As the paper: the copies share one transfer (only groups with distinct data count in `ct`).
    Shared,
    /// As NCCL and XLA run it: one transfer per copy.
    Flat,
}

impl Replicas {
    /// # Errors
    /// [`Error::Topology`] for a name other than `shared` or `flat`.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "shared" => Ok(Replicas::Shared),
            "flat" => Ok(Replicas::Flat),
            _ => Err(Error::Topology(format!(
                "unknown replica model {name:?}: expected \"shared\" or \"flat\""
            ))),
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Replicas::Shared => "shared",
            Replicas::Flat => "flat",
        }
    }
}

/// A named cluster: per level, innermost first, how many parts of the level below one unit holds
/// (the outermost level's count comes from the number of nodes), its bandwidth and its latency.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    pub name: &'static str,
    pub levels: &'static [(u64, f64, f64)],
    pub device_memory: Option<f64>,
    pub replicas: Replicas,
}

/// The built-in clusters, the one place that states their numbers.
pub const PRESETS: [Preset; 2] = [
    // The paper's: nodes of 8 V100s, 60 GB/s between GPUs of a node, 6 GB/s out of a node; no
    // latency, replicas share transfers.
    Preset {
        name: "dgx-v100",
        levels: &[(8, 60e9, 0.0), (1, 6e9, 0.0)],
        device_memory: None,
        replicas: Replicas::Shared,
    },
    // DGX H100: NVLink 4 at 450 GB/s per direction per GPU, 8 ConnectX-7 at 400 Gb/s (400 GB/s
    // per node); about 5 us per collective inside a node and 10 us across (NCCL's small-message
    // latencies); 80 GB per GPU; one transfer per copy, as NCCL.
    Preset {
        name: "dgx-h100",
        levels: &[(8, 450e9, 5e-6), (1, 400e9, 1e-5)],
        device_memory: Some(80e9),
        replicas: Replicas::Flat,
    },
];

/// The paper's cluster, whose bandwidths are the defaults of the Python `Cluster(...)`.
pub const PAPER: Preset = PRESETS[0];

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
    /// Two levels, nodes of `devices_per_node` devices, no latency, shared replicas: the paper's
    /// model.
    ///
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
        Self::hierarchy(
            &[
                (devices_per_node, intra_bandwidth, 0.0),
                (nodes, inter_bandwidth, 0.0),
            ],
            device_memory,
            Replicas::Shared,
        )
    }

    /// A cluster of nested levels, innermost first, each given as (how many parts of the level
    /// below one unit holds, bandwidth, latency): the first count is the devices per node, the
    /// product of the others the nodes.
    ///
    /// # Errors
    /// [`Error::Topology`] unless there is a level, the counts are positive with a power-of-two
    /// product, the bandwidths (and memory, if given) positive and finite, and the latencies
    /// finite and not negative.
    pub fn hierarchy(
        levels: &[(u64, f64, f64)],
        device_memory: Option<f64>,
        replicas: Replicas,
    ) -> Result<Self> {
        let Some(&(devices_per_node, intra_bandwidth, _)) = levels.first() else {
            return Err(Error::Topology("a cluster needs at least one level".into()));
        };
        let counts: Vec<u64> = levels.iter().map(|l| l.0).collect();
        if counts.contains(&0) {
            return Err(Error::Topology(format!(
                "a cluster needs at least one node and one device per node, got counts \
                 {counts:?} (devices per node first)"
            )));
        }
        let total = counts.iter().try_fold(1u64, |n, &c| n.checked_mul(c));
        if !total.is_some_and(u64::is_power_of_two) {
            return Err(Error::Topology(format!(
                "levels of {counts:?} parts (devices per node first): the device count must be a \
                 power of two"
            )));
        }
        let inter_bandwidth = levels.get(1).map_or(intra_bandwidth, |l| l.1);
        let mut out = Vec::with_capacity(levels.len());
        let mut devices = 1;
        for (j, &(count, bandwidth, latency)) in levels.iter().enumerate() {
            let name = match j {
                0 => "intra_bandwidth".to_string(),
                1 => "inter_bandwidth".to_string(),
                _ => format!("the bandwidth of level {j}"),
            };
            if !(bandwidth.is_finite() && bandwidth > 0.0) {
                return Err(Error::Topology(format!(
                    "{name} must be a positive number of bytes per second, got {bandwidth}"
                )));
            }
            if !(latency.is_finite() && latency >= 0.0) {
                return Err(Error::Topology(format!(
                    "the latency of level {j} must be a number of seconds, not negative, got \
                     {latency}"
                )));
            }
            devices *= count;
            out.push(Level {
                devices,
                bandwidth,
                latency,
            });
        }
        if let Some(m) = device_memory {
            if !(m.is_finite() && m > 0.0) {
                return Err(Error::Topology(format!(
                    "device_memory must be a positive number of bytes, got {m}"
                )));
            }
        }
        Ok(Cluster {
            nodes: devices / devices_per_node,
            devices_per_node,
            intra_bandwidth,
            inter_bandwidth,
            device_memory,
            levels: out,
            replicas,
        })
    }

    /// The built-in cluster `name` ([`PRESETS`]) with `nodes` nodes.
    ///
    /// # Errors
    /// [`Error::Topology`] for an unknown name or a node count that does not fill its levels.
    pub fn preset(name: &str, nodes: u64) -> Result<Self> {
        let Some(p) = PRESETS.iter().find(|p| p.name == name) else {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            return Err(Error::Topology(format!(
                "unknown cluster preset {name:?}: expected one of {names:?} or a .toml file"
            )));
        };
        let mut levels = p.levels.to_vec();
        let last = levels.len() - 1;
        let inner: u64 = levels[1..last].iter().map(|l| l.0).product();
        if nodes == 0 || nodes % inner != 0 {
            return Err(Error::Topology(format!(
                "{nodes} nodes do not fill units of {inner} nodes of preset {name:?}"
            )));
        }
        levels[last].0 = nodes / inner;
        Self::hierarchy(&levels, p.device_memory, p.replicas)
    }

    /// The levels as [`Cluster::hierarchy`] takes them: (parts of the level below, bandwidth,
    /// latency).
    #[must_use]
    pub fn level_parts(&self) -> Vec<(u64, f64, f64)> {
        let mut below = 1;
        self.levels
            .iter()
            .map(|l| {
                let count = l.devices / below;
                below = l.devices;
                (count, l.bandwidth, l.latency)
            })
            .collect()
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
        let flat = self.replicas == Replicas::Flat;
        // The innermost level one unit of which holds every group.
        let j = self
            .levels
            .iter()
            .position(|l| crossing(layout, &in_group, l.devices, flat) == 0)
            .unwrap_or(self.levels.len() - 1);
        let level = &self.levels[j];
        if j == 0 {
            return level.latency + bytes / level.bandwidth;
        }
        let below = self.levels[j - 1].devices;
        let ct = crossing(layout, &in_group, below, flat);
        let effective = level.bandwidth / ct as f64;
        let factor = if collective == Collective::AllToAll {
            // Only the k(p-k) of the p(p-1) peer transfers that leave the part use its link.
            let p = (0..layout.num_device_dims())
                .filter(|&k| in_group(k))
                .map(|k| layout.dim_size(k))
                .product::<u64>() as f64;
            let k = extents(layout, below)
                .enumerate()
                .filter(|&(k, _)| in_group(k))
                .map(|(_, e)| e)
                .product::<u64>() as f64;
            k * (p - k) / (p - 1.0)
        } else {
            1.0
        };
        level.latency + factor * bytes / effective
    }

    /// A lower bound on the seconds of a collective moving `bytes` per device over a group that
    /// holds device dim `k` of `layout`: the fastest level the group may use, and the least
    /// latency.
    pub(crate) fn least_seconds(&self, layout: &Layout, k: usize, bytes: f64) -> f64 {
        let inside = extents(layout, self.devices_per_node)
            .nth(k)
            .is_some_and(|e| e == layout.dim_size(k));
        let usable = if inside {
            &self.levels[..]
        } else {
            &self.levels[1.min(self.levels.len() - 1)..]
        };
        let fastest = usable.iter().map(|l| l.bandwidth).fold(0.0, f64::max);
        let latency = usable
            .iter()
            .map(|l| l.latency)
            .fold(f64::INFINITY, f64::min);
        latency + bytes / fastest
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
    crossing(layout, in_group, l, false)
}

/// [`groups_crossing`] for parts of `l` consecutive devices; with `flat` replicas every copy
/// counts as a group of its own.
fn crossing(layout: &Layout, in_group: impl Fn(usize) -> bool, l: u64, flat: bool) -> u64 {
    let mut inside = true;
    let mut ct = 1;
    for (k, e) in extents(layout, l).enumerate() {
        if in_group(k) {
            inside &= e == layout.dim_size(k);
        } else if flat || layout.distinct_along(k) {
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
