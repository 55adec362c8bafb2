//! The built-in clusters ([`PRESETS`]), one per device kind, and [`Cluster::preset`], which also
//! opens cluster files.

use std::path::Path;

use super::cluster::{memory_limit, Cluster, Replicas};
use super::device::{Device, DEVICES};
use crate::error::{Error, Result};

/// A named cluster of one kind of device: per level, innermost first, how many parts of the level
/// below one unit holds (the outermost level's count comes from the number of nodes), its
/// bandwidth and its latency. Its devices hold their kind's memory; copies send one transfer
/// each, as NCCL and XLA.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    pub name: &'static str,
    pub device: Device,
    pub levels: &'static [(u64, f64, f64)],
}

/// Seconds per collective step over NVLink: NCCL's tuning model (src/graph/tuning.cc) charges
/// 1.9 us per ring step over NVLink with its LL128 protocol.
const NVLINK_LATENCY: f64 = 2e-6;
/// Seconds per collective step over the network between nodes (InfiniBand or RoCE): NCCL's tuning
/// model charges a few microseconds per network step, more than twice NVLink's.
const NETWORK_LATENCY: f64 = 5e-6;

/// The built-in clusters, the one place that states their numbers. Bandwidths per direction:
/// between two GPUs of a node, the NVLink bandwidth of one GPU (its NVSwitch gives any pair the
/// whole of it); out of a node, the sum of its compute network adapters.
pub const PRESETS: [Preset; 6] = [
    // The paper's cluster: nodes of 8 V100s, 60 GB/s between GPUs of a node, 6 GB/s out of a
    // node (its numbers, not a DGX-1's); the latencies of NVLink and the network.
    Preset {
        name: "dgx-v100",
        device: DEVICES[0],
        levels: &[(8, 60e9, NVLINK_LATENCY), (1, 6e9, NETWORK_LATENCY)],
    },
    // DGX A100 (datasheet): NVLink 3 at 600 GB/s per GPU both ways (300 each way), 8 ConnectX-6
    // HDR adapters at 200 Gb/s for compute (200 GB/s out of a node).
    Preset {
        name: "dgx-a100",
        device: DEVICES[1],
        levels: &[(8, 300e9, NVLINK_LATENCY), (1, 200e9, NETWORK_LATENCY)],
    },
    // DGX H100 (datasheet): NVLink 4 at 900 GB/s per GPU both ways (450 each way), 8 ConnectX-7
    // at 400 Gb/s (400 GB/s out of a node).
    Preset {
        name: "dgx-h100",
        device: DEVICES[2],
        levels: &[(8, 450e9, NVLINK_LATENCY), (1, 400e9, NETWORK_LATENCY)],
    },
    // DGX H200 (datasheet): the DGX H100's NVLink 4 and 8 ConnectX-7 at 400 Gb/s.
    Preset {
        name: "dgx-h200",
        device: DEVICES[3],
        levels: &[(8, 450e9, NVLINK_LATENCY), (1, 400e9, NETWORK_LATENCY)],
    },
    // DGX B200 (datasheet): NVLink 5 at 1.8 TB/s per GPU both ways (900 GB/s each way), 8
    // ConnectX-7 at 400 Gb/s (400 GB/s out of a node).
    Preset {
        name: "dgx-b200",
        device: DEVICES[4],
        levels: &[(8, 900e9, NVLINK_LATENCY), (1, 400e9, NETWORK_LATENCY)],
    },
    // One Cloud TPU v5p slice (Cloud TPU v5p documentation): a node is a host of 4 chips (a
    // 2x2x1 block of the 3D torus), each chip with 6 ICI links of 100 GB/s each way (1,200 GB/s
    // both ways per chip). Two chips of a host talk over the 2 links a chip has inside its block
    // (200 GB/s); out of a host go the other 4 links of its 4 chips (1.6 TB/s). A torus is not a
    // switch: the model takes a host's links as shared by the groups that leave it and ignores
    // the torus' bisection, which an all-to-all over a large slice meets. Slices joined over the
    // data-center network (50 Gb/s per chip, 25 GB/s per host) are a third level: a cluster file
    // (docs/core.md). ICI latencies are not published: 1 us per step, to be measured
    // (`taps calibrate`).
    Preset {
        name: "tpu-v5p",
        device: DEVICES[5],
        levels: &[(4, 200e9, 1e-6), (1, 1.6e12, 1e-6)],
    },
];

impl Preset {
    /// The preset of `device`'s kind: where a cluster of that kind takes the bandwidths and
    /// latencies it is not given.
    ///
    /// # Panics
    /// Never for a kind of [`DEVICES`]: each has a preset (a test checks).
    #[must_use]
    pub fn of(device: Device) -> Preset {
        *PRESETS
            .iter()
            .find(|p| p.device.name == device.name)
            .expect("every device kind has a preset")
    }
}

impl Cluster {
    /// The built-in cluster `name` ([`PRESETS`]) with `nodes` nodes, or the cluster of the TOML
    /// file `name` (a name ending in `.toml`: [`Cluster::from_file`]).
    ///
    /// # Errors
    /// [`Error::Topology`] for an unknown name, a file that does not describe a cluster, or a
    /// node count that does not fill its levels.
    pub fn preset(name: &str, nodes: u64) -> Result<Self> {
        let path = Path::new(name);
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
        {
            return Self::from_file(path, nodes);
        }
        let Some(p) = PRESETS.iter().find(|p| p.name == name) else {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            return Err(Error::Topology(format!(
                "unknown cluster preset {name:?}: expected one of {names:?} or a .toml file"
            )));
        };
        Self::filled(
            p.levels,
            nodes,
            memory_limit(p.device, None),
            Replicas::Flat,
        )
        .map(|c| c.with_device(p.device))
        .map_err(|e| Error::Topology(format!("preset {name:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_kind_has_one_preset_of_its_devices() {
        for d in DEVICES {
            let named: Vec<_> = PRESETS.iter().filter(|p| p.device == d).collect();
            assert_eq!(named.len(), 1, "{}", d.name);
            assert_eq!(Preset::of(d).name, named[0].name);
            let c = Cluster::preset(named[0].name, 4).unwrap();
            assert_eq!(c.device(), d);
            assert_eq!(c.device_memory(), Some(d.memory));
            assert_eq!(c.replicas(), Replicas::Flat);
            assert!(c.levels().iter().all(|l| l.latency > 0.0), "{}", d.name);
            // Leaving a node is never faster than staying inside it, except on a TPU host, whose
            // chips reach the torus over more links than join them to each other.
            if d.name != "tpu-v5p" {
                assert!(c.inter_bandwidth() <= c.intra_bandwidth(), "{}", d.name);
            }
        }
    }

    #[test]
    fn the_paper_preset_has_the_papers_bandwidths_and_unknown_names_are_refused() {
        let c = Cluster::preset("dgx-v100", 4).unwrap();
        assert_eq!(
            (
                c.nodes(),
                c.devices_per_node(),
                c.intra_bandwidth(),
                c.inter_bandwidth()
            ),
            (4, 8, 60e9, 6e9)
        );
        assert_eq!(c.device(), Device::V100);
        let Err(Error::Topology(m)) = Cluster::preset("dgx-a200", 1) else {
            panic!("an unknown preset was found")
        };
        assert!(m.contains("or a .toml file"), "{m}");
    }
}
