//! The paper's Algorithm 1 ([`Planner::Paper`](super::Planner::Paper)): the two layouts lined up
//! (unified, with all-gathers before and slices after where reshaping cannot line them up), then
//! slices, all-to-alls and all-gathers in a fixed order.

use std::borrow::Cow;

use super::ops::{group_step_cost, volume, CommOp, Objective, OpKind, Redistribution};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::topology::{self, rank_bits, Cluster, CostModel};
use crate::unify::{
    check_same_tensor, pieces_of, reshape_for, try_unify, Piece, Reshaped, Side, Unified,
};

/// Algorithm 1 from a unified layout to the unified target `t`: all-reduce the partial sums the
/// target does not keep, then slice what can be sliced and turn gather-then-slice pairs on one
/// device dim into all-to-alls until neither applies, then gather one dim that is split
/// differently in the target, and repeat. `step` gets each op (kind, device dim, tensor dim, dim
/// split by an all-to-all) with the layout before it; `current` is stepped in place so that
/// pricing the ops allocates nothing.
fn plan_unified(
    current: &mut Layout,
    t: &Layout,
    mut step: impl FnMut(OpKind, usize, Option<usize>, Option<usize>, &Layout),
) {
    let mut at = 0;
    while let Some(&k) = current.partial().get(at) {
        if t.partial().contains(&k) {
            at += 1;
        } else {
            step(OpKind::AllReduce, k, None, None, current);
            current.remove_partial(at);
        }
    }
    let t = t.tensor_map();
    // Tensor dims as bits (a unified layout has at most 64: each of its dims holds two elements
    // or more), so that each pass visits only the dims it may act on, in order: those the target
    // splits, and those whole in the current layout.
    debug_assert!(t.len() <= 64);
    let dims = |test: &dyn Fn(usize) -> bool| {
        (0..t.len())
            .filter(|&i| test(i))
            .fold(0u64, |mask, i| mask | 1 << i)
    };
    let all = dims(&|_| true);
    let wanted = dims(&|i| t[i] != -1);
    let mut whole = dims(&|i| current.tensor_map()[i] == -1);
    // The dims of `mask` from `i` on, in order, read afresh after each op.
    let next = |mask: u64, i: u32| (mask & u64::MAX.checked_shl(i).unwrap_or(0)).trailing_zeros();
    loop {
        loop {
            let mut progress = false;
            // A slice takes its own device dim only, which no other dim waits for: the dims to
            // slice are those of the pass's start.
            let mut todo = whole & wanted;
            while todo != 0 {
                let i = todo.trailing_zeros() as usize;
                todo &= todo - 1;
                if !current.uses(t[i] as usize) {
                    step(OpKind::Slice, t[i] as usize, Some(i), None, current);
                    current.set_map_entry(i, t[i]);
                    whole &= !(1 << i);
                    progress = true;
                }
            }
            // An all-to-all leaves the dim it takes the split from whole: a later one may take
            // it in the same pass.
            let mut i = next(whole & wanted, 0);
            while i < 64 {
                let at = i as usize;
                if current.uses(t[at] as usize) {
                    if let Some(j) = current.tensor_dim_on(t[at] as usize) {
                        step(OpKind::AllToAll, t[at] as usize, Some(j), Some(at), current);
                        current.set_map_entry(j, -1);
                        current.set_map_entry(at, t[at]);
                        whole = whole & !(1 << at) | 1 << j;
                        progress = true;
                    }
                }
                i = next(whole & wanted, i + 1);
            }
            if !progress {
                break;
            }
        }
        // Left over: dims split in the source and not the same way in the target. (A dim that
        // waits for a device dim held elsewhere would have been served by an all-to-all.)
        let m = current.tensor_map();
        let mut split = all & !whole;
        let gathered = loop {
            if split == 0 {
                break None;
            }
            let i = split.trailing_zeros() as usize;
            split &= split - 1;
            if m[i] != t[i] {
                break Some(i);
            }
        };
        let Some(i) = gathered else {
            break;
        };
        step(OpKind::AllGather, m[i] as usize, Some(i), None, current);
        current.set_map_entry(i, -1);
        whole |= 1 << i;
    }
    debug_assert_eq!(current.tensor_map(), t);
}

/// Two layouts made unifiable (the unified pair is left in the caller's [`Unified`]): the
/// fallback steps around the unified pair.
struct LinedUp {
    prelude: Vec<CommOp>,
    epilogue: Vec<CommOp>,
}

/// Unifies `a` with `b` into `unified`, reshaping and, where reshaping cannot line them up,
/// giving up splits. With `known`, the pieces of `a` and `b` ([`pieces_of`]) from a caller that
/// has checked that they are layouts of one tensor.
fn line_up(
    a: &Layout,
    b: &Layout,
    known: Option<(&[Piece], &[Piece])>,
    unified: &mut Unified,
) -> Result<LinedUp> {
    let (mut src, mut tgt) = if let Some((pa, pb)) = known {
        (Reshaped::with_pieces(a, pa), Reshaped::with_pieces(b, pb))
    } else {
        check_same_tensor(a, b)?;
        (Reshaped::new(a), Reshaped::new(b))
    };
    let mut prelude = Vec::new();
    let mut relaxed = Vec::new();
    loop {
        let blocker = match try_unify(&src, &tgt, unified) {
            Ok(()) => break,
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
    }
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
    Ok(LinedUp { prelude, epilogue })
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

/// Algorithm 1 on `a` and `b` as given.
///
/// # Errors
/// As [`plan_redistribution`](super::plan_redistribution).
pub(super) fn plan(a: &Layout, b: &Layout, objective: Objective<'_>) -> Result<Redistribution> {
    let on = match objective {
        Objective::Volume => None,
        Objective::Seconds {
            cluster,
            dtype_bytes,
        } => Some((cluster, dtype_bytes)),
    };
    let mut plan = lined_up(a, b, on)?;
    plan.ops = unified_ops(&plan.source, &plan.target);
    Ok(plan)
}

/// Algorithm 1's ops from the unified `source` to the unified `target`, each with the layout
/// before it.
pub(super) fn unified_ops(source: &Layout, target: &Layout) -> Vec<CommOp> {
    let mut ops = Vec::new();
    plan_unified(&mut source.clone(), target, |kind, k, i, to, l| {
        ops.push(CommOp::new(kind, k, i, to, l.clone()));
    });
    ops
}

/// What both forms of Algorithm 1 start from: `a` and `b` lined up ([`line_up`]), as a plan
/// with no ops yet, its partial sums checked and, when pricing on a cluster (with bytes per
/// element), its layouts checked against it.
pub(super) fn lined_up(
    a: &Layout,
    b: &Layout,
    on: Option<(&Cluster, f64)>,
) -> Result<Redistribution> {
    let mut unified = Unified::default();
    let mut source = Layout::scratch();
    let mut target = Layout::scratch();
    let lined = lined_up_into(a, b, None, on, &mut unified, &mut source, &mut target)?;
    Ok(Redistribution {
        source,
        target,
        ops: Vec::new(),
        prelude: lined.prelude,
        epilogue: lined.epilogue,
    })
}

/// [`lined_up`] in `scratch`'s buffers (the bounded tables line up tens of thousands of pairs,
/// each in the buffers of the last): the ops before the unified pair and after it; the pair is
/// [`Scratch::pair`].
pub(super) fn lined_up_in(
    a: &Layout,
    b: &Layout,
    scratch: &mut Scratch,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    let Scratch {
        unified,
        source,
        target,
        ..
    } = scratch;
    let lined = lined_up_into(a, b, None, None, unified, source, target)?;
    Ok((lined.prelude, lined.epilogue))
}

/// [`lined_up`] into the caller's buffers: the unified pair in `source` and `target`; `known` as
/// [`line_up`]'s.
fn lined_up_into(
    a: &Layout,
    b: &Layout,
    known: Option<(&[Piece], &[Piece])>,
    on: Option<(&Cluster, f64)>,
    unified: &mut Unified,
    source: &mut Layout,
    target: &mut Layout,
) -> Result<LinedUp> {
    let lined = line_up(a, b, known, unified)?;
    unified.layout_into(Side::First, source);
    unified.layout_into(Side::Second, target);
    check_partial(source, target, a, b)?;
    if let Some((cluster, dtype_bytes)) = on {
        topology::check_dtype_bytes(dtype_bytes)?;
        // Every layout of the plan has the source's device count.
        cluster.check(source)?;
    }
    Ok(lined)
}

/// The buffers one thread of the cost kernel prices pair after pair in.
pub(crate) struct Scratch {
    unified: Unified,
    source: Layout,
    target: Layout,
    /// The rank bits of each device dim of the unified pair ([`rank_bits`]).
    bits: Vec<u64>,
}

impl Scratch {
    /// The unified pair [`lined_up_in`] made last.
    pub(super) fn pair(&self) -> (&Layout, &Layout) {
        (&self.source, &self.target)
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            unified: Unified::default(),
            source: Layout::scratch(),
            target: Layout::scratch(),
            bits: Vec::new(),
        }
    }
}

/// A layout the batch kernel prices against many others, with what it works out for it once:
/// its pieces ([`pieces_of`]).
pub(crate) struct Prepared<'a> {
    layout: &'a Layout,
    pieces: Vec<Piece>,
}

impl<'a> Prepared<'a> {
    pub fn new(layout: &'a Layout) -> Self {
        Prepared {
            layout,
            pieces: pieces_of(layout),
        }
    }
}

/// `plan_redistribution(a, b, Planner::Paper, _)?.cost(cluster, dtype_bytes, model)`, bit for
/// bit, without building the ops of the unified pair, in `scratch`'s buffers: the batch
/// kernel's inner loop. Also the plan's elements received per device, summed as
/// [`Objective::Volume`] prices it (what the optimal planner compares under the volume model),
/// in the same pass. The caller has checked that `a` and `b` are layouts of one tensor
/// ([`check_same_tensor`]).
///
/// # Errors
/// As [`plan_redistribution`](super::plan_redistribution) and [`Redistribution::cost`].
pub(crate) fn cost(
    a: &Prepared<'_>,
    b: &Prepared<'_>,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    scratch: &mut Scratch,
) -> Result<(f64, f64)> {
    let Scratch {
        unified,
        source,
        target,
        bits,
    } = scratch;
    let lined = lined_up_into(
        a.layout,
        b.layout,
        Some((&a.pieces, &b.pieces)),
        Some((cluster, dtype_bytes)),
        unified,
        source,
        target,
    )?;
    // In plan order, from +0.0 as the plan's own sums.
    let add = |(cost, elements): (f64, f64), op: &CommOp| {
        Ok::<_, Error>((
            cost + op.cost(cluster, dtype_bytes, model)?,
            elements + op.volume() as f64,
        ))
    };
    let mut total = lined.prelude.iter().try_fold((0.0, 0.0), add)?;
    // Every layout of the unified plan has the source's device matrix (of at most 62 dims, each
    // of two devices or more): an op's group, the dims that hold distinct data and the shard
    // (the elements over the devices of the split dims, all powers of two) are read off the rank
    // bits of its dims.
    let matrix = source.device_matrix();
    bits.clear();
    bits.extend((0..matrix.len()).map(|k| rank_bits(matrix, |i| i == k)));
    let elements = source.num_elements();
    let bits_of = |mut dims: u64| {
        let mut mask = 0;
        while dims != 0 {
            mask |= bits[dims.trailing_zeros() as usize];
            dims &= dims - 1;
        }
        mask
    };
    plan_unified(source, target, |kind, k, _, _, l| {
        let split = bits_of(l.used_dims());
        let shard = elements >> split.count_ones();
        debug_assert_eq!(shard, l.shard_size());
        let volume = volume(kind, l.dim_size(k), shard);
        total.0 += group_step_cost(
            kind,
            bits[k],
            split | bits_of(l.partial_dims()),
            volume,
            cluster,
            dtype_bytes,
            model,
        );
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
        let plan = plan(&a, &b, Objective::Volume).unwrap();
        let steps: Vec<_> = plan
            .ops
            .iter()
            .map(|o| (o.kind(), o.device_dim(), o.tensor_dim(), o.to_tensor_dim()))
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

    /// Algorithm 1 as plain scans over the partial dims and every dim of the maps: the ops
    /// (kind, device dim, tensor dim, dim split) that the passes over dim masks must make, in
    /// the same order.
    fn scanned_ops(
        source: &Layout,
        target: &Layout,
    ) -> Vec<(OpKind, usize, Option<usize>, Option<usize>)> {
        let mut ops: Vec<_> = source
            .partial()
            .iter()
            .filter(|k| !target.partial().contains(k))
            .map(|&k| (OpKind::AllReduce, k, None, None))
            .collect();
        let mut m = source.tensor_map().to_vec();
        let t = target.tensor_map();
        let n = t.len();
        loop {
            loop {
                let mut progress = false;
                for i in 0..n {
                    if m[i] == -1 && t[i] != -1 && !m.contains(&t[i]) {
                        ops.push((OpKind::Slice, t[i] as usize, Some(i), None));
                        m[i] = t[i];
                        progress = true;
                    }
                }
                for i in 0..n {
                    if m[i] == -1 && t[i] != -1 {
                        if let Some(j) = m.iter().position(|&x| x == t[i]) {
                            ops.push((OpKind::AllToAll, t[i] as usize, Some(j), Some(i)));
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
            let Some(i) = (0..n).find(|&i| m[i] != -1 && m[i] != t[i]) else {
                return ops;
            };
            ops.push((OpKind::AllGather, m[i] as usize, Some(i), None));
            m[i] = -1;
        }
    }

    /// Every unified pair of the layouts of 96 elements on 8 devices, and of some of them with
    /// partial sums on unused device dims: the passes over dim masks make the scans' ops.
    #[test]
    fn passes_over_dim_masks_are_the_scans() {
        let mut layouts = crate::batch::tests::layouts_of_96();
        layouts.extend(crate::batch::tests::partial_sums_of(&layouts, 7));
        let (mut ops, mut reduced) = (0, 0);
        for a in &layouts {
            for b in &layouts {
                // (A target may not hold partial sums its source does not.)
                let Ok(plan) = lined_up(a, b, None) else {
                    continue;
                };
                let got: Vec<_> = unified_ops(&plan.source, &plan.target)
                    .iter()
                    .map(|o| (o.kind(), o.device_dim(), o.tensor_dim(), o.to_tensor_dim()))
                    .collect();
                assert_eq!(
                    got,
                    scanned_ops(&plan.source, &plan.target),
                    "{a:?} to {b:?}"
                );
                ops += got.len();
                reduced += got.iter().filter(|o| o.0 == OpKind::AllReduce).count();
            }
        }
        assert!(ops > 30_000 && reduced > 1_000, "{ops} {reduced}");
    }

    #[test]
    fn identical_layouts_need_nothing() {
        let a = layout(&[8, 8], &[2, 4], &[0, 1]);
        assert!(plan(&a, &a, Objective::Volume).unwrap().ops.is_empty());
    }

    #[test]
    fn misaligned_reshape_falls_back_to_a_gather() {
        let a = layout(&[6, 16], &[16], &[-1, 0]);
        let b = layout(&[96], &[16], &[0]);
        let plan = plan(&a, &b, Objective::Volume).unwrap();
        assert!(!plan.prelude.is_empty() || !plan.epilogue.is_empty());
        // Never more than gathering everything: 15 * 6 elements per device.
        assert!(plan.volume().unwrap() <= 15 * 6);
    }
}
