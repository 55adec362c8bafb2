//! The redistribution planner (docs/conventions.md#redistribution, the paper's Algorithm 1): the
//! sequence of slices, all-to-alls and all-gathers that turns one layout of a tensor into another.

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::topology::{self, Cluster, CollectiveKind, CostModel};
use crate::unify::{check_same_tensor, reshape_for, try_unify, Reshaped, Side, Unified};

/// What a redistribution step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Keep one block of an unsplit dim: local, free.
    Slice,
    /// Gather a split dim from the group along its device dim.
    AllGather,
    /// Move a split from one tensor dim to another along the same device dim.
    AllToAll,
}

impl OpKind {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Slice => "slice",
            OpKind::AllGather => "all_gather",
            OpKind::AllToAll => "all_to_all",
        }
    }

    #[must_use]
    pub fn collective(self) -> Option<CollectiveKind> {
        match self {
            OpKind::Slice => None,
            OpKind::AllGather => Some(CollectiveKind::AllGather),
            OpKind::AllToAll => Some(CollectiveKind::AllToAll),
        }
    }
}

/// One step of a redistribution, with the layout it acts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommOp {
    pub kind: OpKind,
    pub device_dim: usize,
    /// The dim that is sliced or gathered (for an all-to-all, the one gathered).
    pub tensor_dim: usize,
    /// All-to-all only: the dim that is split.
    pub to_tensor_dim: Option<usize>,
    pub group_size: u64,
    /// Elements received per device.
    pub volume: u64,
    /// The layout before the op.
    pub layout: Layout,
}

impl CommOp {
    fn new(
        kind: OpKind,
        device_dim: usize,
        tensor_dim: usize,
        to: Option<usize>,
        layout: Layout,
    ) -> Self {
        CommOp {
            kind,
            device_dim,
            tensor_dim,
            to_tensor_dim: to,
            group_size: layout.dim_size(device_dim),
            volume: step_volume(kind, device_dim, &layout),
            layout,
        }
    }

    /// `ct` of the op on nodes of `devices_per_node` (0 for a slice), as
    /// [`topology::inter_node_groups`] gives it for the op's collective.
    ///
    /// # Errors
    /// [`Error::Topology`] unless `devices_per_node` is a positive power of two.
    pub fn inter_node_groups(&self, devices_per_node: u64) -> Result<u64> {
        match self.kind.collective() {
            Some(kind) => topology::inter_node_groups(
                &self.layout,
                kind,
                devices_per_node,
                Some(self.device_dim),
            ),
            None => topology::check_devices_per_node(devices_per_node).map(|()| 0),
        }
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
            self.device_dim,
            self.volume,
            &self.layout,
            cluster,
            dtype_bytes,
            model,
        ))
    }
}

/// Elements received per device by an op along `device_dim` of `layout`.
fn step_volume(kind: OpKind, device_dim: usize, layout: &Layout) -> u64 {
    let g = layout.dim_size(device_dim);
    let s = layout.shard_size();
    match kind {
        OpKind::Slice => 0,
        OpKind::AllGather => (g - 1) * s,
        // `g` is a power of two: `s / g` as a shift.
        OpKind::AllToAll => (g - 1) * (s >> g.trailing_zeros()),
    }
}

/// The cost of an op moving `volume` elements per device; the layout is on the cluster's devices.
fn step_cost(
    kind: OpKind,
    device_dim: usize,
    volume: u64,
    layout: &Layout,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> f64 {
    let Some(c) = kind.collective() else {
        return 0.0;
    };
    let bytes = volume as f64 * dtype_bytes;
    match model {
        CostModel::Volume => bytes,
        CostModel::Topology => cluster.seconds(layout, c, |k| k == device_dim, bytes),
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
    #[must_use]
    pub fn volume(&self) -> u64 {
        self.all_ops().map(|op| op.volume).sum()
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

/// Algorithm 1 from a unified layout to the unified target map `t`: slice what can be sliced and
/// turn gather-then-slice pairs on one device dim into all-to-alls until neither applies, then
/// gather one dim that is split differently in the target, and repeat. `step` gets each op (kind,
/// device dim, tensor dim, dim split by an all-to-all) with the layout before it; `current` is
/// stepped in place so that pricing the ops allocates nothing.
fn plan_unified(
    mut current: Layout,
    t: &[i64],
    mut step: impl FnMut(OpKind, usize, usize, Option<usize>, &Layout),
) {
    let n = t.len();
    loop {
        loop {
            let mut progress = false;
            for i in 0..n {
                let m = current.tensor_map();
                if m[i] == -1 && t[i] != -1 && !m.contains(&t[i]) {
                    step(OpKind::Slice, t[i] as usize, i, None, &current);
                    current.tensor_map_mut()[i] = t[i];
                    progress = true;
                }
            }
            for i in 0..n {
                let m = current.tensor_map();
                if m[i] == -1 && t[i] != -1 {
                    if let Some(j) = m.iter().position(|&x| x == t[i]) {
                        step(OpKind::AllToAll, t[i] as usize, j, Some(i), &current);
                        let m = current.tensor_map_mut();
                        m[j] = -1;
                        m[i] = t[i];
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
        step(OpKind::AllGather, m[i] as usize, i, None, &current);
        current.tensor_map_mut()[i] = -1;
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
                dim,
                None,
                before,
            )),
            Side::Second => relaxed.push((dim, k)),
        }
    };
    let mut epilogue = Vec::new();
    let mut current = tgt.layout.into_owned();
    for &(dim, k) in relaxed.iter().rev() {
        let mut map = current.tensor_map().to_vec();
        map[dim] = k;
        let after = current.with_map(map);
        epilogue.push(CommOp::new(OpKind::Slice, k as usize, dim, None, current));
        current = after;
    }
    debug_assert_eq!(&current, b);
    Ok(LinedUp {
        unified,
        prelude,
        epilogue,
    })
}

/// Plans the redistribution of a tensor from layout `a` to layout `b`
/// (docs/conventions.md#redistribution).
///
/// # Errors
/// [`Error::Layout`] if the layouts do not describe one tensor on one set of devices.
pub fn plan_redistribution(a: &Layout, b: &Layout) -> Result<Redistribution> {
    let lined = line_up(a, b)?;
    let source = lined.unified.layout(Side::First);
    let target = lined.unified.layout(Side::Second);
    let mut ops = Vec::new();
    plan_unified(source.clone(), target.tensor_map(), |kind, k, i, to, l| {
        ops.push(CommOp::new(kind, k, i, to, l.clone()));
    });
    Ok(Redistribution {
        source,
        target,
        ops,
        prelude: lined.prelude,
        epilogue: lined.epilogue,
    })
}

/// `plan_redistribution(a, b)?.cost(cluster, dtype_bytes, model)`, bit for bit, without building
/// the ops of the unified pair: the batch kernel's inner loop.
///
/// # Errors
/// As [`plan_redistribution`] and [`Redistribution::cost`].
pub(crate) fn redistribution_cost(
    a: &Layout,
    b: &Layout,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> Result<f64> {
    let lined = line_up(a, b)?;
    let source = lined.unified.layout(Side::First);
    // Every layout of the plan has the source's device count.
    cluster.check(&source)?;
    // In plan order, from +0.0 as the plan's own sum.
    let mut total = lined.prelude.iter().try_fold(0.0, |acc, op| {
        Ok::<_, Error>(acc + op.cost(cluster, dtype_bytes, model)?)
    })?;
    let target = lined.unified.tensor_map(Side::Second);
    plan_unified(source, &target, |kind, k, _, _, l| {
        let volume = step_volume(kind, k, l);
        total += step_cost(kind, k, volume, l, cluster, dtype_bytes, model);
    });
    lined.epilogue.iter().try_fold(total, |acc, op| {
        Ok(acc + op.cost(cluster, dtype_bytes, model)?)
    })
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
        let plan = plan_redistribution(&a, &b).unwrap();
        let steps: Vec<_> = plan
            .ops
            .iter()
            .map(|o| (o.kind, o.device_dim, o.tensor_dim, o.to_tensor_dim))
            .collect();
        assert_eq!(
            steps,
            vec![
                (OpKind::Slice, 0, 3, None),
                (OpKind::AllToAll, 1, 1, Some(0)),
                (OpKind::AllGather, 2, 2, None),
            ]
        );
        let size: u64 = shape.iter().product();
        assert_eq!(plan.volume() * d0 * d1 * d1 * d2 * d3, (d1 * d2 - 1) * size);
        assert!(plan.prelude.is_empty() && plan.epilogue.is_empty());
    }

    #[test]
    fn identical_layouts_need_nothing() {
        let a = layout(&[8, 8], &[2, 4], &[0, 1]);
        assert!(plan_redistribution(&a, &a).unwrap().ops.is_empty());
    }

    #[test]
    fn misaligned_reshape_falls_back_to_a_gather() {
        let a = layout(&[6, 16], &[16], &[-1, 0]);
        let b = layout(&[96], &[16], &[0]);
        let plan = plan_redistribution(&a, &b).unwrap();
        assert!(!plan.prelude.is_empty() || !plan.epilogue.is_empty());
        // Never more than gathering everything: 15 * 6 elements per device.
        assert!(plan.volume() <= 15 * 6);
    }
}
