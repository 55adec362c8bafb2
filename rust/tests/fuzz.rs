//! A fuzz target on stable Rust: arbitrary, mostly invalid, shapes, device matrices, tensor maps,
//! clusters, node sizes and strategies thrown at every public entry of the core, for a fixed
//! number of cases (about 30 s in a debug build, two cores). Nothing may panic; every rejection
//! is the [`Error`] variant of the entry's domain; every success satisfies the invariants a
//! caller relies on (unified layouts share a device matrix and a shape, a plan's cost is a number
//! at least 0 and equals the batch kernel's, ...). A cost may be infinite (a valid but tiny
//! bandwidth such as 1e-308 bytes/s overflows f64), never NaN or negative.
//!
//! The property tests (`properties.rs`) check valid inputs in depth; this one checks the edges:
//! zero, one, odd and non-power-of-two sizes, `u64::MAX`, `2^63`, negative and huge map entries,
//! NaN and infinite bandwidths.

use proptest::prelude::*;
use proptest::strategy::Strategy as _;
use proptest::test_runner::{Config, FileFailurePersistence};
use taps::batch::{allreduce_costs, AxesTensor};
use taps::{
    enumerate_strategies, inter_node_groups, plan_redistribution, redistribution_costs, unify,
    Cluster, CollectiveKind, CostModel, Error, Layout, Objective, OpKind, Planner, Strategy,
};

/// Cases per target; the five targets share the time budget.
const CASES: u32 = 20_000;

/// An unsigned entry: mostly small (valid and invalid sizes alike), sometimes at the edges.
fn edge_u64() -> impl proptest::strategy::Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..=9,
        3 => (0u32..64).prop_map(|b| 1u64 << b),
        1 => Just(u64::MAX),
        1 => Just((1u64 << 63) + 1),
        1 => any::<u64>(),
    ]
}

/// A signed entry: mostly a device dim or -1, sometimes out of range.
fn edge_i64() -> impl proptest::strategy::Strategy<Value = i64> {
    prop_oneof![
        8 => -3i64..=5,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
}

/// A float: mostly a plausible bandwidth or dtype size, sometimes zero, negative, NaN or infinite.
fn edge_f64() -> impl proptest::strategy::Strategy<Value = f64> {
    prop_oneof![
        6 => 1e-3f64..1e12,
        1 => Just(0.0),
        1 => Just(-2.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::MIN_POSITIVE),
    ]
}

/// The parts of a layout: either anything at all, or a layout that is probably valid (power-of-two
/// device dims, split dims that usually divide), so that the later stages see many valid ones.
fn layout_parts() -> impl proptest::strategy::Strategy<Value = (Vec<u64>, Vec<u64>, Vec<i64>)> {
    let wild = (
        prop::collection::vec(edge_u64(), 0..5),
        prop::collection::vec(edge_u64(), 0..5),
        prop::collection::vec(edge_i64(), 0..5),
    );
    let plausible = (
        prop::collection::vec(0u32..=3, 0..4),
        prop::collection::vec(prop::sample::select(vec![1u64, 2, 3, 4, 6, 8, 16]), 1..5),
        prop::collection::vec(-1i64..4, 4),
    )
        .prop_map(|(dims, base, picks)| {
            let matrix: Vec<u64> = dims.iter().map(|&b| 1u64 << b).collect();
            let h = matrix.len() as i64;
            let mut map = Vec::new();
            let mut shape = Vec::new();
            for (i, &b) in base.iter().enumerate() {
                let m = picks.get(i).copied().unwrap_or(-1);
                // Usually a free device dim; sometimes a taken or missing one (invalid).
                let m = if m < h && !map.contains(&m) { m } else { -1 };
                let split = usize::try_from(m).map_or(1, |k| matrix[matrix.len() - 1 - k]);
                shape.push(b * split);
                map.push(m);
            }
            (shape, matrix, map)
        });
    prop_oneof![1 => wild, 3 => plausible]
}

/// A reshape of `shape` with the same element count: adjacent dims merged, and dims split in two
/// (a factor of 3 or 2 outside or inside), where the bits of `edits` say.
fn reshaped(shape: &[u64], edits: u16) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for (i, &s) in shape.iter().enumerate() {
        let bits = edits >> (2 * (i % 8)) & 3;
        let factor = [3, 2].into_iter().find(|f| s % f == 0 && s > *f);
        match (bits, out.last_mut(), factor) {
            (1, Some(last), _) => *last = last.saturating_mul(s),
            (2, _, Some(f)) => out.extend([f, s / f]),
            (3, _, Some(f)) => out.extend([s / f, f]),
            _ => out.push(s),
        }
    }
    out
}

/// A cluster for `devices` devices: usually `2^node_bits` nodes (capped at the device count),
/// sometimes `wild` nodes, which need not divide the devices.
fn cluster_for(devices: u64, node_bits: u32, wild: Option<u64>) -> Result<Cluster, Error> {
    let nodes = wild.unwrap_or(1 << node_bits.min(devices.trailing_zeros()));
    let per_node = devices.checked_div(nodes).unwrap_or(0);
    Cluster::new(nodes, per_node, 60e9, 6e9, None)
}

/// A strategy's parts: anything, or power-of-two degrees with a permutation of the device dims.
fn strategy_parts() -> impl proptest::strategy::Strategy<Value = (Vec<u64>, Vec<i64>)> {
    let wild = (
        prop::collection::vec(edge_u64(), 0..4),
        prop::collection::vec(edge_i64(), 0..4),
    );
    let plausible =
        (prop::collection::vec(0u32..=3, 0..4), any::<u64>()).prop_map(|(exps, seed)| {
            let degrees: Vec<u64> = exps.iter().map(|&e| 1u64 << e).collect();
            let mut split: Vec<usize> = (0..degrees.len()).filter(|&i| degrees[i] > 1).collect();
            // A seeded rotation of the split axes: some order of the device dims.
            if !split.is_empty() {
                let r = (seed as usize) % split.len();
                split.rotate_left(r);
            }
            let mut map = vec![-1i64; degrees.len()];
            for (k, &axis) in split.iter().enumerate() {
                map[axis] = k as i64;
            }
            (degrees, map)
        });
    prop_oneof![1 => wild, 3 => plausible]
}

fn model(volume: bool) -> CostModel {
    if volume {
        CostModel::Volume
    } else {
        CostModel::Topology
    }
}

fn config() -> Config {
    Config {
        cases: CASES,
        // Failures are kept in `fuzz.proptest-regressions` next to this file and replayed first.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// `Layout::new` accepts exactly the valid parts; a valid layout answers every query.
    #[test]
    fn layouts((shape, matrix, map) in layout_parts(), rank in edge_u64()) {
        match Layout::new(shape, matrix, map) {
            Err(e) => prop_assert!(matches!(e, Error::Layout(_)), "{e:?}"),
            Ok(l) => {
                let n = l.num_devices();
                prop_assert!(n.is_power_of_two());
                prop_assert_eq!(l.shard_index(rank).is_ok(), rank < n);
                let shard: u64 = l.shard_shape().iter().product();
                prop_assert_eq!(shard, l.shard_size());
                let normal = taps::unify::normalized(&l);
                prop_assert_eq!(taps::unify::normalized(&normal), normal);
            }
        }
    }

    /// Unification and the planner on two layouts, of one tensor or not: a result or the error of
    /// their domain, never a panic; a plan costs what the batch kernel says.
    #[test]
    fn unify_and_plan(
        a in layout_parts(),
        b in layout_parts(),
        edits in any::<u16>(),
        same_tensor in any::<bool>(),
        node_bits in 0u32..6,
        wild_nodes in prop::option::weighted(0.2, edge_u64()),
        dtype_bytes in edge_f64(),
        volume in any::<bool>(),
    ) {
        let Ok(a) = Layout::new(a.0, a.1, a.2) else { return Ok(()) };
        // Half the pairs describe a's tensor: b's matrix and map on a reshape of a's shape.
        let (b_shape, b_matrix, b_map) = if same_tensor {
            let shape = reshaped(a.shape(), edits);
            // b's map entries folded onto a's device dims, each used once.
            let h = a.num_device_dims() as i64 + 1;
            let mut map: Vec<i64> = Vec::new();
            for i in 0..shape.len() {
                let m = b.2.get(i).map_or(-1, |m| m.rem_euclid(h) - 1);
                map.push(if map.contains(&m) { -1 } else { m });
            }
            (shape, a.device_matrix().to_vec(), map)
        } else {
            b
        };
        let Ok(b) = Layout::new(b_shape, b_matrix, b_map) else { return Ok(()) };
        let one_tensor = a.num_devices() == b.num_devices() && a.num_elements() == b.num_elements();
        match unify(&a, &b) {
            Ok((x, y)) => {
                prop_assert!(one_tensor);
                prop_assert_eq!(x.device_matrix(), y.device_matrix());
                prop_assert_eq!(x.shape(), y.shape());
                prop_assert_eq!(x.num_elements(), a.num_elements());
            }
            Err(e) => prop_assert!(matches!(e, Error::Layout(_) | Error::Unify(_)), "{e:?}"),
        }
        let plan = match plan_redistribution(&a, &b, Planner::Paper, Objective::Volume) {
            Ok(plan) => plan,
            Err(e) => {
                prop_assert!(!one_tensor, "no plan for one tensor: {e:?}");
                prop_assert!(matches!(e, Error::Layout(_)), "{e:?}");
                return Ok(());
            }
        };
        prop_assert!(one_tensor);
        let splits = (0..a.ndim()).try_fold(1u64, |acc, i| acc.checked_mul(a.split_degree(i)));
        if let Some(splits) = splits {
            prop_assert!(plan.volume().unwrap() <= (splits - 1) * a.shard_size());
        }
        let cluster = cluster_for(a.num_devices(), node_bits, wild_nodes);
        let Ok(cluster) = cluster else {
            prop_assert!(matches!(cluster, Err(Error::Topology(_))));
            return Ok(());
        };
        // Each planner's plan, minimizing what the cost model prices, costs what the kernel says.
        let objective = if volume {
            Objective::Volume
        } else {
            Objective::Seconds { cluster: &cluster, dtype_bytes }
        };
        for planner in [Planner::Paper, Planner::Optimal] {
            let single = plan_redistribution(&a, &b, planner, objective)
                .and_then(|plan| plan.cost(&cluster, dtype_bytes, model(volume)));
            let batch = redistribution_costs(
                std::slice::from_ref(&a),
                std::slice::from_ref(&b),
                &cluster,
                dtype_bytes,
                model(volume),
                planner,
            );
            match (single, batch) {
                (Ok(cost), Ok(costs)) => {
                    prop_assert!(cost >= 0.0, "cost {}", cost);
                    prop_assert_eq!(costs[0].to_bits(), cost.to_bits(), "{:?}", planner);
                }
                (Err(e), Err(f)) => {
                    let valid_dtype = dtype_bytes.is_finite() && dtype_bytes > 0.0;
                    prop_assert!(!valid_dtype, "{e:?}");
                    prop_assert!(matches!(e, Error::Topology(_)) && e == f, "{e:?} {f:?}");
                }
                (single, batch) => prop_assert!(false, "plan {single:?} but batch {batch:?}"),
            }
        }
    }

    /// `ct` from both entry points, the free function and a plan's op, under one rule: a node size
    /// that is not a positive power of two is an `Error::Topology`, and both agree otherwise.
    #[test]
    fn inter_node_groups_of_any_node_size(
        a in layout_parts(),
        map in prop::collection::vec(-1i64..4, 0..5),
        per_node in edge_u64(),
        dim in prop::option::of(0usize..6),
        kind in prop::sample::select(CollectiveKind::ALL.to_vec()),
    ) {
        let Ok(a) = Layout::new(a.0, a.1, a.2) else { return Ok(()) };
        let valid_node = per_node.is_power_of_two();
        match inter_node_groups(&a, kind, per_node, dim) {
            Ok(ct) => {
                prop_assert!(valid_node);
                prop_assert!(ct <= a.num_devices());
            }
            Err(e) => prop_assert!(matches!(e, Error::Topology(_)), "{e:?}"),
        }
        let b = Layout::new(a.shape().to_vec(), a.device_matrix().to_vec(), map);
        let Ok(b) = b else { return Ok(()) };
        for planner in [Planner::Paper, Planner::Optimal] {
            let plan = plan_redistribution(&a, &b, planner, Objective::Volume).unwrap();
            for op in plan.all_ops() {
                let ct = op.inter_node_groups(per_node);
                prop_assert_eq!(ct.is_ok(), valid_node);
                // The free function takes one device dim (an all_reduce: the unused ones).
                let one_dim = op.permutation().is_none() && op.kind() != OpKind::AllReduce;
                if let (Ok(ct), Some(kind), true) = (ct, op.kind().collective(), one_dim) {
                    let direct =
                        inter_node_groups(op.layout(), kind, per_node, Some(op.device_dim()));
                    prop_assert_eq!(direct, Ok(ct));
                }
            }
        }
    }

    /// Strategy enumeration on any sizes and device count: a list of strategies of that many
    /// devices whose degrees divide the sizes, or `Error::Strategy`.
    #[test]
    fn strategies(
        sizes in prop::collection::vec(edge_u64(), 0..4),
        devices in edge_u64(),
        replicas in any::<bool>(),
    ) {
        match enumerate_strategies(&sizes, devices, replicas) {
            Ok(all) => {
                prop_assert!(devices.is_power_of_two() && !sizes.contains(&0));
                for s in all {
                    prop_assert_eq!(s.num_devices(), devices);
                    prop_assert_eq!(s.degrees().iter().product::<u64>() * s.replicas(), devices);
                    prop_assert!(s.degrees().iter().zip(&sizes).all(|(&d, &n)| n % d == 0));
                    let again = Strategy::with_device_matrix(
                        s.degrees().to_vec(),
                        s.device_map().to_vec(),
                        s.device_matrix().to_vec(),
                    );
                    prop_assert_eq!(again.as_ref(), Ok(&s));
                }
            }
            Err(e) => prop_assert!(matches!(e, Error::Strategy(_)), "{e:?}"),
        }
    }

    /// Hand-made strategies and the node-cost kernel on any tensors, clusters and dtypes.
    #[test]
    fn strategies_and_allreduce_costs(
        (degrees, device_map) in strategy_parts(),
        axes in prop::collection::vec(prop_oneof![4 => -1i64..4, 1 => edge_i64()], 0..4),
        blocks in prop::collection::vec(prop_oneof![4 => 1u64..4, 1 => edge_u64()], 0..4),
        node_bits in 0u32..6,
        wild_cluster in prop::option::weighted(
            0.2,
            (edge_u64(), edge_u64(), edge_f64(), edge_f64(), prop::option::of(edge_f64())),
        ),
        dtype_bytes in edge_f64(),
        volume in any::<bool>(),
    ) {
        let s = match Strategy::new(degrees, device_map) {
            Ok(s) => s,
            Err(e) => {
                prop_assert!(matches!(e, Error::Strategy(_)), "{e:?}");
                return Ok(());
            }
        };
        // Usually a block count per dim times the degree of its axis: a shape that fits.
        let shape: Vec<u64> = axes
            .iter()
            .zip(&blocks)
            .map(|(&a, &b)| {
                let degree = usize::try_from(a).ok().and_then(|a| s.degrees().get(a));
                b.saturating_mul(degree.copied().unwrap_or(1))
            })
            .collect();
        let layout = s.tensor_layout(&axes, &shape, true);
        if let Err(e) = &layout {
            prop_assert!(matches!(e, Error::Layout(_)), "{e:?}");
        }
        let devices = s.num_devices();
        let cluster = match wild_cluster {
            Some((nodes, per_node, intra, inter, memory)) => {
                Cluster::new(nodes, per_node, intra, inter, memory)
            }
            None => cluster_for(devices, node_bits, None),
        };
        let cluster = match cluster {
            Ok(c) => c,
            Err(e) => {
                prop_assert!(matches!(e, Error::Topology(_)), "{e:?}");
                return Ok(());
            }
        };
        let tensor = AxesTensor { axes, shape, dtype_bytes };
        match allreduce_costs(std::slice::from_ref(&s), &[tensor], &cluster, model(volume)) {
            Ok(costs) => {
                prop_assert!(layout.is_ok() && devices == cluster.num_devices());
                prop_assert!(costs[0] >= 0.0, "cost {}", costs[0]);
            }
            Err(e) => prop_assert!(matches!(e, Error::Layout(_) | Error::Topology(_)), "{e:?}"),
        }
    }
}
