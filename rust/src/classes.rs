//! The layout classes of the search's cost tables: the candidates of one end of an edge that give
//! its tensor the same distributions share a class, and the edge is priced once per class pair.

use std::borrow::Cow;

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

/// One direction of an end's candidates: each candidate's layout and, optionally, the device
/// dims along which it holds partial sums instead (the partial outputs and the gradients: built
/// here, not as one Python object each).
#[derive(Debug, Clone, Copy)]
pub struct Direction<'a> {
    pub layouts: &'a [&'a Layout],
    /// Per candidate a row of `width` entries, each a device dim or negative (none); a row with
    /// none leaves the layout as it is. (`width` entries a row, `layouts.len()` rows.)
    pub partial: Option<(&'a [i64], usize)>,
}

impl<'a> Direction<'a> {
    /// The layouts as they are.
    #[must_use]
    pub fn of(layouts: &'a [&'a Layout]) -> Self {
        Direction {
            layouts,
            partial: None,
        }
    }

    /// Candidate `i`'s layout, with its row's partial dims if it has any.
    fn layout(&self, i: usize) -> Result<Cow<'a, Layout>> {
        let l = self.layouts[i];
        let Some((dims, width)) = self.partial else {
            return Ok(Cow::Borrowed(l));
        };
        let partial: Vec<usize> = dims[i * width..(i + 1) * width]
            .iter()
            .filter_map(|&k| usize::try_from(k).ok())
            .collect();
        if partial.is_empty() {
            return Ok(Cow::Borrowed(l));
        }
        Ok(Cow::Owned(Layout::with_partial(
            l.shape().to_vec(),
            l.device_matrix().to_vec(),
            l.tensor_map().to_vec(),
            partial,
        )?))
    }

    fn check(&self, n: usize, what: &str) -> Result<()> {
        if self.layouts.len() != n {
            return Err(Error::Shape(format!(
                "{} {what} for {n} candidates",
                self.layouts.len()
            )));
        }
        match self.partial {
            Some((dims, width)) if dims.len() != n * width => Err(Error::Shape(format!(
                "{} partial dims for {n} candidates' {what}, {width} each",
                dims.len()
            ))),
            _ => Ok(()),
        }
    }
}

/// The classes of candidates whose layouts are `forward` (and, in the training step, whose
/// gradients are `backward`, one per candidate), each with its partial dims if given: two
/// candidates share a class iff their layouts' compacted forms ([`compacted`]: the form
/// Algorithm 1 plans, which merges no tensor dims) are equal in each direction. Compacted on all
/// cores; a gradient equal to its layout (no partial sums) is compacted once.
///
/// # Errors
/// [`Error::Shape`] if `backward` does not hold one layout per candidate or a direction's partial
/// dims one row per candidate; [`Error::Layout`] if a row's dims do not fit its layout
/// ([`Layout::with_partial`]).
pub fn layout_classes(forward: Direction<'_>, backward: Option<Direction<'_>>) -> Result<Classes> {
    let n = forward.layouts.len();
    forward.check(n, "layouts")?;
    if let Some(b) = &backward {
        b.check(n, "gradients")?;
    }
    let keys: Vec<(Layout, Option<Layout>)> = (0..n)
        .into_par_iter()
        .map(|i| {
            let f = forward.layout(i)?;
            let ahead = compacted(&f);
            let back = match &backward {
                None => None,
                Some(b) => {
                    let b = b.layout(i)?;
                    Some(if *b == *f {
                        ahead.clone()
                    } else {
                        compacted(&b)
                    })
                }
            };
            Ok((ahead, back))
        })
        .collect::<Result<_>>()?;
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
            let got = layout_classes(Direction::of(&forward), backward.map(Direction::of));
            assert_eq!(got.unwrap(), plain(&forward, backward));
        }
        let got = layout_classes(Direction::of(&forward), Some(Direction::of(&backward))).unwrap();
        assert_eq!(got.class, [0, 0, 1, 2, 3, 0]);
        assert_eq!(
            layout_classes(Direction::of(&forward), None).unwrap().class,
            [0, 0, 1, 0, 1, 0]
        );
        let short = Direction::of(&backward[1..]);
        assert!(layout_classes(Direction::of(&forward), Some(short)).is_err());
    }

    #[test]
    fn partial_dims_are_the_layouts_built_with_them() {
        // [8, 6] on 2 x 2 x 2 devices, each layout given with rows of partial dims (-1: none)
        // in either direction: the classes of the layouts built with those dims first.
        let a = layout(&[8, 6], &[2, 2, 2], &[1, -1]);
        let c = layout(&[8, 6], &[2, 2, 2], &[-1, 0]);
        let forward = [&a, &c, &a, &c, &a, &a];
        let rows: [i64; 12] = [-1, -1, 1, -1, 0, 2, -1, 2, 2, -1, -1, -1];
        let built: Vec<Layout> = forward
            .iter()
            .zip(rows.chunks(2))
            .map(|(l, row)| {
                let dims: Vec<usize> = row
                    .iter()
                    .filter_map(|&k| usize::try_from(k).ok())
                    .collect();
                let (shape, dm) = (l.shape().to_vec(), l.device_matrix().to_vec());
                Layout::with_partial(shape, dm, l.tensor_map().to_vec(), dims).unwrap()
            })
            .collect();
        let built: Vec<&Layout> = built.iter().collect();
        let partial = Direction {
            layouts: &forward,
            partial: Some((&rows, 2)),
        };
        let got = layout_classes(partial, Some(Direction::of(&forward))).unwrap();
        assert_eq!(got, plain(&built, Some(&forward)));
        let got = layout_classes(Direction::of(&forward), Some(partial)).unwrap();
        assert_eq!(got, plain(&forward, Some(&built)));
        assert_eq!(got.class, [0, 1, 2, 3, 4, 0]);
        // A dim the map splits cannot also hold partial sums; rows must fit the layouts.
        let split = Direction {
            layouts: &forward,
            partial: Some((&[1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1], 2)),
        };
        assert!(layout_classes(split, None).is_err());
        let short = Direction {
            layouts: &forward,
            partial: Some((&rows[2..], 2)),
        };
        assert!(layout_classes(short, None).is_err());
    }
}
