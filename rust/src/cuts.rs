//! The dynamic programmes of the stage search over cuts (docs/pipeline.md): a chain of `n` units
//! cut into `K` stages, stage `k` covering units `a..b`. The results are numpy's to the bit (the
//! search's numpy code computed them before): the same sums and comparisons, the same minimum,
//! the first of equal choices.

use crate::error::{Error, Result};

/// A chain of units as the programmes read it, over its `points = n + 1` cut points; matrices
/// are row-major `points x points`, indexed `[a][b]` for the run of units `a..b`.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a> {
    /// Seconds per microbatch of the run (`inf` unless `b > a`), not shrinking as it grows.
    pub times: &'a [f64],
    /// Per end point `b`, what a stage ending there pays after it (the sends across it, both
    /// ways), but the last stage.
    pub edge: &'a [f64],
    /// Parameter bytes of the run.
    pub parameters: &'a [f64],
    /// Activation bytes of the run per microbatch in flight.
    pub activations: &'a [f64],
    /// Per stage, the microbatches in flight it holds.
    pub flights: &'a [f64],
    /// Bytes held once more (a checkpointed unit recomputing).
    pub buffer: f64,
    /// Bytes per device a stage may hold.
    pub limit: f64,
}

impl Chain<'_> {
    /// The cut points, checked against every array's length.
    fn points(&self) -> Result<usize> {
        let points = self.edge.len();
        let square = points * points;
        if points < 2
            || self.flights.is_empty()
            || [self.times, self.parameters, self.activations]
                .iter()
                .any(|m| m.len() != square)
        {
            return Err(Error::Shape(format!(
                "a chain of units needs at least one stage and its times, parameters and \
                 activations over {points} x {points} cut points (at least 2), got {}, {} and {} \
                 entries for {} stage(s)",
                self.times.len(),
                self.parameters.len(),
                self.activations.len(),
                self.flights.len()
            )));
        }
        Ok(points)
    }

    /// Whether stage `k` fits in memory covering the run at index `i` (`a * points + b`).
    fn fits(&self, k: usize, i: usize) -> bool {
        self.parameters[i] + self.flights[k] * self.activations[i] + self.buffer <= self.limit
    }
}

/// The cuts of least total time (the stages' times and what they pay after them) whose stages
/// all fit and take at most `bound`. A run's time must not shrink as it grows (units of
/// non-negative time): each stage end looks back only to the first start over the bound. Returns the `K + 1` cut points `0 = c_0 < ... < c_K = n`,
/// or `None` when no cuts meet the bound. Among equal totals the programme keeps, for every
/// stage end, the first start.
///
/// # Errors
/// [`Error::Shape`] when the arrays' sizes do not fit together.
pub fn least_cuts(chain: &Chain<'_>, bound: f64) -> Result<Option<Vec<usize>>> {
    let points = chain.points()?;
    let stages = chain.flights.len();
    let mut best = vec![f64::INFINITY; points];
    best[0] = 0.0;
    let mut next = vec![0.0; points];
    let mut back = vec![0usize; stages * points];
    for k in 0..stages {
        let final_stage = k + 1 == stages;
        for b in 0..points {
            let (mut least, mut at) = (f64::INFINITY, 0usize);
            // From the shortest stage ending at b to the first over the bound (a run's time
            // grows with it); numpy's argmin keeps the first least, so among equals the last
            // seen. A start from which nothing is finite is never followed back.
            for a in (0..b).rev() {
                let i = a * points + b;
                let time = chain.times[i];
                if time > bound {
                    break;
                }
                if !chain.fits(k, i) {
                    continue;
                }
                let c = best[a]
                    + if final_stage {
                        time
                    } else {
                        time + chain.edge[b]
                    };
                if c <= least && c.is_finite() {
                    (least, at) = (c, a);
                }
            }
            back[k * points + b] = at;
            next[b] = least;
        }
        std::mem::swap(&mut best, &mut next);
    }
    if !best[points - 1].is_finite() {
        return Ok(None);
    }
    let mut cuts = vec![points - 1];
    for k in (0..stages).rev() {
        let end = cuts[cuts.len() - 1];
        cuts.push(back[k * points + end]);
    }
    cuts.reverse();
    Ok(Some(cuts))
}

/// The least, over every cut into stages that all fit, of the slowest stage's time: the least
/// bound any cuts meet (`inf` if none fit). A run's time must not shrink as it grows.
///
/// # Errors
/// [`Error::Shape`] when the arrays' sizes do not fit together.
pub fn least_bottleneck(chain: &Chain<'_>) -> Result<f64> {
    let points = chain.points()?;
    let mut best = vec![f64::INFINITY; points];
    best[0] = 0.0;
    let mut next = vec![0.0; points];
    for k in 0..chain.flights.len() {
        for (b, slot) in next.iter_mut().enumerate() {
            let mut least = f64::INFINITY;
            // Longer stages take no less: stop at the first as slow as the least found.
            for a in (0..b).rev() {
                let i = a * points + b;
                if chain.times[i] >= least {
                    break;
                }
                if chain.fits(k, i) {
                    least = least.min(best[a].max(chain.times[i]));
                }
            }
            *slot = least;
        }
        std::mem::swap(&mut best, &mut next);
    }
    Ok(best[points - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cut of `n` units into `k` runs, as cut points.
    fn all_cuts(n: usize, k: usize) -> Vec<Vec<usize>> {
        if k == 1 {
            return vec![vec![0, n]];
        }
        let mut out = vec![];
        for last in (k - 1)..n {
            for mut head in all_cuts(last, k - 1) {
                head.push(n);
                out.push(head);
            }
        }
        out
    }

    /// The runs' sums of `units` over every pair of cut points (`inf` unless `b > a`).
    fn runs(units: &[f64]) -> Vec<f64> {
        let points = units.len() + 1;
        let mut out = vec![f64::INFINITY; points * points];
        for a in 0..points {
            for b in (a + 1)..points {
                out[a * points + b] = units[a..b].iter().sum();
            }
        }
        out
    }

    const UNITS: [f64; 7] = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0];
    const BYTES: [f64; 7] = [1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 2.0];

    /// Checks both programmes against every cut of [`UNITS`] into `stages`, stage `k` holding
    /// `stages - k` microbatches of [`BYTES`] within `limit`, each boundary sending 0.5.
    fn against_brute_force(stages: usize, limit: f64, bound: f64) {
        let (times, bytes) = (runs(&UNITS), runs(&BYTES));
        let points = UNITS.len() + 1;
        let zero = vec![0.0; points * points];
        let mut edge = vec![1.0; points];
        edge[points - 1] = 0.0;
        #[allow(clippy::cast_precision_loss)]
        let flights: Vec<f64> = (0..stages).map(|k| (stages - k) as f64).collect();
        let chain = Chain {
            times: &times,
            edge: &edge,
            parameters: &zero,
            activations: &bytes,
            flights: &flights,
            buffer: 0.0,
            limit,
        };
        let fitting: Vec<Vec<usize>> = all_cuts(UNITS.len(), stages)
            .into_iter()
            .filter(|c| {
                c.windows(2)
                    .enumerate()
                    .all(|(k, w)| BYTES[w[0]..w[1]].iter().sum::<f64>() * flights[k] <= limit)
            })
            .collect();
        let slowest = |c: &Vec<usize>| {
            c.windows(2)
                .map(|w| UNITS[w[0]..w[1]].iter().sum::<f64>())
                .fold(0.0, f64::max)
        };
        let brute = fitting.iter().map(slowest).fold(f64::INFINITY, f64::min);
        // Both are one run's sum of the same units, added in the same order.
        // (Both `inf` when no cut fits.)
        let least = least_bottleneck(&chain).unwrap();
        if brute.is_infinite() {
            assert!(least.is_infinite(), "{least} where no cut fits");
        } else {
            assert!((least - brute).abs() < 1e-12, "{least} against {brute}");
        }
        // Under the bound, the least number of sends is the most units per stage: any cut that
        // meets it has stages - 1 sends; the programme finds one iff one exists.
        let meets = fitting.iter().filter(|c| slowest(c) <= bound).count();
        let found = least_cuts(&chain, bound).unwrap();
        assert_eq!(found.is_some(), meets > 0, "stages {stages}, limit {limit}");
        if let Some(cuts) = found {
            assert!(fitting.contains(&cuts) && slowest(&cuts) <= bound);
        }
    }

    #[test]
    fn the_programmes_agree_with_every_cut() {
        for stages in 1..=UNITS.len() {
            for limit in [4.0, 8.0, 100.0] {
                for bound in [6.0, 9.0, 12.0, 30.0] {
                    against_brute_force(stages, limit, bound);
                }
            }
        }
    }

    #[test]
    fn bad_sizes_are_refused() {
        let chain = Chain {
            times: &[0.0; 4],
            edge: &[0.0; 2],
            parameters: &[0.0; 3],
            activations: &[0.0; 4],
            flights: &[1.0],
            buffer: 0.0,
            limit: 1.0,
        };
        assert!(least_cuts(&chain, 1.0).is_err());
        assert!(least_bottleneck(&chain).is_err());
    }
}
