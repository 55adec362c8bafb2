//! The layout classes of the search's cost tables: the candidates of one end of an edge that give
//! its tensor the same distributions share a class, and the edge is priced once per class pair.

use rayon::prelude::*;

use crate::batch::dedupe;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::unify::compacted;

/// One end's classes: each candidate's class, and per class (numbered in the order first met)
/// its forward layout and, with a backward direction, its gradient's, both compacted.
#[derive(Debug, Clone, PartialEq)]
pub struct Classes {
    pub class: Vec<usize>,
    pub forward: Vec<Layout>,
    pub backward: Option<Vec<Layout>>,
}

/// The classes of candidates whose layouts are `forward` (and, in the training step, whose
/// gradients are `backward`, one per candidate): two candidates share a class iff their layouts'
/// compacted forms ([`compacted`]: the form Algorithm 1 plans, which merges no tensor dims) are
/// equal in each direction. Compacted on all cores; a gradient equal to its layout (no partial
/// sums) is compacted once.
///
/// # Errors
/// [`Error::Shape`] if `backward` does not hold one layout per candidate.
pub fn layout_classes(forward: &[&Layout], backward: Option<&[&Layout]>) -> Result<Classes> {
    if let Some(b) = backward.filter(|b| b.len() != forward.len()) {
        return Err(Error::Shape(format!(
            "{} gradients for {} candidates",
            b.len(),
            forward.len()
        )));
    }
    let keys: Vec<(Layout, Option<Layout>)> = forward
        .par_iter()
        .enumerate()
        .map(|(i, &f)| {
            let ahead = compacted(f);
            let back = backward.map(|b| {
                if b[i] == f {
                    ahead.clone()
                } else {
                    compacted(b[i])
                }
            });
            (ahead, back)
        })
        .collect();
    let (distinct, class) = dedupe(&keys);
    let mut classes = Classes {
        class,
        forward: Vec::with_capacity(distinct.len()),
        backward: backward.map(|_| Vec::with_capacity(distinct.len())),
    };
    for (ahead, back) in distinct {
        classes.forward.push(ahead.clone());
        if let (Some(out), Some(back)) = (classes.backward.as_mut(), back) {
            out.push(back.clone());
        }
    }
    Ok(classes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::layout;

    /// The classes written plainly: every layout compacted, the pairs numbered as first met.
    fn plain(forward: &[&Layout], backward: Option<&[&Layout]>) -> Classes {
        let mut rows: Vec<(Layout, Option<Layout>)> = Vec::new();
        let mut class = Vec::new();
        for (i, f) in forward.iter().enumerate() {
            let key = (compacted(f), backward.map(|b| compacted(b[i])));
            class.push(rows.iter().position(|r| *r == key).unwrap_or_else(|| {
                rows.push(key);
                rows.len() - 1
            }));
        }
        Classes {
            class,
            forward: rows.iter().map(|r| r.0.clone()).collect(),
            backward: backward.map(|_| rows.iter().map(|r| r.1.clone().unwrap()).collect()),
        }
    }

    #[test]
    fn classes_are_the_compacted_pairs_first_met() {
        // [8, 6] on 2 x 4 devices: one distribution written with a size-1 dim and a matrix cut
        // where nothing needs it compacts to the plain one; gradients with partial sums apart.
        let a = layout(&[8, 6], &[2, 4], &[1, -1]);
        let b = layout(&[8, 1, 6], &[2, 2, 2], &[2, -1, -1]);
        let c = layout(&[8, 6], &[2, 4], &[-1, 1]);
        let pa = Layout::with_partial(vec![8, 6], vec![2, 4], vec![1, -1], vec![0]).unwrap();
        let pc = Layout::with_partial(vec![8, 6], vec![2, 4], vec![-1, 1], vec![0]).unwrap();
        assert_eq!(compacted(&a), compacted(&b));
        let forward = [&a, &b, &c, &a, &c, &b];
        let backward = [&a, &b, &pc, &pa, &c, &a];
        for backward in [None, Some(&backward[..])] {
            let got = layout_classes(&forward, backward).unwrap();
            assert_eq!(got, plain(&forward, backward));
        }
        let got = layout_classes(&forward, Some(&backward)).unwrap();
        assert_eq!(got.class, [0, 0, 1, 2, 3, 0]);
        assert_eq!(
            layout_classes(&forward, None).unwrap().class,
            [0, 0, 1, 0, 1, 0]
        );
        assert!(layout_classes(&forward, Some(&backward[1..])).is_err());
    }
}
