//! The dynamic programmes of the stage search over cuts (docs/pipeline.md): a chain of `n` units
//! cut into `stages` runs, stage `k` covering units `a..b`. Its costs come as dense row-major
//! matrices over the `n + 1` cut points, `inf` where a run cannot be a stage. The results are
//! numpy's to the bit (the search's numpy code computed them before): the same sums, the same
//! minimum, the first of equal choices.

use crate::error::{Error, Result};

/// Checks that `matrices` holds `count` square matrices over `points` cut points.
fn check(what: &str, len: usize, count: usize, points: usize) -> Result<()> {
    if points < 2 || len != count * points * points {
        return Err(Error::Shape(format!(
            "{what}: {len} entries are not {count} square matrices over {points} cut points \
             (at least 2)"
        )));
    }
    Ok(())
}

/// The cuts of least total `paid` whose stages all take at most `bound`: `paid[k][a][b]` is
/// what stage `k` costs covering units `a..b` (`inf` where it may not), `times[a][b]` its time,
/// and a stage of time over `bound` is not allowed. Returns the `stages + 1` cut points
/// `0 = c_0 < ... < c_K = n`, or `None` when no cuts meet the bound. Among equal totals the
/// programme keeps, for every stage end, the first start.
///
/// # Errors
/// [`Error::Shape`] when the matrices' sizes do not fit `stages` and `points`.
pub fn least_cuts(
    paid: &[f64],
    times: &[f64],
    stages: usize,
    points: usize,
    bound: f64,
) -> Result<Option<Vec<usize>>> {
    check("least_cuts: paid", paid.len(), stages, points)?;
    check("least_cuts: times", times.len(), 1, points)?;
    let mut best = vec![f64::INFINITY; points];
    best[0] = 0.0;
    let mut next = vec![0.0; points];
    let mut back = vec![0usize; stages * points];
    for k in 0..stages {
        let stage = &paid[k * points * points..(k + 1) * points * points];
        for b in 0..points {
            let (mut least, mut at) = (f64::INFINITY, 0usize);
            let mut first = true;
            for a in 0..points {
                let cost = if times[a * points + b] > bound {
                    f64::INFINITY
                } else {
                    stage[a * points + b]
                };
                let c = best[a] + cost;
                // numpy's argmin: the first least (inf ties keep the first index).
                if first || c < least {
                    (least, at, first) = (c, a, false);
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

/// The least, over every cut into `stages` runs that all fit (`fits[k][a][b]`), of the slowest
/// stage's time (`times[a][b]`): the least bound any cuts meet (`inf` if none fit).
///
/// # Errors
/// [`Error::Shape`] when the matrices' sizes do not fit `stages` and `points`.
pub fn least_bottleneck(fits: &[bool], times: &[f64], stages: usize, points: usize) -> Result<f64> {
    check("least_bottleneck: fits", fits.len(), stages, points)?;
    check("least_bottleneck: times", times.len(), 1, points)?;
    let mut best = vec![f64::INFINITY; points];
    best[0] = 0.0;
    let mut next = vec![0.0; points];
    for k in 0..stages {
        let fit = &fits[k * points * points..(k + 1) * points * points];
        for (b, slot) in next.iter_mut().enumerate() {
            let mut least = f64::INFINITY;
            for a in 0..points {
                if fit[a * points + b] {
                    least = least.min(best[a].max(times[a * points + b]));
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

    /// A chain of units with the given times, every stage paying its time.
    fn chain(units: &[f64], stages: usize) -> (Vec<f64>, Vec<f64>) {
        let points = units.len() + 1;
        let mut times = vec![f64::INFINITY; points * points];
        for a in 0..points {
            for b in (a + 1)..points {
                times[a * points + b] = units[a..b].iter().sum();
            }
        }
        let paid = times.repeat(stages);
        (paid, times)
    }

    #[test]
    fn the_bottleneck_is_the_least_slowest_stage_of_every_cut() {
        let units = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0];
        for k in 1..=units.len() {
            let (_, times) = chain(&units, k);
            let fits = vec![true; k * (units.len() + 1).pow(2)];
            let got = least_bottleneck(&fits, &times, k, units.len() + 1).unwrap();
            let brute = all_cuts(units.len(), k)
                .iter()
                .map(|c| {
                    c.windows(2)
                        .map(|w| units[w[0]..w[1]].iter().sum::<f64>())
                        .fold(0.0, f64::max)
                })
                .fold(f64::INFINITY, f64::min);
            assert!((got - brute).abs() < 1e-12, "k {k}: {got} vs {brute}");
        }
    }

    #[test]
    fn the_cuts_meet_the_bound_or_there_are_none() {
        let units = [3.0, 1.0, 4.0, 1.0, 5.0];
        let (paid, times) = chain(&units, 2);
        let cuts = least_cuts(&paid, &times, 2, 6, 8.0).unwrap().unwrap();
        assert_eq!(cuts.len(), 3);
        for w in cuts.windows(2) {
            assert!(units[w[0]..w[1]].iter().sum::<f64>() <= 8.0);
        }
        assert_eq!(least_cuts(&paid, &times, 2, 6, 6.0).unwrap(), None);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(least_cuts(&[0.0; 8], &[0.0; 4], 1, 2, 1.0).is_err());
        assert!(least_bottleneck(&[true; 3], &[0.0; 4], 1, 2).is_err());
    }
}
