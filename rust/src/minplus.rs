//! Min-plus matrix products, the kernel of the series reductions of the search
//! (docs/search.md): eliminating an operator between two others takes, for every pair of their
//! choices, the least over its own choices of the two pair costs' sum.
//!
//! Each cost is a vector of objectives compared lexicographically, the first one up to a relative
//! tie tolerance. The results are numpy's to the bit (the reductions' own numpy code computed
//! them before): the same sums, the same minimum, the same choice among ties and NaNs.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Elements of the running minimum of one job of a one-objective product (256 KiB: it stays in
/// the core's cache while every row of `y` streams past it).
const BLOCK: usize = 32_768;

/// The dimensions of a min-plus product `x (rows x inner x objectives)` by
/// `y (inner x cols x objectives)`, both row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub rows: usize,
    pub inner: usize,
    pub cols: usize,
    pub objectives: usize,
}

impl Dims {
    /// Checks the dimensions against the lengths of `x` and `y`.
    fn check(self, x: usize, y: usize) -> Result<()> {
        let Dims {
            rows,
            inner,
            cols,
            objectives,
        } = self;
        if inner == 0 || objectives == 0 {
            return Err(Error::Shape(format!(
                "min-plus product over {inner} inner choices of {objectives} objectives: both \
                 must be positive"
            )));
        }
        let size = |a: usize, b: usize| {
            a.checked_mul(b)
                .and_then(|n| n.checked_mul(objectives))
                .ok_or_else(|| Error::Shape(format!("min-plus product {self:?} is too large")))
        };
        let (want_x, want_y) = (size(rows, inner)?, size(inner, cols)?);
        size(rows, cols)?;
        if x == want_x && y == want_y {
            Ok(())
        } else {
            Err(Error::Shape(format!(
                "min-plus product {self:?} needs {want_x} and {want_y} costs, got {x} and {y}"
            )))
        }
    }
}

/// numpy's `minimum(current, term)`: the least, NaN if either is, `current` on a tie.
#[inline]
pub(crate) fn np_minimum(current: f64, term: f64) -> f64 {
    if term < current || term.is_nan() {
        term
    } else {
        current
    }
}

/// `out[a, b] = min_k x[a, k] + y[k, b]` (one objective per cost, the last axis), lexicographic
/// with more than one objective: the least first objective decides up to a relative `tie`
/// (`p <= least + tie * |least|`), then among those within it the least second objective, the
/// first `k` of equals; the chosen `k`'s sums of every objective are the entry. NaNs and
/// infinities are taken as numpy's `min`, `argmin` and `minimum` take them. In parallel over
/// blocks of rows.
///
/// # Errors
/// [`Error::Shape`] if `dims` do not match the lengths of `x` and `y`, or the inner size or the
/// number of objectives is 0.
pub fn min_plus(x: &[f64], y: &[f64], dims: Dims, tie: f64) -> Result<Vec<f64>> {
    dims.check(x.len(), y.len())?;
    let Dims {
        rows,
        inner,
        cols,
        objectives,
    } = dims;
    let mut out = vec![0.0; rows * cols * objectives];
    if out.is_empty() {
        return Ok(out);
    }
    if objectives == 1 {
        // Rows at a time, one `k` at a time: the block's running minimum stays in cache, and each
        // term is added and compared once, in the order of numpy's loop.
        let height = (BLOCK / cols).max(1);
        out.par_chunks_mut(height * cols)
            .enumerate()
            .for_each(|(job, block)| {
                let xs = &x[job * height * inner..];
                for (r, row) in block.chunks_exact_mut(cols).enumerate() {
                    let xv = xs[r * inner];
                    for (o, &yv) in row.iter_mut().zip(&y[..cols]) {
                        *o = xv + yv;
                    }
                }
                for (k, yk) in y.chunks_exact(cols).enumerate().skip(1) {
                    for (r, row) in block.chunks_exact_mut(cols).enumerate() {
                        let xv = xs[r * inner + k];
                        for (o, &yv) in row.iter_mut().zip(yk) {
                            *o = np_minimum(*o, xv + yv);
                        }
                    }
                }
            });
        return Ok(out);
    }
    out.par_chunks_mut(cols * objectives)
        .enumerate()
        .for_each(|(a, row)| {
            let xa = &x[a * inner * objectives..(a + 1) * inner * objectives];
            let sum = |k: usize, b: usize, i: usize| {
                xa[k * objectives + i] + y[(k * cols + b) * objectives + i]
            };
            for (b, entry) in row.chunks_exact_mut(objectives).enumerate() {
                // numpy's `min`: NaN if any first objective is.
                let least = (1..inner).fold(sum(0, b, 0), |m, k| np_minimum(m, sum(k, b, 0)));
                let bound = least + tie * least.abs();
                // numpy's `argmin` of the second objective where the first is within the bound,
                // inf elsewhere: the first NaN, else the first least.
                let second = |k: usize| {
                    if sum(k, b, 0) <= bound {
                        sum(k, b, 1)
                    } else {
                        f64::INFINITY
                    }
                };
                let mut best = (0, second(0));
                for k in 1..inner {
                    if best.1.is_nan() {
                        break;
                    }
                    let v = second(k);
                    if v < best.1 || v.is_nan() {
                        best = (k, v);
                    }
                }
                for (i, e) in entry.iter_mut().enumerate() {
                    *e = sum(best.0, b, i);
                }
            }
        });
    Ok(out)
}
