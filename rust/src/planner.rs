//! Redistribution plans (docs/conventions.md#redistribution): the steps that turn one layout of
//! a tensor into another, and two planners that choose them. [`Planner::Paper`] is the paper's
//! Algorithm 1 (slices, all-to-alls and all-gathers in a fixed order); [`Planner::Optimal`] is a
//! shortest path over the layouts between the two canonical forms ([`crate::optimal`]), which
//! also uses reduce-scatters, all-reduces and collective-permutes.

use std::borrow::Cow;
use std::sync::atomic::AtomicBool;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::optimal::{Path, Problem};
use crate::topology::{self, Cluster, CollectiveKind, CostModel};
use crate::unify::{
    check_same_tensor, normalized, reshape_for, try_unify, Reshaped, Side, Unified,
};

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
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Slice => "slice",
            OpKind::AllGather => "all_gather",
            OpKind::AllToAll => "all_to_all",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllReduce => "all_reduce",
            OpKind::CollectivePermute => "collective_permute",
        }
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

/// Which planner chooses the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Planner {
    /// The cheapest plan between the canonical forms, never dearer than Algorithm 1 on them.
    Optimal,
    /// The paper's Algorithm 1 on the two layouts as given (partial sums all-reduced first).
    Paper,
}

impl Planner {
    /// Every planner, in the order of [`Planner::NAMES`].
    pub const ALL: [Planner; 2] = [Planner::Optimal, Planner::Paper];

    /// The names callers use (Python, the CLI): the one list of them.
    pub const NAMES: [&'static str; 2] = ["optimal", "paper"];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The planner named `name`, one of [`Planner::NAMES`].
    ///
    /// # Errors
    /// [`Error::Layout`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        topology::parse_name(name, "planner", &Self::NAMES, Error::Layout).map(|i| Self::ALL[i])
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
        total + self.price(op.kind, op.group(), op.volume, &op.layout)
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
        plan.all_ops().fold(0.0, |t, op| self.add(t, op))
    }
    /// Lower bounds on the price of an op that moves `c` shards of a tensor of `elements` over
    /// a group that holds device dim `k` of a layout with `layout`'s device matrix and lies
    /// within the dims of `spread` (a mask holding `k`), where only the dims of `splitting` (a
    /// mask) may split the tensor: `(latency, rate)` pairs, the op pricing at least
    /// `latency + c * elements * rate` under one of them ([`Cluster::least_rates`]).
    pub(crate) fn least_rates(
        &self,
        layout: &Layout,
        k: usize,
        spread: u64,
        splitting: u64,
    ) -> Vec<(f64, f64)> {
        match *self {
            Objective::Volume => {
                let parts: u64 = (0..layout.num_device_dims())
                    .filter(|&i| splitting >> i & 1 == 1)
                    .map(|i| layout.dim_size(i))
                    .product();
                vec![(0.0, 1.0 / parts as f64)]
            }
            Objective::Seconds {
                cluster,
                dtype_bytes,
            } => cluster
                .least_rates(layout.device_matrix(), k, spread, splitting)
                .into_iter()
                .map(|(latency, rate)| (latency, rate * dtype_bytes))
                .collect(),
        }
    }

    /// The price of one op: its volume, or its seconds on the cluster (the topology cost).
    pub(crate) fn price(&self, kind: OpKind, group: u64, volume: u64, layout: &Layout) -> f64 {
        self.price_on(kind, group, volume, layout.device_matrix(), |k| {
            layout.distinct_along(k)
        })
    }

    /// [`Objective::price`] of an op on a layout given by its device matrix and the device dims
    /// that hold distinct data, all the topology model needs of it: the optimal planner prices
    /// its steps without building their layouts.
    pub(crate) fn price_on(
        &self,
        kind: OpKind,
        group: u64,
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
                group,
                volume,
                device_matrix,
                distinct,
                cluster,
                dtype_bytes,
            ),
        }
    }
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

    /// The device dims the op communicates along, as a mask.
    pub(crate) fn group(&self) -> u64 {
        self.permutation
            .as_deref()
            .map_or(1 << self.device_dim, moved)
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
            self.group(),
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
pub(crate) fn volume(kind: OpKind, g: u64, s: u64) -> u64 {
    match kind {
        OpKind::Slice => 0,
        OpKind::AllGather => (g - 1) * s,
        // `g` is a power of two: `s / g` as a shift. The dim a reduce-scatter splits is whole in
        // the shard, so `g` divides `s`.
        OpKind::AllToAll | OpKind::ReduceScatter => (g - 1) * (s >> g.trailing_zeros()),
        // A ring: reduce-scatter then all-gather, `2 (g-1)/g s`, rounded up to whole elements
        // (in 128 bits: `2 (g-1) s` may not fit 64; the result, under `2 s`, saturates).
        OpKind::AllReduce => {
            u64::try_from((2 * u128::from(g - 1) * u128::from(s)).div_ceil(u128::from(g)))
                .unwrap_or(u64::MAX)
        }
        OpKind::CollectivePermute => s,
    }
}

/// The cost of an op over the device dims `group` (a mask) moving `volume` elements per device;
/// the layout is on the cluster's devices.
pub(crate) fn step_cost(
    kind: OpKind,
    group: u64,
    volume: u64,
    layout: &Layout,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> f64 {
    match model {
        CostModel::Volume if kind == OpKind::Slice => 0.0,
        CostModel::Volume => volume as f64 * dtype_bytes,
        CostModel::Topology => seconds(
            kind,
            group,
            volume,
            layout.device_matrix(),
            |k| layout.distinct_along(k),
            cluster,
            dtype_bytes,
        ),
    }
}

/// The seconds of an op over the device dims `group` (a mask) moving `volume` elements per
/// device, on a layout given by its device matrix and the dims that hold distinct data.
fn seconds(
    kind: OpKind,
    group: u64,
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
    cluster.seconds(device_matrix, distinct, c, |k| group >> k & 1 == 1, bytes)
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

/// Algorithm 1 from a unified layout to the unified target `t`: all-reduce the partial sums the
/// target does not keep, then slice what can be sliced and turn gather-then-slice pairs on one
/// device dim into all-to-alls until neither applies, then gather one dim that is split
/// differently in the target, and repeat. `step` gets each op (kind, device dim, tensor dim, dim
/// split by an all-to-all) with the layout before it; `current` is stepped in place so that
/// pricing the ops allocates nothing (but for partial sums).
pub(crate) fn plan_unified(
    mut current: Layout,
    t: &Layout,
    mut step: impl FnMut(OpKind, usize, Option<usize>, Option<usize>, &Layout),
) {
    for &k in &current.partial().to_vec() {
        if !t.partial().contains(&k) {
            step(OpKind::AllReduce, k, None, None, &current);
            let partial = current
                .partial()
                .iter()
                .copied()
                .filter(|&p| p != k)
                .collect();
            current = current.with_state(current.tensor_map().to_vec(), partial);
        }
    }
    let t = t.tensor_map();
    let n = t.len();
    loop {
        loop {
            let mut progress = false;
            for i in 0..n {
                let m = current.tensor_map();
                if m[i] == -1 && t[i] != -1 && !current.uses(t[i] as usize) {
                    step(OpKind::Slice, t[i] as usize, Some(i), None, &current);
                    current.set_map_entry(i, t[i]);
                    progress = true;
                }
            }
            for i in 0..n {
                let m = current.tensor_map();
                if m[i] == -1 && t[i] != -1 && current.uses(t[i] as usize) {
                    if let Some(j) = m.iter().position(|&x| x == t[i]) {
                        step(OpKind::AllToAll, t[i] as usize, Some(j), Some(i), &current);
                        current.set_map_entry(j, -1);
                        current.set_map_entry(i, t[i]);
                        progress = true;
                    }
                }
            }
            if !progress {
                break;
            }
        }
        // Left over: dims split in the source and not the same way in the target. (A dim that
        // waits for a device dim held elsewhere would have been served by an all-to-all.)
        let m = current.tensor_map();
        let Some(i) = (0..n).find(|&i| m[i] != -1 && m[i] != t[i]) else {
            break;
        };
        step(OpKind::AllGather, m[i] as usize, Some(i), None, &current);
        current.set_map_entry(i, -1);
    }
    debug_assert_eq!(current.tensor_map(), t);
}

/// Two layouts made unifiable: the unified pair, and the fallback steps around it.
struct LinedUp {
    unified: Unified,
    prelude: Vec<CommOp>,
    epilogue: Vec<CommOp>,
}

/// Unifies `a` with `b`, reshaping and, where reshaping cannot line them up, giving up splits.
fn line_up(a: &Layout, b: &Layout) -> Result<LinedUp> {
    check_same_tensor(a, b)?;
    let mut src = Reshaped::new(a);
    let mut tgt = Reshaped::new(b);
    let mut prelude = Vec::new();
    let mut relaxed = Vec::new();
    let unified = loop {
        let blocker = match try_unify(&src, &tgt) {
            Ok(unified) => break unified,
            Err(blocker) => blocker,
        };
        if reshape_for(blocker, &mut src, &mut tgt) {
            continue;
        }
        // Reshaping alone cannot line the two up: give up a split, the blocked dim's or, if that
        // is unsplit, a neighbour's.
        let side = match blocker.side {
            Side::First => &mut src,
            Side::Second => &mut tgt,
        };
        let j = blocker.dim;
        let dim = [Some(j), j.checked_add(1), j.checked_sub(1)]
            .into_iter()
            .flatten()
            .find_map(|j| side.split_dim(j))
            .ok_or_else(|| {
                Error::Unify(format!("no split to give up to unify {a:?} with {b:?}"))
            })?;
        let before = side.layout.clone().into_owned();
        let k = before.tensor_map()[dim];
        let mut map = before.tensor_map().to_vec();
        map[dim] = -1;
        side.layout = Cow::Owned(before.with_map(map));
        match blocker.side {
            Side::First => prelude.push(CommOp::new(
                OpKind::AllGather,
                k as usize,
                Some(dim),
                None,
                before,
            )),
            Side::Second => relaxed.push((dim, k)),
        }
    };
    let mut epilogue = Vec::new();
    // Borrowed (not cloned) unless a split of the target was given up.
    let mut current = tgt.layout;
    for &(dim, k) in relaxed.iter().rev() {
        let mut map = current.tensor_map().to_vec();
        map[dim] = k;
        let after = current.with_map(map);
        epilogue.push(CommOp::new(
            OpKind::Slice,
            k as usize,
            Some(dim),
            None,
            current.into_owned(),
        ));
        current = Cow::Owned(after);
    }
    debug_assert_eq!(&*current, b);
    Ok(LinedUp {
        unified,
        prelude,
        epilogue,
    })
}

/// The target may keep partial sums the source has, but no step creates them.
fn check_partial(source: &Layout, target: &Layout, a: &Layout, b: &Layout) -> Result<()> {
    if target
        .partial()
        .iter()
        .all(|k| source.partial().contains(k))
    {
        Ok(())
    } else {
        Err(Error::Layout(format!(
            "{b:?} holds partial sums where {a:?} does not: no redistribution step creates \
             partial sums"
        )))
    }
}

/// Plans the redistribution of a tensor from layout `a` to layout `b` with `planner`; the optimal
/// planner minimizes `objective` (the paper's planner ignores it).
///
/// The optimal plan is the cheaper of the shortest path between the canonical forms and
/// Algorithm 1 on the layouts as given (the canonical forms merge device dims, which can take
/// away a cheaper order of smaller collectives); on a tie, the shortest path's.
///
/// # Errors
/// [`Error::Layout`] if the layouts do not describe one tensor on one set of devices or the target
/// holds partial sums the source does not, [`Error::Topology`] if the objective's cluster does
/// not have the layouts' device count or its `dtype_bytes` is not positive.
pub fn plan_redistribution(
    a: &Layout,
    b: &Layout,
    planner: Planner,
    objective: Objective<'_>,
) -> Result<Redistribution> {
    let paper = paper_plan(a, b, objective)?;
    if planner == Planner::Paper {
        return Ok(paper);
    }
    let optimal = canonical_plan(a, b, objective)?;
    Ok(if objective.total(&optimal) <= objective.total(&paper) {
        optimal
    } else {
        paper
    })
}

/// Algorithm 1 on `a` and `b` as given.
fn paper_plan(a: &Layout, b: &Layout, objective: Objective<'_>) -> Result<Redistribution> {
    let on = match objective {
        Objective::Volume => None,
        Objective::Seconds {
            cluster,
            dtype_bytes,
        } => Some((cluster, dtype_bytes)),
    };
    let mut plan = lined_up(a, b, on)?;
    let mut ops = Vec::new();
    plan_unified(plan.source.clone(), &plan.target, |kind, k, i, to, l| {
        ops.push(CommOp::new(kind, k, i, to, l.clone()));
    });
    plan.ops = ops;
    Ok(plan)
}

/// What both forms of Algorithm 1 start from: `a` and `b` lined up ([`line_up`]), as a plan
/// with no ops yet, its partial sums checked and, when pricing on a cluster (with bytes per
/// element), its layouts checked against it.
fn lined_up(a: &Layout, b: &Layout, on: Option<(&Cluster, f64)>) -> Result<Redistribution> {
    let lined = line_up(a, b)?;
    let source = lined.unified.layout(Side::First);
    let target = lined.unified.layout(Side::Second);
    check_partial(&source, &target, a, b)?;
    if let Some((cluster, dtype_bytes)) = on {
        topology::check_dtype_bytes(dtype_bytes)?;
        // Every layout of the plan has the source's device count.
        cluster.check(&source)?;
    }
    Ok(Redistribution {
        source,
        target,
        ops: Vec::new(),
        prelude: lined.prelude,
        epilogue: lined.epilogue,
    })
}

/// The shortest path between the canonical forms of `a` and `b` (Algorithm 1 on them if the
/// search gives up): one distribution, one plan.
pub(crate) fn canonical_plan(
    a: &Layout,
    b: &Layout,
    objective: Objective<'_>,
) -> Result<Redistribution> {
    shortest_plan_by(&normalized(a), &normalized(b), objective, |problem| {
        Cow::Owned(crate::optimal::solve(
            problem,
            objective,
            &AtomicBool::new(false),
        ))
    })
}

/// [`canonical_plan`] of layouts already in canonical form, with the search's path of a problem
/// from `solve` (the batch kernel normalises each distinct layout once and searches once per
/// [`Key`](crate::optimal::Key), not once per pair): Algorithm 1 on the unified pair, unless the
/// path, mapped onto the pair, costs no more.
pub(crate) fn shortest_plan_by<'p>(
    a: &Layout,
    b: &Layout,
    objective: Objective<'_>,
    solve: impl FnOnce(&Problem) -> Cow<'p, Path>,
) -> Result<Redistribution> {
    debug_assert!(normalized(a) == *a && normalized(b) == *b);
    let mut plan = paper_plan(a, b, objective)?;
    if let Some(problem) = Problem::of(&plan.source, &plan.target) {
        let ops = problem.ops(&solve(&problem), &plan.source);
        let price = |ops: &[CommOp]| ops.iter().fold(0.0, |t, op| objective.add(t, op));
        if price(&ops) <= price(&plan.ops) {
            plan.ops = ops;
        }
    }
    Ok(plan)
}

/// The search [`shortest_plan_by`] runs for `a` and `b` (`None` if it runs none).
///
/// # Errors
/// As [`plan_redistribution`].
pub(crate) fn search_problem(a: &Layout, b: &Layout) -> Result<Option<Problem>> {
    let plan = lined_up(a, b, None)?;
    Ok(Problem::of(&plan.source, &plan.target))
}

/// `plan_redistribution(a, b, Planner::Paper, _)?.cost(cluster, dtype_bytes, model)`, bit for
/// bit, without building the ops of the unified pair: the batch kernel's inner loop. Also the
/// plan's elements received per device, summed as [`Objective::Volume`] prices it (what the
/// optimal planner compares under the volume model), in the same pass.
///
/// # Errors
/// As [`plan_redistribution`] and [`Redistribution::cost`].
pub(crate) fn paper_cost(
    a: &Layout,
    b: &Layout,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> Result<(f64, f64)> {
    let lined = lined_up(a, b, Some((cluster, dtype_bytes)))?;
    // In plan order, from +0.0 as the plan's own sums.
    let add = |(cost, elements): (f64, f64), op: &CommOp| {
        Ok::<_, Error>((
            cost + op.cost(cluster, dtype_bytes, model)?,
            elements + op.volume as f64,
        ))
    };
    let mut total = lined.prelude.iter().try_fold((0.0, 0.0), add)?;
    plan_unified(lined.source, &lined.target, |kind, k, _, _, l| {
        let volume = step_volume(kind, k, l);
        total.0 += step_cost(kind, 1 << k, volume, l, cluster, dtype_bytes, model);
        total.1 += volume as f64;
    });
    lined.epilogue.iter().try_fold(total, add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;

    /// The paper's table "Tensor Redistribution" (caption erratum applied).
    #[test]
    fn paper_example() {
        let (d3, d2, d1, d0) = (2u64, 4, 2, 8);
        let dm = [d3, d2, d1, d0];
        let shape = [16, 16, 16, 16, 16];
        let a = layout(&shape, &dm, &[-1, 1, 2, -1, 3]);
        let b = layout(&shape, &dm, &[1, -1, -1, 0, 3]);
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        let steps: Vec<_> = plan
            .ops
            .iter()
            .map(|o| (o.kind, o.device_dim, o.tensor_dim, o.to_tensor_dim))
            .collect();
        assert_eq!(
            steps,
            vec![
                (OpKind::Slice, 0, Some(3), None),
                (OpKind::AllToAll, 1, Some(1), Some(0)),
                (OpKind::AllGather, 2, Some(2), None),
            ]
        );
        let size: u64 = shape.iter().product();
        assert_eq!(
            plan.volume().unwrap() * d0 * d1 * d1 * d2 * d3,
            (d1 * d2 - 1) * size
        );
        assert!(plan.prelude.is_empty() && plan.epilogue.is_empty());
    }

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

    #[test]
    fn identical_layouts_need_nothing() {
        let a = layout(&[8, 8], &[2, 4], &[0, 1]);
        assert!(
            plan_redistribution(&a, &a, Planner::Paper, Objective::Volume)
                .unwrap()
                .ops
                .is_empty()
        );
    }

    #[test]
    fn misaligned_reshape_falls_back_to_a_gather() {
        let a = layout(&[6, 16], &[16], &[-1, 0]);
        let b = layout(&[96], &[16], &[0]);
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        assert!(!plan.prelude.is_empty() || !plan.epilogue.is_empty());
        // Never more than gathering everything: 15 * 6 elements per device.
        assert!(plan.volume().unwrap() <= 15 * 6);
    }
}

#[cfg(test)]
mod optimal_tests {
    use super::*;
    use crate::layout::layout;

    fn both(a: &Layout, b: &Layout) -> (Redistribution, Redistribution) {
        (
            plan_redistribution(a, b, Planner::Paper, Objective::Volume).unwrap(),
            plan_redistribution(a, b, Planner::Optimal, Objective::Volume).unwrap(),
        )
    }

    /// The examples of issue 12: elements received per device by each planner.
    #[test]
    fn optimal_plans_of_the_issue() {
        let cases: [(Layout, Layout, u64, u64); 5] = [
            (
                layout(&[96, 32, 96], &[16, 2], &[1, 0, -1]),
                layout(&[96, 32, 96], &[16, 2], &[0, 1, -1]),
                211_968,
                17_280,
            ),
            (
                layout(&[16, 48], &[8, 2], &[0, -1]),
                layout(&[16, 48], &[16], &[0, -1]),
                192,
                48,
            ),
            (
                layout(&[32, 96, 96], &[2, 2, 4, 2], &[2, -1, -1]),
                layout(&[32, 96, 96], &[8, 4], &[0, -1, -1]),
                147_456,
                73_728,
            ),
            // A 4x4 mesh swapping its two dims: one collective-permute of the whole shard.
            (
                layout(&[1024, 1024], &[4, 4], &[1, 0]),
                layout(&[1024, 1024], &[4, 4], &[0, 1]),
                393_216,
                65_536,
            ),
            (
                layout(&[64, 4, 8, 16], &[4, 4], &[-1, 1, 0, -1]),
                layout(&[64, 32, 16], &[16], &[0, -1, -1]),
                3_072,
                1_920,
            ),
        ];
        for (a, b, paper, optimal) in cases {
            let (p, o) = both(&a, &b);
            assert_eq!(
                (p.volume().unwrap(), o.volume().unwrap()),
                (paper, optimal),
                "{a:?} -> {b:?}"
            );
        }
        let swap = both(
            &layout(&[1024, 1024], &[4, 4], &[1, 0]),
            &layout(&[1024, 1024], &[4, 4], &[0, 1]),
        )
        .1;
        assert_eq!(swap.ops.len(), 1);
        assert_eq!(swap.ops[0].kind, OpKind::CollectivePermute);
        assert_eq!(swap.ops[0].permutation.as_deref(), Some(&[1, 0][..]));
    }

    /// One distribution written two ways gets one plan.
    #[test]
    fn one_distribution_one_plan() {
        let b = layout(&[64, 32, 16], &[16], &[0, -1, -1]);
        let (_, one) = both(&layout(&[64, 32, 16], &[16], &[-1, 0, -1]), &b);
        let (_, other) = both(&layout(&[64, 4, 8, 16], &[4, 4], &[-1, 1, 0, -1]), &b);
        assert_eq!(one, other);
        assert_eq!(one.volume().unwrap(), 1_920);
    }

    /// A partial sum over 4 devices to a split: one reduce-scatter, half the all-reduce's volume;
    /// to a replica: one all-reduce.
    #[test]
    fn partial_sums_reduce() {
        let a = Layout::with_partial(vec![64, 8], vec![4, 2], vec![-1, 0], vec![1]).unwrap();
        let split = layout(&[64, 8], &[4, 2], &[1, 0]);
        let (paper, optimal) = both(&a, &split);
        let kinds: Vec<_> = optimal.ops.iter().map(|o| o.kind).collect();
        assert_eq!(kinds, [OpKind::ReduceScatter]);
        assert_eq!(optimal.volume().unwrap(), 3 * 64 * 4 / 4);
        assert_eq!(paper.volume().unwrap(), 2 * optimal.volume().unwrap());
        let (_, whole) = both(&a, &layout(&[64, 8], &[4, 2], &[-1, 0]));
        assert_eq!(whole.ops.len(), 1);
        assert_eq!(whole.ops[0].kind, OpKind::AllReduce);
        assert_eq!(whole.volume().unwrap(), 2 * 3 * 64 * 4 / 4);
        // No step creates partial sums.
        assert!(matches!(
            plan_redistribution(&split, &a, Planner::Optimal, Objective::Volume),
            Err(Error::Layout(_))
        ));
    }
}
