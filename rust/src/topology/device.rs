//! The kinds of device a cluster is made of ([`DEVICES`]): the one home of their peak compute,
//! memory bandwidth and memory, each number with its source.

use crate::error::{parse_name, Error, Result};

/// One kind of accelerator, as its vendor's datasheet states it: the dense (no sparsity)
/// fp16/bf16 matrix-multiply peak in FLOP/s, the memory bandwidth in bytes per second and the
/// memory in bytes (the datasheet's GB, 10^9 bytes: what a plan may use, a little under what the
/// driver reports).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Device {
    pub name: &'static str,
    pub peak_flops: f64,
    pub memory_bandwidth: f64,
    pub memory: f64,
}

/// Every device kind, the one place that states their numbers.
pub const DEVICES: [Device; 6] = [
    // NVIDIA Tesla V100 SXM2 32 GB (V100 datasheet): 125 TFLOP/s fp16 tensor core, HBM2 at
    // 900 GB/s, 32 GB. The paper's cluster is made of these.
    Device {
        name: "v100",
        peak_flops: 125e12,
        memory_bandwidth: 900e9,
        memory: 32e9,
    },
    // NVIDIA A100 SXM 80 GB (A100 datasheet): 312 TFLOP/s bf16 dense, HBM2e at 2,039 GB/s, 80 GB.
    Device {
        name: "a100",
        peak_flops: 312e12,
        memory_bandwidth: 2039e9,
        memory: 80e9,
    },
    // NVIDIA H100 SXM 80 GB (H100 datasheet): 989 TFLOP/s bf16 dense (1,979 with sparsity),
    // HBM3 at 3.35 TB/s, 80 GB.
    Device {
        name: "h100",
        peak_flops: 989e12,
        memory_bandwidth: 3.35e12,
        memory: 80e9,
    },
    // NVIDIA H200 SXM 141 GB (H200 datasheet): the H100's compute, 989 TFLOP/s bf16 dense; HBM3e
    // at 4.8 TB/s, 141 GB.
    Device {
        name: "h200",
        peak_flops: 989e12,
        memory_bandwidth: 4.8e12,
        memory: 141e9,
    },
    // NVIDIA B200 as in DGX/HGX B200 (DGX B200 datasheet: 1,440 GB of GPU memory and 64 TB/s for
    // 8 GPUs, 72 PFLOP/s fp8 training with sparsity): 180 GB (the 192 GB chip as the systems
    // ship it), 8 TB/s, and 2.25 PFLOP/s bf16 dense (a quarter of the fp8 sparse figure).
    Device {
        name: "b200",
        peak_flops: 2.25e15,
        memory_bandwidth: 8e12,
        memory: 180e9,
    },
    // Google Cloud TPU v5p (Cloud TPU v5p documentation): 459 TFLOP/s bf16 per chip, HBM2e at
    // 2,765 GB/s, 95 GB.
    Device {
        name: "tpu-v5p",
        peak_flops: 459e12,
        memory_bandwidth: 2765e9,
        memory: 95e9,
    },
];

impl Device {
    /// The paper's device, the default kind of a cluster.
    pub const V100: Device = DEVICES[0];

    /// The names callers use (Python, the CLI, TOML files), in the order of [`DEVICES`].
    pub const NAMES: [&'static str; DEVICES.len()] = {
        let mut names = [""; DEVICES.len()];
        let mut i = 0;
        while i < DEVICES.len() {
            names[i] = DEVICES[i].name;
            i += 1;
        }
        names
    };

    /// The device kind named `name`, one of [`Device::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "device kind", &Self::NAMES, Error::Topology).map(|i| DEVICES[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_parses_back_and_others_are_one_line() {
        for d in DEVICES {
            assert_eq!(Device::parse(d.name), Ok(d));
        }
        let Err(Error::Topology(m)) = Device::parse("H100") else {
            panic!("a device name is case-sensitive")
        };
        assert_eq!(
            m,
            r#"unknown device kind "H100": expected "v100", "a100", "h100", "h200", "b200" or "tpu-v5p""#
        );
    }

    /// The table against the datasheets' headline ratios, so that a mistyped exponent shows: each
    /// generation of NVIDIA GPU computes faster than the one before, the H200 is an H100 with
    /// more and faster memory, and every kind's arithmetic intensity at its ridge point (FLOPs per
    /// byte of memory traffic) lies between 100 and 300, as for every accelerator of these years.
    #[test]
    fn the_numbers_keep_the_datasheets_relations() {
        let [v100, a100, h100, h200, b200, tpu] = DEVICES;
        assert!(v100.peak_flops < a100.peak_flops && a100.peak_flops < h100.peak_flops);
        assert!(h100.peak_flops < b200.peak_flops);
        assert_eq!(h200.peak_flops.to_bits(), h100.peak_flops.to_bits());
        assert!(h200.memory > h100.memory && h200.memory_bandwidth > h100.memory_bandwidth);
        for d in DEVICES {
            let ridge = d.peak_flops / d.memory_bandwidth;
            assert!((100.0..=300.0).contains(&ridge), "{}: {ridge}", d.name);
            assert!((16e9..=200e9).contains(&d.memory), "{}", d.name);
        }
        assert_eq!((tpu.name, Device::V100), ("tpu-v5p", v100));
    }
}
