//! Batch cost kernels for the search: many layout pairs, or many strategies, at once, on all cores.

use std::borrow::Cow;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use crate::error::{reserve, try_filled, Error, Result};
use crate::layout::Layout;
use crate::plan::optimal::{self, Key, Path};
use crate::plan::{
    paper, plan_bound_within, search_problem, shortest_plan_bound, shortest_plan_by, solve,
    Objective, Planner,
};
use crate::strategies::Strategy;
use crate::topology::{check_dtype_bytes, Cluster, CostModel};
use crate::unify::{check_same_tensor, normalized};

/// The distinct items of `layouts` (layouts, or tuples of them), in the order first met, and
/// the index of each item among them.
pub(crate) fn dedupe<T: Hash + Eq>(layouts: &[T]) -> (Vec<&T>, Vec<usize>) {
    // (Fx, not std's SipHash: a layout is a few short vectors, hashed once per layout.)
    let mut seen: FxHashMap<&T, usize> =
        FxHashMap::with_capacity_and_hasher(layouts.len(), rustc_hash::FxBuildHasher);
    let mut distinct = Vec::new();
    let index = layouts
        .iter()
        .map(|l| {
            *seen.entry(l).or_insert_with(|| {
                distinct.push(l);
                distinct.len() - 1
            })
        })
        .collect();
    (distinct, index)
}

/// Every (source, target) pair describes one tensor ([`check_same_tensor`]): checked once per
/// call, not per pair, as each layout with the first of the other side.
fn check_one_tensor(src: &[&Layout], tgt: &[&Layout]) -> Result<()> {
    if let (Some(a), Some(b)) = (src.first(), tgt.first()) {
        for (x, y) in tgt
            .iter()
            .map(|t| (*a, *t))
            .chain(src.iter().map(|s| (*s, *b)))
        {
            check_same_tensor(x, y)?;
        }
    }
    Ok(())
}

/// The objective the optimal planner minimizes for a cost model.
fn objective(cluster: &Cluster, dtype_bytes: f64, model: CostModel) -> Objective<'_> {
    match model {
        CostModel::Topology => Objective::Seconds {
            cluster,
            dtype_bytes,
        },
        CostModel::Volume => Objective::Volume,
    }
}

/// The row-major `sources.len() x targets.len()` matrix of redistribution costs: entry `(i, j)`
/// is the cost of the plan `planner` makes, minimizing seconds under the topology model and
/// volume under the volume model.
///
/// Each distinct (source, target) pair is planned once, in parallel over the pairs so that one
/// source against many targets uses every core too. The optimal planner's shortest path runs
/// once per pattern (`optimal::Key`) of the unified pairs of canonical forms ([`normalized`]), in
/// parallel over the patterns; Algorithm 1, which it must beat, once per distinct pair of
/// layouts.
///
/// # Panics
/// Never: nothing sets the flag that would stop it ([`redistribution_costs_until`]).
///
/// # Errors
/// An error of some pair (layouts of different tensors, or not on the cluster),
/// [`Error::Topology`] if `dtype_bytes` is not positive, or [`Error::Memory`] if the costs
/// cannot be allocated.
pub fn redistribution_costs(
    sources: &[Layout],
    targets: &[Layout],
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    planner: Planner,
) -> Result<Vec<f64>> {
    let never = AtomicBool::new(false);
    let costs = redistribution_costs_until(
        sources,
        targets,
        cluster,
        dtype_bytes,
        model,
        planner,
        &never,
    )?;
    Ok(costs.expect("never stopped"))
}

/// Layout pairs per job of [`paper_costs`]: enough that a job's set-up is amortized, few enough
/// that one source against many targets is shared among every core.
const PAIRS_PER_JOB: usize = 64;

/// The rows of the row-major `rows x width` matrix `flat` (`rows` of them when `width` is 0).
fn rows_of(flat: &mut [f64], rows: usize, width: usize) -> Vec<&mut [f64]> {
    if width == 0 {
        return (0..rows).map(|_| Default::default()).collect();
    }
    flat.chunks_mut(width).collect()
}

/// A run of a row of [`paper_costs`]'s matrix: its row, its first column, and its entries.
struct Piece<'a> {
    row: usize,
    column: usize,
    costs: &'a mut [f64],
    volumes: Option<&'a mut [f64]>,
}

/// Per distinct pair of `src` x `tgt`, Algorithm 1's cost, written into `costs` (a row per
/// source, an entry per target); and, into `volumes` (the optimal planner comparing under the
/// volume model), its elements, not its bytes, whose rounding could break a tie otherwise than
/// the planner does (under the topology model its price is its cost). Every entry is written.
fn paper_costs(
    pairs: &Pairs<'_>,
    stop: &AtomicBool,
    costs: &mut [&mut [f64]],
    volumes: Option<&mut [&mut [f64]]>,
) -> Result<()> {
    let Pairs {
        src,
        tgt,
        cluster,
        dtype_bytes,
        model,
    } = *pairs;
    // What the pair kernel needs of each layout, worked out once per layout, not per pair.
    let prepared_src: Vec<paper::Prepared> =
        src.par_iter().map(|l| paper::Prepared::new(l)).collect();
    let prepared_tgt: Vec<paper::Prepared> =
        tgt.par_iter().map(|l| paper::Prepared::new(l)).collect();
    let width = tgt.len();
    // The target equal to each source, if any (the targets are distinct): found once, not
    // compared per pair.
    let columns: FxHashMap<&Layout, usize> = tgt.iter().enumerate().map(|(j, l)| (*l, j)).collect();
    let twin: Vec<Option<usize>> = src.iter().map(|l| columns.get(l).copied()).collect();
    // Runs of at most a job's pairs of each row (the rows may be a caller's, apart in memory),
    // and jobs of about that many pairs: a run of a wide row, or a few narrow rows.
    let mut volumes = volumes.map(|v| v.iter_mut().map(Some).collect::<Vec<_>>());
    let mut pieces = Vec::new();
    reserve(
        &mut pieces,
        costs.len() * width.div_ceil(PAIRS_PER_JOB),
        "the layout pairs' jobs",
    )?;
    for (row, costs) in costs.iter_mut().enumerate() {
        let mut volumes = volumes
            .as_mut()
            .and_then(|v| v[row].take())
            .map(|v| v.chunks_mut(PAIRS_PER_JOB));
        for (c, costs) in costs.chunks_mut(PAIRS_PER_JOB).enumerate() {
            pieces.push(Piece {
                row,
                column: c * PAIRS_PER_JOB,
                costs,
                volumes: volumes.as_mut().and_then(Iterator::next),
            });
        }
    }
    let per_job = (PAIRS_PER_JOB / width.max(1)).max(1);
    pieces
        .par_chunks_mut(per_job)
        .try_for_each_init(paper::Scratch::kept, |scratch, job| {
            for piece in job {
                let (i, j) = (piece.row, piece.column);
                let run = paper::Run {
                    source: &prepared_src[i],
                    targets: &prepared_tgt[j..j + piece.costs.len()],
                    twin: twin[i].and_then(|t| t.checked_sub(j)),
                    costs: &mut *piece.costs,
                    volumes: piece.volumes.as_deref_mut(),
                };
                paper::run_costs(run, stop, cluster, dtype_bytes, model, scratch.get())?;
            }
            Ok::<_, Error>(())
        })
}

/// [`redistribution_costs`] that another thread may stop by setting `stop` (the optimal
/// planner's searches look at it every few dozen layouts): `None` once it is set.
///
/// # Errors
/// As [`redistribution_costs`].
pub fn redistribution_costs_until(
    sources: &[Layout],
    targets: &[Layout],
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    planner: Planner,
    stop: &AtomicBool,
) -> Result<Option<Vec<f64>>> {
    let (rows, width) = (sources.len(), targets.len());
    let mut costs = try_filled(rows * width, 0.0, "the layout pairs' costs")?;
    let done = redistribution_costs_into(
        sources,
        targets,
        cluster,
        dtype_bytes,
        model,
        planner,
        stop,
        &mut rows_of(&mut costs, rows, width),
    )?;
    Ok(done.then_some(costs))
}

/// [`redistribution_costs_until`] written into `out`, a row per source with an entry per target
/// (a caller's matrix, whose rows may lie apart in memory, as a block of a wider one): whether it
/// ran to the end (not once `stop` is set; `out` is then partly written).
///
/// # Errors
/// [`Error::Shape`] if `out` is not `sources.len()` rows of `targets.len()` entries, else as
/// [`redistribution_costs`].
#[allow(clippy::too_many_arguments)]
pub fn redistribution_costs_into(
    sources: &[Layout],
    targets: &[Layout],
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    planner: Planner,
    stop: &AtomicBool,
    out: &mut [&mut [f64]],
) -> Result<bool> {
    if out.len() != sources.len() || out.iter().any(|row| row.len() != targets.len()) {
        let widths: Vec<usize> = out.iter().map(|row| row.len()).collect();
        return Err(Error::Shape(format!(
            "the costs of {} sources and {} targets need {} rows of {} entries, got rows of {:?}",
            sources.len(),
            targets.len(),
            sources.len(),
            targets.len(),
            &widths[..widths.len().min(4)]
        )));
    }
    let (src, src_index) = dedupe(sources);
    let (tgt, tgt_index) = dedupe(targets);
    check_batch((&src, &tgt), cluster, dtype_bytes)?;
    let priced = |distinct: &mut [&mut [f64]]| {
        let pairs = Pairs {
            src: &src,
            tgt: &tgt,
            cluster,
            dtype_bytes,
            model,
        };
        distinct_costs(&pairs, planner, stop, distinct)
    };
    // Sets without repeats (as the search passes them) are their own matrix: priced in place.
    let identity = |index: &[usize]| index.iter().enumerate().all(|(i, &j)| i == j);
    if identity(&src_index) && identity(&tgt_index) {
        return priced(out);
    }
    let width = tgt.len();
    let mut distinct = try_filled(src.len() * width, 0.0, "the layout pairs' costs")?;
    if !priced(&mut rows_of(&mut distinct, src.len(), width))? {
        return Ok(false);
    }
    for (row, &i) in out.iter_mut().zip(&src_index) {
        for (cost, &j) in row.iter_mut().zip(&tgt_index) {
            *cost = distinct[i * width + j];
        }
    }
    Ok(true)
}

/// Checks that the distinct layouts `src` and `tgt` of a batch are of one tensor on `cluster`,
/// and its bytes per element.
fn check_batch((src, tgt): (&[&Layout], &[&Layout]), cluster: &Cluster, bytes: f64) -> Result<()> {
    check_dtype_bytes(bytes)?;
    for layout in src.iter().chain(tgt) {
        cluster.check(layout)?;
    }
    check_one_tensor(src, tgt)
}

/// The distinct layouts of a batch, and what they are priced on.
struct Pairs<'a> {
    src: &'a [&'a Layout],
    tgt: &'a [&'a Layout],
    cluster: &'a Cluster,
    dtype_bytes: f64,
    model: CostModel,
}

/// The costs of the distinct pairs under `planner`, written into `distinct` (a row per distinct
/// source), as [`redistribution_costs`] plans them: whether it ran to the end (not once `stop`
/// is set).
fn distinct_costs(
    pairs: &Pairs<'_>,
    planner: Planner,
    stop: &AtomicBool,
    distinct: &mut [&mut [f64]],
) -> Result<bool> {
    let (rows, width) = (pairs.src.len(), pairs.tgt.len());
    let volume_prices = planner == Planner::Optimal && pairs.model == CostModel::Volume;
    let mut elements = if volume_prices {
        try_filled(rows * width, 0.0, "the layout pairs' costs")?
    } else {
        Vec::new()
    };
    let mut element_rows = rows_of(&mut elements, if volume_prices { rows } else { 0 }, width);
    let volumes = volume_prices.then_some(&mut element_rows[..]);
    paper_costs(pairs, stop, distinct, volumes)?;
    if planner == Planner::Optimal && !stop.load(Relaxed) {
        optimal_choices(
            pairs,
            stop,
            distinct,
            volume_prices.then_some(&element_rows[..]),
        )?;
    }
    Ok(!stop.load(Relaxed))
}

/// The optimal planner's costs over Algorithm 1's (`distinct`, and with `volumes` the elements
/// its plans receive, which it compares under the volume model): each pair takes the shortest
/// path's plan unless Algorithm 1's is strictly cheaper.
fn optimal_choices(
    pairs: &Pairs<'_>,
    stop: &AtomicBool,
    distinct: &mut [&mut [f64]],
    volumes: Option<&[&mut [f64]]>,
) -> Result<()> {
    let Pairs {
        src,
        tgt,
        cluster,
        dtype_bytes,
        model,
    } = *pairs;
    let canon_src: Vec<Layout> = src.par_iter().map(|l| normalized(l)).collect();
    let canon_tgt: Vec<Layout> = tgt.par_iter().map(|l| normalized(l)).collect();
    let (csrc, csrc_index) = dedupe(&canon_src);
    let (ctgt, ctgt_index) = dedupe(&canon_tgt);
    let cwidth = ctgt.len();
    let objective = objective(cluster, dtype_bytes, model);
    let pair = |k: usize| (csrc[k / cwidth], ctgt[k % cwidth]);
    // The search of each canonical pair, and one search per key: the first pair's of it. (Each
    // pair's problem is made again where it is needed: cheaper than holding them all.)
    let keys: Vec<Option<Key>> = (0..csrc.len() * cwidth)
        .into_par_iter()
        .map(|k| {
            let (a, b) = pair(k);
            Ok(if a == b || stop.load(Relaxed) {
                None
            } else {
                search_problem(a, b)?.map(|p| p.key().clone())
            })
        })
        .collect::<Result<_>>()?;
    let mut first: FxHashMap<&Key, usize> = FxHashMap::default();
    for (k, key) in keys.iter().enumerate() {
        if let Some(key) = key {
            first.entry(key).or_insert(k);
        }
    }
    let searched: Vec<(&Key, usize)> = first.into_iter().collect();
    let paths: FxHashMap<&Key, Path> = searched
        .into_par_iter()
        .filter_map(|(key, k)| {
            if stop.load(Relaxed) {
                return None;
            }
            let (a, b) = pair(k);
            let problem = search_problem(a, b).transpose()?;
            Some(problem.and_then(|p| Ok((key, solve(&p, objective, stop)?))))
        })
        .collect::<Result<_>>()?;
    if stop.load(Relaxed) {
        return Ok(());
    }
    // Per canonical pair, the plan's price under the objective and its cost.
    let mut canonical = try_filled(csrc.len() * cwidth, (0.0, 0.0), "the pairs' plans")?;
    canonical
        .par_iter_mut()
        .enumerate()
        .try_for_each(|(k, entry)| {
            let (a, b) = pair(k);
            if a != b {
                let plan = shortest_plan_by(a, b, objective, |problem| {
                    paths.get(problem.key()).map_or_else(
                        || Ok(Cow::Owned(solve(problem, objective, stop)?)),
                        |path| Ok(Cow::Borrowed(path)),
                    )
                })?;
                *entry = (
                    objective.total(&plan),
                    plan.cost(cluster, dtype_bytes, model)?,
                );
            }
            Ok::<_, Error>(())
        })?;
    // The plan's choice: the shortest path unless Algorithm 1 is strictly cheaper.
    for (i, row) in distinct.iter_mut().enumerate() {
        for (j, cost) in row.iter_mut().enumerate() {
            let (price, c) = canonical[csrc_index[i] * cwidth + ctgt_index[j]];
            let paper_price = volumes.map_or(*cost, |v| v[i][j]);
            if price <= paper_price {
                *cost = c;
            }
        }
    }
    Ok(())
}

/// Per pair `(sources[k], targets[k])` of `dtype_bytes[k]` bytes per element, the cost
/// [`redistribution_costs_until`] gives it: the pairs of many tensors in one call, in parallel
/// over the pairs (the optimal search's rounds price the few pairs their assignment picks on
/// every edge at once, not one call per edge); `None` once `stop` is set.
///
/// # Errors
/// [`Error::Shape`] if the three lists differ in length, else the first pair's error in order
/// (as [`redistribution_costs`]).
pub fn pair_costs_until(
    sources: &[Layout],
    targets: &[Layout],
    dtype_bytes: &[f64],
    cluster: &Cluster,
    model: CostModel,
    planner: Planner,
    stop: &AtomicBool,
) -> Result<Option<Vec<f64>>> {
    if sources.len() != targets.len() || sources.len() != dtype_bytes.len() {
        return Err(Error::Shape(format!(
            "{} sources, {} targets and {} dtype_bytes: one of each per pair",
            sources.len(),
            targets.len(),
            dtype_bytes.len()
        )));
    }
    if planner == Planner::Paper {
        return paper_pair_costs(sources, targets, dtype_bytes, cluster, model, stop);
    }
    let costs: Vec<Result<Option<f64>>> = (0..sources.len())
        .into_par_iter()
        .map(|k| {
            let (source, target) = (
                std::slice::from_ref(&sources[k]),
                std::slice::from_ref(&targets[k]),
            );
            let cost = redistribution_costs_until(
                source,
                target,
                cluster,
                dtype_bytes[k],
                model,
                planner,
                stop,
            )?;
            Ok(cost.map(|c| c[0]))
        })
        .collect();
    // Collected in order first: the error reported is the first pair's, whichever thread met it.
    costs.into_iter().collect()
}

/// The pairs `k` that `keep`, by element size `dtype_bytes[k]` (bit for bit), in order: sizes
/// as first met, the pairs of each in order.
fn by_size(dtype_bytes: &[f64], keep: impl Fn(usize) -> bool) -> Vec<(f64, Vec<usize>)> {
    let mut sizes: Vec<(f64, Vec<usize>)> = Vec::new();
    for (k, &bytes) in dtype_bytes.iter().enumerate().filter(|&(k, _)| keep(k)) {
        match sizes
            .iter_mut()
            .find(|(b, _)| b.to_bits() == bytes.to_bits())
        {
            Some((_, pairs)) => pairs.push(k),
            None => sizes.push((bytes, vec![k])),
        }
    }
    sizes
}

/// [`pair_costs_until`] under Algorithm 1 (checked as it checks them, pair by pair): what the
/// pair kernel needs of each layout worked out once per distinct layout, then one pair a run
/// ([`paper::run_costs`]), not a 1 x 1 table per pair (3.3x to 4.6x the CPU on 64 devices: the
/// full bounds of the optimal search's rounds price tens of thousands of pairs).
fn paper_pair_costs(
    sources: &[Layout],
    targets: &[Layout],
    dtype_bytes: &[f64],
    cluster: &Cluster,
    model: CostModel,
    stop: &AtomicBool,
) -> Result<Option<Vec<f64>>> {
    for ((a, b), &bytes) in sources.iter().zip(targets).zip(dtype_bytes) {
        check_dtype_bytes(bytes)?;
        cluster.check(a)?;
        cluster.check(b)?;
        check_same_tensor(a, b)?;
    }
    let (src, src_index) = dedupe(sources);
    let (tgt, tgt_index) = dedupe(targets);
    let prepared = prepared_pair(&src, &tgt);
    let mut costs = try_filled(sources.len(), 0.0, "the layout pairs' costs")?;
    // A scratch's prices are of one element size: the pairs of each size apart.
    for (bytes, pairs) in by_size(dtype_bytes, |_| true) {
        let at: Vec<(usize, usize)> = pairs
            .iter()
            .map(|&k| (src_index[k], tgt_index[k]))
            .collect();
        let found = paper_costs_at(&prepared, &at, (cluster, bytes, model), stop)?;
        for (k, cost) in pairs.into_iter().zip(found) {
            costs[k] = cost;
        }
    }
    Ok((!stop.load(Relaxed)).then_some(costs))
}

/// What the pair kernel needs of each of the layouts `src` and `tgt`, worked out once per
/// layout.
fn prepared_pair<'l>(
    src: &[&'l Layout],
    tgt: &[&'l Layout],
) -> (Vec<paper::Prepared<'l>>, Vec<paper::Prepared<'l>>) {
    let prepare = |layouts: &[&'l Layout]| {
        layouts
            .par_iter()
            .map(|l| paper::Prepared::new(l))
            .collect()
    };
    (prepare(src), prepare(tgt))
}

/// Algorithm 1's cost of each pair `(i, j)` of `at` (source `i`, target `j` of `prepared`) of
/// `bytes` bytes per element, one pair a run ([`paper::run_costs`]).
fn paper_costs_at(
    (src, tgt): &(Vec<paper::Prepared<'_>>, Vec<paper::Prepared<'_>>),
    at: &[(usize, usize)],
    (cluster, bytes, model): (&Cluster, f64, CostModel),
    stop: &AtomicBool,
) -> Result<Vec<f64>> {
    at.par_iter()
        .with_min_len(PAIRS_PER_JOB)
        .map_init(paper::Scratch::kept, |scratch, &(i, j)| {
            let mut cost = 0.0;
            let run = paper::Run {
                source: &src[i],
                targets: std::slice::from_ref(&tgt[j]),
                twin: (src[i].layout() == tgt[j].layout()).then_some(0),
                costs: std::slice::from_mut(&mut cost),
                volumes: None,
            };
            paper::run_costs(run, stop, cluster, bytes, model, scratch.get()).map(|()| cost)
        })
        .collect()
}

/// Per pair of `sources` x `targets` (row-major), a lower bound on its cost under the optimal
/// planner without its search: Algorithm 1's cost, or the search's bound at the source if less;
/// and whether the bound is that cost: where Algorithm 1 moves nothing, and where the search's
/// bound exceeds Algorithm 1's cost (nothing is as cheap, so the optimal planner keeps
/// Algorithm 1's plan). [`redistribution_table_bounds`] without its cheap bounds and Algorithm
/// 1's costs.
///
/// # Errors
/// As [`redistribution_costs`], and [`Error::Topology`] under the volume model (its objective
/// counts elements, its cost bytes).
pub fn redistribution_bounds(
    sources: &[Layout],
    targets: &[Layout],
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> Result<(Vec<f64>, Vec<bool>)> {
    let table = redistribution_table_bounds(sources, targets, cluster, dtype_bytes, model, false)?;
    Ok((table.bounds, table.exact))
}

/// The bounds of [`redistribution_table_bounds`], row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct TableBounds {
    /// Per pair, a lower bound on the optimal planner's cost.
    pub bounds: Vec<f64>,
    /// Per pair, whether the bound is that cost.
    pub exact: Vec<bool>,
    /// Per pair, Algorithm 1's cost; with cheap bounds, NaN where it was not worked out.
    pub paper: Vec<f64>,
}

/// [`redistribution_bounds`], and Algorithm 1's cost of each pair (which it works out first);
/// with `cheap`, a weaker bound at the source, at a tenth of the cost: the search's bound
/// without the terms that need each pair's own bounds per device dim, worked out from the
/// lined-up pair with no memo (`optimal::cheap_bound`). Each is at most the bound without
/// `cheap` (so at most the optimal planner's cost), and exact (Algorithm 1's cost) where it
/// exceeds it. The cheap bounds need Algorithm 1's cost only where the search's bound may
/// exceed it (the canonical forms line up otherwise than the layouts as given): where a bound
/// on every plan is near the search's, that one is the pair's bound, exact where nothing
/// moves, and Algorithm 1's cost is left out (NaN); it is worked out for the rest alone (3% of
/// a GPT-3 layer's pairs: Algorithm 1 of every pair was a third of the tables' work).
///
/// # Errors
/// As [`redistribution_bounds`].
pub fn redistribution_table_bounds(
    sources: &[Layout],
    targets: &[Layout],
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
    cheap: bool,
) -> Result<TableBounds> {
    check_bounded(model)?;
    // The cheap bounds need Algorithm 1's costs only where they may exceed them: worked out
    // after the bounds, for those pairs alone.
    let paper = if cheap {
        check_batch(
            (&dedupe(sources).0, &dedupe(targets).0),
            cluster,
            dtype_bytes,
        )?;
        None
    } else {
        let paper = redistribution_costs(
            sources,
            targets,
            cluster,
            dtype_bytes,
            model,
            Planner::Paper,
        )?;
        Some(paper)
    };
    // The bound depends on the canonical forms alone: each layout is normalised once (not once
    // per pair) and each distinct pair of forms bounded once.
    let canon = |layouts: &[Layout]| {
        let forms: Vec<Layout> = layouts.par_iter().map(normalized).collect();
        dedupe_cloned(forms.iter())
    };
    let (csrc, csrc_index) = canon(sources);
    let (ctgt, ctgt_index) = canon(targets);
    let (width, cwidth) = (targets.len(), ctgt.len());
    let canonical = |k: usize| csrc_index[k / width] * cwidth + ctgt_index[k % width];
    // Only the canonical pairs of some pair Algorithm 1 does not move for free are bounded
    // (every one where its costs are not known yet).
    let mut needed = vec![paper.is_none(); csrc.len() * cwidth];
    for (k, &cost) in paper.iter().flatten().enumerate() {
        if cost != 0.0 {
            needed[canonical(k)] = true;
        }
    }
    let wanted: Vec<(usize, usize)> = (needed.iter().enumerate())
        .filter(|(_, &n)| n)
        .map(|(c, _)| (c / cwidth, c % cwidth))
        .collect();
    let objective = objective(cluster, dtype_bytes, model);
    let found = canonical_bounds(objective, (&csrc, &ctgt), &wanted, cheap)?;
    let mut bounds = vec![(0.0, false); needed.len()];
    for (&(i, j), bound) in wanted.iter().zip(found) {
        bounds[i * cwidth + j] = bound;
    }
    let paper = if let Some(paper) = paper {
        paper
    } else {
        let pairs = sources.len() * width;
        let at: Vec<usize> = (0..pairs).filter(|&k| !bounds[canonical(k)].1).collect();
        paper_costs_of(sources, targets, &at, (cluster, dtype_bytes, model))?
    };
    let (bounds, exact) = paper
        .iter()
        .enumerate()
        .map(|(k, &cost)| {
            let bound = bounds[canonical(k)].0;
            // Not worked out: the bound is at most Algorithm 1's cost, exact where nothing
            // moves (only slices reach the target: any other step, so the last op, moves
            // something).
            if cost.is_nan() {
                (bound, bound == 0.0)
            } else {
                bounded(bound, cost)
            }
        })
        .unzip();
    Ok(TableBounds {
        bounds,
        exact,
        paper,
    })
}

/// Per pair of `sources` x `targets` (row-major), Algorithm 1's cost where it is one of `at`
/// (each pair's index), NaN elsewhere.
///
/// # Errors
/// As [`redistribution_costs`].
fn paper_costs_of(
    sources: &[Layout],
    targets: &[Layout],
    at: &[usize],
    (cluster, bytes, model): (&Cluster, f64, CostModel),
) -> Result<Vec<f64>> {
    let width = targets.len();
    let mut paper = try_filled(sources.len() * width, f64::NAN, "the layout pairs' costs")?;
    // Only the layouts of those pairs prepared, each once.
    let (mut rows, mut columns) = (vec![usize::MAX; sources.len()], vec![usize::MAX; width]);
    let (mut src, mut tgt) = (Vec::new(), Vec::new());
    let mut pairs = Vec::with_capacity(at.len());
    for &k in at {
        let (i, j) = (k / width, k % width);
        for (slot, out, layout) in [
            (&mut rows[i], &mut src, &sources[i]),
            (&mut columns[j], &mut tgt, &targets[j]),
        ] {
            if *slot == usize::MAX {
                *slot = out.len();
                out.push(layout);
            }
        }
        pairs.push((rows[i], columns[j]));
    }
    let never = AtomicBool::new(false);
    let costs = paper_costs_at(
        &prepared_pair(&src, &tgt),
        &pairs,
        (cluster, bytes, model),
        &never,
    )?;
    for (&k, cost) in at.iter().zip(costs) {
        paper[k] = cost;
    }
    Ok(paper)
}

/// Lower bounds are priced under the topology model only (the volume's objective counts
/// elements, its cost bytes).
fn check_bounded(model: CostModel) -> Result<()> {
    if model == CostModel::Volume {
        let message = "lower bounds are priced under the topology model only";
        return Err(Error::Topology(message.to_string()));
    }
    Ok(())
}

/// The bound of a pair whose canonical pair is bounded by `bound` and whose Algorithm 1 costs
/// `cost`, and whether it is the optimal planner's cost.
fn bounded(bound: f64, cost: f64) -> (f64, bool) {
    if cost == 0.0 {
        return (0.0, true);
    }
    // Over it, not at it: a pair the search does not take is bounded by Algorithm 1's price
    // on the canonical pair, whose plan the optimal planner takes at a tie.
    (bound.min(cost), bound > cost)
}

/// Per pair `(i, j)` of `wanted`, a lower bound on the price of the plan of canonical forms
/// `csrc[i]` -> `ctgt[j]` ([`shortest_plan_bound`]), in parallel over the pairs: with `cheap`,
/// [`optimal::cheap_bound`]'s; else the search's bound at the source, by key ([`optimal::Bounds`])
/// and by pair of forms ([`optimal::Pairs`]) remembered across calls (the cheap bounds are not:
/// a memo would cost them more than it saves). With each, whether it is also at most Algorithm
/// 1's cost of any layouts of the two forms' distributions (some cheap bounds).
fn canonical_bounds(
    objective: Objective<'_>,
    (csrc, ctgt): (&[Layout], &[Layout]),
    wanted: &[(usize, usize)],
    cheap: bool,
) -> Result<Vec<(f64, bool)>> {
    // What lining up needs of each canonical form, worked out once per form (not once per
    // pair).
    let psrc: Vec<paper::Prepared> = csrc.par_iter().map(paper::Prepared::new).collect();
    let ptgt: Vec<paper::Prepared> = ctgt.par_iter().map(paper::Prepared::new).collect();
    if cheap {
        // Each thread's matrices and chains kept across jobs and calls (under one objective).
        let fingerprint = objective.fingerprint();
        return wanted
            .par_iter()
            .map_init(
                || {
                    let scratch = optimal::CheapScratch::kept(&fingerprint);
                    (paper::LineUp::default(), scratch)
                },
                |(line_up, scratch), &(i, j)| {
                    cheap_pair_bound((&psrc[i], &ptgt[j]), objective, line_up, &mut scratch.0)
                },
            )
            .collect();
    }
    // A pair of forms bounded before (by an earlier call) is read back; the search's bound
    // depends on the problem's key alone: worked out once per key, across calls.
    let pairs = optimal::Pairs::of(objective, csrc, ctgt, wanted.len());
    let memo = optimal::Bounds::of(objective, wanted.len());
    let bounds: Vec<(f64, bool)> = wanted
        .par_iter()
        .map_init(
            || (paper::LineUp::default(), optimal::BoundScratch::default()),
            |(line_up, scratch), &(i, j)| {
                if let Some(bound) = pairs.get(i, j) {
                    return Ok((bound, false));
                }
                let (bound, _) =
                    shortest_plan_bound((&psrc[i], &ptgt[j]), objective, line_up, |line_up| {
                        let (source, target) = line_up.pair();
                        memo.bound(source, target, scratch)
                    })?;
                Ok((bound, true))
            },
        )
        .collect::<Result<_>>()?;
    memo.keep();
    let found = wanted.iter().zip(&bounds).filter(|(_, &(_, new))| new);
    pairs.keep(found.map(|(&(i, j), &(bound, _))| (i, j, bound)));
    Ok(bounds
        .into_iter()
        .map(|(bound, _)| (bound, false))
        .collect())
}

/// The cheap bound of the plan of canonical forms `a` -> `b` ([`shortest_plan_bound`] with
/// [`optimal::cheap_bound`]), lined up in `line_up`, and whether it is also at most Algorithm
/// 1's cost of any layouts of the two forms' distributions.
///
/// # Errors
/// As [`shortest_plan_bound`].
fn cheap_pair_bound<'p>(
    (a, b): (&'p paper::Prepared<'_>, &'p paper::Prepared<'_>),
    objective: Objective<'_>,
    line_up: &mut paper::LineUp<'p>,
    scratch: &mut optimal::CheapScratch,
) -> Result<(f64, bool)> {
    let mut any = false;
    let (bound, inside) = shortest_plan_bound((a, b), objective, line_up, |line_up| {
        let (bound, below) = optimal::cheap_bound(line_up, objective, scratch)?;
        any = below;
        Some(bound)
    })?;
    // (Ops outside the search, forced by lining up the canonical forms, may be avoided by
    // layouts that line up as they are.)
    Ok((bound, any && inside))
}

/// The pairs [`pair_bounds_until`] bounds between two looks at `stop`: about 10 ms of one
/// thread's full bounds (a few microseconds a pair), the interval at which a watched call looks
/// for Ctrl-C and at the clock. (The tests bound pairs in parts of a few.)
#[cfg(not(test))]
const BOUNDS_PER_LOOK: usize = 4096;
#[cfg(test)]
const BOUNDS_PER_LOOK: usize = 64;

/// Per pair `(sources[k], targets[k])` of `dtype_bytes[k]` bytes per element, the bound and
/// whether it is exact that [`redistribution_bounds`] gives it: the pairs of many tensors in
/// one call, in parallel over the pairs of each element size, on the memos of the tables (the
/// search's rounds bound again, in full, the pairs whose cheap bounds could matter); `None` once
/// `stop` is set.
///
/// # Errors
/// As [`pair_costs_until`] and [`redistribution_bounds`].
pub fn pair_bounds_until(
    sources: &[Layout],
    targets: &[Layout],
    dtype_bytes: &[f64],
    cluster: &Cluster,
    model: CostModel,
    stop: &AtomicBool,
) -> Result<Option<(Vec<f64>, Vec<bool>)>> {
    check_bounded(model)?;
    let paper = pair_costs_until(
        sources,
        targets,
        dtype_bytes,
        cluster,
        model,
        Planner::Paper,
        stop,
    )?;
    let Some(paper) = paper else {
        return Ok(None);
    };
    let forms: Vec<(Layout, Layout)> = (sources.par_iter().zip(targets))
        .map(|(a, b)| (normalized(a), normalized(b)))
        .collect();
    let mut bounds = vec![0.0; paper.len()];
    // The pairs that move something, by element size (an objective each).
    for (bytes, pairs) in by_size(dtype_bytes, |k| paper[k] != 0.0) {
        let objective = objective(cluster, bytes, model);
        // A bound depends on its pair alone: bounded a part at a time, `stop` looked at between.
        for part in pairs.chunks(BOUNDS_PER_LOOK) {
            if stop.load(Relaxed) {
                return Ok(None);
            }
            let (csrc, src_index) = dedupe_cloned(part.iter().map(|&k| &forms[k].0));
            let (ctgt, tgt_index) = dedupe_cloned(part.iter().map(|&k| &forms[k].1));
            let wanted: Vec<(usize, usize)> = src_index.into_iter().zip(tgt_index).collect();
            let found = canonical_bounds(objective, (&csrc, &ctgt), &wanted, false)?;
            for (&k, (bound, _)) in part.iter().zip(found) {
                bounds[k] = bound;
            }
        }
    }
    Ok(Some(
        bounds
            .iter()
            .zip(&paper)
            .map(|(&b, &c)| bounded(b, c))
            .unzip(),
    ))
}

/// Per pair `(sources[k], targets[k])` of `dtype_bytes[k]` bytes per element, its cost under
/// the optimal planner (as [`pair_costs_until`] gives it) and true; or, where the search of the
/// pair expands `expansions[k]` layouts (`None`: no limit) without reaching the target, a lower
/// bound on that cost and false: the least estimate the search left (at least the bound at the
/// source [`pair_bounds_until`] gives, and no more than Algorithm 1's cost). The optimal
/// search's rounds search a pair that far the first time they price it: of AlexNet 64's 173
/// pairs priced, 160 were dropped once priced, and a bound nearer their cost drops most of them
/// too. `None` once `stop` is set.
///
/// # Errors
/// As [`pair_bounds_until`], and [`Error::Shape`] if `expansions` is not one per pair.
pub fn pair_estimates_until(
    sources: &[Layout],
    targets: &[Layout],
    dtype_bytes: &[f64],
    expansions: &[Option<usize>],
    cluster: &Cluster,
    model: CostModel,
    stop: &AtomicBool,
) -> Result<Option<(Vec<f64>, Vec<bool>)>> {
    check_bounded(model)?;
    if expansions.len() != sources.len() {
        return Err(Error::Shape(format!(
            "{} pairs and {} expansions: one per pair",
            sources.len(),
            expansions.len()
        )));
    }
    let Some(paper) = pair_costs_until(
        sources,
        targets,
        dtype_bytes,
        cluster,
        model,
        Planner::Paper,
        stop,
    )?
    else {
        return Ok(None);
    };
    // The searches as far as each pair may go: a bound where one stops short (Algorithm 1's
    // cost where that is no more), the rest priced in full below (their paths remembered).
    let short: Vec<Option<f64>> = (0..sources.len())
        .into_par_iter()
        .map(|k| {
            let Some(most) = expansions[k] else {
                return Ok(None);
            };
            let (a, b) = (normalized(&sources[k]), normalized(&targets[k]));
            if paper[k] == 0.0 || a == b {
                return Ok(None);
            }
            let objective = objective(cluster, dtype_bytes[k], model);
            plan_bound_within(&a, &b, objective, stop, most)
        })
        .collect::<Result<_>>()?;
    let full: Vec<usize> = (0..sources.len()).filter(|&k| short[k].is_none()).collect();
    let pick = |list: &[Layout]| full.iter().map(|&k| list[k].clone()).collect::<Vec<_>>();
    let bytes: Vec<f64> = full.iter().map(|&k| dtype_bytes[k]).collect();
    let Some(costs) = pair_costs_until(
        &pick(sources),
        &pick(targets),
        &bytes,
        cluster,
        model,
        Planner::Optimal,
        stop,
    )?
    else {
        return Ok(None);
    };
    let mut found: Vec<(f64, bool)> = short
        .iter()
        .zip(&paper)
        .map(|(bound, &cost)| bound.map_or((0.0, true), |b| (b.min(cost), b >= cost)))
        .collect();
    for (&k, cost) in full.iter().zip(costs) {
        found[k] = (cost, true);
    }
    Ok((!stop.load(Relaxed)).then(|| found.into_iter().unzip()))
}

/// The distinct layouts of `layouts`, copied, and the index of each among them ([`dedupe`]).
fn dedupe_cloned<'l>(layouts: impl Iterator<Item = &'l Layout>) -> (Vec<Layout>, Vec<usize>) {
    let all: Vec<&Layout> = layouts.collect();
    let (distinct, index) = dedupe(&all);
    (distinct.into_iter().map(|l| (*l).clone()).collect(), index)
}

/// Strategies per job of [`allreduce_costs`]: fewer are priced in less time than waking another
/// thread takes, so an operator with fewer than twice as many runs on the calling thread alone.
const MIN_STRATEGIES_PER_JOB: usize = 128;

/// A tensor of an operator, as [`allreduce_costs`] sees it: the strategy axis of each dim (-1 for
/// a dim of no partitionable axis), the shape, and the bytes per element.
#[derive(Debug, Clone, PartialEq)]
pub struct AxesTensor {
    pub axes: Vec<i64>,
    pub shape: Vec<u64>,
    pub dtype_bytes: f64,
}

/// Per strategy of one operator, the summed cost of an all_reduce of each tensor over the device
/// dims its layout leaves unused (docs/conventions.md#intra-operator-communication, priced as in
/// #topology-aware-cost): 0 for a tensor split along every device dim. Each replica of a
/// replicated strategy reduces on its own: the tensor is priced in the strategy's per-replica
/// layout ([`Strategy::tensor_layout`]), whose group leaves out the replica dims.
/// Summed in the order of `tensors`, as a per-strategy loop over the collectives would.
///
/// # Errors
/// [`Error::Topology`] if a strategy is not on the cluster's devices or a tensor's `dtype_bytes`
/// is not positive, [`Error::Layout`] if a tensor does not fit a strategy (an axis out of range,
/// a split that does not divide), [`Error::Memory`] if the costs cannot be allocated.
pub fn allreduce_costs(
    strategies: &[Strategy],
    tensors: &[AxesTensor],
    cluster: &Cluster,
    model: CostModel,
) -> Result<Vec<f64>> {
    for t in tensors {
        check_dtype_bytes(t.dtype_bytes)?;
    }
    let mut costs = try_filled(
        strategies.len(),
        0.0,
        "the all-reduce costs of the strategies",
    )?;
    // Into a preallocated vector: collecting results would gather them in per-job lists. Each job
    // builds its layouts in one scratch layout, set to a strategy's device matrix once.
    costs
        .par_iter_mut()
        .zip(strategies)
        .with_min_len(MIN_STRATEGIES_PER_JOB)
        .try_for_each_init(Layout::scratch, |layout, (cost, s)| {
            let devices = s.num_devices();
            if devices != cluster.num_devices() {
                return Err(Error::Topology(format!(
                    "strategy {s:?} spans {devices} devices but the cluster has {}",
                    cluster.num_devices()
                )));
            }
            s.device_layout_into(layout)?;
            *cost = tensors.iter().try_fold(0.0, |total, t| {
                s.tensor_layout_into(&t.axes, &t.shape, true, layout)?;
                Ok::<_, Error>(total + cluster.allreduce_cost(layout, t.dtype_bytes, model))
            })?;
            Ok(())
        })?;
    Ok(costs)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::layout::layout;
    use crate::plan::{plan_redistribution, Redistribution};
    use crate::strategies::enumerate_strategies;
    use crate::topology::{CollectiveKind, Replicas};

    /// Every layout of a few shapes of 96 elements on every device matrix of 8 devices: pairs
    /// that reshape, and pairs that only a fallback plan can redistribute.
    pub(crate) fn layouts_of_96() -> Vec<Layout> {
        let shapes: [&[u64]; 5] = [&[96], &[6, 16], &[16, 6], &[2, 3, 16], &[4, 4, 6]];
        let matrices: [&[u64]; 4] = [&[8], &[2, 4], &[4, 2], &[2, 2, 2]];
        every_layout(&shapes, &matrices)
    }

    /// Every layout of a few shapes of 64 elements on every device matrix of 8 devices: a
    /// power-of-two count of elements, which the kernel unifies by masks, with reshapes whose
    /// dim boundaries fall inside each other's splits (cutting device dims) and outside them.
    pub(crate) fn layouts_of_64() -> Vec<Layout> {
        let shapes: [&[u64]; 5] = [&[64], &[8, 8], &[4, 16], &[2, 4, 8], &[16, 2, 2]];
        let matrices: [&[u64]; 4] = [&[8], &[2, 4], &[4, 2], &[2, 2, 2]];
        every_layout(&shapes, &matrices)
    }

    /// Every layout of each shape on each device matrix.
    pub(crate) fn every_layout(shapes: &[&[u64]], matrices: &[&[u64]]) -> Vec<Layout> {
        let mut out = Vec::new();
        for &shape in shapes {
            for &matrix in matrices {
                // Every map: one digit per tensor dim in base h + 1, the digit minus 1 its entry.
                let base = matrix.len() as i64 + 1;
                for code in 0..base.pow(shape.len() as u32) {
                    let map = (0..shape.len() as u32)
                        .map(|i| code / base.pow(i) % base - 1)
                        .collect();
                    if let Ok(l) = Layout::new(shape.to_vec(), matrix.to_vec(), map) {
                        out.push(l);
                    }
                }
            }
        }
        out
    }

    /// Every `step`-th of `layouts` held as partial sums along each set of its device dims that
    /// split no tensor dim.
    pub(crate) fn partial_sums_of(layouts: &[Layout], step: usize) -> Vec<Layout> {
        let with = |l: &Layout, dims: Vec<usize>| {
            let (shape, matrix, map) = (l.shape(), l.device_matrix(), l.tensor_map());
            Layout::with_partial(shape.to_vec(), matrix.to_vec(), map.to_vec(), dims).ok()
        };
        layouts
            .iter()
            .step_by(step)
            .flat_map(|l| {
                let h = l.num_device_dims();
                (1..1usize << h)
                    .filter_map(move |set| with(l, (0..h).filter(|&k| set >> k & 1 == 1).collect()))
            })
            .collect()
    }

    /// The kernel prices a pair without building its plan; it must give the plan's cost exactly:
    /// on layouts that it unifies by cuts (some only with a fallback plan), and on layouts of 64
    /// elements, which it unifies by masks.
    #[test]
    fn costs_are_the_plans_bit_for_bit() {
        let cluster = Cluster::new(2, 4, 60e9, 6e9, None).unwrap();
        let mut fallbacks = 0;
        for (layouts, model) in [
            (layouts_of_96(), CostModel::Topology),
            (layouts_of_96(), CostModel::Volume),
            (layouts_of_64(), CostModel::Topology),
            (layouts_of_64(), CostModel::Volume),
        ] {
            let n = layouts.len();
            let got =
                redistribution_costs(&layouts, &layouts, &cluster, 2.0, model, Planner::Paper)
                    .unwrap();
            for (i, a) in layouts.iter().enumerate() {
                for (j, b) in layouts.iter().enumerate() {
                    let plan =
                        plan_redistribution(a, b, Planner::Paper, Objective::Volume).unwrap();
                    fallbacks += usize::from(!plan.prelude.is_empty() || !plan.epilogue.is_empty());
                    let want = plan.cost(&cluster, 2.0, model).unwrap();
                    assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{a:?} to {b:?}");
                }
            }
        }
        assert!(fallbacks > 0);
    }

    /// Each thread keeps its scratch, step prices and all, from one call to the next
    /// ([`paper::Scratch::kept`]): calls that alternate clusters, element sizes and cost models
    /// on one tensor's layouts (the step prices' keys are the same) each give the plans' costs
    /// bit for bit, as a scratch that kept the last call's prices would not.
    #[test]
    fn kept_scratch_prices_each_call_on_its_own_cluster() {
        let layouts: Vec<Layout> = layouts_of_64().into_iter().step_by(4).collect();
        let n = layouts.len();
        let two = Cluster::hierarchy(&[(4, 60e9, 1e-6), (2, 6e9, 5e-6)], None, Replicas::Flat);
        let three = Cluster::hierarchy(&[(2, 40e9, 2e-6), (4, 4e9, 9e-6)], None, Replicas::Shared);
        let clusters = [two.unwrap(), three.unwrap()];
        for _ in 0..2 {
            for (cluster, bytes, model) in [
                (&clusters[0], 2.0, CostModel::Topology),
                (&clusters[1], 2.0, CostModel::Topology),
                (&clusters[1], 4.0, CostModel::Topology),
                (&clusters[0], 4.0, CostModel::Volume),
            ] {
                let got =
                    redistribution_costs(&layouts, &layouts, cluster, bytes, model, Planner::Paper)
                        .unwrap();
                for (i, a) in layouts.iter().enumerate() {
                    for (j, b) in layouts.iter().enumerate() {
                        let plan =
                            plan_redistribution(a, b, Planner::Paper, Objective::Volume).unwrap();
                        let want = plan.cost(cluster, bytes, model).unwrap();
                        assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{a:?} to {b:?}");
                    }
                }
            }
        }
    }

    /// The kernel reads each step's group, distinct dims and shard off rank bits; the plan's ops
    /// price their own layouts: on clusters of three levels with latencies, under both replica
    /// models, the two agree bit for bit.
    #[test]
    fn costs_are_the_plans_with_latencies_and_either_replicas() {
        let mut layouts: Vec<Layout> = layouts_of_96().into_iter().step_by(3).collect();
        layouts.extend(layouts_of_64().into_iter().step_by(3));
        layouts.extend(partial_sums_of(&layouts, 5));
        for replicas in crate::topology::Replicas::ALL {
            let levels = [(2, 60e9, 1e-6), (2, 12e9, 5e-6), (2, 3e9, 2e-5)];
            let cluster = Cluster::hierarchy(&levels, None, replicas).unwrap();
            let model = CostModel::Topology;
            let mut reduced = 0;
            for a in &layouts {
                // The targets that hold no partial sums `a` does not (no step creates them).
                let plans: Vec<(Layout, Redistribution)> = layouts
                    .iter()
                    .filter_map(|b| {
                        let plan = plan_redistribution(a, b, Planner::Paper, Objective::Volume);
                        Some((b.clone(), plan.ok()?))
                    })
                    .collect();
                let targets: Vec<Layout> = plans.iter().map(|(b, _)| b.clone()).collect();
                let got = redistribution_costs(
                    std::slice::from_ref(a),
                    &targets,
                    &cluster,
                    2.0,
                    model,
                    Planner::Paper,
                )
                .unwrap();
                for ((b, plan), cost) in plans.iter().zip(got) {
                    let want = plan.cost(&cluster, 2.0, model).unwrap();
                    assert_eq!(cost.to_bits(), want.to_bits(), "{a:?} to {b:?}");
                    reduced += usize::from(a.partial() != b.partial());
                }
            }
            assert!(reduced > 500, "{reduced}");
        }
    }

    /// The kernel checks once per call that its pairs describe one tensor, not once per pair: a
    /// mismatch between any source and any target is still an error, wherever it stands.
    #[test]
    fn a_pair_of_two_tensors_anywhere_is_an_error() {
        let cluster = Cluster::new(1, 4, 60e9, 6e9, None).unwrap();
        let good = [
            layout(&[8, 8], &[4], &[0, -1]),
            layout(&[64], &[2, 2], &[0]),
            layout(&[4, 16], &[4], &[-1, 0]),
        ];
        // (A layout on other devices is not on the cluster: a topology error before any pair.)
        for bad in [layout(&[8, 4], &[4], &[0, -1]), layout(&[128], &[4], &[0])] {
            for at in 0..=good.len() {
                let mut with_bad = good.to_vec();
                with_bad.insert(at, bad.clone());
                for (sources, targets) in [(&with_bad[..], &good[..]), (&good[..], &with_bad[..])] {
                    let got = redistribution_costs(
                        sources,
                        targets,
                        &cluster,
                        2.0,
                        CostModel::Volume,
                        Planner::Paper,
                    );
                    assert!(
                        matches!(got, Err(Error::Layout(_))),
                        "{bad:?} at {at}: {got:?}"
                    );
                }
            }
        }
    }

    /// The optimal planner's batch compares Algorithm 1's price under each model (its elements
    /// under the volume model, its cost under the topology model): its costs are the plans'.
    #[test]
    fn optimal_costs_are_the_plans_bit_for_bit() {
        let cluster = Cluster::new(2, 4, 60e9, 6e9, None).unwrap();
        let layouts: Vec<Layout> = layouts_of_96().into_iter().step_by(9).collect();
        let n = layouts.len();
        for model in [CostModel::Topology, CostModel::Volume] {
            let objective = objective(&cluster, 2.0, model);
            let got =
                redistribution_costs(&layouts, &layouts, &cluster, 2.0, model, Planner::Optimal)
                    .unwrap();
            for (i, a) in layouts.iter().enumerate() {
                for (j, b) in layouts.iter().enumerate() {
                    let want = plan_redistribution(a, b, Planner::Optimal, objective)
                        .unwrap()
                        .cost(&cluster, 2.0, model)
                        .unwrap();
                    assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{a:?} to {b:?}");
                }
            }
        }
    }

    /// Pairs of several tensors and element sizes in one call: each pair's cost is its plan's,
    /// under both planners and both models.
    #[test]
    fn pair_costs_are_the_plans_bit_for_bit() {
        let cluster = Cluster::new(2, 4, 60e9, 6e9, None).unwrap();
        let layouts: Vec<Layout> = layouts_of_96().into_iter().step_by(7).collect();
        let pairs: Vec<(&Layout, &Layout)> = layouts
            .iter()
            .flat_map(|a| layouts.iter().map(move |b| (a, b)))
            .filter(|(a, b)| check_same_tensor(a, b).is_ok())
            .step_by(3)
            .collect();
        assert!(pairs.len() > 100, "{} pairs", pairs.len());
        let sources: Vec<Layout> = pairs.iter().map(|p| p.0.clone()).collect();
        let targets: Vec<Layout> = pairs.iter().map(|p| p.1.clone()).collect();
        let bytes: Vec<f64> = (0..pairs.len()).map(|k| [2.0, 4.0, 1.0][k % 3]).collect();
        let never = AtomicBool::new(false);
        for planner in [Planner::Paper, Planner::Optimal] {
            for model in [CostModel::Topology, CostModel::Volume] {
                let got =
                    pair_costs_until(&sources, &targets, &bytes, &cluster, model, planner, &never)
                        .unwrap()
                        .unwrap();
                for (k, (a, b)) in pairs.iter().enumerate() {
                    let objective = objective(&cluster, bytes[k], model);
                    let want = plan_redistribution(a, b, planner, objective)
                        .unwrap()
                        .cost(&cluster, bytes[k], model)
                        .unwrap();
                    assert_eq!(got[k].to_bits(), want.to_bits(), "{a:?} to {b:?}");
                }
            }
        }
        let (a, b) = (layout(&[8, 8], &[4], &[0, -1]), layout(&[32], &[4], &[0]));
        let bad = pair_costs_until(
            &[a.clone(), a.clone()],
            &[a.clone(), b],
            &[2.0, 2.0],
            &cluster,
            CostModel::Topology,
            Planner::Optimal,
            &never,
        );
        assert!(bad.is_err());
        let one = std::slice::from_ref(&a);
        let short = pair_costs_until(
            one,
            one,
            &[],
            &cluster,
            CostModel::Topology,
            Planner::Optimal,
            &never,
        );
        assert!(matches!(short, Err(Error::Shape(_))));
    }

    /// A pair's estimate is its cost under the optimal planner, bit for bit, where its search
    /// ends within the layouts it may expand; else a bound between the bound at the source and
    /// the cost, no lower the more layouts it may expand. Every pair is exact without a limit,
    /// and some stop short at a few layouts (a limit the search ignored would fail that). Pairs
    /// of partial sums on two nodes of four devices, two element sizes; each limit's call in a
    /// fresh order of pairs, so that a search stopped short and remembered would be read back.
    #[test]
    fn estimates_are_the_costs_or_bounds_below_them() {
        // (A cluster of its own: the searches' memo is the process's, and a path another test
        // remembered would end a search here at once.)
        let cluster =
            Cluster::hierarchy(&[(4, 50e9, 3e-6), (2, 5e9, 7e-6)], None, Replicas::Flat).unwrap();
        let layouts = layouts_of_64();
        let sums = partial_sums_of(&layouts, 9);
        let pairs: Vec<(&Layout, &Layout)> = sums
            .iter()
            .flat_map(|a| layouts.iter().step_by(5).map(move |b| (a, b)))
            .filter(|(a, b)| check_same_tensor(a, b).is_ok())
            .step_by(3)
            .collect();
        assert!(pairs.len() > 200, "{} pairs", pairs.len());
        let mut sources: Vec<Layout> = pairs.iter().map(|p| p.0.clone()).collect();
        let mut targets: Vec<Layout> = pairs.iter().map(|p| p.1.clone()).collect();
        let mut bytes: Vec<f64> = (0..pairs.len()).map(|k| [2.0, 4.0][k % 2]).collect();
        let never = AtomicBool::new(false);
        let model = CostModel::Topology;
        let (bounds, _) = pair_bounds_until(&sources, &targets, &bytes, &cluster, model, &never)
            .unwrap()
            .unwrap();
        // Each limit's estimates, the pairs in another order per call (rotated by 5 more).
        let mut calls = Vec::new();
        for (n, most) in [Some(0), Some(1), Some(2), Some(4), Some(16), None]
            .into_iter()
            .enumerate()
        {
            let limits = vec![most; sources.len()];
            let (mut got, mut exact) =
                pair_estimates_until(&sources, &targets, &bytes, &limits, &cluster, model, &never)
                    .unwrap()
                    .unwrap();
            // Back in the first call's order.
            got.rotate_right(5 * n);
            exact.rotate_right(5 * n);
            calls.push((most, got, exact));
            for list in [&mut sources, &mut targets] {
                list.rotate_left(5);
            }
            bytes.rotate_left(5);
        }
        let back = 5 * calls.len();
        for list in [&mut sources, &mut targets] {
            list.rotate_right(back);
        }
        bytes.rotate_right(back);
        let costs = pair_costs_until(
            &sources,
            &targets,
            &bytes,
            &cluster,
            model,
            Planner::Optimal,
            &never,
        )
        .unwrap()
        .unwrap();
        let mut last = bounds.clone();
        for (most, got, exact) in &calls {
            let short = exact.iter().filter(|&&e| !e).count();
            for k in 0..sources.len() {
                let pair = format!("{:?} to {:?} within {most:?}", sources[k], targets[k]);
                if exact[k] {
                    assert_eq!(got[k].to_bits(), costs[k].to_bits(), "{pair}");
                } else {
                    assert!(
                        got[k] >= bounds[k] && got[k] <= costs[k],
                        "{pair}: {}",
                        got[k]
                    );
                }
                assert!(got[k] >= last[k], "{pair}: {} under {}", got[k], last[k]);
            }
            match most {
                Some(0..=2) => assert!(short > pairs.len() / 10, "{short} stopped short"),
                None => assert_eq!(short, 0),
                Some(_) => {}
            }
            last.clone_from(got);
        }
        let one = std::slice::from_ref(&sources[0]);
        let wrong = pair_estimates_until(one, one, &[2.0], &[], &cluster, model, &never);
        assert!(matches!(wrong, Err(Error::Shape(_))));
        let volume = CostModel::Volume;
        let volume = pair_estimates_until(one, one, &[2.0], &[None], &cluster, volume, &never);
        assert!(matches!(volume, Err(Error::Topology(_))));
    }

    /// Bounds read back from pairs of canonical forms bounded by earlier calls
    /// ([`optimal::Pairs`]) are each pair's own, worked out afresh per pair (Algorithm 1's cost,
    /// and the bound of the canonical pair's problem without any memo): calls of other layouts
    /// with the same canonical forms, in another order, and under another element size (a memo
    /// that ignored the objective, or named pairs by their places in a call rather than by their
    /// forms, would hand a pair another's bound).
    #[test]
    fn pairs_bounded_before_are_read_back_as_their_own() {
        let mut layouts = layouts_of_96();
        layouts.extend(partial_sums_of(&layouts, 7));
        let sources: Vec<Layout> = layouts.iter().step_by(3).cloned().collect();
        let targets: Vec<Layout> = layouts
            .iter()
            .filter(|l| l.partial().is_empty())
            .step_by(4)
            .cloned()
            .collect();
        // Other layouts, whose canonical forms are the first ones', in another order.
        let (others, other_targets): (Vec<Layout>, Vec<Layout>) = (
            sources.iter().rev().map(normalized).collect(),
            targets.iter().rev().step_by(2).map(normalized).collect(),
        );
        let levels = [(2, 71e9, 1.7e-6), (4, 5.3e9, 1.1e-5)];
        let cluster = Cluster::hierarchy(&levels, None, crate::topology::Replicas::Flat).unwrap();
        let own = |s: &[Layout], t: &[Layout], bytes: f64| {
            let objective = Objective::Seconds {
                cluster: &cluster,
                dtype_bytes: bytes,
            };
            let mut out = Vec::new();
            for a in s {
                for b in t {
                    let cost = plan_redistribution(a, b, Planner::Paper, objective)
                        .unwrap()
                        .cost(&cluster, bytes, CostModel::Topology)
                        .unwrap();
                    if cost == 0.0 {
                        out.push((0, true));
                        continue;
                    }
                    let (a, b) = (normalized(a), normalized(b));
                    let (a, b) = (paper::Prepared::new(&a), paper::Prepared::new(&b));
                    let mut line_up = paper::LineUp::default();
                    let (bound, _) =
                        shortest_plan_bound((&a, &b), objective, &mut line_up, |line_up| {
                            let (s, t) = line_up.pair();
                            optimal::fresh_bound(s, t, objective)
                        })
                        .unwrap();
                    out.push((bound.min(cost).to_bits(), bound > cost));
                }
            }
            out
        };
        let batch = |s: &[Layout], t: &[Layout], bytes| {
            let (bound, exact) =
                redistribution_bounds(s, t, &cluster, bytes, CostModel::Topology).unwrap();
            let bits = bound.iter().map(|b| b.to_bits());
            bits.zip(exact).collect::<Vec<_>>()
        };
        for _ in 0..2 {
            for bytes in [4.0, 2.0, 4.0] {
                let want = own(&sources, &targets, bytes);
                assert_eq!(batch(&sources, &targets, bytes), want, "{bytes}");
                let want = own(&others, &other_targets, bytes);
                assert_eq!(batch(&others, &other_targets, bytes), want, "{bytes}");
            }
        }
    }

    /// The cheap tables, each thread keeping its scratch across jobs and calls (its matrices'
    /// bounds, sums' chains and all-reduces and tensors' prices), bound every pair as a fresh
    /// scratch does, bit for bit, and work out Algorithm 1's cost only where the bound is not
    /// below it on any layouts: calls alternating between two tensors (96 and 64 elements, with
    /// partial sums, on the same device matrices) and two element sizes (two objectives), twice
    /// over.
    #[test]
    fn kept_cheap_scratch_bounds_as_a_fresh_one() {
        // (Without latencies, a price tells the tensors apart.)
        let levels = [(2, 60e9, 0.0), (2, 12e9, 0.0), (2, 3e9, 0.0)];
        let cluster = Cluster::hierarchy(&levels, None, crate::topology::Replicas::Flat).unwrap();
        let mut checked = 0;
        for _ in 0..2 {
            for layouts in [layouts_of_96(), layouts_of_64()] {
                // (A target holds no partial sums its source does not.)
                let targets: Vec<Layout> = layouts.into_iter().step_by(3).collect();
                let mut sources = targets.clone();
                sources.extend(partial_sums_of(&targets, 5));
                for bytes in [2.0, 4.0] {
                    let model = CostModel::Topology;
                    let table = redistribution_table_bounds(
                        &sources, &targets, &cluster, bytes, model, true,
                    )
                    .unwrap();
                    let objective = Objective::Seconds {
                        cluster: &cluster,
                        dtype_bytes: bytes,
                    };
                    let costs = redistribution_costs(
                        &sources,
                        &targets,
                        &cluster,
                        bytes,
                        model,
                        Planner::Paper,
                    )
                    .unwrap();
                    let pairs = (sources.iter()).flat_map(|a| targets.iter().map(move |b| (a, b)));
                    for (k, (a, b)) in pairs.enumerate() {
                        let (a, b) = (normalized(a), normalized(b));
                        let (a, b) = (paper::Prepared::new(&a), paper::Prepared::new(&b));
                        let (mut line_up, mut fresh) =
                            (paper::LineUp::default(), optimal::CheapScratch::default());
                        let (bound, below) =
                            cheap_pair_bound((&a, &b), objective, &mut line_up, &mut fresh)
                                .unwrap();
                        let (want, exact, paper) = if below {
                            (bound, bound == 0.0, f64::NAN)
                        } else {
                            let (want, exact) = bounded(bound, costs[k]);
                            (want, exact, costs[k])
                        };
                        let got = (table.bounds[k].to_bits(), table.exact[k]);
                        assert_eq!(got, (want.to_bits(), exact), "pair {k}");
                        assert_eq!(table.paper[k].to_bits(), paper.to_bits(), "pair {k}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 20_000, "{checked}");
    }

    /// The cheap bounds ([`redistribution_table_bounds`] with `cheap`) are at most the full
    /// ones, which are at most the optimal planner's costs, pair by pair, bit for bit, and at
    /// most Algorithm 1's costs of the layouts as given, which they mostly leave out: on
    /// layouts of 96 and 64 elements (by cuts and by masks), with partial sums, on clusters of
    /// two and three levels with latencies under both replica models (16 devices: one
    /// distribution on several device matrices, whose canonical forms line up otherwise);
    /// exact only where the full bound is, Algorithm 1's costs the same where worked out. And
    /// not vacuous: most equal the full bound (to its hair), their mean over it 0.75 (a bound
    /// scaled down fails here too).
    #[test]
    fn cheap_bounds_lie_below_the_full_ones_and_the_costs() {
        let mut layouts: Vec<Layout> = layouts_of_96().into_iter().step_by(4).collect();
        layouts.extend(layouts_of_64().into_iter().step_by(4));
        layouts.extend(partial_sums_of(&layouts, 5));
        // And on 16 devices: more device dims, more units.
        let shapes: [&[u64]; 3] = [&[192], &[12, 16], &[4, 3, 16]];
        let matrices: [&[u64]; 4] = [&[16], &[4, 4], &[2, 8], &[2, 2, 4]];
        let mut wide: Vec<Layout> = every_layout(&shapes, &matrices)
            .into_iter()
            .step_by(2)
            .collect();
        wide.extend(partial_sums_of(&wide, 6));
        let mut clusters = vec![(Cluster::new(2, 4, 60e9, 6e9, None).unwrap(), &layouts)];
        for replicas in crate::topology::Replicas::ALL {
            let levels = [(2, 60e9, 1e-6), (2, 12e9, 5e-6), (2, 3e9, 2e-5)];
            let cluster = Cluster::hierarchy(&levels, None, replicas).unwrap();
            clusters.push((cluster, &layouts));
            let levels = [(4, 80e9, 2e-6), (4, 9e9, 7e-6)];
            let cluster = Cluster::hierarchy(&levels, None, replicas).unwrap();
            clusters.push((cluster, &wide));
            // A fitted cluster can have its fastest link behind the longest latency.
            let levels = [(4, 80e9, 9e-6), (4, 9e9, 1e-6)];
            let cluster = Cluster::hierarchy(&levels, None, replicas).unwrap();
            clusters.push((cluster, &wide));
        }
        let (mut moved, mut equal, mut ratios, mut computed) = (0, 0, 0.0, 0);
        for (cluster, layouts) in &clusters {
            for elements in [96, 64, 192] {
                let tensor: Vec<Layout> = (layouts.iter())
                    .filter(|l| l.num_elements() == elements)
                    .cloned()
                    .collect();
                let targets: Vec<Layout> = (tensor.iter())
                    .filter(|l| l.partial().is_empty())
                    .cloned()
                    .collect();
                let model = CostModel::Topology;
                let table = |cheap| {
                    redistribution_table_bounds(&tensor, &targets, cluster, 2.0, model, cheap)
                        .unwrap()
                };
                let (cheap, full) = (table(true), table(false));
                let costs =
                    redistribution_costs(&tensor, &targets, cluster, 2.0, model, Planner::Optimal)
                        .unwrap();
                for k in 0..costs.len() {
                    let (c, f) = (cheap.bounds[k], full.bounds[k]);
                    let pair = (&tensor[k / targets.len()], &targets[k % targets.len()]);
                    assert!(c <= f && f <= costs[k], "{pair:?}: {c} {f} {}", costs[k]);
                    assert!(c <= full.paper[k], "{pair:?}: {c} {}", full.paper[k]);
                    let paper = cheap.paper[k];
                    assert!(paper.is_nan() || paper.to_bits() == full.paper[k].to_bits());
                    computed += usize::from(!paper.is_nan());
                    if cheap.exact[k] {
                        assert!(full.exact[k] && c.to_bits() == f.to_bits(), "{pair:?}");
                    }
                    if full.paper[k] != 0.0 {
                        moved += 1;
                        equal += usize::from(c >= f * (1.0 - 1e-9));
                        ratios += c / f;
                    }
                }
            }
        }
        let mean = ratios / moved as f64;
        assert!(moved > 5_000, "{moved}");
        assert!(2 * equal > moved, "{equal} of {moved} equal");
        assert!(mean > 0.65, "mean ratio {mean}");
        // (3% of a GPT-3 layer's; here a third: tensors of a few elements, whose prices
        // are mostly latencies.)
        assert!(
            2 * computed < moved,
            "Algorithm 1 worked out for {computed} of {moved}"
        );
    }

    /// The bounds of scattered pairs of several tensors and element sizes in one call
    /// ([`pair_bounds_until`], in parts of [`BOUNDS_PER_LOOK`]) are those each pair's table
    /// gives it, bit for bit, whatever the memos held (asked first, then again after the tables
    /// filled them); a call stopped first gives none.
    #[test]
    fn pair_bounds_are_the_tables_bit_for_bit() {
        let mut layouts: Vec<Layout> = layouts_of_96().into_iter().step_by(5).collect();
        layouts.extend(layouts_of_64().into_iter().step_by(5));
        layouts.extend(partial_sums_of(&layouts, 7));
        let pairs: Vec<(&Layout, &Layout)> = layouts
            .iter()
            .flat_map(|a| layouts.iter().map(move |b| (a, b)))
            .filter(|(a, b)| check_same_tensor(a, b).is_ok() && b.partial().is_empty())
            .step_by(3)
            .collect();
        assert!(pairs.len() > 300, "{} pairs", pairs.len());
        let sources: Vec<Layout> = pairs.iter().map(|p| p.0.clone()).collect();
        let targets: Vec<Layout> = pairs.iter().map(|p| p.1.clone()).collect();
        // Sizes no other test bounds under: the memos start empty for them.
        let bytes: Vec<f64> = (0..pairs.len()).map(|k| [2.5, 4.5, 1.5][k % 3]).collect();
        let levels = [(2, 71e9, 1.7e-6), (4, 5.3e9, 1.1e-5)];
        let cluster = Cluster::hierarchy(&levels, None, crate::topology::Replicas::Flat).unwrap();
        let model = CostModel::Topology;
        let never = AtomicBool::new(false);
        let bound = |bytes: &[f64], model| {
            pair_bounds_until(&sources, &targets, bytes, &cluster, model, &never)
        };
        assert!(pairs.len() > 4 * BOUNDS_PER_LOOK, "{} pairs", pairs.len());
        for _ in 0..2 {
            let (bounds, exact) = bound(&bytes, model).unwrap().expect("not stopped");
            for (k, (a, b)) in pairs.iter().enumerate() {
                let (one, two) = (std::slice::from_ref(*a), std::slice::from_ref(*b));
                let (want, want_exact) =
                    redistribution_bounds(one, two, &cluster, bytes[k], model).unwrap();
                assert_eq!(bounds[k].to_bits(), want[0].to_bits(), "{a:?} to {b:?}");
                assert_eq!(exact[k], want_exact[0], "{a:?} to {b:?}");
            }
        }
        assert!(matches!(
            bound(&bytes, CostModel::Volume),
            Err(Error::Topology(_))
        ));
        assert!(matches!(bound(&bytes[1..], model), Err(Error::Shape(_))));
        let stopped = AtomicBool::new(true);
        let none = pair_bounds_until(&sources, &targets, &bytes, &cluster, model, &stopped);
        assert!(none.unwrap().is_none());
    }

    #[test]
    fn duplicates_get_the_cost_of_their_first_copy() {
        let cluster = Cluster::new(2, 2, 60e9, 6e9, None).unwrap();
        let a = layout(&[8, 8], &[4], &[0, -1]);
        let b = layout(&[8, 8], &[4], &[-1, 0]);
        let sources = [a.clone(), b.clone(), a.clone()];
        let targets = [b.clone(), a.clone(), b.clone(), b.clone()];
        for model in [CostModel::Topology, CostModel::Volume] {
            let got =
                redistribution_costs(&sources, &targets, &cluster, 2.0, model, Planner::Paper)
                    .unwrap();
            for (i, s) in sources.iter().enumerate() {
                for (j, t) in targets.iter().enumerate() {
                    let want = plan_redistribution(s, t, Planner::Paper, Objective::Volume)
                        .unwrap()
                        .cost(&cluster, 2.0, model)
                        .unwrap();
                    assert_eq!(got[i * targets.len() + j].to_bits(), want.to_bits());
                }
            }
        }
    }

    /// MatMul `(b, in, out)` with degrees (d, r, c): the dW all_reduce moves `2(d-1)/d` of the
    /// W shard, the forward one `2(r-1)/r` of the Y shard (the paper's MatMul volume,
    /// docs/conventions.md#intra-operator-communication).
    #[test]
    fn matmul_volumes() {
        let (batch, inner, outer) = (64u64, 32, 16);
        let cluster = Cluster::new(2, 4, 60e9, 6e9, None).unwrap();
        let strategies = enumerate_strategies(&[batch, inner, outer], 8, false).unwrap();
        let tensors = [
            AxesTensor {
                axes: vec![0, 2],
                shape: vec![batch, outer],
                dtype_bytes: 1.0,
            },
            AxesTensor {
                axes: vec![1, 2],
                shape: vec![inner, outer],
                dtype_bytes: 1.0,
            },
        ];
        let got = allreduce_costs(&strategies, &tensors, &cluster, CostModel::Volume).unwrap();
        for (s, cost) in strategies.iter().zip(got) {
            let [d, r, c] = [0, 1, 2].map(|k| s.degrees()[k] as f64);
            let y_size = (batch * outer) as f64;
            let w_size = (inner * outer) as f64;
            let want = 2.0 * ((r - 1.0) * y_size + (d - 1.0) * w_size) / (d * r * c);
            assert!((cost - want).abs() <= 1e-9 * want.max(1.0), "{s:?}");
        }
    }

    /// The kernel prices each tensor in a reused layout; it must give the sum of the
    /// collective costs of the tensors' own layouts exactly.
    #[test]
    fn allreduce_costs_are_the_collective_costs_bit_for_bit() {
        let cluster = Cluster::new(4, 8, 60e9, 6e9, None).unwrap();
        let sizes = [64, 48, 32, 16];
        let strategies = enumerate_strategies(&sizes, 32, true).unwrap();
        let tensors = [
            AxesTensor {
                axes: vec![0, 1, 3],
                shape: vec![64, 48, 16],
                dtype_bytes: 2.0,
            },
            AxesTensor {
                axes: vec![2, -1, 3],
                shape: vec![32, 5, 16],
                dtype_bytes: 4.0,
            },
        ];
        for model in [CostModel::Topology, CostModel::Volume] {
            let got = allreduce_costs(&strategies, &tensors, &cluster, model).unwrap();
            for (s, cost) in strategies.iter().zip(got) {
                let want = tensors.iter().fold(0.0, |total, t| {
                    let layout = s.tensor_layout(&t.axes, &t.shape, true).unwrap();
                    let c = cluster.collective_cost(
                        &layout,
                        CollectiveKind::AllReduce,
                        None,
                        t.dtype_bytes,
                        model,
                    );
                    total + c.unwrap()
                });
                assert_eq!(cost.to_bits(), want.to_bits(), "{s:?}");
            }
        }
    }

    #[test]
    fn rejects_strategies_of_another_cluster_and_misfit_tensors() {
        let cluster = Cluster::new(1, 4, 60e9, 6e9, None).unwrap();
        let s = Strategy::new(vec![2, 4], vec![1, 0]).unwrap();
        let t = AxesTensor {
            axes: vec![0],
            shape: vec![8],
            dtype_bytes: 2.0,
        };
        assert!(matches!(
            allreduce_costs(
                &[s],
                std::slice::from_ref(&t),
                &cluster,
                CostModel::Topology
            ),
            Err(Error::Topology(_))
        ));
        let s = Strategy::new(vec![4, 1], vec![0, -1]).unwrap();
        let odd = AxesTensor {
            shape: vec![6],
            ..t.clone()
        };
        let far = AxesTensor { axes: vec![2], ..t };
        for bad in [odd, far] {
            assert!(matches!(
                allreduce_costs(
                    std::slice::from_ref(&s),
                    &[bad],
                    &cluster,
                    CostModel::Topology
                ),
                Err(Error::Layout(_))
            ));
        }
    }

    /// Every cost entry point rejects a dtype size that is not a positive number, with the one
    /// core error; the bindings add no check of their own.
    #[test]
    fn every_cost_rejects_bad_dtype_bytes() {
        use std::slice::from_ref;

        let cluster = Cluster::new(2, 2, 60e9, 6e9, None).unwrap();
        let a = Layout::new(vec![8, 8], vec![4], vec![0, -1]).unwrap();
        let b = Layout::new(vec![8, 8], vec![4], vec![-1, 0]).unwrap();
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        let strategy = Strategy::new(vec![4], vec![0]).unwrap();
        let (model, paper) = (CostModel::Topology, Planner::Paper);
        for bad in [0.0, -2.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let tensor = AxesTensor {
                axes: vec![0],
                shape: vec![8],
                dtype_bytes: bad,
            };
            let results = [
                cluster.collective_cost(&a, CollectiveKind::AllReduce, None, bad, model),
                plan.cost(&cluster, bad, model),
                plan.ops[0].cost(&cluster, bad, model),
                redistribution_costs(from_ref(&a), from_ref(&b), &cluster, bad, model, paper)
                    .map(|c| c[0]),
                allreduce_costs(from_ref(&strategy), &[tensor], &cluster, model).map(|c| c[0]),
            ];
            for r in results {
                match r {
                    Err(Error::Topology(m)) => assert!(m.contains("dtype_bytes"), "{m}"),
                    other => panic!("dtype_bytes {bad}: {other:?}"),
                }
            }
        }
        // A layout pair with no op is still checked: the answer must not depend on the plan.
        for planner in [Planner::Paper, Planner::Optimal] {
            let costs =
                redistribution_costs(from_ref(&a), from_ref(&a), &cluster, 0.0, model, planner);
            assert!(costs.is_err());
        }
    }
}
