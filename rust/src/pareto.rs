//! The sum of two (cost, memory) Pareto tables, the kernel of the memory-limited search's
//! frontiers (`taps.solve.pareto`, docs/search.md#exact-reductions-before-scip).
//!
//! A table holds, per memory level (ascending), one cost per entry (`inf` where the entry has no
//! point at that level). Adding two tables adds every level of one to every level of the other
//! that fits under a cap, and keeps, per entry, only the points no point of less memory beats:
//! numpy's `argsort`, `unique`, `minimum.reduceat` and `minimum.accumulate` steps of the Python
//! code that came before, in one pass that holds one row at a time instead of every sum.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::{Error, Result};
use crate::minplus::np_minimum;

/// The frontier a sum leaves: its levels (ascending, distinct) and, row-major, one row of
/// `width` costs per level.
#[derive(Debug, Clone, PartialEq)]
pub struct Frontier {
    pub mems: Vec<f64>,
    pub costs: Vec<f64>,
}

/// One sum of levels, `ma[i] + mb[j]`, waiting in the merge (least memory first).
struct Sum {
    mem: f64,
    i: usize,
    j: usize,
}

impl PartialEq for Sum {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Sum {}

impl PartialOrd for Sum {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Sum {
    /// Reversed, so that the max-heap pops the least memory first (then the first row).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .mem
            .total_cmp(&self.mem)
            .then_with(|| other.i.cmp(&self.i))
            .then_with(|| other.j.cmp(&self.j))
    }
}

/// Checks that `levels` ascend (no NaN) and that `costs` hold `width` costs per level.
fn check(name: &str, costs: &[f64], levels: &[f64], width: usize) -> Result<()> {
    if levels.len().checked_mul(width) != Some(costs.len()) {
        return Err(Error::Shape(format!(
            "frontier table {name}: {} costs for {} levels of {width} entries",
            costs.len(),
            levels.len()
        )));
    }
    if levels.iter().any(|m| m.is_nan()) || levels.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::Shape(format!(
            "frontier table {name}: its memory levels must ascend"
        )));
    }
    Ok(())
}

/// The frontier of the sum of tables `a` (levels `ma`) and `b` (levels `mb`), both ascending, of
/// `width` entries per level: every pair of levels with `mb[j] <= cap - ma[i]`, their memories
/// and costs added; sums of equal memory merged by their least cost per entry; a cost kept only
/// where it is below the entry's cost at every lower level (`inf` elsewhere); levels left with no
/// finite cost dropped.
///
/// # Errors
/// [`Error::Shape`] if the lengths do not fit `width` or the levels do not ascend.
pub fn frontier_sum(
    a: &[f64],
    ma: &[f64],
    b: &[f64],
    mb: &[f64],
    width: usize,
    cap: f64,
) -> Result<Frontier> {
    check("a", a, ma, width)?;
    check("b", b, mb, width)?;
    // How many of b's levels fit with each of a's.
    let fits: Vec<usize> = ma
        .iter()
        .map(|&m| {
            let room = cap - m;
            mb.partition_point(|&x| x <= room)
        })
        .collect();
    let mut heap: BinaryHeap<Sum> = fits
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 0)
        .map(|(i, _)| Sum {
            mem: ma[i] + mb[0],
            i,
            j: 0,
        })
        .collect();
    let mut out = Frontier {
        mems: Vec::new(),
        costs: Vec::new(),
    };
    let mut row = vec![0.0; width];
    let mut below = vec![f64::INFINITY; width];
    let mut first = true;
    while let Some(sum) = heap.pop() {
        let mem = sum.mem;
        let mut next = Some(sum);
        let mut fresh = true;
        // Every sum of this memory, merged into one row.
        while let Some(Sum { i, j, .. }) = next {
            let (ra, rb) = (
                &a[i * width..(i + 1) * width],
                &b[j * width..(j + 1) * width],
            );
            if fresh {
                for ((r, x), y) in row.iter_mut().zip(ra).zip(rb) {
                    *r = x + y;
                }
                fresh = false;
            } else {
                for ((r, x), y) in row.iter_mut().zip(ra).zip(rb) {
                    *r = np_minimum(*r, x + y);
                }
            }
            if j + 1 < fits[i] {
                heap.push(Sum {
                    mem: ma[i] + mb[j + 1],
                    i,
                    j: j + 1,
                });
            }
            // Exactly equal memories are one level (numpy's `unique`).
            #[allow(clippy::float_cmp)]
            let same = heap.peek().is_some_and(|top| top.mem == mem);
            next = if same { heap.pop() } else { None };
        }
        // Kept where below every lower level's cost; the running least takes the raw costs.
        let mut alive = false;
        let start = out.costs.len();
        for (r, low) in row.iter().zip(below.iter_mut()) {
            let kept = if first || *r < *low {
                *r
            } else {
                f64::INFINITY
            };
            *low = np_minimum(*low, *r);
            alive |= kept.is_finite();
            out.costs.push(kept);
        }
        first = false;
        if alive {
            out.mems.push(mem);
        } else {
            out.costs.truncate(start);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, plainly: every fitting sum, then per distinct memory the least cost per
    /// entry, kept where below all lower levels' costs.
    #[allow(clippy::float_cmp)] // exactly equal memories are one level
    fn plain(a: &[f64], ma: &[f64], b: &[f64], mb: &[f64], width: usize, cap: f64) -> Frontier {
        let mut sums: Vec<(f64, Vec<f64>)> = Vec::new();
        for (i, &x) in ma.iter().enumerate() {
            for (j, &y) in mb.iter().enumerate() {
                if y <= cap - x {
                    let row = (0..width)
                        .map(|e| a[i * width + e] + b[j * width + e])
                        .collect();
                    sums.push((x + y, row));
                }
            }
        }
        sums.sort_by(|p, q| p.0.total_cmp(&q.0));
        let mut levels: Vec<(f64, Vec<f64>)> = Vec::new();
        for (m, row) in sums {
            match levels.last_mut() {
                Some((lm, lrow)) if *lm == m => {
                    for (l, r) in lrow.iter_mut().zip(row) {
                        *l = l.min(r);
                    }
                }
                _ => levels.push((m, row)),
            }
        }
        let mut out = Frontier {
            mems: Vec::new(),
            costs: Vec::new(),
        };
        for (k, (m, row)) in levels.iter().enumerate() {
            let kept: Vec<f64> = (0..width)
                .map(|e| {
                    let low = levels[..k]
                        .iter()
                        .map(|(_, r)| r[e])
                        .fold(f64::INFINITY, f64::min);
                    if k == 0 || row[e] < low {
                        row[e]
                    } else {
                        f64::INFINITY
                    }
                })
                .collect();
            if kept.iter().any(|c| c.is_finite()) {
                out.mems.push(*m);
                out.costs.extend(kept);
            }
        }
        out
    }

    fn table(width: usize) -> impl Strategy<Value = (Vec<f64>, Vec<f64>)> {
        (1usize..6).prop_flat_map(move |levels| {
            (
                proptest::collection::vec(
                    prop_oneof![3 => (0u8..8).prop_map(f64::from), 1 => Just(f64::INFINITY)],
                    levels * width,
                ),
                proptest::collection::vec((0u8..6).prop_map(f64::from), levels),
            )
                .prop_map(|(costs, mut mems)| {
                    mems.sort_by(f64::total_cmp);
                    (costs, mems)
                })
        })
    }

    proptest! {
        #[test]
        fn matches_the_definition(
            (width, (a, ma), (b, mb), cap) in (1usize..4).prop_flat_map(|w| {
                (Just(w), table(w), table(w), (0u8..14).prop_map(f64::from))
            })
        ) {
            let got = frontier_sum(&a, &ma, &b, &mb, width, cap).unwrap();
            let want = plain(&a, &ma, &b, &mb, width, cap);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn rejects_bad_shapes_and_unsorted_levels() {
        assert!(matches!(
            frontier_sum(&[1.0, 2.0], &[0.0], &[1.0], &[0.0], 2, 9.0),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            frontier_sum(&[1.0, 2.0], &[1.0, 0.0], &[1.0], &[0.0], 1, 9.0),
            Err(Error::Shape(_))
        ));
    }

    #[test]
    fn a_sum_dominated_by_less_memory_goes() {
        // Levels 0 and 1 of `a` plus level 0 of `b`: the second costs more, so only one point.
        let got = frontier_sum(&[1.0, 2.0], &[0.0, 1.0], &[0.0], &[0.0], 1, 9.0).unwrap();
        assert_eq!(got.mems, vec![0.0]);
        assert_eq!(got.costs, vec![1.0]);
    }
}
