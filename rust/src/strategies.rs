//! Strategy enumeration (docs/conventions.md#strategies): every way to give an operator's
//! partitionable axes power-of-two degrees whose product is the device count, and the split axes
//! an order in the device matrix.

use crate::error::{Error, Result};
use crate::layout::{log2, Layout};

/// Degrees and device dims for the axes of one operator. Validated once by [`Strategy::new`] (or
/// built valid by [`enumerate_strategies`]); the fields are read through accessors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Strategy {
    degrees: Vec<u64>,
    device_map: Vec<i64>,
}

impl Strategy {
    /// A strategy given by hand: power-of-two degrees, and device dims `0..h` over the axes of
    /// degree above 1 (-1 for the others).
    ///
    /// # Errors
    /// [`Error::Strategy`] if the lengths differ, a degree is not a positive power of two, the
    /// degrees multiply to more devices than a u64 counts, or the device map is not a permutation
    /// of `0..h` over the split axes.
    pub fn new(degrees: Vec<u64>, device_map: Vec<i64>) -> Result<Self> {
        if degrees.len() != device_map.len() {
            return Err(Error::Strategy(format!(
                "degrees {degrees:?} and device map {device_map:?} differ in length"
            )));
        }
        if let Some(d) = degrees.iter().find(|d| !d.is_power_of_two()) {
            return Err(Error::Strategy(format!(
                "degrees {degrees:?}: {d} is not a positive power of two"
            )));
        }
        if degrees
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(Error::Strategy(format!(
                "degrees {degrees:?} multiply to more devices than 64 bits count"
            )));
        }
        let h = degrees.iter().filter(|&&d| d > 1).count() as i64;
        // Device dims exactly where the degree is above 1, distinct and below h: a permutation of
        // 0..h. Checked in place, as the node-cost kernel builds a strategy per row.
        let valid = degrees
            .iter()
            .zip(&device_map)
            .enumerate()
            .all(|(i, (&d, &m))| {
                if d > 1 {
                    (0..h).contains(&m) && !device_map[..i].contains(&m)
                } else {
                    m < 0
                }
            });
        if !valid {
            return Err(Error::Strategy(format!(
                "device map {device_map:?} must give the {h} axes of degree above 1 in {degrees:?} \
                 the device dims 0..{h} once each, and -1 to the others"
            )));
        }
        Ok(Strategy {
            degrees,
            device_map,
        })
    }

    /// Per axis, the number of blocks it is split into (a power of two).
    #[must_use]
    pub fn degrees(&self) -> &[u64] {
        &self.degrees
    }

    /// Per axis, the device dim it is split along (0 innermost), -1 where the degree is 1.
    #[must_use]
    pub fn device_map(&self) -> &[i64] {
        &self.device_map
    }

    /// The number of devices: the product of the degrees.
    #[must_use]
    pub fn num_devices(&self) -> u64 {
        self.degrees.iter().product()
    }

    /// One dim per split axis, sized by its degree, outermost first.
    #[must_use]
    pub fn device_matrix(&self) -> Vec<u64> {
        let mut matrix = Vec::new();
        self.device_matrix_into(&mut matrix);
        matrix
    }

    fn device_matrix_into(&self, matrix: &mut Vec<u64>) {
        let h = self.device_map.iter().filter(|&&m| m >= 0).count();
        matrix.resize(h, 1);
        for (&m, &d) in self.device_map.iter().zip(&self.degrees) {
            if let Ok(k) = usize::try_from(m) {
                matrix[h - 1 - k] = d;
            }
        }
    }

    /// The tensor map of a tensor whose dims are the axes `axes`, pushed onto `map`.
    fn tensor_map_into(&self, axes: &[i64], map: &mut Vec<i64>) -> Result<()> {
        for &a in axes {
            map.push(match a {
                -1 => -1,
                a if a >= 0 && (a as usize) < self.device_map.len() => self.device_map[a as usize],
                a => {
                    return Err(Error::Layout(format!(
                        "axis {a} is not one of the strategy's {} axes",
                        self.device_map.len()
                    )))
                }
            });
        }
        Ok(())
    }

    /// The layout of a tensor whose dims are the axes `axes` (indices; -1 for a dim of no
    /// partitionable axis, which stays whole) with the given shape.
    ///
    /// # Errors
    /// [`Error::Layout`] if an axis index is out of range or the shape does not fit.
    pub fn tensor_layout(&self, axes: &[i64], shape: Vec<u64>) -> Result<Layout> {
        let mut map = Vec::with_capacity(axes.len());
        self.tensor_map_into(axes, &mut map)?;
        Layout::new(shape, self.device_matrix(), map)
    }

    /// Empties `layout` onto this strategy's device matrix, for [`Strategy::tensor_layout_into`].
    ///
    /// # Errors
    /// [`Error::Layout`] if the matrix has too many devices for a u64.
    pub(crate) fn device_layout_into(&self, layout: &mut Layout) -> Result<()> {
        layout.refill(|_, matrix, _| {
            self.device_matrix_into(matrix);
            Ok(())
        })
    }

    /// [`Strategy::tensor_layout`] in the buffers of `layout`, which holds this strategy's device
    /// matrix: a kernel pricing many tensors allocates nothing per tensor.
    pub(crate) fn tensor_layout_into(
        &self,
        axes: &[i64],
        shape: &[u64],
        layout: &mut Layout,
    ) -> Result<()> {
        debug_assert_eq!(layout.device_matrix(), self.device_matrix());
        layout.refill_tensor(|s, map| {
            self.tensor_map_into(axes, map)?;
            s.extend_from_slice(shape);
            Ok(())
        })
    }
}

/// All permutations of `0..n`, lexicographically.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for first in 0..n {
        for rest in permutations(n - 1) {
            let mut p = vec![first];
            p.extend(rest.into_iter().map(|x| if x >= first { x + 1 } else { x }));
            out.push(p);
        }
    }
    out
}

/// Exponent tuples of length `p` summing to `n`, lexicographically ascending.
fn compositions(p: usize, n: u32, prefix: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) {
    if prefix.len() + 1 == p {
        prefix.push(n);
        out.push(prefix.clone());
        prefix.pop();
        return;
    }
    for e in 0..=n {
        prefix.push(e);
        compositions(p, n - e, prefix, out);
        prefix.pop();
    }
}

/// Every strategy of `axis_sizes` on `num_devices` devices whose degrees divide the sizes, in a
/// fixed order: degrees ascending lexicographically, then device maps descending (the order of the
/// paper's table "Auxiliary nodes").
///
/// # Errors
/// [`Error::Strategy`] if `num_devices` is not a positive power of two or a size is 0.
pub fn enumerate_strategies(axis_sizes: &[u64], num_devices: u64) -> Result<Vec<Strategy>> {
    if !num_devices.is_power_of_two() {
        return Err(Error::Strategy(format!(
            "the device count must be a power of two, got {num_devices}"
        )));
    }
    if let Some(i) = axis_sizes.iter().position(|&s| s == 0) {
        return Err(Error::Strategy(format!("axis {i} has size 0")));
    }
    let n = log2(num_devices);
    let p = axis_sizes.len();
    if p == 0 {
        return Ok(if n == 0 {
            vec![Strategy {
                degrees: vec![],
                device_map: vec![],
            }]
        } else {
            vec![]
        });
    }
    let mut exps = Vec::new();
    compositions(p, n, &mut Vec::new(), &mut exps);
    let mut out = Vec::new();
    for e in exps {
        let degrees: Vec<u64> = e.iter().map(|&x| 1u64 << x).collect();
        if degrees.iter().zip(axis_sizes).any(|(&d, &s)| s % d != 0) {
            continue;
        }
        let split: Vec<usize> = (0..p).filter(|&i| degrees[i] > 1).collect();
        let mut maps: Vec<Vec<i64>> = permutations(split.len())
            .into_iter()
            .map(|perm| {
                let mut map = vec![-1; p];
                for (&axis, &k) in split.iter().zip(&perm) {
                    map[axis] = k as i64;
                }
                map
            })
            .collect();
        maps.sort_unstable_by(|a, b| b.cmp(a));
        out.extend(maps.into_iter().map(|device_map| Strategy {
            degrees: degrees.clone(),
            device_map,
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binom(n: u64, k: u64) -> u64 {
        if k > n {
            return 0;
        }
        (0..k).fold(1, |acc, i| acc * (n - i) / (i + 1))
    }

    #[test]
    fn count_matches_the_closed_form() {
        for p in 1..=5u64 {
            for n in 0..=6u32 {
                let got = enumerate_strategies(&vec![1 << 12; p as usize], 1 << n)
                    .unwrap()
                    .len() as u64;
                let want = if n == 0 {
                    1
                } else {
                    (1..=p.min(u64::from(n)))
                        .map(|i| {
                            (1..=i).product::<u64>() * binom(p, i) * binom(u64::from(n) - 1, i - 1)
                        })
                        .sum()
                };
                assert_eq!(got, want, "p={p} n={n}");
            }
        }
    }

    #[test]
    fn matmul_on_four_devices_is_the_papers_table() {
        let s = enumerate_strategies(&[64, 64, 64], 4).unwrap();
        let rows: Vec<(Vec<u64>, Vec<i64>)> = s
            .iter()
            .map(|s| (s.degrees.clone(), s.device_map.clone()))
            .collect();
        let want: Vec<(Vec<u64>, Vec<i64>)> = vec![
            (vec![1, 1, 4], vec![-1, -1, 0]),
            (vec![1, 2, 2], vec![-1, 1, 0]),
            (vec![1, 2, 2], vec![-1, 0, 1]),
            (vec![1, 4, 1], vec![-1, 0, -1]),
            (vec![2, 1, 2], vec![1, -1, 0]),
            (vec![2, 1, 2], vec![0, -1, 1]),
            (vec![2, 2, 1], vec![1, 0, -1]),
            (vec![2, 2, 1], vec![0, 1, -1]),
            (vec![4, 1, 1], vec![0, -1, -1]),
        ];
        assert_eq!(rows, want);
        assert_eq!(s[1].device_matrix(), vec![2, 2]);
        let w = s[3].tensor_layout(&[1, 2], vec![64, 64]).unwrap();
        assert_eq!(w.shard_shape(), vec![16, 64]);
    }

    #[test]
    fn rejects_degrees_whose_product_overflows() {
        let err = Strategy::new(vec![1 << 39, 1 << 25], vec![1, 0]);
        assert!(matches!(err, Err(Error::Strategy(m)) if m.contains("64 bits")));
        let fits = Strategy::new(vec![1 << 39, 1 << 24], vec![1, 0]).unwrap();
        assert_eq!(fits.num_devices(), 1 << 63);
    }

    #[test]
    fn non_dividing_degrees_are_dropped_and_bad_counts_rejected() {
        assert!(enumerate_strategies(&[3, 64], 4)
            .unwrap()
            .iter()
            .all(|s| s.degrees()[0] == 1));
        assert!(matches!(
            enumerate_strategies(&[8], 6),
            Err(Error::Strategy(_))
        ));
    }
}
