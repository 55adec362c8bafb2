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
    /// Work whose memory could not be allocated (the machine's, or the process's address-space
    /// limit): refused before it starts instead of aborting the process.
    Memory(String),
    /// Work stopped because the time limit its caller gave ran out.
    TimeLimit(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Layout(m)
            | Error::Unify(m)
            | Error::Strategy(m)
            | Error::Topology(m)
            | Error::Shape(m)
            | Error::Memory(m)
            | Error::TimeLimit(m) => f.write_str(m),
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

/// A vector of `len` copies of `value`, or [`Error::Memory`] naming `what` when the allocator
/// cannot give it (Rust's own allocation aborts the process instead).
pub(crate) fn try_filled<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut out = Vec::new();
    reserve(&mut out, len, what)?;
    out.resize(len, value);
    Ok(out)
}

/// Room for `more` elements in `out`, or [`Error::Memory`] naming `what`.
pub(crate) fn reserve<T>(out: &mut Vec<T>, more: usize, what: &str) -> Result<()> {
    out.try_reserve_exact(more).map_err(|_| {
        let bytes = more.saturating_mul(std::mem::size_of::<T>()) as f64;
        Error::Memory(format!(
            "out of memory: {what} need {:.1} GiB, more than can be allocated",
            bytes / f64::from(1u32 << 30)
        ))
    })
}

/// `x` as a message shows it: plainly when that is short, in exponent form at the edges of `f64`
/// (Rust's plain form of 1e308 is 309 digits long).
pub(crate) fn shown_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e16).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::{shown_number, try_filled, Error};

    #[test]
    fn numbers_at_the_edges_are_short() {
        assert_eq!(shown_number(1e308), "1e308");
        assert_eq!(shown_number(5e-324), "5e-324");
        assert_eq!(shown_number(-2.5e20), "-2.5e20");
        assert_eq!(shown_number(0.5), "0.5");
        assert_eq!(shown_number(1e9), "1000000000");
        assert_eq!(shown_number(0.0), "0");
        assert_eq!(shown_number(f64::NAN), "NaN");
    }

    #[test]
    fn an_allocation_too_large_is_an_error_not_an_abort() {
        // More bytes than any address space holds: the allocator refuses it.
        let e = try_filled(usize::MAX / 16, 0u64, "the test's table").unwrap_err();
        assert!(matches!(&e, Error::Memory(m) if m.starts_with("out of memory: the test's table")));
        assert_eq!(try_filled(3, 7u8, "three").unwrap(), vec![7, 7, 7]);
    }
}
