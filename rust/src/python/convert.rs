//! Argument conversion shared by the bindings: numbers too large for a machine type ([`Num`]),
//! lists of sizes and dims, each rejected with the error of the binding's domain naming the
//! argument.

use std::fmt;

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;

use crate::error::Error;

/// A number argument as the bindings take it: its value, or, for a Python number too large for
/// `T` (an int of 2**63 or more for an `i64`), its text. PyO3 would raise `OverflowError` while
/// extracting it, before the binding could say which argument is wrong; this way the binding
/// raises the `TapsError` of its domain naming the argument and the value.
pub(super) enum Num<T> {
    Fits(T),
    TooLarge(String),
}

impl<'a, 'py, T: FromPyObject<'a, 'py>> FromPyObject<'a, 'py> for Num<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match T::extract(obj) {
            Ok(v) => Ok(Num::Fits(v)),
            Err(e) => {
                let e: PyErr = e.into();
                if e.is_instance_of::<PyOverflowError>(obj.py()) {
                    Ok(Num::TooLarge(too_large(&obj)))
                } else {
                    Err(e)
                }
            }
        }
    }
}

/// One level of `Cluster.hierarchy`, `(parts, bandwidth, latency)`: any sequence of three
/// numbers (a list, as a saved plan's JSON gives it, or a tuple, as `Cluster.levels` does).
/// PyO3's tuple extraction would refuse a list and give a plain `ValueError` for a tuple of
/// another length.
pub(super) struct Level(pub Num<i64>, pub Num<f64>, pub Num<f64>);

impl<'a, 'py> FromPyObject<'a, 'py> for Level {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let items: Vec<Bound<'py, PyAny>> = obj.extract()?;
        match items.as_slice() {
            [parts, bandwidth, latency] => Ok(Level(
                parts.extract()?,
                bandwidth.extract()?,
                latency.extract()?,
            )),
            _ => Err(Error::Topology(format!(
                "a level is three numbers (parts, bandwidth, latency), got {} value(s)",
                items.len()
            ))
            .into()),
        }
    }
}

/// The text of a number too large for a machine type: its digits, or for a huge int its size
/// (Python refuses to print ints of more than a few thousand digits).
fn too_large(obj: &Bound<'_, PyAny>) -> String {
    let bits = obj
        .call_method0("bit_length")
        .and_then(|b| b.extract::<u64>());
    match bits {
        Ok(bits) if bits > 128 => format!("an int of {bits} bits"),
        _ => obj
            .str()
            .map_or_else(|_| "a number".to_string(), |s| s.to_string()),
    }
}

impl<T: fmt::Display> fmt::Display for Num<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Fits(v) => v.fmt(f),
            Num::TooLarge(text) => f.write_str(text),
        }
    }
}

/// The error kind of a binding's domain: a variant of [`Error`].
pub(super) type Kind = fn(String) -> Error;

/// The range of a machine number, as an error message states it.
pub(super) trait Range {
    const RANGE: &'static str;
}

impl Range for i64 {
    const RANGE: &'static str = "from -2**63 to 2**63 - 1";
}

impl Range for f64 {
    const RANGE: &'static str = "of at most about 1.8e308";
}

impl<T: Copy + Range> Num<T> {
    /// The value of argument `what`.
    pub(super) fn get(&self, what: &str, kind: Kind) -> Result<T, Error> {
        match self {
            Num::Fits(v) => Ok(*v),
            Num::TooLarge(text) => Err(kind(format!(
                "{what} must be a number {}, got {text}",
                T::RANGE
            ))),
        }
    }
}

impl Num<i64> {
    /// The value of argument `what`, which must be `need` (a description of a non-negative value).
    pub(super) fn unsigned(&self, what: &str, need: &str, kind: Kind) -> Result<u64, Error> {
        let v = self.get(what, kind)?;
        u64::try_from(v).map_err(|_| kind(format!("{what} must be {need}, got {v}")))
    }
}

/// `[a, b, ...]` of numbers as Python prints a list.
pub(super) fn listed<T: fmt::Display>(values: &[Num<T>]) -> String {
    let items: Vec<String> = values.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// The values of list argument `what`.
pub(super) fn signed_list(values: &[Num<i64>], what: &str, kind: Kind) -> Result<Vec<i64>, Error> {
    values
        .iter()
        .map(|v| match v {
            Num::Fits(v) => Ok(*v),
            Num::TooLarge(text) => Err(kind(format!(
                "{what} {}: entry {text} is not a number {}",
                listed(values),
                i64::RANGE
            ))),
        })
        .collect()
}

/// The values of list argument `what`, each of which must be `need` (non-negative).
pub(super) fn unsigned_list(
    values: &[Num<i64>],
    what: &str,
    need: &str,
    kind: Kind,
) -> Result<Vec<u64>, Error> {
    signed_list(values, what, kind)?
        .into_iter()
        .map(|v| {
            u64::try_from(v).map_err(|_| {
                kind(format!(
                    "{what} {}: entry {v} is not {need}",
                    listed(values)
                ))
            })
        })
        .collect()
}

/// The device dim argument `device_dim`, if given.
pub(super) fn device_dim(k: Option<Num<i64>>, kind: Kind) -> Result<Option<usize>, Error> {
    k.map(|k| {
        let k = k.get("device_dim", kind)?;
        usize::try_from(k).map_err(|_| {
            kind(format!(
                "device_dim must be a device dim (0 innermost), got {k}"
            ))
        })
    })
    .transpose()
}
