//! Strategy enumeration (docs/conventions.md#strategies): every way to give an operator's
//! partitionable axes power-of-two degrees whose product is the device count, and the split axes
//! an order in the device matrix; optionally also every way to split over fewer devices, the
//! remaining factor replicating the operator along one more device dim.

use crate::error::{reserve, Error, Result};
use crate::layout::{log2, Layout};

/// Degrees and device dims for the axes of one operator, on a device matrix whose dims no axis
/// uses hold replicas of the operator. Validated once by [`Strategy::new`] or
/// [`Strategy::with_device_matrix`] (or built valid by [`enumerate_strategies`]); the fields are
/// read through accessors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Strategy {
    degrees: Vec<u64>,
    device_map: Vec<i64>,
    device_matrix: Vec<u64>,
}

impl Strategy {
    /// A strategy given by hand: power-of-two degrees, and device dims `0..h` over the axes of
    /// degree above 1 (-1 for the others); the device matrix has one dim per split axis.
    ///
    /// # Errors
    /// [`Error::Strategy`] if the lengths differ, a degree is not a positive power of two, the
    /// degrees multiply to more devices than a u64 counts, or the device map is not a permutation
    /// of `0..h` over the split axes.
    pub fn new(degrees: Vec<u64>, device_map: Vec<i64>) -> Result<Self> {
        check_degrees(&degrees, &device_map)?;
        let h = degrees.iter().filter(|&&d| d > 1).count();
        let mut device_matrix = vec![1; h];
        for (&m, &d) in device_map.iter().zip(&degrees) {
            match usize::try_from(m) {
                Ok(k) if d > 1 && k < h && device_matrix[h - 1 - k] == 1 => {
                    device_matrix[h - 1 - k] = d;
                }
                Err(_) if d == 1 => {}
                _ => {
                    return Err(Error::Strategy(format!(
                        "device map {device_map:?} must give the {h} axes of degree above 1 in \
                         {degrees:?} the device dims 0..{h} once each, and -1 to the others"
                    )))
                }
            }
        }
        Ok(Strategy {
            degrees,
            device_map,
            device_matrix,
        })
    }

    /// A strategy on an explicit device matrix (outermost dim first, dims of at least 2): each
    /// axis of degree above 1 takes a device dim of its degree, no two the same; the dims no axis
    /// takes replicate the operator.
    ///
    /// # Errors
    /// [`Error::Strategy`] as [`Strategy::new`], or if a device dim is not a power of two of at
    /// least 2, the matrix counts more devices than a u64, or an axis's device dim is out of range,
    /// taken twice or not of its degree.
    pub fn with_device_matrix(
        degrees: Vec<u64>,
        device_map: Vec<i64>,
        device_matrix: Vec<u64>,
    ) -> Result<Self> {
        check_degrees(&degrees, &device_map)?;
        if let Some(d) = device_matrix
            .iter()
            .find(|d| **d < 2 || !d.is_power_of_two())
        {
            return Err(Error::Strategy(format!(
                "device matrix {device_matrix:?}: {d} is not a power of two of at least 2"
            )));
        }
        if product(&device_matrix).is_none() {
            return Err(Error::Strategy(format!(
                "device matrix {device_matrix:?} counts more devices than 64 bits hold"
            )));
        }
        let h = device_matrix.len();
        for (i, (&d, &m)) in degrees.iter().zip(&device_map).enumerate() {
            let fits = match usize::try_from(m) {
                Ok(k) => {
                    d > 1 && k < h && device_matrix[h - 1 - k] == d && !device_map[..i].contains(&m)
                }
                Err(_) => d == 1,
            };
            if !fits {
                return Err(Error::Strategy(format!(
                    "device map {device_map:?} must give each axis of degree above 1 in \
                     {degrees:?} its own dim of that size of device matrix {device_matrix:?} \
                     (0 innermost), and -1 to the others"
                )));
            }
        }
        Ok(Strategy {
            degrees,
            device_map,
            device_matrix,
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

    /// The device matrix, outermost dim first: the split axes' dims and the replica dims.
    #[must_use]
    pub fn device_matrix(&self) -> &[u64] {
        &self.device_matrix
    }

    /// The number of devices: the product of the device matrix.
    #[must_use]
    pub fn num_devices(&self) -> u64 {
        self.device_matrix.iter().product()
    }

    /// Whether device dim `k` (0 innermost) holds replicas: no axis is split along it.
    #[must_use]
    pub fn is_replica_dim(&self, k: usize) -> bool {
        !self.device_map.contains(&(k as i64))
    }

    /// The number of copies of the operator: the product of the replica dims.
    #[must_use]
    pub fn replicas(&self) -> u64 {
        (0..self.device_matrix.len())
            .filter(|&k| self.is_replica_dim(k))
            .map(|k| self.device_matrix[self.device_matrix.len() - 1 - k])
            .product()
    }

    /// The tensor map of a tensor whose dims are the axes `axes`, pushed onto `map`; with
    /// `per_replica`, a leading dim per replica dim, split along it.
    fn tensor_map_into(&self, axes: &[i64], per_replica: bool, map: &mut Vec<i64>) -> Result<()> {
        if per_replica {
            map.extend(
                (0..self.device_matrix.len())
                    .rev()
                    .filter(|&k| self.is_replica_dim(k))
                    .map(|k| k as i64),
            );
        }
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

    /// The leading dims of a per-replica layout: the replica dims' sizes, outermost first.
    fn replica_shape(&self) -> impl Iterator<Item = u64> + '_ {
        let h = self.device_matrix.len();
        (0..h)
            .rev()
            .filter(|&k| self.is_replica_dim(k))
            .map(move |k| self.device_matrix[h - 1 - k])
    }

    /// The layout of a tensor whose dims are the axes `axes` (indices; -1 for a dim of no
    /// partitionable axis, which stays whole) with the given shape. Every replica holds the
    /// same blocks. With `per_replica`, the copies are stacked instead: a leading dim per
    /// replica dim, split along it, so a collective over the dims the map leaves unused stays
    /// inside each replica (the forward partial sums of a replicated operator).
    ///
    /// # Errors
    /// [`Error::Layout`] if an axis index is out of range or the shape does not fit.
    pub fn tensor_layout(&self, axes: &[i64], shape: &[u64], per_replica: bool) -> Result<Layout> {
        let mut layout = Layout::scratch();
        self.device_layout_into(&mut layout)?;
        self.tensor_layout_into(axes, shape, per_replica, &mut layout)?;
        Ok(layout)
    }

    /// Empties `layout` onto this strategy's device matrix, for [`Strategy::tensor_layout_into`].
    ///
    /// # Errors
    /// [`Error::Layout`] if the matrix has too many devices for a u64.
    pub(crate) fn device_layout_into(&self, layout: &mut Layout) -> Result<()> {
        layout.refill(|_, matrix, _| {
            matrix.extend_from_slice(&self.device_matrix);
            Ok(())
        })
    }

    /// [`Strategy::tensor_layout`] in the buffers of `layout`, which holds this strategy's device
    /// matrix: a kernel pricing many tensors allocates nothing per tensor.
    pub(crate) fn tensor_layout_into(
        &self,
        axes: &[i64],
        shape: &[u64],
        per_replica: bool,
        layout: &mut Layout,
    ) -> Result<()> {
        debug_assert_eq!(layout.device_matrix(), self.device_matrix());
        layout.refill_tensor(|s, map| {
            self.tensor_map_into(axes, per_replica, map)?;
            if per_replica {
                s.extend(self.replica_shape());
            }
            s.extend_from_slice(shape);
            Ok(())
        })
    }
}

/// The product, if it fits a u64.
fn product(values: &[u64]) -> Option<u64> {
    values.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// The checks [`Strategy::new`] and [`Strategy::with_device_matrix`] share: one device dim entry
/// per degree, positive powers of two whose product a u64 holds.
fn check_degrees(degrees: &[u64], device_map: &[i64]) -> Result<()> {
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
    if product(degrees).is_none() {
        return Err(Error::Strategy(format!(
            "degrees {degrees:?} multiply to more devices than 64 bits count"
        )));
    }
    Ok(())
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

/// The strategies that split `axis_sizes` over all `2^n` devices (no replicas), in the order of
/// [`enumerate_strategies`], pushed onto `out` (which has the room: the count came first).
fn splits(axis_sizes: &[u64], n: u32, out: &mut Vec<Strategy>) {
    let p = axis_sizes.len();
    if p == 0 {
        if n == 0 {
            out.push(Strategy::new(vec![], vec![]).expect("the empty strategy"));
        }
        return;
    }
    let mut exps = Vec::new();
    compositions(p, n, &mut Vec::new(), &mut exps);
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
        out.extend(
            maps.into_iter()
                .map(|device_map| Strategy::new(degrees.clone(), device_map).expect("valid")),
        );
    }
}

/// `ways[i][k]`: the unordered choices of `i` split axes of `axis_sizes` whose exponents (each at
/// least 1 and at most the power of two dividing its axis) add up to `k <= n` (saturating).
fn split_ways(axis_sizes: &[u64], n: u32) -> Vec<Vec<u128>> {
    let n = n as usize;
    let mut ways = vec![vec![0u128; n + 1]; axis_sizes.len() + 1];
    ways[0][0] = 1;
    for (axis, &size) in axis_sizes.iter().enumerate() {
        let most = (size.trailing_zeros() as usize).min(n);
        for i in (0..=axis).rev() {
            for k in (0..=n).rev() {
                let w = ways[i][k];
                for e in 1..=most.min(n - k) {
                    ways[i + 1][k + e] = ways[i + 1][k + e].saturating_add(w);
                }
            }
        }
    }
    ways
}

/// How many strategies [`enumerate_strategies`] returns for these arguments, counted without
/// enumerating them (saturating at `u64::MAX`): the splits over `2^k` devices are the choices of
/// `i` split axes in `i!` orders; with `replicas` each split over fewer devices once more per
/// place of the replica dim among its `i` split dims.
#[must_use]
pub fn strategy_count(axis_sizes: &[u64], num_devices: u64, replicas: bool) -> u64 {
    if !num_devices.is_power_of_two() || axis_sizes.contains(&0) {
        return 0;
    }
    let n = log2(num_devices) as usize;
    let ways = split_ways(axis_sizes, n as u32);
    let mut total = 0u128;
    let mut orders = 1u128;
    for (i, row) in ways.iter().enumerate() {
        if i > 0 {
            orders = orders.saturating_mul(i as u128);
        }
        let mut per_order = row[n];
        if replicas {
            for &w in &row[..n] {
                per_order = per_order.saturating_add(w.saturating_mul(i as u128 + 1));
            }
        }
        total = total.saturating_add(orders.saturating_mul(per_order));
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// `s` with one replica dim of `r` devices inserted as device dim `k` (0 innermost): the split
/// dims from `k` up move one dim out.
fn with_replica_dim(s: &Strategy, r: u64, k: usize) -> Strategy {
    let h = s.device_matrix.len();
    let mut device_matrix = s.device_matrix.clone();
    device_matrix.insert(h - k, r);
    let device_map = s
        .device_map
        .iter()
        .map(|&m| if m >= k as i64 { m + 1 } else { m })
        .collect();
    Strategy {
        degrees: s.degrees.clone(),
        device_map,
        device_matrix,
    }
}

/// Every strategy of `axis_sizes` on `num_devices` devices whose degrees divide the sizes, in a
/// fixed order: degrees ascending lexicographically, then device maps descending (the order of the
/// paper's table "Auxiliary nodes").
///
/// With `replicas`, these are followed by the strategies that split over `num_devices / r`
/// devices and replicate the operator `r` times along one more device dim, for `r = 2, 4, ...,
/// num_devices` in turn: each split of the smaller count in the order above, with the replica dim
/// at every position among its `h` split dims, innermost (device dim 0) first.
///
/// # Errors
/// [`Error::Strategy`] if `num_devices` is not a positive power of two or a size is 0;
/// [`Error::Memory`] if the strategies (counted first) cannot be allocated.
pub fn enumerate_strategies(
    axis_sizes: &[u64],
    num_devices: u64,
    replicas: bool,
) -> Result<Vec<Strategy>> {
    if !num_devices.is_power_of_two() {
        return Err(Error::Strategy(format!(
            "the device count must be a power of two, got {num_devices}"
        )));
    }
    if let Some(i) = axis_sizes.iter().position(|&s| s == 0) {
        return Err(Error::Strategy(format!("axis {i} has size 0")));
    }
    let n = log2(num_devices);
    // Counted first and the room taken at once: a count the memory cannot hold is an error here,
    // not an abort halfway through (each strategy also holds three short vectors: probed too).
    let count =
        usize::try_from(strategy_count(axis_sizes, num_devices, replicas)).unwrap_or(usize::MAX);
    let what = format!(
        "the {count} strategies of {} axes on {num_devices} devices",
        axis_sizes.len()
    );
    let mut out = Vec::new();
    reserve(&mut out, count, &what)?;
    let each = 3 * (axis_sizes.len() + 1) * std::mem::size_of::<u64>();
    reserve(&mut Vec::<u8>::new(), count.saturating_mul(each), &what)?;
    splits(axis_sizes, n, &mut out);
    if replicas {
        let mut smaller = Vec::new();
        for j in 1..=n {
            smaller.clear();
            splits(axis_sizes, n - j, &mut smaller);
            for s in &smaller {
                out.extend((0..=s.device_matrix.len()).map(|k| with_replica_dim(s, 1 << j, k)));
            }
        }
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
                let got = enumerate_strategies(&vec![1 << 12; p as usize], 1 << n, false)
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
    fn the_count_is_the_number_enumerated() {
        let sizes: [&[u64]; 6] = [
            &[],
            &[3],
            &[12, 8],
            &[64, 6, 1],
            &[2, 4, 8, 16],
            &[96, 1000, 5],
        ];
        for axes in sizes {
            for n in 0..=6u32 {
                for replicas in [false, true] {
                    let got = enumerate_strategies(axes, 1 << n, replicas).unwrap().len() as u64;
                    assert_eq!(
                        strategy_count(axes, 1 << n, replicas),
                        got,
                        "{axes:?} n={n}"
                    );
                }
            }
        }
    }

    #[test]
    fn too_many_strategies_are_an_error_before_any_is_made() {
        // 8 axes on 2^40 devices: about 10^15 strategies, refused at the reservation.
        let e = enumerate_strategies(&[1 << 40; 8], 1 << 40, false).unwrap_err();
        assert!(
            matches!(&e, Error::Memory(m) if m.contains("strategies of 8 axes")),
            "{e}"
        );
    }

    #[test]
    fn matmul_on_four_devices_is_the_papers_table() {
        let s = enumerate_strategies(&[64, 64, 64], 4, false).unwrap();
        let rows: Vec<(Vec<u64>, Vec<i64>)> = s
            .iter()
            .map(|s| (s.degrees().to_vec(), s.device_map().to_vec()))
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
        assert_eq!(s[1].device_matrix(), [2, 2]);
        let w = s[3].tensor_layout(&[1, 2], &[64, 64], false).unwrap();
        assert_eq!(w.shard_shape(), vec![16, 64]);
    }

    #[test]
    fn non_dividing_degrees_are_dropped_and_bad_counts_rejected() {
        assert!(enumerate_strategies(&[3, 64], 4, false)
            .unwrap()
            .iter()
            .all(|s| s.degrees()[0] == 1));
        assert!(matches!(
            enumerate_strategies(&[8], 6, true),
            Err(Error::Strategy(_))
        ));
    }

    #[test]
    fn rejects_degrees_whose_product_overflows() {
        let err = Strategy::new(vec![1 << 39, 1 << 25], vec![1, 0]);
        assert!(matches!(err, Err(Error::Strategy(m)) if m.contains("64 bits")));
        let fits = Strategy::new(vec![1 << 39, 1 << 24], vec![1, 0]).unwrap();
        assert_eq!(fits.num_devices(), 1 << 63);
    }

    /// Replica count by a plain count: for each r = 2^j, the splits of `n - j` with `h + 1`
    /// places for the replica dim.
    #[test]
    fn replica_count_is_the_splits_of_each_smaller_count_times_the_positions() {
        for sizes in [
            vec![],
            vec![8],
            vec![64, 64, 64],
            vec![3, 16],
            vec![2, 2, 2, 2],
        ] {
            for n in 0..=5u32 {
                let plain = enumerate_strategies(&sizes, 1 << n, false).unwrap();
                let all = enumerate_strategies(&sizes, 1 << n, true).unwrap();
                assert_eq!(
                    all[..plain.len()],
                    plain[..],
                    "the default list comes first"
                );
                let want = plain.len()
                    + (1..=n)
                        .flat_map(|j| {
                            let mut smaller = Vec::new();
                            splits(&sizes, n - j, &mut smaller);
                            smaller
                        })
                        .map(|s| s.device_matrix().len() + 1)
                        .sum::<usize>();
                assert_eq!(all.len(), want, "{sizes:?} n={n}");
                let distinct: std::collections::HashSet<_> = all.iter().collect();
                assert_eq!(distinct.len(), all.len(), "no strategy twice");
                for s in &all {
                    assert_eq!(s.num_devices(), 1 << n);
                    let again = Strategy::with_device_matrix(
                        s.degrees().to_vec(),
                        s.device_map().to_vec(),
                        s.device_matrix().to_vec(),
                    );
                    assert_eq!(again.as_ref(), Ok(s));
                    let split: u64 = s.degrees().iter().product();
                    assert_eq!(split * s.replicas(), 1 << n);
                }
            }
        }
    }

    #[test]
    fn no_partitionable_axis_has_the_one_replicated_strategy() {
        assert!(enumerate_strategies(&[], 8, false).unwrap().is_empty());
        let s = enumerate_strategies(&[], 8, true).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].device_matrix(), [8]);
        assert_eq!(s[0].replicas(), 8);
        let l = s[0].tensor_layout(&[], &[], false).unwrap();
        assert_eq!(l.device_matrix(), [8]);
    }

    #[test]
    fn replica_dims_sit_among_the_split_dims() {
        // Split (4, 2) over 8 devices, replicated twice on 16: the replica dim innermost, between
        // the two split dims, or outermost.
        let all = enumerate_strategies(&[64, 64], 16, true).unwrap();
        let found: Vec<(&[i64], &[u64])> = all
            .iter()
            .filter(|s| s.degrees() == [4, 2] && s.replicas() == 2)
            .map(|s| (s.device_map(), s.device_matrix()))
            .collect();
        let want: [(&[i64], &[u64]); 6] = [
            (&[2, 1], &[4, 2, 2]),
            (&[2, 0], &[4, 2, 2]),
            (&[1, 0], &[2, 4, 2]),
            (&[1, 2], &[2, 4, 2]),
            (&[0, 2], &[2, 2, 4]),
            (&[0, 1], &[2, 2, 4]),
        ];
        assert_eq!(found, want);
        let s = Strategy::with_device_matrix(vec![4, 2], vec![2, 0], vec![4, 2, 2]).unwrap();
        assert!(s.is_replica_dim(1) && !s.is_replica_dim(0) && !s.is_replica_dim(2));
        assert!(all.contains(&s));
        let x = s.tensor_layout(&[0, 1], &[64, 64], false).unwrap();
        assert_eq!(x.tensor_map(), [2, 0]);
        assert_eq!(x.shard_shape(), vec![16, 32]);
        let stacked = s.tensor_layout(&[0], &[64], true).unwrap();
        assert_eq!(stacked.shape(), [2, 64]);
        assert_eq!(stacked.tensor_map(), [1, 2]);
    }

    #[test]
    fn explicit_matrices_are_checked() {
        let ok = Strategy::with_device_matrix(vec![2, 1], vec![0, -1], vec![2]).unwrap();
        assert_eq!(ok, Strategy::new(vec![2, 1], vec![0, -1]).unwrap());
        for (degrees, map, matrix) in [
            (vec![2], vec![0], vec![4]),
            (vec![2], vec![1], vec![2]),
            (vec![2, 2], vec![0, 0], vec![2, 2]),
            (vec![2], vec![-1], vec![2]),
            (vec![1], vec![0], vec![2]),
            (vec![2], vec![0], vec![2, 1]),
            (vec![2], vec![0], vec![2, 3]),
            (vec![2], vec![0], vec![2, 1 << 63]),
        ] {
            assert!(
                matches!(
                    Strategy::with_device_matrix(degrees.clone(), map.clone(), matrix.clone()),
                    Err(Error::Strategy(_))
                ),
                "{degrees:?} {map:?} {matrix:?}"
            );
        }
    }
}
