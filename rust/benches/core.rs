//! Criterion benchmarks of the core kernels, reported as layout pairs per second.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rayon::ThreadPoolBuilder;
use taps::batch::{allreduce_costs, AxesTensor};
use taps::minplus::{min_plus, min_plus_one, Dims, Matrix};
use taps::{
    enumerate_strategies, plan_redistribution, redistribution_costs, Cluster, CostModel, Layout,
    Objective, Planner,
};

/// The allocator of the Python extension (set in its binding module, not in the library), so that
/// these figures are the extension's and compare with the Python benchmarks. Under the system
/// allocator the kernels measure about the same and `enumerate_strategies`, which allocates a
/// vector per strategy, is slower.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The axes `(b, s, h, o)` of a Megatron-sized linear layer `(b, s, h) x (h, o)`.
const LINEAR: [u64; 4] = [64, 2048, 4096, 4096];

/// The output layouts of every strategy of a linear layer `(b, s, h) x (h, o)` on `n` devices.
fn linear_outputs(n: u64) -> Vec<Layout> {
    enumerate_strategies(&LINEAR, n, false)
        .unwrap()
        .iter()
        .map(|s| {
            s.tensor_layout(&[0, 1, 3], &[64, 2048, 4096], false)
                .unwrap()
        })
        .collect()
}

/// Plans of every output layout of the linear layer on 32 devices against 16 of them, by each
/// planner (the optimal one pricing seconds on 4 nodes of 8), in pairs per second.
fn planner(c: &mut Criterion) {
    let cluster = Cluster::new(4, 8, 60e9, 6e9, None).unwrap();
    let layouts = linear_outputs(32);
    let pairs: Vec<(&Layout, &Layout)> = layouts
        .iter()
        .flat_map(|a| layouts.iter().take(16).map(move |b| (a, b)))
        .collect();
    let mut g = c.benchmark_group("planner");
    g.throughput(Throughput::Elements(pairs.len() as u64));
    for (name, planner) in [("paper", Planner::Paper), ("optimal", Planner::Optimal)] {
        let objective = Objective::Seconds {
            cluster: &cluster,
            dtype_bytes: 2.0,
        };
        g.bench_function(
            BenchmarkId::new("plan_redistribution/linear-32dev", name),
            |bench| {
                bench.iter(|| {
                    for (a, b) in &pairs {
                        black_box(plan_redistribution(a, b, planner, objective).unwrap());
                    }
                });
            },
        );
    }
    g.finish();
}

/// The cost kernel on every output layout of the linear layer against every other (the optimal
/// planner on the first 32 of them: it plans a pair hundreds of times slower), on thread pools of
/// 1 and 2 threads: the thread scaling of the kernel, in layout pairs per second.
fn cost_kernel(c: &mut Criterion) {
    let cluster = Cluster::new(4, 8, 60e9, 6e9, None).unwrap();
    let all = linear_outputs(32);
    let mut g = c.benchmark_group("cost_kernel");
    g.sample_size(10);
    for (name, planner, layouts) in [
        ("paper", Planner::Paper, &all[..]),
        ("optimal", Planner::Optimal, &all[..32]),
    ] {
        g.throughput(Throughput::Elements((layouts.len() * layouts.len()) as u64));
        for threads in [1, 2] {
            let pool = ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            g.bench_function(
                BenchmarkId::new(format!("redistribution_costs/linear-32dev/{name}"), threads),
                |bench| {
                    bench.iter(|| {
                        pool.install(|| {
                            black_box(
                                redistribution_costs(
                                    layouts,
                                    layouts,
                                    &cluster,
                                    2.0,
                                    CostModel::Topology,
                                    planner,
                                )
                                .unwrap(),
                            )
                        })
                    });
                },
            );
        }
    }
    g.finish();
}

/// The node-cost kernel on every strategy of the linear layer `(b, s, h, o)`: the forward
/// all_reduce of Y and the gradients of X and W, in strategies per second, on 32 devices (292
/// strategies) and on 512 nodes of 8 (4964), on thread pools of 1 and 2 threads.
fn allreduce_kernel(c: &mut Criterion) {
    let [batch, seq, hidden, out] = LINEAR;
    let tensor = |axes: Vec<i64>, shape: Vec<u64>| AxesTensor {
        axes,
        shape,
        dtype_bytes: 2.0,
    };
    let tensors = [
        tensor(vec![0, 1, 3], vec![batch, seq, out]),
        tensor(vec![0, 1, 2], vec![batch, seq, hidden]),
        tensor(vec![2, 3], vec![hidden, out]),
    ];
    let mut g = c.benchmark_group("allreduce_kernel");
    for nodes in [4, 512] {
        let cluster = Cluster::new(nodes, 8, 60e9, 6e9, None).unwrap();
        let strategies = enumerate_strategies(&LINEAR, cluster.num_devices(), false).unwrap();
        g.throughput(Throughput::Elements(strategies.len() as u64));
        for threads in [1, 2] {
            let pool = ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let name = format!("allreduce_costs/linear-{}dev", cluster.num_devices());
            g.bench_function(BenchmarkId::new(name, threads), |bench| {
                bench.iter(|| {
                    pool.install(|| {
                        black_box(
                            allreduce_costs(&strategies, &tensors, &cluster, CostModel::Topology)
                                .unwrap(),
                        )
                    })
                });
            });
        }
    }
    g.finish();
}

/// The attention scores of Llama-3 8B, `[batch, heads, group, seq, seq]`, on 128 nodes of 8: a
/// rank-5 tensor whose pairs unify into many dims and take many steps.
const SCORES: [u64; 5] = [64, 8, 4, 2048, 2048];

/// Algorithm 1's cost kernel on high-rank pairs: 256 layouts of the attention scores (every 59th
/// of its strategies' layouts on 1024 devices) against each other, in pairs per second on one
/// thread.
fn high_rank_kernel(c: &mut Criterion) {
    let cluster = Cluster::new(128, 8, 60e9, 6e9, None).unwrap();
    let layouts: Vec<Layout> = enumerate_strategies(&SCORES, 1024, false)
        .unwrap()
        .iter()
        .step_by(59)
        .take(256)
        .map(|s| s.tensor_layout(&[0, 1, 2, 3, 4], &SCORES, false).unwrap())
        .collect();
    let pool = ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let mut g = c.benchmark_group("cost_kernel");
    g.sample_size(10);
    g.throughput(Throughput::Elements((layouts.len() * layouts.len()) as u64));
    g.bench_function("redistribution_costs/scores-1024dev/paper/1", |bench| {
        bench.iter(|| {
            pool.install(|| {
                black_box(
                    redistribution_costs(
                        &layouts,
                        &layouts,
                        &cluster,
                        2.0,
                        CostModel::Topology,
                        Planner::Paper,
                    )
                    .unwrap(),
                )
            })
        });
    });
    g.finish();
}

/// The min-plus product of the series reductions, in additions per second: 512 x 512 x 512 of one
/// objective and 128 x 128 x 128 of two, and jax_llama's shapes of few rows or few columns
/// (62 x 618 x 6470, 1340 x 6470 x 62) of one, with ties (small integer costs), on thread pools
/// of 1 and 2 threads; of one objective also as the reductions call it on these shapes, `x`
/// column-major (a transposed view) and shifted.
fn min_plus_kernel(c: &mut Criterion) {
    let mut g = c.benchmark_group("min_plus");
    g.sample_size(10);
    for (rows, inner, cols, objectives) in [
        (512, 512, 512, 1),
        (128, 128, 128, 2),
        (62, 618, 6470, 1),
        (1340, 6470, 62, 1),
    ] {
        let dims = Dims {
            rows,
            inner,
            cols,
            objectives,
        };
        // A fixed pseudo-random sequence of small integers: many ties.
        let costs = |seed: usize, n: usize| -> Vec<f64> {
            (0..n * objectives)
                .map(|i| ((i * 2_654_435_761 + seed) >> 7 & 15) as f64)
                .collect()
        };
        let (x, y) = (costs(1, rows * inner), costs(2, inner * cols));
        g.throughput(Throughput::Elements((rows * inner * cols) as u64));
        for threads in [1, 2] {
            let pool = ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let name = format!("{rows}x{inner}x{cols}/{objectives}-objectives");
            g.bench_function(BenchmarkId::new(name, threads), |bench| {
                bench.iter(|| pool.install(|| black_box(min_plus(&x, &y, dims, 1e-12).unwrap())));
            });
            if objectives == 1 {
                let xm = Matrix {
                    data: &x,
                    rows,
                    cols: inner,
                    strides: [1, rows],
                };
                let ym = Matrix {
                    data: &y,
                    rows: inner,
                    cols,
                    strides: [cols, 1],
                };
                let shift = costs(3, inner);
                let name = format!("{rows}x{inner}x{cols}/column-major-x-shifted");
                g.bench_function(BenchmarkId::new(name, threads), |bench| {
                    bench.iter(|| {
                        pool.install(|| black_box(min_plus_one(xm, Some(&shift), ym).unwrap()))
                    });
                });
            }
        }
    }
    g.finish();
}

fn strategies(c: &mut Criterion) {
    c.bench_function("enumerate_strategies/4-axes-1024dev", |bench| {
        bench.iter(|| black_box(enumerate_strategies(&[1 << 12; 4], 1024, false).unwrap()));
    });
}

criterion_group!(
    benches,
    planner,
    cost_kernel,
    high_rank_kernel,
    allreduce_kernel,
    min_plus_kernel,
    strategies
);
criterion_main!(benches);
