//! Criterion benchmarks of the core kernels, reported as layout pairs per second.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use taps::{
    enumerate_strategies, plan_redistribution, redistribution_costs, Cluster, CostModel, Layout,
};

/// The output layouts of every strategy of a linear layer `(b, s, h) x (h, o)` on `n` devices.
fn linear_outputs(n: u64) -> Vec<Layout> {
    let sizes = [64, 2048, 4096, 4096];
    enumerate_strategies(&sizes, n)
        .unwrap()
        .iter()
        .map(|s| s.tensor_layout(&[0, 1, 3], vec![64, 2048, 4096]).unwrap())
        .collect()
}

fn planner(c: &mut Criterion) {
    let layouts = linear_outputs(32);
    let pairs: Vec<(&Layout, &Layout)> = layouts
        .iter()
        .flat_map(|a| layouts.iter().take(16).map(move |b| (a, b)))
        .collect();
    let mut g = c.benchmark_group("planner");
    g.throughput(Throughput::Elements(pairs.len() as u64));
    g.bench_function("plan_redistribution/linear-32dev", |bench| {
        bench.iter(|| {
            for (a, b) in &pairs {
                black_box(plan_redistribution(a, b).unwrap());
            }
        });
    });
    g.finish();
}

fn cost_kernel(c: &mut Criterion) {
    let cluster = Cluster::new(4, 8, 60e9, 6e9, None).unwrap();
    let layouts = linear_outputs(32);
    let mut g = c.benchmark_group("cost_kernel");
    g.throughput(Throughput::Elements((layouts.len() * layouts.len()) as u64));
    g.sample_size(20);
    g.bench_function("redistribution_costs/linear-32dev", |bench| {
        bench.iter(|| {
            black_box(
                redistribution_costs(&layouts, &layouts, &cluster, 2.0, CostModel::Topology)
                    .unwrap(),
            )
        });
    });
    g.finish();
}

fn strategies(c: &mut Criterion) {
    c.bench_function("enumerate_strategies/4-axes-1024dev", |bench| {
        bench.iter(|| black_box(enumerate_strategies(&[1 << 12; 4], 1024).unwrap()));
    });
}

criterion_group!(benches, planner, cost_kernel, strategies);
criterion_main!(benches);
