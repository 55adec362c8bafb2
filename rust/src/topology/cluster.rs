//! A cluster of nested levels (GPUs in a node, nodes in a pod, ...), each with the bandwidth out of
//! one of its parts and a latency per collective, its kind of device, and how copies of a tensor
//! send it out of a node: built and checked once, read through accessors.

use super::device::Device;
use crate::error::{parse_name, shown_number, Error, Result};
use crate::layout::Layout;

/// The most devices a cluster may have: their count and products of it stay within `i64`.
pub const MAX_DEVICES: u64 = 1 << 62;
/// The least bandwidth a level may have, in bytes per second: with [`MAX_LATENCY`], any
/// collective's time stays a finite number of seconds (a subnormal bandwidth or a latency near
/// `f64::MAX` would price plans at infinity).
pub const MIN_BANDWIDTH: f64 = 1.0;
/// The most latency a level may have, in seconds per collective.
pub const MAX_LATENCY: f64 = 1e6;

/// A homogeneous cluster: `nodes` nodes of `devices_per_node` devices each, nested in
/// [`Level`]s. Validated once by [`Cluster::hierarchy`] (which [`Cluster::new`] and
/// [`Cluster::preset`] call); the fields are read through accessors so that no cluster skips the
/// checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    device: Device,
    /// Bytes a device may hold, `None` for no limit (the paper's model).
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

/// The memory limit of a device of `device`'s kind given `requested` bytes: its kind's memory
/// if none is requested, no limit for an infinite request (the paper's model), else the request.
#[must_use]
pub fn memory_limit(device: Device, requested: Option<f64>) -> Option<f64> {
    match requested {
        None => Some(device.memory),
        Some(m) if m == f64::INFINITY => None,
        Some(m) => Some(m),
    }
}

impl Cluster {
    /// Two levels, nodes of `devices_per_node` devices, no latency, shared replicas, of V100s:
    /// the paper's model.
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
    /// product of the others the nodes. Its devices are V100s (the paper's) until
    /// [`Cluster::with_device`] says otherwise; `device_memory` is the limit as given (`None`: no
    /// limit), whatever the device.
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
        if total.is_none_or(|n| n > MAX_DEVICES) {
            return Err(Error::Topology(format!(
                "levels of {counts:?} parts (devices per node first) make more than 2^62 devices"
            )));
        }
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
            if !(bandwidth.is_finite() && bandwidth >= MIN_BANDWIDTH) {
                return Err(Error::Topology(format!(
                    "{} must be a finite number of at least 1 byte per second, got {}",
                    name("bandwidth"),
                    shown_number(bandwidth)
                )));
            }
            if !(latency.is_finite() && (0.0..=MAX_LATENCY).contains(&latency)) {
                return Err(Error::Topology(format!(
                    "{} must be a number of seconds from 0 to 1e6, got {}",
                    name("latency"),
                    shown_number(latency)
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
            if !(m.is_finite() && m >= 1.0) {
                return Err(Error::Topology(format!(
                    "device_memory must be a finite number of at least 1 byte, got {}",
                    shown_number(m)
                )));
            }
        }
        Ok(Cluster {
            device: Device::V100,
            device_memory,
            levels: out,
            replicas,
        })
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
                    if nodes == 0 || !nodes.is_multiple_of(inner) {
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

    /// This cluster made of `device`s (its levels, memory limit and replica model unchanged).
    #[must_use]
    pub fn with_device(self, device: Device) -> Self {
        Cluster { device, ..self }
    }

    /// The kind of device the cluster is made of.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    /// Numbers at the edge of floating point and of the integers are refused with their reason,
    /// and the edges themselves are accepted.
    #[test]
    fn device_counts_bandwidths_and_latencies_keep_prices_finite() {
        let refused = |levels: &[(u64, f64, f64)], why: &str| {
            let e = Cluster::hierarchy(levels, None, Replicas::Flat).unwrap_err();
            assert!(matches!(&e, Error::Topology(m) if m.contains(why)), "{e:?}");
        };
        refused(
            &[(1 << 62, 1e9, 0.0), (2, 1e9, 0.0)],
            "more than 2^62 devices",
        );
        refused(
            &[(1 << 40, 1e9, 0.0), (1 << 40, 1e9, 0.0)],
            "more than 2^62 devices",
        );
        refused(&[(8, 5e-320, 0.0)], "at least 1 byte per second");
        refused(&[(8, 0.5, 0.0)], "at least 1 byte per second");
        refused(&[(8, 1e9, 1e308)], "from 0 to 1e6");
        let edge = [(1 << 62, MIN_BANDWIDTH, MAX_LATENCY)];
        let c = Cluster::hierarchy(&edge, None, Replicas::Flat).unwrap();
        assert_eq!(c.num_devices(), 1 << 62);
    }

    #[test]
    fn memory_defaults_to_the_devices_and_infinity_is_no_limit() {
        let h100 = crate::topology::Device::parse("h100").unwrap();
        assert_eq!(memory_limit(h100, None), Some(80e9));
        assert_eq!(memory_limit(h100, Some(40e9)), Some(40e9));
        assert_eq!(memory_limit(h100, Some(f64::INFINITY)), None);
        let c = Cluster::new(1, 8, 60e9, 6e9, None)
            .unwrap()
            .with_device(h100);
        assert_eq!((c.device(), c.device_memory()), (h100, None));
    }

    #[test]
    fn replica_models_parse_back_and_others_are_rejected() {
        for replicas in Replicas::ALL {
            assert_eq!(Replicas::parse(replicas.name()), Ok(replicas));
        }
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
