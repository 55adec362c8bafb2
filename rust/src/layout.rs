//! Tensor layouts in MindSpore's convention (docs/conventions.md#layouts): a device matrix listed
//! outermost first, device dim 0 innermost, a tensor map giving each tensor dim the device dim it
//! is split along (or -1), and the device dims along which the devices hold partial sums (addends
//! of the tensor, as a contraction over a split axis leaves them) rather than copies.

use std::fmt;

use crate::error::{Error, Result};

/// How a tensor is spread over the devices. Immutable once validated.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<u64>,
    device_matrix: Vec<u64>,
    tensor_map: Vec<i64>,
    /// Device dims holding partial sums, ascending; none of them is in the tensor map.
    partial: Vec<usize>,
    /// The device dims below 64 the tensor map uses, bit `k` for dim `k`: a function of the map,
    /// kept with it so that the cost kernels ask [`Layout::uses`] in one instruction.
    used: u64,
}

/// The bit of device dim `k` in a mask of device dims (none for a dim past 63, which the masks
/// leave to a scan of the map).
fn dim_bit(k: i64) -> u64 {
    u64::try_from(k)
        .ok()
        .and_then(|k| 1u64.checked_shl(u32::try_from(k).ok()?))
        .unwrap_or(0)
}

/// The mask of the device dims a tensor map uses ([`Layout::used`]).
fn used_mask(tensor_map: &[i64]) -> u64 {
    tensor_map.iter().fold(0, |mask, &k| mask | dim_bit(k))
}

// The mask is the map's, seen another way: error messages show the layout as it was given.
#[allow(clippy::missing_fields_in_debug)]
impl fmt::Debug for Layout {
    /// The layout's parts, without the mask derived from them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layout")
            .field("shape", &self.shape)
            .field("device_matrix", &self.device_matrix)
            .field("tensor_map", &self.tensor_map)
            .field("partial", &self.partial)
            .finish()
    }
}

/// `log2(x)` for a power of two.
pub(crate) fn log2(x: u64) -> u32 {
    debug_assert!(x.is_power_of_two());
    x.trailing_zeros()
}

impl Layout {
    /// Validates and builds a layout.
    ///
    /// # Errors
    /// [`Error::Layout`] when the lengths differ, a device-matrix entry is not a positive power of
    /// two, a map entry is out of range or used twice, a dim is not positive, or a split does not
    /// divide its dim.
    pub fn new(shape: Vec<u64>, device_matrix: Vec<u64>, tensor_map: Vec<i64>) -> Result<Self> {
        Self::with_partial(shape, device_matrix, tensor_map, Vec::new())
    }

    /// [`Layout::new`] of a tensor held as partial sums along the device dims `partial`: the
    /// devices that differ only in those coordinates hold addends whose sum is the tensor.
    ///
    /// # Errors
    /// As [`Layout::new`], and [`Error::Layout`] when a partial dim is out of range, listed twice,
    /// or also in the tensor map (a device dim splits a tensor dim or holds partial sums, not both).
    pub fn with_partial(
        shape: Vec<u64>,
        device_matrix: Vec<u64>,
        tensor_map: Vec<i64>,
        mut partial: Vec<usize>,
    ) -> Result<Self> {
        let h = device_matrix.len();
        let listed = partial.clone();
        partial.sort_unstable();
        if let Some(&k) = partial.iter().find(|&&k| k >= h) {
            return Err(Error::Layout(format!(
                "partial {listed:?}: {k} is not a device dim of the {h}-dim device matrix \
                 {device_matrix:?}"
            )));
        }
        if partial.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::Layout(format!(
                "partial {listed:?} lists a device dim twice"
            )));
        }
        if let Some(&k) = partial.iter().find(|&&k| tensor_map.contains(&(k as i64))) {
            return Err(Error::Layout(format!(
                "device dim {k} both splits a tensor dim (tensor map {tensor_map:?}) and holds \
                 partial sums (partial {listed:?})"
            )));
        }
        let layout = Layout {
            used: used_mask(&tensor_map),
            shape,
            device_matrix,
            tensor_map,
            partial,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// An empty layout (a scalar on one device) whose buffers [`Layout::refill`] reuses.
    pub(crate) fn scratch() -> Self {
        Layout {
            shape: Vec::new(),
            device_matrix: Vec::new(),
            tensor_map: Vec::new(),
            partial: Vec::new(),
            used: 0,
        }
    }

    /// Refills the layout's buffers with `fill` and validates the result as [`Layout::new`] does:
    /// a kernel that builds a layout per item allocates once. After an error the layout is invalid
    /// and must be refilled before any other use.
    pub(crate) fn refill(
        &mut self,
        fill: impl FnOnce(&mut Vec<u64>, &mut Vec<u64>, &mut Vec<i64>) -> Result<()>,
    ) -> Result<()> {
        let mut filled = Ok(());
        self.fill_parts(|shape, matrix, map, _| filled = fill(shape, matrix, map));
        filled?;
        self.validate()
    }

    /// [`Layout::refill`] of the shape and map alone, on the same device matrix: what a kernel
    /// pricing every tensor of one strategy changes between tensors.
    pub(crate) fn refill_tensor(
        &mut self,
        fill: impl FnOnce(&mut Vec<u64>, &mut Vec<i64>) -> Result<()>,
    ) -> Result<()> {
        self.shape.clear();
        self.tensor_map.clear();
        fill(&mut self.shape, &mut self.tensor_map)?;
        self.used = used_mask(&self.tensor_map);
        self.check_lengths()?;
        self.validate_tensor()
    }

    fn validate(&self) -> Result<()> {
        self.check_lengths()?;
        let device_matrix = &self.device_matrix;
        if let Some(d) = device_matrix.iter().find(|d| !d.is_power_of_two()) {
            return Err(Error::Layout(format!(
                "device matrix {device_matrix:?}: entry {d} is not a positive power of two"
            )));
        }
        if device_matrix
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(Error::Layout(format!(
                "device matrix {device_matrix:?} has too many devices"
            )));
        }
        self.validate_tensor()
    }

    fn check_lengths(&self) -> Result<()> {
        let (shape, tensor_map) = (&self.shape, &self.tensor_map);
        if shape.len() == tensor_map.len() {
            Ok(())
        } else {
            Err(Error::Layout(format!(
                "tensor map {tensor_map:?} has {} entries but shape {shape:?} has {} dims",
                tensor_map.len(),
                shape.len()
            )))
        }
    }

    /// The checks of the shape and map against a valid device matrix.
    fn validate_tensor(&self) -> Result<()> {
        let Layout {
            shape,
            device_matrix,
            tensor_map,
            ..
        } = self;
        if let Some(s) = shape.iter().find(|&&s| s == 0) {
            return Err(Error::Layout(format!(
                "shape {shape:?}: dim of size {s} is not positive"
            )));
        }
        if shape
            .iter()
            .try_fold(1u64, |acc, &s| acc.checked_mul(s))
            .is_none()
        {
            return Err(Error::Layout(format!(
                "shape {shape:?} has too many elements"
            )));
        }
        let h = device_matrix.len() as i64;
        for (i, &m) in tensor_map.iter().enumerate() {
            if m < -1 || m >= h {
                return Err(Error::Layout(format!(
                    "tensor map {tensor_map:?}: entry {m} of dim {i} is not -1 or a device dim \
                     of the {h}-dim device matrix {device_matrix:?}"
                )));
            }
            if m >= 0 && tensor_map[..i].contains(&m) {
                return Err(Error::Layout(format!(
                    "tensor map {tensor_map:?}: device dim {m} is used by more than one tensor dim"
                )));
            }
        }
        for i in 0..shape.len() {
            let g = self.split_degree(i);
            // `g` is a power of two: `shape[i] % g` as a mask.
            if shape[i] & (g - 1) != 0 {
                return Err(Error::Layout(format!(
                    "dim {i} of shape {shape:?} (size {}) cannot be split {g} ways along device \
                     dim {}",
                    shape[i], tensor_map[i]
                )));
            }
        }
        Ok(())
    }

    #[must_use]
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    #[must_use]
    pub fn device_matrix(&self) -> &[u64] {
        &self.device_matrix
    }

    #[must_use]
    pub fn tensor_map(&self) -> &[i64] {
        &self.tensor_map
    }

    /// The device dims holding partial sums, ascending.
    #[must_use]
    pub fn partial(&self) -> &[usize] {
        &self.partial
    }

    /// Whether the devices along device dim `k` hold distinct data: blocks of a split tensor dim
    /// or addends of a partial sum (not copies).
    #[must_use]
    #[inline]
    pub fn distinct_along(&self, k: usize) -> bool {
        self.uses(k) || self.partial.contains(&k)
    }

    /// Number of tensor dims.
    #[must_use]
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of device dims.
    #[must_use]
    pub fn num_device_dims(&self) -> usize {
        self.device_matrix.len()
    }

    /// `d_k`, the size of device dim `k` (0 innermost). Panics if `k` is out of range.
    #[must_use]
    pub fn dim_size(&self, k: usize) -> u64 {
        self.device_matrix[self.device_matrix.len() - 1 - k]
    }

    #[must_use]
    pub fn num_devices(&self) -> u64 {
        self.device_matrix.iter().product()
    }

    #[must_use]
    pub fn num_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The number of blocks tensor dim `i` is split into (1 if it is not split).
    #[must_use]
    pub fn split_degree(&self, i: usize) -> u64 {
        match self.tensor_map[i] {
            -1 => 1,
            k => self.dim_size(k as usize),
        }
    }

    /// The device dims below 64 some tensor dim is split along (a mask).
    #[must_use]
    #[inline]
    pub(crate) fn used_dims(&self) -> u64 {
        self.used
    }

    /// Whether some tensor dim is split along device dim `k`.
    #[must_use]
    #[inline]
    pub fn uses(&self, k: usize) -> bool {
        if k < 64 {
            self.used >> k & 1 == 1
        } else {
            self.tensor_map.contains(&(k as i64))
        }
    }

    /// The tensor dim split along device dim `k`, if any.
    #[must_use]
    pub fn tensor_dim_on(&self, k: usize) -> Option<usize> {
        self.tensor_map.iter().position(|&m| m == k as i64)
    }

    #[must_use]
    pub fn shard_shape(&self) -> Vec<u64> {
        (0..self.ndim())
            .map(|i| self.shape[i] / self.split_degree(i))
            .collect()
    }

    /// Elements each device holds.
    #[must_use]
    pub fn shard_size(&self) -> u64 {
        // Split degrees are powers of two: a shift, not a division, in the cost kernels' hot loop.
        (0..self.ndim())
            .map(|i| self.shape[i] >> self.split_degree(i).trailing_zeros())
            .product()
    }

    /// Coordinate of `rank` along device dim `k`.
    #[must_use]
    pub fn coordinate(&self, rank: u64, k: usize) -> u64 {
        let inner: u64 = (0..k).map(|j| self.dim_size(j)).product();
        (rank / inner) % self.dim_size(k)
    }

    /// The half-open range of every tensor dim that `rank` holds.
    ///
    /// # Errors
    /// [`Error::Layout`] if `rank` is not a device of this layout.
    pub fn shard_index(&self, rank: u64) -> Result<Vec<(u64, u64)>> {
        if rank >= self.num_devices() {
            return Err(Error::Layout(format!(
                "rank {rank} is not one of the {} devices of the layout",
                self.num_devices()
            )));
        }
        let shard = self.shard_shape();
        Ok((0..self.ndim())
            .map(|i| match self.tensor_map[i] {
                -1 => (0, self.shape[i]),
                k => {
                    let start = self.coordinate(rank, k as usize) * shard[i];
                    (start, start + shard[i])
                }
            })
            .collect())
    }

    /// The bit range `[lo, hi)` of the rank that device dim `k` occupies.
    #[must_use]
    pub(crate) fn bit_range(&self, k: usize) -> (u32, u32) {
        let lo: u32 = (0..k).map(|j| log2(self.dim_size(j))).sum();
        (lo, lo + log2(self.dim_size(k)))
    }

    /// A layout from parts the caller has already made consistent (derived from valid layouts).
    pub(crate) fn from_parts(
        shape: Vec<u64>,
        device_matrix: Vec<u64>,
        tensor_map: Vec<i64>,
        partial: Vec<usize>,
    ) -> Self {
        let layout = Layout {
            used: used_mask(&tensor_map),
            shape,
            device_matrix,
            tensor_map,
            partial,
        };
        layout.debug_check();
        layout
    }

    /// Refills the layout's buffers with parts `fill` has already made consistent (derived from
    /// valid layouts): [`Layout::from_parts`] without allocating, for the cost kernels.
    pub(crate) fn set_parts(
        &mut self,
        fill: impl FnOnce(&mut Vec<u64>, &mut Vec<u64>, &mut Vec<i64>, &mut Vec<usize>),
    ) {
        self.fill_parts(fill);
        self.debug_check();
    }

    /// Clears the layout's buffers, has `fill` fill them, and sets the mask of the map: checked
    /// by the caller.
    fn fill_parts(
        &mut self,
        fill: impl FnOnce(&mut Vec<u64>, &mut Vec<u64>, &mut Vec<i64>, &mut Vec<usize>),
    ) {
        self.shape.clear();
        self.device_matrix.clear();
        self.tensor_map.clear();
        self.partial.clear();
        fill(
            &mut self.shape,
            &mut self.device_matrix,
            &mut self.tensor_map,
            &mut self.partial,
        );
        self.used = used_mask(&self.tensor_map);
    }

    /// In debug builds, that parts said to be consistent are.
    fn debug_check(&self) {
        debug_assert!(self.validate().is_ok());
        debug_assert!(self.partial.windows(2).all(|w| w[0] < w[1]));
    }

    /// The same layout with another tensor map, for maps the planner derives from a valid one.
    pub(crate) fn with_map(&self, tensor_map: Vec<i64>) -> Layout {
        self.with_state(tensor_map, self.partial.clone())
    }

    /// The same shape and device matrix with another map and partial set, derived from a valid
    /// layout by a redistribution step.
    pub(crate) fn with_state(&self, tensor_map: Vec<i64>, partial: Vec<usize>) -> Layout {
        debug_assert_eq!(tensor_map.len(), self.ndim());
        Layout::from_parts(
            self.shape.clone(),
            self.device_matrix.clone(),
            tensor_map,
            partial,
        )
    }
}

/// A valid layout from literals, for the tests of every module.
#[cfg(test)]
pub(crate) fn layout(shape: &[u64], device_matrix: &[u64], tensor_map: &[i64]) -> Layout {
    Layout::new(shape.to_vec(), device_matrix.to_vec(), tensor_map.to_vec()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_index_follows_innermost_first_coordinates() {
        // [2, 4]: dim 0 has 4 devices (inner), dim 1 has 2. Rank 5 = (c1 = 1, c0 = 1).
        let l = Layout::new(vec![8, 12], vec![2, 4], vec![1, 0]).unwrap();
        assert_eq!(l.shard_shape(), vec![4, 3]);
        assert_eq!(l.shard_index(5).unwrap(), vec![(4, 8), (3, 6)]);
        assert_eq!(l.bit_range(0), (0, 2));
        assert_eq!(l.bit_range(1), (2, 3));
    }

    #[test]
    fn rejects_bad_layouts() {
        for (shape, dm, map) in [
            (vec![8], vec![3], vec![0]),
            (vec![8], vec![0], vec![0]),
            (vec![8, 8], vec![2, 2], vec![0, 0]),
            (vec![8], vec![2], vec![1]),
            (vec![8], vec![2], vec![0, -1]),
            (vec![6], vec![4], vec![0]),
            (vec![0], vec![2], vec![-1]),
        ] {
            assert!(matches!(Layout::new(shape, dm, map), Err(Error::Layout(_))));
        }
        for partial in [vec![2], vec![0, 0], vec![1]] {
            assert!(matches!(
                Layout::with_partial(vec![8], vec![2, 2], vec![1], partial),
                Err(Error::Layout(_))
            ));
        }
        let l = Layout::with_partial(vec![8], vec![2, 2, 2], vec![1], vec![2, 0]).unwrap();
        assert_eq!(l.partial(), &[0, 2]);
        assert!(l.distinct_along(0) && l.distinct_along(1) && !l.uses(0));
    }
}
