//! Min-plus matrix products, the kernel of the series reductions of the search
//! (docs/search.md): eliminating an operator between two others takes, for every pair of their
//! choices, the least over its own choices of the two pair costs' sum.
//!
//! Each cost is a vector of objectives compared lexicographically, the first one up to a relative
//! tie tolerance. The results are numpy's to the bit (the reductions' own numpy code computed
//! them before): the same sums, the same minimum, the same choice among ties and NaNs.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Rows and columns of the tile of a one-objective product whose running minima stay in
/// registers while the inner index runs (8 SSE2 registers of two; the sums of one `k` are
/// independent, so they pipeline).
const MR: usize = 4;
const NR: usize = 4;
/// Inner choices of one pass over a tile: the columns' packed panel of a pass (8 KiB) stays in the
/// first-level cache while every row tile of a job goes past it.
const KC: usize = 256;
/// Row tiles of one parallel job at most (fewer if the rows would not keep every core busy).
const JOB_TILES: usize = 16;

/// A matrix of costs in a slice, laid out by any non-negative strides (a numpy array in C or
/// Fortran order, or a transposed view of one).
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub data: &'a [f64],
    pub rows: usize,
    pub cols: usize,
    /// Elements between consecutive rows, and between consecutive columns.
    pub strides: [usize; 2],
}

impl Matrix<'_> {
    /// Checks that every entry lies in `data`.
    pub(crate) fn check(&self, name: &str) -> Result<()> {
        let last = |n: usize, stride: usize| n.saturating_sub(1).checked_mul(stride);
        let end = last(self.rows, self.strides[0])
            .zip(last(self.cols, self.strides[1]))
            .and_then(|(a, b)| a.checked_add(b));
        match end {
            _ if self.rows == 0 || self.cols == 0 => Ok(()),
            Some(end) if end < self.data.len() => Ok(()),
            _ => Err(Error::Shape(format!(
                "{name} of {} x {} costs with strides {:?} does not fit in {} costs",
                self.rows,
                self.cols,
                self.strides,
                self.data.len()
            ))),
        }
    }

    #[inline]
    pub(crate) fn get(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.strides[0] + c * self.strides[1]]
    }

    /// Entry `(r, c)` plus `shift[c]` (the entry itself without a shift).
    #[inline]
    fn shifted(&self, r: usize, c: usize, shift: Option<&[f64]>) -> f64 {
        match shift {
            Some(s) => self.get(r, c) + s[c],
            None => self.get(r, c),
        }
    }

    /// Whether no sum of an entry of this matrix (plus `shift` of its column) and one of `other`
    /// can be NaN (neither holds NaN or -inf): then a plain comparison takes the least as numpy's
    /// `minimum` does.
    fn sums_are_numbers(&self, shift: Option<&[f64]>, other: &Matrix<'_>) -> bool {
        let numbers = |m: &Matrix<'_>, shift: Option<&[f64]>| {
            (0..m.rows).all(|r| (0..m.cols).all(|c| m.shifted(r, c, shift) > f64::NEG_INFINITY))
        };
        numbers(self, shift) && numbers(other, None)
    }

    /// Panels of `width` rows (`transposed`: columns) at a time, each stored by its other index
    /// then its `width` entries, padded with zeros past the last; `shift` (untransposed only) is
    /// added to each column's entries as they are packed.
    fn panels(&self, width: usize, transposed: bool, shift: Option<&[f64]>) -> Vec<f64> {
        let (outer, inner) = if transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        };
        let mut packed = vec![0.0; outer.div_ceil(width) * inner * width];
        packed
            .chunks_exact_mut(inner * width)
            .enumerate()
            .for_each(|(p, panel)| {
                for (k, entries) in panel.chunks_exact_mut(width).enumerate() {
                    for (i, e) in entries.iter_mut().enumerate() {
                        let o = p * width + i;
                        if o < outer {
                            *e = if transposed {
                                self.get(k, o)
                            } else {
                                self.shifted(o, k, shift)
                            };
                        }
                    }
                }
            });
        packed
    }
}

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
    if objectives == 1 {
        let x = Matrix {
            data: x,
            rows,
            cols: inner,
            strides: [inner, 1],
        };
        let y = Matrix {
            data: y,
            rows: inner,
            cols,
            strides: [cols, 1],
        };
        return min_plus_one(x, None, y);
    }
    let mut out = vec![0.0; rows * cols * objectives];
    if out.is_empty() {
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

/// numpy's `minimum(current, term)`, or (`NAN` false: neither can be NaN) the plain comparison
/// that is the same then and compiles to one instruction.
#[allow(clippy::inline_always)]
#[inline(always)]
fn least<const NAN: bool>(current: f64, term: f64) -> f64 {
    if NAN {
        np_minimum(current, term)
    } else if term < current {
        term
    } else {
        current
    }
}

/// The running minima of one tile over the inner choices of one pass: `xs` holds `MR` rows' entries
/// per `k`, `ys` `NR` columns' per `k`.
#[allow(clippy::inline_always)]
#[inline(always)]
fn tile<const NAN: bool>(xs: &[f64], ys: &[f64], acc: &mut [[f64; NR]; MR]) {
    let mut a = *acc;
    for (xk, yk) in xs.chunks_exact(MR).zip(ys.chunks_exact(NR)) {
        for (row, &xv) in a.iter_mut().zip(xk) {
            for (e, &yv) in row.iter_mut().zip(yk) {
                *e = least::<NAN>(*e, xv + yv);
            }
        }
    }
    *acc = a;
}

/// One parallel job of [`min_plus_one`]: its rows' packed panels, every column's, the sizes.
struct Job<'a> {
    xs: &'a [f64],
    ys: &'a [f64],
    inner: usize,
    cols: usize,
}

impl Job<'_> {
    /// The job's block of the product (whole rows of `cols`), with the fastest passes the
    /// processor has.
    fn run(&self, block: &mut [f64], nan: bool, avx2: bool) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: `avx2` is true only if the processor has AVX2 (`has_avx2`).
            unsafe {
                if nan {
                    self.passes_avx2::<true>(block);
                } else {
                    self.passes_avx2::<false>(block);
                }
            }
            return;
        }
        let _ = avx2;
        if nan {
            self.passes::<true>(block);
        } else {
            self.passes::<false>(block);
        }
    }

    /// [`Job::passes`] compiled for AVX2: the same additions and comparisons in the same order,
    /// four lanes at a time with non-destructive operands (about twice the speed of SSE2's).
    ///
    /// # Safety
    /// The processor must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn passes_avx2<const NAN: bool>(&self, block: &mut [f64]) {
        self.passes::<NAN>(block);
    }

    /// Every tile of the block, a pass of [`KC`] inner choices at a time: the running minima of
    /// each tile start from the block (infinity before the first pass) and go back to it.
    // Inlined into each caller, so that the AVX2 one compiles it (and `tile`) for AVX2.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn passes<const NAN: bool>(&self, block: &mut [f64]) {
        let (inner, cols) = (self.inner, self.cols);
        let height = block.len() / cols;
        for start in (0..inner).step_by(KC) {
            let stop = (start + KC).min(inner);
            for (p, panel) in self.ys.chunks_exact(inner * NR).enumerate() {
                let yk = &panel[start * NR..stop * NR];
                for (t, rows_panel) in self.xs.chunks_exact(inner * MR).enumerate() {
                    let xk = &rows_panel[start * MR..stop * MR];
                    let (r0, c0) = (t * MR, p * NR);
                    let (h, w) = ((height - r0).min(MR), (cols - c0).min(NR));
                    let mut acc = [[f64::INFINITY; NR]; MR];
                    for (i, row) in acc.iter_mut().enumerate().take(h) {
                        row[..w].copy_from_slice(&block[(r0 + i) * cols + c0..][..w]);
                    }
                    tile::<NAN>(xk, yk, &mut acc);
                    for (i, row) in acc.iter().enumerate().take(h) {
                        block[(r0 + i) * cols + c0..][..w].copy_from_slice(&row[..w]);
                    }
                }
            }
        }
    }
}

/// Whether the processor has AVX2 (checked once by the standard library, then cached).
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[a, b] = min_k x[a, k] + y[k, b]`, row-major, `k` in order for every entry: numpy's
/// `minimum` of the sums in turn, to the bit (NaN if any sum is). With `shift`, `x[a, k]` is
/// `x[a, k] + shift[k]` (numpy's `x + shift` to the bit, added as `x` is packed: no copy of `x`
/// is made for it). Tiles of `MR x NR` entries keep their minima in registers while `k` runs,
/// over packed panels of `x`'s rows and `y`'s columns; in parallel over blocks of rows.
///
/// # Errors
/// [`Error::Shape`] if `x`'s columns are not `y`'s rows or `shift`'s entries, there are none, or
/// a matrix does not fit in its slice.
pub fn min_plus_one(x: Matrix<'_>, shift: Option<&[f64]>, y: Matrix<'_>) -> Result<Vec<f64>> {
    product(x, shift, y, has_avx2())
}

/// [`min_plus_one`], with AVX2 if `avx2` (which the processor must then have).
fn product(x: Matrix<'_>, shift: Option<&[f64]>, y: Matrix<'_>, avx2: bool) -> Result<Vec<f64>> {
    x.check("the rows")?;
    y.check("the columns")?;
    let (rows, inner, cols) = (x.rows, x.cols, y.cols);
    if y.rows != inner || inner == 0 || shift.is_some_and(|s| s.len() != inner) {
        return Err(Error::Shape(format!(
            "min-plus product of {rows} x {inner} (shifted by {:?} costs) by {} x {cols} costs: \
             the inner sizes must match and be positive",
            shift.map(<[f64]>::len),
            y.rows
        )));
    }
    let size = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Shape(format!("min-plus product of {rows} x {cols} is too large")))?;
    let mut out = vec![f64::INFINITY; size];
    if size == 0 {
        return Ok(out);
    }
    let ys = y.panels(NR, true, None);
    // Enough jobs for every core, each of whole row tiles.
    let tiles = rows.div_ceil(MR);
    let per_job = tiles
        .div_ceil(4 * rayon::current_num_threads())
        .clamp(1, JOB_TILES);
    let nan = !x.sums_are_numbers(shift, &y);
    out.par_chunks_mut(per_job * MR * cols)
        .enumerate()
        .for_each(|(job, block)| {
            let xs = Matrix {
                data: &x.data[job * per_job * MR * x.strides[0]..],
                rows: block.len() / cols,
                ..x
            }
            .panels(MR, false, shift);
            let job = Job {
                xs: &xs,
                ys: &ys,
                inner,
                cols,
            };
            job.run(block, nan, avx2);
        });
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// numpy's loop, plainly: the first sum, then `minimum` with each next one (`x + shift`
    /// first, as numpy's broadcast sum).
    fn plain(x: &Matrix<'_>, shift: Option<&[f64]>, y: &Matrix<'_>) -> Vec<f64> {
        let mut out = Vec::new();
        for a in 0..x.rows {
            for b in 0..y.cols {
                let sum = |k: usize| x.shifted(a, k, shift) + y.get(k, b);
                out.push((1..x.cols).fold(sum(0), |m, k| np_minimum(m, sum(k))));
            }
        }
        out
    }

    /// Pseudo-random costs: small integers (many ties), with zeros of both signs and, if asked,
    /// infinities and NaNs.
    pub(crate) fn costs(n: usize, seed: u64, odd: bool) -> Vec<f64> {
        let mut state = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                match (state >> 33) % 40 {
                    0 => -0.0,
                    1 => f64::INFINITY,
                    2 if odd => f64::NAN,
                    3 if odd => f64::NEG_INFINITY,
                    r => (r % 7) as f64,
                }
            })
            .collect()
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|e| e.to_bits()).collect()
    }

    #[test]
    fn tiles_match_the_plain_loop_in_every_layout() {
        let mut seed = 0;
        for (rows, inner, cols) in [
            (1, 1, 1),
            (5, 3, 7),
            (9, 300, 6),
            (17, 513, 13),
            (64, 20, 3),
        ] {
            for odd in [false, true] {
                seed += 1;
                let xd = costs(rows * inner, seed, odd);
                let yd = costs(inner * cols, seed + 100, odd);
                // x row-major, y column-major (numpy's transposed views).
                let x = Matrix {
                    data: &xd,
                    rows,
                    cols: inner,
                    strides: [inner, 1],
                };
                let y = Matrix {
                    data: &yd,
                    rows: inner,
                    cols,
                    strides: [1, inner],
                };
                let got = min_plus_one(x, None, y).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&plain(&x, None, &y)),
                    "{rows} {inner} {cols} {odd}"
                );
                // Without AVX2 (the dispatch takes it where the processor has it).
                let sse2 = product(x, None, y, false).unwrap();
                assert_eq!(bits(&sse2), bits(&got), "{rows} {inner} {cols} {odd}");
                // A shift of x's columns, added as x is packed, in both instruction sets. (NaNs
                // as one: which sign a sum of two NaNs keeps is the compiler's choice, as an
                // addition's operands may be swapped.)
                let shift = costs(inner, seed + 200, odd);
                let numbers = |v: Vec<f64>| {
                    let v: Vec<f64> = v
                        .into_iter()
                        .map(|e| if e.is_nan() { f64::NAN } else { e })
                        .collect();
                    bits(&v)
                };
                let want = numbers(plain(&x, Some(&shift), &y));
                for avx2 in [false, has_avx2()] {
                    let shifted = product(x, Some(&shift), y, avx2).unwrap();
                    assert_eq!(numbers(shifted), want, "{rows} {inner} {cols} {odd} {avx2}");
                }
                // The contiguous entry point takes the same path.
                let yc: Vec<f64> = (0..inner * cols)
                    .map(|i| y.get(i / cols, i % cols))
                    .collect();
                let dims = Dims {
                    rows,
                    inner,
                    cols,
                    objectives: 1,
                };
                assert_eq!(bits(&min_plus(&xd, &yc, dims, 0.0).unwrap()), bits(&got));
            }
        }
    }

    #[test]
    fn a_nan_sum_wins_as_in_numpy() {
        // inf + -inf is NaN: the entry is NaN though other sums are numbers.
        let (xd, yd) = ([1.0, f64::INFINITY], [0.0, f64::NEG_INFINITY]);
        let x = Matrix {
            data: &xd,
            rows: 1,
            cols: 2,
            strides: [2, 1],
        };
        let y = Matrix {
            data: &yd,
            rows: 2,
            cols: 1,
            strides: [1, 1],
        };
        assert!(min_plus_one(x, None, y).unwrap()[0].is_nan());
        // So is one of a shifted entry: x's inf plus a shift of -inf.
        let y = Matrix {
            data: &[0.0, 0.0],
            ..y
        };
        let shift = [0.0, f64::NEG_INFINITY];
        assert!(min_plus_one(x, Some(&shift), y).unwrap()[0].is_nan());
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let d = [0.0; 6];
        let m = |rows, cols, strides| Matrix {
            data: &d,
            rows,
            cols,
            strides,
        };
        assert!(min_plus_one(m(2, 3, [3, 1]), None, m(2, 3, [3, 1])).is_err());
        assert!(min_plus_one(m(2, 0, [3, 1]), None, m(0, 3, [3, 1])).is_err());
        assert!(min_plus_one(m(3, 3, [3, 1]), None, m(3, 2, [2, 1])).is_err());
        assert_eq!(
            min_plus_one(m(0, 3, [3, 1]), None, m(3, 2, [2, 1])).unwrap(),
            []
        );
        // A shift of another length than the inner size.
        assert!(min_plus_one(m(2, 3, [3, 1]), Some(&[0.0; 2]), m(3, 2, [2, 1])).is_err());
    }
}
