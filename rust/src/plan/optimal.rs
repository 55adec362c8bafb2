//! The optimal redistribution planner: Dijkstra's shortest path between two unified layouts (one
//! shape, one device matrix), over the layouts a step can reach: slices, all-gathers and
//! all-to-alls as in Algorithm 1, reduce-scatters and all-reduces of partial sums, and
//! collective-permutes that hand the splits of some device dims to others of the same size.
//!
//! A layout of the search is its tensor map and its partial dims. Each device dim may split only
//! the tensor dim it splits in the source or in the target, or a dim that neither splits (where a
//! slice shrinks the shard before a dearer step); a dim that splits the same tensor dim at both
//! ends stays, one that splits nothing at either end splits nothing on the way, and a free dim
//! whose target dim is unsplit is sliced there first. The plans of Algorithm 1 stay inside, so
//! the search never returns a dearer plan than it, and the space stays small enough to plan the
//! edges of a strategy search. Algorithm 1's cost bounds the search: only a strictly cheaper plan
//! is searched for, so no layout whose cost plus the lower bound on the rest reaches it is
//! expanded.
//!
//! The search runs on the pair with its tensor dims sorted by the part each plays ([`Key`]):
//! pairs that differ only in that order, or in the sizes of dims of one part, have one search,
//! which the batch kernel runs once for all of them ([`Problem`]).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

use rustc_hash::FxHashMap;

use super::ops::{volume, CommOp, Objective, OpKind};
use crate::layout::Layout;

/// The layouts the search expands at most: past them it gives up, and the caller keeps Algorithm
/// 1's plan (sound, the planner is still never dearer than Algorithm 1, but maybe not the
/// cheapest). Most plans of a strategy search take a few dozen to a few hundred; the few that
/// would take more (chains of many device dims of one size) would cost the search more than they
/// save. (A budget of 256 halves a GPT-3 layer's search on 256 devices with the same result, but
/// loses to Algorithm 1's fallback on 8% of random pairs there, by up to 6x.)
const MAX_EXPANSIONS: usize = 1024;

/// The most tensor dims of a unified layout the search takes (a state is a fixed array, so that
/// stepping allocates nothing).
const MAX_DIMS: usize = 32;

/// A layout of the search: the tensor map (-1 past the layout's dims) and the partial device
/// dims (a mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct State {
    map: [i8; MAX_DIMS],
    partial: u64,
}

impl State {
    fn of(layout: &Layout) -> Self {
        let mut map = [-1; MAX_DIMS];
        for (m, &x) in map.iter_mut().zip(layout.tensor_map()) {
            *m = x as i8;
        }
        State {
            map,
            partial: mask_of(layout.partial()),
        }
    }

    /// The state an op (`kind` on device dim `k`, tensor dims `i` and `to` as in [`CommOp`]; not a
    /// collective-permute) leads to.
    fn after(mut self, kind: OpKind, k: usize, i: Option<usize>, to: Option<usize>) -> Self {
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
    fn used(&self) -> u64 {
        self.map
            .iter()
            .filter_map(|&m| u32::try_from(m).ok())
            .fold(0, |mask, k| mask | 1 << k)
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Op(OpKind, usize, Option<usize>, Option<usize>),
    Permute,
}

struct Node {
    state: State,
    /// Elements per device in `state`.
    shard: u64,
    cost: f64,
    ops: u32,
    parent: usize,
    step: Option<Step>,
    done: bool,
}

/// A heap entry, lowest estimate first (cost so far plus the lower bound on the rest), then
/// fewest ops, then first reached (for determinism).
struct Queued {
    cost: f64,
    ops: u32,
    node: usize,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .cost
            .total_cmp(&self.cost)
            .then(other.ops.cmp(&self.ops))
            .then(other.node.cmp(&self.node))
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

/// The least price of an op moving `elements` per device over any group, by the `rates` of every
/// device dim.
fn cheapest(rates: &[Vec<(f64, f64)>], elements: f64) -> f64 {
    rates
        .iter()
        .map(|rates| least_price(rates, elements))
        .fold(f64::INFINITY, f64::min)
}

fn mask_of(dims: &[usize]) -> u64 {
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
/// way (a mask): the one it splits in the source or in the target, or one that neither splits
/// (scratch, for a dim that splits something at an end or holds partial sums), if its size
/// divides the dim.
fn allowed(source: &Layout, target: &Layout) -> Vec<u64> {
    let (src, tgt) = (source.tensor_map(), target.tensor_map());
    let src_partial = mask_of(source.partial());
    let scratch = (0..source.ndim())
        .filter(|&i| src[i] < 0 && tgt[i] < 0)
        .fold(0u64, |m, i| m | 1 << i);
    (0..source.num_device_dims())
        .map(|k| {
            let d = source.dim_size(k);
            let at = |map: &[i64]| map.iter().position(|&m| m == k as i64);
            let ends = [at(src), at(tgt)];
            // A dim that splits nothing at either end would only have to be gathered again.
            let start = if ends.iter().all(Option::is_none) && src_partial >> k & 1 == 0 {
                0
            } else {
                scratch
            };
            let places = ends.into_iter().flatten().fold(start, |m, i| m | 1 << i);
            bits(places)
                .filter(|&i| source.shape()[i] % d == 0)
                .fold(0, |m, i| m | 1 << i)
        })
        .collect()
}

/// What the search of a unified pair depends on: the device matrix, the elements, the partial
/// dims at both ends, and per tensor dim (in sorted order) the device dims splitting it at both
/// ends and those that may split it on the way. Pairs of one key differ only in the order of
/// their tensor dims and in the sizes of dims that play one part, which no price sees (a shard
/// is the elements over the sizes of the dims that split it): one search serves them all.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    device_matrix: Vec<u64>,
    elements: u64,
    partial: (u64, u64),
    columns: Vec<(i64, i64, u64)>,
}

/// A unified pair with its tensor dims in the order of its [`Key`]: the search runs on it, and
/// its path maps back onto every pair of the key.
pub(crate) struct Problem {
    key: Key,
    /// The pair's tensor dim at each position of the sorted order.
    order: Vec<usize>,
    source: Layout,
    target: Layout,
}

impl Problem {
    /// The problem of the unified pair `source` -> `target`; `None` if they have too many dims
    /// for the search's masks.
    pub(crate) fn of(source: &Layout, target: &Layout) -> Option<Self> {
        if source.ndim() > MAX_DIMS || source.num_device_dims() >= 64 {
            return None;
        }
        let allowed = allowed(source, target);
        let column = |i: usize| {
            let may = (0..allowed.len())
                .filter(|&k| allowed[k] >> i & 1 == 1)
                .fold(0u64, |m, k| m | 1 << k);
            (source.tensor_map()[i], target.tensor_map()[i], may)
        };
        let mut order: Vec<usize> = (0..source.ndim()).collect();
        order.sort_by_key(|&i| column(i));
        let sorted = |layout: &Layout| {
            let pick = |v: &[u64]| order.iter().map(|&i| v[i]).collect::<Vec<u64>>();
            let map = order.iter().map(|&i| layout.tensor_map()[i]).collect();
            Layout::from_parts(
                pick(layout.shape()),
                layout.device_matrix().to_vec(),
                map,
                layout.partial().to_vec(),
            )
        };
        Some(Problem {
            key: Key {
                device_matrix: source.device_matrix().to_vec(),
                elements: source.num_elements(),
                partial: (mask_of(source.partial()), mask_of(target.partial())),
                columns: order.iter().map(|&i| column(i)).collect(),
            },
            source: sorted(source),
            target: sorted(target),
            order,
        })
    }

    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The ops of `path` (a solution of a problem of this key) on the unified `source` this
    /// problem was made of, each with the layout before it.
    pub(crate) fn ops(&self, path: &Path, source: &Layout) -> Vec<CommOp> {
        let unsort = |state: &State| {
            let mut map = [-1; MAX_DIMS];
            for (c, &i) in self.order.iter().enumerate() {
                map[i] = state.map[c];
            }
            State {
                map,
                partial: state.partial,
            }
        };
        let dim = |c: Option<usize>| c.map(|c| self.order[c]);
        let mut before = State::of(source);
        path.steps
            .iter()
            .map(|(step, after)| {
                let after = unsort(after);
                let layout = state_layout(source, &before);
                let op = match *step {
                    Step::Op(kind, k, i, to) => CommOp::new(kind, k, dim(i), dim(to), layout),
                    Step::Permute => CommOp::permute(
                        permutation(source.num_device_dims(), &before, &after),
                        layout,
                    ),
                };
                before = after;
                op
            })
            .collect()
    }
}

/// A solution: each step with the layout it leads to.
#[derive(Debug, Clone)]
pub(crate) struct Path {
    steps: Vec<(Step, State)>,
}

/// The layout of `state` on `template`'s shape and device matrix.
fn state_layout(template: &Layout, state: &State) -> Layout {
    template.with_state(
        state.map[..template.ndim()]
            .iter()
            .map(|&m| i64::from(m))
            .collect(),
        bits(state.partial).collect(),
    )
}

/// The search space around one unified pair.
struct Space<'a> {
    template: &'a Layout,
    /// Per device dim, the tensor dims it may split (a mask).
    allowed: Vec<u64>,
    /// Per device dim, the tensor dim the target splits along it, if any.
    goal: Vec<Option<usize>>,
    /// The target's tensor map.
    target_map: Vec<i8>,
    /// The device dims that split the same tensor dim in the source and the target: they stay.
    fixed: u64,
    /// Per device dim, the device dims of the same size.
    same_size: Vec<u64>,
    /// Per device dim, `(latency, price per element)` pairs bounding the price of any op whose
    /// group holds it, by the elements it moves ([`Objective::least_rates`]).
    rates: Vec<Vec<(f64, f64)>>,
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
    /// Elements per device in the target.
    goal_shard: f64,
    /// A lower bound on the price of the last op that is not a slice: half the goal's shard.
    least_last: f64,
}

impl<'a> Space<'a> {
    /// The space of `source` and `target` (no more dims than the masks hold: [`Problem::of`]).
    fn new(source: &'a Layout, target: &Layout, objective: Objective<'_>) -> Self {
        let h = source.num_device_dims();
        let (src, tgt) = (source.tensor_map(), target.tensor_map());
        let allowed = allowed(source, target);
        let goal: Vec<Option<usize>> = (0..h)
            .map(|k| tgt.iter().position(|&m| m == k as i64))
            .collect();
        let fixed = (0..h)
            .filter(|&k| goal[k].is_some() && goal[k] == src.iter().position(|&m| m == k as i64))
            .fold(0u64, |m, k| m | 1 << k);
        let same_size: Vec<u64> = (0..h)
            .map(|k| {
                (0..h)
                    .filter(|&j| source.dim_size(j) == source.dim_size(k))
                    .fold(0u64, |m, j| m | 1 << j)
            })
            .collect();
        // A collective-permute moves device dims that are not fixed and have a partner of their
        // size that is not fixed either.
        let permutable = (0..h)
            .filter(|&k| fixed >> k & 1 == 0 && same_size[k] & !fixed & !(1 << k) != 0)
            .fold(0u64, |m, k| m | 1 << k);
        let spread = |k: usize| {
            if permutable >> k & 1 == 1 {
                permutable
            } else {
                1 << k
            }
        };
        // The dims that may split the tensor on the way.
        let splitting = (0..h)
            .filter(|&k| allowed[k] != 0)
            .fold(0u64, |m, k| m | 1 << k);
        let whole = source.num_elements() as f64;
        // An op over a group of `g` devices holding dim `k` moves at least `(g-1)/g` shards.
        let (least, least_leave): (Vec<f64>, Vec<f64>) = (0..h)
            .map(|k| {
                let rates = objective.least_rates(source, k, spread(k), splitting);
                let g = source.dim_size(k) as f64;
                // Shards an all-gather moves, or a collective-permute (one) if one may.
                let leave = if permutable >> k & 1 == 1 {
                    (g - 1.0).min(1.0)
                } else {
                    g - 1.0
                };
                (
                    least_price(&rates, (g - 1.0) / g * whole),
                    least_price(&rates, leave * whole),
                )
            })
            .unzip();
        let movers = f64::from(permutable.count_ones());
        let shares = |least: &[f64]| -> Vec<f64> {
            (0..h)
                .map(|k| {
                    if permutable >> k & 1 == 1 {
                        least[k] / movers
                    } else {
                        least[k]
                    }
                })
                .collect()
        };
        let (share, share_leave) = (shares(&least), shares(&least_leave));
        // A dim holding partial sums splits nothing: its sum (an op of that dim alone) moves
        // `(g-1)/g` of a shard split by the other dims at most.
        let least_sum: Vec<f64> = (0..h)
            .map(|k| {
                let g = source.dim_size(k) as f64;
                let rates = objective.least_rates(source, k, 1 << k, splitting & !(1 << k));
                least_price(&rates, (g - 1.0) / g * whole)
            })
            .collect();
        // Per element moved, over any group.
        let rates: Vec<Vec<(f64, f64)>> = (0..h)
            .map(|k| objective.least_rates(source, k, spread(k), 0))
            .collect();
        let goal_shard = target.shard_size() as f64;
        let least_last = cheapest(&rates, goal_shard / 2.0);
        Space {
            template: source,
            allowed,
            goal,
            target_map: tgt.iter().map(|&m| m as i8).collect(),
            fixed,
            same_size,
            rates,
            least,
            share,
            least_leave,
            share_leave,
            least_sum,
            goal_shard,
            least_last,
        }
    }

    /// A lower bound on the price of the steps from `state` to the goal (A*'s heuristic), the
    /// largest of three, each of which no op lowers by more than it prices (so the bound is
    /// consistent: A* never reopens a layout):
    /// - every device dim that splits another tensor dim than in the goal, or holds partial sums
    ///   the goal does not keep, takes part in one op at least. An op of one device dim prices at
    ///   least its `least`, a collective-permute at least the sum of the `share`s of its dims; so
    ///   the rest prices at least the largest `least` and at least the sum of the `share`s;
    /// - only all-gathers grow a shard, `g` times for `(g-1)` shards: growing it to the goal's
    ///   size moves at least the difference; the partial sums' ops come on top;
    /// - unless slices alone reach the goal, the last other op moves at least half the goal's
    ///   shard (only slices follow it, and an op moves at least half its larger shard).
    ///
    /// Scaled down by a hair so that rounding never makes it exceed a true price.
    fn remaining(&self, state: &State, shard: u64, keep: u64) -> f64 {
        let n = self.template.ndim();
        let bound = |k: usize| {
            if self.goal[k].is_none() {
                (self.least_leave[k], self.share_leave[k])
            } else {
                (self.least[k], self.share[k])
            }
        };
        let sums = state.partial & !keep;
        let misplaced = state.map[..n]
            .iter()
            .zip(&self.target_map)
            .filter(|(m, t)| m != t)
            .filter_map(|(&m, _)| usize::try_from(m).ok())
            .map(bound)
            .chain(bits(sums).map(|k| (self.least_sum[k], self.least_sum[k])));
        let (most, sum) = misplaced.fold((0.0, 0.0), |(most, sum), (least, share)| {
            (f64::max(most, least), sum + share)
        });
        let grow = cheapest(&self.rates, self.goal_shard - shard as f64)
            + bits(sums).map(|k| self.least_sum[k]).sum::<f64>();
        let sliced = sums == 0
            && state.map[..n]
                .iter()
                .zip(&self.target_map)
                .all(|(&m, &t)| m < 0 || m == t);
        let last = if sliced { 0.0 } else { self.least_last };
        most.max(sum).max(grow).max(last) * (1.0 - 1e-9)
    }

    /// Elements per device after `step` from a layout of `shard` elements per device.
    fn shard_after(&self, shard: u64, step: Step) -> u64 {
        match step {
            Step::Op(OpKind::Slice | OpKind::ReduceScatter, k, ..) => {
                shard >> self.template.dim_size(k).trailing_zeros()
            }
            Step::Op(OpKind::AllGather, k, ..) => {
                shard << self.template.dim_size(k).trailing_zeros()
            }
            Step::Op(..) | Step::Permute => shard,
        }
    }

    /// The price of `step` from `state` (whose shards hold `shard` elements, and whose device
    /// dims in the mask `distinct` hold distinct data) to `next`, from what the topology model
    /// needs of the layout, without building it.
    fn price(
        &self,
        objective: Objective<'_>,
        (state, distinct, shard): (&State, u64, u64),
        step: Step,
        next: &State,
    ) -> f64 {
        let (kind, group, volume) = match step {
            Step::Op(kind, k, ..) => (kind, 1 << k, volume(kind, self.template.dim_size(k), shard)),
            Step::Permute => (OpKind::CollectivePermute, moved(state, next), shard),
        };
        objective.price_on(kind, group, volume, self.template.device_matrix(), |k| {
            distinct >> k & 1 == 1
        })
    }

    /// Every step from `state` with the state it leads to; `keep` are the partial dims the
    /// target keeps.
    fn steps(&self, state: &State, keep: u64, out: &mut Vec<(Step, State)>) {
        out.clear();
        let h = self.allowed.len();
        let map = &state.map[..self.template.ndim()];
        let used = state.used();
        let unsplit = map
            .iter()
            .enumerate()
            .filter(|&(_, &m)| m < 0)
            .fold(0u64, |mask, (i, _)| mask | 1 << i);
        let mut push = |kind: OpKind, k: usize, i: Option<usize>, to: Option<usize>| {
            out.push((Step::Op(kind, k, i, to), state.after(kind, k, i, to)));
        };
        // A free device dim whose target dim is unsplit is sliced there first: free, and every
        // later step moves a smaller shard.
        let free = |k: usize| (used | state.partial) >> k & 1 == 0;
        if let Some((k, i)) = (0..h).filter(|&k| free(k)).find_map(|k| {
            self.goal[k]
                .filter(|&i| unsplit >> i & 1 == 1)
                .map(|i| (k, i))
        }) {
            push(OpKind::Slice, k, Some(i), None);
            return;
        }
        for k in 0..h {
            let bit = 1u64 << k;
            let targets = self.allowed[k] & unsplit;
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
            for j in bits(self.allowed[k] & unsplit) {
                push(OpKind::AllToAll, k, Some(i), Some(j));
            }
        }
        self.permutes(state, out);
    }

    /// The collective-permutes from `state`: each moving device dim (not fixed) hands its split
    /// to the device dim of the same size that splits that tensor dim in the target (and holds
    /// no partial sums), one dim to one dim; at least one moves. The step records nothing: the
    /// two layouts say which dim took over which split ([`permutation`]).
    fn permutes(&self, state: &State, out: &mut Vec<(Step, State)>) {
        let n = self.template.ndim();
        let movable = state.map[..n]
            .iter()
            .filter_map(|&m| u32::try_from(m).ok())
            .filter(|&k| self.fixed >> k & 1 == 0)
            .fold(0u64, |mask, k| mask | 1 << k);
        let taken = (state.used() | state.partial) & !movable;
        self.assign(state, state.map, 0, taken, out);
    }

    /// The permutes that hand the splits of the movable dims from tensor dim `at` on, each to
    /// itself or to a free dim of its size that splits that tensor dim in the target; `next` is
    /// the map so far.
    fn assign(
        &self,
        state: &State,
        mut next: [i8; MAX_DIMS],
        at: usize,
        taken: u64,
        out: &mut Vec<(Step, State)>,
    ) {
        let n = self.template.ndim();
        let Some(i) = (at..n)
            .find(|&i| usize::try_from(state.map[i]).is_ok_and(|k| self.fixed >> k & 1 == 0))
        else {
            if next != state.map {
                out.push((
                    Step::Permute,
                    State {
                        map: next,
                        partial: state.partial,
                    },
                ));
            }
            return;
        };
        let k = state.map[i] as usize;
        let options = self.same_size[k] & !taken & !self.fixed;
        for d in bits(options) {
            if d == k || self.goal[d] == Some(i) {
                next[i] = d as i8;
                self.assign(state, next, i + 1, taken | 1 << d, out);
            }
        }
    }
}

/// The device dims a collective-permute from `before` to `after` moves (a mask): each dim that
/// hands its split to another, and that other.
fn moved(before: &State, after: &State) -> u64 {
    before
        .map
        .iter()
        .zip(&after.map)
        .filter(|(k, d)| k != d)
        .fold(0, |mask, (&k, &d)| mask | 1 << k | 1 << d)
}

/// The permutation of the `h` device dims a collective-permute from `before` to `after` makes:
/// for each dim `k`, the dim that takes over its splits. The dims that give up a split and take
/// none pass their (replicated) coordinates on to the dims that take a split from elsewhere.
fn permutation(h: usize, before: &State, after: &State) -> Vec<usize> {
    let mut sigma: Vec<Option<usize>> = vec![None; h];
    for (&k, &d) in before.map.iter().zip(&after.map) {
        if let (Ok(k), Ok(d)) = (usize::try_from(k), usize::try_from(d)) {
            sigma[k] = Some(d);
        }
    }
    let taken_over = |d: usize| sigma.contains(&Some(d));
    let mut sources = (0..h).filter(|&k| sigma[k].is_none() && taken_over(k));
    let mut full: Vec<usize> = (0..h).collect();
    for (k, d) in sigma.iter().enumerate() {
        if let Some(d) = d {
            full[k] = *d;
        }
    }
    for d in (0..h).filter(|&d| sigma[d].is_some() && !taken_over(d)) {
        full[sources.next().expect("as many sources as targets")] = d;
    }
    full
}

/// Paths found, by key and objective ([`Objective::fingerprint`]): a search's pairs come back
/// across its edges and directions, and across searches on one cluster. The search of a key is
/// deterministic, so the memo changes no result; it is emptied past [`MEMO_SIZE`] paths.
static MEMO: Mutex<Option<Memo>> = Mutex::new(None);

/// Paths by key and objective fingerprint.
type Memo = FxHashMap<(Key, Vec<u64>), Path>;

/// The most paths [`MEMO`] keeps (each a few hundred bytes).
const MEMO_SIZE: usize = 1 << 20;

/// The cheapest path of `problem` under `objective`: A* with [`Space::remaining`] among the
/// paths cheaper than Algorithm 1's (whose ops between a unified pair `paper` gives), or
/// Algorithm 1's if there is none or the search would expand more than [`MAX_EXPANSIONS`]
/// layouts, or `stop` is set (then the path is not remembered). Remembered ([`MEMO`]).
pub(crate) fn solve(
    problem: &Problem,
    objective: Objective<'_>,
    stop: &AtomicBool,
    paper: impl FnOnce(&Layout, &Layout) -> Vec<CommOp>,
) -> Path {
    let key = (problem.key.clone(), objective.fingerprint());
    // A panic elsewhere while the lock was held leaves the map whole: use it.
    let memo = || MEMO.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(path) = memo().as_ref().and_then(|m| m.get(&key)) {
        return path.clone();
    }
    let path = search_or_paper(problem, objective, stop, paper);
    if stop.load(Relaxed) {
        return path;
    }
    let mut memo = memo();
    let map = memo.get_or_insert_with(FxHashMap::default);
    if map.len() >= MEMO_SIZE {
        map.clear();
    }
    map.insert(key, path.clone());
    path
}

/// [`solve`] without the memo.
fn search_or_paper(
    problem: &Problem,
    objective: Objective<'_>,
    stop: &AtomicBool,
    paper: impl FnOnce(&Layout, &Layout) -> Vec<CommOp>,
) -> Path {
    let (source, target) = (&problem.source, &problem.target);
    let paper = paper(source, target);
    let bound = paper.iter().fold(0.0, |t, op| objective.add(t, op));
    search(source, target, bound, objective, stop).unwrap_or_else(|| {
        let mut at = State::of(source);
        let steps = paper.iter().map(|op| {
            let (kind, k, i, to) = (
                op.kind(),
                op.device_dim(),
                op.tensor_dim(),
                op.to_tensor_dim(),
            );
            at = at.after(kind, k, i, to);
            (Step::Op(kind, k, i, to), at)
        });
        Path {
            steps: steps.collect(),
        }
    })
}

/// A* from `source` to `target` among the paths cheaper than `bound`; `None` past the budget or
/// once `stop` is set.
fn search(
    source: &Layout,
    target: &Layout,
    bound: f64,
    objective: Objective<'_>,
    stop: &AtomicBool,
) -> Option<Path> {
    let space = Space::new(source, target, objective);
    let goal = State::of(target);
    let keep = goal.partial;
    let mut nodes = vec![Node {
        state: State::of(source),
        shard: source.shard_size(),
        cost: 0.0,
        ops: 0,
        parent: 0,
        step: None,
        done: false,
    }];
    let mut index = FxHashMap::default();
    index.insert(nodes[0].state, 0);
    let first = space.remaining(&nodes[0].state, nodes[0].shard, keep);
    if first >= bound {
        return None;
    }
    let mut heap = BinaryHeap::from([Queued {
        cost: first,
        ops: 0,
        node: 0,
    }]);
    let mut steps = Vec::new();
    let mut expanded = 0usize;
    while let Some(Queued { node, .. }) = heap.pop() {
        if nodes[node].done {
            continue;
        }
        nodes[node].done = true;
        expanded += 1;
        // Checked now and then (and first): a caller stops a long batch (Ctrl-C) within
        // milliseconds.
        if expanded > MAX_EXPANSIONS || expanded % 64 == 1 && stop.load(Relaxed) {
            return None;
        }
        if nodes[node].state == goal {
            return Some(path_to(&nodes, node));
        }
        let state = nodes[node].state;
        let (cost, ops) = (nodes[node].cost, nodes[node].ops + 1);
        let (shard, distinct) = (nodes[node].shard, state.used() | state.partial);
        space.steps(&state, keep, &mut steps);
        for (step, next) in steps.drain(..) {
            // A layout already expanded is not reopened (the bound is consistent): skip it before
            // pricing the step.
            let seen = index.get(&next).copied();
            if seen.is_some_and(|id| nodes[id].done) {
                continue;
            }
            let total = cost + space.price(objective, (&state, distinct, shard), step, &next);
            if seen.is_some_and(|id| (total, ops) >= (nodes[id].cost, nodes[id].ops)) {
                continue;
            }
            let after = space.shard_after(shard, step);
            let estimate = total + space.remaining(&next, after, keep);
            if estimate >= bound {
                continue;
            }
            let fresh = Node {
                state: next,
                shard: after,
                cost: total,
                ops,
                parent: node,
                step: Some(step),
                done: false,
            };
            let id = if let Some(id) = seen {
                nodes[id] = fresh;
                id
            } else {
                nodes.push(fresh);
                index.insert(next, nodes.len() - 1);
                nodes.len() - 1
            };
            heap.push(Queued {
                cost: estimate,
                ops,
                node: id,
            });
        }
    }
    None
}

/// The steps to `end`, each with the layout it leads to.
fn path_to(nodes: &[Node], end: usize) -> Path {
    let mut steps = Vec::new();
    let mut at = end;
    while let Some(step) = nodes[at].step {
        steps.push((step, nodes[at].state));
        at = nodes[at].parent;
    }
    steps.reverse();
    Path { steps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;
    use crate::topology::{Cluster, Replicas};

    /// The least price from `source` to `target` by a plain Dijkstra over the same steps, with
    /// no heuristic, no bound and no budget.
    fn dijkstra(source: &Layout, target: &Layout, objective: Objective<'_>) -> f64 {
        let space = Space::new(source, target, objective);
        let (start, goal) = (State::of(source), State::of(target));
        let mut best = FxHashMap::default();
        best.insert(start, 0.0);
        let mut heap = BinaryHeap::from([Queued {
            cost: 0.0,
            ops: 0,
            node: 0,
        }]);
        let mut states = vec![start];
        let mut steps = Vec::new();
        while let Some(Queued { cost, node, .. }) = heap.pop() {
            let state = states[node];
            if cost > best[&state] {
                continue;
            }
            if state == goal {
                return cost;
            }
            // Counted from the layout, not stepped along as the search does.
            let shard = state_layout(space.template, &state).shard_size();
            let distinct = state.used() | state.partial;
            space.steps(&state, goal.partial, &mut steps);
            for (step, next) in steps.drain(..) {
                let total = cost + space.price(objective, (&state, distinct, shard), step, &next);
                if best.get(&next).is_none_or(|&b| total < b) {
                    best.insert(next, total);
                    states.push(next);
                    heap.push(Queued {
                        cost: total,
                        ops: 0,
                        node: states.len() - 1,
                    });
                }
            }
        }
        panic!("the target is unreachable")
    }

    /// A* with its heuristic finds what a plain Dijkstra finds, in seconds, on clusters of
    /// every shape of 16 devices (two levels and three), with latencies and both replica
    /// models, from layouts with and without partial sums; the heuristic at the source never
    /// exceeds the least price; and the same pair with its tensor dims in another order has the
    /// same key and the same price.
    #[test]
    fn a_star_equals_dijkstra_in_seconds() {
        let (shape, matrix) = ([8u64, 4, 8, 2], [2u64, 2, 4]);
        let maps: Vec<Vec<i64>> = (0..4i64.pow(4))
            .map(|code| (0..4).map(|i| code / 4i64.pow(i) % 4 - 1).collect())
            .filter(|m: &Vec<i64>| Layout::new(shape.to_vec(), matrix.to_vec(), m.clone()).is_ok())
            .collect();
        let mut clusters = Vec::new();
        for per_node in [1, 2, 4, 8, 16] {
            for replicas in Replicas::ALL {
                let levels = [(per_node, 60e9, 1e-6), (16 / per_node, 6e9, 5e-6)];
                clusters.push(Cluster::hierarchy(&levels, None, replicas).unwrap());
            }
        }
        for replicas in Replicas::ALL {
            let levels = [(2, 100e9, 1e-6), (4, 20e9, 2e-6), (2, 5e9, 8e-6)];
            clusters.push(Cluster::hierarchy(&levels, None, replicas).unwrap());
        }
        // The first device dim the map leaves unused holds partial sums, in some sources.
        let with_partial = |l: &Layout, x: usize| {
            let free = (0..3).find(|&k| !l.uses(k));
            match free {
                Some(k) if x % 2 == 1 => l.with_state(l.tensor_map().to_vec(), vec![k]),
                _ => l.clone(),
            }
        };
        let reversed = |l: &Layout| {
            Layout::with_partial(
                l.shape().iter().rev().copied().collect(),
                l.device_matrix().to_vec(),
                l.tensor_map().iter().rev().copied().collect(),
                l.partial().to_vec(),
            )
            .unwrap()
        };
        let mut compared = 0;
        for (x, a) in maps.iter().enumerate().step_by(3) {
            for b in maps.iter().skip(x % 5).step_by(4) {
                let a = with_partial(&layout(&shape, &matrix, a), x);
                let b = layout(&shape, &matrix, b);
                let problem = Problem::of(&a, &b).unwrap();
                let other = Problem::of(&reversed(&a), &reversed(&b)).unwrap();
                assert_eq!(problem.key(), other.key());
                for cluster in &clusters {
                    let objective = Objective::Seconds {
                        cluster,
                        dtype_bytes: 2.0,
                    };
                    let want = dijkstra(&a, &b, objective);
                    let start =
                        Space::new(&a, &b, objective).remaining(&State::of(&a), a.shard_size(), 0);
                    assert!(start <= want, "{a:?} -> {b:?}: bound {start} over {want}");
                    // The search alone, unbounded: the planner bounds it by Algorithm 1's plan
                    // and falls back on that (`plan::solve`).
                    let price = |problem: &Problem, a: &Layout| {
                        let (source, target) = (&problem.source, &problem.target);
                        let stop = AtomicBool::new(false);
                        let path = search(source, target, f64::INFINITY, objective, &stop)
                            .expect("within the budget");
                        let ops = problem.ops(&path, a);
                        ops.iter().fold(0.0, |t, op| objective.add(t, op))
                    };
                    let got = price(&problem, &a);
                    assert!(
                        (got - want).abs() <= 1e-12 * want,
                        "{a:?} -> {b:?} on {cluster:?}: {got} against {want}"
                    );
                    let turned = price(&other, &reversed(&a));
                    assert!(
                        (turned - want).abs() <= 1e-12 * want,
                        "{turned} against {want}"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 1000, "{compared}");
    }
}
