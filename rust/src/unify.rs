//! Unification (docs/conventions.md#unification): rewrite two layouts of one tensor to a common
//! device matrix and a common shape without moving any element, so that redistribution operators
//! can be read off the two tensor maps.
//!
//! A layout is handled as a list of *pieces* (tensor dims, outermost first), each with a size and
//! the bit range `[lo, hi)` of the rank it is split along. Two refinements alternate until neither
//! changes anything: every device boundary of either side cuts the pieces split across it (the
//! outer bits take the outer part of the dim), and every dim boundary of either side, taken as a
//! suffix product of the flat index, cuts the piece it falls in (the split stays on the outer part,
//! or is cut itself when the outer part is smaller than the split). A boundary that lands where no
//! cut preserves the distribution is a [`Blocker`]; callers resolve it by merging unsplit dims
//! (a pure reshape) or, in the planner, by gathering.

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::layout::{log2, Layout};

/// A tensor dim of a unified pair: its size, the tensor dim of the input layout it comes from,
/// and the rank bits `[lo, hi)` of its split (`hi` 0 if it is whole; a split has bits). Sixteen
/// bytes: the cost kernel copies millions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Piece {
    size: u64,
    origin: u32,
    lo: u8,
    hi: u8,
}

impl Piece {
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn new(size: u64, split: Option<(u32, u32)>, origin: usize) -> Self {
        let (lo, hi) = split.unwrap_or((0, 0));
        debug_assert!(split.is_none_or(|(lo, hi)| lo < hi && hi < 64));
        Piece {
            size,
            origin: origin as u32,
            lo: lo as u8,
            hi: hi as u8,
        }
    }

    /// The rank bits `[lo, hi)` of its split, if it is split.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn split(self) -> Option<(u32, u32)> {
        (self.hi != 0).then_some((u32::from(self.lo), u32::from(self.hi)))
    }

    /// The tensor dim of the input layout it comes from.
    fn origin(self) -> usize {
        self.origin as usize
    }
}

/// Which input of a unification a blocker belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    First,
    Second,
}

/// A dim of one input that a boundary of the other cannot be placed in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocker {
    pub side: Side,
    pub dim: usize,
}

pub(crate) fn pieces_of(l: &Layout) -> Vec<Piece> {
    (0..l.ndim())
        .filter(|&i| l.shape()[i] > 1)
        .map(|i| {
            let split = match l.tensor_map()[i] {
                -1 => None,
                k => Some(l.bit_range(k as usize)).filter(|(lo, hi)| lo < hi),
            };
            Piece::new(l.shape()[i], split, i)
        })
        .collect()
}

/// Device boundaries as a mask, bit `b` set for a boundary at rank bit `b`: a device count fits in
/// a u64, so no boundary lies above bit 63 and a set costs no allocation.
pub(crate) type DeviceBounds = u64;

/// The boundaries of a device count's rank bits: its first and last bit.
fn outer_bounds(num_devices: u64) -> DeviceBounds {
    1 | 1 << log2(num_devices)
}

/// The boundaries strictly between rank bits `lo` and `hi`.
#[allow(clippy::inline_always)]
#[inline(always)]
fn bounds_inside(bounds: DeviceBounds, lo: u32, hi: u32) -> DeviceBounds {
    bounds & ((1 << hi) - 1) & !((2 << lo) - 1)
}

/// The device boundaries of the split pieces. Only the dims a map uses split a piece: unused dims
/// only replicate, so their factorization carries nothing and cutting at it would price one
/// collective as several.
fn split_bounds(pieces: &[Piece]) -> DeviceBounds {
    pieces
        .iter()
        .filter_map(|p| p.split())
        .fold(0, |bounds, (lo, hi)| bounds | 1 << lo | 1 << hi)
}

/// The rank bits strictly inside the splits of `pieces`: where a device boundary cuts one.
#[allow(clippy::inline_always)]
#[inline(always)]
fn inside_splits(pieces: &[Piece]) -> u64 {
    pieces
        .iter()
        .filter_map(|p| p.split())
        .fold(0, |inside, (lo, hi)| {
            inside | bounds_inside(u64::MAX, lo, hi)
        })
}

/// The pieces of `from` into `into`, every split piece that a device boundary falls inside cut
/// at it; the outer bits keep the outer part. (Written into another buffer, not cut in place:
/// the kernel makes millions of cuts, and an insert moves every piece after it.)
#[allow(clippy::inline_always)]
#[inline(always)]
fn cut_at_device_bounds(from: &[Piece], bounds: DeviceBounds, into: &mut Vec<Piece>) {
    into.clear();
    for &p in from {
        let Some((lo, mut hi)) = p.split() else {
            into.push(p);
            continue;
        };
        let mut size = p.size;
        let mut inside = bounds_inside(bounds, lo, hi);
        // The highest boundary first: the inner part is cut again at the others.
        while inside != 0 {
            let b = inside.ilog2();
            into.push(Piece::new(1 << (hi - b), Some((b, hi)), p.origin()));
            size >>= hi - b;
            hi = b;
            inside &= !(1 << b);
        }
        into.push(Piece::new(size, Some((lo, hi)), p.origin()));
    }
}

/// The flat-index boundaries between the pieces of either side, as products of the sizes inside
/// them, ascending and distinct. Every piece holds more than one element, so each side's, taken
/// from its innermost piece out, ascend already: the two are merged, not sorted.
#[allow(clippy::inline_always)]
#[inline(always)]
fn dim_bounds(a: &[Piece], b: &[Piece], into: &mut Vec<u64>) {
    into.clear();
    // Each side's next boundary: the product of its pieces from `at` on, while a piece lies
    // outside them (the product of all of them is the total, no boundary); `u64::MAX` once there
    // is none (a boundary is below the total, which a u64 holds).
    let advance = |pieces: &[Piece], at: &mut usize, suffix: &mut u64| {
        if *at >= 2 {
            *at -= 1;
            *suffix *= pieces[*at].size;
            *suffix
        } else {
            u64::MAX
        }
    };
    let (mut at_a, mut at_b) = (a.len(), b.len());
    let (mut suffix_a, mut suffix_b) = (1u64, 1u64);
    let mut next_a = advance(a, &mut at_a, &mut suffix_a);
    let mut next_b = advance(b, &mut at_b, &mut suffix_b);
    loop {
        let next = next_a.min(next_b);
        if next == u64::MAX {
            break;
        }
        into.push(next);
        if next_a == next {
            next_a = advance(a, &mut at_a, &mut suffix_a);
        }
        if next_b == next {
            next_b = advance(b, &mut at_b, &mut suffix_b);
        }
    }
    debug_assert!(into.windows(2).all(|w| w[0] < w[1]));
}

/// Cuts every piece a dim boundary falls inside at every boundary inside it, writing the cut
/// pieces into `spare` and swapping it with `pieces`. `Err(origin)` names a piece it cannot cut.
///
/// Every boundary of `bounds` (the boundaries of both sides, [`dim_bounds`]) is one of the
/// pieces' or falls inside one and is cut there: the cut pieces are those between consecutive
/// boundaries and the outermost, one more than the boundaries. So a side with as many pieces
/// needs no cut, and the others are written from the outermost end without a search.
#[allow(clippy::inline_always)]
#[inline(always)]
fn cut_at_dim_bounds(
    pieces: &mut Vec<Piece>,
    bounds: &[u64],
    device: &mut DeviceBounds,
    spare: &mut Vec<Piece>,
) -> std::result::Result<(), usize> {
    let count = bounds.len() + 1;
    // (A tensor of one element has no piece, and no boundary either.)
    if pieces.len() == count || pieces.is_empty() {
        return Ok(());
    }
    spare.clear();
    spare.resize(count, pieces[0]);
    let mut at = count;
    let mut inner = 1u64;
    // The first boundary above `inner`: `inner` only grows, so a cursor finds it, not a search.
    let mut next = 0;
    // Innermost first, each piece cut from its inner end.
    for &p in pieces.iter().rev() {
        let mut piece = p;
        loop {
            let top = inner * piece.size;
            while bounds.get(next).is_some_and(|&b| b <= inner) {
                next += 1;
            }
            at -= 1;
            let Some(&bound) = bounds.get(next).filter(|&&b| b < top) else {
                inner = top;
                spare[at] = piece;
                break;
            };
            // Divisions checked by multiplying back: the kernel makes millions of cuts.
            let rest = bound / inner;
            let outer = piece.size / rest;
            if rest * inner != bound || outer * rest != piece.size {
                return Err(piece.origin());
            }
            let make = |size, split| Piece::new(size, split, piece.origin());
            let (outer_piece, inner_piece) = match piece.split() {
                None => (make(outer, None), make(rest, None)),
                Some((lo, hi)) => {
                    let g = 1u64 << (hi - lo);
                    // `g` is a power of two, and so is any divisor of it.
                    if outer & (g - 1) == 0 {
                        (make(outer, Some((lo, hi))), make(rest, None))
                    } else if outer.is_power_of_two() && outer < g {
                        // The outer part is smaller than the split: the device dim is cut as
                        // well.
                        let b = hi - log2(outer);
                        *device |= 1 << b;
                        (make(outer, Some((b, hi))), make(rest, Some((lo, b))))
                    } else {
                        return Err(piece.origin());
                    }
                }
            };
            spare[at] = inner_piece;
            // The outer part next: more boundaries may fall inside it.
            piece = outer_piece;
            inner = bound;
        }
    }
    debug_assert_eq!(at, 0);
    std::mem::swap(pieces, spare);
    Ok(())
}

/// Appends to `matrix` the device matrix whose dims lie between consecutive boundaries, outermost
/// (highest bits) first.
fn device_matrix_into(bounds: DeviceBounds, matrix: &mut Vec<u64>) {
    let mut hi = bounds.ilog2();
    let mut below = bounds & ((1 << hi) - 1);
    while below != 0 {
        let lo = below.ilog2();
        matrix.push(1u64 << (hi - lo));
        below &= !(1 << lo);
        hi = lo;
    }
}

/// Appends to `map` the tensor map of the pieces on the device matrix of `bounds`.
fn tensor_map_into(pieces: &[Piece], bounds: DeviceBounds, map: &mut Vec<i64>) {
    map.extend(pieces.iter().map(|&p| map_entry(p, bounds)));
}

/// The map entry of `piece` on the device matrix of `bounds`: the device dim splitting it, -1 if
/// none.
#[allow(clippy::inline_always)]
#[inline(always)]
fn map_entry(piece: Piece, bounds: DeviceBounds) -> i64 {
    match piece.split() {
        None => -1,
        Some((lo, hi)) => {
            debug_assert!(bounds & 1 << lo != 0, "split starts on a device boundary");
            debug_assert_eq!((bounds >> (lo + 1)).trailing_zeros() + lo + 1, hi);
            i64::from((bounds & ((1 << lo) - 1)).count_ones())
        }
    }
}

/// The rank bits of the device dims holding partial sums.
pub(crate) fn partial_mask(l: &Layout) -> u64 {
    l.partial().iter().fold(0, |mask, &k| {
        let (lo, hi) = l.bit_range(k);
        mask | bits_between(lo, hi)
    })
}

/// The boundaries of the runs of partial rank bits: adjacent partial dims are one partial dim
/// (the addends of a group of groups are addends of the larger group).
fn partial_bounds(mask: u64) -> DeviceBounds {
    mask ^ (mask << 1)
}

/// Appends to `dims` the device dims, on the matrix of `bounds`, whose bits are partial in
/// `mask`.
fn partial_dims_into(bounds: DeviceBounds, mask: u64, dims: &mut Vec<usize>) {
    let mut rest = partial_dims(bounds, mask);
    while rest != 0 {
        dims.push(rest.trailing_zeros() as usize);
        rest &= rest - 1;
    }
}

/// The device dims, on the matrix of `bounds`, whose bits are partial in `mask` (a mask: a
/// matrix of rank bits has fewer than 64 dims).
fn partial_dims(bounds: DeviceBounds, mask: u64) -> u64 {
    let top = bounds.ilog2();
    let mut rest = bounds & ((1 << top) - 1);
    let (mut k, mut dims) = (0, 0);
    while rest != 0 {
        let lo = rest.trailing_zeros();
        if mask >> lo & 1 == 1 {
            dims |= 1 << k;
        }
        rest &= rest - 1;
        k += 1;
    }
    dims
}

/// The layout of `pieces` on the device matrix of `bounds`, the bits of `partial` holding partial
/// sums.
fn build_into(pieces: &[Piece], bounds: DeviceBounds, partial: u64, out: &mut Layout) {
    out.set_parts(|shape, matrix, map, dims| {
        shape.extend(pieces.iter().map(|p| p.size));
        device_matrix_into(bounds, matrix);
        tensor_map_into(pieces, bounds, map);
        partial_dims_into(bounds, partial, dims);
    });
}

fn build(pieces: &[Piece], bounds: DeviceBounds, partial: u64) -> Layout {
    let mut out = Layout::scratch();
    build_into(pieces, bounds, partial, &mut out);
    out
}

/// The layout with its device matrix cut only where a split or a partial dim needs it and its
/// size-1 tensor dims dropped, every other dim kept: one layout per distribution *and* per plan,
/// as Algorithm 1 (which runs on the dims as given, one partial dim at a time) plans the same
/// steps from and to it. The search groups candidate layouts by it; [`normalized`], which also
/// merges tensor dims and adjacent partial dims, is coarser.
#[must_use]
pub fn compacted(l: &Layout) -> Layout {
    let pieces = pieces_of(l);
    let partial = l.partial().iter().fold(0, |bounds, &k| {
        let (lo, hi) = l.bit_range(k);
        bounds | 1 << lo | 1 << hi
    });
    build(
        &pieces,
        outer_bounds(l.num_devices()) | split_bounds(&pieces) | partial,
        partial_mask(l),
    )
}

/// The canonical form of a layout, a reshape that moves nothing: every split dim cut into its
/// split part and its local rest, runs of unsplit parts merged, adjacent split parts whose device
/// bits continue each other merged (`[4, 8]` split 4 and 4 ways is `[32]` split 16 ways), size-1
/// dims dropped, and the device matrix cut only where a split or a run of partial dims needs it.
/// Two layouts of one tensor (shapes of one element count, read row-major) hold the same elements,
/// and the same partial sums, on every rank iff their normal forms are equal.
#[must_use]
pub fn normalized(l: &Layout) -> Layout {
    let mut pieces: Vec<Piece> = Vec::with_capacity(2 * l.ndim());
    for p in pieces_of(l) {
        let mut push = |q: Piece| match (pieces.last_mut(), q.split()) {
            (Some(last), None) if last.split().is_none() => last.size *= q.size,
            (Some(last), Some((lo, hi))) if last.split().is_some_and(|(l, _)| l == hi) => {
                last.size *= q.size;
                let top = last.split().map_or(hi, |(_, h)| h);
                *last = Piece::new(last.size, Some((lo, top)), last.origin());
            }
            _ => pieces.push(q),
        };
        match p.split() {
            Some((lo, hi)) if p.size > 1 << (hi - lo) => {
                let g = 1u64 << (hi - lo);
                push(Piece { size: g, ..p });
                push(Piece::new(p.size / g, None, p.origin()));
            }
            _ => push(p),
        }
    }
    for (j, p) in pieces.iter_mut().enumerate() {
        p.origin = j as u32;
    }
    let partial = partial_mask(l);
    build(
        &pieces,
        outer_bounds(l.num_devices()) | split_bounds(&pieces) | partial_bounds(partial),
        partial,
    )
}

/// Two views cut until they line up: one shape, one device matrix. Its buffers are refilled by
/// each [`try_unify`] into it, so that the cost kernel unifies pair after pair allocating nothing.
#[derive(Default)]
pub(crate) struct Unified {
    first: Vec<Piece>,
    second: Vec<Piece>,
    /// The buffer each cut writes into, swapped with the side it cuts.
    spare: Vec<Piece>,
    /// The start of each side that is not known beforehand ([`Reshaped::start`]).
    starts: (Start, Start),
    /// The dim boundaries of both sides, reused by every round.
    dims: Vec<u64>,
    device: DeviceBounds,
    /// The partial rank bits of each side.
    partial: (u64, u64),
}

/// What [`Unified::splits_into`] reads of a unified pair besides its splits.
#[derive(Debug, PartialEq)]
pub(crate) struct Splits {
    /// The device dims holding partial sums in the first and in the second (masks).
    pub(crate) partial: (u64, u64),
    /// The elements per device in the first and in the second.
    pub(crate) shards: (u64, u64),
    /// The tensor's elements.
    pub(crate) elements: u64,
    /// The device dims splitting a tensor dim in the second (a mask).
    pub(crate) target_dims: u64,
    /// The most factors of two of a tensor dim: a device dim (of a power of two) divides some
    /// tensor dim iff it has no more.
    pub(crate) twos: u32,
    /// The tensor dims.
    pub(crate) ndim: usize,
    /// The pair's device matrix, by its boundaries in rank bits.
    pub(crate) device: DeviceBounds,
}

impl Unified {
    fn side(&self, side: Side) -> (&[Piece], u64) {
        match side {
            Side::First => (&self.first, self.partial.0),
            Side::Second => (&self.second, self.partial.1),
        }
    }

    /// The unified layout of one side (of the last unification that succeeded).
    pub fn layout(&self, side: Side) -> Layout {
        let (pieces, partial) = self.side(side);
        build(pieces, self.device, partial)
    }

    /// [`Unified::layout`] into `out`'s buffers.
    pub fn layout_into(&self, side: Side, out: &mut Layout) {
        let (pieces, partial) = self.side(side);
        build_into(pieces, self.device, partial, out);
    }

    /// The unified pair as a bound reads it, without building its layouts
    /// ([`Unified::layout_into`]'s): per tensor dim split in the first, the device dims splitting
    /// it in each (the second's -1 if none), into `splits`, in the order of the dims; and the
    /// rest in [`Splits`]. One pass over the dims, the unsplit ones (most of them) skipped.
    ///
    /// `dim_at` gives the device dim starting at each rank bit of the pair's device matrix (a
    /// table, not a count of the boundaries below each split: the baseline x86-64 target counts
    /// bits in a dozen instructions).
    pub fn splits_into(&self, dim_at: &[i8; 64], splits: &mut Vec<(i8, i8)>) -> Splits {
        splits.clear();
        let (mut elements, mut split, mut target_dims, mut twos) = (1u64, (0, 0), 0u64, 0);
        let entry = |x: Piece| {
            debug_assert_eq!(
                i64::from(dim_at[usize::from(x.lo)]),
                map_entry(x, self.device)
            );
            dim_at[usize::from(x.lo)]
        };
        for (&p, &q) in self.first.iter().zip(&self.second) {
            elements *= p.size;
            twos = twos.max(p.size.trailing_zeros());
            if q.hi != 0 {
                split.1 += u32::from(q.hi - q.lo);
                target_dims |= 1 << entry(q);
            }
            if p.hi != 0 {
                split.0 += u32::from(p.hi - p.lo);
                splits.push((entry(p), if q.hi != 0 { entry(q) } else { -1 }));
            }
        }
        // Most sides hold no partial sums: no device dim to visit.
        let dims = |partial| match partial {
            0 => 0,
            _ => partial_dims(self.device, partial),
        };
        Splits {
            partial: (dims(self.partial.0), dims(self.partial.1)),
            shards: (elements >> split.0, elements >> split.1),
            elements,
            target_dims,
            twos,
            ndim: self.first.len(),
            device: self.device,
        }
    }

    /// The rank bits of the partial dims of each side.
    pub fn partial(&self) -> (u64, u64) {
        self.partial
    }

    /// Per tensor dim of one side's unified layout, the rank bits of the device dim that splits
    /// it (0 if none): its map as the cost kernel reads it, without building the layout.
    pub fn split_bits(&self, side: Side) -> impl Iterator<Item = u64> + '_ {
        split_bits(self.side(side).0)
    }

    /// The device boundaries of the unified pair: bit `b` set for a boundary at rank bit `b`.
    pub fn device(&self) -> DeviceBounds {
        self.device
    }
}

/// Per piece, the rank bits of the device dim that splits it (0 if none).
#[allow(clippy::inline_always)]
#[inline(always)]
fn split_bits(pieces: &[Piece]) -> impl Iterator<Item = u64> + '_ {
    pieces
        .iter()
        .map(|p| p.split().map_or(0, |(lo, hi)| bits_between(lo, hi)))
}

/// The rank bits `[lo, hi)` as a mask (`hi` below 64: a device count fits a u64).
#[allow(clippy::inline_always)]
#[inline(always)]
fn bits_between(lo: u32, hi: u32) -> u64 {
    ((1 << hi) - 1) & !((1 << lo) - 1)
}

/// One attempt at unification of the two views as they are, into `into` (whose layouts are
/// those of the two views once it succeeds).
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn try_unify(
    a: &Reshaped<'_>,
    b: &Reshaped<'_>,
    into: &mut Unified,
) -> std::result::Result<(), Blocker> {
    let Unified {
        first: pa,
        second: pb,
        spare,
        starts,
        dims,
        ..
    } = into;
    let (first, second) = (a.start(&mut starts.0), b.start(&mut starts.1));
    let partial = (first.partial, second.partial);
    let mut device = first.bounds | second.bounds;
    for (start, pieces) in [(first, &mut *pa), (second, &mut *pb)] {
        if device & start.inside == 0 {
            pieces.clear();
            pieces.extend_from_slice(&start.pieces);
        } else {
            cut_at_device_bounds(&start.pieces, device, pieces);
        }
    }
    loop {
        dim_bounds(pa, pb, dims);
        // A round that adds no device boundary leaves nothing for the next: its device cuts were
        // all made before the dim boundaries were taken, the dim cuts then made every boundary one
        // of both sides, and a cut at a dim boundary that splits no device dim needs no device cut.
        let before = device;
        cut_at_dim_bounds(pa, dims, &mut device, spare).map_err(|dim| Blocker {
            side: Side::First,
            dim,
        })?;
        cut_at_dim_bounds(pb, dims, &mut device, spare).map_err(|dim| Blocker {
            side: Side::Second,
            dim,
        })?;
        if device == before {
            into.device = device;
            into.partial = partial;
            return Ok(());
        }
        for pieces in [&mut *pa, &mut *pb] {
            // (Only the pieces of the new boundaries' device dims are cut.)
            if device & inside_splits(pieces) != 0 {
                cut_at_device_bounds(pieces, device, spare);
                std::mem::swap(pieces, spare);
            }
        }
    }
}

/// Both layouts must describe one tensor on one set of devices.
pub(crate) fn check_same_tensor(a: &Layout, b: &Layout) -> Result<()> {
    if a.num_devices() != b.num_devices() {
        return Err(Error::Layout(format!(
            "layouts on {} and {} devices cannot describe one tensor on one set of devices",
            a.num_devices(),
            b.num_devices()
        )));
    }
    if a.num_elements() != b.num_elements() {
        return Err(Error::Layout(format!(
            "shapes {:?} and {:?} hold {} and {} elements: not one tensor",
            a.shape(),
            b.shape(),
            a.num_elements(),
            b.num_elements()
        )));
    }
    Ok(())
}

/// A layout seen through a reshape that moves nothing: runs of unsplit dims merged, or, in the
/// canonical form, every split dim cut into its split part and its local rest and every run of
/// unsplit parts merged (two layouts with equal distributions have equal canonical forms up to
/// device cuts). The map of the original dims can be changed by the planner; until then the
/// layout is borrowed.
#[derive(Debug, Clone)]
pub(crate) struct Reshaped<'a> {
    pub layout: Cow<'a, Layout>,
    /// The runs of original dims each view dim merges; empty until a first merge, for one run
    /// per dim (the cost kernel makes two views per pair, and most are never merged).
    groups: Vec<(usize, usize)>,
    canonical: bool,
    /// The start of `layout` as given ([`Start::of`]), worked out once by a caller that unifies
    /// it with many layouts; used while the view is the layout's own (borrowed, unmerged).
    known: Option<&'a Start>,
}

/// What unification starts from on one side: the view's pieces, the rank bits of its partial
/// dims ([`partial_mask`]), the device boundaries it brings (its device count's, its splits'
/// and its runs of partial bits') and those that would cut its pieces ([`inside_splits`]). The
/// cost kernel works it out once per layout.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Start {
    pieces: Vec<Piece>,
    partial: u64,
    bounds: DeviceBounds,
    inside: u64,
}

impl Start {
    /// The start of `layout` as given.
    pub fn of(layout: &Layout) -> Self {
        let mut start = Start::default();
        Reshaped::new(layout).start_into(&mut start);
        start
    }

    /// Per piece, the rank bits of the device dim that splits it (0 if none).
    pub fn split_bits(&self) -> impl Iterator<Item = u64> + '_ {
        split_bits(&self.pieces)
    }

    /// The rank bits of the partial dims.
    pub fn partial(&self) -> u64 {
        self.partial
    }

    /// The device boundaries of `self` and `other` (starts of layouts of one tensor) unified as
    /// they are, if that needs no cut: pieces of the same sizes, and no device boundary of either
    /// inside a split of the other. [`try_unify`] leaves both starts' pieces as they are then,
    /// on the boundaries of both: the cost kernel reads such a pair off the two starts.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub fn uncut(&self, other: &Start) -> Option<DeviceBounds> {
        let device = self.bounds | other.bounds;
        let same = |a: &[Piece], b: &[Piece]| {
            a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p.size == q.size)
        };
        (device & (self.inside | other.inside) == 0 && same(&self.pieces, &other.pieces))
            .then_some(device)
    }
}

/// A layout of a tensor of `m * 2^e` elements (`m` odd) in bits, unified with another by masks
/// ([`unify_bits`]). Every dim is then a power of two but the one holding `m`, which counts as
/// one bit more (`m` read as 2), and holds a run of the flat index's `e` (or `e + 1`) bits (the
/// outermost dim the top run), and a split maps the top bits of its dim's run onto the rank bits
/// of its device dim, top to top. Each cut [`try_unify`] makes carries a boundary across such a
/// map: a dim boundary inside the split part of a run cuts the device dim at the rank bit it maps
/// to, a device boundary inside a split cuts the dim at the element bit mapped to it. With
/// `m = 1` no cut can fail (every size is a power of two), so the unified pair's boundaries are
/// the least sets that hold both sides' own and are closed under both sides' maps. With `m > 1`
/// the same holds when `m` lies in one dim of each side, in the whole part of it, and the two
/// sides' bits where it may sit ([`Bits::odd`]) meet: at such a bit `T`, every boundary of
/// either side below `m` is `2^j` with `j <= T` and every one above it `m * 2^k` with `k >= T`,
/// so read as bit `j`, and `k + 1`, every product, quotient and comparison of the cuts is that
/// of the bits (no boundary can fall inside `m`'s one bit), and no cut fails either.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bits {
    /// The dim boundaries: bit `p` for one between element bits `p - 1` and `p`, the first and
    /// the last (bit `e`) included.
    dims: u64,
    /// The device boundaries the layout brings (its [`Start`]'s).
    device: DeviceBounds,
    /// The element bits the splits map.
    split: u64,
    /// The dim boundaries strictly inside a split's run, and the device boundaries strictly
    /// inside a split's device dim: where the other side's boundaries are carried across.
    inside: u64,
    inside_ranks: u64,
    /// Per element bit of a split, the left rotation that takes it (and its run's other split
    /// bits) to its rank bit; per rank bit of a split, the one that takes it to its element bit.
    /// (A map is a shift within a run, which never wraps: a rotation is the shift either way.)
    to_rank: [u8; 64],
    to_element: [u8; 64],
    /// The element bits of the whole part of the dim holding the odd factor of the count of
    /// elements, where that factor may sit (0 for a count `2^e`), and the factor.
    odd: u64,
    factor: u64,
    /// The unified dims split on this side in any pair, in [`unify_bits`]'s numbering: a unified
    /// dim lies in one dim of this side, whose split part is the top of it, so it holds split
    /// bits exactly when its top bit is split.
    split_dims: u64,
}

impl Bits {
    /// The bits of the layout of `elements` elements whose start is `start`, if the odd factor
    /// of `elements` lies in one of its dims (and a count of `2^e` elements has none).
    pub fn of(start: &Start, elements: u64) -> Option<Self> {
        let factor = elements >> elements.trailing_zeros();
        let mut bits = Bits {
            dims: 1,
            device: start.bounds,
            split: 0,
            inside: 0,
            inside_ranks: 0,
            to_rank: [0; 64],
            to_element: [0; 64],
            odd: 0,
            factor,
            split_dims: 0,
        };
        // Innermost piece first: the lowest run.
        let mut bottom = 0;
        for p in start.pieces.iter().rev() {
            let twos = p.size.trailing_zeros();
            let top = match p.size >> twos {
                1 => bottom + twos,
                // The odd factor whole in this dim: one bit more.
                odd if odd == factor && bits.odd == 0 => bottom + twos + 1,
                _ => return None,
            };
            let (lo, hi) = p.split().unwrap_or((0, 0));
            let base = top - (hi - lo);
            if p.size >> twos != 1 {
                bits.odd = bits_between(bottom, base);
            }
            if hi != 0 {
                for k in 0..hi - lo {
                    bits.to_rank[(base + k) as usize] = (lo.wrapping_sub(base) & 63) as u8;
                    bits.to_element[(lo + k) as usize] = (base.wrapping_sub(lo) & 63) as u8;
                }
                bits.split |= bits_between(base, top);
                bits.inside |= bounds_inside(u64::MAX, base, top);
                bits.inside_ranks |= bounds_inside(u64::MAX, lo, hi);
            }
            bottom = top;
            bits.dims |= 1 << top;
        }
        bits.split_dims = unified_dims(bits.split << 1);
        debug_assert_eq!(
            1u64 << bottom,
            elements / factor * (1 + u64::from(factor > 1))
        );
        Some(bits)
    }

    /// The unified dims split on this side, in [`unify_bits`]'s numbering, in any pair this side
    /// is in.
    pub fn split_dims(&self) -> u64 {
        self.split_dims
    }

    /// Whether two layouts of one tensor unify by masks (the bits where each may hold the odd
    /// factor meet, or there is none).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn meets(&self, other: &Bits) -> bool {
        self.odd & other.odd != 0 || self.factor == 1
    }

    /// The rank bits of this side's split of the unified dim of element bits `run`, whose top bit
    /// is `top - 1` (0 if it is whole). The run lies in one dim of this side, whose split part is
    /// the top of it: its split bits (none if its top bit is not split) are in one run, mapped by
    /// the top bit's rotation.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn split_of(&self, run: u64, top: u32) -> u64 {
        // (Masked: `top` is 1 to 63, and the mask is cheaper than a bounds check per dim.)
        (self.split & run).rotate_left(u32::from(self.to_rank[(top as usize - 1) & 63]))
    }
}

/// The boundaries `boundaries` carried across a map: each bit `b` rotated by `to[b]`.
#[allow(clippy::inline_always)]
#[inline(always)]
fn carried(mut boundaries: u64, to: &[u8; 64]) -> u64 {
    let mut out = 0;
    while boundaries != 0 {
        // (Masked: `b` is below 64, and the mask is cheaper than a bounds check per bit.)
        let b = boundaries.trailing_zeros() & 63;
        out |= (1u64 << b).rotate_left(u32::from(to[b as usize]));
        boundaries &= boundaries - 1;
    }
    out
}

/// The dim and device boundaries of the pair unified by masks: both sides' own, carried across
/// both sides' maps until no new one appears.
#[allow(clippy::inline_always)]
#[inline(always)]
fn closed_bounds(a: &Bits, b: &Bits) -> (u64, DeviceBounds) {
    let (mut dims, mut device) = (a.dims | b.dims, a.device | b.device);
    // The boundaries not yet carried across the maps.
    let (mut new_dims, mut new_device) = (dims, device);
    while new_dims | new_device != 0 {
        let (mut to_device, mut to_dims) = (0, 0);
        for side in [a, b] {
            to_device |= carried(new_dims & side.inside, &side.to_rank);
            to_dims |= carried(new_device & side.inside_ranks, &side.to_element);
        }
        new_device = to_device & !device;
        new_dims = to_dims & !dims;
        device |= to_device;
        dims |= to_dims;
    }
    (dims, device)
}

/// The dim boundary below the one at `top` (bit 0 is one).
#[allow(clippy::inline_always)]
#[inline(always)]
fn bottom_of(dims: u64, top: u32) -> u32 {
    // (`63 - leading_zeros`, not `ilog2`, whose check of 0 costs the kernel about 20
    // instructions a pair: bit 0 is a boundary below `top`.)
    #[allow(clippy::manual_ilog2)]
    let bottom = 63 - (dims & ((1 << top) - 1)).leading_zeros();
    bottom
}

/// The unified dims whose top boundaries are the bits of `tops`, in [`unify_bits`]'s numbering:
/// dim `63 - p` for the one whose top boundary is bit `p`, so that the outermost comes first.
fn unified_dims(tops: u64) -> u64 {
    tops.reverse_bits()
}

/// [`try_unify`] of two layouts of one tensor, by masks ([`Bits`]; `None` if the pair does not
/// unify so, [`Bits::meets`]): returns the unified pair's device boundaries, and gives `each`,
/// per unified tensor dim split on either side, outermost first, its number and the rank bits of
/// its split on each side (0 where it is whole). The dims whole on both sides are left out:
/// Algorithm 1 never acts on them. The numbers rise, but not one by one: dim `63 - p` is the one
/// whose top boundary is element bit `p` ([`Bits::split_dims`] in the same numbering), so that
/// the caller needs no count of the dims handed over.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn unify_bits(
    a: &Bits,
    b: &Bits,
    mut each: impl FnMut(usize, u64, u64),
) -> Option<DeviceBounds> {
    if !a.meets(b) {
        return None;
    }
    let (dims, device) = closed_bounds(a, b);
    // The unified dims are the runs between consecutive dim boundaries; those split on a side
    // end at a split element bit of that side.
    let mut tops = dims & ((a.split | b.split) << 1);
    while tops != 0 {
        // (`tops` is not 0.)
        #[allow(clippy::manual_ilog2)]
        let top = 63 - tops.leading_zeros();
        tops &= !(1 << top);
        let run = bits_between(bottom_of(dims, top), top);
        each(
            (63 - top) as usize,
            a.split_of(run, top),
            b.split_of(run, top),
        );
    }
    Some(device)
}

/// Two layouts of one tensor unified by masks ([`Bits`]), their boundaries closed
/// ([`closed_bounds`]) but their pieces not laid out: the cheap bounds read the pair off the
/// masks ([`BitsPair::splits_into`]), and lay it out only for a layout of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BitsPair<'p> {
    first: (&'p Start, &'p Bits),
    second: (&'p Start, &'p Bits),
    /// The unified pair's dim boundaries (element bits) and device boundaries (rank bits).
    dims: u64,
    device: DeviceBounds,
}

impl<'p> BitsPair<'p> {
    /// The pair of the starts and bits of each side, if it unifies by masks ([`Bits::meets`]).
    pub fn of(first: (&'p Start, &'p Bits), second: (&'p Start, &'p Bits)) -> Option<Self> {
        if !first.1.meets(second.1) {
            return None;
        }
        let (dims, device) = closed_bounds(first.1, second.1);
        Some(BitsPair {
            first,
            second,
            dims,
            device,
        })
    }

    /// The device boundaries of the unified pair.
    pub fn device(&self) -> DeviceBounds {
        self.device
    }

    /// The rank bits of the partial dims of each side ([`Unified::partial`]).
    pub fn partial(&self) -> (u64, u64) {
        (self.first.0.partial, self.second.0.partial)
    }

    /// Calls `each` with every unified dim, outermost first: its index, its size (the one holding
    /// the odd factor with it) and the rank bits of its split on each side (0 where whole).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn each_dim(&self, mut each: impl FnMut(usize, u64, u64, u64)) {
        let (a, b, dims) = (self.first.1, self.second.1, self.dims);
        // The bit the odd factor sits at (any the two sides share: no boundary lies between them).
        let odd = (a.odd & b.odd).trailing_zeros();
        // Outermost first: the boundaries above bit 0, highest first.
        let (mut tops, mut j) = (dims & !1, 0);
        while tops != 0 {
            // (`tops` is not 0.)
            #[allow(clippy::manual_ilog2)]
            let top = 63 - tops.leading_zeros();
            tops &= !(1 << top);
            let bottom = bottom_of(dims, top);
            let size = if a.factor > 1 && (bottom..top).contains(&odd) {
                a.factor << (top - bottom - 1)
            } else {
                1 << (top - bottom)
            };
            let run = bits_between(bottom, top);
            each(j, size, a.split_of(run, top), b.split_of(run, top));
            j += 1;
        }
    }

    /// [`try_unify`] of the pair, by masks, into `into`: every unified dim with its size (the
    /// one holding the odd factor with it).
    pub fn unified_into(&self, into: &mut Unified) {
        into.first.clear();
        into.second.clear();
        self.each_dim(|j, size, s, t| {
            for (split, pieces) in [(s, &mut into.first), (t, &mut into.second)] {
                let range =
                    (split != 0).then(|| (split.trailing_zeros(), 64 - split.leading_zeros()));
                pieces.push(Piece::new(size, range, j));
            }
        });
        into.device = self.device;
        into.partial = self.partial();
    }

    /// [`Unified::splits_into`] of the unified pair, read off the masks: no pieces built, and
    /// the dims visited once (building the pieces and reading them back was most of lining a
    /// pair up for a cheap bound).
    pub fn splits_into(&self, dim_at: &[i8; 64], splits: &mut Vec<(i8, i8)>) -> Splits {
        splits.clear();
        let (mut elements, mut split, mut target_dims, mut twos, mut ndim) =
            (1u64, (0, 0), 0u64, 0, 0);
        // (A split's device dim starts at its lowest rank bit.)
        let entry = |bits: u64| dim_at[bits.trailing_zeros() as usize & 63];
        self.each_dim(|_, size, s, t| {
            elements *= size;
            twos = twos.max(size.trailing_zeros());
            ndim += 1;
            if t != 0 {
                split.1 += t.count_ones();
                target_dims |= 1 << entry(t);
            }
            if s != 0 {
                split.0 += s.count_ones();
                splits.push((entry(s), if t != 0 { entry(t) } else { -1 }));
            }
        });
        let dims = |partial| match partial {
            0 => 0,
            _ => partial_dims(self.device, partial),
        };
        let partial = self.partial();
        Splits {
            partial: (dims(partial.0), dims(partial.1)),
            shards: (elements >> split.0, elements >> split.1),
            elements,
            target_dims,
            twos,
            ndim,
            device: self.device,
        }
    }
}

/// A dim of a reshaped view: size, map entry, and the original dim whose split it carries.
type ViewDim = (u64, i64, Option<usize>);

impl<'a> Reshaped<'a> {
    pub fn new(layout: &'a Layout) -> Self {
        Reshaped {
            layout: Cow::Borrowed(layout),
            groups: Vec::new(),
            canonical: false,
            known: None,
        }
    }

    /// The view of `layout` whose start is `start`, which must be `Start::of(layout)`.
    pub fn with_start(layout: &'a Layout, start: &'a Start) -> Self {
        debug_assert_eq!(&Start::of(layout), start);
        Reshaped {
            known: Some(start),
            ..Reshaped::new(layout)
        }
    }

    /// The start of the view: the known one while the view is the layout's own, else worked out
    /// into `buffer`.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn start<'s>(&'s self, buffer: &'s mut Start) -> &'s Start {
        if let (Some(known), Cow::Borrowed(_), true, false) = (
            self.known,
            &self.layout,
            self.groups.is_empty(),
            self.canonical,
        ) {
            return known;
        }
        self.start_into(buffer);
        buffer
    }

    /// The start of the view, worked out into `out`.
    fn start_into(&self, out: &mut Start) {
        self.pieces_into(&mut out.pieces);
        out.partial = partial_mask(&self.layout);
        out.bounds = outer_bounds(self.layout.num_devices())
            | split_bounds(&out.pieces)
            | partial_bounds(out.partial);
        out.inside = inside_splits(&out.pieces);
    }

    /// Calls `f` with every dim of the view, outermost first.
    fn each_dim(&self, mut f: impl FnMut(ViewDim)) {
        let l = &*self.layout;
        let split = |i: usize| (l.split_degree(i) > 1).then_some(i);
        if !self.canonical {
            for j in 0..self.num_groups() {
                let (s, e) = self.group(j);
                let carried = if e - s == 1 { split(s) } else { None };
                let size = l.shape()[s..e].iter().product();
                f((size, carried.map_or(-1, |i| l.tensor_map()[i]), carried));
            }
            return;
        }
        // The product of the unsplit parts since the last split one, which make one dim.
        let mut run = 1;
        for i in 0..l.ndim() {
            let g = l.split_degree(i);
            if g > 1 {
                if run > 1 {
                    f((run, -1, None));
                }
                run = 1;
                f((g, l.tensor_map()[i], Some(i)));
            }
            run *= l.shape()[i] / g;
        }
        if run > 1 {
            f((run, -1, None));
        }
    }

    /// The pieces of the view, its dims of size above 1 with the rank bits of their splits,
    /// written into `out`.
    fn pieces_into(&self, out: &mut Vec<Piece>) {
        out.clear();
        let mut j = 0;
        self.each_dim(|(size, k, _)| {
            if size > 1 {
                // Only a split of degree above 1 is carried, so the range is not empty.
                let split = (k >= 0).then(|| self.layout.bit_range(k as usize));
                out.push(Piece::new(size, split, j));
            }
            j += 1;
        });
    }

    /// The original dim whose split view dim `j` carries, if any.
    pub fn split_dim(&self, j: usize) -> Option<usize> {
        let mut found = None;
        let mut at = 0;
        self.each_dim(|d| {
            if at == j {
                found = d.2;
            }
            at += 1;
        });
        found
    }

    fn num_groups(&self) -> usize {
        if self.groups.is_empty() {
            self.layout.ndim()
        } else {
            self.groups.len()
        }
    }

    /// The original dims `[s, e)` view dim `j` merges.
    fn group(&self, j: usize) -> (usize, usize) {
        self.groups.get(j).copied().unwrap_or((j, j + 1))
    }

    fn merge(&mut self, j: usize) {
        if self.groups.is_empty() {
            self.groups = (0..self.layout.ndim()).map(|i| (i, i + 1)).collect();
        }
        self.groups[j].1 = self.groups[j + 1].1;
        self.groups.remove(j + 1);
    }

    /// Merges unsplit view dim `j` with an unsplit neighbour, the inner one first.
    fn merge_around(&mut self, j: usize) -> bool {
        if self.canonical || self.split_dim(j).is_some() {
            return false;
        }
        let unsplit = |r: &Reshaped<'_>, j: usize| r.split_dim(j).is_none();
        if j + 1 < self.num_groups() && unsplit(self, j + 1) {
            self.merge(j);
            true
        } else if j > 0 && unsplit(self, j - 1) {
            self.merge(j - 1);
            true
        } else {
            false
        }
    }

    /// Merges every run of adjacent unsplit view dims.
    fn merge_all(&mut self) -> bool {
        if self.canonical {
            return false;
        }
        let mut changed = false;
        let mut j = 0;
        while j + 1 < self.num_groups() {
            if self.split_dim(j).is_none() && self.split_dim(j + 1).is_none() {
                self.merge(j);
                changed = true;
            } else {
                j += 1;
            }
        }
        changed
    }
}

/// Resolves a blocker by reshaping alone, trying the gentlest reshape first: merge around the
/// blocked dim, merge every run of unsplit dims on the other side, then on this side, then take
/// both to the canonical form. `false` when nothing is left to try.
pub(crate) fn reshape_for<'a>(
    blocker: Blocker,
    a: &mut Reshaped<'a>,
    b: &mut Reshaped<'a>,
) -> bool {
    let (this, other) = match blocker.side {
        Side::First => (&mut *a, &mut *b),
        Side::Second => (&mut *b, &mut *a),
    };
    if this.merge_around(blocker.dim) || other.merge_all() || this.merge_all() {
        return true;
    }
    let changed = !(a.canonical && b.canonical);
    a.canonical = true;
    b.canonical = true;
    changed
}

/// Rewrites `a` and `b` to one device matrix and one shape, moving no element
/// (docs/conventions.md#unification).
///
/// # Errors
/// [`Error::Layout`] if the two layouts do not describe one tensor on one set of devices,
/// [`Error::Unify`] if no such rewrite exists (a split boundary that does not line up with the
/// other shape).
pub fn unify(a: &Layout, b: &Layout) -> Result<(Layout, Layout)> {
    check_same_tensor(a, b)?;
    let mut ga = Reshaped::new(a);
    let mut gb = Reshaped::new(b);
    let mut u = Unified::default();
    loop {
        match try_unify(&ga, &gb, &mut u) {
            Ok(()) => return Ok((u.layout(Side::First), u.layout(Side::Second))),
            Err(blocker) => {
                if !reshape_for(blocker, &mut ga, &mut gb) {
                    return Err(Error::Unify(format!(
                        "layouts {a:?} and {b:?} cannot be unified without moving data: a dim \
                         boundary of one falls inside a split of the other"
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;

    #[test]
    fn paper_example() {
        let (s0, s1) = (16, 32);
        let a = layout(&[s0, s1], &[2, 8], &[1, 0]);
        let b = layout(&[s0, s1], &[8, 2], &[1, 0]);
        let (ua, ub) = unify(&a, &b).unwrap();
        assert_eq!(ua.device_matrix(), &[2, 4, 2]);
        assert_eq!(ua.shape(), &[2, s0 / 2, 4, s1 / 4]);
        assert_eq!(ua.tensor_map(), &[2, -1, 1, 0]);
        assert_eq!(ub.device_matrix(), &[2, 4, 2]);
        assert_eq!(ub.shape(), &[2, s0 / 2, 4, s1 / 4]);
        assert_eq!(ub.tensor_map(), &[2, 1, 0, -1]);
    }

    #[test]
    fn normal_form_ignores_unused_factorization() {
        let a = layout(&[8, 1, 8], &[2, 1, 2, 4], &[-1, -1, 0]);
        let b = layout(&[8, 8], &[4, 4], &[-1, 0]);
        assert_eq!(normalized(&a), normalized(&b));
        assert_eq!(normalized(&a).device_matrix(), &[4, 4]);
        assert_ne!(
            normalized(&a),
            normalized(&layout(&[8, 8], &[4, 4], &[0, -1]))
        );
    }

    /// One distribution written two ways: `[32]` split 16 ways, and `[4, 8]` split 4 and 4 ways
    /// along device dims whose bits continue each other.
    #[test]
    fn normal_form_merges_continued_splits() {
        let a = layout(&[64, 32, 16], &[16], &[-1, 0, -1]);
        let b = layout(&[64, 4, 8, 16], &[4, 4], &[-1, 1, 0, -1]);
        assert_eq!(normalized(&a), normalized(&b));
        assert_eq!(normalized(&a).shape(), &[64, 16, 2 * 16]);
        // The split part and the local rest of a split dim, unsplit runs merged.
        let c = layout(&[8, 8, 3], &[4], &[0, -1, -1]);
        assert_eq!(normalized(&c), layout(&[4, 48], &[4], &[0, -1]));
        // Bits that do not continue each other stay apart.
        let d = layout(&[4, 8], &[4, 4], &[0, 1]);
        assert_eq!(normalized(&d).tensor_map(), &[0, 1, -1]);
    }

    #[test]
    fn normal_form_merges_adjacent_partial_dims() {
        let a = Layout::with_partial(vec![8], vec![2, 2, 2], vec![-1], vec![0, 1]).unwrap();
        let b = Layout::with_partial(vec![8], vec![2, 4], vec![-1], vec![0]).unwrap();
        assert_eq!(normalized(&a), normalized(&b));
        assert_eq!(normalized(&a).partial(), &[0]);
        let c = Layout::with_partial(vec![8], vec![2, 2, 2], vec![1], vec![0, 2]).unwrap();
        assert_eq!(normalized(&c).partial(), &[0, 2]);
        assert_ne!(normalized(&a), normalized(&layout(&[8], &[2, 4], &[-1])));
    }

    /// [`unify_bits`] of a pair that unifies by masks: the device boundaries and, per dim handed
    /// over, the split bits on each side; its numbers of the dims rise, and each side's
    /// [`Bits::split_dims`] are the dims split on that side.
    fn lined_up_by_masks(a: &Bits, b: &Bits) -> (DeviceBounds, Vec<(u64, u64)>) {
        let mut got = Vec::new();
        let device = unify_bits(a, b, |dim, s, t| got.push((dim, s, t))).unwrap();
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "{got:?}");
        for (dim, s, t) in &got {
            assert_eq!(a.split_dims() >> dim & 1 == 1, *s != 0, "{got:?}");
            assert_eq!(b.split_dims() >> dim & 1 == 1, *t != 0, "{got:?}");
        }
        (device, got.into_iter().map(|(_, s, t)| (s, t)).collect())
    }

    /// Unification by masks ([`unify_bits`]) is what [`try_unify`] cuts: the same device
    /// boundaries, and per unified dim split on either side the same split bits on each (the
    /// dims whole on both left out), on every pair of the layouts of 64 elements on 8 devices
    /// and of some of them with partial sums, all of which unify as they are.
    #[test]
    fn unification_by_masks_is_the_cuts() {
        use crate::batch::tests::{layouts_of_64, partial_sums_of};

        let mut layouts = layouts_of_64();
        layouts.extend(partial_sums_of(&layouts, 3));
        let starts: Vec<(Start, Bits)> = layouts
            .iter()
            .map(|l| {
                let start = Start::of(l);
                let bits = Bits::of(&start, l.num_elements()).expect("64 elements");
                (start, bits)
            })
            .collect();
        let mut unified = Unified::default();
        let (mut device_cuts, mut dim_cuts) = (0, 0);
        for (a, (sa, ba)) in layouts.iter().zip(&starts) {
            for (b, (sb, bb)) in layouts.iter().zip(&starts) {
                let (va, vb) = (Reshaped::with_start(a, sa), Reshaped::with_start(b, sb));
                try_unify(&va, &vb, &mut unified).unwrap();
                let want: Vec<(u64, u64)> = unified
                    .split_bits(Side::First)
                    .zip(unified.split_bits(Side::Second))
                    .filter(|&bits| bits != (0, 0))
                    .collect();
                let (device, got) = lined_up_by_masks(ba, bb);
                assert_eq!((device, &got), (unified.device(), &want), "{a:?}, {b:?}");
                device_cuts += usize::from(device != sa.bounds | sb.bounds);
                dim_cuts += usize::from(unified.first.len() > sa.pieces.len());
            }
        }
        assert!(
            device_cuts > 1_000 && dim_cuts > 10_000,
            "{device_cuts} {dim_cuts}"
        );
        // A count whose odd factor is split across dims is left to the cuts.
        let odd = layout(&[3, 2, 3], &[2], &[-1, 0, -1]);
        assert!(Bits::of(&Start::of(&odd), odd.num_elements()).is_none());
    }

    /// On tensors of `m * 2^e` elements, a pair unified by masks is unified as [`try_unify`] cuts
    /// it (which unifies it as it is): the same two layouts, on every pair of the layouts of 96,
    /// 48 and 64 elements on 8 devices, and of some with partial sums; the pairs it refuses are
    /// those whose odd factors' bits do not meet, and those the cuts block are among them. Read
    /// off the masks ([`BitsPair::splits_into`]), the pair is what a bound reads of its pieces.
    #[test]
    fn unification_by_masks_of_odd_counts_is_the_cuts() {
        use crate::batch::tests::{layouts_of_64, layouts_of_96, partial_sums_of};

        let mut layouts = layouts_of_96();
        layouts.extend(layouts_of_64());
        let more: [&[u64]; 4] = [&[48], &[3, 16], &[12, 4], &[2, 6, 4]];
        for shape in more {
            for (matrix, map) in [(&[8][..], &[0, -1, -1][..]), (&[2, 4], &[1, 0, -1])] {
                let map = &map[..shape.len()];
                layouts.extend(Layout::new(shape.to_vec(), matrix.to_vec(), map.to_vec()));
            }
        }
        layouts.extend(partial_sums_of(&layouts, 5));
        let prepared: Vec<(Start, Option<Bits>)> = layouts
            .iter()
            .map(|l| {
                let start = Start::of(l);
                let bits = Bits::of(&start, l.num_elements());
                (start, bits)
            })
            .collect();
        let (mut unified, mut masks) = (Unified::default(), Unified::default());
        let (mut by_masks, mut refused, mut blocked) = (0, 0, 0);
        for (a, (sa, ba)) in layouts.iter().zip(&prepared) {
            for (b, (sb, bb)) in layouts.iter().zip(&prepared) {
                if a.num_elements() != b.num_elements() {
                    continue;
                }
                let (va, vb) = (Reshaped::with_start(a, sa), Reshaped::with_start(b, sb));
                let cut = try_unify(&va, &vb, &mut unified);
                let (Some(ba), Some(bb)) = (ba, bb) else {
                    continue;
                };
                let Some(pair) = BitsPair::of((sa, ba), (sb, bb)) else {
                    refused += 1;
                    blocked += usize::from(cut.is_err());
                    continue;
                };
                pair.unified_into(&mut masks);
                // Per rank bit, the device dim starting there (what the matrix's bounds give).
                let (mut dim_at, mut k) = ([-1; 64], 0);
                let mut rest = masks.device() & !(1 << masks.device().ilog2());
                while rest != 0 {
                    dim_at[rest.trailing_zeros() as usize] = k;
                    rest &= rest - 1;
                    k += 1;
                }
                let (mut got, mut want) = (Vec::new(), Vec::new());
                assert_eq!(
                    pair.splits_into(&dim_at, &mut got),
                    masks.splits_into(&dim_at, &mut want),
                    "{a:?}, {b:?}"
                );
                assert_eq!(got, want, "{a:?}, {b:?}");
                assert_eq!(pair.device(), masks.device());
                assert!(cut.is_ok(), "{a:?}, {b:?}");
                by_masks += 1;
                for side in [Side::First, Side::Second] {
                    assert_eq!(masks.layout(side), unified.layout(side), "{a:?}, {b:?}");
                }
                assert_eq!(masks.partial(), unified.partial());
                let (device, got) = lined_up_by_masks(ba, bb);
                let want: Vec<(u64, u64)> = unified
                    .split_bits(Side::First)
                    .zip(unified.split_bits(Side::Second))
                    .filter(|&bits| bits != (0, 0))
                    .collect();
                assert_eq!((device, &got), (unified.device(), &want), "{a:?}, {b:?}");
            }
        }
        assert!(
            by_masks > 10_000 && refused > 100 && blocked > 10,
            "{by_masks} {refused} {blocked}"
        );
    }

    #[test]
    fn reshape_of_replicated_dims_merges() {
        let a = layout(&[6, 4], &[2], &[-1, -1]);
        let b = layout(&[4, 6], &[2], &[-1, -1]);
        let (ua, ub) = unify(&a, &b).unwrap();
        assert_eq!(ua, ub);
        assert_eq!(ua.shape(), &[4, 6]);
    }

    #[test]
    fn flatten_keeps_channel_split() {
        // [b, c, h, w] -> [b, c*h*w] with c split 4 ways: the split stays on the channel part.
        let a = layout(&[8, 16, 3, 3], &[4], &[-1, 0, -1, -1]);
        let b = layout(&[8, 144], &[4], &[-1, 0]);
        let (ua, ub) = unify(&a, &b).unwrap();
        assert_eq!(ua, ub);
    }

    #[test]
    fn misaligned_split_is_a_unify_error() {
        // Each rank holds a column of [6, 16], but a run of 6 consecutive elements of [96].
        let a = layout(&[6, 16], &[16], &[-1, 0]);
        let b = layout(&[96], &[16], &[0]);
        assert!(matches!(unify(&a, &b), Err(Error::Unify(_))));
    }

    #[test]
    fn different_device_or_element_counts_are_layout_errors() {
        let a = layout(&[8], &[2], &[0]);
        assert!(matches!(
            unify(&a, &layout(&[8], &[4], &[0])),
            Err(Error::Layout(_))
        ));
        assert!(matches!(
            unify(&a, &layout(&[16], &[2], &[0])),
            Err(Error::Layout(_))
        ));
    }
}
