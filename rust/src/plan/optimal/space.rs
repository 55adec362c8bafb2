//! The search space of the optimal planner around one unified pair: its layouts ([`State`]: a
//! tensor map and partial dims), the steps between them with their prices, and a lower bound on
//! the price of the rest ([`Space::remaining`], the search's heuristic).
//!
//! Each device dim may split only the tensor dim it splits in the source or in the target, or a
//! dim that neither splits (where a slice shrinks the shard before a dearer step); a dim that
//! splits the same tensor dim at both ends stays, one that splits nothing at either end splits
//! nothing on the way but what a permute hands it (a split the target leaves unsplit, handed to
//! the free dim where it is cheapest to gather), and a free dim whose target dim is unsplit is
//! sliced there first. The
//! plans of Algorithm 1 stay inside, so the search never returns a dearer plan than it, and the
//! space stays small enough to plan the edges of a strategy search.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::locked;
use crate::layout::Layout;
use crate::plan::ops::{volume, LeastRates, Objective, OpKind, Over};
use crate::unify::Splits;

/// The most tensor dims of a unified layout the search takes (a state is a fixed array, so that
/// stepping allocates nothing).
pub(super) const MAX_DIMS: usize = 32;

/// The most device dims whose permutation [`Space::price`] packs in a word (a nibble each).
const PACKED_DIMS: usize = usize::BITS as usize / 4;

/// A layout of the search: the tensor map (-1 past the layout's dims) and the partial device
/// dims (a mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct State {
    pub(super) map: [i8; MAX_DIMS],
    pub(super) partial: u64,
}

/// One word per state, its map's words and partial dims folded by odd multipliers: hashing the
/// map byte by byte left long probe chains in the search's tables (mostly -1 bytes).
impl std::hash::Hash for State {
    fn hash<H: std::hash::Hasher>(&self, hasher: &mut H) {
        let word =
            |c: usize| u64::from_le_bytes(std::array::from_fn(|b| self.map[8 * c + b] as u8));
        let folded = (0..MAX_DIMS / 8).fold(self.partial, |h, c| {
            (h ^ word(c))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29)
        });
        hasher.write_u64(folded);
    }
}

impl State {
    pub(super) fn of(layout: &Layout) -> Self {
        let mut map = [-1; MAX_DIMS];
        for (m, &x) in map.iter_mut().zip(layout.tensor_map()) {
            *m = x as i8;
        }
        State {
            map,
            partial: mask_of(layout.partial()),
        }
    }

    /// [`State::of`] `layout` with its tensor dims in `order` (`order[c]` the dim at position
    /// `c`), without the sorted layout.
    pub(super) fn in_order(layout: &Layout, order: &[usize]) -> Self {
        let mut map = [-1; MAX_DIMS];
        let given = layout.tensor_map();
        for (m, &i) in map.iter_mut().zip(order) {
            *m = given[i] as i8;
        }
        State {
            map,
            partial: mask_of(layout.partial()),
        }
    }

    /// The state an op (`kind` on device dim `k`, tensor dims `i` and `to` as in a `CommOp`; not a
    /// collective-permute) leads to.
    pub(super) fn after(
        mut self,
        kind: OpKind,
        k: usize,
        i: Option<usize>,
        to: Option<usize>,
    ) -> Self {
        let bit = 1u64 << k;
        match (kind, i, to) {
            (OpKind::Slice | OpKind::ReduceScatter, Some(i), _) => self.map[i] = k as i8,
            (OpKind::AllGather, Some(i), _) => self.map[i] = -1,
            (OpKind::AllToAll, Some(i), Some(to)) => {
                self.map[i] = -1;
                self.map[to] = k as i8;
            }
            _ => {}
        }
        if matches!(kind, OpKind::AllReduce | OpKind::ReduceScatter) {
            self.partial &= !bit;
        }
        self
    }

    /// The device dims that split a tensor dim (a mask).
    pub(super) fn used(&self) -> u64 {
        self.map
            .iter()
            .filter_map(|&m| u32::try_from(m).ok())
            .fold(0, |mask, k| mask | 1 << k)
    }
}

/// A step of the search, in a word: a deep search holds millions of them (their size is its
/// memory, and the page faults of its growth).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Step {
    /// `kind` on device dim `k`, tensor dims `i` and `to` as in a `CommOp` (not a
    /// collective-permute).
    Op(OpKind, u8, Option<u8>, Option<u8>),
    /// A collective-permute: the tensor dims (a mask) whose split passes to another device dim:
    /// the one that splits it in the target, or for a tensor dim the target leaves unsplit the
    /// one [`Space::settle`] picks ([`Space::permutes`]).
    Permute(u32),
}

impl Step {
    /// [`Step::Op`] of dims as a `CommOp` numbers them (fewer than 64 device dims and
    /// [`MAX_DIMS`] tensor dims: [`Problem::of`](super::Problem::of)).
    pub(super) fn op(kind: OpKind, k: usize, i: Option<usize>, to: Option<usize>) -> Self {
        Step::Op(kind, k as u8, i.map(|i| i as u8), to.map(|to| to as u8))
    }

    /// The layout this step leads to from `state` (not made canonical) in `space`.
    pub(super) fn from(self, state: State, space: &Space<'_>) -> State {
        match self {
            Step::Op(kind, k, i, to) => state.after(
                kind,
                usize::from(k),
                i.map(usize::from),
                to.map(usize::from),
            ),
            Step::Permute(moved) => {
                let mut next = state;
                let mut deferred = 0u32;
                for i in bits(u64::from(moved)) {
                    match space.buf.target_map[i] {
                        t if t >= 0 => next.map[i] = t,
                        _ => {
                            next.map[i] = -1;
                            deferred |= 1 << i;
                        }
                    }
                }
                let taken = next
                    .map
                    .iter()
                    .filter_map(|&m| u32::try_from(m).ok())
                    .fold(state.partial | space.fixed, |mask, k| mask | 1 << k);
                next.map = space
                    .settle(&state, next.map, deferred, taken)
                    .expect("a permute's destinations");
                next
            }
        }
    }
}

/// The least of `latency + rate * elements` over `rates`; nothing to move prices nothing.
fn least_price(rates: &[(f64, f64)], elements: f64) -> f64 {
    if elements <= 0.0 {
        return 0.0;
    }
    rates
        .iter()
        .map(|&(latency, rate)| latency + rate * elements)
        .fold(f64::INFINITY, f64::min)
}

/// A lower bound on the op that sums the partial sums of device dim `k` (an op of that dim
/// alone, of `g-1` steps at least), moving `(g-1)/g` of a shard split by no more than the device
/// dims of `split`; the dim's rates it used (`least_rates`) are left in `rates`.
fn least_sum_op(
    source: &Layout,
    least: &LeastRates,
    k: usize,
    split: u64,
    rates: &mut Vec<(f64, f64)>,
) -> f64 {
    let g = source.dim_size(k) as f64;
    least.least_rates_into(k, 1 << k, split, rates);
    let whole = source.num_elements() as f64;
    least_stepped(rates, g - 1.0, (g - 1.0) / g * whole)
}

/// The least of `latency * steps + rate * elements` over `rates`: a collective's every step pays
/// its level's latency (a ring or pairwise collective of `g` devices runs `g-1` steps at least,
/// an all-reduce `2 (g-1)`; a permute one); nothing to move prices nothing.
fn least_stepped(rates: &[(f64, f64)], steps: f64, elements: f64) -> f64 {
    if elements <= 0.0 {
        return 0.0;
    }
    rates
        .iter()
        .map(|&(latency, rate)| latency * steps + rate * elements)
        .fold(f64::INFINITY, f64::min)
}

/// Per device dim, a lower bound on the op that sums its partial sums (`least_sum`), and `least`
/// and `share` of the ops the sum takes (`sum_ops`), into `dims` (by `goal`, per device dim the
/// tensor dim the target splits along it). A dim holding
/// partial sums splits nothing: its sum (an op of that dim alone, of `g-1` steps at least) moves
/// `(g-1)/g` of a shard split by the other dims at most. A sum along which the target splits
/// nothing is an all-reduce (`2 (g-1)` steps moving `2 (g-1)/g` shards, on the same groups), or
/// a reduce-scatter and then an op that ends the split it made (`least_leave`, `share_leave`).
/// No step makes partial sums, so only the source's partial dims ever hold them: the other dims'
/// entries are 0, never read (working them out took a third of bounding a pair's source).
fn sums(
    source: &Layout,
    least: &LeastRates,
    (splitting, goal): (u64, &[Option<usize>]),
    rates: &mut Vec<(f64, f64)>,
    dims: &mut DimBounds,
) {
    let whole = source.num_elements() as f64;
    let partial = mask_of(source.partial());
    let DimBounds {
        least_leave,
        share_leave,
        least_sum,
        sum_ops,
        ..
    } = dims;
    least_sum.clear();
    sum_ops.clear();
    for k in 0..source.num_device_dims() {
        let (sum, ops) = if partial >> k & 1 == 0 {
            (0.0, (0.0, 0.0))
        } else {
            let sum = least_sum_op(source, least, k, splitting & !(1 << k), rates);
            if goal[k].is_some() {
                (sum, (sum, sum))
            } else {
                let g = source.dim_size(k) as f64;
                let all_reduce = least_stepped(rates, 2.0 * (g - 1.0), 2.0 * (g - 1.0) / g * whole);
                let ops = (
                    all_reduce.min(sum + least_leave[k]),
                    all_reduce.min(sum + share_leave[k]),
                );
                (sum, ops)
            }
        };
        least_sum.push(sum);
        sum_ops.push(ops);
    }
}

/// The most device dims holding partial sums in a source whose sums' orders the bound tries
/// ([`chains_into`]): `2^CHAINED` sets of sums to go.
const CHAINED: u32 = 4;

/// For each set `P` of the dims of `partial` (if no more than [`CHAINED`]), a lower bound on the
/// price of the ops that sum them from a layout where they are the sums to go: in some order,
/// each an op of its dim alone on a shard split by no more than the dims of `splitting` that
/// are not sums to go and those summed before it (a sum splits at most its own dim: an
/// all-reduce none, a reduce-scatter its own), so the least over the orders of the `(g-1)/g`
/// shards each moves (`op(k, split)`: [`least_sum_op`] of dim `k` on a shard split by no more
/// than `split`). A sum that comes first cannot have its shard split by the others, which
/// `least_sum` assumes. Into `least`, the sets in increasing order.
fn chains_into(
    partial: u64,
    splitting: u64,
    mut op: impl FnMut(usize, u64) -> f64,
    least: &mut Vec<(u64, f64)>,
) {
    least.clear();
    if partial.count_ones() > CHAINED {
        return;
    }
    // `least[P]`, for `P` a subset of `partial` (at most 16: a list, not a map), built up from
    // the smaller subsets: the subsets in increasing order, each a proper subset's successor, so
    // the `i`-th is the one whose bits, packed below each other, spell `i` (a subset's entry
    // read off its bits, not looked for). (A sum alone is its op plus nothing: its
    // `least_sum`.)
    let index = |p: u64| {
        bits(partial)
            .enumerate()
            .fold(0, |i, (j, k)| i | ((p >> k & 1) as usize) << j)
    };
    let mut to_go = 0u64;
    loop {
        let split = splitting & !to_go;
        let price = bits(to_go).fold(if to_go == 0 { 0.0 } else { f64::INFINITY }, |price, k| {
            price.min(op(k, split) + least[index(to_go & !(1 << k))].1)
        });
        least.push((to_go, price));
        if to_go == partial {
            return;
        }
        to_go = (to_go | !partial).wrapping_add(1) & partial;
    }
}

/// The least price of an op moving `elements` per device over any group, by the `rates` of every
/// device dim (one list: the least over every dim's is the least over all; none without a dim).
fn cheapest(rates: &[(f64, f64)], elements: f64) -> f64 {
    if rates.is_empty() {
        return f64::INFINITY;
    }
    least_price(rates, elements)
}

pub(super) fn mask_of(dims: &[usize]) -> u64 {
    dims.iter().fold(0, |m, &k| m | 1 << k)
}

fn bits(mask: u64) -> impl Iterator<Item = usize> {
    let mut rest = mask;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let k = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            k
        })
    })
}

/// Per device dim of the unified pair `source` -> `target`, the tensor dims it may split on the
/// way (a mask): every dim its size divides, for a device dim that splits a tensor dim at either
/// end or holds partial sums in the source; none for the others (they would only have to be
/// gathered again).
pub(super) fn allowed(source: &Layout, target: &Layout) -> Vec<u64> {
    let mut out = Vec::new();
    allowed_into(source, target, &mut out);
    out
}

/// [`allowed`] into `out`.
fn allowed_into(source: &Layout, target: &Layout, out: &mut Vec<u64>) {
    out.clear();
    out.resize(source.num_device_dims(), 0);
    for (d, group) in by_size(source, may_split(source, target)) {
        let dims = (0..source.ndim())
            .filter(|&i| divides(d, source.shape()[i]))
            .fold(0, |m, i| m | 1 << i);
        for k in bits(group) {
            out[k] = dims;
        }
    }
}

/// The device dims [`allowed`] gives some tensor dim to split (a mask), without the tensor dims:
/// all a bound reads of it (working out every dim's mask was a tenth of a bound's space).
pub(super) fn allowed_dims(source: &Layout, target: &Layout) -> u64 {
    by_size(source, may_split(source, target))
        .filter(|&(d, _)| source.shape().iter().any(|&x| divides(d, x)))
        .fold(0, |m, (_, group)| m | group)
}

/// [`allowed`] the other way round, into `out`: per tensor dim, the device dims that may split
/// it (a mask). The bounded tables key every pair by these columns.
pub(super) fn allowed_columns(source: &Layout, target: &Layout, out: &mut Vec<u64>) {
    out.clear();
    out.resize(source.ndim(), 0);
    for (d, group) in by_size(source, may_split(source, target)) {
        for (column, &x) in out.iter_mut().zip(source.shape()) {
            if divides(d, x) {
                *column |= group;
            }
        }
    }
}

/// The device dims of `dims` (a mask) by size: each size with its dims (a mask). A matrix has
/// few sizes (the usual one, one): a tensor dim is tested once per size, not once per dim.
fn by_size(layout: &Layout, dims: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut rest = dims;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let d = layout.dim_size(rest.trailing_zeros() as usize);
            let group = bits(rest)
                .filter(|&k| layout.dim_size(k) == d)
                .fold(0, |m, k| m | 1 << k);
            rest &= !group;
            (d, group)
        })
    })
}

/// The device dims that may split a tensor dim on the way (a mask): those that split one at
/// either end or hold partial sums in the source.
fn may_split(source: &Layout, target: &Layout) -> u64 {
    // The layouts' masks of used dims, not a scan of their maps per dim (the dims, fewer than
    // 64, are the masks' own).
    debug_assert_eq!(source.device_matrix(), target.device_matrix());
    source.used_dims() | target.used_dims() | mask_of(source.partial())
}

/// Whether `d` divides `x`: a mask, not a division, for the usual power-of-two dim (the bounded
/// tables ask this of every pair).
fn divides(d: u64, x: u64) -> bool {
    if d.is_power_of_two() {
        x & (d - 1) == 0
    } else {
        x.is_multiple_of(d)
    }
}

/// The runs `[start, end)` of two or more adjacent tensor dims that play one part: unsplit at
/// both ends, split on the way by the same device dims. No price and no step tells them apart (a
/// price sees the shard, not which dim a device dim splits), so the search keeps one layout of
/// each class of layouts that differ only by a permutation within runs: the one whose map is
/// sorted within each run ([`canonical`]). The problem's sorted order puts such dims together.
pub(super) fn runs(source: &Layout, target: &Layout, allowed: &[u64]) -> Vec<(usize, usize)> {
    let (src, tgt) = (source.tensor_map(), target.tensor_map());
    let column = |i: usize| {
        (src[i] < 0 && tgt[i] < 0).then(|| {
            (0..allowed.len())
                .filter(|&k| allowed[k] >> i & 1 == 1)
                .fold(0u64, |m, k| m | 1 << k)
        })
    };
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=src.len() {
        if i == src.len() || column(i).is_none() || column(i) != column(start) {
            if i - start >= 2 && column(start).is_some() {
                out.push((start, i));
            }
            start = i;
        }
    }
    out
}

/// `state` with its map sorted within each of `runs`: one layout per class of equivalent ones.
pub(super) fn canonical(mut state: State, runs: &[(usize, usize)]) -> State {
    for &(start, end) in runs {
        state.map[start..end].sort_unstable();
    }
    state
}

/// The permutation of tensor dims (within `runs`) that takes `from` to `to`, two layouts of one
/// class: `pi[i]` is the dim of `to` that holds what dim `i` of `from` holds.
pub(super) fn matching(from: &State, to: &State, runs: &[(usize, usize)]) -> [usize; MAX_DIMS] {
    let mut pi: [usize; MAX_DIMS] = std::array::from_fn(|i| i);
    for &(start, end) in runs {
        let mut free = (start..end).filter(|&j| to.map[j] < 0);
        for (p, &m) in pi[start..end].iter_mut().zip(&from.map[start..end]) {
            *p = if m < 0 {
                free.next().expect("one class")
            } else {
                (start..end).find(|&j| to.map[j] == m).expect("one class")
            };
        }
    }
    pi
}

/// The layout of `state` on `template`'s shape and device matrix.
pub(super) fn state_layout(template: &Layout, state: &State) -> Layout {
    template.with_state(
        state.map[..template.ndim()]
            .iter()
            .map(|&m| i64::from(m))
            .collect(),
        bits(state.partial).collect(),
    )
}

/// The device dims that may split the tensor on the way (a mask): those `allowed` to, and those
/// a permute may hand a split to (any dim that is not `fixed`, of the size of one that may move).
/// `allowed` is the mask of the dims [`allowed`] gives a tensor dim ([`allowed_dims`]).
fn splitting(allowed: u64, fixed: u64, same_size: &[u64]) -> u64 {
    (0..same_size.len())
        .filter(|&d| fixed >> d & 1 == 0 && same_size[d] & allowed & !fixed != 0)
        .fold(allowed, |m, d| m | 1 << d)
}

/// Per device dim of `h`, the tensor dim the target map `tgt` splits along it, if any (into
/// `goal`); and the device dims that split the same tensor dim in the source map `src` (a mask).
/// Each map read once, not once per device dim (a map names each device dim once).
fn goal_and_fixed(src: &[i64], tgt: &[i64], h: usize, goal: &mut Vec<Option<usize>>) -> u64 {
    goal.clear();
    goal.resize(h, None);
    for (i, &m) in tgt.iter().enumerate() {
        if let Ok(k) = usize::try_from(m) {
            goal[k] = Some(i);
        }
    }
    src.iter()
        .enumerate()
        .filter_map(|(i, &m)| usize::try_from(m).ok().filter(|&k| goal[k] == Some(i)))
        .fold(0u64, |mask, k| mask | 1 << k)
}

/// The device dims of `source`'s matrix, cheapest first, by the price of the all-gather along
/// each that ends at `target`'s shard, from `target` with that dim splitting too (the last
/// gather of a split the target does not keep), ties by index.
fn preferred(source: &Layout, target: &Layout, objective: Objective<'_>) -> Vec<usize> {
    let target_distinct = target
        .tensor_map()
        .iter()
        .filter_map(|&m| u32::try_from(m).ok())
        .fold(mask_of(target.partial()), |mask, k| mask | 1 << k);
    let gather = |k: usize| {
        let g = source.dim_size(k);
        let volume = volume(OpKind::AllGather, g, target.shard_size() / g);
        objective.price_on(
            OpKind::AllGather,
            Over::Group(1 << k),
            volume,
            source.device_matrix(),
            |d| (target_distinct | 1 << k) >> d & 1 == 1,
        )
    };
    // Each dim priced once, not once per comparison.
    let prices: Vec<f64> = (0..source.num_device_dims()).map(gather).collect();
    let mut order: Vec<usize> = (0..prices.len()).collect();
    order.sort_by(|&a, &b| prices[a].total_cmp(&prices[b]).then(a.cmp(&b)));
    order
}

/// A unit of devices the elements entering which bound the price ([`Space::bring`]), as the
/// cluster gives it on layouts of one device matrix.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Unit {
    /// Per device dim, the coordinates of it the unit holds (`e_k`).
    extents: Vec<f64>,
    /// Per device dim, the part of its coordinates the unit holds (`e_k / d_k`).
    held: Vec<f64>,
    /// The latency and price per element of bringing elements into the unit.
    latency: f64,
    rate: f64,
}

impl Unit {
    /// The elements the unit lacks of the `needed` elements its devices need together
    /// ([`Space::bring`]'s term for one unit), the tensor dims mapped as `maps` gives them:
    /// per dim, the device dim splitting it now and in the goal (-1 for none).
    fn lack(&self, needed: f64, maps: impl IntoIterator<Item = (i8, i8)>) -> f64 {
        let mut part = 1.0;
        for (m, t) in maps {
            let Ok(s) = usize::try_from(m) else { continue };
            if m == t || self.held[s] >= 1.0 {
                continue;
            }
            if usize::try_from(t).is_ok_and(|t| self.held[t] < 1.0) {
                part = 0.0;
                break;
            }
            part *= self.held[s];
        }
        needed * (1.0 - part)
    }

    /// Whether the unit lacks a coordinate of some device dim of `dims` (a mask).
    fn lacks_any(&self, dims: u64) -> bool {
        bits(dims).any(|k| self.held[k] < 1.0)
    }
}

/// The least price of bringing elements into nested units at once ([`Space::bring`]): the
/// units innermost first (a device, then a unit of each level), each with the elements it
/// lacks, fed outermost first ([`Nested::add`]). An op of a level brings into every unit below
/// it at most what its price pays for at that level's rate, so with `B_i` the elements ops
/// bring into units of `i` or higher at the rate of `i` (the rates grow outward: a unit's is
/// the fastest level above it), their least price is `sum_i B_i (r_i - r_{i-1})` over the
/// suffix sums `B_i`, each at least the most any unit of `i` or higher lacks: a device lacking
/// more than its node brings the rest in at the faster rate, where the dearest unit alone
/// priced everything at one rate. One latency: that of the outermost unit lacking something
/// (the op bringing into it pays at least that). Each op lowers the price by no more than it
/// pays: the bound stays consistent.
#[derive(Default)]
struct Nested {
    most: f64,
    price: f64,
    latency: Option<f64>,
}

impl Nested {
    /// Unit `u` of `units`, lacking `lack` elements (the units past it added before).
    fn add(&mut self, units: &[Unit], u: usize, lack: f64) {
        let unit = &units[u];
        if lack > 0.0 && self.latency.is_none() {
            self.latency = Some(unit.latency);
        }
        self.most = self.most.max(lack);
        let inner = u.checked_sub(1).map_or(0.0, |v| units[v].rate);
        self.price += self.most * (unit.rate - inner);
    }

    fn price(&self) -> f64 {
        self.latency.map_or(0.0, |latency| latency + self.price)
    }
}

/// [`Space::bring`]'s two bounds on `units`, unit `u`'s devices needing `needed(u, unit)`
/// elements together, from the splits `maps` gives (per tensor dim, the device dim splitting it
/// now and in the goal), the dims `sums` holding partial sums to go.
fn bring<M: Iterator<Item = (i8, i8)>>(
    units: &[Unit],
    needed: impl Fn(usize, &Unit) -> f64,
    maps: impl Fn() -> M,
    sums: u64,
) -> (f64, f64) {
    let mut entering = Nested::default();
    // Most layouts a search reaches hold no sums to go: then both are one. (A loop of its own:
    // one loop testing `sums` per unit cost GPT-3's cheap bounds 19 M instructions more.)
    if sums == 0 {
        for (u, unit) in units.iter().enumerate().rev() {
            entering.add(units, u, unit.lack(needed(u, unit), maps()));
        }
        let price = entering.price();
        return (price, price);
    }
    let mut unsummed = Nested::default();
    for (u, unit) in units.iter().enumerate().rev() {
        let needed = needed(u, unit);
        let lack = unit.lack(needed, maps());
        entering.add(units, u, lack);
        let whole = unit.lacks_any(sums);
        unsummed.add(units, u, if whole { needed } else { lack });
    }
    (entering.price(), unsummed.price())
}

/// What a bound reads of the cluster on layouts of one device matrix, whatever the pair: the
/// lower bounds on the ops' prices ([`Objective::least_rates_of`]) and the units of
/// [`Space::bring`]. Working them out again for every pair took about a sixth of bounding
/// one.
pub(super) struct MatrixBounds {
    least_rates: LeastRates,
    units: Vec<Unit>,
    /// Per device dim, the device dims of the same size.
    same_size: Vec<u64>,
    /// Per device dim `k`, the rates of [`LeastRates::least_rates_into`] with no dim splitting,
    /// for a group of `k` alone and for a wider one: they depend on the group only through
    /// whether it is wider (the level it may reach), so every pair on the matrix reads them
    /// (working them out per pair was a twentieth of bounding one). In one list (GPT-3's calls
    /// meet hundreds of matrices), `k`'s from `unsplit_at[k]`: alone up to the second entry,
    /// wide up to the third.
    unsplit: Vec<(f64, f64)>,
    unsplit_at: Vec<[usize; 3]>,
    /// What [`MatrixBounds::cheap_bound`] reads instead of a pair's [`DimBounds`].
    cheap: CheapRates,
    /// The bounds per device dim of the sources on the matrix ([`DimBounds`]) met so far, by
    /// their permutable, splitting, partial and partial target-split dims and their elements.
    dims: Mutex<FxHashMap<[u64; 5], Arc<DimBounds>>>,
}

impl MatrixBounds {
    /// The bounds on layouts of `layout`'s device matrix under `objective`.
    pub(super) fn of(objective: Objective<'_>, layout: &Layout) -> Self {
        let h = layout.num_device_dims();
        let units = objective
            .entering_rates(layout)
            .into_iter()
            .map(|(extents, latency, rate)| Unit {
                held: (0..h)
                    .map(|k| extents[k] as f64 / layout.dim_size(k) as f64)
                    .collect(),
                extents: extents.iter().map(|&e| e as f64).collect(),
                latency,
                rate,
            })
            .collect();
        let least_rates = objective.least_rates_of(layout);
        let (mut unsplit, mut unsplit_at, mut rates) =
            (Vec::new(), Vec::with_capacity(h), Vec::new());
        for k in 0..h {
            let start = unsplit.len();
            least_rates.least_rates_into(k, 1 << k, 0, &mut rates);
            unsplit.extend_from_slice(&rates);
            let wide = unsplit.len();
            least_rates.least_rates_into(k, u64::MAX, 0, &mut rates);
            unsplit.extend_from_slice(&rates);
            unsplit_at.push([start, wide, unsplit.len()]);
        }
        let same_size = same_size(layout);
        let cheap = CheapRates::of(layout, &least_rates, &same_size, &unsplit);
        MatrixBounds {
            least_rates,
            units,
            same_size,
            unsplit,
            unsplit_at,
            cheap,
            dims: Mutex::default(),
        }
    }

    /// The [`DimBounds`] of `key` ([`MatrixBounds::dims`]'s), worked out by `work` if not met
    /// before (not under the lock: another thread may ask for another key meanwhile).
    fn dims(&self, key: [u64; 5], work: impl FnOnce() -> DimBounds) -> Arc<DimBounds> {
        if let Some(dims) = locked(&self.dims).get(&key) {
            return Arc::clone(dims);
        }
        let dims = Arc::new(work());
        let mut map = locked(&self.dims);
        if map.len() >= DIMS_KEPT {
            map.clear();
        }
        map.insert(key, Arc::clone(&dims));
        dims
    }
}

/// The buffers [`MatrixBounds::cheap_bound`] works in, pair after pair.
#[derive(Default)]
pub(crate) struct CheapBuffers {
    /// One op's rates.
    rates: Vec<(f64, f64)>,
    /// The sums' chains ([`chains_into`]).
    chains: Vec<(u64, f64)>,
    /// The least price of the sums to go, by device matrix (its rank-bit boundaries), sums,
    /// splitting dims and elements.
    chained: FxHashMap<[u64; 4], f64>,
    /// The least price of all-reducing the sums to go over any groups ([`all_reduced`]), by
    /// their rank bits, the dims splitting the tensor and its elements.
    summed: FxHashMap<[u64; 3], f64>,
}

/// What [`MatrixBounds::cheap_bound`] prices alike for every pair of one tensor on its matrix,
/// worked out once per tensor (a call's pairs are of one): per device dim, the removal of a
/// split along it alone; per class of [`CheapRates::moving`], its least op.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct TensorPrices {
    /// The tensor's elements (0 before the first).
    elements: u64,
    removal: Vec<f64>,
    moving: Vec<f64>,
}

impl CheapBuffers {
    /// The chains' prices kept.
    pub(super) fn held(&self) -> usize {
        self.chained.len() + self.summed.len()
    }
}

/// Rates below those a pair's [`DimBounds`] holds, whatever the pair on the matrix: the bound
/// of [`MatrixBounds::cheap_bound`], with no [`DimBounds`] to work out or look up (a sixth of
/// GPT-3's bound keys had one of their own, each worked out for a dozen pairs). A shard is at
/// least the tensor over the dims splitting it, so the rates with every dim splitting (and for
/// a group wider than one dim, as wide as the matrix) are at most those of any pair.
#[derive(Debug)]
struct CheapRates {
    /// The distinct rates of `unsplit`: a pair's `DimBounds::rates` is a choice of them.
    unsplit: Vec<(f64, f64)>,
    /// Per device dim `k`, from `removal_at[k]` to `removal_at[k + 1]`: the distinct rates of a
    /// collective of one dim of its size alone, every dim splitting (`DimBounds::removal`).
    removal: Vec<(f64, f64)>,
    removal_at: Vec<usize>,
    /// The rates of an op whose group holds a device dim, every dim splitting
    /// (`DimBounds::least`, a collective of the dim alone or a permute of several dims): per
    /// class of dims of the same rates and size (a few per matrix: the pairs ask for the least
    /// over the dims that are not fixed), the dims (a mask), where its rates lie in `moving`,
    /// and the part of the tensor its collectives move at least (`collective`'s).
    moving: Vec<(f64, f64)>,
    moving_classes: Vec<(u64, std::ops::Range<usize>, f64)>,
    /// Per device dim of `g` devices, the steps of a collective of it alone and the part of
    /// the tensor it moves at least: `g-1`, `(g-1)/g`.
    collective: Vec<(f64, f64)>,
    /// Per count of factors of two, the device dims of no more (a mask): those dividing a
    /// tensor dim of that many.
    dividing: [u64; 64],
    /// Per device dim, its factors of two (matrices of powers of two).
    twos: Vec<u32>,
    /// Per level, `(latency, rate)` of an op over any group reaching it with nothing splitting
    /// the tensor ([`LeastRates::group_rates_into`] of one rank bit): an op of any plan, on any
    /// devices, prices at least one of them. Empty unless the matrix is of powers of two.
    any: Vec<(f64, f64)>,
    /// The least latency and the least rate of `any`, apart: what ops of several levels pay at
    /// least per step and per element.
    least: (f64, f64),
    /// Per rank bit, the device dim whose bits start there (-1 inside a dim, or past the
    /// matrix): a unified pair's splits read off their rank bits ([`Unified::splits_into`](crate::unify::Unified::splits_into),
    /// whose matrices are of powers of two; for others, every entry is -1 and unread).
    dim_at: [i8; 64],
}

impl CheapRates {
    /// The rates on a device matrix of `least_rates`, whose dims of one size are `same_size`
    /// and whose rates with no dim splitting are `unsplit`.
    fn of(
        layout: &Layout,
        least_rates: &LeastRates,
        same_size: &[u64],
        unsplit: &[(f64, f64)],
    ) -> Self {
        let h = same_size.len();
        let every = if h < 64 { (1u64 << h) - 1 } else { u64::MAX };
        // Equal rates give equal prices: one of each is enough for the least.
        let push_distinct = |out: &mut Vec<(f64, f64)>, from: usize, rates: &[(f64, f64)]| {
            for &rate in rates {
                if !out[from..].contains(&rate) {
                    out.push(rate);
                }
            }
        };
        let mut cheap = CheapRates {
            unsplit: Vec::new(),
            removal: Vec::new(),
            removal_at: Vec::new(),
            moving: Vec::new(),
            moving_classes: Vec::new(),
            collective: Vec::new(),
            dividing: [0; 64],
            twos: Vec::new(),
            any: Vec::new(),
            least: (f64::INFINITY, f64::INFINITY),
            dim_at: [-1; 64],
        };
        if layout.device_matrix().iter().all(|d| d.is_power_of_two()) {
            least_rates.group_rates_into(1, 0, &mut cheap.any);
            cheap.least =
                (cheap.any.iter()).fold(cheap.least, |(l, r), &(a, b)| (l.min(a), r.min(b)));
            let mut bit = 0;
            for k in 0..h {
                cheap.dim_at[bit] = k as i8;
                let twos = layout.dim_size(k).trailing_zeros() as usize;
                cheap.twos.push(twos as u32);
                bit += twos;
                for dividing in &mut cheap.dividing[twos..] {
                    *dividing |= 1 << k;
                }
            }
        }
        push_distinct(&mut cheap.unsplit, 0, unsplit);
        cheap.collective.extend((0..h).map(|k| {
            let g = layout.dim_size(k) as f64;
            (g - 1.0, (g - 1.0) / g)
        }));
        let mut rates = Vec::new();
        let mut alone = Vec::with_capacity(h);
        for k in 0..h {
            least_rates.least_rates_into(k, 1 << k, every, &mut rates);
            alone.push(rates.clone());
            least_rates.least_rates_into(k, every, every, &mut rates);
            let part = cheap.collective[k].1;
            let moving = &cheap.moving;
            let class = (cheap.moving_classes.iter_mut()).find(|(_, at, p)| {
                p.to_bits() == part.to_bits() && moving[at.clone()] == rates[..]
            });
            if let Some((dims, ..)) = class {
                *dims |= 1 << k;
            } else {
                let at = moving.len()..moving.len() + rates.len();
                cheap.moving.extend_from_slice(&rates);
                cheap.moving_classes.push((1 << k, at, part));
            }
        }
        for &group in same_size {
            let from = cheap.removal.len();
            cheap.removal_at.push(from);
            for d in bits(group) {
                push_distinct(&mut cheap.removal, from, &alone[d]);
            }
        }
        cheap.removal_at.push(cheap.removal.len());
        cheap
    }
}

impl MatrixBounds {
    /// Per rank bit, the device dim starting there on this matrix (of powers of two; -1 inside
    /// a dim): what [`Unified::splits_into`](crate::unify::Unified::splits_into) reads a pair on it with.
    pub(super) fn dim_at(&self) -> &[i8; 64] {
        &self.cheap.dim_at
    }

    /// A lower bound on [`Space::remaining`] at the source of the unified pair `pair` on this
    /// device matrix (what [`super::Bounds::bound`] gives the pair), from the matrix's bounds
    /// alone ([`CheapRates`]): no key, no memo, no [`DimBounds`]. Of the five terms, the
    /// largest `least` and the sum of the `share`s (which need the pair's [`DimBounds`]) are
    /// left out; the others are each at most the space's: the shard's growth, the last op, the
    /// elements entering a unit (or all it needs while sums to go are missing there) and the
    /// splits' removals, on the [`CheapRates`], with the sums' ops on top as the space prices
    /// them (their chains on the pair's splitting dims). The pair's tensor dims stay in their
    /// order, not the key's, which can round a product or a sum otherwise: scaled down by a
    /// hair more. With it, whether it is also at most Algorithm 1's cost of the pair's two
    /// distributions as any layouts give them ([`MatrixBounds::any_plan`]: then the bound may
    /// be one on every plan instead, within [`NEAR`] of this one).
    pub(super) fn cheap_bound(
        &self,
        pair: &Splits,
        splits: &[(i8, i8)],
        prices: &mut TensorPrices,
        buffers: &mut CheapBuffers,
    ) -> (f64, bool) {
        let cheap = &self.cheap;
        let whole = pair.elements as f64;
        let prices = self.tensor_prices(pair.elements, prices);
        // [`Space::removals`] at the source: the splits are those of the source.
        let (mut removed, mut wrong, mut fixed, mut used) = (0.0, false, 0u64, 0u64);
        // The factors of two of the splits the target does not keep.
        let mut leaving = 0u32;
        for &(m, t) in splits {
            let k = m as usize;
            used |= 1 << k;
            if t < 0 {
                removed += prices.removal[k];
                leaving += cheap.twos[k];
            } else if m != t {
                wrong = true;
            } else {
                fixed |= 1 << k;
            }
        }
        // The sums' ops in their cheapest order, as the space's `DimBounds` price them, on the
        // dims that may split the tensor: those [`splitting`] gives the dims [`allowed_dims`]
        // gives (used at either end or summed, of a size dividing a tensor dim). With every dim
        // splitting and each sum on its smallest shard, GPT-3's partial pairs got a tenth of the
        // space's bound (a mean of 0.86 of it over its tables, 0.99 now).
        let sums = pair.partial.0 & !pair.partial.1;
        let chained = if sums == 0 {
            0.0
        } else {
            let dividing = cheap.dividing[pair.twos.min(63) as usize];
            let allowed = (used | pair.target_dims | pair.partial.0) & dividing;
            let may = splitting(allowed, fixed, &self.same_size);
            let CheapBuffers {
                rates,
                chains,
                chained,
                ..
            } = buffers;
            // Worked out once per matrix, sums, splitting dims and elements on a thread (a
            // table's partial pairs share a few: working each out took a fifth of the cheap
            // table's GPT-3 work).
            *chained
                .entry([pair.device, sums, may, pair.elements])
                .or_insert_with(|| {
                    let mut op = |k: usize, split: u64| {
                        self.least_rates.least_rates_into(k, 1 << k, split, rates);
                        let (steps, part) = cheap.collective[k];
                        least_stepped(rates, steps, part * whole)
                    };
                    // As the space's `chains` (over every partial dim there: a set of sums to
                    // go is worked out alike from its own subsets), or as its sum past
                    // [`CHAINED`].
                    chains_into(sums, may, &mut op, chains);
                    match chains.last() {
                        Some(&(_, least)) => least,
                        None => bits(sums).map(|k| op(k, may & !(1 << k))).sum::<f64>(),
                    }
                })
        };
        let goal_shard = pair.shards.1 as f64;
        let grow = cheapest(&cheap.unsplit, goal_shard - pair.shards.0 as f64) + chained;
        let sliced = sums == 0 && splits.iter().all(|&(m, t)| m == t);
        let last = if sliced {
            0.0
        } else {
            cheapest(&cheap.unsplit, goal_shard / 2.0)
        };
        if wrong {
            // An op of a dim that is not fixed: one step at least.
            let moving = (cheap.moving_classes.iter().zip(&prices.moving))
                .filter(|((dims, ..), _)| dims & !fixed != 0)
                .map(|(_, &least)| least)
                .fold(f64::INFINITY, f64::min);
            removed += moving;
        }
        // [`Space::bring`] at the source, unit by unit.
        let needed =
            |_, unit: &Unit| bits(pair.target_dims).fold(goal_shard, |n, k| n * unit.extents[k]);
        let (entering, unsummed) = bring(&self.units, needed, || splits.iter().copied(), sums);
        let bring = (entering + chained).max(unsummed);
        let space = grow.max(last).max(bring).max(removed + chained);
        let hair = (1.0 - 1e-9) * (1.0 - 1e-12);
        let plan = AnyPlan {
            sliced,
            leaving,
            used,
            sums,
            entering,
            unsummed,
        };
        let (bound, below) = self.any_plan(pair, &plan, space, buffers);
        (bound * hair, below)
    }

    /// [`MatrixBounds::cheap_bound`] of `pair` from the search's bound `space` and `plan`: a
    /// bound on every plan (one of Algorithm 1's of any layouts of the pair's distributions
    /// among them) near `space`, and `true`; else `space` and `false` (on a matrix of powers of
    /// two only: a device dim's groups are then runs of rank bits).
    fn any_plan(
        &self,
        pair: &Splits,
        plan: &AnyPlan,
        space: f64,
        buffers: &mut CheapBuffers,
    ) -> (f64, bool) {
        let cheap = &self.cheap;
        if cheap.any.is_empty() {
            return (space, false);
        }
        let (whole, goal_shard) = (pair.elements as f64, pair.shards.1 as f64);
        // Of any ops over any groups of devices (whose device dims can split or join the
        // pair's): the shard's growth and the last op at the fastest level, and the elements
        // entering a unit.
        let grow = cheapest(&cheap.any, goal_shard - pair.shards.0 as f64);
        let last = if plan.sliced {
            0.0
        } else {
            cheapest(&cheap.any, goal_shard / 2.0)
        };
        // A split the target does not keep ends in an op over a group holding its rank bits
        // (a permute only hands it to others), each of `b` bits at least `b` steps
        // (`2^b - 1`): one step per factor of two of those splits, the ops moving at least
        // `1 - 2^-n` of a shard, and a shard at least the tensor over every device. (Several
        // ops, maybe of several levels: the least latency and the least rate apart.)
        let leave = if plan.leaving == 0 {
            0.0
        } else {
            let share = 1.0 - half_power(plan.leaving);
            let smallest = whole * half_power(pair.device.ilog2());
            let (latency, rate) = cheap.least;
            latency * f64::from(plan.leaving) + rate * share * smallest
        };
        let entering = plan.entering;
        let any = (grow.max(last).max(entering)).max(plan.unsummed).max(leave);
        let bound = if plan.sums == 0 {
            any
        } else {
            // With sums to go, the space's bound, unless Algorithm 1 of the layouts as given
            // (which all-reduces them first, over some groups of their bits, and then brings
            // the elements in) may cost less.
            let CheapBuffers { rates, summed, .. } = buffers;
            let bits = dims_bits(pair.device, plan.sums);
            let reduced = *summed
                .entry([bits, plan.used, pair.elements])
                .or_insert_with(|| all_reduced(&self.least_rates, (bits, plan.used), whole, rates));
            any.max(space.min(reduced + grow.max(entering).max(leave)))
        };
        if bound < space * NEAR {
            (space, false)
        } else {
            (bound, true)
        }
    }
}

/// What [`MatrixBounds::any_plan`] reads of a pair besides its [`Splits`]: whether only slices
/// reach the target, the factors of two of the splits the target drops, the dims splitting the
/// source, those holding sums to go, and [`bring`]'s two bounds.
struct AnyPlan {
    sliced: bool,
    leaving: u32,
    used: u64,
    sums: u64,
    entering: f64,
    unsummed: f64,
}

/// The share of the search's bound a cheap bound may give up not to need Algorithm 1's cost: a
/// bound on every plan ([`MatrixBounds::cheap_bound`]) under this share of it leaves the pair to
/// Algorithm 1 (3% of GPT-3's layer's and of AlexNet 64's pairs). Taking every such bound instead
/// gave Gemma 2 on 8 x 8, whose pairs are mostly latencies, 312,613 full bounds and a round more
/// (against 103,946).
const NEAR: f64 = 0.99;

/// `2^-n`, exactly (`n` under 1023).
fn half_power(n: u32) -> f64 {
    f64::from_bits(u64::from(1023 - n) << 52)
}

/// The rank bits of the device dims of `dims` (a mask) on the matrix of boundaries `device`.
fn dims_bits(device: u64, dims: u64) -> u64 {
    let (mut out, mut bounds, mut k) = (0, device, 0);
    while bounds.count_ones() >= 2 {
        let lo = bounds.trailing_zeros();
        bounds &= bounds - 1;
        let hi = bounds.trailing_zeros();
        if dims >> k & 1 == 1 {
            out |= (1 << hi) - (1 << lo);
        }
        k += 1;
    }
    out
}

/// A lower bound on all-reducing, one group after another, the partial sums of the rank bits
/// `bits` of a tensor of `whole` elements split by the device dims of `splitting`, whatever the
/// groups: each run of adjacent bits split into groups of adjacent bits in the cheapest way, a
/// group of `g` devices an all-reduce of `2 (g-1)` steps moving `2 (g-1) / g` shards at its
/// rates ([`LeastRates::group_rates_into`]), in `rates`' buffer.
fn all_reduced(
    least: &LeastRates,
    (bits, splitting): (u64, u64),
    whole: f64,
    rates: &mut Vec<(f64, f64)>,
) -> f64 {
    let (mut total, mut rest) = (0.0, bits);
    while rest != 0 {
        let lo = rest.trailing_zeros();
        let len = (!(rest >> lo)).trailing_zeros();
        // `best[j]`: the run's first `j` bits in groups.
        let mut best = [0.0f64; 65];
        for j in 1..=len as usize {
            best[j] = (0..j)
                .map(|i| {
                    let group = (1u64 << (lo as usize + j)) - (1u64 << (lo as usize + i));
                    least.group_rates_into(group, splitting, rates);
                    let g = (1u64 << (j - i)) as f64;
                    best[i] + least_stepped(rates, 2.0 * (g - 1.0), 2.0 * (g - 1.0) / g * whole)
                })
                .fold(f64::INFINITY, f64::min);
        }
        total += best[len as usize];
        rest &= !((u64::MAX >> (64 - len)) << lo);
    }
    total
}

impl MatrixBounds {
    /// The [`TensorPrices`] of a tensor of `elements` elements on this matrix, in `out`: worked
    /// out again only if `out` holds another tensor's.
    fn tensor_prices<'t>(&self, elements: u64, out: &'t mut TensorPrices) -> &'t TensorPrices {
        if out.elements == elements {
            return out;
        }
        let cheap = &self.cheap;
        let whole = elements as f64;
        out.elements = elements;
        out.removal.clear();
        out.removal.extend(
            (cheap.collective.iter().enumerate()).map(|(k, &(steps, part))| {
                let group = &cheap.removal[cheap.removal_at[k]..cheap.removal_at[k + 1]];
                least_stepped(group, steps, part * whole)
            }),
        );
        out.moving.clear();
        out.moving.extend(
            (cheap.moving_classes.iter())
                .map(|(_, at, part)| least_stepped(&cheap.moving[at.clone()], 1.0, part * whole)),
        );
        out
    }
}

/// The most [`DimBounds`] one [`MatrixBounds`] keeps (GPT-3's 512 matrices meet 32 on average,
/// 128 at most).
const DIMS_KEPT: usize = 1 << 8;

/// Per device dim of `layout`'s matrix, the dims of its size (a mask): its group of [`by_size`].
fn same_size(layout: &Layout) -> Vec<u64> {
    let h = layout.num_device_dims();
    let mut out = vec![0; h];
    for (_, group) in by_size(layout, (0..h).fold(0, |m, k| m | 1 << k)) {
        for k in bits(group) {
            out[k] = group;
        }
    }
    out
}

/// [`MatrixBounds`] by objective fingerprint ([`Objective::fingerprint`]) and device matrix,
/// across calls: GPT-3's 11 bounded tables met 512 device matrices, but each call's threads
/// worked them out afresh, 16,176 times (a twentieth of the calls' work). It changes no result
/// (the bounds depend on the objective and the matrix alone); emptied past [`MATRICES_KEPT`].
static MATRICES: Mutex<Option<FxHashMap<Vec<u64>, Matrices>>> = Mutex::new(None);

/// Bounds by device matrix.
type Matrices = FxHashMap<Vec<u64>, Arc<MatrixBounds>>;

/// The most matrices [`MATRICES`] keeps under all objectives together (each a few KB, and up to
/// [`DIMS_KEPT`] [`DimBounds`] of about a KB: a quarter GB at most).
const MATRICES_KEPT: usize = 1 << 10;

/// [`MatrixBounds`] by device matrix for one thread, read off [`MATRICES`] (or worked out and
/// kept there) once per matrix: the pairs one thread bounds in a batch lie on a few device
/// matrices, and the thread asks without the lock. The bounds of one objective (the key is the
/// matrix alone; its fingerprint is worked out at the first matrix).
#[derive(Default)]
pub(crate) struct MatrixCache {
    fingerprint: Option<Vec<u64>>,
    matrices: Matrices,
}

impl MatrixCache {
    /// The bounds on layouts of `layout`'s device matrix under `objective` (the objective of every
    /// call on this cache).
    pub(super) fn of(&mut self, objective: Objective<'_>, layout: &Layout) -> &MatrixBounds {
        self.shared(objective, layout)
    }

    /// [`MatrixCache::of`], shared.
    pub(super) fn shared(
        &mut self,
        objective: Objective<'_>,
        layout: &Layout,
    ) -> &Arc<MatrixBounds> {
        let matrix = layout.device_matrix();
        if !self.matrices.contains_key(matrix) {
            let fingerprint = self
                .fingerprint
                .get_or_insert_with(|| objective.fingerprint());
            let mut memo = locked(&MATRICES);
            let map = memo.get_or_insert_with(FxHashMap::default);
            let known = map.get(fingerprint.as_slice()).and_then(|m| m.get(matrix));
            let bounds = if let Some(bounds) = known {
                Arc::clone(bounds)
            } else {
                if map.values().map(FxHashMap::len).sum::<usize>() >= MATRICES_KEPT {
                    map.clear();
                }
                let bounds = Arc::new(MatrixBounds::of(objective, layout));
                let kept = map.entry(fingerprint.clone()).or_default();
                kept.insert(matrix.to_vec(), Arc::clone(&bounds));
                bounds
            };
            self.matrices.insert(matrix.to_vec(), bounds);
        }
        &self.matrices[matrix]
    }
}

/// The vectors of a [`Space`], kept by the thread that bounds pair after pair
/// ([`Space::bounding_in`], [`Space::into_buffers`]): filling them afresh for each key allocated
/// some thirty vectors, about a fifth of the work of bounding it.
#[derive(Default)]
pub(crate) struct Buffers {
    /// Per device dim, the tensor dims it may split (a mask; the search alone reads it).
    allowed: Vec<u64>,
    /// Per device dim, the tensor dim the target splits along it, if any.
    goal: Vec<Option<usize>>,
    /// The target's tensor map.
    target_map: Vec<i8>,
    /// Per device dim, the device dims of the same size.
    same_size: Vec<u64>,
    /// Per unit of [`Space::bring`], the elements the unit's devices need in the goal
    /// together.
    needed: Vec<f64>,
    /// What building the rest works in: one op's rates.
    work: Vec<(f64, f64)>,
    /// The rates of every level of a group of the permutable dims
    /// ([`LeastRates::wide_rates_into`]).
    wide: Vec<(f64, f64)>,
}

/// What a space's bound reads per device dim and per set of sums to go: it depends on the
/// source's device matrix, the dims a permute may move and those that may split the tensor,
/// the partial dims and which of them the target splits along, and the elements, not on the
/// rest of the pair (GPT-3's 109,961 bound keys have 16,166 of these), so it is worked out once
/// per matrix and these ([`MatrixBounds::dims`]).
#[derive(Default)]
pub(super) struct DimBounds {
    /// Per device dim, `(latency, price per element)` pairs bounding the price of any op whose
    /// group holds it, by the elements it moves ([`LeastRates::least_rates_into`]), every dim's in one
    /// list (the bound reads only the least over all of them), but those another's bound.
    rates: Vec<(f64, f64)>,
    /// Per device dim, a lower bound on the price of any op whose group holds it.
    least: Vec<f64>,
    /// Per device dim, its share of the price of an op whose group holds it: `least` over the
    /// number of device dims a collective-permute may move at once (the only op of several dims).
    share: Vec<f64>,
    /// `least` and `share` of the ops that end a device dim's split (for a dim the target does
    /// not split along): an all-gather, `(g-1)` shards, or a collective-permute, one.
    least_leave: Vec<f64>,
    share_leave: Vec<f64>,
    /// Per device dim, a lower bound on the price of the op that sums its partial sums: the
    /// shard then is whole along it.
    least_sum: Vec<f64>,
    /// Per device dim, `least` and `share` of the ops a sum of its partial sums takes at least:
    /// for a dim the target does not split along, an all-reduce (twice a reduce-scatter), or a
    /// reduce-scatter and then an op that ends the split it made; `least_sum` otherwise.
    sum_ops: Vec<(f64, f64)>,
    /// The least price of the sums to go, by their set ([`chains_into`]; none past [`CHAINED`]).
    chains: Vec<(u64, f64)>,
    /// Per device dim, a lower bound on an all-gather or all-to-all of any dim of its size (a
    /// collective of that dim alone, `g-1` steps moving `(g-1)/g` shards at least): the op
    /// that ends a split the target does not have ([`Space::removals`]), made by the dim
    /// splitting it then, which permutes may have handed it to (a dim of the same size).
    removal: Vec<f64>,
}

impl DimBounds {
    /// The bounds of a source on `matrix`, the bounds of its device matrix, where the dims of
    /// `permutable` may move and those of `splitting` split the tensor, and `goal` gives per
    /// device dim the tensor dim the target splits along it; worked out in `rates` and `wide`.
    fn of(
        source: &Layout,
        matrix: &MatrixBounds,
        (permutable, splitting): (u64, u64),
        goal: &[Option<usize>],
        rates: &mut Vec<(f64, f64)>,
        wide: &mut Vec<(f64, f64)>,
    ) -> Self {
        let least_rates = &matrix.least_rates;
        let h = source.num_device_dims();
        let spread = |k: usize| {
            if permutable >> k & 1 == 1 {
                permutable
            } else {
                1 << k
            }
        };
        let mut dims = DimBounds::default();
        let whole = source.num_elements() as f64;
        // Per dim, a collective of it alone (for a dim that may not be permuted, its `least`).
        let mut alone = Vec::with_capacity(h);
        // An op over a group of `g` devices holding dim `k` moves at least `(g-1)/g` shards, and
        // unless it is a permute (a dim with no partner has none) it is a collective of that dim
        // alone, of `g-1` steps at least.
        let movers = f64::from(permutable.count_ones());
        let share = |least: f64, k: usize| {
            if permutable >> k & 1 == 1 {
                least / movers
            } else {
                least
            }
        };
        // The permutable dims' groups share one spread: their rates are one list's tails, worked
        // out once, not once per dim.
        wide.clear();
        if permutable != 0 {
            least_rates.wide_rates_into(permutable, splitting, wide);
        }
        for k in 0..h {
            let g = source.dim_size(k) as f64;
            // A dim that may be permuted has its `least` from a permute's rates.
            if permutable >> k & 1 == 1 {
                least_rates.least_rates_into(k, 1 << k, splitting, rates);
                alone.push(least_stepped(rates, g - 1.0, (g - 1.0) / g * whole));
            }
            let rates: &[(f64, f64)] = if permutable >> k & 1 == 1 {
                &wide[least_rates.first_level(k)..]
            } else {
                least_rates.least_rates_into(k, 1 << k, splitting, rates);
                rates
            };
            // Each level's latency once for a permute, `g-1` times for a collective; and the
            // shards an all-gather moves, or a collective-permute (one) if one may.
            let (steps, leave) = if permutable >> k & 1 == 1 {
                (1.0, (g - 1.0).min(1.0))
            } else {
                (g - 1.0, g - 1.0)
            };
            let least = least_stepped(rates, steps, (g - 1.0) / g * whole);
            let least_leave = least_stepped(rates, steps, leave * whole);
            if permutable >> k & 1 == 0 {
                alone.push(least);
            }
            dims.least.push(least);
            dims.least_leave.push(least_leave);
            dims.share.push(share(least, k));
            dims.share_leave.push(share(least_leave, k));
        }
        dims.removal.extend((0..h).map(|k| {
            bits(matrix.same_size[k])
                .map(|d| alone[d])
                .fold(f64::INFINITY, f64::min)
        }));
        sums(source, least_rates, (splitting, goal), rates, &mut dims);
        let op = |k, split| least_sum_op(source, least_rates, k, split, rates);
        chains_into(mask_of(source.partial()), splitting, op, &mut dims.chains);
        // Per element moved, over any group. Only their least is read, at every search step
        // ([`Space::remaining`]): a rate no lower in latency nor per element than another kept
        // is never below it (rounding is monotone) and is left out (most dims share their
        // levels' rates: AlexNet 64's lists held a few distinct ones among a dozen).
        for (k, &[start, wide, end]) in matrix.unsplit_at.iter().enumerate() {
            let rates = if spread(k) == 1 << k {
                start..wide
            } else {
                wide..end
            };
            for &(latency, rate) in &matrix.unsplit[rates] {
                if (dims.rates.iter()).any(|&(l, r)| l <= latency && r <= rate) {
                    continue;
                }
                dims.rates.retain(|&(l, r)| l < latency || r < rate);
                dims.rates.push((latency, rate));
            }
        }
        dims
    }
}

/// What [`Space::remaining`] reads off the splits of a layout that differ from the goal's
/// ([`Space::removals`]).
struct Misplaced {
    /// The largest `least` and the sum of the `share`s of the device dims splitting them.
    most: f64,
    sum: f64,
    /// The bound of [`Space::removals`].
    removed: f64,
    /// Whether every split is the goal's (slices alone may be left, but for sums).
    sliced: bool,
}

/// The search space around one unified pair.
pub(super) struct Space<'a> {
    pub(super) template: &'a Layout,
    /// Its vectors, per device dim and per tensor dim.
    buf: Buffers,
    /// Its bounds per device dim and per set of sums to go.
    dims: Arc<DimBounds>,
    /// The runs of tensor dims that play one part ([`runs`]).
    pub(super) runs: Vec<(usize, usize)>,
    /// The device dims that split the same tensor dim in the source and the target: they stay.
    fixed: u64,
    /// The device dims, cheapest all-gather of the goal's shard first: a permute hands a split
    /// the target does not keep to the first free one of its size ([`Space::settle`]), where
    /// gathering it is cheapest.
    preferred: Vec<usize>,
    /// Elements per device in the target.
    goal_shard: f64,
    /// A lower bound on the price of the last op that is not a slice: half the goal's shard.
    least_last: f64,
    /// A lower bound on any op of a device dim that is not fixed: what handing a split the
    /// target keeps to its target's dim takes at least ([`Space::removals`]).
    least_moving: f64,
    /// Per unit of devices (a device, and with flat replicas a unit of each level below the
    /// outermost): per device dim the coordinates and the part of them one unit holds (`e_k`,
    /// `e_k / d_k`), and the latency and price per element of bringing elements into it
    /// ([`Objective::entering_rates`]); the same for every pair on the source's device matrix,
    /// so borrowed from the thread's [`MatrixCache`] when bounding.
    entering: Cow<'a, [Unit]>,
    /// The prices of the ops of one device dim met so far, by kind, dim, volume and the dims
    /// holding distinct data (all a price depends on), and of the collective-permutes by their
    /// permutation (packed in the dim's place), shard and distinct dims: a search meets each
    /// many times.
    prices: RefCell<FxHashMap<(OpKind, usize, u64, u64), f64>>,
}

impl<'a> Space<'a> {
    /// The space of `source` and `target` (no more dims than the masks hold: [`Problem::of`](super::Problem::of)).
    pub(super) fn new(source: &'a Layout, target: &Layout, objective: Objective<'_>) -> Self {
        let mut space = Self::bounding(source, target, objective);
        allowed_into(source, target, &mut space.buf.allowed);
        space.runs = runs(source, target, &space.buf.allowed);
        space.preferred = preferred(source, target, objective);
        space
    }

    /// [`Space::new`] for its bound alone ([`Space::remaining`]), without the runs and the
    /// order of preference only its steps use: the bounded tables bound the sources of tens of
    /// thousands of pairs, and pricing each device dim's all-gather for the order took a fifth of
    /// the work.
    pub(super) fn bounding(source: &'a Layout, target: &Layout, objective: Objective<'_>) -> Self {
        let mut matrix = MatrixBounds::of(objective, source);
        let units = std::mem::take(&mut matrix.units);
        Self::bounding_on(
            (source, target, None, allowed_dims(source, target)),
            &matrix,
            Cow::Owned(units),
            Buffers::default(),
        )
    }

    /// [`Space::bounding`] of `source` and `target` with their tensor dims in `order` (`order[c]`
    /// the dim at position `c`; its states in that order, [`State::in_order`]), without the
    /// sorted layouts (building them was a twentieth of the bounded tables' work), on the bounds
    /// of `source`'s device matrix ([`MatrixBounds`]), built in `buffers` (those of an earlier
    /// space: [`Space::into_buffers`]), with `allowed` the pair's [`allowed_dims`]. Only the
    /// target's map depends on the order.
    pub(super) fn bounding_in(
        (source, target, order, allowed): (&'a Layout, &Layout, &[usize], u64),
        matrix: &'a MatrixBounds,
        buffers: Buffers,
    ) -> Self {
        Self::bounding_on(
            (source, target, Some(order), allowed),
            matrix,
            Cow::Borrowed(&matrix.units),
            buffers,
        )
    }

    /// The vectors of the space, for the next one.
    pub(super) fn into_buffers(self) -> Buffers {
        self.buf
    }

    /// The space on `matrix`, the bounds of `source`'s device matrix, whose units are `entering`;
    /// the tensor dims in `order` if given ([`Space::bounding_in`]); `allowed` the pair's
    /// [`allowed_dims`] (a caller that keyed the pair has them in its columns).
    fn bounding_on(
        (source, target, order, allowed): (&'a Layout, &Layout, Option<&[usize]>, u64),
        matrix: &MatrixBounds,
        entering: Cow<'a, [Unit]>,
        mut buf: Buffers,
    ) -> Self {
        let h = source.num_device_dims();
        let (src, tgt) = (source.tensor_map(), target.tensor_map());
        let fixed = goal_and_fixed(src, tgt, h, &mut buf.goal);
        buf.same_size.clear();
        buf.same_size.extend_from_slice(&matrix.same_size);
        let same_size = &buf.same_size;
        // A collective-permute moves device dims that are not fixed and have a partner of their
        // size that is not fixed either.
        let permutable = (0..h)
            .filter(|&k| fixed >> k & 1 == 0 && same_size[k] & !fixed & !(1 << k) != 0)
            .fold(0u64, |m, k| m | 1 << k);
        let splitting = splitting(allowed, fixed, same_size);
        let partial = mask_of(source.partial());
        let goal = (0..h)
            .filter(|&k| buf.goal[k].is_some())
            .fold(0u64, |m, k| m | 1 << k);
        let key = [
            permutable,
            splitting,
            partial,
            goal & partial,
            source.num_elements(),
        ];
        let (work, wide) = (&mut buf.work, &mut buf.wide);
        let dims = matrix.dims(key, || {
            DimBounds::of(
                source,
                matrix,
                (permutable, splitting),
                &buf.goal,
                work,
                wide,
            )
        });
        let goal_shard = target.shard_size() as f64;
        let least_last = cheapest(&dims.rates, goal_shard / 2.0);
        let least_moving = (0..h)
            .filter(|&k| fixed >> k & 1 == 0)
            .map(|k| dims.least[k])
            .fold(f64::INFINITY, f64::min);
        // A unit holds `e_k` coordinates of each dim: as many distinct goal blocks along the
        // dims the goal splits by.
        let goal = &buf.goal;
        buf.needed.clear();
        buf.needed.extend(entering.iter().map(|unit| {
            (0..h)
                .filter(|&k| goal[k].is_some())
                .fold(goal_shard, |n, k| n * unit.extents[k])
        }));
        buf.target_map.clear();
        match order {
            Some(order) => buf.target_map.extend(order.iter().map(|&i| tgt[i] as i8)),
            None => buf.target_map.extend(tgt.iter().map(|&m| m as i8)),
        }
        Space {
            template: source,
            buf,
            dims,
            runs: Vec::new(),
            fixed,
            preferred: Vec::new(),
            goal_shard,
            least_last,
            least_moving,
            entering,
            prices: RefCell::default(),
        }
    }

    /// A lower bound on the price of the steps from `state` to the goal (A*'s heuristic), the
    /// largest of five, each of which no op lowers by more than it prices (so the bound is
    /// consistent: A* never reopens a layout):
    /// - every device dim that splits another tensor dim than in the goal, or holds partial sums
    ///   the goal does not keep, takes part in one op at least. An op of one device dim prices at
    ///   least its `least`, a collective-permute at least the sum of the `share`s of its dims; so
    ///   the rest prices at least the largest `least` and at least the sum of the `share`s. A
    ///   dim holding sums along which the target splits nothing takes an all-reduce, or a
    ///   reduce-scatter and then an op that ends the split it made (`sum_ops`);
    /// - only all-gathers grow a shard, `g` times for `(g-1)` shards: growing it to the goal's
    ///   size moves at least the difference; the partial sums' ops come on top;
    /// - unless slices alone reach the goal, the last other op moves at least half the goal's
    ///   shard (only slices follow it, and an op moves at least half its larger shard);
    /// - the elements the devices of a unit need that none of them holds enter the unit, every
    ///   unit at once; the partial sums' ops come on top; or, while a unit lacks a coordinate
    ///   of a dim still to be summed, everything it needs ([`Space::bring`]);
    /// - every split the goal does not have ends by an op of its own, and a split the goal
    ///   keeps on another device dim takes one op more ([`Space::removals`]); the partial sums'
    ///   ops come on top.
    ///
    /// Scaled down by a hair so that rounding never makes it exceed a true price.
    pub(super) fn remaining(&self, state: &State, shard: u64, keep: u64) -> f64 {
        let sums = state.partial & !keep;
        let Misplaced {
            most,
            sum,
            removed,
            sliced,
        } = self.removals(state);
        // The sums' ops: each dim's (with the op ending a reduce-scatter's split), and all of
        // them in their cheapest order (the sum ops alone).
        let (most_sum, summed) = bits(sums)
            .map(|k| self.dims.sum_ops[k])
            .fold((0.0, 0.0), |(most, sum), (least, share)| {
                (f64::max(most, least), sum + share)
            });
        let chained = self
            .dims
            .chains
            .iter()
            .find(|&&(p, _)| p == sums)
            .map_or_else(
                || bits(sums).map(|k| self.dims.least_sum[k]).sum::<f64>(),
                |&(_, least)| least,
            );
        let most = most.max(most_sum).max(chained);
        let sum = sum + summed.max(chained);
        let grow = cheapest(&self.dims.rates, self.goal_shard - shard as f64) + chained;
        let last = if sums == 0 && sliced {
            0.0
        } else {
            self.least_last
        };
        let (entering, unsummed) = self.bring(state, sums);
        let bring = (entering + chained).max(unsummed);
        let removed = removed + chained;
        most.max(sum).max(grow).max(last).max(bring).max(removed) * (1.0 - 1e-9)
    }

    /// A lower bound on the price of the ops other than sums from `state` to the goal, counted
    /// by the splits that must change: every tensor dim split now that the goal leaves unsplit
    /// loses its split by its own op (an all-gather, or an all-to-all to another tensor dim) of
    /// the device dim splitting it then, a dim of the size of the one splitting it now
    /// (permutes hand splits between dims of one size; `removal`); and if some tensor dim the
    /// goal splits is split now by another device dim than the goal's, one op more (a permute,
    /// or an op of that dim ending the split), which ends no split of the first kind (it acts
    /// on a split the goal keeps, or an all-to-all's destination is unsplit before it). No
    /// other op ends a split: a permute hands splits on, a slice or a reduce-scatter makes one.
    /// So each op lowers this by no more than it prices (an op ending one split of the first
    /// kind lowers the sum by that split's term; one making the last wrong split right, by
    /// `least_moving`), and sums, which end no split, come on top. Where latencies dominate
    /// (small tensors: Gemma 2's 2,048-element pairs on six size-2 dims), it counts the ops
    /// that the other bounds, each seeing the dearest op or the elements moved, do not.
    ///
    /// Worked out with the other terms of [`Space::remaining`] read off the splits of `state`
    /// that differ from the goal's ([`Misplaced`]), in one pass over its map (three passes were
    /// a tenth of the bound, which the search works out at every layout it reaches).
    fn removals(&self, state: &State) -> Misplaced {
        let n = self.template.ndim();
        let (mut most, mut sum, mut removed, mut wrong) = (0.0, 0.0, 0.0, false);
        let mut sliced = true;
        for (&m, &t) in state.map[..n].iter().zip(&self.buf.target_map) {
            let Ok(k) = usize::try_from(m) else { continue };
            if m == t {
                continue;
            }
            sliced = false;
            let (least, share) = if self.buf.goal[k].is_none() {
                (self.dims.least_leave[k], self.dims.share_leave[k])
            } else {
                (self.dims.least[k], self.dims.share[k])
            };
            most = f64::max(most, least);
            sum += share;
            if t < 0 {
                removed += self.dims.removal[k];
            } else {
                wrong = true;
            }
        }
        if wrong {
            removed += self.least_moving;
        }
        Misplaced {
            most,
            sum,
            removed,
            sliced,
        }
    }

    /// Lower bounds on the price of the steps from `state` to the goal: of the ops other than
    /// sums, and of all of them while the device dims `sums` (a mask) hold partial sums to go.
    ///
    /// The first: the elements the devices of a unit need together that no device of the unit
    /// holds must be brought into the unit ([`Objective::entering_rates`]: an op brings at most
    /// as many into a unit, in all, as its price at the fastest level above the unit pays for),
    /// every unit at once ([`Nested`]). A unit holds `e_k` of the `d_k` coordinates of each
    /// device dim `k` (an aligned block, independently of the other dims), so along a tensor
    /// dim `i` the goal needs there, and the state holds there, an aligned interval: the part
    /// `e_t / d_t` of it for the device dim `t` splitting it (all of it if none does). The unit
    /// needs and holds the products of these intervals. If along some tensor dim both intervals
    /// are proper and of different device dims, one of them lies outside the other in some
    /// unit: that unit holds nothing it needs. Otherwise along every dim one interval holds the
    /// other (or they are one), in every unit, and the unit holds the part of what it needs
    /// that is the product, over the dims where the state's interval is the smaller, of that
    /// interval's part. Sums, which bring no element (positions only), come on top. With a
    /// device as the unit this is the elements a device lacks of its goal shard.
    ///
    /// The second: a unit that lacks a coordinate of a sum holds no element it needs summed
    /// (each needs a contribution from outside it), so all it needs must come in. A sum brings
    /// in at least one value for each element it completes in the unit, and no other op
    /// completes one, so no op lowers a unit's lack by more than it brings in: the bound is
    /// consistent, and once the sums are done it is the first. It prices what the first leaves
    /// to the sums on top: the split a reduce-scatter across units makes, which another op must
    /// end (AlexNet 64's partial pairs across nodes).
    pub(super) fn bring(&self, state: &State, sums: u64) -> (f64, f64) {
        let maps = || self.splits_at(state);
        bring(&self.entering, |u, _| self.buf.needed[u], maps, sums)
    }

    /// Per tensor dim, the device dim splitting it at `state` and in the goal (-1 for none).
    fn splits_at<'s>(&'s self, state: &'s State) -> impl Iterator<Item = (i8, i8)> + 's {
        let n = self.template.ndim();
        (state.map[..n].iter().zip(&self.buf.target_map)).map(|(&m, &t)| (m, t))
    }

    /// The dearest unit's price of bringing in what it lacks at `state`, alone: what
    /// [`Space::bring`]'s first bound was before it took every unit at once.
    #[cfg(test)]
    pub(super) fn dearest_unit(&self, state: &State) -> f64 {
        (self.entering.iter().zip(&self.buf.needed))
            .map(|(unit, &needed)| {
                let lack = unit.lack(needed, self.splits_at(state));
                if lack > 0.0 {
                    unit.latency + unit.rate * lack
                } else {
                    0.0
                }
            })
            .fold(0.0, f64::max)
    }

    /// Elements per device after `step` from a layout of `shard` elements per device.
    pub(super) fn shard_after(&self, shard: u64, step: Step) -> u64 {
        match step {
            Step::Op(OpKind::Slice | OpKind::ReduceScatter, k, ..) => {
                shard >> self.template.dim_size(usize::from(k)).trailing_zeros()
            }
            Step::Op(OpKind::AllGather, k, ..) => {
                shard << self.template.dim_size(usize::from(k)).trailing_zeros()
            }
            Step::Op(..) | Step::Permute(_) => shard,
        }
    }

    /// The price of `step` from `state` (whose shards hold `shard` elements, and whose device
    /// dims in the mask `distinct` hold distinct data) to `next`, from what the topology model
    /// needs of the layout, without building it.
    pub(super) fn price(
        &self,
        objective: Objective<'_>,
        (state, distinct, shard): (&State, u64, u64),
        step: Step,
        next: &State,
    ) -> f64 {
        let matrix = self.template.device_matrix();
        match step {
            Step::Op(OpKind::Slice, ..) => 0.0,
            Step::Op(kind, k, ..) => {
                let k = usize::from(k);
                let volume = volume(kind, self.template.dim_size(k), shard);
                *self
                    .prices
                    .borrow_mut()
                    .entry((kind, k, volume, distinct))
                    .or_insert_with(|| {
                        objective.price_on(kind, Over::Group(1 << k), volume, matrix, |k| {
                            distinct >> k & 1 == 1
                        })
                    })
            }
            Step::Permute(_) => {
                let (n, h) = (self.template.ndim(), self.buf.allowed.len());
                let price = |sigma: &[usize]| {
                    let over = Over::Permutation(sigma);
                    let distinct = |k: usize| distinct >> k & 1 == 1;
                    objective.price_on(OpKind::CollectivePermute, over, shard, matrix, distinct)
                };
                // (A word's worth of dims, not 64, zeroed at every permute priced where they fit.)
                let (mut packed_dims, mut all_dims);
                let sigma: &mut [usize] = if h > PACKED_DIMS {
                    all_dims = [0; 64];
                    &mut all_dims[..h]
                } else {
                    packed_dims = [0; PACKED_DIMS];
                    &mut packed_dims[..h]
                };
                permutation_into(self.template, &state.map[..n], &next.map[..n], sigma);
                if h > PACKED_DIMS {
                    return price(sigma);
                }
                // Remembered by the permutation, packed a nibble a dim where it fits a word (a
                // search prices the same few permutations of one shard over and over: pricing
                // each was a tenth of the search).
                let packed = sigma.iter().rev().fold(0usize, |word, &d| word << 4 | d);
                let key = (OpKind::CollectivePermute, packed, shard, distinct);
                if let Some(&known) = self.prices.borrow().get(&key) {
                    return known;
                }
                let priced = price(sigma);
                self.prices.borrow_mut().insert(key, priced);
                priced
            }
        }
    }

    /// Every step from `state` (whose device dims in the mask `used` split a tensor dim:
    /// [`State::used`], which the caller has at hand) with the state it leads to; `keep` are the
    /// partial dims the target keeps.
    pub(super) fn steps(
        &self,
        (state, used): (&State, u64),
        keep: u64,
        out: &mut Vec<(Step, State)>,
    ) {
        out.clear();
        let h = self.buf.allowed.len();
        let map = &state.map[..self.template.ndim()];
        let unsplit = map
            .iter()
            .enumerate()
            .filter(|&(_, &m)| m < 0)
            .fold(0u64, |mask, (i, _)| mask | 1 << i);
        // Of the unsplit dims of a run, one is split: the others would give equivalent layouts.
        let open = self.runs.iter().fold(unsplit, |mask, &(start, end)| {
            let run = (u64::MAX >> (64 - (end - start))) << start;
            let first = mask & run & (mask & run).wrapping_neg();
            mask & !run | first
        });
        let mut push = |kind: OpKind, k: usize, i: Option<usize>, to: Option<usize>| {
            out.push((Step::op(kind, k, i, to), state.after(kind, k, i, to)));
        };
        // A free device dim whose target dim is unsplit is sliced there first: free, and every
        // later step moves a smaller shard.
        let free = |k: usize| (used | state.partial) >> k & 1 == 0;
        if let Some((k, i)) = (0..h).filter(|&k| free(k)).find_map(|k| {
            self.buf.goal[k]
                .filter(|&i| unsplit >> i & 1 == 1)
                .map(|i| (k, i))
        }) {
            push(OpKind::Slice, k, Some(i), None);
            return;
        }
        for k in 0..h {
            let bit = 1u64 << k;
            let targets = self.buf.allowed[k] & open;
            if free(k) {
                for i in bits(targets) {
                    push(OpKind::Slice, k, Some(i), None);
                }
            }
            if state.partial & bit != 0 && keep & bit == 0 {
                push(OpKind::AllReduce, k, None, None);
                for j in bits(targets) {
                    push(OpKind::ReduceScatter, k, Some(j), None);
                }
            }
        }
        for (i, &m) in map.iter().enumerate() {
            let Ok(k) = usize::try_from(m) else { continue };
            if self.fixed >> k & 1 == 1 {
                continue;
            }
            push(OpKind::AllGather, k, Some(i), None);
            for j in bits(self.buf.allowed[k] & open) {
                push(OpKind::AllToAll, k, Some(i), Some(j));
            }
        }
        self.permutes(state, used, out);
    }

    /// The splits of the tensor dims `deferred` (a mask; the target leaves them unsplit) that a
    /// permute from `state` moves, handed each to the first device dim of its size in
    /// [`Space::preferred`] order (where it is cheapest to gather) that is not its own and not
    /// `taken`: the fixed dims, those holding partial sums and those splitting a tensor dim in
    /// `next` (the map with the other moves made and these dims unsplit), which the caller
    /// knows (scanning `next` for them was a fifth of the permutes' enumeration); `None` if one
    /// finds none.
    pub(super) fn settle(
        &self,
        state: &State,
        mut next: [i8; MAX_DIMS],
        deferred: u32,
        mut taken: u64,
    ) -> Option<[i8; MAX_DIMS]> {
        for i in bits(u64::from(deferred)) {
            let k = state.map[i] as usize;
            let options = self.buf.same_size[k] & !taken & !(1 << k);
            let d = self
                .preferred
                .iter()
                .copied()
                .find(|&d| options >> d & 1 == 1)?;
            taken |= 1 << d;
            next[i] = d as i8;
        }
        Some(next)
    }

    /// The collective-permutes from `state`: each moving device dim (not fixed) hands its split
    /// to another of the same size: to the target's dim for that tensor dim, or if the target
    /// leaves it unsplit to a dim free once the others have moved, where it is cheapest to
    /// gather ([`Space::settle`]); one dim to one dim; at least one moves. The step records the
    /// tensor dims whose split changes hands; the two layouts say which dim took over which split
    /// ([`permutation`]).
    fn permutes(&self, state: &State, used: u64, out: &mut Vec<(Step, State)>) {
        let n = self.template.ndim();
        // The tensor dims whose split may move, and the device dims splitting them.
        let (dims, movable) = state.map[..n]
            .iter()
            .enumerate()
            .filter_map(|(i, &m)| u32::try_from(m).ok().map(|k| (i, k)))
            .filter(|&(_, k)| self.fixed >> k & 1 == 0)
            .fold((0u32, 0u64), |(dims, movable), (i, k)| {
                (dims | 1 << i, movable | 1 << k)
            });
        let taken = (used | state.partial) & !movable;
        self.assign(state, (state.map, 0, 0), dims, taken, out);
    }

    /// The permutes that hand the splits of the tensor dims `rest` (a mask of those whose split
    /// may move, not yet assigned), each to itself, to a free dim of its size that splits that
    /// tensor dim in the target, or if the target leaves it unsplit to the dim
    /// [`Space::settle`] picks; `next` is the map so far (unsplit where deferred to `settle`)
    /// with the tensor dims deferred and those whose split changes hands (masks, the deferred
    /// among them: `settle` hands a split to another dim than its own).
    fn assign(
        &self,
        state: &State,
        (mut next, deferred, moved): ([i8; MAX_DIMS], u32, u32),
        rest: u32,
        taken: u64,
        out: &mut Vec<(Step, State)>,
    ) {
        if rest == 0 {
            if moved == 0 {
                return;
            }
            // `taken` holds the fixed dims (they split where they are), the partial ones and
            // those the moves took: every dim splitting a tensor dim in `next`.
            let Some(next) = self.settle(state, next, deferred, taken) else {
                return;
            };
            out.push((
                Step::Permute(moved),
                State {
                    map: next,
                    partial: state.partial,
                },
            ));
            return;
        }
        let i = rest.trailing_zeros() as usize;
        let rest = rest & (rest - 1);
        let k = state.map[i] as usize;
        // Its own dim or the one splitting it in the target (the map names each dim once: the
        // one `d` whose goal is `i`), read off the map, not tested dim by dim.
        let t = self.buf.target_map[i];
        let wanted = 1 << k | u32::try_from(t).map_or(0, |t| 1 << t);
        for d in bits(self.buf.same_size[k] & !taken & !self.fixed & wanted) {
            next[i] = d as i8;
            let moved = if d == k { moved } else { moved | 1 << i };
            self.assign(state, (next, deferred, moved), rest, taken | 1 << d, out);
        }
        if t < 0 {
            next[i] = -1;
            let (deferred, moved) = (deferred | 1 << i, moved | 1 << i);
            self.assign(state, (next, deferred, moved), rest, taken, out);
        }
    }
}

/// The permutation of the device dims of `layout` a collective-permute from `before` to `after`
/// makes: for each dim `k`, the dim that takes over its splits. The dims that give up a split and
/// take none pass their (replicated) coordinates on to the dims that take a split from elsewhere,
/// each to one of its own size.
pub(super) fn permutation(layout: &Layout, before: &State, after: &State) -> Vec<usize> {
    let mut full = vec![0; layout.num_device_dims()];
    permutation_into(layout, &before.map, &after.map, &mut full);
    full
}

/// [`permutation`] of the maps `before` and `after` (as far as a layout's tensor dims go) into
/// `full` (one entry per device dim), without allocating: the search prices a permute at every
/// step that makes one.
fn permutation_into(layout: &Layout, before: &[i8], after: &[i8], full: &mut [usize]) {
    // The dim taking over each dim's split (`NONE` if it gives up none), and the dims that take
    // one over.
    const NONE: u8 = u8::MAX;
    let h = full.len();
    let mut sigma = [NONE; 64];
    let mut taken_over = 0u64;
    for (&k, &d) in before.iter().zip(after) {
        if let (Ok(k), Ok(d)) = (usize::try_from(k), u8::try_from(d)) {
            sigma[k] = d;
            taken_over |= 1 << d;
        }
    }
    let mut sources = (0..h)
        .filter(|&k| sigma[k] == NONE && taken_over >> k & 1 == 1)
        .fold(0u64, |m, k| m | 1 << k);
    for (k, out) in full.iter_mut().enumerate() {
        *out = if sigma[k] == NONE {
            k
        } else {
            usize::from(sigma[k])
        };
    }
    // Each to a source of its size (the splits handed on are of one size each, so the dims
    // freed and those taken hold the same sizes): a dim sent to one of another size is no
    // permutation of the devices, and was priced as fewer blocks than the move sends (6 of
    // the 7 that leave each node of `[2, 4, 4, 2]` swapping dims 1 with 2 and 0 with 3).
    for d in (0..h).filter(|&d| sigma[d] != NONE && taken_over >> d & 1 == 0) {
        let k = bits(sources)
            .find(|&k| layout.dim_size(k) == layout.dim_size(d))
            .expect("a source of each size freed");
        sources &= !(1 << k);
        full[k] = d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Cluster, Replicas};

    /// A matrix's prices kept for one tensor are worked out again for another: kept across
    /// tensors of 64, 96 and 64 elements, they are those worked out afresh for each (and
    /// differ between the two).
    #[test]
    fn tensor_prices_follow_the_tensor() {
        let levels = [(2, 60e9, 1e-6), (4, 12e9, 5e-6)];
        let cluster = Cluster::hierarchy(&levels, None, Replicas::Flat).unwrap();
        let objective = Objective::Seconds {
            cluster: &cluster,
            dtype_bytes: 2.0,
        };
        let layout = Layout::new(vec![96], vec![2, 4], vec![-1]).unwrap();
        let matrix = MatrixBounds::of(objective, &layout);
        let mut kept = TensorPrices::default();
        let fresh = |elements| {
            let mut fresh = TensorPrices::default();
            matrix.tensor_prices(elements, &mut fresh);
            fresh
        };
        assert_ne!(fresh(64).removal, fresh(96).removal);
        for elements in [64, 96, 64] {
            assert_eq!(matrix.tensor_prices(elements, &mut kept), &fresh(elements));
        }
    }

    /// Every device matrix of `devices` (a power of two) devices: its ordered factorisations
    /// into powers of two above one.
    fn matrices(devices: u64) -> Vec<Vec<u64>> {
        if devices == 1 {
            return vec![Vec::new()];
        }
        (1..=devices.trailing_zeros())
            .flat_map(|b| {
                matrices(devices >> b).into_iter().map(move |mut rest| {
                    rest.insert(0, 1 << b);
                    rest
                })
            })
            .collect()
    }

    /// The bounds a thread keeps by device matrix ([`MatrixCache`]) are those worked out afresh
    /// for the matrix (and its rates with no dim splitting, those worked out per group; its dims
    /// of one size, those of the matrix), asked for every device matrix of 64 devices in turn,
    /// twice, on clusters of several shapes and under both objectives: matrices that differ in
    /// one entry, in their order or in their length alternate, so a key that left out part of
    /// the matrix would hand one matrix another's bounds. The rates of a group wider than one dim
    /// are the tail of every level's ([`LeastRates::wide_rates_into`]) from the dim's first.
    #[test]
    fn the_bounds_kept_by_device_matrix_are_the_matrix_own() {
        let matrices = matrices(64);
        assert_eq!(matrices.len(), 32);
        let mut clusters = Vec::new();
        for replicas in Replicas::ALL {
            for per_node in [2, 8, 32] {
                let levels = [(per_node, 60e9, 1e-6), (64 / per_node, 6e9, 5e-6)];
                clusters.push(Cluster::hierarchy(&levels, None, replicas).unwrap());
            }
            let levels = [(2, 100e9, 1e-6), (8, 20e9, 2e-6), (4, 5e9, 8e-6)];
            clusters.push(Cluster::hierarchy(&levels, None, replicas).unwrap());
        }
        let objectives = clusters
            .iter()
            .map(|cluster| Objective::Seconds {
                cluster,
                dtype_bytes: 2.0,
            })
            .chain([Objective::Volume]);
        let mut tails = 0;
        for objective in objectives {
            let mut cache = MatrixCache::default();
            for _ in 0..2 {
                for matrix in &matrices {
                    let layout = Layout::new(vec![64], matrix.clone(), vec![-1]).unwrap();
                    let kept = cache.of(objective, &layout);
                    let fresh = MatrixBounds::of(objective, &layout);
                    assert_eq!(kept.units, fresh.units, "{matrix:?}");
                    let h = matrix.len();
                    for k in 0..h {
                        let same = (0..h).filter(|&j| matrix[h - 1 - j] == matrix[h - 1 - k]);
                        assert_eq!(kept.same_size[k], same.fold(0, |m, j| m | 1 << j));
                        for spread in (0..1u64 << h).filter(|s| s >> k & 1 == 1) {
                            // The rates with no dim splitting, read off the matrix's.
                            let mut rates = Vec::new();
                            kept.least_rates.least_rates_into(k, spread, 0, &mut rates);
                            let [start, wide, end] = kept.unsplit_at[k];
                            let at = if spread == 1 << k {
                                start..wide
                            } else {
                                wide..end
                            };
                            let unsplit = &kept.unsplit[at];
                            let bits = |r: &[(f64, f64)]| {
                                r.iter()
                                    .map(|&(l, r)| (l.to_bits(), r.to_bits()))
                                    .collect::<Vec<_>>()
                            };
                            assert_eq!(bits(unsplit), bits(&rates), "{matrix:?} {k} {spread}");
                            for splitting in 0..1u64 << h {
                                let bits = |rates: &LeastRates| {
                                    let mut out = Vec::new();
                                    rates.least_rates_into(k, spread, splitting, &mut out);
                                    out.iter()
                                        .map(|&(l, r)| (l.to_bits(), r.to_bits()))
                                        .collect::<Vec<_>>()
                                };
                                assert_eq!(
                                    bits(&kept.least_rates),
                                    bits(&fresh.least_rates),
                                    "{matrix:?} {k} {spread} {splitting}"
                                );
                                // A wider group's rates, read off every level's from `k`'s
                                // first.
                                if spread != 1 << k {
                                    let mut wide = Vec::new();
                                    let least = &kept.least_rates;
                                    least.wide_rates_into(spread, splitting, &mut wide);
                                    let tail = &wide[least.first_level(k)..];
                                    assert_eq!(
                                        tail.iter()
                                            .map(|&(l, r)| (l.to_bits(), r.to_bits()))
                                            .collect::<Vec<_>>(),
                                        bits(least),
                                        "{matrix:?} {k} {spread} {splitting}"
                                    );
                                    tails += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(tails > 100_000, "{tails}");
    }

    /// The sums' chains ([`chains_into`]) are the least, over every order of each set of sums to go,
    /// of its ops' bounds one after another, each on a shard split by the dims that are not
    /// sums to go and those summed before it (worked out here by trying every order): sources
    /// of one to four partial dims on every device matrix of 64 devices, on clusters of two and
    /// three levels.
    #[test]
    fn the_sums_chains_are_the_least_over_every_order() {
        // Every order of `to_go`, by recursion on the first sum.
        fn least_order(source: &Layout, least: &LeastRates, splitting: u64, to_go: u64) -> f64 {
            if to_go == 0 {
                return 0.0;
            }
            bits(to_go)
                .map(|k| {
                    let mut rates = Vec::new();
                    least_sum_op(source, least, k, splitting & !to_go, &mut rates)
                        + least_order(source, least, splitting, to_go & !(1 << k))
                })
                .fold(f64::INFINITY, f64::min)
        }
        let mut checked = 0;
        for levels in [
            vec![(8, 60e9, 1e-6), (8, 6e9, 5e-6)],
            vec![(2, 100e9, 1e-6), (8, 20e9, 2e-6), (4, 5e9, 8e-6)],
        ] {
            let cluster = Cluster::hierarchy(&levels, None, Replicas::Flat).unwrap();
            let objective = Objective::Seconds {
                cluster: &cluster,
                dtype_bytes: 2.0,
            };
            for matrix in matrices(64) {
                let h = matrix.len();
                // The last dim splits the tensor; the first ones (up to four) hold partial sums.
                let map = vec![h as i64 - 1, -1];
                let target = Layout::new(vec![64, 64], matrix.clone(), map.clone()).unwrap();
                for p in 1..h.min(5) {
                    let source = target.with_state(map.clone(), (0..p).collect());
                    let space = Space::bounding(&source, &target, objective);
                    let least = objective.least_rates_of(&source);
                    let allowed = allowed_dims(&source, &target);
                    let fixed = goal_and_fixed(
                        source.tensor_map(),
                        target.tensor_map(),
                        h,
                        &mut Vec::new(),
                    );
                    let splitting = splitting(allowed, fixed, &same_size(&source));
                    let partial = (1u64 << p) - 1;
                    assert_eq!(space.dims.chains.len(), 1 << p, "{matrix:?} {p}");
                    for &(to_go, price) in &space.dims.chains {
                        assert_eq!(to_go & !partial, 0);
                        let want = least_order(&source, &least, splitting, to_go);
                        assert_eq!(price.to_bits(), want.to_bits(), "{matrix:?} {p} {to_go}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 500, "{checked}");
    }

    /// The rates a space keeps per element moved over any group ([`DimBounds`]'s `rates`, with
    /// those another's bound left out) price every volume as the least over every device dim's
    /// rates (a collective of the dim alone, or for a dim a permute may move, of a wider
    /// group), bit for bit: sources of every map of two dims, with and without partial sums, on
    /// every matrix of 64 devices, on clusters of two and three levels with latencies and
    /// without, and one whose inner level is the slower per element but the quicker to start
    /// (each level's rate is the least at some volume). And they are fewer: most dims share
    /// their levels' rates.
    #[test]
    fn the_rates_kept_price_as_every_dims() {
        let (mut checked, mut kept, mut all) = (0, 0, 0);
        for levels in [
            vec![(8, 60e9, 2e-6), (8, 6e9, 5e-6)],
            vec![(8, 60e9, 0.0), (8, 6e9, 0.0)],
            vec![(8, 6e9, 1e-7), (8, 60e9, 5e-5)],
            vec![(2, 100e9, 1e-6), (8, 20e9, 2e-6), (4, 5e9, 8e-6)],
        ] {
            let cluster = Cluster::hierarchy(&levels, None, Replicas::Flat).unwrap();
            let objective = Objective::Seconds {
                cluster: &cluster,
                dtype_bytes: 2.0,
            };
            for matrix in matrices(64) {
                let h = matrix.len() as i64;
                let bounds = MatrixBounds::of(
                    objective,
                    &Layout::new(vec![64], matrix.clone(), vec![-1]).unwrap(),
                );
                for code in 0..(h + 1).pow(4) {
                    let entry = |j: u32| code / (h + 1).pow(j) % (h + 1) - 1;
                    let (src, tgt) = (vec![entry(0), entry(1)], vec![entry(2), entry(3)]);
                    let (Ok(source), Ok(target)) = (
                        Layout::new(vec![64, 64], matrix.clone(), src.clone()),
                        Layout::new(vec![64, 64], matrix.clone(), tgt.clone()),
                    ) else {
                        continue;
                    };
                    let unused = (0..h as usize).find(|&k| !src.contains(&(k as i64)));
                    let sources = [
                        Some(source.clone()),
                        unused.map(|k| source.with_state(src.clone(), vec![k])),
                    ];
                    for source in sources.into_iter().flatten() {
                        let space = Space::bounding(&source, &target, objective);
                        // Every dim's rates, as a space listed them before any was left out.
                        let fixed = goal_and_fixed(&src, &tgt, h as usize, &mut Vec::new());
                        let permutable = (0..h as usize)
                            .filter(|&k| {
                                fixed >> k & 1 == 0 && bounds.same_size[k] & !fixed & !(1 << k) != 0
                            })
                            .fold(0u64, |m, k| m | 1 << k);
                        let every: Vec<(f64, f64)> = (0..h as usize)
                            .flat_map(|k| {
                                let [start, wide, end] = bounds.unsplit_at[k];
                                let at = if permutable >> k & 1 == 1 {
                                    wide..end
                                } else {
                                    start..wide
                                };
                                bounds.unsplit[at].to_vec()
                            })
                            .collect();
                        for elements in [1.0, 3.0, 512.0, 4096.0, 1e5, 3e6, 1e9, 2f64.powi(40)] {
                            let want = cheapest(&every, elements);
                            let got = cheapest(&space.dims.rates, elements);
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{matrix:?} {src:?} {tgt:?} {elements}"
                            );
                            checked += 1;
                        }
                        kept += space.dims.rates.len();
                        all += every.len();
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
        assert!(2 * kept < all, "{kept} of {all}");
    }

    /// The device dims a bound lets split a tensor dim ([`allowed_dims`]) are those [`allowed`]
    /// gives some tensor dim, on every pair of maps of shapes with odd and even dims over every
    /// matrix of 16 devices, sources with and without partial sums.
    #[test]
    fn the_dims_allowed_are_those_allowed_some_tensor_dim() {
        let mut checked = 0;
        for matrix in matrices(16) {
            let h = matrix.len() as i64;
            for shape in [
                vec![16, 16],
                vec![6, 4],
                vec![3, 24],
                vec![8, 5, 2],
                vec![9, 2],
            ] {
                let maps: Vec<Vec<i64>> = (0..(h + 1).pow(shape.len() as u32))
                    .map(|code| {
                        (0..shape.len() as u32)
                            .map(|i| code / (h + 1).pow(i) % (h + 1) - 1)
                            .collect()
                    })
                    .collect();
                let layouts: Vec<Layout> = maps
                    .iter()
                    .filter_map(|map| Layout::new(shape.clone(), matrix.clone(), map.clone()).ok())
                    .collect();
                for a in &layouts {
                    let free: Vec<usize> = (0..h as usize)
                        .filter(|&k| a.tensor_map().iter().all(|&m| m != k as i64))
                        .collect();
                    let sources = [a.clone(), a.with_state(a.tensor_map().to_vec(), free)];
                    for source in &sources {
                        for target in &layouts {
                            let plain = allowed(source, target)
                                .iter()
                                .enumerate()
                                .filter(|&(_, &m)| m != 0)
                                .fold(0u64, |m, (k, _)| m | 1 << k);
                            assert_eq!(
                                allowed_dims(source, target),
                                plain,
                                "{source:?} {target:?}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 5_000, "{checked}");
    }
}
