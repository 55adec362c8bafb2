//! The built-in clusters ([`PRESETS`]) and [`Cluster::preset`], which also opens cluster files.

use std::path::Path;

use super::cluster::{Cluster, Replicas};
use crate::error::{Error, Result};

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
        Self::filled(p.levels, nodes, p.device_memory, p.replicas)
            .map_err(|e| Error::Topology(format!("preset {name:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paper_preset_is_the_default_cluster() {
        assert_eq!(
            Cluster::preset("dgx-v100", 4).unwrap(),
            Cluster::new(4, 8, 60e9, 6e9, None).unwrap()
        );
        let Err(Error::Topology(m)) = Cluster::preset("dgx-a100", 1) else {
            panic!("an unknown preset was found")
        };
        assert!(m.contains("or a .toml file"), "{m}");
    }
}
