//! The topology-aware cost model (docs/conventions.md#topology-aware-cost), on a cluster of nested
//! levels (GPUs in a node, nodes in a pod, ...), each with the bandwidth out of one of its parts
//! and a latency per collective: how many communication groups of a part cross its boundary at
//! once (`ct`), the effective bandwidth that leaves each, and the cost of a collective in seconds,
//! or in bytes under the volume model.

use crate::error::{Error, Result};
use crate::layout::Layout;

/// A homogeneous cluster: `nodes` nodes of `devices_per_node` devices each, nested in
/// [`Level`]s. Validated once by [`Cluster::hierarchy`] (which [`Cluster::new`] and
/// [`Cluster::preset`] call); the fields are read through accessors so that no cluster skips the
/// checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    device_memory: Option<f64>,
    /// Innermost first, never empty: the node sizes and bandwidths are its first two levels'.
    levels: Vec<Level>,
    replicas: Replicas,
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
    /// Every model, in the order of [`Replicas::NAMES`].
    pub const ALL: [Replicas; 2] = [Replicas::Shared, Replicas::Flat];

    /// The names callers use (Python, the CLI, TOML files): the one list of them.
    pub const NAMES: [&'static str; 2] = ["shared", "flat"];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The replica model named `name`, one of [`Replicas::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "replica model", &Self::NAMES, Error::Topology).map(|i| Self::ALL[i])
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

/// The kind of a collective the cost model prices. (A kind, not a collective: the Python
/// `taps.costs.Collective` record is one collective of an operator, with its tensor and layout.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    AllToAll,
    ReduceScatter,
    CollectivePermute,
}

impl CollectiveKind {
    /// Every kind, in the order of [`CollectiveKind::NAMES`].
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::AllToAll,
        CollectiveKind::ReduceScatter,
        CollectiveKind::CollectivePermute,
    ];

    /// The names callers use (Python, the CLI, a plan's steps): the one list of them.
    pub const NAMES: [&'static str; 5] = [
        "all_reduce",
        "all_gather",
        "all_to_all",
        "reduce_scatter",
        "collective_permute",
    ];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The kind named `name`, one of [`CollectiveKind::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "collective", &Self::NAMES, Error::Topology).map(|i| Self::ALL[i])
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
        parse_name(name, "cost model", &Self::NAMES, Error::Topology).map(|i| Self::ALL[i])
    }
}

/// The index of `name` in `names`, or an error of `kind` listing them.
pub(crate) fn parse_name(
    name: &str,
    what: &str,
    names: &[&str],
    kind: fn(String) -> Error,
) -> Result<usize> {
    names.iter().position(|&n| n == name).ok_or_else(|| {
        let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        let (last, rest) = quoted.split_last().expect("names are not empty");
        kind(format!(
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
        if levels.is_empty() {
            return Err(Error::Topology("a cluster needs at least one level".into()));
        }
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
        let mut out = Vec::with_capacity(levels.len());
        let mut devices = 1;
        for (j, &(count, bandwidth, latency)) in levels.iter().enumerate() {
            // Levels 0 and 1 are the arguments of `Cluster(...)` too: both names.
            let name = |what: &str| match j {
                0 => format!("intra_{what} (the {what} of level 0)"),
                1 => format!("inter_{what} (the {what} of level 1)"),
                _ => format!("the {what} of level {j}"),
            };
            if !(bandwidth.is_finite() && bandwidth > 0.0) {
                return Err(Error::Topology(format!(
                    "{} must be a positive number of bytes per second, got {bandwidth}",
                    name("bandwidth")
                )));
            }
            if !(latency.is_finite() && latency >= 0.0) {
                return Err(Error::Topology(format!(
                    "{} must be a finite number of seconds, not negative, got {latency}",
                    name("latency")
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
        Self::filled(p.levels, nodes, p.device_memory, p.replicas)
            .map_err(|e| Error::Topology(format!("preset {name:?}: {e}")))
    }

    /// [`Cluster::hierarchy`] of `levels` with `nodes` nodes (the rule of presets and cluster
    /// files): the outermost level holds as many units as the nodes fill (its given count is not
    /// read), and a cluster of one level is one node.
    ///
    /// # Errors
    /// [`Error::Topology`] if the nodes do not fill whole units of the levels between the node
    /// and the outermost one, a one-level cluster is given more than one node, or
    /// [`Cluster::hierarchy`] rejects the levels.
    pub fn filled(
        levels: &[(u64, f64, f64)],
        nodes: u64,
        device_memory: Option<f64>,
        replicas: Replicas,
    ) -> Result<Self> {
        let mut levels = levels.to_vec();
        match levels.len() {
            1 if nodes != 1 => {
                return Err(Error::Topology(format!(
                    "a cluster of one level is one node, not {nodes}"
                )))
            }
            // No level (which `hierarchy` rejects) or one level: nothing to fill.
            0 | 1 => {}
            n => {
                // A zero or overflowing count is left to `hierarchy` to reject.
                let inner = levels[1..n - 1]
                    .iter()
                    .try_fold(1u64, |p, l| p.checked_mul(l.0))
                    .filter(|&inner| inner > 0);
                if let Some(inner) = inner {
                    if nodes == 0 || nodes % inner != 0 {
                        return Err(Error::Topology(format!(
                            "{nodes} nodes do not fill units of {inner} nodes"
                        )));
                    }
                    levels[n - 1].0 = nodes / inner;
                }
            }
        }
        Self::hierarchy(&levels, device_memory, replicas)
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
    pub fn nodes(&self) -> u64 {
        self.num_devices() / self.devices_per_node()
    }

    /// Devices per node: a node holds this many consecutive ranks.
    #[must_use]
    pub fn devices_per_node(&self) -> u64 {
        self.levels[0].devices
    }

    /// Bytes per second between two devices of one node.
    #[must_use]
    pub fn intra_bandwidth(&self) -> f64 {
        self.levels[0].bandwidth
    }

    /// Bytes per second out of a node, shared by every group that crosses it.
    #[must_use]
    pub fn inter_bandwidth(&self) -> f64 {
        self.levels.get(1).unwrap_or(&self.levels[0]).bandwidth
    }

    /// Bytes of memory per device, if limited.
    #[must_use]
    pub fn device_memory(&self) -> Option<f64> {
        self.device_memory
    }

    /// The levels, innermost first: the node, then every level above it, the last holding every
    /// device.
    #[must_use]
    pub fn levels(&self) -> &[Level] {
        &self.levels
    }

    /// How copies of a tensor send it out of a node.
    #[must_use]
    pub fn replicas(&self) -> Replicas {
        self.replicas
    }

    #[must_use]
    pub fn num_devices(&self) -> u64 {
        self.levels[self.levels.len() - 1].devices
    }

    pub(crate) fn check(&self, layout: &Layout) -> Result<()> {
        if layout.num_devices() == self.num_devices() {
            Ok(())
        } else {
            Err(Error::Topology(format!(
                "the layout spans {} devices but the cluster has {} ({} nodes of {})",
                layout.num_devices(),
                self.num_devices(),
                self.nodes(),
                self.devices_per_node()
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
            CostModel::Topology => self.seconds(
                layout.device_matrix(),
                |k| layout.distinct_along(k),
                collective,
                in_group,
                bytes,
            ),
        }
    }

    /// Seconds to move `bytes` per device in a collective over the device dims that pass
    /// `in_group` of a layout on `device_matrix` whose dims that pass `distinct` hold distinct
    /// data (tests rather than lists or a layout, so that pricing allocates nothing and the
    /// optimal planner prices a step without building its layout); the group is valid.
    pub(crate) fn seconds(
        &self,
        device_matrix: &[u64],
        distinct: impl Fn(usize) -> bool,
        collective: CollectiveKind,
        in_group: impl Fn(usize) -> bool,
        bytes: f64,
    ) -> f64 {
        if bytes == 0.0 {
            return 0.0;
        }
        let flat = self.replicas == Replicas::Flat;
        // The innermost level one unit of which holds every group, and how many groups cross the
        // parts of the level below it (counted once, in the same walk).
        let (mut ct, mut here) = (0, 0);
        let j = self
            .levels
            .iter()
            .position(|l| {
                ct = here;
                here = crossing(device_matrix, &distinct, &in_group, l.devices, flat);
                here == 0
            })
            .unwrap_or(self.levels.len() - 1);
        let level = &self.levels[j];
        if j == 0 {
            return level.latency + bytes / level.bandwidth;
        }
        let below = self.levels[j - 1].devices;
        let effective = level.bandwidth / ct as f64;
        let factor = if collective == CollectiveKind::AllToAll {
            // Only the k(p-k) of the p(p-1) peer transfers that leave the part use its link.
            let p = device_matrix
                .iter()
                .rev()
                .enumerate()
                .filter(|&(k, _)| in_group(k))
                .map(|(_, &d)| d)
                .product::<u64>() as f64;
            let k = extents(device_matrix, below)
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

    /// What the topology model prices by, as numbers: each level's devices, bandwidth and
    /// latency, and the replica model.
    pub(crate) fn fingerprint(&self) -> Vec<u64> {
        let levels = self
            .levels
            .iter()
            .flat_map(|l| [l.devices, l.bandwidth.to_bits(), l.latency.to_bits()]);
        levels.chain([self.replicas as u64]).collect()
    }

    /// Lower bounds on the seconds of a collective that moves `c` shards of a tensor of `bytes`
    /// over a group holding device dim `k` and lying within the dims of `spread` (a mask holding
    /// `k`), on layouts of `device_matrix` where only the dims of `splitting` (a mask) may split
    /// the tensor: per level such a group may cross up to, `(latency, rate)` with the collective
    /// taking at least `latency + c * bytes * rate`.
    ///
    /// Within a node, a shard is at least the tensor over every dim of `splitting`. Across
    /// units, what the groups crossing a unit move together counts: a shard times the groups
    /// with distinct data (or every group, with flat replicas) is at least the tensor over the
    /// number of units each splitting dim spans, and over the whole size of the dims of the
    /// group. A group of more dims crosses no fewer levels than `k` alone; an all-to-all's factor
    /// is at least 1.
    pub(crate) fn least_rates(
        &self,
        device_matrix: &[u64],
        k: usize,
        spread: u64,
        splitting: u64,
    ) -> Vec<(f64, f64)> {
        let flat = self.replicas == Replicas::Flat;
        let first = self
            .levels
            .iter()
            .position(|l| crossing(device_matrix, |_| true, |i| i == k, l.devices, flat) == 0)
            .unwrap_or(self.levels.len() - 1);
        // A group of `k` alone runs at its first level; a wider one at that level or above.
        let last = if spread == 1 << k {
            first
        } else {
            self.levels.len() - 1
        };
        let splits = |i: usize| splitting >> i & 1 == 1;
        (first..=last)
            .map(|j| {
                let level = &self.levels[j];
                let parts: f64 = if j == 0 {
                    (0..device_matrix.len())
                        .filter(|&i| splits(i))
                        .map(|i| device_matrix[device_matrix.len() - 1 - i] as f64)
                        .product()
                } else {
                    extents(device_matrix, self.levels[j - 1].devices)
                        .zip(device_matrix.iter().rev())
                        .enumerate()
                        .filter(|&(i, _)| splits(i))
                        .map(|(i, (e, &d))| {
                            if spread >> i & 1 == 1 {
                                d as f64
                            } else {
                                (d / e) as f64
                            }
                        })
                        .product()
                };
                (level.latency, 1.0 / (parts * level.bandwidth))
            })
            .collect()
    }
}

/// `e_k`: how many distinct coordinates of device dim `k` one node of `l` consecutive ranks holds.
#[must_use]
pub fn extents_in_node(layout: &Layout, l: u64) -> Vec<u64> {
    extents(layout.device_matrix(), l).collect()
}

/// [`extents_in_node`] of the layouts on `device_matrix`, without the vector, for the cost
/// kernels.
fn extents(device_matrix: &[u64], l: u64) -> impl Iterator<Item = u64> + '_ {
    let mut inner = 1u64;
    device_matrix.iter().rev().map(move |&d| {
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
        CollectiveKind::AllToAll | CollectiveKind::ReduceScatter => (g - 1.0) / g * s,
        CollectiveKind::CollectivePermute => s,
    }
}

/// `ct` for a valid group, the device dims that pass `in_group`: 0 if the group stays inside a
/// node, else the number of groups with distinct data that leave one node at once. Replicas
/// (device dims that neither split the tensor nor hold partial sums) share one transfer, so only
/// the other dims outside the group count.
pub(crate) fn groups_crossing(layout: &Layout, in_group: impl Fn(usize) -> bool, l: u64) -> u64 {
    crossing(
        layout.device_matrix(),
        |k| layout.distinct_along(k),
        in_group,
        l,
        false,
    )
}

/// [`groups_crossing`] for parts of `l` consecutive devices; with `flat` replicas every copy
/// counts as a group of its own.
fn crossing(
    device_matrix: &[u64],
    distinct: impl Fn(usize) -> bool,
    in_group: impl Fn(usize) -> bool,
    l: u64,
    flat: bool,
) -> u64 {
    let mut inside = true;
    let mut ct = 1;
    for ((k, e), &d) in extents(device_matrix, l)
        .enumerate()
        .zip(device_matrix.iter().rev())
    {
        if in_group(k) {
            inside &= e == d;
        } else if flat || distinct(k) {
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
        use crate::plan::{plan_redistribution, Objective, Planner};
        use crate::strategies::Strategy;
        use std::slice::from_ref;

        let cluster = Cluster::new(2, 2, 60e9, 6e9, None).unwrap();
        let a = Layout::new(vec![8, 8], vec![4], vec![0, -1]).unwrap();
        let b = Layout::new(vec![8, 8], vec![4], vec![-1, 0]).unwrap();
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        let strategy = Strategy::new(vec![4], vec![0]).unwrap();
        let (model, paper) = (CostModel::Topology, Planner::Paper);
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
                redistribution_costs(from_ref(&a), from_ref(&b), &cluster, bad, model, paper)
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
        for planner in [Planner::Paper, Planner::Optimal] {
            let costs =
                redistribution_costs(from_ref(&a), from_ref(&a), &cluster, 0.0, model, planner);
            assert!(costs.is_err());
        }
    }

    /// `ct` has one rule whichever way it is asked for: a node size that is not a positive power
    /// of two is rejected by the free function and by a plan's ops alike (slices included), and
    /// both give the same `ct` otherwise.
    #[test]
    fn one_node_size_rule_for_both_ct_entry_points() {
        use crate::plan::{plan_redistribution, Objective, OpKind, Planner};

        let a = Layout::new(vec![16, 16, 16], vec![2, 4, 2], vec![0, 1, -1]).unwrap();
        let b = Layout::new(vec![16, 16, 16], vec![2, 4, 2], vec![-1, 2, 1]).unwrap();
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        assert!(plan.ops.iter().any(|op| op.kind() == OpKind::Slice));
        assert!(plan.ops.iter().any(|op| op.kind() != OpKind::Slice));
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
                let want = match op.kind().collective() {
                    Some(kind) => inter_node_groups(op.layout(), kind, l, Some(op.device_dim())),
                    None => Ok(0),
                };
                assert_eq!(op.inter_node_groups(l), want);
            }
        }
    }

    /// The node-filling rule of presets and cluster files: no panic on any number of levels.
    #[test]
    fn filled_levels_take_their_outermost_count_from_the_nodes() {
        let three = [(4, 100e9, 0.0), (2, 20e9, 0.0), (99, 5e9, 0.0)];
        let c = Cluster::filled(&three, 8, None, Replicas::Flat).unwrap();
        assert_eq!(
            (c.nodes(), c.num_devices(), c.level_parts()[2].0),
            (8, 32, 4)
        );
        for nodes in [0, 3] {
            let e = Cluster::filled(&three, nodes, None, Replicas::Flat).unwrap_err();
            assert!(matches!(e, Error::Topology(m) if m.contains("do not fill")));
        }
        let one = [(8, 60e9, 0.0)];
        assert_eq!(
            Cluster::filled(&one, 1, None, Replicas::Shared).unwrap(),
            Cluster::hierarchy(&one, None, Replicas::Shared).unwrap()
        );
        for nodes in [0, 2] {
            let e = Cluster::filled(&one, nodes, None, Replicas::Shared).unwrap_err();
            assert!(matches!(e, Error::Topology(m) if m.contains("one level is one node")));
        }
        for bad in [&[][..], &[(8, 60e9, 0.0), (0, 6e9, 0.0), (1, 1e9, 0.0)][..]] {
            assert!(matches!(
                Cluster::filled(bad, 2, None, Replicas::Shared),
                Err(Error::Topology(_))
            ));
        }
        assert_eq!(
            Cluster::preset("dgx-v100", 4).unwrap(),
            Cluster::new(4, 8, 60e9, 6e9, None).unwrap()
        );
    }

    #[test]
    fn names_parse_back_and_others_are_rejected() {
        for kind in CollectiveKind::ALL {
            assert_eq!(CollectiveKind::parse(kind.name()), Ok(kind));
        }
        for model in CostModel::ALL {
            assert_eq!(CostModel::parse(model.name()), Ok(model));
        }
        for replicas in Replicas::ALL {
            assert_eq!(Replicas::parse(replicas.name()), Ok(replicas));
        }
        let Err(Error::Topology(m)) = CostModel::parse("bytes") else {
            panic!("an unknown cost model parsed")
        };
        assert_eq!(
            m,
            r#"unknown cost model "bytes": expected "topology" or "volume""#
        );
        assert!(CollectiveKind::parse("broadcast").is_err());
        assert!(Replicas::parse("copies").is_err());
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
