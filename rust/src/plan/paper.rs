//! The paper's Algorithm 1 ([`Planner::Paper`](super::Planner::Paper)): the two layouts lined up
//! (unified, with all-gathers before and slices after where reshaping cannot line them up), then
//! slices, all-to-alls and all-gathers in a fixed order.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::ops::{group_step_cost, volume, CommOp, Objective, OpKind, Redistribution};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::topology::{self, rank_bits, Cluster, CostModel};
use crate::unify::{
    check_same_tensor, reshape_for, try_unify, unify_bits, Bits, BitsPair, DeviceBounds, Reshaped,
    Side, Splits, Start, Unified,
};

/// A unified layout as Algorithm 1 steps through it, in rank bits (a device dim of `d` devices
/// holds `log2(d)` bits of the rank, [`rank_bits`]; every dim of a unified layout has two devices
/// or more, so each has bits of its own): per tensor dim the bits of the device dim that splits
/// it (0 if it is whole), the bits of every dim the map uses, and those of the dims holding
/// partial sums. A step's price needs no more, and the cost kernel reads these off the unified
/// pieces without building the pair's layouts.
#[derive(Debug, Clone)]
pub(crate) struct Maps {
    /// Per tensor dim, those of `dims`, the rank bits of its split (a unified layout has at most
    /// 64 tensor dims: each holds two elements or more). In place, not in a vector: the kernel
    /// fills and steps millions of them, with no capacity or bounds to check.
    map: [u64; 64],
    /// The tensor dims, as bits: the first `n` for maps filled a dim at a time ([`Maps::push`]),
    /// or those the line-up by masks numbers ([`unify_bits`]), in the same order, with gaps (the
    /// entries there are stale; Algorithm 1 visits only these dims).
    dims: u64,
    /// Per rank bit, the tensor dim whose split the device dim starting at it is, while one is
    /// (the entry of a device dim no dim uses is stale; the last is that of a whole dim's `0`).
    /// The maps of a unified pair are on one device matrix, so a target's split that the current
    /// layout uses is one of its dims' splits, which an all-to-all reads here.
    owner: [u8; 65],
    used: u64,
    partial: u64,
    /// The tensor dims that are split, as bits, as filled: Algorithm 1's passes read it once and
    /// track the dims they change themselves (their steps leave it alone).
    split: u64,
}

impl Default for Maps {
    fn default() -> Self {
        Maps {
            map: [0; 64],
            dims: 0,
            owner: [0; 65],
            used: 0,
            partial: 0,
            split: 0,
        }
    }
}

impl Maps {
    /// Per tensor dim, the rank bits of its split (of maps filled a dim at a time).
    fn map(&self) -> &[u64] {
        &self.map[..self.dims.count_ones() as usize]
    }

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
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(crate) fn refill(&mut self, map: impl Iterator<Item = u64>, partial: u64) {
        self.restart(partial);
        for bits in map {
            self.push(bits);
        }
    }

    /// Empties the maps, the bits of `partial` holding partial sums.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn restart(&mut self, partial: u64) {
        (self.dims, self.used, self.split, self.partial) = (0, 0, 0, partial);
    }

    /// Appends a tensor dim split along the rank bits `bits` (0: whole).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn push(&mut self, bits: u64) {
        let dim = self.dims.count_ones() as usize;
        self.used |= bits;
        self.split |= u64::from(bits != 0) << dim;
        self.map[dim] = bits;
        self.owner[bits.trailing_zeros() as usize] = dim as u8;
        self.dims |= 1 << dim;
    }

    /// The tensor dims these maps split as `t` does, as bits.
    fn settled(&self, t: &Maps) -> u64 {
        (0..self.map().len()).fold(0, |settled, i| {
            settled | u64::from(self.map[i] != 0 && self.map[i] == t.map[i]) << i
        })
    }

    /// The maps of a unified pair lined up by masks ([`unify_bits`]), here and in the target's
    /// maps `target` (a target's owners are not kept), each side's used bits and partial dims
    /// `used` and `partial` (those of its own maps, [`Prepared`]'s: every split of a side lies in
    /// a dim handed over). A dim split the same way on both sides is left out: Algorithm 1 never
    /// acts on it (no other dim of the target takes its device dim). Without a branch (whether the
    /// two are equal is hard to predict): each dim is written, and kept if the two differ. Per
    /// dim, no count and no split masks to keep: the dims are numbered by the line-up, and each
    /// side's split dims are its [`Bits::split_dims`] among those kept.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn fill_lined_up(
        &mut self,
        target: &mut Maps,
        (x, y): (&Bits, &Bits),
        used: (u64, u64),
        partial: (u64, u64),
    ) -> Option<DeviceBounds> {
        let mut differ = 0;
        let device = unify_bits(x, y, |dim, s, t| {
            // (Masked: the line-up numbers dims below 64, and the mask is cheaper than a
            // bounds check per dim.)
            let dim = dim & 63;
            self.map[dim] = s;
            self.owner[s.trailing_zeros() as usize] = dim as u8;
            target.map[dim] = t;
            differ |= u64::from(s != t) << dim;
        })?;
        (self.dims, self.used, self.split, self.partial) =
            (differ, used.0, x.split_dims() & differ, partial.0);
        (target.dims, target.used, target.split, target.partial) =
            (differ, used.1, y.split_dims() & differ, partial.1);
        Some(device)
    }

    /// `other`'s maps, in this one's buffer.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn copy_from(&mut self, other: &Maps) {
        self.map[..other.map().len()].copy_from_slice(other.map());
        self.owner = other.owner;
        self.dims = other.dims;
        (self.used, self.partial, self.split) = (other.used, other.partial, other.split);
    }

    /// Splits the whole tensor dim `i` along the free device dim of rank bits `bits` (a slice).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn slice(&mut self, i: usize, bits: u64) {
        self.used |= bits;
        self.map[i] = bits;
        self.owner[bits.trailing_zeros() as usize] = i as u8;
    }

    /// Moves the split of tensor dim `from` to the whole tensor dim `to` (an all-to-all): the
    /// same device dim stays used.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn move_split(&mut self, from: usize, to: usize) {
        let bits = self.map[from];
        (self.map[from], self.map[to]) = (0, bits);
        self.owner[bits.trailing_zeros() as usize] = to as u8;
    }

    /// Leaves tensor dim `i` whole (a gather), freeing its device dim.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn gather(&mut self, i: usize) {
        self.used &= !self.map[i];
        self.map[i] = 0;
    }

    /// The layout of these maps on the shape and device matrix of `like`, whose device dim `k`
    /// holds the rank bits `dims[k]`.
    fn layout(&self, like: &Layout, dims: &[u64]) -> Layout {
        let dim = |bits: u64| dims.iter().position(|&d| d == bits);
        let map = self
            .map()
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

/// What Algorithm 1's passes hand each op to ([`plan_unified`]): a closure, or the cost
/// kernel's [`Pricer`] (a closure there would be a function of its own, compiled without the
/// kernel's newer instructions).
trait Step {
    fn step(&mut self, kind: OpKind, bits: u64, i: Option<usize>, to: Option<usize>, m: &Maps);
}

impl<F: FnMut(OpKind, u64, Option<usize>, Option<usize>, &Maps)> Step for F {
    fn step(&mut self, kind: OpKind, bits: u64, i: Option<usize>, to: Option<usize>, m: &Maps) {
        self(kind, bits, i, to, m);
    }
}

/// Algorithm 1 from a unified layout to the unified target `t`, on the device dims between the
/// boundaries `bounds` (bit `b` set for a boundary at rank bit `b`): all-reduce the partial sums
/// the target does not keep, then slice what can be sliced and turn gather-then-slice pairs on one
/// device dim into all-to-alls until neither applies, then gather one dim that is split differently
/// in the target, and repeat. `step` gets each op (kind, the rank bits of its device dim, tensor
/// dim, dim split by an all-to-all) with the maps before it; `current` is stepped in place so that
/// pricing the ops allocates nothing. `settled` holds the dims `current` already splits as `t`
/// does ([`Maps::settled`]; the kernel's unification by masks leaves such dims out, so it
/// knows there are none).
#[allow(clippy::inline_always)]
#[inline(always)]
fn plan_unified(
    current: &mut Maps,
    t: &Maps,
    bounds: DeviceBounds,
    mut settled: u64,
    step: &mut impl Step,
) {
    // One partial dim at a time, innermost first: each device dim is partial or not as a whole.
    let mut reduced = current.partial & !t.partial;
    while reduced != 0 {
        let lo = reduced.trailing_zeros();
        let above = bounds & !((2 << lo) - 1);
        let bits = (above & above.wrapping_neg()) - (1 << lo);
        step.step(OpKind::AllReduce, bits, None, None, current);
        current.partial &= !bits;
        reduced &= !bits;
    }
    // Tensor dims as bits, so that each pass visits only the dims it may act on, in order: those
    // the target splits, and those whole in the current layout.
    let (wanted, split, all) = (t.split, current.split, t.dims);
    let t = &t.map;
    let mut whole = all & !split;
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
                    step.step(OpKind::Slice, t[i], Some(i), None, current);
                    current.slice(i, t[i]);
                    whole &= !(1 << i);
                    settled |= 1 << i;
                    progress = true;
                }
            }
            // An all-to-all leaves the dim it takes the split from whole: a later one may take
            // it in the same pass (the dims after the last visited are read afresh after each op).
            let mut todo = whole & wanted;
            while todo != 0 {
                let at = todo.trailing_zeros() as usize;
                if current.used & t[at] != 0 {
                    let j = usize::from(current.owner[t[at].trailing_zeros() as usize]);
                    debug_assert_eq!(current.map[j], t[at]);
                    step.step(OpKind::AllToAll, t[at], Some(j), Some(at), current);
                    current.move_split(j, at);
                    whole = whole & !(1 << at) | 1 << j;
                    settled |= 1 << at;
                    progress = true;
                }
                // (`at` is below 64: the mask of the dims above it needs no check of the shift.)
                todo = whole & wanted & (u64::MAX - 1) << at;
            }
            if !progress {
                break;
            }
        }
        // Left over: dims split in the source and not the same way in the target. (A dim that
        // waits for a device dim held elsewhere would have been served by an all-to-all.) A dim
        // a slice or an all-to-all split as the target does stays so: no all-to-all takes its
        // split (no other dim of the target has its device dim), and no gather does.
        let left = all & !whole & !settled;
        if left == 0 {
            break;
        }
        let i = left.trailing_zeros() as usize;
        debug_assert!((0..64)
            .filter(|k| all >> k & 1 == 1)
            .all(|k| (settled >> k & 1 == 1) == (current.map[k] != 0 && current.map[k] == t[k])));
        step.step(OpKind::AllGather, current.map[i], Some(i), None, current);
        current.gather(i);
        whole |= 1 << i;
    }
    debug_assert!((0..64)
        .filter(|k| all >> k & 1 == 1)
        .all(|k| current.map[k] == t[k]));
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
    check_partial(unified.partial(), a, b)?;
    Ok(LinedUp { prelude, epilogue })
}

/// The target may keep partial sums the source has, but no step creates them: checked on the
/// rank bits of the unified pair's partial dims ([`Unified::partial`]; each dim of the unified
/// device matrix lies in or out of each side's partial bits).
fn check_partial((source, target): (u64, u64), a: &Layout, b: &Layout) -> Result<()> {
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
    // The boundaries between the device dims: the lowest bit of each, and the top.
    let bounds = dims
        .iter()
        .fold(1, |bounds, &d| bounds | (d + (d & d.wrapping_neg())));
    let mut current = Maps::of(source, &dims);
    let target = Maps::of(target, &dims);
    let settled = current.settled(&target);
    plan_unified(
        &mut current,
        &target,
        bounds,
        settled,
        &mut |kind, bits, i, to, m: &Maps| {
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
    scratch.pair();
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
/// each in the buffers of the last), of layouts prepared for `'p` ([`lined_up_prepared`]).
pub(crate) struct LineUp<'p> {
    unified: Unified,
    /// The pair lined up last, if by masks: not laid out in `unified` until asked for
    /// ([`LineUp::unified`]; the cheap bounds read it off the masks, [`LineUp::splits_into`]).
    by_bits: Option<BitsPair<'p>>,
    source: Layout,
    target: Layout,
    /// Whether `source` and `target` are `unified`'s layouts: built when asked for
    /// ([`LineUp::pair`]), as the cheap bounds read the unified pair without them (building
    /// both was half the work of lining a pair up).
    built: bool,
}

impl Default for LineUp<'_> {
    fn default() -> Self {
        LineUp {
            unified: Unified::default(),
            by_bits: None,
            source: Layout::scratch(),
            target: Layout::scratch(),
            built: false,
        }
    }
}

impl LineUp<'_> {
    /// The layouts of the unified pair [`lined_up_in`] made last.
    pub(crate) fn pair(&mut self) -> (&Layout, &Layout) {
        if !self.built {
            self.unified();
            self.unified.layout_into(Side::First, &mut self.source);
            self.unified.layout_into(Side::Second, &mut self.target);
            self.built = true;
        }
        (&self.source, &self.target)
    }

    /// The unified pair [`lined_up_in`] made last.
    pub(crate) fn unified(&mut self) -> &Unified {
        if let Some(pair) = self.by_bits.take() {
            pair.unified_into(&mut self.unified);
        }
        &self.unified
    }

    /// The device boundaries of the unified pair made last.
    pub(crate) fn device(&self) -> DeviceBounds {
        self.by_bits
            .as_ref()
            .map_or(self.unified.device(), BitsPair::device)
    }

    /// [`Unified::splits_into`] of the unified pair made last (off the masks if lined up so).
    pub(crate) fn splits_into(&self, dim_at: &[i8; 64], splits: &mut Vec<(i8, i8)>) -> Splits {
        match &self.by_bits {
            Some(pair) => pair.splits_into(dim_at, splits),
            None => self.unified.splits_into(dim_at, splits),
        }
    }
}

/// [`lined_up`] in `scratch`'s buffers, without the cluster's checks: the ops before the unified
/// pair and after it; the pair is [`LineUp::pair`].
pub(super) fn lined_up_in(
    a: &Layout,
    b: &Layout,
    scratch: &mut LineUp<'_>,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    line_up_into(a, b, None, scratch)
}

/// [`lined_up_in`] of two layouts prepared once each, which the caller has checked are layouts
/// of one tensor: the bounded tables line up every pair of their canonical forms.
pub(crate) fn lined_up_prepared<'p>(
    a: &'p Prepared<'_>,
    b: &'p Prepared<'_>,
    scratch: &mut LineUp<'p>,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    // A pair that unifies by masks needs no cut, and no step around it.
    if let (Some(x), Some(y)) = (&a.bits, &b.bits) {
        if let Some(pair) = BitsPair::of((&a.start, x), (&b.start, y)) {
            check_partial(pair.partial(), a.layout, b.layout)?;
            scratch.by_bits = Some(pair);
            scratch.built = false;
            return Ok((Vec::new(), Vec::new()));
        }
    }
    line_up_into(a.layout, b.layout, Some((&a.start, &b.start)), scratch)
}

/// [`line_up`] into `scratch`'s buffers.
fn line_up_into(
    a: &Layout,
    b: &Layout,
    known: Option<(&Start, &Start)>,
    scratch: &mut LineUp<'_>,
) -> Result<(Vec<CommOp>, Vec<CommOp>)> {
    let lined = line_up(a, b, known, &mut scratch.unified)?;
    scratch.by_bits = None;
    scratch.built = false;
    Ok((lined.prelude, lined.epilogue))
}

/// The buffers one thread of the cost kernel prices pair after pair in: a job takes its
/// thread's ([`Scratch::kept`]), its step prices forgotten.
pub(crate) struct Scratch {
    unified: Unified,
    source: Maps,
    target: Maps,
    prices: StepPrices,
    /// Whether the processor counts and finds bits in one instruction ([`has_bit_ops`]): looked
    /// up once per thread, not per pair.
    bit_ops: bool,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            unified: Unified::default(),
            source: Maps::default(),
            target: Maps::default(),
            prices: StepPrices::new(),
            bit_ops: has_bit_ops(),
        }
    }
}

thread_local! {
    /// This thread's [`Scratch`] between jobs: each job allocated and zeroed its own (its step
    /// prices' table is 24 KB: 7 of AlexNet 16's 170 million instructions of an optimal search).
    static KEPT: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

/// A thread's [`Scratch`] taken for a job ([`Scratch::kept`]), given back to the thread when
/// dropped (moved out, not swapped for a new one: a new one is the allocation kept away).
pub(crate) struct KeptScratch(Option<Scratch>);

impl KeptScratch {
    /// The scratch.
    pub(crate) fn get(&mut self) -> &mut Scratch {
        self.0.get_or_insert_with(Scratch::default)
    }
}

impl Drop for KeptScratch {
    fn drop(&mut self) {
        if let Some(scratch) = self.0.take() {
            // (Not at the thread's exit: its scratch is gone then.)
            let _ = KEPT.try_with(|kept| *kept.borrow_mut() = Some(scratch));
        }
    }
}

impl Scratch {
    /// This thread's scratch for a job, its step prices forgotten (they are of the last job's
    /// cluster, element size and cost model); a new one where the thread has none (or another
    /// job on the thread holds it).
    pub(crate) fn kept() -> KeptScratch {
        let mut scratch = KEPT
            .try_with(|kept| kept.borrow_mut().take())
            .ok()
            .flatten()
            .unwrap_or_default();
        scratch.prices.forget();
        KeptScratch(Some(scratch))
    }
}

/// Whether the processor has `popcnt`, `lzcnt` and the BMI sets (x86-64 since 2013): the baseline
/// x86-64 target that wheels are built for has none of them, and counts a mask's bits in a dozen
/// instructions.
fn has_bit_ops() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("popcnt")
            && std::arch::is_x86_feature_detected!("lzcnt")
            && std::arch::is_x86_feature_detected!("bmi1")
            && std::arch::is_x86_feature_detected!("bmi2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A layout the batch kernel prices against many others, with what it works out for it once:
/// its start of unification ([`Start::of`]), the maps of its pieces (those of a pair that needs
/// no cut, [`Start::uncut`]), its bits if its tensor has a power-of-two count of elements
/// ([`Bits`]), and its elements.
pub(crate) struct Prepared<'a> {
    layout: &'a Layout,
    start: Start,
    maps: Maps,
    bits: Option<Bits>,
    elements: u64,
}

impl<'a> Prepared<'a> {
    /// The layout prepared.
    pub(crate) fn layout(&self) -> &'a Layout {
        self.layout
    }

    pub fn new(layout: &'a Layout) -> Self {
        let start = Start::of(layout);
        let mut maps = Maps::default();
        maps.refill(start.split_bits(), start.partial());
        let elements = layout.num_elements();
        Prepared {
            layout,
            bits: Bits::of(&start, elements),
            start,
            maps,
            elements,
        }
    }
}

/// The prices of the steps one thread of the kernel has met in one call, direct-mapped (a slot
/// keeps the last step hashed to it), a table per kind: a step's price walks the cluster's levels
/// and divides twice, and a table's steps repeat (a few groups, dims and shards). A step's price
/// depends on the rank bits of its group, those of the dims holding distinct data, and its shard
/// (its elements per device before it, which with the group and the kind make its volume); the
/// shard is the tensor's elements over the devices of the used dims, so for one tensor the count
/// of used bits stands for it, and the three pack into one word ([`StepPrices::key`]). A kind
/// known where Algorithm 1 takes the step picks its table, not a key word.
struct StepPrices {
    slots: Vec<(u64, f64)>,
    /// The tensor whose steps the table holds, by its elements (those of a call's runs).
    elements: u64,
    /// All ones if the cluster's rank bits fit a key ([`StepPrices::BITS`]), else 0: every key
    /// is that of no step, and nothing is kept.
    keys: u64,
    /// The bits above a key's that mark the steps of this tensor ([`StepPrices::TAG`]): the
    /// slots of another tensor's steps read as empty without being cleared (clearing the table
    /// for each tensor of a call was another 7 million of AlexNet 16's instructions).
    tag: u64,
}

impl StepPrices {
    /// Slots per kind, a power of two.
    const SLOTS: usize = 256;
    /// Rank bits a key holds: those of clusters of up to 2^21 devices.
    const BITS: u32 = 21;
    /// The lowest bit of a key's tag, above its group's and distinct dims' rank bits and its
    /// count of used bits (at most `BITS`: five bits).
    const TAG: u32 = 2 * Self::BITS + 5;

    /// No step: a step's group has bits (a unified device dim has two devices or more), so no
    /// key is 0.
    fn new() -> Self {
        let kinds = OpKind::CollectivePermute as usize + 1;
        StepPrices {
            slots: vec![(0, 0.0); kinds * Self::SLOTS],
            elements: 0,
            keys: 0,
            tag: 0,
        }
    }

    /// Ready for the steps of a run's pairs: its tensor of `elements` on `cluster`, the steps of
    /// another tensor forgotten (the shard is not in the key).
    fn prepare(&mut self, elements: u64, cluster: &Cluster) {
        if self.elements != elements {
            self.forget();
            self.elements = elements;
        }
        self.keys = if cluster.num_devices() <= 1 << Self::BITS {
            u64::MAX
        } else {
            0
        };
    }

    /// Every step priced so far forgotten: a new tag, the table cleared only when the tags wrap
    /// (a slot tagged before would read as this tag's).
    fn forget(&mut self) {
        self.tag = self.tag.wrapping_add(1 << Self::TAG);
        if self.tag == 0 {
            self.slots.fill((0, 0.0));
        }
    }

    /// A step's key: its group's and distinct dims' rank bits (under `2^BITS` when they fit)
    /// and the count of used bits (at most `BITS`), side by side.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn key(group: u64, distinct: u64, used: u32) -> u64 {
        group | distinct << Self::BITS | u64::from(used) << (2 * Self::BITS)
    }

    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn slot(kind: OpKind, key: u64) -> usize {
        const ODD: u64 = 0x9e37_79b9_7f4a_7c15;
        let hashed = (key.wrapping_mul(ODD) >> (64 - Self::SLOTS.trailing_zeros())) as usize;
        kind as usize * Self::SLOTS + hashed
    }
}

/// Algorithm 1's steps priced as they come: an op's group, the bits that hold distinct data and
/// the shard (the elements over the devices of the split dims, all powers of two) are read off
/// the rank bits of its dims.
struct Pricer<'c> {
    /// The tensor's elements.
    elements: u64,
    prices: &'c mut StepPrices,
    cluster: &'c Cluster,
    dtype_bytes: f64,
    model: CostModel,
    /// Whether the elements received are summed too.
    received: bool,
    /// The cost and the elements received so far.
    total: (f64, f64),
}

impl Step for Pricer<'_> {
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn step(&mut self, kind: OpKind, bits: u64, _: Option<usize>, _: Option<usize>, m: &Maps) {
        let used = m.used.count_ones();
        let shard = self.elements >> used;
        let moved = || volume(kind, 1 << bits.count_ones(), shard);
        // (A slice is free: nothing to look up.)
        if kind != OpKind::Slice {
            let distinct = m.used | m.partial;
            // (Key 0, that of no step, when the cluster's bits do not fit: priced every time.)
            let key = (StepPrices::key(bits, distinct, used) | self.prices.tag) & self.prices.keys;
            let slot = &mut self.prices.slots[StepPrices::slot(kind, key)];
            if key == 0 || slot.0 != key {
                let price = group_step_cost(
                    kind,
                    bits,
                    distinct,
                    moved(),
                    self.cluster,
                    self.dtype_bytes,
                    self.model,
                );
                *slot = (key, price);
            }
            self.total.0 += slot.1;
        }
        if self.received {
            self.total.1 += moved() as f64;
        }
    }
}

/// A run of pairs of one row of the batch kernel's table: its source, the targets of the run, the
/// one equal to the source if any (at its index among them: its cost is exactly 0, without
/// planning), and where the costs go, and with `volumes` the plans' elements received per device,
/// summed as [`Objective::Volume`] prices them (what the optimal planner compares under the
/// volume model).
pub(crate) struct Run<'r, 'l> {
    pub source: &'r Prepared<'l>,
    pub targets: &'r [Prepared<'l>],
    pub twin: Option<usize>,
    pub costs: &'r mut [f64],
    pub volumes: Option<&'r mut [f64]>,
}

/// Per pair of `run`, `plan_redistribution(a, b, Planner::Paper, _)?.cost(cluster, dtype_bytes,
/// model)`, bit for bit, without building the ops or the layouts of the unified pair, in
/// `scratch`'s buffers: the batch kernel's inner loop, a row's run at a time (what depends on the
/// row and the call is set up once per run, not per pair). Once `stop` is set, the rest is not
/// planned (the result is dropped). The caller has checked that the layouts are of one tensor
/// ([`check_same_tensor`]) on the cluster's devices, and that `dtype_bytes` is positive.
///
/// # Errors
/// As [`plan_redistribution`](super::plan_redistribution) and [`Redistribution::cost`].
pub(crate) fn run_costs(
    run: Run<'_, '_>,
    stop: &AtomicBool,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    scratch: &mut Scratch,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if scratch.bit_ops {
        // SAFETY: the processor has the instructions (`has_bit_ops`).
        return unsafe { run_bit_ops(run, stop, cluster, dtype_bytes, model, scratch) };
    }
    priced_run(run, stop, cluster, dtype_bytes, model, scratch)
}

/// [`run_costs`] compiled with `popcnt`, `lzcnt` and BMI: the same integers and the same f64
/// operations in the same order (no FMA), so the same bits.
///
/// # Safety
/// The processor must have those instructions ([`has_bit_ops`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt,lzcnt,bmi1,bmi2")]
unsafe fn run_bit_ops(
    run: Run<'_, '_>,
    stop: &AtomicBool,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    scratch: &mut Scratch,
) -> Result<()> {
    priced_run(run, stop, cluster, dtype_bytes, model, scratch)
}

/// The body of [`run_costs`], inlined into each form of it.
#[allow(clippy::inline_always)]
#[inline(always)]
fn priced_run(
    run: Run<'_, '_>,
    stop: &AtomicBool,
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    scratch: &mut Scratch,
) -> Result<()> {
    let Run {
        source,
        targets,
        twin,
        costs,
        mut volumes,
    } = run;
    let elements = volumes.is_some();
    scratch.prices.prepare(source.elements, cluster);
    for (k, (target, cost)) in targets.iter().zip(costs).enumerate() {
        let (priced, volume) = if twin != Some(k) && !stop.load(Relaxed) {
            priced(
                source,
                target,
                cluster,
                dtype_bytes,
                model,
                elements,
                scratch,
            )?
        } else {
            (0.0, 0.0)
        };
        *cost = priced;
        if let Some(volumes) = volumes.as_deref_mut() {
            volumes[k] = volume;
        }
    }
    Ok(())
}

/// The cost of one pair of [`run_costs`] (with `elements`, and the elements received, else 0),
/// inlined into each form of it, with what it calls per pair (unification, Algorithm 1's passes,
/// the step prices), so that the one built for the newer instructions uses them throughout.
#[allow(clippy::inline_always)]
#[inline(always)]
fn priced(
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
        prices,
        ..
    } = scratch;
    let mut pricer = Pricer {
        elements: a.elements,
        prices,
        cluster,
        dtype_bytes,
        model,
        received: elements,
        total: (0.0, 0.0),
    };
    // A pair that unifies by masks ([`Bits`]: no cut can fail, so [`line_up`] has nothing to
    // do).
    if let (Some(x), Some(y)) = (&a.bits, &b.bits) {
        check_partial((a.maps.partial, b.maps.partial), a.layout, b.layout)?;
        let (used, partial) = ((a.maps.used, b.maps.used), (a.maps.partial, b.maps.partial));
        if let Some(device) = source.fill_lined_up(target, (x, y), used, partial) {
            plan_unified(source, target, device, 0, &mut pricer);
            return Ok(pricer.total);
        }
    }
    // Otherwise a pair that needs no cut is read off the two layouts' own maps.
    if let Some(device) = a.start.uncut(&b.start) {
        check_partial((a.maps.partial, b.maps.partial), a.layout, b.layout)?;
        source.copy_from(&a.maps);
        plan_unified(
            source,
            &b.maps,
            device,
            source.settled(&b.maps),
            &mut pricer,
        );
        return Ok(pricer.total);
    }
    // Most others unify as they are: [`line_up`]'s reshapes and fallback steps only for the rest
    // (which unify again from the start there).
    let (src, tgt) = (
        Reshaped::with_start(a.layout, &a.start),
        Reshaped::with_start(b.layout, &b.start),
    );
    let lined = if try_unify(&src, &tgt, unified).is_ok() {
        check_partial(unified.partial(), a.layout, b.layout)?;
        None
    } else {
        Some(line_up(
            a.layout,
            b.layout,
            Some((&a.start, &b.start)),
            unified,
        )?)
    };
    // In plan order, from +0.0 as the plan's own sums.
    // (The elements only when asked for: a u64 to f64 conversion per op is worth skipping.)
    let add = |(cost, received): (f64, f64), op: &CommOp| {
        let volume = if elements { op.volume() as f64 } else { 0.0 };
        Ok::<_, Error>((
            cost + op.cost(cluster, dtype_bytes, model)?,
            received + volume,
        ))
    };
    let steps = |part: fn(&LinedUp) -> &[CommOp]| lined.as_ref().map_or(&[][..], part);
    pricer.total = steps(|l| &l.prelude).iter().try_fold((0.0, 0.0), add)?;
    let (first, second) = unified.partial();
    source.refill(unified.split_bits(Side::First), first);
    target.refill(unified.split_bits(Side::Second), second);
    plan_unified(
        source,
        target,
        unified.device(),
        source.settled(target),
        &mut pricer,
    );
    steps(|l| &l.epilogue).iter().try_fold(pricer.total, add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;

    /// A step priced under one tag reads as empty under every other, until the tags wrap: the
    /// table is then cleared, so a slot tagged 0 long before is not read as the new tag 0's.
    #[test]
    fn step_prices_forget_by_tags_and_clear_when_they_wrap() {
        let mut prices = StepPrices::new();
        let cluster = Cluster::new(2, 4, 60e9, 6e9, None).unwrap();
        prices.prepare(64, &cluster);
        let key = (StepPrices::key(0b11, 0b111, 3) | prices.tag) & prices.keys;
        let slot = StepPrices::slot(OpKind::AllGather, key);
        prices.slots[slot] = (key, 1.5);
        prices.prepare(64, &cluster);
        assert_eq!(prices.slots[slot].0, key, "the same tensor keeps its steps");
        prices.prepare(128, &cluster);
        let again = (StepPrices::key(0b11, 0b111, 3) | prices.tag) & prices.keys;
        assert_ne!(
            prices.slots[slot].0, again,
            "another tensor's steps read as empty"
        );
        // The key's own bits never reach the tag's.
        assert!(
            StepPrices::key(u64::MAX >> 43, u64::MAX >> 43, StepPrices::BITS) >> StepPrices::TAG
                == 0
        );
        // 2^17 tags: the third tensor's is the last but two before they wrap.
        let tags = 1u64 << (64 - StepPrices::TAG);
        for _ in 2..tags {
            assert_ne!(prices.slots[slot], (0, 0.0));
            prices.forget();
        }
        assert_eq!(prices.tag, 0);
        assert_eq!(prices.slots[slot], (0, 0.0));
    }

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

    /// The kernel's portable form (what a processor without `popcnt` runs; the batch tests run
    /// the other form on a processor that has it) prices every pair as its plan does, on a
    /// cluster of three levels with latencies, partial sums on some sources; the layouts of 64
    /// elements by masks.
    #[test]
    fn portable_kernel_costs_are_the_plans() {
        use crate::batch::tests::{layouts_of_64, layouts_of_96, partial_sums_of};

        let mut layouts = layouts_of_96();
        layouts.extend(partial_sums_of(&layouts, 5));
        let powers = layouts_of_64();
        layouts.extend(partial_sums_of(&powers, 5));
        layouts.extend(powers);
        let levels = [(2, 60e9, 1e-6), (2, 12e9, 5e-6), (2, 3e9, 2e-5)];
        let priced = kernel_prices_as_plans(&layouts, &levels);
        assert!(priced > 40_000, "{priced}");
    }

    /// On a cluster of 2^22 devices, whose rank bits do not fit a step's key (so no step price
    /// is kept), the kernel prices every pair as its plan does.
    #[test]
    fn kernel_costs_past_the_keyed_devices_are_the_plans() {
        use crate::batch::tests::{every_layout, partial_sums_of};

        let shapes: [&[u64]; 3] = [&[1 << 24], &[1 << 12, 1 << 12], &[2, 1 << 11, 1 << 11]];
        let matrices: [&[u64]; 4] = [
            &[1 << 22],
            &[2, 1 << 21],
            &[1 << 21, 2],
            &[1 << 11, 2, 1 << 10],
        ];
        let mut layouts = every_layout(&shapes, &matrices);
        layouts.extend(partial_sums_of(&layouts, 1));
        let levels = [(1 << 11, 60e9, 1e-6), (1 << 11, 3e9, 2e-5)];
        let priced = kernel_prices_as_plans(&layouts, &levels);
        assert!(priced > 10_000, "{priced}");
    }

    /// The pairs of `layouts` that plan, each priced by the kernel's portable form exactly as its
    /// plan, under both cost models on the cluster of `levels` (a scratch per model: one call).
    fn kernel_prices_as_plans(layouts: &[Layout], levels: &[(u64, f64, f64)]) -> usize {
        use crate::plan::{plan_redistribution, Planner};
        use crate::topology::Replicas;

        let cluster = Cluster::hierarchy(levels, None, Replicas::Shared).unwrap();
        let prepared: Vec<Prepared<'_>> = layouts.iter().map(Prepared::new).collect();
        let never = AtomicBool::new(false);
        let mut priced = 0;
        for model in [CostModel::Topology, CostModel::Volume] {
            let mut scratch = Scratch {
                bit_ops: false,
                ..Scratch::default()
            };
            for (a, pa) in layouts.iter().zip(&prepared) {
                for (b, pb) in layouts.iter().zip(&prepared) {
                    let Ok(plan) = plan_redistribution(a, b, Planner::Paper, Objective::Volume)
                    else {
                        continue;
                    };
                    let mut got = [f64::NAN];
                    let run = Run {
                        source: pa,
                        targets: std::slice::from_ref(pb),
                        twin: None,
                        costs: &mut got,
                        volumes: None,
                    };
                    run_costs(run, &never, &cluster, 2.0, model, &mut scratch).unwrap();
                    let got = got[0];
                    let want = plan.cost(&cluster, 2.0, model).unwrap();
                    assert_eq!(got.to_bits(), want.to_bits(), "{a:?} to {b:?}");
                    priced += 1;
                }
            }
        }
        priced
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
