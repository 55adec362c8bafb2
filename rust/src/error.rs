//! The one error type of the core, and the one wording of a name that is not among the names a
//! caller may give. The Python bindings map each variant onto one class of the `taps.TapsError`
//! hierarchy, so the variants follow what a caller can act on.

use std::fmt;

/// Everything the core can reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A malformed layout, or two layouts that cannot describe the same tensor.
    Layout(String),
    /// Two layouts for which no rewrite to a common device matrix and shape preserves both
    /// distributions.
    Unify(String),
    /// Bad input to strategy enumeration.
    Strategy(String),
    /// A bad cluster, or a collective that does not fit the layout or the cluster.
    Topology(String),
    /// Arrays whose sizes do not fit together, given to a numeric kernel.
    Shape(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Layout(m)
            | Error::Unify(m)
            | Error::Strategy(m)
            | Error::Topology(m)
            | Error::Shape(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

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
