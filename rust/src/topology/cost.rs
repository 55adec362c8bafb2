//! The topology-aware cost model (docs/conventions.md#topology-aware-cost) on a [`Cluster`]: how
//! many communication groups of a part cross its boundary at once (`ct`), the effective bandwidth
//! that leaves each, and the cost of a collective in seconds, or in bytes under the volume model.

use super::cluster::{Cluster, Level, Replicas};
use crate::error::{parse_name, Error, Result};
use crate::layout::Layout;

/// The kind of a collective the cost model prices. (A kind, not a collective: the Python
/// `taps.costs.Collective` record is one collective of an operator, with its tensor and layout.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    AllToAll,
    ReduceScatter,
    CollectivePermute,
}

impl CollectiveKind {
    /// Every kind, in the order of [`CollectiveKind::NAMES`].
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::AllToAll,
        CollectiveKind::ReduceScatter,
        CollectiveKind::CollectivePermute,
    ];

    /// The names callers use (Python, the CLI, a plan's steps): the one list of them.
    pub const NAMES: [&'static str; 5] = [
        "all_reduce",
        "all_gather",
        "all_to_all",
        "reduce_scatter",
        "collective_permute",
    ];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The kind named `name`, one of [`CollectiveKind::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "collective", &Self::NAMES, Error::Topology).map(|i| Self::ALL[i])
    }
}

/// What a cost means: seconds on the cluster, or bytes moved per device on uniform links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CostModel {
    Topology,
    Volume,
}

impl CostModel {
    /// Every model, in the order of [`CostModel::NAMES`].
    pub const ALL: [CostModel; 2] = [CostModel::Topology, CostModel::Volume];

    /// The names callers use (Python, the CLI): the one list of them.
    pub const NAMES: [&'static str; 2] = ["topology", "volume"];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The model named `name`, one of [`CostModel::NAMES`].
    ///
    /// # Errors
    /// [`Error::Topology`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "cost model", &Self::NAMES, Error::Topology).map(|i| Self::ALL[i])
    }
}

/// Checks the bytes per element that every cost takes: positive and finite.
///
/// # Errors
/// [`Error::Topology`] otherwise.
pub fn check_dtype_bytes(dtype_bytes: f64) -> Result<()> {
    if dtype_bytes.is_finite() && dtype_bytes > 0.0 {
        Ok(())
    } else {
        Err(Error::Topology(format!(
            "dtype_bytes must be a positive number of bytes, got {dtype_bytes}"
        )))
    }
}

/// Checks a node size: `ct` assumes a node holds a power-of-two block of consecutive ranks.
///
/// # Errors
/// [`Error::Topology`] unless `devices_per_node` is a positive power of two.
pub fn check_devices_per_node(devices_per_node: u64) -> Result<()> {
    if devices_per_node.is_power_of_two() {
        Ok(())
    } else {
        Err(Error::Topology(format!(
            "devices_per_node must be a positive power of two, got {devices_per_node}"
        )))
    }
}

impl Cluster {
    /// The cost of a collective over `group` (device dims) of `layout`: seconds under
    /// [`CostModel::Topology`], bytes per device under [`CostModel::Volume`].
    ///
    /// # Errors
    /// [`Error::Topology`] if the layout is not on this cluster's devices, the group is invalid,
    /// `dtype_bytes` is not positive or the collective is a permute (priced by its pairs, as a
    /// plan's step).
    pub fn collective_cost(
        &self,
        layout: &Layout,
        collective: CollectiveKind,
        device_dim: Option<usize>,
        dtype_bytes: f64,
        model: CostModel,
    ) -> Result<f64> {
        check_dtype_bytes(dtype_bytes)?;
        self.check(layout)?;
        if collective == CollectiveKind::CollectivePermute {
            return Err(Error::Topology(
                "a collective_permute is priced by the pairs it moves, which a device dim does \
                 not give: price the plan's step (CommOp.cost)"
                    .into(),
            ));
        }
        let group = group_dims(layout, collective, device_dim)?;
        let size = group.iter().map(|&k| layout.dim_size(k)).product();
        Ok(self.priced(
            layout,
            collective,
            size,
            |k| group.contains(&k),
            dtype_bytes,
            model,
        ))
    }

    /// [`Cluster::collective_cost`] of an all_reduce, for a layout on this cluster's devices,
    /// without listing its group: the node-cost kernel's inner loop.
    pub(crate) fn allreduce_cost(
        &self,
        layout: &Layout,
        dtype_bytes: f64,
        model: CostModel,
    ) -> f64 {
        let unused = |k| !layout.uses(k);
        let size = (0..layout.num_device_dims())
            .filter(|&k| unused(k))
            .map(|k| layout.dim_size(k))
            .product();
        self.priced(
            layout,
            CollectiveKind::AllReduce,
            size,
            unused,
            dtype_bytes,
            model,
        )
    }

    /// The cost of a collective over the group of `size` devices whose device dims pass
    /// `in_group`.
    fn priced(
        &self,
        layout: &Layout,
        collective: CollectiveKind,
        size: u64,
        in_group: impl Fn(usize) -> bool,
        dtype_bytes: f64,
        model: CostModel,
    ) -> f64 {
        let bytes = collective_volume(layout, collective, size) * dtype_bytes;
        match model {
            CostModel::Volume => bytes,
            CostModel::Topology => self.seconds(
                layout.device_matrix(),
                |k| layout.distinct_along(k),
                collective,
                in_group,
                bytes,
            ),
        }
    }

    /// Seconds to move `bytes` per device in a collective over the device dims that pass
    /// `in_group` of a layout on `device_matrix` whose dims that pass `distinct` hold distinct
    /// data (tests rather than lists or a layout, so that pricing allocates nothing and the
    /// optimal planner prices a step without building its layout); the group is valid. Not for a
    /// collective-permute, which [`Cluster::permute_seconds`] prices by its pairs.
    pub(crate) fn seconds(
        &self,
        device_matrix: &[u64],
        distinct: impl Fn(usize) -> bool,
        collective: CollectiveKind,
        in_group: impl Fn(usize) -> bool,
        bytes: f64,
    ) -> f64 {
        self.group_seconds(
            collective,
            rank_bits(device_matrix, in_group),
            rank_bits(device_matrix, distinct),
            bytes,
        )
    }

    /// [`Cluster::seconds`] of a group given by its rank bits (`group`, [`rank_bits`]), the rank
    /// bits of the dims holding distinct data being `distinct`: a device dim of `d` devices
    /// holds `log2(d)` bits of the rank, and each count the cost needs (`ct`, the group size,
    /// the all-to-all's `k`) is a power of two read off the bits, without a walk over the dims.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn group_seconds(
        &self,
        collective: CollectiveKind,
        group: u64,
        distinct: u64,
        bytes: f64,
    ) -> f64 {
        if bytes == 0.0 {
            return 0.0;
        }
        let counted = if self.replicas() == Replicas::Flat {
            u64::MAX
        } else {
            distinct
        };
        // The innermost level one unit of which holds every group, and how many groups cross the
        // parts of the level below it (counted once, in the same walk).
        let (mut ct, mut here) = (0, 0);
        let j = self
            .levels()
            .iter()
            .position(|l| {
                ct = here;
                here = crossing(group, counted, l.devices);
                here == 0
            })
            .unwrap_or(self.levels().len() - 1);
        let level = &self.levels()[j];
        let p = (1u64 << group.count_ones()) as f64;
        // Every step of a ring (and of the pairwise all-to-all) uses every edge of it at once, so
        // each step crosses the outermost level the group spans and pays its latency.
        let latency = steps(collective, p) * level.latency;
        if j == 0 {
            return latency + bytes / level.bandwidth;
        }
        let below = self.levels()[j - 1].devices;
        let effective = level.bandwidth / ct as f64;
        let factor = if collective == CollectiveKind::AllToAll {
            // Only the k(p-k) of the p(p-1) peer transfers that leave the part use its link.
            let k = (1u64 << (group & (below - 1)).count_ones()) as f64;
            k * (p - k) / (p - 1.0)
        } else {
            1.0
        };
        latency + factor * bytes / effective
    }

    /// Seconds of a collective-permute of blocks of `bytes` on a layout of `device_matrix` whose
    /// dims that pass `distinct` hold distinct data, by `permutation` (device dim `k` hands its
    /// coordinate to `permutation[k]`, of the same size): one step at the latency of the
    /// innermost level whose units hold every pair, and the most bytes that leave one unit of the
    /// level below (every device whose destination is outside its unit sends its own block; with
    /// shared replicas, copies along dims it does not move send one).
    pub(crate) fn permute_seconds(
        &self,
        device_matrix: &[u64],
        distinct: impl Fn(usize) -> bool,
        permutation: &[usize],
        bytes: f64,
    ) -> f64 {
        let bits = PermutedBits::new(device_matrix, permutation);
        let Some(top) = bits.highest_moved() else {
            return 0.0;
        };
        if bytes == 0.0 {
            return 0.0;
        }
        let j = self
            .levels()
            .iter()
            .position(|l| top < l.devices.trailing_zeros())
            .unwrap_or(self.levels().len() - 1);
        let level = &self.levels()[j];
        if j == 0 {
            return level.latency + bytes / level.bandwidth;
        }
        let m = self.levels()[j - 1].devices.trailing_zeros();
        let mut blocks = bits.most_leaving(m);
        if self.replicas() == Replicas::Shared {
            // Copies along the dims the permute leaves alone go to one unit: one block serves them.
            let copies: u32 = (0..device_matrix.len())
                .filter(|&k| permutation[k] == k && !distinct(k))
                .map(|k| bits.below(k, m))
                .sum();
            blocks >>= copies;
        }
        level.latency + blocks as f64 * bytes / level.bandwidth
    }

    /// What the topology model prices by, as numbers: each level's devices, bandwidth and
    /// latency, and the replica model.
    pub(crate) fn fingerprint(&self) -> Vec<u64> {
        let levels = self
            .levels()
            .iter()
            .flat_map(|l| [l.devices, l.bandwidth.to_bits(), l.latency.to_bits()]);
        levels.chain([self.replicas() as u64]).collect()
    }

    /// What [`MatrixRates::least_rates_into`] reads of `device_matrix`, worked out once: a bound asks
    /// for the rates of every device dim under several masks (about eleven calls per bound), and
    /// working out each dim's group, first level and extents per call was most of their work.
    ///
    /// Within a node, a shard is at least the tensor over every dim of `splitting`. Across
    /// units, what the groups crossing a unit move together counts: a shard times the groups
    /// with distinct data (or every group, with flat replicas) is at least the tensor over the
    /// number of units each splitting dim spans, and over the whole size of the dims of the
    /// group. A group of more dims crosses no fewer levels than `k` alone; an all-to-all's factor
    /// is at least 1.
    pub(crate) fn matrix_rates(&self, device_matrix: &[u64]) -> MatrixRates {
        let levels = self.levels();
        let h = device_matrix.len();
        let sizes = device_matrix.iter().rev().map(|&d| d as f64).collect();
        let parts = levels[..levels.len() - 1]
            .iter()
            .flat_map(|below| {
                extents(device_matrix, below.devices)
                    .zip(device_matrix.iter().rev())
                    .map(|(e, &d)| (d / e) as f64)
            })
            .collect();
        let first = (0..h)
            .map(|k| {
                let group = rank_bits(device_matrix, |i| i == k);
                levels
                    .iter()
                    .position(|l| crossing(group, u64::MAX, l.devices) == 0)
                    .unwrap_or(levels.len() - 1)
            })
            .collect();
        MatrixRates {
            levels: levels.to_vec(),
            sizes,
            parts,
            first,
        }
    }
}

/// A cluster's lower bounds on the seconds of collectives on layouts of one device matrix
/// ([`Cluster::matrix_rates`]).
pub(crate) struct MatrixRates {
    /// The cluster's levels, copied: the rates outlive a call on the cluster (the bounds keep
    /// them by device matrix across calls).
    levels: Vec<Level>,
    /// Per device dim, its size.
    sizes: Vec<f64>,
    /// Per level but the last, per device dim, its size over the coordinates of it one unit of
    /// the level holds (row-major).
    parts: Vec<f64>,
    /// Per device dim, the first level a group of it alone lies within.
    first: Vec<usize>,
}

impl MatrixRates {
    /// Lower bounds on the seconds of a collective that moves `c` shards of a tensor of `bytes`
    /// over a group holding device dim `k` and lying within the dims of `spread` (a mask holding
    /// `k`), where only the dims of `splitting` (a mask) may split the tensor: per level such a
    /// group may cross up to, `(latency, rate)` with the collective taking at least
    /// `latency + c * bytes * rate`; each rate times `scale` (the bytes per element of a caller
    /// that counts elements); into `out` (emptied first): a bound asks for about a dozen per key,
    /// and a vector allocated for each was a third of their work. The products run over the splitting dims alone, in
    /// ascending order as before.
    pub(crate) fn least_rates_into(
        &self,
        k: usize,
        spread: u64,
        splitting: u64,
        scale: f64,
        out: &mut Vec<(f64, f64)>,
    ) {
        let first = self.first[k];
        // A group of `k` alone runs at its first level; a wider one at that level or above.
        let last = if spread == 1 << k {
            first
        } else {
            self.levels.len() - 1
        };
        self.levels_into(first, last, spread, splitting, scale, out);
    }

    /// [`MatrixRates::least_rates_into`] of a collective over a group of devices that differ in
    /// the rank bits of `group` alone, whatever the device dims (any group, not only one of the
    /// matrix's dims) but for those of `splitting`, which it leaves out: from the first level
    /// whose units hold such a group. (A dim outside the group's counts at each level as one
    /// outside `spread` there, so only the level the group reaches matters.) A group of one bit
    /// starts at the innermost level.
    pub(crate) fn group_rates_into(
        &self,
        group: u64,
        splitting: u64,
        scale: f64,
        out: &mut Vec<(f64, f64)>,
    ) {
        let last = self.levels.len() - 1;
        let first = (self.levels.iter())
            .position(|l| crossing(group, u64::MAX, l.devices) == 0)
            .unwrap_or(last);
        self.levels_into(first, last, 0, splitting, scale, out);
    }

    /// [`MatrixRates::least_rates_into`] for a `spread` of two dims or more, of every level:
    /// a level's rate does not depend on `k`, so `least_rates_into(k, spread, ..)` is
    /// `out[self.first_level(k)..]` for every dim `k` of `spread` (the bound asks this of most
    /// device dims, each with the same `spread` and `splitting`).
    pub(crate) fn wide_rates_into(
        &self,
        spread: u64,
        splitting: u64,
        scale: f64,
        out: &mut Vec<(f64, f64)>,
    ) {
        debug_assert!(spread.count_ones() >= 2);
        self.levels_into(0, self.levels.len() - 1, spread, splitting, scale, out);
    }

    /// The first level of device dim `k`'s rates ([`MatrixRates::least_rates_into`]).
    pub(crate) fn first_level(&self, k: usize) -> usize {
        self.first[k]
    }

    /// The rates of the levels `first` to `last`, into `out` (emptied first).
    fn levels_into(
        &self,
        first: usize,
        last: usize,
        spread: u64,
        splitting: u64,
        scale: f64,
        out: &mut Vec<(f64, f64)>,
    ) {
        out.clear();
        let h = self.sizes.len();
        let splitting = if h < 64 {
            splitting & ((1 << h) - 1)
        } else {
            splitting
        };
        for (j, level) in self.levels.iter().enumerate().take(last + 1).skip(first) {
            let mut parts = 1.0;
            let mut rest = splitting;
            if j == 0 {
                while rest != 0 {
                    parts *= self.sizes[rest.trailing_zeros() as usize];
                    rest &= rest - 1;
                }
            } else {
                let below = &self.parts[(j - 1) * h..j * h];
                while rest != 0 {
                    let i = rest.trailing_zeros() as usize;
                    parts *= if spread >> i & 1 == 1 {
                        self.sizes[i]
                    } else {
                        below[i]
                    };
                    rest &= rest - 1;
                }
            }
            out.push((level.latency, 1.0 / (parts * level.bandwidth) * scale));
        }
    }
}

impl Cluster {
    /// Lower bounds on the seconds it takes to bring elements into a unit of devices, on
    /// layouts of `device_matrix`: per unit (one device, then with flat replicas one unit of
    /// each level below the outermost), the extents `e_k` of its device dims and `(latency,
    /// seconds per byte)` such that the collectives that bring `b` bytes a device needs into it
    /// from outside take at least `latency + b * rate` (nothing if `b` is 0).
    ///
    /// Only the collectives of a level above the unit's bring data into it, and one that prices
    /// `x` bytes per device at level `j` (its groups inside a unit of `j`, crossing the units
    /// of `j - 1`, `ct` of them crossing each, all-to-all factor `f`) brings at most `f x ct`
    /// bytes into a unit of a lower level: as many groups meet it, each bringing at most the
    /// `(g-1)` shards of an all-gather, the `k (p-k) / p` shards of an all-to-all (the most at
    /// the widest part, at most half a group), or for a permute at most one block per device,
    /// no more than leave the part of `j - 1` that most devices leave (a smaller unit than that
    /// part has at most half its devices). So the bytes a device needs that no device of its
    /// unit holds take the fastest of the levels above the unit at least. With shared replicas
    /// a permute's copies share one block, which can break the count for units: then only the
    /// device's own is given.
    pub(crate) fn entering_rates(&self, device_matrix: &[u64]) -> Vec<(Vec<u64>, f64, f64)> {
        let levels = self.levels();
        let above = |j: usize| {
            levels[j..]
                .iter()
                .fold((f64::INFINITY, 0.0f64), |(lat, bw), l| {
                    (lat.min(l.latency), bw.max(l.bandwidth))
                })
        };
        let (latency, bandwidth) = above(0);
        let mut out = vec![(vec![1; device_matrix.len()], latency, 1.0 / bandwidth)];
        let powers = device_matrix.iter().all(|d| d.is_power_of_two());
        if self.replicas() == Replicas::Flat && powers {
            for j in 1..levels.len() {
                let (latency, bandwidth) = above(j);
                let extents = extents(device_matrix, levels[j - 1].devices).collect();
                out.push((extents, latency, 1.0 / bandwidth));
            }
        }
        out
    }
}

/// `e_k`: how many distinct coordinates of device dim `k` one node of `l` consecutive ranks holds.
#[must_use]
pub fn extents_in_node(layout: &Layout, l: u64) -> Vec<u64> {
    extents(layout.device_matrix(), l).collect()
}

/// [`extents_in_node`] of the layouts on `device_matrix`, without the vector, for the cost
/// kernels.
fn extents(device_matrix: &[u64], l: u64) -> impl Iterator<Item = u64> + '_ {
    let mut inner = 1u64;
    device_matrix.iter().rev().map(move |&d| {
        // `inner` is a power of two: `l / inner` as a shift.
        let e = d.min((l >> inner.trailing_zeros()).max(1));
        inner = inner.saturating_mul(d);
        e
    })
}

/// The steps of a collective over `p` devices as NCCL runs it: a ring all-reduce `2 (p - 1)`
/// (reduce-scatter, then all-gather), a ring all-gather or reduce-scatter and a pairwise
/// all-to-all `p - 1`, a collective-permute one.
#[allow(clippy::inline_always)]
#[inline(always)]
fn steps(collective: CollectiveKind, p: f64) -> f64 {
    match collective {
        CollectiveKind::AllReduce => 2.0 * (p - 1.0),
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
            p - 1.0
        }
        CollectiveKind::CollectivePermute => 1.0,
    }
}

/// A permutation of device dims as a permutation of the bits of a rank: bit `t` of dim `k`'s
/// coordinate becomes bit `t` of dim `permutation[k]`'s.
struct PermutedBits {
    /// For each rank bit, the source bit it is read from.
    from: [u8; 64],
    /// Each device dim's first rank bit, and one past the last.
    offsets: [u32; 65],
    len: u32,
}

impl PermutedBits {
    fn new(device_matrix: &[u64], permutation: &[usize]) -> Self {
        let h = device_matrix.len();
        let mut offsets = [0u32; 65];
        for (k, &d) in device_matrix.iter().rev().enumerate() {
            offsets[k + 1] = offsets[k] + d.trailing_zeros();
        }
        let len = offsets[h];
        let mut from = [0u8; 64];
        for (b, f) in from.iter_mut().enumerate() {
            *f = b as u8;
        }
        for (k, &to) in permutation.iter().enumerate() {
            for t in 0..offsets[k + 1] - offsets[k] {
                from[(offsets[to] + t) as usize] = (offsets[k] + t) as u8;
            }
        }
        PermutedBits { from, offsets, len }
    }

    /// The highest bit that moves, if any does.
    fn highest_moved(&self) -> Option<u32> {
        (0..self.len)
            .rev()
            .find(|&b| self.from[b as usize] != b as u8)
    }

    /// How many bits of dim `k` lie below bit `m`.
    fn below(&self, k: usize, m: u32) -> u32 {
        self.offsets[k + 1].min(m).saturating_sub(self.offsets[k])
    }

    /// The most devices of one unit of `2^m` consecutive ranks whose destination is outside it.
    /// A device stays iff each bit `b >= m` equals its source bit: if some such bit is read from
    /// another bit `>= m`, the units where the two differ keep no device; else each moved bit
    /// `b >= m` fixes one distinct bit below `m`, and of the `2^m` devices those that match stay.
    fn most_leaving(&self, m: u32) -> u64 {
        let mut fixed = 0;
        for b in m..self.len {
            let f = u32::from(self.from[b as usize]);
            if f == b {
                continue;
            }
            if f >= m {
                return 1 << m;
            }
            fixed += 1;
        }
        (1u64 << m) - (1u64 << (m - fixed))
    }
}

/// The device dims a collective runs over: the unused dims for an all_reduce of partial sums,
/// `device_dim` otherwise.
pub(crate) fn group_dims(
    layout: &Layout,
    collective: CollectiveKind,
    device_dim: Option<usize>,
) -> Result<Vec<usize>> {
    match (collective, device_dim) {
        (CollectiveKind::AllReduce, None) => Ok((0..layout.num_device_dims())
            .filter(|&k| !layout.uses(k))
            .collect()),
        (CollectiveKind::AllReduce, Some(_)) => Err(Error::Topology(
            "an all_reduce runs over the device dims the tensor map does not use; pass no device_dim"
                .into(),
        )),
        (_, None) => Err(Error::Topology(format!(
            "{collective:?} needs the device dim it runs along"
        ))),
        (_, Some(k)) if k >= layout.num_device_dims() => Err(Error::Topology(format!(
            "device dim {k} is not one of the {} dims of device matrix {:?}",
            layout.num_device_dims(),
            layout.device_matrix()
        ))),
        (_, Some(k)) => Ok(vec![k]),
    }
}

/// Elements received per device by a collective over a group of `size` devices of `layout`.
fn collective_volume(layout: &Layout, collective: CollectiveKind, size: u64) -> f64 {
    let g = size as f64;
    let s = layout.shard_size() as f64;
    match collective {
        // Whole elements, as a plan's all_reduce step is priced (a scalar's over 4 devices: 2).
        CollectiveKind::AllReduce => all_reduce_volume(size, layout.shard_size()) as f64,
        CollectiveKind::AllGather => (g - 1.0) * s,
        CollectiveKind::AllToAll | CollectiveKind::ReduceScatter => (g - 1.0) / g * s,
        CollectiveKind::CollectivePermute => s,
    }
}

/// Elements received per device by a ring all_reduce over `g` devices holding `s` elements each:
/// reduce-scatter then all-gather, `2 (g-1)/g s`, rounded up to whole elements (in 128 bits:
/// `2 (g-1) s` may not fit 64; the result, under `2 s`, saturates).
pub(crate) fn all_reduce_volume(g: u64, s: u64) -> u64 {
    u64::try_from((2 * u128::from(g - 1) * u128::from(s)).div_ceil(u128::from(g)))
        .unwrap_or(u64::MAX)
}

/// `ct` for a valid group, the device dims that pass `in_group`: 0 if the group stays inside a
/// node, else the number of groups with distinct data that leave one node at once. Replicas
/// (device dims that neither split the tensor nor hold partial sums) share one transfer, so only
/// the other dims outside the group count.
pub(crate) fn groups_crossing(layout: &Layout, in_group: impl Fn(usize) -> bool, l: u64) -> u64 {
    let matrix = layout.device_matrix();
    crossing(
        rank_bits(matrix, in_group),
        rank_bits(matrix, |k| layout.distinct_along(k)),
        l,
    )
}

/// The rank bits of the device dims of `device_matrix` that pass `test`, as a mask: dim `k` of
/// `d_k` devices holds the `log2(d_k)` bits above those of the dims inside it.
pub(crate) fn rank_bits(device_matrix: &[u64], test: impl Fn(usize) -> bool) -> u64 {
    let mut lo = 0;
    let mut mask = 0;
    for (k, &d) in device_matrix.iter().rev().enumerate() {
        let width = d.trailing_zeros();
        if test(k) {
            mask |= ((1 << width) - 1) << lo;
        }
        lo += width;
    }
    mask
}

/// [`groups_crossing`] for parts of `l` consecutive devices (a power of two), of the group of
/// rank bits `group` where the dims of the rank bits `counted` count (every dim, with flat
/// replicas): 0 if the group's bits all lie inside a part; else each group crossing a part
/// differs from the others that cross it in the counted bits below the part's outside the group.
#[allow(clippy::inline_always)]
#[inline(always)]
fn crossing(group: u64, counted: u64, l: u64) -> u64 {
    if group & !(l - 1) == 0 {
        0
    } else {
        1 << (counted & !group & (l - 1)).count_ones()
    }
}

/// The exact `ct` (docs/conventions.md#ct) of a collective of `layout` on nodes of
/// `devices_per_node` devices.
///
/// # Errors
/// [`Error::Topology`] if `devices_per_node` is not a positive power of two or the group is
/// invalid.
pub fn inter_node_groups(
    layout: &Layout,
    collective: CollectiveKind,
    devices_per_node: u64,
    device_dim: Option<usize>,
) -> Result<u64> {
    check_devices_per_node(devices_per_node)?;
    let group = group_dims(layout, collective, device_dim)?;
    Ok(groups_crossing(
        layout,
        |k| group.contains(&k),
        devices_per_node,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rates of [`MatrixRates`], worked out once per device matrix, are those worked out per
    /// call from the matrix (written out plainly here), bit for bit: every device matrix of 16
    /// devices, every dim, group spread and set of splitting dims, on clusters of two and three
    /// levels.
    #[test]
    fn matrix_rates_are_those_worked_out_per_call() {
        fn plain(
            cluster: &Cluster,
            device_matrix: &[u64],
            (k, spread, splitting): (usize, u64, u64),
            scale: f64,
        ) -> Vec<(f64, f64)> {
            let levels = cluster.levels();
            let group = rank_bits(device_matrix, |i| i == k);
            let first = levels
                .iter()
                .position(|l| crossing(group, u64::MAX, l.devices) == 0)
                .unwrap_or(levels.len() - 1);
            let last = if spread == 1 << k {
                first
            } else {
                levels.len() - 1
            };
            let h = device_matrix.len();
            (first..=last)
                .map(|j| {
                    let mut parts = 1.0;
                    for i in (0..h).filter(|&i| splitting >> i & 1 == 1) {
                        let d = device_matrix[h - 1 - i];
                        parts *= if j == 0 || spread >> i & 1 == 1 {
                            d as f64
                        } else {
                            let e: Vec<u64> =
                                extents(device_matrix, levels[j - 1].devices).collect();
                            (d / e[i]) as f64
                        };
                    }
                    (
                        levels[j].latency,
                        1.0 / (parts * levels[j].bandwidth) * scale,
                    )
                })
                .collect()
        }
        let bits = |r: &[(f64, f64)]| -> Vec<(u64, u64)> {
            r.iter().map(|&(a, b)| (a.to_bits(), b.to_bits())).collect()
        };
        // Every ordered factorisation of 16 into factors of 2 and more.
        let mut open: Vec<Vec<u64>> = vec![vec![]];
        let mut matrices = Vec::new();
        while let Some(m) = open.pop() {
            let left = 16 / m.iter().product::<u64>();
            if left == 1 {
                matrices.push(m);
                continue;
            }
            for f in [2, 4, 8, 16].into_iter().filter(|&f| left % f == 0) {
                open.push([m.clone(), vec![f]].concat());
            }
        }
        let clusters = [
            Cluster::hierarchy(&[(4, 61e9, 1.3e-6), (4, 7.1e9, 9e-6)], None, Replicas::Flat),
            Cluster::hierarchy(
                &[(2, 97e9, 7e-7), (2, 23e9, 3e-6), (4, 3.3e9, 2.1e-5)],
                None,
                Replicas::Shared,
            ),
        ];
        let mut compared = 0;
        for cluster in clusters.iter().map(|c| c.as_ref().unwrap()) {
            for matrix in &matrices {
                let h = matrix.len();
                let rates = cluster.matrix_rates(matrix);
                for k in 0..h {
                    for spread in (0..1u64 << h).filter(|s| s >> k & 1 == 1) {
                        for splitting in 0..1u64 << h {
                            let want = plain(cluster, matrix, (k, spread, splitting), 2.0);
                            let mut got = Vec::new();
                            rates.least_rates_into(k, spread, splitting, 2.0, &mut got);
                            let at = (matrix, k, spread, splitting);
                            assert_eq!(bits(&got), bits(&want), "{at:?}");
                            compared += 1;
                        }
                    }
                }
            }
        }
        assert!(compared > 1000, "{compared}");
    }

    /// The dW of a MatMul with (d, r, c) = (8, 2, 2) on 32 devices, 8 per node, for the d dim
    /// outermost, innermost and in the middle: the paper's ct of 4, 0 and 2.
    #[test]
    fn paper_ct_example() {
        let cases = [
            (vec![8, 2, 2], vec![1, 0], 4),
            (vec![2, 2, 8], vec![2, 1], 0),
            (vec![2, 8, 2], vec![2, 0], 2),
        ];
        for (dm, map, ct) in cases {
            let dw = Layout::new(vec![64, 64], dm, map).unwrap();
            assert_eq!(
                inter_node_groups(&dw, CollectiveKind::AllReduce, 8, None).unwrap(),
                ct
            );
        }
    }

    /// Two 8-device nodes, groups (0, 8), (1, 9), ...: eight groups share the inter-node link.
    #[test]
    fn paper_bandwidth_example() {
        let cluster = Cluster::new(2, 8, 60e9, 12.5e9, None).unwrap();
        let t = Layout::new(vec![16, 16], vec![2, 8], vec![1, 0]).unwrap();
        let bytes = 16.0 * 2.0;
        let cost = cluster
            .collective_cost(
                &t,
                CollectiveKind::AllGather,
                Some(1),
                2.0,
                CostModel::Topology,
            )
            .unwrap();
        assert_eq!(
            inter_node_groups(&t, CollectiveKind::AllGather, 8, Some(1)).unwrap(),
            8
        );
        assert!((cost - bytes / 1.5625e9).abs() < 1e-15);
    }

    /// Every permutation of the dims of small device matrices on every unit size: the most
    /// devices of one unit whose destination leaves it, counted rank by rank.
    #[test]
    fn most_leaving_counts_the_devices_that_leave_a_unit() {
        for dm in [
            vec![4, 4],
            vec![2, 2, 2],
            vec![2, 4, 2, 4],
            vec![8, 2, 8],
            vec![2, 2, 2, 2],
        ] {
            let h = dm.len();
            let n: u64 = dm.iter().product();
            let coords = |mut r: u64| -> Vec<u64> {
                dm.iter()
                    .rev()
                    .map(|&d| {
                        let c = r % d;
                        r /= d;
                        c
                    })
                    .collect()
            };
            let mut perms: Vec<Vec<usize>> = vec![Vec::new()];
            for _ in 0..h {
                let mut longer = Vec::new();
                for p in &perms {
                    for k in (0..h).filter(|k| !p.contains(k)) {
                        let mut q = p.clone();
                        q.push(k);
                        longer.push(q);
                    }
                }
                perms = longer;
            }
            let size = |k: usize| dm[h - 1 - k];
            for perm in perms
                .iter()
                .filter(|p| (0..h).all(|k| size(p[k]) == size(k)))
            {
                let bits = PermutedBits::new(&dm, perm);
                let dest = |r: u64| {
                    let c = coords(r);
                    let mut to = vec![0; h];
                    for k in 0..h {
                        to[perm[k]] = c[k];
                    }
                    to.iter()
                        .enumerate()
                        .rev()
                        .fold(0, |acc, (k, &x)| acc * size(k) + x)
                };
                for m in 0..=n.trailing_zeros() {
                    let most = (0..n >> m)
                        .map(|u| {
                            (u << m..(u + 1) << m)
                                .filter(|&r| dest(r) >> m != u)
                                .count() as u64
                        })
                        .max()
                        .unwrap();
                    assert_eq!(bits.most_leaving(m), most, "{dm:?} {perm:?} m={m}");
                }
            }
        }
    }

    /// [`Cluster::seconds`] as a walk over the device dims, level by level (the extents of each
    /// dim in a part, `ct` and the group size as products of dim sizes): the plain form that the
    /// rank-bit form must match bit for bit.
    fn walked_seconds(
        cluster: &Cluster,
        device_matrix: &[u64],
        distinct: impl Fn(usize) -> bool,
        collective: CollectiveKind,
        in_group: impl Fn(usize) -> bool,
        bytes: f64,
    ) -> f64 {
        if bytes == 0.0 {
            return 0.0;
        }
        let flat = cluster.replicas() == Replicas::Flat;
        let crossing = |l: u64| {
            let mut inside = true;
            let mut ct = 1;
            for ((k, e), &d) in extents(device_matrix, l)
                .enumerate()
                .zip(device_matrix.iter().rev())
            {
                if in_group(k) {
                    inside &= e == d;
                } else if flat || distinct(k) {
                    ct *= e;
                }
            }
            if inside {
                0
            } else {
                ct
            }
        };
        let levels = cluster.levels();
        let j = levels
            .iter()
            .position(|l| crossing(l.devices) == 0)
            .unwrap_or(levels.len() - 1);
        let level = &levels[j];
        let p = device_matrix
            .iter()
            .rev()
            .enumerate()
            .filter(|&(k, _)| in_group(k))
            .map(|(_, &d)| d)
            .product::<u64>() as f64;
        let latency = steps(collective, p) * level.latency;
        if j == 0 {
            return latency + bytes / level.bandwidth;
        }
        let below = levels[j - 1].devices;
        let effective = level.bandwidth / crossing(below) as f64;
        let factor = if collective == CollectiveKind::AllToAll {
            let k = extents(device_matrix, below)
                .enumerate()
                .filter(|&(k, _)| in_group(k))
                .map(|(_, e)| e)
                .product::<u64>() as f64;
            k * (p - k) / (p - 1.0)
        } else {
            1.0
        };
        latency + factor * bytes / effective
    }

    /// Every group and every set of distinct dims of every device matrix of 32 devices (with and
    /// without dims of one device), on clusters of two and three levels with latencies, under
    /// both replica models: the seconds read off rank bits are the walk's, bit for bit.
    #[test]
    fn seconds_of_rank_bits_are_the_walks() {
        let mut clusters = vec![Cluster::new(4, 8, 60e9, 6e9, None).unwrap()];
        for replicas in Replicas::ALL {
            let levels = [(4, 60e9, 1e-6), (2, 12e9, 5e-6), (4, 3e9, 2e-5)];
            clusters.push(Cluster::hierarchy(&levels, None, replicas).unwrap());
            let levels = [(2, 50e9, 2e-6), (16, 7e9, 9e-6)];
            clusters.push(Cluster::hierarchy(&levels, None, replicas).unwrap());
        }
        // The ordered factorizations of 2^5, then each with a dim of one device put in.
        let mut matrices: Vec<Vec<u64>> = vec![Vec::new()];
        for _ in 0..5 {
            let mut longer = Vec::new();
            for m in &matrices {
                longer.push([m.as_slice(), &[2]].concat());
                if let Some((&last, rest)) = m.split_last() {
                    longer.push([rest, &[last * 2]].concat());
                }
            }
            matrices = longer;
        }
        let with_ones: Vec<Vec<u64>> = matrices
            .iter()
            .map(|m| [&m[..1], &[1], &m[1..]].concat())
            .collect();
        matrices.extend(with_ones);
        let mut compared = 0;
        for cluster in &clusters {
            for m in &matrices {
                let h = m.len();
                for group in 1..1u64 << h {
                    for distinct in 0..1u64 << h {
                        let in_group = |k: usize| group >> k & 1 == 1;
                        let distinct = |k: usize| distinct >> k & 1 == 1;
                        for collective in [
                            CollectiveKind::AllReduce,
                            CollectiveKind::AllGather,
                            CollectiveKind::AllToAll,
                            CollectiveKind::ReduceScatter,
                        ] {
                            for bytes in [0.0, 6.0, 3.0e7] {
                                let got = cluster.seconds(m, distinct, collective, in_group, bytes);
                                let want = walked_seconds(
                                    cluster, m, distinct, collective, in_group, bytes,
                                );
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{m:?} group {group:b} {collective:?} {bytes}"
                                );
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(compared > 100_000, "{compared}");
    }

    #[test]
    fn names_parse_back_and_others_are_rejected() {
        for kind in CollectiveKind::ALL {
            assert_eq!(CollectiveKind::parse(kind.name()), Ok(kind));
        }
        for model in CostModel::ALL {
            assert_eq!(CostModel::parse(model.name()), Ok(model));
        }
        let Err(Error::Topology(m)) = CostModel::parse("bytes") else {
            panic!("an unknown cost model parsed")
        };
        assert_eq!(
            m,
            r#"unknown cost model "bytes": expected "topology" or "volume""#
        );
        assert!(CollectiveKind::parse("broadcast").is_err());
    }
}
