//! Redistribution plans (docs/conventions.md#redistribution): the steps that turn one layout of
//! a tensor into another, and two planners that choose them. [`Planner::Paper`] is the paper's
//! Algorithm 1 (`paper.rs`: slices, all-to-alls and all-gathers in a fixed order);
//! [`Planner::Optimal`] is a shortest path over the layouts between the two canonical forms
//! (`optimal.rs`), which also uses reduce-scatters, all-reduces and collective-permutes. Both
//! build the steps of `ops.rs`; this module chooses between them and hands the search Algorithm
//! 1's plan as its bound and fallback, so that neither planner imports the other.

mod ops;
pub(crate) mod optimal;
pub(crate) mod paper;

use std::borrow::Cow;
use std::sync::atomic::AtomicBool;

pub use ops::{CommOp, Objective, OpKind, Redistribution};
use optimal::{Path, Problem, Solved};

use crate::error::{parse_name, Error, Result};
use crate::layout::Layout;
use crate::unify::normalized;

/// Which planner chooses the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Planner {
    /// The cheapest plan between the canonical forms, never dearer than Algorithm 1 on them.
    Optimal,
    /// The paper's Algorithm 1 on the two layouts as given (partial sums all-reduced first).
    Paper,
}

impl Planner {
    /// Every planner, in the order of [`Planner::NAMES`].
    pub const ALL: [Planner; 2] = [Planner::Optimal, Planner::Paper];

    /// The names callers use (Python, the CLI): the one list of them.
    pub const NAMES: [&'static str; 2] = ["optimal", "paper"];

    #[must_use]
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The planner named `name`, one of [`Planner::NAMES`].
    ///
    /// # Errors
    /// [`Error::Layout`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        parse_name(name, "planner", &Self::NAMES, Error::Layout).map(|i| Self::ALL[i])
    }
}

/// Plans the redistribution of a tensor from layout `a` to layout `b` with `planner`; the optimal
/// planner minimizes `objective` (the paper's planner ignores it).
///
/// The optimal plan is the cheaper of the shortest path between the canonical forms and
/// Algorithm 1 on the layouts as given (the canonical forms merge device dims, which can take
/// away a cheaper order of smaller collectives); on a tie, the shortest path's.
///
/// # Errors
/// [`Error::Layout`] if the layouts do not describe one tensor on one set of devices or the target
/// holds partial sums the source does not, [`Error::Topology`] if the objective's cluster does
/// not have the layouts' device count or its `dtype_bytes` is not positive.
pub fn plan_redistribution(
    a: &Layout,
    b: &Layout,
    planner: Planner,
    objective: Objective<'_>,
) -> Result<Redistribution> {
    let paper = paper::plan(a, b, objective)?;
    if planner == Planner::Paper {
        return Ok(paper);
    }
    let optimal = canonical_plan(a, b, objective)?;
    Ok(if objective.total(&optimal) <= objective.total(&paper) {
        optimal
    } else {
        paper
    })
}

/// The shortest path between the canonical forms of `a` and `b` (Algorithm 1 on them if the
/// search gives up): one distribution, one plan.
fn canonical_plan(a: &Layout, b: &Layout, objective: Objective<'_>) -> Result<Redistribution> {
    shortest_plan_by(&normalized(a), &normalized(b), objective, |problem| {
        Ok(Cow::Owned(solve(
            problem,
            objective,
            &AtomicBool::new(false),
        )?))
    })
}

/// The search's path of `problem` ([`optimal::solve`]), bounded by Algorithm 1's plan of it,
/// which it falls back on.
///
/// # Errors
/// [`Error::Memory`] if the search's layouts cannot be allocated.
pub(crate) fn solve(
    problem: &Problem,
    objective: Objective<'_>,
    stop: &AtomicBool,
) -> Result<Path> {
    optimal::solve(problem, objective, stop, paper::unified_ops)
}

/// [`canonical_plan`] of layouts already in canonical form, with the search's path of a problem
/// from `solve` (the batch kernel normalises each distinct layout once and searches once per
/// [`Key`](optimal::Key), not once per pair): Algorithm 1 on the unified pair, unless the
/// path, mapped onto the pair, costs no more.
pub(crate) fn shortest_plan_by<'p>(
    a: &Layout,
    b: &Layout,
    objective: Objective<'_>,
    solve: impl FnOnce(&Problem) -> Result<Cow<'p, Path>>,
) -> Result<Redistribution> {
    debug_assert!(normalized(a) == *a && normalized(b) == *b);
    let mut plan = paper::plan(a, b, objective)?;
    if let Some(problem) = Problem::of(&plan.source, &plan.target) {
        let path = solve(&problem)?;
        let ops = problem.ops(&path, &plan.source);
        let price = |ops: &[CommOp]| ops.iter().fold(0.0, |t, op| objective.add(t, op));
        if price(&ops) <= price(&plan.ops) {
            plan.ops = ops;
        }
    }
    Ok(plan)
}

/// A lower bound on the price of [`shortest_plan_by`]'s plan of `a` and `b` (canonical forms,
/// prepared once each: [`paper::Prepared`]), without its search: the plan's ops outside the
/// search at their price, the search's bound at its source for the rest (`lower_bound` of the
/// unified pair lined up in `scratch`, `None` if it makes no search problem:
/// [`optimal::Bounds::bound`], which depends on the problem's key alone, or a lower bound on
/// it). Algorithm 1's ops between the unified pair are not built unless there is no search (the
/// lined-up pair is what `paper::plan` makes; the caller has checked that the layouts are of
/// one tensor on the cluster). With it, whether the plan has no ops outside the search and
/// `lower_bound` gave a bound (not the plan's price).
///
/// # Errors
/// As [`plan_redistribution`].
pub(crate) fn shortest_plan_bound<'p>(
    (a, b): (&'p paper::Prepared<'_>, &'p paper::Prepared<'_>),
    objective: Objective<'_>,
    scratch: &mut paper::LineUp<'p>,
    lower_bound: impl FnOnce(&mut paper::LineUp<'p>) -> Option<f64>,
) -> Result<(f64, bool)> {
    let (prelude, epilogue) = paper::lined_up_prepared(a, b, scratch)?;
    if let Some(bound) = lower_bound(scratch) {
        let inside = prelude.is_empty() && epilogue.is_empty();
        return Ok((
            with_outside(objective, (&prelude, &epilogue), bound),
            inside,
        ));
    }
    // The plan's price, its ops in order.
    let (source, target) = scratch.pair();
    let ops = paper::unified_ops(source, target);
    Ok((
        objective.sum(prelude.iter().chain(&ops).chain(&epilogue)),
        false,
    ))
}

/// A lower bound on the price of [`shortest_plan_by`]'s plan of `a` and `b` (canonical forms)
/// where its search expands `expansions` layouts without reaching the target: the plan's ops
/// outside the search at their price, the least estimate the search left for the rest
/// ([`optimal::solve_within`]). `None` where there is no search or it ends (its path is then
/// remembered: [`solve`] finds it at once).
///
/// # Errors
/// As [`plan_redistribution`].
pub(crate) fn plan_bound_within(
    a: &Layout,
    b: &Layout,
    objective: Objective<'_>,
    stop: &AtomicBool,
    expansions: usize,
) -> Result<Option<f64>> {
    let plan = paper::lined_up(a, b, None)?;
    let Some(problem) = Problem::of(&plan.source, &plan.target) else {
        return Ok(None);
    };
    let solved = optimal::solve_within(
        &problem,
        objective,
        stop,
        paper::unified_ops,
        Some(expansions),
    )?;
    Ok(match solved {
        Solved::Path(_) => None,
        Solved::AtLeast(least) => Some(with_outside(
            objective,
            (&plan.prelude, &plan.epilogue),
            least,
        )),
    })
}

/// A lower bound on a plan's price from `bound`, one on its search's part: the ops outside the
/// search (`prelude` and `epilogue`) at their price added, scaled down by a hair (the plan's
/// price adds its ops in another order).
fn with_outside(
    objective: Objective<'_>,
    (prelude, epilogue): (&[CommOp], &[CommOp]),
    bound: f64,
) -> f64 {
    let outside = objective.sum(prelude.iter().chain(epilogue));
    (outside + bound) * (1.0 - 1e-12)
}

/// The search [`shortest_plan_by`] runs for `a` and `b` (`None` if it runs none).
///
/// # Errors
/// As [`plan_redistribution`].
pub(crate) fn search_problem(a: &Layout, b: &Layout) -> Result<Option<Problem>> {
    let plan = paper::lined_up(a, b, None)?;
    Ok(Problem::of(&plan.source, &plan.target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;
    use crate::topology::{inter_node_groups, CollectiveKind};

    fn both(a: &Layout, b: &Layout) -> (Redistribution, Redistribution) {
        (
            plan_redistribution(a, b, Planner::Paper, Objective::Volume).unwrap(),
            plan_redistribution(a, b, Planner::Optimal, Objective::Volume).unwrap(),
        )
    }

    /// The examples of issue 12: elements received per device by each planner.
    #[test]
    fn optimal_plans_of_the_issue() {
        let cases: [(Layout, Layout, u64, u64); 5] = [
            (
                layout(&[96, 32, 96], &[16, 2], &[1, 0, -1]),
                layout(&[96, 32, 96], &[16, 2], &[0, 1, -1]),
                211_968,
                17_280,
            ),
            (
                layout(&[16, 48], &[8, 2], &[0, -1]),
                layout(&[16, 48], &[16], &[0, -1]),
                192,
                48,
            ),
            (
                layout(&[32, 96, 96], &[2, 2, 4, 2], &[2, -1, -1]),
                layout(&[32, 96, 96], &[8, 4], &[0, -1, -1]),
                147_456,
                73_728,
            ),
            // A 4x4 mesh swapping its two dims: one collective-permute of the whole shard.
            (
                layout(&[1024, 1024], &[4, 4], &[1, 0]),
                layout(&[1024, 1024], &[4, 4], &[0, 1]),
                393_216,
                65_536,
            ),
            (
                layout(&[64, 4, 8, 16], &[4, 4], &[-1, 1, 0, -1]),
                layout(&[64, 32, 16], &[16], &[0, -1, -1]),
                3_072,
                1_920,
            ),
        ];
        for (a, b, paper, optimal) in cases {
            let (p, o) = both(&a, &b);
            assert_eq!(
                (p.volume().unwrap(), o.volume().unwrap()),
                (paper, optimal),
                "{a:?} -> {b:?}"
            );
        }
        // Issue 23: a replicated dim sliced along the free device dim the target uses for the
        // other dim, then one collective-permute of the smaller shard: what XLA moves.
        let (paper, optimal) = both(
            &layout(&[256, 1024], &[4, 4], &[0, -1]),
            &layout(&[256, 1024], &[4, 4], &[1, 0]),
        );
        assert_eq!(paper.volume().unwrap(), 49_152);
        assert_eq!(optimal.volume().unwrap(), 16_384);
        let kinds: Vec<_> = optimal.ops.iter().map(CommOp::kind).collect();
        assert_eq!(kinds, [OpKind::Slice, OpKind::CollectivePermute]);
        let swap = both(
            &layout(&[1024, 1024], &[4, 4], &[1, 0]),
            &layout(&[1024, 1024], &[4, 4], &[0, 1]),
        )
        .1;
        assert_eq!(swap.ops.len(), 1);
        assert_eq!(swap.ops[0].kind(), OpKind::CollectivePermute);
        assert_eq!(swap.ops[0].permutation(), Some(&[1, 0][..]));
    }

    /// One distribution written two ways gets one plan.
    #[test]
    fn one_distribution_one_plan() {
        let b = layout(&[64, 32, 16], &[16], &[0, -1, -1]);
        let (_, one) = both(&layout(&[64, 32, 16], &[16], &[-1, 0, -1]), &b);
        let (_, other) = both(&layout(&[64, 4, 8, 16], &[4, 4], &[-1, 1, 0, -1]), &b);
        assert_eq!(one, other);
        assert_eq!(one.volume().unwrap(), 1_920);
    }

    /// A partial sum over 4 devices to a split: one reduce-scatter, half the all-reduce's volume;
    /// to a replica: one all-reduce.
    #[test]
    fn partial_sums_reduce() {
        let a = Layout::with_partial(vec![64, 8], vec![4, 2], vec![-1, 0], vec![1]).unwrap();
        let split = layout(&[64, 8], &[4, 2], &[1, 0]);
        let (paper, optimal) = both(&a, &split);
        let kinds: Vec<_> = optimal.ops.iter().map(CommOp::kind).collect();
        assert_eq!(kinds, [OpKind::ReduceScatter]);
        assert_eq!(optimal.volume().unwrap(), 3 * 64 * 4 / 4);
        assert_eq!(paper.volume().unwrap(), 2 * optimal.volume().unwrap());
        let (_, whole) = both(&a, &layout(&[64, 8], &[4, 2], &[-1, 0]));
        assert_eq!(whole.ops.len(), 1);
        assert_eq!(whole.ops[0].kind(), OpKind::AllReduce);
        assert_eq!(whole.volume().unwrap(), 2 * 3 * 64 * 4 / 4);
        // No step creates partial sums.
        assert!(matches!(
            plan_redistribution(&split, &a, Planner::Optimal, Objective::Volume),
            Err(Error::Layout(_))
        ));
    }

    /// Every step of both planners' plans is the step its parts (what a pickle holds) rebuild,
    /// every kind among them; parts that fit no step are an error, not a panic.
    #[test]
    fn steps_rebuild_from_their_parts() {
        let partial = Layout::with_partial(vec![64, 8], vec![4, 2], vec![-1, 0], vec![1]).unwrap();
        let pairs = [
            (partial.clone(), layout(&[64, 8], &[4, 2], &[1, 0])),
            (partial, layout(&[64, 8], &[4, 2], &[-1, 0])),
            (
                layout(&[1024, 1024], &[4, 4], &[1, 0]),
                layout(&[1024, 1024], &[4, 4], &[0, 1]),
            ),
            (
                layout(&[96, 32, 96], &[16, 2], &[1, 0, -1]),
                layout(&[96, 32, 96], &[16, 2], &[0, 1, -1]),
            ),
            (
                layout(&[16, 48], &[8, 2], &[0, -1]),
                layout(&[16, 48], &[16], &[0, -1]),
            ),
            (
                layout(&[16, 16, 16], &[2, 4, 2], &[0, 1, -1]),
                layout(&[16, 16, 16], &[2, 4, 2], &[-1, 2, 1]),
            ),
        ];
        let mut kinds = Vec::new();
        for (a, b) in &pairs {
            let (paper, optimal) = both(a, b);
            for op in paper.all_ops().chain(optimal.all_ops()) {
                let again = CommOp::from_parts(
                    op.kind(),
                    op.device_dim(),
                    op.tensor_dim(),
                    op.to_tensor_dim(),
                    op.permutation().map(<[usize]>::to_vec),
                    op.layout().clone(),
                );
                assert_eq!(again.as_ref(), Ok(op));
                kinds.push(op.kind());
            }
        }
        assert!(OpKind::ALL.iter().all(|k| kinds.contains(k)), "{kinds:?}");
        let l = layout(&[4, 4], &[2, 2], &[0, 1]);
        for (kind, k, i, to, p) in [
            (OpKind::AllGather, 2, Some(0), None, None),
            (OpKind::AllGather, 0, Some(2), None, None),
            (OpKind::AllGather, 0, None, None, None),
            (OpKind::AllToAll, 0, Some(0), Some(0), None),
            (OpKind::AllReduce, 0, Some(0), None, None),
            (OpKind::Slice, 0, Some(0), None, Some(vec![1, 0])),
            (OpKind::CollectivePermute, 0, None, None, None),
            (OpKind::CollectivePermute, 0, None, None, Some(vec![0, 1])),
            (OpKind::CollectivePermute, 0, None, None, Some(vec![1, 1])),
            (
                OpKind::CollectivePermute,
                0,
                None,
                None,
                Some(vec![1, 0, 2]),
            ),
            (OpKind::CollectivePermute, 1, None, None, Some(vec![1, 0])),
        ] {
            let got = CommOp::from_parts(kind, k, i, to, p, l.clone());
            assert!(
                matches!(got, Err(Error::Layout(_))),
                "{kind:?} {k} {i:?} {to:?}"
            );
        }
        assert!(matches!(OpKind::parse("gather"), Err(Error::Layout(_))));
        assert!(OpKind::ALL
            .iter()
            .all(|&k| OpKind::parse(k.name()) == Ok(k)));
    }

    /// `ct` has one rule whichever way it is asked for: a node size that is not a positive power
    /// of two is rejected by the free function and by a plan's ops alike (slices included), and
    /// both give the same `ct` otherwise.
    #[test]
    fn one_node_size_rule_for_both_ct_entry_points() {
        let a = Layout::new(vec![16, 16, 16], vec![2, 4, 2], vec![0, 1, -1]).unwrap();
        let b = Layout::new(vec![16, 16, 16], vec![2, 4, 2], vec![-1, 2, 1]).unwrap();
        let plan = plan_redistribution(&a, &b, Planner::Paper, Objective::Volume).unwrap();
        assert!(plan.ops.iter().any(|op| op.kind() == OpKind::Slice));
        assert!(plan.ops.iter().any(|op| op.kind() != OpKind::Slice));
        for l in [0, 3, 6, 12, u64::MAX] {
            assert!(matches!(
                inter_node_groups(&a, CollectiveKind::AllReduce, l, None),
                Err(Error::Topology(_))
            ));
            for op in &plan.ops {
                assert!(matches!(op.inter_node_groups(l), Err(Error::Topology(_))));
            }
        }
        for l in [1, 2, 4, 8, 16, 32, 1 << 40] {
            for op in &plan.ops {
                let want = match op.kind().collective() {
                    Some(kind) => inter_node_groups(op.layout(), kind, l, Some(op.device_dim())),
                    None => Ok(0),
                };
                assert_eq!(op.inter_node_groups(l), want);
            }
        }
    }
}
