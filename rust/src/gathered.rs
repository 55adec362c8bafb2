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
    let mut out = try_filled(rows * cols, 0.0, "the gathered sum")?;
    gathered_into(&mut out, rows, cols, terms, false)?;
    Ok((rows, cols, out))
}

/// [`gathered_sum`] written into `out` (a row-major `rows` x `cols` matrix) whatever it held,
/// or with `add` added to its entries: `out[i, j] = out[i, j] + terms[0](i, j) + ...`, in that
/// order. So the caller chooses the memory (the search's tables: pages of their own, or a
/// matrix of the memo, whole and in its own order, that nothing reads later).
///
/// # Errors
/// [`Error::Shape`] if `out` does not hold `rows` x `cols` entries, there is no term and no
/// `add`, or a term's shape is not `out`'s or a position lies outside its matrix.
pub fn gathered_into(
    out: &mut [f64],
    rows: usize,
    cols: usize,
    terms: &[Term<'_>],
    add: bool,
) -> Result<()> {
    if rows * cols != out.len() {
        return Err(Error::Shape(format!(
            "{} entries are no {rows} x {cols} matrix",
            out.len()
        )));
    }
    if terms.is_empty() && !add {
        return Err(Error::Shape("a gathered sum needs a term".into()));
    }
    for (k, term) in terms.iter().enumerate() {
        if term.shape() != (rows, cols) {
            return Err(Error::Shape(format!(
                "term {k} gathers {:?} entries, the sum {:?}",
                term.shape(),
                (rows, cols)
            )));
        }
        term.check(k)?;
    }
    summed(out, cols, terms, add);
    Ok(())
}

/// `terms` summed in order into `out` (row-major, `cols` columns), after `out`'s own entries
/// with `add`, else from the first term's; tile by tile on all cores.
fn summed(out: &mut [f64], cols: usize, terms: &[Term<'_>], add: bool) {
    if cols == 0 || terms.is_empty() {
        return;
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
                    let first = k == 0 && !add;
                    let mut put = |i: usize, j: usize, v: f64| {
                        let o = &mut block[i * cols + left + j];
                        *o = if first { v } else { *o + v };
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
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for terms in [vec![f], vec![b], vec![f, b], vec![b, f]] {
                let (r, c, got) = gathered_sum(&terms).unwrap();
                assert_eq!((r, c), (rows, cols));
                let want = plain(&terms);
                assert_eq!(bits(&got), bits(&want));
                // Added to a matrix in place: that matrix read in its own order, then the terms.
                let start = costs(rows * cols, 3, false);
                let (all_rows, all_cols): (Vec<usize>, Vec<usize>) =
                    ((0..rows).collect(), (0..cols).collect());
                let own = Term {
                    matrix: Matrix {
                        data: &start,
                        rows,
                        cols,
                        strides: [cols, 1],
                    },
                    rows: &all_rows,
                    cols: &all_cols,
                    transposed: false,
                };
                let mut got = start.clone();
                gathered_into(&mut got, rows, cols, &terms, true).unwrap();
                let want = plain(&[&[own][..], &terms].concat());
                assert_eq!(bits(&got), bits(&want));
                // Written over whatever the matrix held.
                let mut got = start.clone();
                gathered_into(&mut got, rows, cols, &terms, false).unwrap();
                assert_eq!(bits(&got), bits(&plain(&terms)));
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
        let mut two = [0.0; 2];
        assert!(gathered_into(&mut two, 1, 2, &[term(&[0, 1], &[0], false)], true).is_err());
        assert!(gathered_into(&mut two, 2, 2, &[], true).is_err());
        assert!(gathered_into(&mut two, 2, 1, &[], false).is_err());
        gathered_into(&mut two, 2, 1, &[], true).unwrap();
        assert_eq!(two.map(f64::to_bits), [0; 2]);
        let (r, c, out) = gathered_sum(&[term(&[1, 0], &[2], false)]).unwrap();
        assert_eq!((r, c), (2, 1));
        assert_eq!(out, vec![data[5], data[2]]);
    }
}
