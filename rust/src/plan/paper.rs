//! The paper's Algorithm 1 ([`Planner::Paper`](super::Planner::Paper)): the two layouts lined up
//! (unified, with all-gathers before and slices after where reshaping cannot line them up), then
//! slices, all-to-alls and all-gathers in a fixed order.

use std::borrow::Cow;

use super::ops::{group_step_cost, volume, CommOp, Objective, OpKind, Redistribution};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::topology::{self, rank_bits, Cluster, CostModel};
use crate::unify::{check_same_tensor, reshape_for, try_unify, Reshaped, Side, Start, Unified};

/// A unified layout as Algorithm 1 steps through it, in rank bits (a device dim of `d` devices
/// holds `log2(d)` bits of the rank, [`rank_bits`]; every dim of a unified layout has two devices
/// or more, so each has bits of its own): per tensor dim the bits of the device dim that splits
/// it (0 if it is whole), the bits of every dim the map uses, and those of the dims holding
/// partial sums. A step's price needs no more, and the cost kernel reads these off the unified
/// pieces without building the pair's layouts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Maps {
    map: Vec<u64>,
    used: u64,
    partial: u64,
}

impl Maps {
    /// The maps of `layout`, whose device dim `k` holds the rank bits `dims[k]`.
    fn of(layout: &Layout, dims: &[u64]) -> Self {
        let mut maps = Maps::default();
        let map = layout.tensor_map().iter();
        maps.refill(
            map.map(|&k| usize::try_from(k).map_or(0, |k| dims[k])),
            layout.partial().iter().fold(0, |mask, &k| mask | dims[k]),
        );
        maps
    }

    /// Refills the maps from the bits of each tensor dim's split and of the partial dims.
    pub(crate) fn refill(&mut self, map: impl Iterator<Item = u64>, partial: u64) {
        self.map.clear();
        self.map.extend(map);
        self.used = self.map.iter().fold(0, |mask, &bits| mask | bits);
        self.partial = partial;
    }

    /// Splits tensor dim `i` along the device dim of rank bits `bits` (0: none); the caller
    /// frees a device dim before another tensor dim takes it.
    fn set(&mut self, i: usize, bits: u64) {
        self.used = self.used & !self.map[i] | bits;
        self.map[i] = bits;
    }

    /// The layout of these maps on the shape and device matrix of `like`, whose device dim `k`
    /// holds the rank bits `dims[k]`.
    fn layout(&self, like: &Layout, dims: &[u64]) -> Layout {
        let dim = |bits: u64| dims.iter().position(|&d| d == bits);
        let map = self
            .map
            .iter()
            .map(|&bits| dim(bits).map_or(-1, |k| k as i64))
            .collect();
        let partial = (0..dims.len())
            .filter(|&k| self.partial & dims[k] != 0)
            .collect();
        Layout::from_parts(
            like.shape().to_vec(),
            like.device_matrix().to_vec(),
            map,
            partial,
        )
    }
}

/// Algorithm 1 from a unified layout to the unified target `t`, whose device dim `k` holds the
/// rank bits `dims[k]`: all-reduce the partial sums the target does not keep, then slice what
/// can be sliced and turn gather-then-slice pairs on one device dim into all-to-alls until
/// neither applies, then gather one dim that is split differently in the target, and repeat.
/// `step` gets each op (kind, the rank bits of its device dim, tensor dim, dim split by an
/// all-to-all) with the maps before it; `current` is stepped in place so that pricing the ops
/// allocates nothing.
fn plan_unified(
    current: &mut Maps,
    t: &Maps,
    dims: &[u64],
    mut step: impl FnMut(OpKind, u64, Option<usize>, Option<usize>, &Maps),
) {
    // One partial dim at a time, innermost first.
    for &bits in dims {
        if current.partial & bits != 0 && t.partial & bits == 0 {
            step(OpKind::AllReduce, bits, None, None, current);
            current.partial &= !bits;
        }
    }
    let t = &t.map;
    // Tensor dims as bits (a unified layout has at most 64: each of its dims holds two elements
    // or more), so that each pass visits only the dims it may act on, in order: those the target
    // splits, and those whole in the current layout.
    debug_assert!(t.len() <= 64);
    let tensor_dims = |test: &dyn Fn(usize) -> bool| {
        (0..t.len())
            .filter(|&i| test(i))
            .fold(0u64, |mask, i| mask | 1 << i)
    };
    let all = tensor_dims(&|_| true);
    let wanted = tensor_dims(&|i| t[i] != 0);
    let mut whole = tensor_dims(&|i| current.map[i] == 0);
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
                if current.used & t[i] == 0 {
                    step(OpKind::Slice, t[i], Some(i), None, current);
                    current.set(i, t[i]);
                    whole &= !(1 << i);
                    progress = true;
                }
            }
            // An all-to-all leaves the dim it takes the split from whole: a later one may take
            // it in the same pass.
            let mut i = next(whole & wanted, 0);
            while i < 64 {
                let at = i as usize;
                if current.used & t[at] != 0 {
                    if let Some(j) = current.map.iter().position(|&bits| bits == t[at]) {
                        step(OpKind::AllToAll, t[at], Some(j), Some(at), current);
                        current.set(j, 0);
                        current.set(at, t[at]);
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
        let m = &current.map;
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
        step(OpKind::AllGather, m[i], Some(i), None, current);
        current.set(i, 0);
        whole |= 1 << i;
    }
    debug_assert_eq!(&current.map, t);
}

/// Two layouts made unifiable (the unified pair is left in the caller's [`Unified`]): the
/// fallback steps around the unified pair.
struct LinedUp {
    prelude: Vec<CommOp>,
    epilogue: Vec<CommOp>,
}

/// Unifies `a` with `b` into `unified`, reshaping and, where reshaping cannot line them up,
/// giving up splits, and checks that the target keeps only partial sums the source has. With
/// `known`, the starts of `a` and `b` ([`Start::of`]) from a caller that has checked that they
/// are layouts of one tensor.
fn line_up(
    a: &Layout,
    b: &Layout,
    known: Option<(&Start, &Start)>,
    unified: &mut Unified,
) -> Result<LinedUp> {
    let (mut src, mut tgt) = if let Some((pa, pb)) = known {
        (Reshaped::with_start(a, pa), Reshaped::with_start(b, pb))
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
    check_partial(unified, a, b)?;
    Ok(LinedUp { prelude, epilogue })
}

/// The target may keep partial sums the source has, but no step creates them: checked on the
/// rank bits of the unified pair's partial dims ([`Unified::partial`]; each dim of the unified
/// device matrix lies in or out of each side's partial bits).
fn check_partial(unified: &Unified, a: &Layout, b: &Layout) -> Result<()> {
    let (source, target) = unified.partial();
    if target & !source == 0 {
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
    let matrix = source.device_matrix();
    debug_assert!(matrix.iter().all(|&d| d > 1), "a unified device matrix");
    let dims: Vec<u64> = (0..matrix.len())
        .map(|k| rank_bits(matrix, |i| i == k))
        .collect();
    let mut ops = Vec::new();
    let mut current = Maps::of(source, &dims);
    plan_unified(
        &mut current,
        &Maps::of(target, &dims),
        &dims,
        |kind, bits, i, to, m| {
            let k = dims
                .iter()
                .position(|&d| d == bits)
                .expect("a device dim's bits");
            ops.push(CommOp::new(kind, k, i, to, m.layout(source, &dims)));
        },
    );
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
    let mut scratch = LineUp::default();
    let (prelude, epilogue) = lined_up_in(a, b, &mut scratch)?;
    let LineUp { source, target, .. } = scratch;
    if let Some((cluster, dtype_bytes)) = on {
        topology::check_dtype_bytes(dtype_bytes)?;
        // Every layout of the plan has the source's device count.
        cluster.check(&source)?;
    }
    Ok(Redistribution {
        source,
        target,
        ops: Vec::new(),
        prelude,
        epilogue,
    })
}

/// The buffers the bounded tables line pairs up in, pair after pair (tens of thousands of them,
/// each in the buffers of the last).
pub(crate) struct LineUp {
    unified: Unified,
    source: Layout,
    target: Layout,
}

impl Default for LineUp {
    fn default() -> Self {
        LineUp {
            unified: Unified::default(),
            source: Layout::scratch(),
            target: Layout::scratch(),
        }
    }
}

impl LineUp {
    /// The unified pair [`lined_up_in`] made last.
    pub(super) fn pair(&self) -> (&Layout, &Layout) {
        (&self.source, &self.target)
    }
}

/// [`lined_up`] in `scratch`'s buffers, without the cluster's checks: the ops before the unified
/// pair and after it; the pair is [`LineUp::pair`].
pub(super) fn lined_up_in(
    a: &Layout,
    b: &Layout,
    scratch: &mut LineUp,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    line_up_into(a, b, None, scratch)
}

/// [`lined_up_in`] of two layouts prepared once each, which the caller has checked are layouts
/// of one tensor: the bounded tables line up every pair of their canonical forms.
pub(crate) fn lined_up_prepared(
    a: &Prepared<'_>,
    b: &Prepared<'_>,
    scratch: &mut LineUp,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    line_up_into(a.layout, b.layout, Some((&a.start, &b.start)), scratch)
}

/// [`line_up`] into `scratch`'s buffers.
fn line_up_into(
    a: &Layout,
    b: &Layout,
    known: Option<(&Start, &Start)>,
    scratch: &mut LineUp,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    let LineUp {
        unified,
        source,
        target,
    } = scratch;
    let lined = line_up(a, b, known, unified)?;
    unified.layout_into(Side::First, source);
    unified.layout_into(Side::Second, target);
    Ok((lined.prelude, lined.epilogue))
}

/// The buffers one thread of the cost kernel prices pair after pair in.
#[derive(Default)]
pub(crate) struct Scratch {
    unified: Unified,
    source: Maps,
    target: Maps,
    /// The rank bits of each device dim of the unified pair.
    dims: Vec<u64>,
}

/// A layout the batch kernel prices against many others, with what it works out for it once:
/// its start of unification ([`Start::of`]) and its elements.
pub(crate) struct Prepared<'a> {
    layout: &'a Layout,
    start: Start,
    elements: u64,
}

impl<'a> Prepared<'a> {
    pub fn new(layout: &'a Layout) -> Self {
        Prepared {
            layout,
            start: Start::of(layout),
            elements: layout.num_elements(),
        }
    }
}

/// `plan_redistribution(a, b, Planner::Paper, _)?.cost(cluster, dtype_bytes, model)`, bit for
/// bit, without building the ops or the layouts of the unified pair, in `scratch`'s buffers: the
/// batch kernel's inner loop. With `elements`, also the plan's elements received per device,
/// summed as [`Objective::Volume`] prices it (what the optimal planner compares under the volume
/// model), in the same pass (0 without). The caller has checked that `a` and `b` are layouts of one tensor
/// ([`check_same_tensor`]) on the cluster's devices, and that `dtype_bytes` is positive.
///
/// # Errors
/// As [`plan_redistribution`](super::plan_redistribution) and [`Redistribution::cost`].
pub(crate) fn cost(
    a: &Prepared<'_>,
    b: &Prepared<'_>,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    elements: bool,
    scratch: &mut Scratch,
) -> Result<(f64, f64)> {
    let Scratch {
        unified,
        source,
        target,
        dims,
    } = scratch;
    let lined = line_up(a.layout, b.layout, Some((&a.start, &b.start)), unified)?;
    // In plan order, from +0.0 as the plan's own sums.
    // (The elements only when asked for: a u64 to f64 conversion per op is worth skipping.)
    let add = |(cost, received): (f64, f64), op: &CommOp| {
        let volume = if elements { op.volume() as f64 } else { 0.0 };
        Ok::<_, Error>((
            cost + op.cost(cluster, dtype_bytes, model)?,
            received + volume,
        ))
    };
    let mut total = lined.prelude.iter().try_fold((0.0, 0.0), add)?;
    // An op's group, the bits that hold distinct data and the shard (the elements over the
    // devices of the split dims, all powers of two) are read off the rank bits of its dims.
    let (first, second) = unified.partial();
    source.refill(unified.split_bits(Side::First), first);
    target.refill(unified.split_bits(Side::Second), second);
    dims.clear();
    dims.extend(unified.dim_bits());
    plan_unified(source, target, dims, |kind, bits, _, _, m| {
        let shard = a.elements >> m.used.count_ones();
        let volume = volume(kind, 1 << bits.count_ones(), shard);
        total.0 += group_step_cost(
            kind,
            bits,
            m.used | m.partial,
            volume,
            cluster,
            dtype_bytes,
            model,
        );
        if elements {
            total.1 += volume as f64;
        }
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
