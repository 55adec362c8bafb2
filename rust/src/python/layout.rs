//! Layouts: the `Layout` class and `unify`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::OnceLock;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::convert::{listed, signed_list, unsigned_list, Num};
use crate::classes;
use crate::error::Error;
use crate::layout::Layout;
use crate::unify as unification;

/// How a tensor is spread over the devices: its shape, the device matrix (outermost dim first,
/// device dim 0 innermost), the tensor map (per tensor dim, the device dim it is split along, or
/// -1) and the device dims `partial` along which the devices hold partial sums rather than copies.
/// See docs/conventions.md#layouts. Immutable, hashable, picklable.
#[pyclass(frozen, eq, module = "taps", name = "Layout")]
#[derive(Clone)]
pub struct PyLayout {
    pub(super) inner: Layout,
    /// The hash, worked out on first use: the search keys dicts and sets by layouts, hashing
    /// each many times (hashing the parts each time cost about 250 ns a lookup).
    hash: OnceLock<u64>,
}

impl PartialEq for PyLayout {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

impl From<Layout> for PyLayout {
    fn from(inner: Layout) -> Self {
        PyLayout {
            inner,
            hash: OnceLock::new(),
        }
    }
}

#[pymethods]
impl PyLayout {
    /// The hash of the layout's parts (what `#[pyclass(hash)]` gives, so sets of layouts keep
    /// their order), once.
    fn __hash__(&self) -> u64 {
        *self.hash.get_or_init(|| {
            let mut hasher = DefaultHasher::new();
            self.inner.hash(&mut hasher);
            hasher.finish()
        })
    }

    #[new]
    #[pyo3(signature = (shape, device_matrix, tensor_map, partial=Vec::new()))]
    fn new(
        shape: Vec<Num<i64>>,
        device_matrix: Vec<Num<i64>>,
        tensor_map: Vec<Num<i64>>,
        partial: Vec<Num<i64>>,
    ) -> PyResult<Self> {
        let shape = unsigned_list(&shape, "shape", "a positive size", Error::Layout)?;
        let dm = unsigned_list(
            &device_matrix,
            "device matrix",
            "a positive power of two",
            Error::Layout,
        )?;
        let map = signed_list(&tensor_map, "tensor map", Error::Layout)?;
        let partial = signed_list(&partial, "partial", Error::Layout)?
            .into_iter()
            .map(|k| {
                usize::try_from(k).map_err(|_| {
                    Error::Layout(format!(
                        "partial {}: entry {k} is not a device dim (0 innermost)",
                        listed(&partial)
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Layout::with_partial(shape, dm, map, partial)?.into())
    }

    /// The device dims along which the devices hold partial sums (ascending): the devices that
    /// differ only there hold addends whose sum is the tensor.
    #[getter]
    fn partial(&self) -> Vec<usize> {
        self.inner.partial().to_vec()
    }

    /// The global shape of the tensor.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.inner.shape().to_vec()
    }

    /// The device matrix, outermost dim first: the last entry is device dim 0.
    #[getter]
    fn device_matrix(&self) -> Vec<u64> {
        self.inner.device_matrix().to_vec()
    }

    /// Per tensor dim, the device dim it is split along (0 innermost), or -1 if it is whole.
    #[getter]
    fn tensor_map(&self) -> Vec<i64> {
        self.inner.tensor_map().to_vec()
    }

    /// The shape of the block each device holds.
    #[getter]
    fn shard_shape(&self) -> Vec<u64> {
        self.inner.shard_shape()
    }

    /// The number of devices: the product of the device matrix.
    #[getter]
    fn num_devices(&self) -> u64 {
        self.inner.num_devices()
    }

    /// Per tensor dim, the half-open `(start, stop)` range that `rank` holds.
    fn shard_index(&self, rank: Num<i64>) -> PyResult<Vec<(u64, u64)>> {
        let rank = rank.unsigned("rank", "a device rank (at least 0)", Error::Layout)?;
        Ok(self.inner.shard_index(rank)?)
    }

    /// `d_k`, the size of device dim `k` (0 innermost).
    fn device_dim_size(&self, k: Num<i64>) -> PyResult<u64> {
        let k = k.get("k", Error::Layout)?;
        match usize::try_from(k) {
            Ok(k) if k < self.inner.num_device_dims() => Ok(self.inner.dim_size(k)),
            _ => Err(Error::Layout(format!(
                "device dim {k} is not one of the {} dims of {:?}",
                self.inner.num_device_dims(),
                self.inner.device_matrix()
            ))
            .into()),
        }
    }

    /// The canonical form, a reshape that moves nothing: two layouts of one tensor hold the same
    /// elements (and partial sums) on every rank iff their normal forms are equal.
    fn normalized(&self) -> PyLayout {
        unification::normalized(&self.inner).into()
    }

    /// The same tensor dims (size-1 dims dropped) with the device matrix cut only where a split or
    /// a partial dim needs it: layouts with equal compacted forms hold the same elements and get
    /// the same plans from Algorithm 1, so the search prices one of them for all.
    fn compacted(&self) -> PyLayout {
        unification::compacted(&self.inner).into()
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        let partial = if l.partial().is_empty() {
            String::new()
        } else {
            format!(", partial={:?}", l.partial())
        };
        format!(
            "Layout(shape={:?}, device_matrix={:?}, tensor_map={:?}{partial})",
            l.shape(),
            l.device_matrix(),
            l.tensor_map()
        )
    }

    fn __reduce__(
        slf: &Bound<'_, Self>,
    ) -> PyResult<(Py<PyAny>, (Vec<u64>, Vec<u64>, Vec<i64>, Vec<usize>))> {
        let l = &slf.get().inner;
        Ok((
            slf.get_type().into_any().unbind(),
            (
                l.shape().to_vec(),
                l.device_matrix().to_vec(),
                l.tensor_map().to_vec(),
                l.partial().to_vec(),
            ),
        ))
    }
}

/// Rewrites two layouts of one tensor to one device matrix and one shape without moving an
/// element (docs/conventions.md#unification).
#[pyfunction]
pub(super) fn unify(a: &PyLayout, b: &PyLayout) -> PyResult<(PyLayout, PyLayout)> {
    let (x, y) = unification::unify(&a.inner, &b.inner)?;
    Ok((x.into(), y.into()))
}

/// The layout classes of one end of an edge in the search's tables
/// ([`classes::layout_classes`]): each candidate's class, and per class its compacted forward
/// layout and (with `backward`, one gradient per candidate) its gradient's. A direction's
/// `*_partial` (candidates x k, device dims or -1) gives each candidate's layout partial sums
/// along its row's dims.
#[pyfunction]
#[pyo3(signature = (forward, backward=None, forward_partial=None, backward_partial=None))]
#[allow(clippy::type_complexity)]
pub(super) fn layout_classes<'py>(
    py: Python<'py>,
    forward: Vec<Bound<'py, PyLayout>>,
    backward: Option<Vec<Bound<'py, PyLayout>>>,
    forward_partial: Option<PyReadonlyArray2<'py, i64>>,
    backward_partial: Option<PyReadonlyArray2<'py, i64>>,
) -> PyResult<(
    Bound<'py, PyArray1<i64>>,
    Vec<PyLayout>,
    Option<Vec<PyLayout>>,
)> {
    if backward.is_none() && backward_partial.is_some() {
        return Err(Error::Shape("backward_partial without backward layouts".into()).into());
    }
    let forward = inners(&forward);
    let backward = backward.as_deref().map(inners);
    let (fp, bp) = (rows(forward_partial), rows(backward_partial));
    let found = py.detach(|| {
        classes::layout_classes(
            direction(&forward, fp.as_ref()),
            backward.as_deref().map(|b| direction(b, bp.as_ref())),
        )
    })?;
    let class: Vec<i64> = found.class.iter().map(|&c| c as i64).collect();
    let listed = |l: Vec<Layout>| l.into_iter().map(PyLayout::from).collect();
    Ok((
        class.into_pyarray(py),
        listed(found.forward),
        found.backward.map(listed),
    ))
}

/// The core's layouts of `layouts`, read in place.
fn inners<'a>(layouts: &'a [Bound<'_, PyLayout>]) -> Vec<&'a Layout> {
    layouts.iter().map(|l| &l.get().inner).collect()
}

/// An array of rows of partial dims as [`classes::Direction`] reads them: its entries in order
/// (any memory layout) and its row width.
fn rows(partial: Option<PyReadonlyArray2<'_, i64>>) -> Option<(Vec<i64>, usize)> {
    partial.map(|p| {
        let p = p.as_array();
        (p.iter().copied().collect(), p.ncols())
    })
}

/// A direction of [`classes::layout_classes`]: `layouts`, with rows of partial dims if given.
fn direction<'a>(
    layouts: &'a [&'a Layout],
    partial: Option<&'a (Vec<i64>, usize)>,
) -> classes::Direction<'a> {
    classes::Direction {
        layouts,
        partial: partial.map(|(d, w)| (&d[..], *w)),
    }
}
