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
/// registers while the inner index runs (the sums of one `k` are independent, so they pipeline):
/// 8 SSE2 registers of two lanes; 8 AVX2 registers of four, enough independent minima to cover
/// an addition's and a minimum's latency; 16 AVX-512 registers of eight.
const MR_SSE2: usize = 4;
const NR_SSE2: usize = 4;
const MR_AVX2: usize = 4;
const NR_AVX2: usize = 8;
const MR512: usize = 8;
const NR512: usize = 16;
/// Inner choices of one pass over a tile: the columns' packed panel of a pass (8 to 32 KiB) stays
/// in the first-level cache while every row tile of a job goes past it.
const KC: usize = 256;
/// Row tiles of one parallel job at most (with fewer rows than every core needs, the columns are
/// split between jobs too).
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

impl<'a> Matrix<'a> {
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

    /// Part `part` of `parts` of a row- or column-major matrix's lines, to be asked for ahead of
    /// their packing: a job's entries of a column-major `x` or a row-major `y` are short runs far
    /// apart, which the processor's own prefetcher does not follow.
    fn ahead(&self, part: usize, parts: usize) -> Lines<'a> {
        // Runs of adjacent entries: how many, how far apart, how long.
        let (runs, step, len) = match self.strides {
            [1, step] => (self.cols, step, self.rows),
            [step, 1] => (self.rows, step, self.cols),
            _ => (0, 0, 0),
        };
        let runs = if len == 0 {
            0..0
        } else {
            runs * part / parts..runs * (part + 1) / parts
        };
        Lines {
            data: self.data,
            step,
            len,
            run: runs.start,
            end: runs.end,
            at: 0,
        }
    }

    /// Panels of `W` rows (`transposed`: columns) at a time into `packed`, each stored by its
    /// other index then its `W` entries, padded with zeros past the last; `shift` (untransposed
    /// only) is added to each column's entries as they are packed. In parallel over groups of
    /// panels if `parallel`.
    fn pack<const W: usize>(
        &self,
        transposed: bool,
        shift: Option<&[f64]>,
        parallel: bool,
        packed: &mut [f64],
    ) {
        // The sizes and strides along the panels (`o`) and across them (`k`).
        let [rows, cols] = self.strides;
        let (outer, inner, so, sk) = if transposed {
            (self.cols, self.rows, cols, rows)
        } else {
            (self.rows, self.cols, rows, cols)
        };
        let panel = inner * W;
        let data = self.data;
        // Panels from `first * W` on, into `group`.
        let fill = |first: usize, group: &mut [f64]| {
            for (p, chunk) in group.chunks_exact_mut(panel).enumerate() {
                let o = (first + p) * W;
                if o + W > outer {
                    // The last panel, partial.
                    for (k, e) in chunk.chunks_exact_mut(W).enumerate() {
                        for (i, e) in e.iter_mut().enumerate() {
                            *e = if o + i < outer {
                                let v = data[(o + i) * so + k * sk];
                                shift.map_or(v, |s| v + s[k])
                            } else {
                                0.0
                            };
                        }
                    }
                } else if so == 1 {
                    // A panel's entries are adjacent (a row-major `y`, a column-major `x`).
                    for (k, e) in chunk.chunks_exact_mut(W).enumerate() {
                        let from = &data[o + k * sk..][..W];
                        match shift {
                            Some(s) => e.iter_mut().zip(from).for_each(|(e, &v)| *e = v + s[k]),
                            None => e.copy_from_slice(from),
                        }
                    }
                } else {
                    // `W` rows (a row-major `x`) read along `k` together.
                    for (k, e) in chunk.chunks_exact_mut(W).enumerate() {
                        let at = o * so + k * sk;
                        let v: [f64; W] = std::array::from_fn(|i| data[at + i * so]);
                        match shift {
                            Some(s) => e.iter_mut().zip(v).for_each(|(e, v)| *e = v + s[k]),
                            None => e.copy_from_slice(&v),
                        }
                    }
                }
            }
        };
        // Parallel jobs of 8 panels.
        let group = 8 * panel;
        if parallel {
            packed
                .par_chunks_mut(group)
                .enumerate()
                .for_each(|(g, chunk)| fill(g * 8, chunk));
        } else {
            fill(0, packed);
        }
    }
}

/// Lines of a matrix asked for one at a time, ahead of their use, by [`Lines::next`]: runs
/// `run..end` of `len` adjacent entries, `step` apart.
#[derive(Clone, Copy)]
struct Lines<'a> {
    data: &'a [f64],
    step: usize,
    len: usize,
    run: usize,
    end: usize,
    /// The next entry of the current run.
    at: usize,
}

impl Lines<'_> {
    const NONE: Lines<'static> = Lines {
        data: &[],
        step: 0,
        len: 0,
        run: 0,
        end: 0,
        at: 0,
    };

    /// Asks for the next line (to the second-level cache), if any is left: one a step of a
    /// tile's inner loop, so that they are fetched while the tile computes rather than all at
    /// once (which stalls on the processor's outstanding misses).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn next(&mut self) {
        if self.run < self.end {
            // Every line of a run: its entries 8 apart, and its last (the run need not start a
            // line).
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                let at = self.run * self.step + self.at.min(self.len - 1);
                // SAFETY: a prefetch reads nothing (the address is in `data` anyway).
                unsafe { _mm_prefetch::<_MM_HINT_T1>(self.data[at..].as_ptr().cast()) };
            }
            self.at += 8;
            if self.at >= self.len + 7 {
                (self.run, self.at) = (self.run + 1, 0);
            }
        }
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

/// The running minima of one `MR x NR` tile over the inner choices of one pass: `xs` holds `MR`
/// rows' entries per `k`, `ys` `NR` columns' per `k`; the minima are read from and written back
/// to `MR` rows of `out` of `NR` entries each, `ld` apart.
#[allow(clippy::inline_always)]
#[inline(always)]
fn tile<const NAN: bool, const MR: usize, const NR: usize>(
    xs: &[f64],
    ys: &[f64],
    out: &mut [f64],
    ld: usize,
    ahead: &mut [Lines<'_>; 2],
) {
    let mut a: [[f64; NR]; MR] =
        std::array::from_fn(|r| out[r * ld..][..NR].try_into().expect("NR entries"));
    for (xk, yk) in xs.chunks_exact(MR).zip(ys.chunks_exact(NR)) {
        ahead.iter_mut().for_each(Lines::next);
        for (row, &xv) in a.iter_mut().zip(xk) {
            for (e, &yv) in row.iter_mut().zip(yk) {
                *e = least::<NAN>(*e, xv + yv);
            }
        }
    }
    for (r, row) in a.iter().enumerate() {
        out[r * ld..][..NR].copy_from_slice(row);
    }
}

/// [`tile`] of `MR_AVX2 x NR_AVX2` compiled for AVX2: the same additions and comparisons in the
/// same order, four lanes at a time with non-destructive operands. A function of its own: inlined
/// into the closure [`Job::passes`] calls its tiles from, it would take that closure's instruction
/// set, the baseline (a closure's is its defining function's, and `passes` has none of its own),
/// and run on two lanes with its minima spilled to the stack.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn tile_avx2<const NAN: bool>(
    xs: &[f64],
    ys: &[f64],
    out: &mut [f64],
    ld: usize,
    ahead: &mut [Lines<'_>; 2],
) {
    tile::<NAN, MR_AVX2, NR_AVX2>(xs, ys, out, ld, ahead);
}

/// [`tile`] of `MR512 x NR512` in AVX-512's registers of eight lanes, written out: the compiler
/// does not keep the generic one's minima in registers for AVX-512. The same additions, and
/// `least`'s choices: MINPD takes its second operand (`current`) unless the first is less, so on
/// ties and on a NaN `current`; a NaN `term` is then taken over it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn tile_avx512<const NAN: bool>(
    xs: &[f64],
    ys: &[f64],
    out: &mut [f64],
    ld: usize,
    ahead: &mut [Lines<'_>; 2],
) {
    use std::arch::x86_64::{
        __m512d, _mm512_add_pd, _mm512_cmp_pd_mask, _mm512_loadu_pd, _mm512_mask_mov_pd,
        _mm512_min_pd, _mm512_set1_pd, _mm512_storeu_pd, _CMP_UNORD_Q,
    };
    const LANES: usize = 8;
    const V: usize = NR512 / LANES;
    // SAFETY (every load and store): each reads or writes `LANES` entries of a chunk of `NR512`.
    let load = |row: &[f64]| -> [__m512d; V] {
        std::array::from_fn(|v| unsafe { _mm512_loadu_pd(row[v * LANES..][..LANES].as_ptr()) })
    };
    let mut a: [[__m512d; V]; MR512] = std::array::from_fn(|r| load(&out[r * ld..][..NR512]));
    for (xk, yk) in xs.chunks_exact(MR512).zip(ys.chunks_exact(NR512)) {
        ahead.iter_mut().for_each(Lines::next);
        let y = load(yk);
        for (row, &xv) in a.iter_mut().zip(xk) {
            let xv = _mm512_set1_pd(xv);
            for (e, &yv) in row.iter_mut().zip(&y) {
                let term = _mm512_add_pd(xv, yv);
                let m = _mm512_min_pd(term, *e);
                *e = if NAN {
                    _mm512_mask_mov_pd(m, _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(term, term), term)
                } else {
                    m
                };
            }
        }
    }
    for (r, v) in a.iter().enumerate() {
        for (chunk, &e) in out[r * ld..][..NR512].chunks_exact_mut(LANES).zip(v) {
            unsafe { _mm512_storeu_pd(chunk.as_mut_ptr(), e) };
        }
    }
}

/// The instruction sets of the one-objective product: its tile and how it is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Sse2,
    Avx2,
    Avx512,
}

/// Whether no sum of these costs and others can be NaN (none is NaN or -inf): then a plain
/// comparison takes the least as numpy's `minimum` does.
// Not `all` nor `&&`: a fold without an early exit compiles to vector comparisons.
#[allow(clippy::needless_bitwise_bool)]
fn numbers(costs: &[f64]) -> bool {
    costs
        .iter()
        .fold(true, |all, &c| all & (c > f64::NEG_INFINITY))
}

/// One parallel job of [`min_plus_one`]: its rows of `x` (and the shift), its columns' packed
/// panels, whether these hold only [`numbers`].
struct Job<'a> {
    x: Matrix<'a>,
    shift: Option<&'a [f64]>,
    /// The job's columns of `y`.
    y: Matrix<'a>,
    /// Their panels packed for every job, and whether these hold only [`numbers`]; or `None`
    /// (no other job reads them): the job packs each panel a pass at a time as it goes.
    ys: Option<(&'a [f64], bool)>,
}

impl Job<'_> {
    /// The job's block of the product (whole rows of `cols`) by the portable tile of `MR x NR`.
    fn portable<const MR: usize, const NR: usize>(&self, block: &mut [f64]) {
        self.passes::<MR, NR>(block, tile::<false, MR, NR>, tile::<true, MR, NR>);
    }

    /// [`Job::portable`] by the tile compiled for AVX2 ([`tile_avx2`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn avx2(&self, block: &mut [f64]) {
        self.passes::<MR_AVX2, NR_AVX2>(
            block,
            |x, y, out, ld, ahead| tile_avx2::<false>(x, y, out, ld, ahead),
            |x, y, out, ld, ahead| tile_avx2::<true>(x, y, out, ld, ahead),
        );
    }

    /// [`Job::portable`] by the AVX-512 tile.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn avx512(&self, block: &mut [f64]) {
        self.passes::<MR512, NR512>(
            block,
            |x, y, out, ld, ahead| tile_avx512::<false>(x, y, out, ld, ahead),
            |x, y, out, ld, ahead| tile_avx512::<true>(x, y, out, ld, ahead),
        );
    }

    /// Every tile of the block by `tile`, a pass of [`KC`] inner choices at a time: the running
    /// minima of each tile start from the block (infinity before the first pass) and go back to
    /// it (in place for whole tiles). The rows' panels are packed a pass at a time, so that they
    /// stay in the second-level cache while every column panel goes past them; the columns'
    /// panels too if no other job reads them (a pass of one panel at a time, in the first-level
    /// cache, rather than all of `y` packed in memory first). The entries packed next are asked
    /// for while the tiles before them compute. A pass of a panel takes `nan_tile` (numpy's
    /// `minimum`) unless its rows' and columns' costs are [`numbers`].
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn passes<const MR: usize, const NR: usize>(
        &self,
        block: &mut [f64],
        tile: impl Fn(&[f64], &[f64], &mut [f64], usize, &mut [Lines<'_>; 2]),
        nan_tile: impl Fn(&[f64], &[f64], &mut [f64], usize, &mut [Lines<'_>; 2]),
    ) {
        let (x, y, inner, cols) = (self.x, self.y, self.x.cols, self.y.cols);
        let (height, panels) = (block.len() / cols, cols.div_ceil(NR));
        let mut xs = vec![0.0; height.div_ceil(MR) * KC.min(inner) * MR];
        let mut own = vec![0.0; self.ys.map_or(KC.min(inner) * NR, |_| 0)];
        for start in (0..inner).step_by(KC) {
            let stop = (start + KC).min(inner);
            let xs = &mut xs[..height.div_ceil(MR) * (stop - start) * MR];
            Matrix {
                data: &x.data[start * x.strides[1]..],
                cols: stop - start,
                ..x
            }
            .pack::<MR>(false, self.shift.map(|s| &s[start..stop]), false, xs);
            let xs_numbers = numbers(xs);
            // The next pass's entries of `x` (and the next panel of `y` the job packs) are asked
            // for a part per tile, spread over the pass (the panel).
            let next = Matrix {
                data: &x.data[stop.min(inner - 1) * x.strides[1]..],
                cols: (stop + KC).min(inner) - stop,
                ..x
            };
            let row_tiles = height.div_ceil(MR);
            for p in 0..panels {
                let y_at = |start: usize, p: usize| Matrix {
                    data: &y.data[start * y.strides[0] + p * NR * y.strides[1]..],
                    rows: (start + KC).min(inner) - start,
                    cols: NR.min(cols - p * NR),
                    ..y
                };
                let (yk, ys_numbers, y_next) = if let Some((ys, numbers)) = self.ys {
                    (&ys[p * inner * NR..][start * NR..stop * NR], numbers, None)
                } else {
                    let yk = &mut own[..(stop - start) * NR];
                    y_at(start, p).pack::<NR>(true, None, false, yk);
                    let next = if p + 1 < panels {
                        Some(y_at(start, p + 1))
                    } else {
                        (stop < inner).then(|| y_at(stop, 0))
                    };
                    (&*yk, numbers(yk), next)
                };
                let nan = !(xs_numbers && ys_numbers);
                for (t, xk) in xs.chunks_exact((stop - start) * MR).enumerate() {
                    let mut ahead = [
                        next.ahead(p * row_tiles + t, panels * row_tiles),
                        y_next.map_or(Lines::NONE, |y| y.ahead(t, row_tiles)),
                    ];
                    let (r0, c0) = (t * MR, p * NR);
                    let (h, w) = ((height - r0).min(MR), (cols - c0).min(NR));
                    let mut run = |out: &mut [f64], ld: usize| {
                        if nan {
                            nan_tile(xk, yk, out, ld, &mut ahead);
                        } else {
                            tile(xk, yk, out, ld, &mut ahead);
                        }
                    };
                    if (h, w) == (MR, NR) {
                        // A whole tile: its minima in place.
                        run(&mut block[r0 * cols + c0..], cols);
                        continue;
                    }
                    let mut acc = [[f64::INFINITY; NR]; MR];
                    for (i, row) in acc.iter_mut().enumerate().take(h) {
                        row[..w].copy_from_slice(&block[(r0 + i) * cols + c0..][..w]);
                    }
                    run(acc.as_flattened_mut(), NR);
                    for (i, row) in acc.iter().enumerate().take(h) {
                        block[(r0 + i) * cols + c0..][..w].copy_from_slice(&row[..w]);
                    }
                }
            }
        }
    }
}

/// The widest instruction set the processor has (checked once by the standard library, then
/// cached).
fn best_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Isa::Avx2;
        }
    }
    Isa::Sse2
}

/// `out[a, b] = min_k x[a, k] + y[k, b]`, row-major, `k` in order for every entry: numpy's
/// `minimum` of the sums in turn, to the bit (NaN if any sum is). With `shift`, `x[a, k]` is
/// `x[a, k] + shift[k]` (numpy's `x + shift` to the bit, added as `x` is packed: no copy of `x`
/// is made for it). Tiles of entries keep their minima in registers while `k` runs, over packed
/// panels of `x`'s rows and `y`'s columns; in parallel over blocks of rows.
///
/// # Errors
/// [`Error::Shape`] if `x`'s columns are not `y`'s rows or `shift`'s entries, there are none, or
/// a matrix does not fit in its slice.
pub fn min_plus_one(x: Matrix<'_>, shift: Option<&[f64]>, y: Matrix<'_>) -> Result<Vec<f64>> {
    product(x, shift, y, best_isa())
}

/// [`min_plus_one`] with `isa` (which the processor must have).
fn product(x: Matrix<'_>, shift: Option<&[f64]>, y: Matrix<'_>, isa: Isa) -> Result<Vec<f64>> {
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
    match isa {
        // SAFETY: `isa` is one the processor has.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => tiled::<MR512, NR512>(x, shift, y, &mut out, |job, block| unsafe {
            job.avx512(block);
        }),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => tiled::<MR_AVX2, NR_AVX2>(x, shift, y, &mut out, |job, block| unsafe {
            job.avx2(block);
        }),
        _ => tiled::<MR_SSE2, NR_SSE2>(x, shift, y, &mut out, |job, block| {
            job.portable::<MR_SSE2, NR_SSE2>(block);
        }),
    }
    Ok(out)
}

/// The product into `out` (every entry infinity) by tiles of `MR x NR`, each job's block by `run`.
fn tiled<const MR: usize, const NR: usize>(
    x: Matrix<'_>,
    shift: Option<&[f64]>,
    y: Matrix<'_>,
    out: &mut [f64],
    run: impl Fn(&Job<'_>, &mut [f64]) + Sync,
) {
    let (rows, inner, cols) = (x.rows, x.cols, y.cols);
    // Enough jobs for every core, each of whole row tiles; with few rows, of blocks of columns
    // too, so that the column panels are read from memory once for all rows of a block rather
    // than once per job.
    let jobs = 4 * rayon::current_num_threads();
    let (tiles, panels) = (rows.div_ceil(MR), cols.div_ceil(NR));
    let per_job = tiles.min(JOB_TILES);
    let blocks = tiles.div_ceil(per_job);
    let per_group = panels.div_ceil(jobs.div_ceil(blocks));
    // The columns' panels packed once if more than one block of rows reads them (else each
    // job packs its own a pass at a time), with whether they hold only numbers.
    let packed = (blocks > 1).then(|| {
        let mut ys = vec![0.0; panels * inner * NR];
        y.pack::<NR>(true, None, true, &mut ys);
        let ys_numbers = numbers(&ys);
        (ys, ys_numbers)
    });
    out.par_chunks_mut(per_job * MR * cols)
        .enumerate()
        .for_each(|(job, block)| {
            let height = block.len() / cols;
            // The job of the block's rows and `count` column panels from `first`.
            let job = |first: usize, count: usize| Job {
                x: Matrix {
                    data: &x.data[job * per_job * MR * x.strides[0]..],
                    rows: height,
                    ..x
                },
                shift,
                y: Matrix {
                    data: &y.data[first * NR * y.strides[1]..],
                    cols: ((first + count) * NR).min(cols) - first * NR,
                    ..y
                },
                ys: packed.as_ref().map(|(ys, ys_numbers)| {
                    (
                        &ys[first * inner * NR..(first + count) * inner * NR],
                        *ys_numbers,
                    )
                }),
            };
            if per_group == panels {
                run(&job(0, panels), block);
                return;
            }
            let parts: Vec<Vec<f64>> = (0..panels.div_ceil(per_group))
                .into_par_iter()
                .map(|g| {
                    let first = g * per_group;
                    let job = job(first, per_group.min(panels - first));
                    let mut part = vec![f64::INFINITY; height * job.y.cols];
                    run(&job, &mut part);
                    part
                })
                .collect();
            for (g, part) in parts.iter().enumerate() {
                let (c0, width) = (g * per_group * NR, part.len() / height);
                for (row, from) in block.chunks_exact_mut(cols).zip(part.chunks_exact(width)) {
                    row[c0..c0 + width].copy_from_slice(from);
                }
            }
        });
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
                let sum = |k: usize| match shift {
                    Some(s) => (x.get(a, k) + s[k]) + y.get(k, b),
                    None => x.get(a, k) + y.get(k, b),
                };
                out.push((1..x.cols).fold(sum(0), |m, k| np_minimum(m, sum(k))));
            }
        }
        out
    }

    /// Pseudo-random costs: small integers (many ties), with zeros of both signs and, if asked,
    /// infinities and NaNs.
    pub(crate) fn costs(n: usize, seed: u64, odd: bool) -> Vec<f64> {
        states(seed)
            .take(n)
            .map(|state| match (state >> 33) % 40 {
                0 => -0.0,
                1 => f64::INFINITY,
                2 if odd => f64::NAN,
                3 if odd => f64::NEG_INFINITY,
                r => (r % 7) as f64,
            })
            .collect()
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|e| e.to_bits()).collect()
    }

    /// Every instruction set of the product the processor has.
    fn isas() -> Vec<Isa> {
        let mut isas = vec![Isa::Sse2];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                isas.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
        }
        isas
    }

    /// NaNs as one: which sign a sum of two NaNs keeps is the compiler's choice, as an addition's
    /// operands may be swapped (a shift's NaN plus `y`'s).
    fn nans_as_one(v: &[f64]) -> Vec<u64> {
        v.iter()
            .map(|&e| if e.is_nan() { f64::NAN } else { e }.to_bits())
            .collect()
    }

    /// Pseudo-random fractions, no two alike: a sum of the wrong `x`, shift or `y` entry shows.
    fn fractions(n: usize, seed: u64) -> Vec<f64> {
        states(seed)
            .take(n)
            .map(|state| (state >> 11) as f64 / (1u64 << 53) as f64 * 100.0 - 50.0)
            .collect()
    }

    /// A linear congruential generator's states from `seed` (the tests' costs, reproducible).
    fn states(seed: u64) -> impl Iterator<Item = u64> {
        let mut state = seed.wrapping_mul(6_364_136_223_846_793_005) | 1;
        std::iter::repeat_with(move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state
        })
    }

    #[test]
    fn tiles_match_the_plain_loop_in_every_layout() {
        let mut seed = 0;
        // Sizes of partial tiles of every instruction set (4 x 4, 4 x 8, 8 x 16), one row or
        // column, inner sizes past a pass (`KC`), more rows than one job (the columns split
        // into several jobs when the rows are few; packed once for every job when not).
        for (rows, inner, cols) in [
            (1, 1, 1),
            (5, 3, 7),
            (1, 40, 50),
            (9, 300, 6),
            (8, 17, 16),
            (17, 513, 13),
            (64, 20, 3),
            (7, 31, 1),
            (33, 5, 70),
            (130, 260, 17),
            (200, 600, 40),
        ] {
            // Small integers (ties), with infinities and NaNs, and fractions.
            for kind in 0..3 {
                seed += 1;
                // Room for any layout below.
                let data = |rows: usize, cols: usize, seed: u64| match kind {
                    2 => fractions(2 * rows * cols + cols, seed),
                    _ => costs(2 * rows * cols + cols, seed, kind == 1),
                };
                let (xd, yd) = (data(rows, inner, seed), data(inner, cols, seed + 100));
                let shift = match kind {
                    2 => fractions(inner, seed + 200),
                    _ => costs(inner, seed + 200, kind == 1),
                };
                // Row- and column-major (numpy's arrays and their transposed views), and
                // neither (a view of every other entry).
                let layouts = |rows: usize, cols: usize| [[cols, 1], [1, rows], [2, 2 * rows + 1]];
                for (xs, ys) in layouts(rows, inner)
                    .into_iter()
                    .flat_map(|xs| layouts(inner, cols).map(|ys| (xs, ys)))
                {
                    let x = Matrix {
                        data: &xd,
                        rows,
                        cols: inner,
                        strides: xs,
                    };
                    let y = Matrix {
                        data: &yd,
                        rows: inner,
                        cols,
                        strides: ys,
                    };
                    let want = bits(&plain(&x, None, &y));
                    let want_shifted = nans_as_one(&plain(&x, Some(&shift), &y));
                    for isa in isas() {
                        let case = format!("{rows} {inner} {cols} {kind} {xs:?} {ys:?} {isa:?}");
                        assert_eq!(bits(&product(x, None, y, isa).unwrap()), want, "{case}");
                        let shifted = product(x, Some(&shift), y, isa).unwrap();
                        assert_eq!(nans_as_one(&shifted), want_shifted, "{case}");
                    }
                    assert_eq!(bits(&min_plus_one(x, None, y).unwrap()), want);
                }
                // The contiguous entry point takes the same path.
                let dims = Dims {
                    rows,
                    inner,
                    cols,
                    objectives: 1,
                };
                let (xd, yd) = (&xd[..rows * inner], &yd[..inner * cols]);
                let y = Matrix {
                    data: yd,
                    rows: inner,
                    cols,
                    strides: [cols, 1],
                };
                let x = Matrix {
                    strides: [inner, 1],
                    rows,
                    cols: inner,
                    data: xd,
                };
                assert_eq!(
                    bits(&min_plus(xd, yd, dims, 0.0).unwrap()),
                    bits(&plain(&x, None, &y))
                );
            }
        }
    }

    #[test]
    fn a_pass_with_a_nan_takes_numpy_minimum_and_the_others_do_not() {
        // Numbers but one NaN and one -inf of x in the second pass of the inner choices (each
        // pass decides its own comparison), and ties of both zeros' signs everywhere.
        let (rows, inner, cols) = (9, KC + 40, 20);
        let mut xd: Vec<f64> = (0..rows * inner).map(|i| [0.0, -0.0, 1.0][i % 3]).collect();
        xd[3 * inner + KC + 5] = f64::NAN;
        xd[5 * inner + KC + 7] = f64::NEG_INFINITY;
        let yd: Vec<f64> = (0..inner * cols)
            .map(|i| [-0.0, 0.0, f64::INFINITY, 2.0][i % 4])
            .collect();
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
            strides: [cols, 1],
        };
        let want = plain(&x, None, &y);
        assert!(want.iter().any(|e| e.is_nan()));
        for isa in isas() {
            assert_eq!(
                bits(&product(x, None, y, isa).unwrap()),
                bits(&want),
                "{isa:?}"
            );
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
        assert!(min_plus_one(m(0, 3, [3, 1]), None, m(3, 2, [2, 1]))
            .unwrap()
            .is_empty());
        // A shift of another length than the inner size.
        assert!(min_plus_one(m(2, 3, [3, 1]), Some(&[0.0; 2]), m(3, 2, [2, 1])).is_err());
    }
}
