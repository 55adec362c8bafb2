//! The redistribution planner (SPEC section 3, the paper's Algorithm 1): the sequence of slices,
//! all-to-alls and all-gathers that turns one layout of a tensor into another.

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::topology::{Cluster, Collective, CostModel};
use crate::unify::{check_same_tensor, reshape_for, try_unify, Reshaped, Side};

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
    pub fn collective(self) -> Option<Collective> {
        match self {
            OpKind::Slice => None,
            OpKind::AllGather => Some(Collective::AllGather),
            OpKind::AllToAll => Some(Collective::AllToAll),
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
        let g = layout.dim_size(device_dim);
        let s = layout.shard_size();
        let volume = match kind {
            OpKind::Slice => 0,
            OpKind::AllGather => (g - 1) * s,
            OpKind::AllToAll => (g - 1) * (s / g),
        };
        CommOp {
            kind,
            device_dim,
            tensor_dim,
            to_tensor_dim: to,
            group_size: g,
            volume,
            layout,
        }
    }

    /// `ct` of the op on nodes of `devices_per_node` (0 for a slice).
    #[must_use]
    pub fn inter_node_groups(&self, devices_per_node: u64) -> u64 {
        if self.kind == OpKind::Slice {
            0
        } else {
            crate::topology::groups_crossing(&self.layout, &[self.device_dim], devices_per_node)
        }
    }

    /// Seconds (topology model) or bytes per device (volume model).
    ///
    /// # Errors
    /// [`Error::Topology`] if the layout is not on the cluster's devices.
    pub fn cost(&self, cluster: &Cluster, dtype_bytes: f64, model: CostModel) -> Result<f64> {
        match self.kind.collective() {
            None => Ok(0.0),
            Some(c) => {
                cluster.check(&self.layout)?;
                let bytes = self.volume as f64 * dtype_bytes;
                Ok(match model {
                    CostModel::Volume => bytes,
                    CostModel::Topology => {
                        cluster.seconds(&self.layout, c, &[self.device_dim], bytes)
                    }
                })
            }
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
    #[must_use]
    pub fn volume(&self) -> u64 {
        self.all_ops().map(|op| op.volume).sum()
    }

    /// # Errors
    /// [`Error::Topology`] if the layouts are not on the cluster's devices.
    pub fn cost(&self, cluster: &Cluster, dtype_bytes: f64, model: CostModel) -> Result<f64> {
        // Checked even when no op runs: the plan must be for this cluster.
        cluster.check(&self.source)?;
        // A fold from +0.0: an empty f64 sum is -0.0.
        self.all_ops().try_fold(0.0, |acc, op| {
            Ok(acc + op.cost(cluster, dtype_bytes, model)?)
        })
    }
}

/// Algorithm 1 on two unified layouts: slice what can be sliced and turn gather-then-slice pairs
/// on one device dim into all-to-alls until neither applies, then gather one dim that is split
/// differently in the target, and repeat.
fn plan_unified(source: &Layout, target: &Layout) -> Vec<CommOp> {
    let t = target.tensor_map();
    let mut m = source.tensor_map().to_vec();
    let mut ops = Vec::new();
    let mut push = |m: &[i64], kind, k: i64, i, to| {
        ops.push(CommOp::new(
            kind,
            k as usize,
            i,
            to,
            source.with_map(m.to_vec()),
        ));
    };
    loop {
        loop {
            let mut progress = false;
            for i in 0..m.len() {
                if m[i] == -1 && t[i] != -1 && !m.contains(&t[i]) {
                    push(&m, OpKind::Slice, t[i], i, None);
                    m[i] = t[i];
                    progress = true;
                }
            }
            for i in 0..m.len() {
                if m[i] == -1 && t[i] != -1 {
                    if let Some(j) = m.iter().position(|&x| x == t[i]) {
                        push(&m, OpKind::AllToAll, t[i], j, Some(i));
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
        let Some(i) = (0..m.len()).find(|&i| m[i] != -1 && m[i] != t[i]) else {
            break;
        };
        push(&m, OpKind::AllGather, m[i], i, None);
        m[i] = -1;
    }
    debug_assert_eq!(m, t);
    ops
}

/// Plans the redistribution of a tensor from layout `a` to layout `b` (SPEC section 3).
///
/// # Errors
/// [`Error::Layout`] if the layouts do not describe one tensor on one set of devices.
pub fn plan_redistribution(a: &Layout, b: &Layout) -> Result<Redistribution> {
    check_same_tensor(a, b)?;
    let mut src = Reshaped::new(a.clone());
    let mut tgt = Reshaped::new(b.clone());
    let mut prelude = Vec::new();
    let mut relaxed = Vec::new();
    let (source, target) = loop {
        let blocker = match try_unify(&src.view(), &tgt.view()) {
            Ok(pair) => break pair,
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
        let before = side.layout.clone();
        let k = before.tensor_map()[dim];
        let mut map = before.tensor_map().to_vec();
        map[dim] = -1;
        side.layout = before.with_map(map);
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
    let ops = plan_unified(&source, &target);
    let mut epilogue = Vec::new();
    let mut current = tgt.layout;
    for &(dim, k) in relaxed.iter().rev() {
        let mut map = current.tensor_map().to_vec();
        map[dim] = k;
        let after = current.with_map(map);
        epilogue.push(CommOp::new(OpKind::Slice, k as usize, dim, None, current));
        current = after;
    }
    debug_assert_eq!(&current, b);
    Ok(Redistribution {
        source,
        target,
        ops,
        prelude,
        epilogue,
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
