//! Property tests of the core without Python: unification keeps every rank's elements, every plan
//! step moves exactly the elements it claims, and `ct` matches brute-force group enumeration.

use std::collections::BTreeSet;

use proptest::prelude::*;
use taps::topology::Replicas;
use taps::unify::normalized;
use taps::{
    inter_node_groups, plan_redistribution, redistribution_costs, unify, Cluster, CollectiveKind,
    CommOp, CostModel, Layout, Objective, OpKind, Planner,
};

/// Flat (row-major) indices of the elements `rank` holds.
fn elements(l: &Layout, rank: u64) -> BTreeSet<u64> {
    let ranges = l.shard_index(rank).unwrap();
    let mut out = BTreeSet::from([0u64]);
    for (i, &(start, stop)) in ranges.iter().enumerate() {
        let size = l.shape()[i];
        out = out
            .iter()
            .flat_map(|&prefix| (start..stop).map(move |x| prefix * size + x))
            .collect();
    }
    out
}

/// A random layout of `2^n` devices: a factorization of the devices, a shape whose split dims
/// divide, and a map using each device dim at most once.
fn layout(n: u32) -> impl Strategy<Value = Layout> {
    (
        proptest::collection::vec(0u32..=n, 0..4),
        proptest::collection::vec(prop::sample::select(vec![1u64, 2, 3, 4, 6, 8]), 1..4),
        any::<u64>(),
    )
        .prop_map(move |(cuts, base, seed)| {
            let mut bounds: Vec<u32> = cuts.into_iter().chain([0, n]).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let dims: Vec<u64> = bounds.windows(2).map(|w| 1u64 << (w[1] - w[0])).collect();
            let matrix: Vec<u64> = dims.iter().rev().copied().collect();
            let mut free: Vec<i64> = (0..dims.len() as i64).collect();
            let mut state = seed;
            let mut shape = Vec::new();
            let mut map = Vec::new();
            for b in base {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                let pick = (state >> 33) as usize % (free.len() + 1);
                if pick < free.len() {
                    let k = free.remove(pick);
                    shape.push(b * dims[k as usize]);
                    map.push(k);
                } else {
                    shape.push(b);
                    map.push(-1);
                }
            }
            Layout::new(shape, matrix, map).unwrap()
        })
}

/// Two layouts of one tensor on 2^n devices; the second reshaped to a random shape of the same
/// element count when it can be.
fn pair() -> impl Strategy<Value = (Layout, Layout)> {
    (0u32..=4)
        .prop_flat_map(|n| (layout(n), layout(n)))
        .prop_filter_map("same element count", |(a, b)| {
            if a.num_elements() == b.num_elements() {
                return Some((a, b));
            }
            // Reuse b's device matrix and map on a reshaped copy of a's shape when possible.
            let total = a.num_elements();
            let mut shape = b.shape().to_vec();
            let last = shape.len() - 1;
            let rest: u64 = shape[..last].iter().product();
            if total % rest != 0 {
                return None;
            }
            shape[last] = total / rest;
            Layout::new(shape, b.device_matrix().to_vec(), b.tensor_map().to_vec())
                .ok()
                .map(|b2| (a, b2))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn unify_keeps_every_ranks_elements((a, b) in pair()) {
        if let Ok((ua, ub)) = unify(&a, &b) {
            prop_assert_eq!(ua.device_matrix(), ub.device_matrix());
            prop_assert_eq!(ua.shape(), ub.shape());
            for r in 0..a.num_devices() {
                prop_assert_eq!(elements(&a, r), elements(&ua, r));
                prop_assert_eq!(elements(&b, r), elements(&ub, r));
            }
        }
    }

    #[test]
    fn every_step_moves_what_it_claims((a, b) in pair()) {
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        // The unified ops: each step's new elements are exactly its volume.
        let mut states: Vec<&Layout> = plan.ops.iter().map(CommOp::layout).collect();
        states.push(&plan.target);
        if let Some(first) = plan.ops.first() {
            prop_assert_eq!(first.layout(), &plan.source);
        }
        for (op, after) in plan.ops.iter().zip(states.iter().skip(1)) {
            for r in 0..a.num_devices() {
                let before = elements(op.layout(), r);
                let now = elements(after, r);
                prop_assert_eq!(now.difference(&before).count() as u64, op.volume());
            }
        }
        for r in 0..a.num_devices() {
            prop_assert_eq!(elements(&plan.target, r), elements(&b, r));
        }
        // Never more than gathering every split of the source.
        let splits: u64 = (0..a.ndim()).map(|i| a.split_degree(i)).product();
        prop_assert!(plan.volume().unwrap() <= (splits - 1) * a.shard_size());
    }

    /// The batch kernel prices a pair without building its plan (Algorithm 1 on rank-bit maps,
    /// unification's cuts written into buffers and skipped where nothing falls inside, each
    /// layout's start worked out once): bit for bit the plan's cost, on clusters of up to three
    /// levels with latencies under either replica model, with partial sums on some of the
    /// source's unused device dims.
    #[test]
    fn kernel_costs_are_the_plans(
        (a, b) in pair(),
        partial in any::<u64>(),
        split in any::<u32>(),
        replicas in 0usize..2,
    ) {
        let unused = (0..a.num_device_dims())
            .filter(|&k| partial >> k & 1 == 1 && !a.tensor_map().contains(&(k as i64)));
        let (shape, matrix, map) = (a.shape(), a.device_matrix(), a.tensor_map());
        let summed =
            Layout::with_partial(shape.to_vec(), matrix.to_vec(), map.to_vec(), unused.collect())
                .unwrap();
        let n = a.num_devices().trailing_zeros();
        let inner = split % (n + 1);
        let middle = split / 8 % (n - inner + 1);
        let levels = [
            (1 << inner, 60e9, 1e-6),
            (1 << middle, 12e9, 5e-6),
            (1 << (n - inner - middle), 3e9, 2e-5),
        ];
        let cluster = Cluster::hierarchy(&levels, None, Replicas::ALL[replicas]).unwrap();
        let sources = [summed, a.clone(), b.clone()];
        let targets = [b, a];
        for model in [CostModel::Topology, CostModel::Volume] {
            let got =
                redistribution_costs(&sources, &targets, &cluster, 2.0, model, Planner::Paper)
                    .unwrap();
            for (i, s) in sources.iter().enumerate() {
                for (j, t) in targets.iter().enumerate() {
                    let plan = plan_redistribution(s, t, Planner::Paper, Objective::Volume);
                    let want = plan.unwrap().cost(&cluster, 2.0, model).unwrap();
                    prop_assert_eq!(got[i * 2 + j].to_bits(), want.to_bits(), "{:?} to {:?}", s, t);
                }
            }
        }
    }

    /// The optimal plan ends on the target's elements, never moves more than Algorithm 1, and
    /// every all-gather, all-to-all and slice in it moves exactly its volume.
    #[test]
    fn optimal_plans_never_lose((a, b) in pair()) {
        let paper = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        let plan = plan_redistribution(&a, &b, Planner::Optimal, Objective::Volume).unwrap();
        prop_assert!(plan.volume().unwrap() <= paper.volume().unwrap());
        let mut states: Vec<&Layout> = plan.ops.iter().map(CommOp::layout).collect();
        states.push(&plan.target);
        for (op, after) in plan.ops.iter().zip(states.iter().skip(1)) {
            let moved = (0..a.num_devices()).map(|r| {
                let before = elements(op.layout(), r);
                elements(after, r).difference(&before).count() as u64
            });
            if op.kind() == OpKind::CollectivePermute {
                prop_assert_eq!(moved.max(), Some(op.volume()));
            } else {
                for m in moved {
                    prop_assert_eq!(m, op.volume());
                }
            }
        }
        for r in 0..a.num_devices() {
            prop_assert_eq!(elements(&plan.target, r), elements(&b, r));
        }
    }

    #[test]
    fn ct_matches_brute_force(l in (1u32..=5).prop_flat_map(layout), node_bits in 0u32..=5) {
        let per_node = 1u64 << node_bits.min(l.num_devices().trailing_zeros());
        let h = l.num_device_dims();
        let groups: Vec<(CollectiveKind, Vec<usize>)> = std::iter::once(
            (CollectiveKind::AllReduce, (0..h).filter(|&k| !l.uses(k)).collect()),
        )
        .chain((0..h).map(|k| (CollectiveKind::AllGather, vec![k])))
        .collect();
        for (collective, group) in groups {
            let dim = (collective != CollectiveKind::AllReduce).then(|| group[0]);
            let got = inter_node_groups(&l, collective, per_node, dim).unwrap();
            prop_assert_eq!(got, brute_ct(&l, collective, &group, per_node));
        }
    }
}

/// Count, in the busiest node, the groups with members inside and outside it, groups that hold
/// the same data (they differ only in unused device dims) counting once for gathers.
fn brute_ct(l: &Layout, collective: CollectiveKind, group: &[usize], per_node: u64) -> u64 {
    let n = l.num_devices();
    let key = |r: u64, dims: &dyn Fn(usize) -> bool| -> Vec<u64> {
        (0..l.num_device_dims())
            .filter(|&k| dims(k))
            .map(|k| l.coordinate(r, k))
            .collect()
    };
    (0..n / per_node)
        .map(|node| {
            let inside = |r: u64| r / per_node == node;
            let mut crossing = BTreeSet::new();
            for r in (node * per_node)..((node + 1) * per_node) {
                let id = key(r, &|k| !group.contains(&k));
                let leaves = (0..n).any(|q| !inside(q) && key(q, &|k| !group.contains(&k)) == id);
                if leaves {
                    let data = if collective == CollectiveKind::AllReduce {
                        id
                    } else {
                        key(r, &|k| !group.contains(&k) && l.uses(k))
                    };
                    crossing.insert(data);
                }
            }
            crossing.len() as u64
        })
        .max()
        .unwrap_or(0)
}

/// A pair of layouts of one tensor on one device matrix of up to 4 dims (sizes 2 and 4): up to
/// 4 tensor dims that every device dim divides, random maps, partial sums on some free dims of
/// the source and on some of those the target leaves free.
fn partial_pair() -> impl Strategy<Value = (Layout, Layout)> {
    (
        proptest::collection::vec(prop::sample::select(vec![2u64, 4]), 1..=4),
        proptest::collection::vec(prop::sample::select(vec![1u64, 2, 3]), 1..=4),
        any::<u64>(),
    )
        .prop_map(|(matrix, base, seed)| {
            let shape: Vec<u64> = base.iter().map(|b| 8 * b).collect();
            let mut state = seed;
            let mut next = |n: usize| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) as usize % n
            };
            let h = matrix.len();
            let mut map = || {
                let mut free: Vec<i64> = (0..h as i64).collect();
                shape
                    .iter()
                    .map(|_| {
                        let pick = next(free.len() + 1);
                        if pick < free.len() {
                            free.remove(pick)
                        } else {
                            -1
                        }
                    })
                    .collect::<Vec<i64>>()
            };
            let (ma, mb) = (map(), map());
            let unused = |m: &[i64], k: usize| !m.contains(&(k as i64));
            let pa: Vec<usize> = (0..h).filter(|&k| unused(&ma, k) && next(2) == 1).collect();
            let pb: Vec<usize> = pa
                .iter()
                .copied()
                .filter(|&k| unused(&mb, k) && next(3) == 1)
                .collect();
            (
                Layout::with_partial(shape.clone(), matrix.clone(), ma, pa).unwrap(),
                Layout::with_partial(shape, matrix, mb, pb).unwrap(),
            )
        })
}

/// A layout of the search: the tensor map and the partial device dims.
type Point = (Vec<i64>, Vec<usize>);

/// `point` as one integer (at most 24 tensor dims, 16 device dims): 4 bits per tensor dim (its
/// device dim + 1), then a bit per partial device dim (so the partial dims' order does not
/// matter).
fn pack((map, partial): &Point) -> u128 {
    let mask: u128 = partial.iter().map(|&k| 1u128 << k).sum();
    map.iter()
        .rev()
        .fold(0u128, |acc, &m| (acc << 4) | (m + 1) as u128)
        << 16
        | mask
}

/// The point [`pack`] made, of `n` tensor dims.
fn unpack(packed: u128, n: usize) -> Point {
    let map = (0..n)
        .map(|i| ((packed >> (16 + 4 * i)) & 15) as i64 - 1)
        .collect();
    let partial = (0..16).filter(|&k| packed >> k & 1 == 1).collect();
    (map, partial)
}

/// The maps a collective-permute reaches from `map` (the search's layout of [`exhaustive_volume`]):
/// every assignment of the split dims to themselves or to a device dim of their size (of `h`),
/// not holding partial sums, that splits their tensor dim in the target map `goal` or, for a
/// tensor dim `goal` leaves unsplit, to any such dim, one to one, other than `map`.
fn permuted(
    map: &[i64],
    partial: &[usize],
    goal: &[i64],
    size: &impl Fn(usize) -> u64,
    h: usize,
) -> Vec<Vec<i64>> {
    // Each split in turn to an option no earlier split took: enumerating the whole product and
    // then dropping the maps that are not one to one took minutes on 7 size-2 dims.
    fn assign(
        at: usize,
        split: &[usize],
        options: &[Vec<i64>],
        next: &mut [i64],
        out: &mut Vec<Vec<i64>>,
    ) {
        let Some(&i) = split.get(at) else {
            out.push(next.to_vec());
            return;
        };
        for &d in &options[at] {
            if split[..at].iter().all(|&j| next[j] != d) {
                next[i] = d;
                assign(at + 1, split, options, next, out);
            }
        }
    }
    let split: Vec<usize> = (0..map.len()).filter(|&i| map[i] >= 0).collect();
    let options: Vec<Vec<i64>> = split
        .iter()
        .map(|&i| {
            let k = map[i] as usize;
            (0..h)
                .filter(|&d| {
                    size(d) == size(k)
                        && !partial.contains(&d)
                        && (d == k || goal[i] == d as i64 || goal[i] < 0)
                })
                .map(|d| d as i64)
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    assign(0, &split, &options, &mut map.to_vec(), &mut out);
    out.retain(|m| m != map);
    out
}

/// The least elements received per device from `source` to `target` (one shape, one device
/// matrix), by a plain Dijkstra over every layout the optimal planner's steps reach, without its
/// bound, heuristic, classes of equivalent layouts or pruning rules (docs/core.md): slices along
/// a free device dim that may split (one that splits a dim at either end or holds partial sums in
/// the source) of any unsplit dim it divides, all-gathers, all-to-alls to any such dim,
/// reduce-scatters and all-reduces of the partial sums the target does not keep, and
/// collective-permutes that hand each split to a device dim of its size that splits that tensor
/// dim in the target, or to any free one for a tensor dim the target leaves unsplit (the planner
/// takes only the one where the final all-gather is cheapest). Volumes from the shard sizes, as
/// docs/conventions.md gives them.
fn exhaustive_volume(source: &Layout, target: &Layout) -> u64 {
    let (shape, matrix) = (source.shape().to_vec(), source.device_matrix().to_vec());
    let h = matrix.len();
    let size = |k: usize| matrix[h - 1 - k];
    let ends = |k: usize| {
        source.tensor_map().contains(&(k as i64))
            || target.tensor_map().contains(&(k as i64))
            || source.partial().contains(&k)
    };
    let goal: Point = (target.tensor_map().to_vec(), target.partial().to_vec());
    let shard = |(map, _): &Point| {
        let parts: u64 = map
            .iter()
            .filter(|&&m| m >= 0)
            .map(|&m| size(m as usize))
            .product();
        shape.iter().product::<u64>() / parts
    };
    // States keyed by a packed integer: comparing and cloning vectors made this reference,
    // not the planner it checks, most of the test's time (minutes for one case in a debug build).
    let dims = source.tensor_map().len();
    assert!(dims <= 24 && h <= 16, "{source:?} is too large to pack");
    let end = pack(&goal);
    let mut best: std::collections::HashMap<u128, u64> = std::collections::HashMap::new();
    let mut queue = std::collections::BinaryHeap::new();
    let start: Point = (source.tensor_map().to_vec(), source.partial().to_vec());
    best.insert(pack(&start), 0);
    queue.push(std::cmp::Reverse((0u64, pack(&start))));
    while let Some(std::cmp::Reverse((cost, packed))) = queue.pop() {
        if best[&packed] < cost {
            continue;
        }
        if packed == end {
            return cost;
        }
        let point = unpack(packed, dims);
        let (map, partial) = &point;
        let s = shard(&point);
        let mut moves: Vec<(u64, Point)> = Vec::new();
        let free = |k: usize| !map.contains(&(k as i64)) && !partial.contains(&k);
        let divides = |k: usize, j: usize| map[j] < 0 && shape[j] % size(k) == 0;
        let with = |j: usize, k: i64, m: &[i64]| {
            let mut m = m.to_vec();
            m[j] = k;
            m
        };
        for k in 0..h {
            let g = size(k);
            for j in 0..map.len() {
                if free(k) && ends(k) && divides(k, j) {
                    moves.push((0, (with(j, k as i64, map), partial.clone())));
                }
            }
            if partial.contains(&k) && !goal.1.contains(&k) {
                let rest: Vec<usize> = partial.iter().copied().filter(|&p| p != k).collect();
                moves.push(((2 * (g - 1) * s).div_ceil(g), (map.clone(), rest.clone())));
                for j in 0..map.len() {
                    if divides(k, j) {
                        moves.push(((g - 1) * s / g, (with(j, k as i64, map), rest.clone())));
                    }
                }
            }
            if let Some(i) = map.iter().position(|&m| m == k as i64) {
                let gathered = with(i, -1, map);
                moves.push(((g - 1) * s, (gathered.clone(), partial.clone())));
                for j in 0..map.len() {
                    if j != i && divides(k, j) {
                        let m = with(j, k as i64, &gathered);
                        moves.push(((g - 1) * s / g, (m, partial.clone())));
                    }
                }
            }
        }
        for m in permuted(map, partial, &goal.0, &size, h) {
            moves.push((s, (m, partial.clone())));
        }
        for (price, next) in moves {
            let (next, total) = (pack(&next), cost + price);
            if best.get(&next).is_none_or(|&b| total < b) {
                best.insert(next, total);
                queue.push(std::cmp::Reverse((total, next)));
            }
        }
    }
    panic!("{target:?} is unreachable from {source:?}")
}

/// `cases` cases from a fixed seed unless `PROPTEST_RNG_SEED` names another: the exhaustive
/// references' time varies tenfold with the cases drawn (a random seed made CI's time a lottery).
fn seeded(cases: u32) -> ProptestConfig {
    let mut config = ProptestConfig::with_cases(cases);
    if config.rng_seed == proptest::test_runner::RngSeed::Random {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(1);
    }
    config
}

proptest! {
    #![proptest_config(seeded(300))]

    /// The optimal planner is exact: its plan moves what the cheaper of a plain exhaustive
    /// shortest path over the same steps (between the unified canonical forms, where it
    /// searches) and Algorithm 1 on the pair as given moves, partial sums included.
    #[test]
    fn optimal_equals_exhaustive_shortest_path((a, b) in partial_pair()) {
        let unified = unify(&normalized(&a), &normalized(&b));
        prop_assume!(unified.is_ok());
        let (ua, ub) = unified.unwrap();
        let paper = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        let plan = plan_redistribution(&a, &b, Planner::Optimal, Objective::Volume).unwrap();
        let want = exhaustive_volume(&ua, &ub).min(paper.volume().unwrap());
        prop_assert_eq!(plan.volume().unwrap(), want, "{:?} -> {:?}", a, b);
    }
}
