//! Batch cost kernels for the search: many layout pairs at once, on all cores.

use rayon::prelude::*;

use crate::error::Result;
use crate::layout::Layout;
use crate::planner::plan_redistribution;
use crate::topology::{Cluster, CostModel};

/// The row-major `sources.len() x targets.len()` matrix of redistribution costs.
///
/// # Errors
/// The first error of any pair (layouts of different tensors, or not on the cluster).
pub fn redistribution_costs(
    sources: &[Layout],
    targets: &[Layout],
    cluster: &Cluster,
    dtype_bytes: f64,
    model: CostModel,
) -> Result<Vec<f64>> {
    for layout in sources.iter().chain(targets) {
        cluster.check(layout)?;
    }
    let rows: Vec<Vec<f64>> = sources
        .par_iter()
        .map(|a| {
            targets
                .iter()
                .map(|b| plan_redistribution(a, b)?.cost(cluster, dtype_bytes, model))
                .collect()
        })
        .collect::<Result<_>>()?;
    Ok(rows.concat())
}
