//! Equal rows of a cost matrix: the reductions of the search merge the choices of an operator
//! whose rows (or columns) of a pair cost are equal (docs/search.md), so that what is left is
//! smaller.
//!
//! Entries are compared as numbers: `-0.0` equals `0.0`, and a row holding NaN equals no other
//! row (numpy's `==`, as the reductions' numpy code compared them before).

use rustc_hash::FxHashMap;

use crate::minplus::Matrix;

/// An entry's bits for hashing, `-0.0` as `0.0` (equal numbers, one pattern).
#[inline]
fn key(v: f64) -> u64 {
    (v + 0.0).to_bits()
}

/// One step of a row's hash (`FxHash`'s mix): equal rows, equal hashes.
#[inline]
fn mix(h: u64, v: f64) -> u64 {
    (h.rotate_left(5) ^ key(v)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// Per row of `m`, the index of the first row equal to it (itself if none before it is).
#[must_use]
pub fn first_equal(m: &Matrix<'_>) -> Vec<usize> {
    first_equal_by(m, &row_hashes(m))
}

/// Each row's hash, the entries read in the order they lie in memory (a transposed view too).
fn row_hashes(m: &Matrix<'_>) -> Vec<u64> {
    let mut hashes = vec![0u64; m.rows];
    if m.strides[1] <= m.strides[0] {
        for (r, h) in hashes.iter_mut().enumerate() {
            *h = (0..m.cols).fold(0, |h, c| mix(h, m.get(r, c)));
        }
    } else {
        for c in 0..m.cols {
            for (r, h) in hashes.iter_mut().enumerate() {
                *h = mix(*h, m.get(r, c));
            }
        }
    }
    hashes
}

/// [`first_equal`] given each row's hash: a row is compared with the first rows of its hash
/// only, so a collision costs a comparison, never a wrong answer.
#[allow(clippy::float_cmp)] // equal rows are equal numbers, exactly
fn first_equal_by(m: &Matrix<'_>, hashes: &[u64]) -> Vec<usize> {
    let equal = |a: usize, b: usize| (0..m.cols).all(|c| m.get(a, c) == m.get(b, c));
    let mut firsts: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    let mut out = Vec::with_capacity(m.rows);
    for (r, &h) in hashes.iter().enumerate() {
        let seen = firsts.entry(h).or_default();
        if let Some(&f) = seen.iter().find(|&&f| equal(f, r)) {
            out.push(f);
        } else {
            seen.push(r);
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::minplus::tests::costs;

    /// Every earlier row compared with every row, plainly.
    #[allow(clippy::float_cmp)]
    fn plain(m: &Matrix<'_>) -> Vec<usize> {
        (0..m.rows)
            .map(|r| {
                (0..r)
                    .find(|&f| (0..m.cols).all(|c| m.get(f, c) == m.get(r, c)))
                    .unwrap_or(r)
            })
            .collect()
    }

    #[test]
    fn matches_the_plain_comparison_in_both_layouts_and_on_collisions() {
        for (rows, cols, seed) in [(1, 1, 1), (40, 1, 2), (60, 3, 3), (7, 9, 4), (200, 2, 5)] {
            for odd in [false, true] {
                // Few distinct values: many equal rows, zeros of both signs, infinities, NaNs.
                let data = costs(rows * cols, seed, odd);
                for strides in [[cols, 1], [1, rows]] {
                    let m = Matrix {
                        data: &data,
                        rows,
                        cols,
                        strides,
                    };
                    let want = plain(&m);
                    assert_eq!(first_equal(&m), want, "{rows} {cols} {odd} {strides:?}");
                    // Every hash equal: the rows are told apart by comparing them.
                    assert_eq!(first_equal_by(&m, &vec![7; rows]), want);
                }
            }
        }
    }

    #[test]
    fn zeros_of_both_signs_are_equal_and_nan_rows_are_not() {
        let data = [0.0, -0.0, f64::NAN, f64::NAN, 1.0, 1.0];
        let m = Matrix {
            data: &data,
            rows: 6,
            cols: 1,
            strides: [1, 1],
        };
        assert_eq!(first_equal(&m), [0, 0, 2, 3, 4, 4]);
    }
}
