//! Gathered sums: an edge's cost matrix in the search's tables is its forward redistributions'
//! costs plus its backward's (transposed), each read out of a larger matrix priced once for
//! many edges at the rows and columns of the edge's layouts. One pass over the result, tile by
//! tile, instead of a gather, a copy and a strided sum each over the whole matrix.

use rayon::prelude::*;

use crate::error::{try_filled, Error, Result};
use crate::minplus::Matrix;

/// Rows and columns of one tile of the result: its entries, and the rows of a transposed term
/// read for it, stay in the first- and second-level caches.
const TILE: usize = 64;

/// One addend of a [`gathered_sum`]: entry `(i, j)` of the result takes `matrix`'s entry
/// `(rows[i], cols[j])`, or with `transposed` its entry `(rows[j], cols[i])`.
#[derive(Debug, Clone, Copy)]
pub struct Term<'a> {
    pub matrix: Matrix<'a>,
    pub rows: &'a [usize],
    pub cols: &'a [usize],
    pub transposed: bool,
}

impl Term<'_> {
    /// The rows and columns of the result: the gathered rows by columns, swapped if transposed.
    fn shape(&self) -> (usize, usize) {
        if self.transposed {
            (self.cols.len(), self.rows.len())
        } else {
            (self.rows.len(), self.cols.len())
        }
    }

    /// Checks that every position lies in the matrix.
    fn check(&self, k: usize) -> Result<()> {
        self.matrix.check("a gathered term")?;
        let outside = |at: &[usize], n: usize| at.iter().find(|&&p| p >= n).copied();
        for (what, at, n) in [
            ("row", self.rows, self.matrix.rows),
            ("column", self.cols, self.matrix.cols),
        ] {
            if let Some(p) = outside(at, n) {
                return Err(Error::Shape(format!(
                    "term {k} reads {what} {p} of a matrix of {n}"
                )));
            }
        }
        Ok(())
    }
}

/// The matrix `out[i, j] = terms[0](i, j) + terms[1](i, j) + ...` (row-major), summed in the
/// terms' order from the first (not from 0: the sum of one term is its entries to the bit, a
/// negative zero too), on all cores.
///
/// # Errors
/// [`Error::Shape`] if there is no term, the terms' shapes differ or a position lies outside
/// its matrix; [`Error::Memory`] if the result cannot be allocated.
pub fn gathered_sum(terms: &[Term<'_>]) -> Result<(usize, usize, Vec<f64>)> {
    let Some(first) = terms.first() else {
        return Err(Error::Shape("a gathered sum needs a term".into()));
    };
    let (rows, cols) = first.shape();
    for (k, term) in terms.iter().enumerate() {
        if term.shape() != (rows, cols) {
            return Err(Error::Shape(format!(
                "term {k} gathers {:?} entries, term 0 {:?}",
                term.shape(),
                (rows, cols)
            )));
        }
        term.check(k)?;
    }
    let mut out = try_filled(rows * cols, 0.0, "the gathered sum")?;
    if cols == 0 {
        return Ok((rows, cols, out));
    }
    // Each term's offsets of its rows and columns in its slice, worked out once.
    let offsets: Vec<(Vec<usize>, Vec<usize>)> = terms
        .iter()
        .map(|t| {
            let at = |p: &[usize], s: usize| p.iter().map(|&x| x * s).collect();
            (
                at(t.rows, t.matrix.strides[0]),
                at(t.cols, t.matrix.strides[1]),
            )
        })
        .collect();
    out.par_chunks_mut(TILE * cols)
        .enumerate()
        .for_each(|(band, block)| {
            let top = band * TILE;
            let height = block.len() / cols;
            for left in (0..cols).step_by(TILE) {
                let width = TILE.min(cols - left);
                for (k, (term, (row_at, col_at))) in terms.iter().zip(&offsets).enumerate() {
                    let data = term.matrix.data;
                    let mut put = |i: usize, j: usize, v: f64| {
                        let o = &mut block[i * cols + left + j];
                        *o = if k == 0 { v } else { *o + v };
                    };
                    if term.transposed {
                        // Along the term's rows: entry (i, j) is its (rows[j], cols[i]).
                        for j in 0..width {
                            let base = row_at[left + j];
                            for i in 0..height {
                                put(i, j, data[base + col_at[top + i]]);
                            }
                        }
                    } else {
                        for i in 0..height {
                            let base = row_at[top + i];
                            for j in 0..width {
                                put(i, j, data[base + col_at[left + j]]);
                            }
                        }
                    }
                }
            }
        });
    Ok((rows, cols, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::minplus::tests::costs;

    /// The sum written plainly: each entry's terms in order.
    fn plain(terms: &[Term<'_>]) -> Vec<f64> {
        let (rows, cols) = terms[0].shape();
        let get = |t: &Term<'_>, i: usize, j: usize| {
            let (r, c) = if t.transposed {
                (t.rows[j], t.cols[i])
            } else {
                (t.rows[i], t.cols[j])
            };
            t.matrix.data[r * t.matrix.strides[0] + c * t.matrix.strides[1]]
        };
        let mut out = Vec::new();
        for i in 0..rows {
            for j in 0..cols {
                let first = get(&terms[0], i, j);
                out.push(terms[1..].iter().fold(first, |s, t| s + get(t, i, j)));
            }
        }
        out
    }

    fn positions(n: usize, of: usize, seed: u64) -> Vec<usize> {
        (0..n).map(|k| (k * 7 + seed as usize * 13) % of).collect()
    }

    #[test]
    fn tiles_equal_the_plain_sum() {
        // Shapes across tile edges; a forward term in C order, a backward one in Fortran order.
        for &(rows, cols) in &[(1, 1), (3, 130), (130, 3), (65, 129), (200, 64)] {
            let forward = costs(150 * 140, 1, false);
            let backward = costs(140 * 210, 2, false);
            let (f_rows, f_cols) = (positions(rows, 150, 3), positions(cols, 140, 4));
            let (b_rows, b_cols) = (positions(cols, 140, 5), positions(rows, 210, 6));
            let f = Term {
                matrix: Matrix {
                    data: &forward,
                    rows: 150,
                    cols: 140,
                    strides: [140, 1],
                },
                rows: &f_rows,
                cols: &f_cols,
                transposed: false,
            };
            let b = Term {
                matrix: Matrix {
                    data: &backward,
                    rows: 140,
                    cols: 210,
                    strides: [1, 140],
                },
                rows: &b_rows,
                cols: &b_cols,
                transposed: true,
            };
            for terms in [vec![f], vec![b], vec![f, b], vec![b, f]] {
                let (r, c, got) = gathered_sum(&terms).unwrap();
                assert_eq!((r, c), (rows, cols));
                let want = plain(&terms);
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want));
            }
        }
    }

    #[test]
    fn positions_outside_and_shapes_apart_are_errors() {
        let data = costs(6, 1, false);
        let matrix = Matrix {
            data: &data,
            rows: 2,
            cols: 3,
            strides: [3, 1],
        };
        let term = |rows: &'static [usize], cols: &'static [usize], transposed| Term {
            matrix,
            rows,
            cols,
            transposed,
        };
        assert!(gathered_sum(&[]).is_err());
        assert!(gathered_sum(&[term(&[2], &[0], false)]).is_err());
        assert!(gathered_sum(&[term(&[0], &[3], false)]).is_err());
        let apart = [term(&[0, 1], &[0], false), term(&[0, 1], &[0], true)];
        assert!(gathered_sum(&apart).is_err());
        let (r, c, out) = gathered_sum(&[term(&[1, 0], &[2], false)]).unwrap();
        assert_eq!((r, c), (2, 1));
        assert_eq!(out, vec![data[5], data[2]]);
    }
}
