//! What both planners build and price: the steps of a redistribution ([`CommOp`] of an
//! [`OpKind`]), the plan that holds them ([`Redistribution`]), the elements a step moves and what
//! a planner minimizes ([`Objective`]).

use crate::error::{parse_name, Error, Result};
use crate::layout::Layout;
use crate::topology::{self, Cluster, CollectiveKind, CostModel, MatrixRates};

/// What a redistribution step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Keep one block of an unsplit dim: local, free.
    Slice,
    /// Gather a split dim from the group along its device dim.
    AllGather,
    /// Move a split from one tensor dim to another along the same device dim.
    AllToAll,
    /// Sum the partial sums along a device dim and split a tensor dim along it.
    ReduceScatter,
    /// Sum the partial sums along a device dim, every device keeping the whole sum.
    AllReduce,
    /// Send whole blocks to other devices: which device dims split which tensor dims changes.
    CollectivePermute,
}

impl OpKind {
    /// Every kind, in the order of [`OpKind::NAMES`].
    pub const ALL: [OpKind; 6] = [
        OpKind::Slice,
        OpKind::AllGather,
        OpKind::AllToAll,
        OpKind::ReduceScatter,
        OpKind::AllReduce,
        OpKind::CollectivePermute,
    ];

    /// The names callers see: the one list of them.
    pub const NAMES: [&'static str; 6] = [
        "slice",
        "all_gather",
        "all_to_all",
        "reduce_scatter",
        "all_reduce",
        "collective_permute",
    ];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The kind named `name`, one of [`OpKind::NAMES`].
    ///
    /// # Errors
    /// [`Error::Layout`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "op kind", &Self::NAMES, Error::Layout).map(|i| Self::ALL[i])
    }

    #[must_use]
    pub fn collective(self) -> Option<CollectiveKind> {
        match self {
            OpKind::Slice => None,
            OpKind::AllGather => Some(CollectiveKind::AllGather),
            OpKind::AllToAll => Some(CollectiveKind::AllToAll),
            OpKind::ReduceScatter => Some(CollectiveKind::ReduceScatter),
            OpKind::AllReduce => Some(CollectiveKind::AllReduce),
            OpKind::CollectivePermute => Some(CollectiveKind::CollectivePermute),
        }
    }
}

/// What the optimal planner minimizes: elements received per device, or seconds on a cluster.
#[derive(Debug, Clone, Copy)]
pub enum Objective<'a> {
    Volume,
    Seconds {
        cluster: &'a Cluster,
        dtype_bytes: f64,
    },
}

impl Objective<'_> {
    /// `total` plus the price of `op`.
    pub(crate) fn add(&self, total: f64, op: &CommOp) -> f64 {
        total + self.price(op.kind, op.over(), op.volume, &op.layout)
    }

    /// Everything prices depend on, as numbers: none for the volume, the cluster's levels,
    /// replica model and the bytes per element for seconds.
    pub(crate) fn fingerprint(&self) -> Vec<u64> {
        match *self {
            Objective::Volume => Vec::new(),
            Objective::Seconds {
                cluster,
                dtype_bytes,
            } => {
                let mut out = cluster.fingerprint();
                out.push(dtype_bytes.to_bits());
                out
            }
        }
    }

    /// The price of a plan, its ops summed in order from +0.0 as its cost is.
    pub(crate) fn total(&self, plan: &Redistribution) -> f64 {
        self.sum(plan.all_ops())
    }

    /// The price of `ops`, summed in order from +0.0 as a plan's cost is.
    pub(crate) fn sum<'o>(&self, ops: impl IntoIterator<Item = &'o CommOp>) -> f64 {
        ops.into_iter().fold(0.0, |t, op| self.add(t, op))
    }

    /// The lower bounds of [`LeastRates::least_rates_into`] on layouts of `layout`'s device matrix,
    /// worked out once for the many dims and masks one bound asks about.
    pub(crate) fn least_rates_of(&self, layout: &Layout) -> LeastRates {
        match *self {
            Objective::Volume => LeastRates::Volume(
                (0..layout.num_device_dims())
                    .map(|i| layout.dim_size(i))
                    .collect(),
            ),
            Objective::Seconds {
                cluster,
                dtype_bytes,
            } => LeastRates::Seconds(cluster.matrix_rates(layout.device_matrix()), dtype_bytes),
        }
    }

    /// Lower bounds on the price of bringing into a unit of devices the elements a device needs
    /// that no device of the unit holds, on layouts of `layout`'s device matrix: per unit, the
    /// extents of its device dims and `(latency, price per element)`
    /// ([`Cluster::entering_rates`]); under the volume objective the device alone, one per
    /// element.
    pub(crate) fn entering_rates(&self, layout: &Layout) -> Vec<(Vec<u64>, f64, f64)> {
        match *self {
            Objective::Volume => vec![(vec![1; layout.num_device_dims()], 0.0, 1.0)],
            Objective::Seconds {
                cluster,
                dtype_bytes,
            } => cluster
                .entering_rates(layout.device_matrix())
                .into_iter()
                .map(|(extents, latency, rate)| (extents, latency, rate * dtype_bytes))
                .collect(),
        }
    }

    /// The price of one op: its volume, or its seconds on the cluster (the topology cost).
    pub(crate) fn price(&self, kind: OpKind, over: Over<'_>, volume: u64, layout: &Layout) -> f64 {
        self.price_on(kind, over, volume, layout.device_matrix(), |k| {
            layout.distinct_along(k)
        })
    }

    /// [`Objective::price`] of an op on a layout given by its device matrix and the device dims
    /// that hold distinct data, all the topology model needs of it: the optimal planner prices
    /// its steps without building their layouts.
    pub(crate) fn price_on(
        &self,
        kind: OpKind,
        over: Over<'_>,
        volume: u64,
        device_matrix: &[u64],
        distinct: impl Fn(usize) -> bool,
    ) -> f64 {
        match *self {
            Objective::Volume => volume as f64,
            Objective::Seconds {
                cluster,
                dtype_bytes,
            } => seconds(
                kind,
                over,
                volume,
                device_matrix,
                distinct,
                cluster,
                dtype_bytes,
            ),
        }
    }
}

/// Lower bounds on the price of an op on layouts of one device matrix
/// ([`Objective::least_rates_of`]).
pub(crate) enum LeastRates {
    /// Under the volume objective, the device dims' sizes.
    Volume(Vec<u64>),
    /// Under the seconds objective, the cluster's bounds and the bytes per element.
    Seconds(MatrixRates, f64),
}

impl LeastRates {
    /// Lower bounds on the price of an op that moves `c` shards of a tensor of `elements` over
    /// a group that holds device dim `k` and lies within the dims of `spread` (a mask holding
    /// `k`), where only the dims of `splitting` (a mask) may split the tensor: `(latency,
    /// rate)` pairs, the op pricing at least `latency + c * elements * rate` under one of them
    /// ([`MatrixRates::least_rates_into`]), into `out` (emptied first): nothing allocated once `out`
    /// holds a rate per level.
    pub(crate) fn least_rates_into(
        &self,
        k: usize,
        spread: u64,
        splitting: u64,
        out: &mut Vec<(f64, f64)>,
    ) {
        match self {
            LeastRates::Volume(sizes) => {
                let parts: u64 = (0..sizes.len())
                    .filter(|&i| splitting >> i & 1 == 1)
                    .map(|i| sizes[i])
                    .product();
                out.clear();
                out.push((0.0, 1.0 / parts as f64));
            }
            LeastRates::Seconds(rates, dtype_bytes) => {
                rates.least_rates_into(k, spread, splitting, *dtype_bytes, out);
            }
        }
    }

    /// [`LeastRates::least_rates_into`] for a `spread` of two dims or more, for every dim of it
    /// at once: `least_rates_into(k, spread, ..)` is `out[self.first_level(k)..]`
    /// ([`MatrixRates::wide_rates_into`]).
    pub(crate) fn wide_rates_into(&self, spread: u64, splitting: u64, out: &mut Vec<(f64, f64)>) {
        match self {
            // The volume's one rate depends on neither `k` nor `spread`.
            LeastRates::Volume(_) => self.least_rates_into(0, spread, splitting, out),
            LeastRates::Seconds(rates, dtype_bytes) => {
                rates.wide_rates_into(spread, splitting, *dtype_bytes, out);
            }
        }
    }

    /// [`LeastRates::least_rates_into`] of an op over any group of devices that differ in the
    /// rank bits of `group` alone, the device dims of `splitting` left out of it
    /// ([`MatrixRates::group_rates_into`]).
    pub(crate) fn group_rates_into(&self, group: u64, splitting: u64, out: &mut Vec<(f64, f64)>) {
        match self {
            LeastRates::Volume(_) => self.least_rates_into(0, 0, splitting, out),
            LeastRates::Seconds(rates, dtype_bytes) => {
                rates.group_rates_into(group, splitting, *dtype_bytes, out);
            }
        }
    }

    /// Where device dim `k`'s rates start among [`LeastRates::wide_rates_into`]'s.
    pub(crate) fn first_level(&self, k: usize) -> usize {
        match self {
            LeastRates::Volume(_) => 0,
            LeastRates::Seconds(rates, _) => rates.first_level(k),
        }
    }
}

/// What an op communicates over: the device dims of its groups (a mask), or for a
/// collective-permute the permutation of device dims it makes (priced by the pairs it moves).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Over<'a> {
    Group(u64),
    Permutation(&'a [usize]),
}

/// One step of a redistribution, with the layout it acts on. Built by the planners only (its
/// fields are read through accessors), so that every op is one a plan can hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommOp {
    kind: OpKind,
    /// The device dim it communicates (or slices) along; for a collective-permute, the innermost
    /// device dim it moves.
    device_dim: usize,
    /// The dim that is sliced, gathered (for an all-to-all, the one gathered) or, by a
    /// reduce-scatter, split; none for an all-reduce or a collective-permute.
    tensor_dim: Option<usize>,
    /// All-to-all only: the dim that is split.
    to_tensor_dim: Option<usize>,
    /// Collective-permute only: for each device dim `k`, the device dim `permutation[k]` that
    /// takes over its splits (the coordinate a block was at along `k` is where it goes along
    /// `permutation[k]`).
    permutation: Option<Vec<usize>>,
    /// The devices of one group: `d_k`, or for a collective-permute the product over the device
    /// dims it moves.
    group_size: u64,
    /// Elements received per device (by a device that receives, for a collective-permute).
    volume: u64,
    /// The layout before the op.
    layout: Layout,
}

impl CommOp {
    #[must_use]
    pub fn kind(&self) -> OpKind {
        self.kind
    }

    /// The device dim it communicates (or slices) along; for a collective-permute, the innermost
    /// device dim it moves.
    #[must_use]
    pub fn device_dim(&self) -> usize {
        self.device_dim
    }

    /// The dim that is sliced, gathered (for an all-to-all, the one gathered) or, by a
    /// reduce-scatter, split; none for an all-reduce or a collective-permute.
    #[must_use]
    pub fn tensor_dim(&self) -> Option<usize> {
        self.tensor_dim
    }

    /// All-to-all only: the dim that is split.
    #[must_use]
    pub fn to_tensor_dim(&self) -> Option<usize> {
        self.to_tensor_dim
    }

    /// Collective-permute only: for each device dim `k`, the device dim that takes over its
    /// splits.
    #[must_use]
    pub fn permutation(&self) -> Option<&[usize]> {
        self.permutation.as_deref()
    }

    /// The devices of one group.
    #[must_use]
    pub fn group_size(&self) -> u64 {
        self.group_size
    }

    /// Elements received per device (by a device that receives, for a collective-permute).
    #[must_use]
    pub fn volume(&self) -> u64 {
        self.volume
    }

    /// The layout before the op.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn new(
        kind: OpKind,
        device_dim: usize,
        tensor_dim: Option<usize>,
        to: Option<usize>,
        layout: Layout,
    ) -> Self {
        debug_assert!(kind != OpKind::CollectivePermute);
        CommOp {
            kind,
            device_dim,
            tensor_dim,
            to_tensor_dim: to,
            permutation: None,
            group_size: layout.dim_size(device_dim),
            volume: step_volume(kind, device_dim, &layout),
            layout,
        }
    }

    /// A collective-permute of `layout` by `permutation` (not the identity).
    pub(crate) fn permute(permutation: Vec<usize>, layout: Layout) -> Self {
        let group = moved(&permutation);
        CommOp {
            kind: OpKind::CollectivePermute,
            device_dim: group.trailing_zeros() as usize,
            tensor_dim: None,
            to_tensor_dim: None,
            group_size: (0..layout.num_device_dims())
                .filter(|&k| group >> k & 1 == 1)
                .map(|k| layout.dim_size(k))
                .product(),
            permutation: Some(permutation),
            volume: layout.shard_size(),
            layout,
        }
    }

    /// The op its accessors describe (a pickled plan's step): of `kind` along `device_dim` of
    /// `layout`, or for a collective-permute by `permutation`.
    ///
    /// # Errors
    /// [`Error::Layout`] if the dims do not fit `kind` and `layout` (an index out of range, a
    /// tensor dim a kind has not or lacks, a permutation that is not one, moves nothing, or
    /// hands a dim's splits to a dim of another size).
    pub fn from_parts(
        kind: OpKind,
        device_dim: usize,
        tensor_dim: Option<usize>,
        to: Option<usize>,
        permutation: Option<Vec<usize>>,
        layout: Layout,
    ) -> Result<Self> {
        let n = layout.num_device_dims();
        let dim = |d: Option<usize>| d.is_some_and(|i| i < layout.ndim());
        let shown = |d: Option<usize>| d.map_or_else(|| "None".into(), |i| i.to_string());
        let wrong = format!(
            "{}(device_dim={device_dim}, tensor_dim={}, to_tensor_dim={}, permutation={}) is \
             not a step on a layout of {} tensor dims and {n} device dims",
            kind.name(),
            shown(tensor_dim),
            shown(to),
            permutation
                .as_ref()
                .map_or_else(|| "None".into(), |p| format!("{p:?}")),
            layout.ndim()
        );
        let op = match (kind, permutation) {
            (OpKind::CollectivePermute, Some(p)) => {
                let mut sorted = p.clone();
                sorted.sort_unstable();
                // A permute hands splits between dims of one size: any other map of dims moves
                // no device's block to one device.
                let sized = |(k, &t): (usize, &usize)| layout.dim_size(k) == layout.dim_size(t);
                (tensor_dim.is_none()
                    && to.is_none()
                    && sorted.into_iter().eq(0..n)
                    && p.iter().enumerate().all(sized))
                .then(|| Self::permute(p, layout))
                .filter(|op| op.group() != 0 && op.device_dim == device_dim)
            }
            (OpKind::CollectivePermute, None) | (_, Some(_)) => None,
            (_, None) => {
                let dims = match kind {
                    OpKind::AllReduce => tensor_dim.is_none() && to.is_none(),
                    OpKind::AllToAll => dim(tensor_dim) && dim(to) && tensor_dim != to,
                    _ => dim(tensor_dim) && to.is_none(),
                };
                (dims && device_dim < n)
                    .then(|| Self::new(kind, device_dim, tensor_dim, to, layout))
            }
        };
        op.ok_or(Error::Layout(wrong))
    }

    /// The device dims the op communicates along, as a mask.
    pub(crate) fn group(&self) -> u64 {
        self.permutation
            .as_deref()
            // Lazily: a permute's `device_dim` is no device dim, and may be past the mask's bits.
            .map_or_else(|| 1 << self.device_dim, moved)
    }

    /// What the op communicates over, as its price needs it.
    pub(crate) fn over(&self) -> Over<'_> {
        self.permutation
            .as_deref()
            .map_or_else(|| Over::Group(1 << self.device_dim), Over::Permutation)
    }

    /// `ct` of the op on nodes of `devices_per_node` (0 for a slice): the groups over its device
    /// dims that leave a node at once, as [`topology::inter_node_groups`] counts them for a
    /// collective along one dim.
    ///
    /// # Errors
    /// [`Error::Topology`] unless `devices_per_node` is a positive power of two.
    pub fn inter_node_groups(&self, devices_per_node: u64) -> Result<u64> {
        topology::check_devices_per_node(devices_per_node)?;
        if self.kind == OpKind::Slice {
            return Ok(0);
        }
        let group = self.group();
        Ok(topology::groups_crossing(
            &self.layout,
            |k| group >> k & 1 == 1,
            devices_per_node,
        ))
    }

    /// Seconds (topology model) or bytes per device (volume model).
    ///
    /// # Errors
    /// [`Error::Topology`] if the layout is not on the cluster's devices or `dtype_bytes` is not
    /// positive.
    pub fn cost(&self, cluster: &Cluster, dtype_bytes: f64, model: CostModel) -> Result<f64> {
        topology::check_dtype_bytes(dtype_bytes)?;
        if self.kind != OpKind::Slice {
            cluster.check(&self.layout)?;
        }
        Ok(step_cost(
            self.kind,
            self.over(),
            self.volume,
            &self.layout,
            cluster,
            dtype_bytes,
            model,
        ))
    }
}

/// The device dims a permutation moves, as a mask.
pub(crate) fn moved(permutation: &[usize]) -> u64 {
    permutation
        .iter()
        .enumerate()
        .filter(|&(k, &to)| k != to)
        .fold(0, |mask, (k, _)| mask | 1 << k)
}

/// Elements received per device by an op along `device_dim` of `layout` (not a permute).
pub(crate) fn step_volume(kind: OpKind, device_dim: usize, layout: &Layout) -> u64 {
    volume(kind, layout.dim_size(device_dim), layout.shard_size())
}

/// Elements received per device by an op over a group of `g` devices holding shards of `s`
/// elements.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn volume(kind: OpKind, g: u64, s: u64) -> u64 {
    match kind {
        OpKind::Slice => 0,
        OpKind::AllGather => (g - 1) * s,
        // `g` is a power of two: `s / g` as a shift. The dim a reduce-scatter splits is whole in
        // the shard, so `g` divides `s`.
        OpKind::AllToAll | OpKind::ReduceScatter => (g - 1) * (s >> g.trailing_zeros()),
        OpKind::AllReduce => topology::all_reduce_volume(g, s),
        OpKind::CollectivePermute => s,
    }
}

/// The cost of an op over `over` moving `volume` elements per device; the layout is on the
/// cluster's devices.
pub(crate) fn step_cost(
    kind: OpKind,
    over: Over<'_>,
    volume: u64,
    layout: &Layout,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> f64 {
    let matrix = layout.device_matrix();
    let distinct = |k| layout.distinct_along(k);
    match over {
        Over::Group(group) => group_step_cost(
            kind,
            topology::rank_bits(matrix, |k| group >> k & 1 == 1),
            topology::rank_bits(matrix, distinct),
            volume,
            cluster,
            dtype_bytes,
            model,
        ),
        Over::Permutation(_) => match model {
            CostModel::Volume => volume as f64 * dtype_bytes,
            CostModel::Topology => {
                seconds(kind, over, volume, matrix, distinct, cluster, dtype_bytes)
            }
        },
    }
}

/// [`step_cost`] of an op over a group whose rank bits are `group`, on a layout whose dims
/// holding distinct data have the rank bits `distinct` ([`topology::rank_bits`]): the cost
/// kernel works the bits of a pair's device dims out once, not per step.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn group_step_cost(
    kind: OpKind,
    group: u64,
    distinct: u64,
    volume: u64,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> f64 {
    match (model, kind.collective()) {
        (_, None) => 0.0,
        (CostModel::Volume, Some(_)) => volume as f64 * dtype_bytes,
        (CostModel::Topology, Some(c)) => {
            cluster.group_seconds(c, group, distinct, volume as f64 * dtype_bytes)
        }
    }
}

/// The seconds of an op over `over` moving `volume` elements per device, on a layout given by
/// its device matrix and the dims that hold distinct data.
fn seconds(
    kind: OpKind,
    over: Over<'_>,
    volume: u64,
    device_matrix: &[u64],
    distinct: impl Fn(usize) -> bool,
    cluster: &Cluster,
    dtype_bytes: f64,
) -> f64 {
    let Some(c) = kind.collective() else {
        return 0.0;
    };
    let bytes = volume as f64 * dtype_bytes;
    match over {
        Over::Group(group) => {
            cluster.seconds(device_matrix, distinct, c, |k| group >> k & 1 == 1, bytes)
        }
        Over::Permutation(permutation) => {
            cluster.permute_seconds(device_matrix, distinct, permutation, bytes)
        }
    }
}

/// A plan: the unified layouts and the ops between them, plus the fallback steps used when the
/// two layouts cannot be unified as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redistribution {
    pub source: Layout,
    pub target: Layout,
    pub ops: Vec<CommOp>,
    /// All-gathers on the original source of the splits that block unification.
    pub prelude: Vec<CommOp>,
    /// Free slices on the original target of the splits that block unification.
    pub epilogue: Vec<CommOp>,
}

impl Redistribution {
    /// Every step in order: prelude, ops, epilogue.
    pub fn all_ops(&self) -> impl Iterator<Item = &CommOp> {
        self.prelude.iter().chain(&self.ops).chain(&self.epilogue)
    }

    /// Elements received per device over the whole plan.
    ///
    /// # Errors
    /// [`Error::Layout`] if the sum does not fit a 64-bit count (a tensor of close to 2^64
    /// elements moved more than once).
    pub fn volume(&self) -> Result<u64> {
        self.all_ops()
            .try_fold(0u64, |total, op| total.checked_add(op.volume))
            .ok_or_else(|| {
                Error::Layout(
                    "the plan moves more elements per device than a 64-bit count holds".into(),
                )
            })
    }

    /// # Errors
    /// [`Error::Topology`] if the layouts are not on the cluster's devices or `dtype_bytes` is not
    /// positive.
    pub fn cost(&self, cluster: &Cluster, dtype_bytes: f64, model: CostModel) -> Result<f64> {
        // Checked even when no op runs: the plan must be for this cluster.
        topology::check_dtype_bytes(dtype_bytes)?;
        cluster.check(&self.source)?;
        // A fold from +0.0: an empty f64 sum is -0.0.
        self.all_ops().try_fold(0.0, |acc, op| {
            Ok(acc + op.cost(cluster, dtype_bytes, model)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;

    /// A sum past 2^64 elements is an error, not a wrap or a panic.
    #[test]
    fn volume_overflow_is_an_error() {
        let big = layout(&[1 << 63], &[2], &[0]);
        let gather = CommOp::new(OpKind::AllGather, 0, Some(0), None, big.clone());
        assert_eq!(gather.volume, 1 << 62);
        let mut plan = Redistribution {
            source: big.clone(),
            target: big,
            ops: vec![gather; 3],
            prelude: Vec::new(),
            epilogue: Vec::new(),
        };
        assert_eq!(plan.volume().unwrap(), 3 << 62);
        plan.ops.push(plan.ops[0].clone());
        assert!(matches!(plan.volume(), Err(Error::Layout(_))));
        // `2 (g-1) s` overflows 64 bits here; the all-reduce's `2 (g-1)/g s` does not.
        let partial = Layout::with_partial(vec![1 << 63], vec![4], vec![-1], vec![0]).unwrap();
        let sum = CommOp::new(OpKind::AllReduce, 0, None, None, partial);
        assert_eq!(sum.volume, 3 << 62);
    }
}
