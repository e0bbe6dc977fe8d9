//! A small tensor: a typed buffer on a device with a shape and element strides (views
//! such as transposes share the buffer). Not a tensor library: just enough to feed kernels.

use std::sync::Arc;

use half::{bf16, f16};

use crate::{DType, Device, Error, Result};

/// An element type a tensor can hold.
pub trait Element: Copy + Send + Sync + bytemuck::Pod + std::fmt::Debug + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Widens to f64 (exactly).
    fn to_f64(self) -> f64;
    /// Rounds an f64 to this type (to nearest; f16 and bf16 through f32, as PyTorch's
    /// conversions round).
    fn from_f64(value: f64) -> Self;
    /// Widens to f32 (exactly, except f64).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type (to nearest).
    fn from_f32(value: f32) -> Self;
    #[doc(hidden)]
    fn wrap(data: Vec<Self>) -> CpuData;
    #[doc(hidden)]
    fn unwrap_vec(data: CpuData) -> Option<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $dtype:ident, $variant:ident, $to64:expr, $from64:expr, $to32:expr, $from32:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn to_f64(self) -> f64 {
                $to64(self)
            }
            fn from_f64(value: f64) -> Self {
                $from64(value)
            }
            fn to_f32(self) -> f32 {
                $to32(self)
            }
            fn from_f32(value: f32) -> Self {
                $from32(value)
            }
            fn wrap(data: Vec<Self>) -> CpuData {
                CpuData::$variant(data)
            }
            fn unwrap_vec(data: CpuData) -> Option<Vec<Self>> {
                match data {
                    CpuData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

element!(f32, F32, F32, f64::from, |v| v as f32, |v| v, |v| v);
element!(i32, I32, I32, f64::from, |v| v as i32, |v| v as f32, |v| v
    as i32);
element!(f64, F64, F64, |v| v, |v| v, |v| v as f32, f64::from);
element!(
    f16,
    F16,
    F16,
    f64::from,
    |v| f16::from_f32(v as f32),
    f32::from,
    f16::from_f32
);
element!(
    bf16,
    Bf16,
    Bf16,
    f64::from,
    |v| bf16::from_f32(v as f32),
    f32::from,
    bf16::from_f32
);

/// Host memory of one element type.
#[doc(hidden)]
#[derive(Debug)]
pub enum CpuData {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
    /// Booleans, one byte each (0 or 1).
    Bool(Vec<u8>),
    /// 32-bit integers.
    I32(Vec<i32>),
}

/// Memory a runtime keeps on a device (a wgpu or CUDA buffer). The tensor only reads it
/// back; the ops that launch kernels downcast it to their runtime's buffer type.
pub(crate) trait DeviceMemory: std::fmt::Debug + Send + Sync + 'static {
    /// The contents, copied to the host (device buffers may be padded past the elements).
    fn download(&self) -> Result<Vec<u8>>;
    /// The buffer as `Any`, to downcast.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Where a tensor's elements are: host memory (owned or borrowed) or a runtime's device
/// memory.
#[derive(Debug)]
pub(crate) enum Storage {
    Host(HostMemory),
    Device(Box<dyn DeviceMemory>),
}

impl Storage {
    /// The bytes of device memory, copied to the host (`None` for host memory).
    fn download(&self) -> Result<Option<Vec<u8>>> {
        Ok(match self {
            Storage::Host(_) => None,
            Storage::Device(memory) => Some(memory.download()?),
        })
    }
}

/// Host memory behind a lock: kernels read it under a shared (recursive) lock, `copy_` and
/// the `*_out` forms write it under the exclusive one, and the end of a borrow (see
/// [`crate::core::borrow`]) takes the exclusive lock to cut the memory off, so a view that
/// outlives its borrow reads nothing (a typed error) rather than freed memory.
#[derive(Debug)]
pub(crate) struct HostMemory {
    dtype: DType,
    state: parking_lot::RwLock<Host>,
}

/// What host memory holds.
#[derive(Debug)]
pub(crate) enum Host {
    /// A buffer this library owns.
    Owned(CpuData),
    /// Caller memory of `len` elements of the storage's dtype, lent for a borrow's lifetime
    /// (writable where it came from a `&mut` slice).
    Borrowed {
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        writable: bool,
    },
    /// Borrowed memory whose borrow has ended.
    Ended,
}

// SAFETY: the borrowed pointer comes from a `&[T]` or `&mut [T]` of an `Element` (`Send +
// Sync`) that stays borrowed until the state becomes `Ended`; every access goes through the
// lock (shared for reads, exclusive for writes), so threads never race on the elements.
unsafe impl Send for Host {}
// SAFETY: as for `Send`: shared access only reads, under the lock.
unsafe impl Sync for Host {}

/// `$body` with `$v` bound to the vector inside `$data`, whatever its element type.
macro_rules! each_vec {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            CpuData::F32($v) => $body,
            CpuData::F64($v) => $body,
            CpuData::F16($v) => $body,
            CpuData::Bf16($v) => $body,
            CpuData::Bool($v) => $body,
            CpuData::I32($v) => $body,
        }
    };
}

impl Drop for HostMemory {
    /// A large owned buffer goes to the [`super::host_cache`] for a later output.
    fn drop(&mut self) {
        if let Host::Owned(data) = std::mem::replace(self.state.get_mut(), Host::Ended) {
            each_vec!(data, v => super::host_cache::give(v));
        }
    }
}

impl CpuData {
    /// The elements' bytes: start and length.
    fn raw(&self) -> (*const u8, usize) {
        each_vec!(self, v => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())))
    }

    /// The elements' bytes, writable: start and length.
    fn raw_mut(&mut self) -> (*mut u8, usize) {
        each_vec!(self, v => (v.as_mut_ptr().cast(), std::mem::size_of_val(v.as_slice())))
    }
}

impl HostMemory {
    /// Owned memory holding `data`.
    pub(crate) fn owned(data: CpuData) -> HostMemory {
        let dtype = match &data {
            CpuData::F32(_) => DType::F32,
            CpuData::F64(_) => DType::F64,
            CpuData::F16(_) => DType::F16,
            CpuData::Bf16(_) => DType::Bf16,
            CpuData::Bool(_) => DType::Bool,
            CpuData::I32(_) => DType::I32,
        };
        HostMemory {
            dtype,
            state: parking_lot::RwLock::new(Host::Owned(data)),
        }
    }

    /// Caller memory: `len` elements of `dtype` at `ptr` (see [`Host::Borrowed`]).
    pub(crate) fn borrowed(
        dtype: DType,
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        writable: bool,
    ) -> HostMemory {
        HostMemory {
            dtype,
            state: parking_lot::RwLock::new(Host::Borrowed { ptr, len, writable }),
        }
    }

    /// The address of the buffer's first element (`None` once a borrow has ended).
    fn address(&self) -> Option<usize> {
        match &*self.state.read_recursive() {
            Host::Owned(data) => Some(data.raw().0 as usize),
            Host::Borrowed { ptr, .. } => Some(ptr.as_ptr() as usize),
            Host::Ended => None,
        }
    }

    /// Ends a borrow: waits for the kernels reading or writing the memory, then cuts it off.
    pub(crate) fn end_borrow(&self) {
        *self.state.write() = Host::Ended;
    }

    /// The whole buffer as `T` (of the storage's element size), read-locked; an error where
    /// its borrow has ended.
    fn read<T: bytemuck::Pod>(&self, op: &'static str) -> Result<HostRead<'_, T>> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        // Recursive: a kernel may hold q's lock while it takes k's on the same storage,
        // and a waiting writer must not block that second read.
        let guard = self.state.read_recursive();
        let (ptr, bytes) = match &*guard {
            Host::Owned(data) => data.raw(),
            Host::Borrowed { ptr, len, .. } => (ptr.as_ptr().cast_const(), len * self.dtype.size()),
            Host::Ended => return Err(borrow_ended(op)),
        };
        Ok(HostRead {
            _guard: guard,
            ptr: ptr.cast(),
            len: bytes / std::mem::size_of::<T>(),
        })
    }

    /// The whole buffer as `T`, write-locked: an error where the memory is read-only caller
    /// memory or its borrow has ended.
    fn write<T: bytemuck::Pod>(&self, op: &'static str) -> Result<HostWrite<'_, T>> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size());
        let mut guard = self.state.write();
        let (ptr, bytes) = match &mut *guard {
            Host::Owned(data) => data.raw_mut(),
            Host::Borrowed {
                ptr,
                len,
                writable: true,
            } => (ptr.as_ptr(), *len * self.dtype.size()),
            Host::Borrowed { .. } => {
                return Err(Error::Borrow {
                    op,
                    detail: "the tensor to write borrows read-only memory (a `&[T]`); borrow \
                             it with Tensor::borrowed_mut to write into it"
                        .into(),
                });
            }
            Host::Ended => return Err(borrow_ended(op)),
        };
        Ok(HostWrite {
            _guard: guard,
            ptr: ptr.cast(),
            len: bytes / std::mem::size_of::<T>(),
        })
    }
}

fn borrow_ended(op: &'static str) -> Error {
    Error::Borrow {
        op,
        detail: "the caller memory this tensor viewed was given back (its borrowed handle was \
                 dropped); keep the handle alive while its views are used, or copy with \
                 Tensor::contiguous before it ends"
            .into(),
    }
}

/// Host elements under a read lock (derefs to the slice).
pub(crate) struct HostRead<'a, T> {
    _guard: parking_lot::RwLockReadGuard<'a, Host>,
    ptr: *const T,
    len: usize,
}

// SAFETY: a shared `HostRead` only hands out `&[T]`, which is `Sync` where `T` is; the
// guard it holds is `Sync` too.
unsafe impl<T: Sync> Sync for HostRead<'_, T> {}

impl<T> HostRead<'_, T> {
    /// The elements of `range` only (the lock stays held).
    pub(crate) fn narrowed(mut self, range: std::ops::Range<usize>) -> Self {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: the range lies inside the buffer (asserted).
        self.ptr = unsafe { self.ptr.add(range.start) };
        self.len = range.len();
        self
    }
}

impl<T> std::ops::Deref for HostRead<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` and `len` describe initialised elements of the buffer the guard keeps
        // alive and unwritten (writers need the exclusive lock).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A tensor's elements in row-major order on the host: its own memory, read-locked, where
/// that is laid out so, else a copy (derefs to the slice either way).
pub(crate) enum HostValues<'a, T> {
    /// The tensor's memory.
    Lent(HostRead<'a, T>),
    /// A row-major copy.
    Copied(Vec<T>),
}

impl<T> std::ops::Deref for HostValues<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostValues::Lent(values) => values,
            HostValues::Copied(values) => values,
        }
    }
}

/// Host elements under the write lock (derefs to the mutable slice).
pub(crate) struct HostWrite<'a, T> {
    _guard: parking_lot::RwLockWriteGuard<'a, Host>,
    ptr: *mut T,
    len: usize,
}

impl<T> std::ops::Deref for HostWrite<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: as for `HostRead`; the exclusive guard is held.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

// SAFETY: a shared `HostWrite` only hands out `&[T]` (writing needs `&mut`).
unsafe impl<T: Sync> Sync for HostWrite<'_, T> {}

impl<T> std::ops::DerefMut for HostWrite<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: the exclusive guard makes this the only access to the elements, which are
        // writable (owned, or lent by a `&mut` slice).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A strided view of a typed buffer on a device.
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    device: Device,
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// A zeroed host buffer of `len` elements, or [`Error::OutOfMemory`] (with what `op` was
/// doing) where the allocation fails: the large outputs of the CPU kernels are allocated
/// here, so that a product too big for the machine is an error, not an abort. A buffer the
/// [`super::host_cache`] kept is reused (zeroed); otherwise the zeroing is the allocator's
/// (fresh pages are zero until the threads that fill them touch them).
pub(crate) fn host_zeros<T: bytemuck::Zeroable>(op: &'static str, len: usize) -> Result<Vec<T>> {
    let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    let out_of_memory = |why: &str| Error::OutOfMemory {
        device: Device::Cpu,
        bytes,
        why: format!("{op}: {why}"),
    };
    let layout = std::alloc::Layout::array::<T>(len)
        .map_err(|_| out_of_memory("the size overflows the address space"))?;
    if layout.size() == 0 {
        let mut empty = Vec::new();
        empty.resize_with(len, T::zeroed);
        return Ok(empty);
    }
    if let Some(kept) = super::host_cache::take_zeroed(layout) {
        // SAFETY: the kept block was allocated by the global allocator with exactly this
        // layout (size and alignment) and is zeroed, a valid T (`Zeroable`).
        return Ok(unsafe { Vec::from_raw_parts(kept.as_ptr().cast::<T>(), len, len) });
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(out_of_memory("the allocation failed"));
    }
    ask_for_huge_pages(ptr.cast(), layout.size());
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` T's, every byte
    // zero, which is a valid T (`Zeroable`); the Vec takes ownership with that capacity.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// Asks the kernel to back the 2 MiB-aligned interior of a large fresh allocation with
/// transparent huge pages where the system leaves that to the program (`madvise` mode) and
/// gives them without stalling ([`huge_pages_never_stall`]): the first touch of a 32 MiB
/// output then takes 16 page faults instead of 8192, which cost a GEMM of that output a
/// third of its time. Only the backing changes: the contents (zero, untouched) stay as they
/// are, and a refusal changes nothing.
fn ask_for_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if bytes < 2 * HUGE || !huge_pages_never_stall() {
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside the allocation just made, which this
            // function's caller owns; MADV_HUGEPAGE changes no contents or permissions.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Whether the kernel backs a huge-page region's faults without compacting memory first:
/// THP `defrag` is `defer` or `never` (a huge page if one is free, else small pages). Under
/// `madvise` (the usual default), `defer+madvise` or `always`, a fault in a fragmented
/// system compacts memory while the program waits: in paired runs on an AMD EPYC VM, half
/// the runs of an einsum with a 64 MiB output took 6x longer than with small pages.
#[cfg(target_os = "linux")]
fn huge_pages_never_stall() -> bool {
    static NEVER_STALL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NEVER_STALL.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/defrag")
            .is_ok_and(|policy| policy_never_stalls(&policy))
    })
}

/// Whether the THP `defrag` policy `policy` (the sysfs line, the active value in brackets)
/// is one that never compacts in a fault.
#[cfg(target_os = "linux")]
fn policy_never_stalls(policy: &str) -> bool {
    let active = policy
        .split_whitespace()
        .find_map(|word| word.strip_prefix('[')?.strip_suffix(']'));
    matches!(active, Some("defer" | "never"))
}

/// The element count of a tensor of `shape` and `dtype`, or a typed error where the shape's
/// extent (its element count, and every row-major stride, in bytes) does not fit the
/// address space: every size and stride computed from a tensor's shape then fits `usize`.
pub(crate) fn checked_numel(op: &'static str, shape: &[usize], dtype: DType) -> Result<usize> {
    // Strides multiply the sizes with 0 read as 1, so their product bounds both.
    let extent = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d.max(1)))
        .filter(|&bytes| bytes <= isize::MAX as usize);
    if extent.is_none() {
        return Err(Error::ShapeMismatch {
            op,
            detail: format!(
                "shape {shape:?} of {dtype} spans more than the address space (its element count or \
                 a stride in bytes overflows); use smaller dimensions"
            ),
        });
    }
    Ok(shape.iter().product())
}

/// A host vector of `len` copies of `value`, or [`Error::OutOfMemory`] where the allocation
/// fails.
pub(crate) fn host_filled<T: Clone>(op: &'static str, len: usize, value: T) -> Result<Vec<T>> {
    let mut out = host_with_room(op, len)?;
    out.resize(len, value);
    Ok(out)
}

/// An empty host vector with room for `len` items, or [`Error::OutOfMemory`] where the
/// allocation fails (for items [`host_filled`] cannot clone).
pub(crate) fn host_with_room<T>(op: &'static str, len: usize) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        device: Device::Cpu,
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        why: format!("{op}: the host allocation failed"),
    })?;
    Ok(out)
}

fn copy_out_of_memory<T>(len: usize) -> Error {
    Error::OutOfMemory {
        device: Device::Cpu,
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        why: "copy: the host allocation failed".into(),
    }
}

/// `shape` and `strides` with size-1 dimensions dropped and each pair of neighbours that
/// steps through memory as one dimension merged (at least one dimension is left): the same
/// elements in the same order, walked with fewer, longer runs.
pub(crate) fn coalesced(shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut sizes, mut steps): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&size, &stride) in shape.iter().zip(strides).filter(|(size, _)| **size != 1) {
        match (sizes.last_mut(), steps.last_mut()) {
            (Some(outer), Some(outer_stride)) if *outer_stride == stride * size => {
                *outer *= size;
                *outer_stride = stride;
            }
            _ => {
                sizes.push(size);
                steps.push(stride);
            }
        }
    }
    if sizes.is_empty() {
        return (vec![1], vec![1]);
    }
    (sizes, steps)
}

/// Calls `visit(at, item)` for the items in turn, `at` walking the index space `sizes` in
/// row-major order: `start` plus the index times `strides` (a view's outer dimensions).
pub(crate) fn for_each_offset<I>(
    (sizes, strides): (&[usize], &[usize]),
    start: usize,
    items: impl IntoIterator<Item = I>,
    mut visit: impl FnMut(usize, I),
) {
    let mut index = vec![0usize; sizes.len()];
    let mut at = start;
    for item in items {
        visit(at, item);
        for d in (0..sizes.len()).rev() {
            index[d] += 1;
            at += strides[d];
            if index[d] < sizes[d] {
                break;
            }
            at -= strides[d] * sizes[d];
            index[d] = 0;
        }
    }
}

/// Row-major strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

impl Tensor {
    /// A contiguous tensor over `storage`.
    pub(crate) fn from_storage(
        storage: Storage,
        dtype: DType,
        device: Device,
        shape: &[usize],
    ) -> Tensor {
        Tensor {
            storage: Arc::new(storage),
            dtype,
            device,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// The elements of a boolean tensor in row-major order, copied to the host.
    pub fn to_bools(&self) -> Result<Vec<bool>> {
        if self.dtype != DType::Bool {
            return Err(Error::DTypeMismatch {
                op: "to_bools",
                expected: DType::Bool,
                got: self.dtype,
            });
        }
        let bytes = match (&*self.storage, self.storage.download()?) {
            (_, Some(device_bytes)) => self.gather(&device_bytes)?,
            (Storage::Host(memory), None) => self.gather(&memory.read::<u8>("to_bools")?)?,
            (Storage::Device(_), None) => unreachable!("device memory downloads"),
        };
        Ok(bytes.into_iter().map(|b| b != 0).collect())
    }

    /// Sizes, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element offset of the first element in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The address of this view's first element in host memory, as PyTorch's `data_ptr()`:
    /// views of one buffer differ by their offsets, and a tensor over caller memory (see
    /// [`crate::borrow_scope`]) gives the caller's address. `None` on a device, and once a
    /// borrow has ended.
    pub fn data_ptr(&self) -> Option<usize> {
        let base = self.host_memory()?.address()?;
        Some(base + self.offset * self.dtype.size())
    }

    /// Whether the elements are laid out row-major without gaps (the strides of size-1
    /// dimensions do not matter).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return self.numel() == 0;
            }
            expected *= size;
        }
        true
    }

    /// This tensor's storage seen with another layout. Callers keep the layout inside the
    /// elements this view can reach.
    pub(crate) fn with_layout(
        &self,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
    ) -> Tensor {
        Tensor {
            storage: Arc::clone(&self.storage),
            dtype: self.dtype,
            device: self.device,
            shape,
            strides,
            offset,
        }
    }

    /// A view with dimensions `d0` and `d1` swapped (no copy).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        let rank = self.shape.len();
        if d0 >= rank || d1 >= rank {
            return Err(Error::ShapeMismatch {
                op: "transpose",
                detail: format!("dimensions {d0} and {d1} of a {rank}-D tensor"),
            });
        }
        let mut view = self.clone();
        view.shape.swap(d0, d1);
        view.strides.swap(d0, d1);
        Ok(view)
    }

    /// The view with its last two dimensions swapped.
    pub fn t(&self) -> Result<Tensor> {
        let rank = self.shape.len();
        if rank < 2 {
            return Err(Error::ShapeMismatch {
                op: "t",
                detail: format!("a {rank}-D tensor has no matrix to transpose"),
            });
        }
        self.transpose(rank - 2, rank - 1)
    }

    /// The elements in row-major order, copied to the host.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                expected: self.dtype,
                got: T::DTYPE,
            });
        }
        match self.storage.download()? {
            None => self.gather(&self.host::<T>("to_vec")?),
            Some(bytes) => {
                // Device buffers may be padded past the elements: read whole elements only.
                let whole = bytes.len() / std::mem::size_of::<T>() * std::mem::size_of::<T>();
                let data: Vec<T> = bytemuck::pod_collect_to_vec(&bytes[..whole]);
                self.gather(&data)
            }
        }
    }

    /// The elements in row-major order, moved out without a copy where this is the only
    /// handle to a contiguous buffer the library owns on the CPU (starting at the view's
    /// first element), else copied as [`Tensor::to_vec`] does.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype || self.offset != 0 || !self.is_contiguous() {
            return self.to_vec();
        }
        let numel = self.numel();
        let Tensor {
            storage,
            dtype,
            device,
            shape,
            strides,
            offset,
        } = self;
        let storage = match Arc::try_unwrap(storage) {
            Ok(Storage::Host(mut memory)) => {
                return match std::mem::replace(memory.state.get_mut(), Host::Ended) {
                    Host::Owned(data) => {
                        let mut values = T::unwrap_vec(data).expect("the buffer holds the dtype");
                        values.truncate(numel);
                        Ok(values)
                    }
                    // A borrow still running is also held by its scope, so the storage was
                    // not this handle's alone: only an ended one gets here.
                    Host::Borrowed { .. } | Host::Ended => Err(borrow_ended("into_vec")),
                };
            }
            Ok(device_storage) => Arc::new(device_storage),
            Err(shared) => shared,
        };
        Tensor {
            storage,
            dtype,
            device,
            shape,
            strides,
            offset,
        }
        .to_vec()
    }

    /// Checks that every tensor of `others` has this tensor's dtype and device (each
    /// tensor's dtype first): the typed error of `op` names the first that does not.
    pub(crate) fn check_same_kind<'t>(
        &self,
        op: &'static str,
        others: impl IntoIterator<Item = &'t Tensor>,
    ) -> Result<()> {
        for t in others {
            if t.dtype != self.dtype {
                return Err(Error::DTypeMismatch {
                    op,
                    expected: self.dtype,
                    got: t.dtype,
                });
            }
            if t.device != self.device {
                return Err(Error::DeviceMismatch {
                    op,
                    a: self.device,
                    b: t.device,
                });
            }
        }
        Ok(())
    }

    /// Whether `other` is the same view of the same storage (as PyTorch's `q is k`).
    pub fn is_same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
            && self.shape == other.shape
            && self.strides == other.strides
            && self.offset == other.offset
    }

    /// The elements in row-major order as f64, copied to the host (`Bool` as 0 and 1).
    pub fn to_f64(&self) -> Result<Vec<f64>> {
        Ok(match self.dtype {
            DType::F32 => self.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            DType::F64 => self.to_vec::<f64>()?,
            DType::F16 => self.to_vec::<f16>()?.into_iter().map(f64::from).collect(),
            DType::Bf16 => self.to_vec::<bf16>()?.into_iter().map(f64::from).collect(),
            DType::I32 => self.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
            DType::Bool => self
                .to_bools()?
                .into_iter()
                .map(|b| f64::from(u8::from(b)))
                .collect(),
        })
    }

    /// Reads the view's elements from a buffer in row-major order ([`Error::OutOfMemory`]
    /// where the copy does not fit).
    pub(crate) fn gather<T: bytemuck::Pod>(&self, data: &[T]) -> Result<Vec<T>> {
        let numel = self.numel();
        if numel == 0 {
            return Ok(Vec::new());
        }
        if self.is_contiguous() {
            let mut out = Vec::new();
            out.try_reserve_exact(numel)
                .map_err(|_| copy_out_of_memory::<T>(numel))?;
            out.extend_from_slice(&data[self.offset..self.offset + numel]);
            return Ok(out);
        }
        let mut out = host_zeros::<T>("copy", numel)?;
        self.each_run(out.len(), |row, at, step| {
            let row = &mut out[row];
            if step == 1 {
                row.copy_from_slice(&data[at..at + row.len()]);
            } else {
                for (i, x) in row.iter_mut().enumerate() {
                    *x = data[at + i * step];
                }
            }
        });
        Ok(out)
    }

    /// Writes `values` (the view's elements in row-major order) into a buffer at the view's
    /// places: [`Tensor::gather`] backwards.
    pub(crate) fn scatter<T: bytemuck::Pod>(&self, data: &mut [T], values: &[T]) {
        self.each_run(values.len(), |row, at, step| {
            let row = &values[row];
            if step == 1 {
                data[at..at + row.len()].copy_from_slice(row);
            } else {
                for (i, &x) in row.iter().enumerate() {
                    data[at + i * step] = x;
                }
            }
        });
    }

    /// Walks the view's `numel` elements as runs along its innermost (merged) dimension:
    /// `visit(rows, at, step)` for the run holding row-major positions `rows`, whose first
    /// element is at buffer index `at` and the next ones `step` apart.
    fn each_run(&self, numel: usize, mut visit: impl FnMut(std::ops::Range<usize>, usize, usize)) {
        if numel == 0 {
            return;
        }
        let (shape, strides) = coalesced(&self.shape, &self.strides);
        let rank = shape.len();
        let (run, step) = (shape[rank - 1], strides[rank - 1]);
        let runs = (0..numel).step_by(run).map(|start| start..start + run);
        let outer = (&shape[..rank - 1], &strides[..rank - 1]);
        for_each_offset(outer, self.offset, runs, |at, rows| visit(rows, at, step));
    }

    /// The elements in row-major order, without a copy, where the tensor is a contiguous
    /// CPU tensor of type `T` whose memory is readable (`None` otherwise: copy with
    /// [`Tensor::to_vec`], which gives the error where there is one).
    pub(crate) fn contiguous_host<T: Element>(&self) -> Option<HostRead<'_, T>> {
        if T::DTYPE != self.dtype || !self.is_contiguous() {
            return None;
        }
        let data = self.host::<T>("read").ok()?;
        // An empty view's offset may lie past the data (a narrow at the end of a dimension).
        let numel = self.numel();
        let start = if numel == 0 { 0 } else { self.offset };
        Some(data.narrowed(start..start + numel))
    }

    /// The elements in row-major order on the host: the tensor's own memory where it is a
    /// contiguous CPU tensor of type `T`, else a copy.
    pub(crate) fn elements<T: Element>(&self) -> Result<HostValues<'_, T>> {
        Ok(match self.contiguous_host::<T>() {
            Some(values) => HostValues::Lent(values),
            None => HostValues::Copied(self.to_vec::<T>()?),
        })
    }

    /// The device memory of a tensor on a device, as the runtime's buffer type `B`.
    pub(crate) fn device_memory<B: 'static>(&self) -> Option<&B> {
        match &*self.storage {
            Storage::Device(memory) => memory.as_any().downcast_ref::<B>(),
            Storage::Host(_) => None,
        }
    }

    /// The host data of a CPU tensor of element type `T`, read-locked (the whole buffer:
    /// index it through the view's offset and strides); an error for a device tensor, another
    /// dtype, or a borrow that has ended.
    pub(crate) fn host<T: Element>(&self, op: &'static str) -> Result<HostRead<'_, T>> {
        match &*self.storage {
            Storage::Host(memory) if T::DTYPE == self.dtype => memory.read(op),
            _ => Err(Error::DTypeMismatch {
                op,
                expected: self.dtype,
                got: T::DTYPE,
            }),
        }
    }

    /// Writes `values` (row-major) into this CPU tensor's places under the write lock
    /// (`T` of the dtype's size: `u8` for booleans).
    pub(crate) fn write_host<T: bytemuck::Pod>(
        &self,
        op: &'static str,
        values: &[T],
    ) -> Result<()> {
        let memory = self.host_memory().ok_or(Error::DeviceMismatch {
            op,
            a: Device::Cpu,
            b: self.device,
        })?;
        let mut data = memory.write::<T>(op)?;
        self.scatter(&mut data, values);
        Ok(())
    }

    /// The host memory behind a CPU tensor (`None` on a device).
    pub(crate) fn host_memory(&self) -> Option<&HostMemory> {
        match &*self.storage {
            Storage::Host(memory) => Some(memory),
            Storage::Device(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Huge pages are asked for only under the THP defrag policies that never make a fault
    /// wait for compaction.
    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_only_where_faults_never_compact() {
        let line = |active: &str| {
            ["always", "defer", "defer+madvise", "madvise", "never"]
                .map(|p| {
                    if p == active {
                        format!("[{p}]")
                    } else {
                        p.into()
                    }
                })
                .join(" ")
        };
        for (active, never_stalls) in [
            ("always", false),
            ("defer", true),
            ("defer+madvise", false),
            ("madvise", false),
            ("never", true),
        ] {
            assert_eq!(policy_never_stalls(&line(active)), never_stalls, "{active}");
        }
        assert!(!policy_never_stalls(""));
    }

    /// PyTorch rounds f64 to the half types through f32 (`static_cast<float>` first), and
    /// so does `from_f64`: a value just above a bf16 midpoint goes up; one whose f32
    /// rounding lands on a midpoint then rounds to even. (half's own f64 conversion
    /// rounds the first of these down.)
    #[test]
    fn f64_rounds_to_the_half_types_as_pytorch_does() {
        let x = [0.673_828_167_863_625_3, 1.003_906_25 + 2f64.powi(-30)];
        let bf = Tensor::from_f64(&x, &[2], DType::Bf16, Device::Cpu).unwrap();
        assert_eq!(bf.to_f64().unwrap(), [0.675_781_25, 1.0]);
        let h = Tensor::from_f64(
            &[1.0 + 2f64.powi(-11) + 2f64.powi(-30)],
            &[1],
            DType::F16,
            Device::Cpu,
        )
        .unwrap();
        assert_eq!(h.to_f64().unwrap(), [1.0]);
    }
}
