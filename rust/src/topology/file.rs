//! Clusters from TOML files, for `Cluster.preset("file.toml", nodes)` (docs/core.md). A file lists
//! the levels of the cluster innermost first, as [`Cluster::hierarchy`] takes them:
//!
//! ```toml
//! device = "h100"           # the kind of device (DEVICES), default "v100"
//! device_memory = 80e9      # bytes per device, default the device's; inf: no limit
//! replicas = "flat"         # "flat" (NCCL, XLA, the default) or "shared" (the paper)
//!
//! [[levels]]                # the node
//! count = 8                 # devices per node
//! bandwidth = 450e9         # bytes per second between two devices of a node
//! latency = 5e-6            # seconds per collective step inside a node, default the device's
//!
//! [[levels]]                # the outermost level: its count comes from `nodes`
//! bandwidth = 400e9
//! latency = 1e-5
//! ```
//!
//! Levels between the first and the last (pods, racks) give `count`, their parts of the level
//! below; `nodes` must fill whole units of them ([`Cluster::filled`]). A level without a latency
//! takes its device kind's preset's ([`Preset::of`]): the node's for the first level, the
//! network's for the others, as `Cluster(nodes, devices_per_node)` does (latency is on by
//! default; `latency = 0` turns it off).

use std::path::Path;

use toml::{Table, Value};

use super::cluster::{memory_limit, Cluster, Replicas};
use super::device::Device;
use super::presets::Preset;
use crate::error::{Error, Result};

impl Cluster {
    /// The cluster of the TOML file `path` with `nodes` nodes.
    ///
    /// # Errors
    /// [`Error::Topology`], naming the file, if it cannot be read, is not UTF-8 text or not TOML,
    /// does not describe a cluster, or describes one that [`Cluster::filled`] rejects.
    pub fn from_file(path: &Path, nodes: u64) -> Result<Self> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| {
            Error::Topology(format!(
                "cannot read cluster file {name:?}: {}",
                os_reason(&e)
            ))
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            Error::Topology(format!(
                "cluster file {name:?} is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        from_toml(&text, &name, nodes)
    }
}

/// Why an OS call failed, as the OS words it (without Rust's "(os error N)").
fn os_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match e.raw_os_error() {
        Some(code) => text
            .trim_end_matches(&format!(" (os error {code})"))
            .to_string(),
        None => text,
    }
}

/// The latency of level `j` of a cluster of `device` whose file gives none: its preset's node
/// latency for the first level, its network latency for the levels above.
fn default_latency(device: Device, j: usize) -> f64 {
    let levels = Preset::of(device).levels;
    if j == 0 {
        levels[0].2
    } else {
        levels[levels.len() - 1].2
    }
}

/// The cluster the TOML `text` of the file `name` describes, with `nodes` nodes. Checked in the
/// order of the file: the levels, each level's count, bandwidth and latency, the device, the
/// memory, the replica model, then the cluster.
fn from_toml(text: &str, name: &str, nodes: u64) -> Result<Cluster> {
    let data: Table = text.parse().map_err(|e| {
        Error::Topology(format!(
            "cluster file {name:?} is not valid TOML: {}",
            one_line(&e, text)
        ))
    })?;
    let bad = |what: String| Error::Topology(format!("{name}: {what}"));
    unknown_key(&data, &["levels", "device", "device_memory", "replicas"]).map_err(bad)?;
    let levels = match data.get("levels") {
        Some(Value::Array(levels)) if !levels.is_empty() => levels
            .iter()
            .map(Value::as_table)
            .collect::<Option<Vec<_>>>(),
        _ => None,
    }
    .ok_or_else(|| bad("expected one [[levels]] table per level, innermost first".into()))?;
    let last = levels.len() - 1;
    let parts = levels
        .iter()
        .enumerate()
        .map(|(j, table)| {
            let at = |what: String| bad(format!("level {j}: {what}"));
            unknown_key(table, &["count", "bandwidth", "latency"]).map_err(at)?;
            // The outermost level's count comes from `nodes` (`Cluster::filled` fills it).
            let count = if j < last || j == 0 {
                match table.get("count") {
                    Some(&Value::Integer(count)) => count,
                    other => {
                        return Err(at(format!(
                            "count must be a whole number, got {}",
                            shown(other)
                        )))
                    }
                }
            } else {
                1
            };
            Ok((
                count,
                number(table, "bandwidth", None).map_err(at)?,
                table
                    .get("latency")
                    .map(|_| number(table, "latency", None).map_err(at))
                    .transpose()?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let device = match data.get("device") {
        None => Ok(Device::V100),
        Some(Value::String(d)) => Device::parse(d).map_err(|e| bad(e.to_string())),
        Some(other) => Err(bad(format!(
            "device must be the name of a device kind, got {other}"
        ))),
    }?;
    let memory = data
        .get("device_memory")
        .map(|_| number(&data, "device_memory", None).map_err(bad))
        .transpose()?;
    let replicas = match data.get("replicas") {
        None => Some(Replicas::Flat),
        Some(Value::String(r)) => Replicas::parse(r).ok(),
        Some(_) => None,
    }
    .ok_or_else(|| {
        let names: Vec<String> = Replicas::NAMES.iter().map(|r| format!("{r:?}")).collect();
        bad(format!(
            "replicas must be {}, got {}",
            names.join(" or "),
            shown(data.get("replicas"))
        ))
    })?;
    let parts = parts
        .into_iter()
        .enumerate()
        .map(|(j, (count, bandwidth, latency))| {
            let latency = latency.unwrap_or_else(|| default_latency(device, j));
            let count = u64::try_from(count).map_err(|_| {
                bad(format!(
                    "the parts of level {j} must be a positive count, got {count}"
                ))
            })?;
            Ok((count, bandwidth, latency))
        })
        .collect::<Result<Vec<_>>>()?;
    Cluster::filled(&parts, nodes, memory_limit(device, memory), replicas)
        .map(|c| c.with_device(device))
        .map_err(|e| bad(e.to_string()))
}

/// A key of `table` not among `known` (a misspelt one would be ignored, its default taken), as
/// what is wrong with it.
fn unknown_key(table: &Table, known: &[&str]) -> std::result::Result<(), String> {
    match table.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(format!(
            "unknown key {key:?}: expected {}",
            known
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The number `key` of `table` (`default` if it has none), or what is wrong with it.
fn number(table: &Table, key: &str, default: Option<f64>) -> std::result::Result<f64, String> {
    match (table.get(key), default) {
        (Some(&Value::Float(v)), _) | (None, Some(v)) => Ok(v),
        (Some(&Value::Integer(v)), _) => Ok(v as f64),
        (other, _) => Err(format!("{key} must be a number, got {}", shown(other))),
    }
}

/// A value of the file as TOML writes it, or "nothing" for a missing one.
fn shown(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".into(), ToString::to_string)
}

/// A TOML error on one line: the parser's message, then where it is in `text`.
fn one_line(e: &toml::de::Error, text: &str) -> String {
    let message: Vec<&str> = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let message = message.join("; ");
    let Some(before) = e.span().and_then(|span| text.get(..span.start)) else {
        return message;
    };
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!("{message} (at line {line}, column {column})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pods of 4 nodes of 8 H100s, on shared replicas, with more memory than an H100's.
    const PODS: &str = r#"
replicas = "shared"
device = "h100"
device_memory = 96e9

[[levels]]
count = 8
bandwidth = 900e9
latency = 2e-6

[[levels]]
count = 4
bandwidth = 50e9

[[levels]]
latency = 1e-5
bandwidth = 25e9
"#;

    /// The message of the error `text` gives, as the file `f.toml` with `nodes` nodes.
    fn error(text: &str, nodes: u64) -> String {
        match from_toml(text, "f.toml", nodes) {
            Err(Error::Topology(m)) => m,
            other => panic!("{text:?}: {other:?}"),
        }
    }

    /// A file of its own in the temporary directory, holding `bytes`.
    fn file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("taps-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_file_gives_the_levels_with_the_outermost_filled_by_the_nodes() {
        let want = Cluster::hierarchy(
            &[(8, 900e9, 2e-6), (4, 50e9, 5e-6), (2, 25e9, 1e-5)],
            Some(96e9),
            Replicas::Shared,
        )
        .map(|c| c.with_device(Device::parse("h100").unwrap()));
        assert_eq!(from_toml(PODS, "f.toml", 8), want);
        let path = file("pods.toml", PODS.as_bytes());
        assert_eq!(Cluster::preset(path.to_str().unwrap(), 8), want);
        std::fs::remove_file(path).unwrap();
        // One level is one node: its count is the devices per node; integers are numbers. By
        // default: V100s holding their memory, flat replicas, the V100 preset's latencies.
        let one = "[[levels]]\ncount = 8\nbandwidth = 450000000000\n";
        assert_eq!(
            from_toml(one, "f.toml", 1),
            Cluster::hierarchy(&[(8, 450e9, 2e-6)], Some(32e9), Replicas::Flat)
        );
        let two = format!("device = \"h100\"\n{one}[[levels]]\nbandwidth = 4e11\n");
        assert_eq!(
            from_toml(&two, "f.toml", 2),
            Cluster::hierarchy(
                &[(8, 450e9, 2e-6), (2, 4e11, 5e-6)],
                Some(80e9),
                Replicas::Flat
            )
            .map(|c| c.with_device(Device::parse("h100").unwrap()))
        );
        let off = "[[levels]]\ncount = 8\nbandwidth = 450000000000\nlatency = 0\n";
        assert_eq!(
            from_toml(off, "f.toml", 1),
            Cluster::hierarchy(&[(8, 450e9, 0.0)], Some(32e9), Replicas::Flat)
        );
        // `inf` memory is no limit.
        let unlimited = from_toml(&format!("device_memory = inf\n{one}"), "f.toml", 1).unwrap();
        assert_eq!(unlimited.device_memory(), None);
    }

    #[test]
    fn each_mistake_is_one_line_naming_the_file() {
        let level = "[[levels]]\ncount = 8\nbandwidth = 1e9\n";
        let cases = [
            ("levels = 3", "f.toml: expected one [[levels]] table per level, innermost first"),
            ("levels = []", "f.toml: expected one [[levels]] table per level, innermost first"),
            ("levels = [1]", "f.toml: expected one [[levels]] table per level, innermost first"),
            ("x = 1", r#"f.toml: unknown key "x": expected "levels", "device", "device_memory", "replicas""#),
            ("levels = 3\ndevice_memroy = 1", r#"f.toml: unknown key "device_memroy": expected "levels", "device", "device_memory", "replicas""#),
            ("[[levels]]\ncount = 8\nbandwidth = 1e9\nlatncy = 1e-6", r#"f.toml: level 0: unknown key "latncy": expected "count", "bandwidth", "latency""#),
            ("[[levels]]\nbandwidth = 1e9", "f.toml: level 0: count must be a whole number, got nothing"),
            ("[[levels]]\ncount = 8.0\nbandwidth = 1e9", "f.toml: level 0: count must be a whole number, got 8.0"),
            ("[[levels]]\ncount = true\nbandwidth = 1e9", "f.toml: level 0: count must be a whole number, got true"),
            ("[[levels]]\ncount = 8\nbandwidth = 'fast'", r#"f.toml: level 0: bandwidth must be a number, got "fast""#),
            ("[[levels]]\ncount = 8", "f.toml: level 0: bandwidth must be a number, got nothing"),
            ("[[levels]]\ncount = 8\nbandwidth = 1e9\nlatency = false", "f.toml: level 0: latency must be a number, got false"),
            ("[[levels]]\ncount = -8\nbandwidth = 1e9", "f.toml: the parts of level 0 must be a positive count, got -8"),
            ("[[levels]]\ncount = 6\nbandwidth = 1e9", "f.toml: levels of [6] parts (devices per node first): the device count must be a power of two"),
        ];
        for (text, message) in cases {
            assert_eq!(error(text, 1), message, "{text:?}");
        }
        let memory = format!("device_memory = 'lots'\n{level}");
        assert_eq!(
            error(&memory, 1),
            r#"f.toml: device_memory must be a number, got "lots""#
        );
        assert_eq!(
            error(&format!("device = 'k80'\n{level}"), 1),
            r#"f.toml: unknown device kind "k80": expected "v100", "a100", "h100", "h200", "b200" or "tpu-v5p""#
        );
        assert_eq!(
            error(&format!("device = 100\n{level}"), 1),
            "f.toml: device must be the name of a device kind, got 100"
        );
        for (replicas, got) in [("'copies'", r#""copies""#), ("1", "1")] {
            assert_eq!(
                error(&format!("replicas = {replicas}\n{level}"), 1),
                format!(r#"f.toml: replicas must be "shared" or "flat", got {got}"#)
            );
        }
        assert_eq!(
            error(PODS, 6),
            "f.toml: 6 nodes do not fill units of 4 nodes"
        );
        assert_eq!(
            error(level, 2),
            "f.toml: a cluster of one level is one node, not 2"
        );
        let m = error("[[levels]\n", 1);
        assert!(
            m.starts_with(r#"cluster file "f.toml" is not valid TOML: "#) && m.ends_with(')'),
            "{m}"
        );
        assert!(!m.contains('\n') && m.contains("at line 1, column "), "{m}");
    }

    #[test]
    fn a_missing_or_binary_file_is_one_line_naming_it() {
        let missing = std::env::temp_dir().join("taps-no-such-cluster.toml");
        let Err(Error::Topology(m)) = Cluster::from_file(&missing, 1) else {
            panic!("a missing file was read")
        };
        let name = missing.display();
        assert_eq!(
            m,
            format!("cannot read cluster file \"{name}\": No such file or directory")
        );
        let binary = file("binary.toml", b"replicas = \"flat\"\n\xff\xfe");
        let Err(Error::Topology(m)) = Cluster::from_file(&binary, 1) else {
            panic!("a binary file was read")
        };
        std::fs::remove_file(&binary).unwrap();
        let name = binary.display();
        assert_eq!(
            m,
            format!("cluster file \"{name}\" is not UTF-8 text (invalid byte at offset 18)")
        );
    }
}
