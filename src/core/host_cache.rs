//! Large host buffers kept after their tensors drop, for the next output of the same size:
//! glibc hands every allocation of 32 MiB or more fresh from the kernel and gives it back
//! on free, so each such output page-faults in its memory again (an einsum with a 32 MiB
//! output on an AMD EPYC VM spent 60% of its time in the kernel's page faults and zeroing:
//! 21 ms a call, 8 ms reusing the memory). Buffers of at least [`FROM`] bytes go to the
//! cache when their tensor drops, up to `BACKENDS_HOST_CACHE_MIB` MiB in all (1024 by
//! default; 0 keeps none, the oldest go first); an output of exactly a kept buffer's size
//! and alignment takes it, zeroed. [`empty_host_cache`] gives them all back, as
//! `torch.cuda.empty_cache` does for PyTorch's device memory.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Buffers of at least this many bytes are kept (glibc's largest threshold for mapping an
/// allocation fresh: smaller freed memory already stays in its heap).
pub(crate) const FROM: usize = 32 << 20;

/// One kept allocation of the global allocator.
struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the block is owned memory that no one else refers to (its tensor dropped it).
unsafe impl Send for Block {}

impl Block {
    fn free(self) {
        // SAFETY: `ptr` came from the global allocator with `layout` and is owned here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The kept blocks, oldest first.
static BLOCKS: Mutex<Vec<Block>> = Mutex::new(Vec::new());

/// Bytes the cache keeps at most.
fn limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("BACKENDS_HOST_CACHE_MIB")
            .ok()
            .and_then(|mib| mib.trim().parse::<usize>().ok())
            .map_or(1 << 30, |mib| mib.saturating_mul(1 << 20))
    })
}

/// A kept buffer of exactly `layout`, zeroed, where the cache has one.
pub(crate) fn take_zeroed(layout: Layout) -> Option<NonNull<u8>> {
    if layout.size() < FROM {
        return None;
    }
    let block = {
        let mut blocks = BLOCKS.lock().unwrap_or_else(PoisonError::into_inner);
        let index = blocks.iter().rposition(|b| b.layout == layout)?;
        blocks.remove(index)
    };
    // SAFETY: the block owns `layout.size()` bytes at `ptr`.
    unsafe { std::ptr::write_bytes(block.ptr.as_ptr(), 0, layout.size()) };
    Some(block.ptr)
}

/// Keeps `vec`'s allocation where it is large enough and fits the limit (giving back the
/// oldest blocks to make room), else frees it.
pub(crate) fn give<T>(vec: Vec<T>) {
    let Ok(layout) = Layout::array::<T>(vec.capacity()) else {
        return;
    };
    if layout.size() < FROM || layout.size() > limit() {
        return;
    }
    let mut vec = std::mem::ManuallyDrop::new(vec);
    let Some(ptr) = NonNull::new(vec.as_mut_ptr().cast::<u8>()) else {
        return;
    };
    let mut freed = Vec::new();
    {
        let mut blocks = BLOCKS.lock().unwrap_or_else(PoisonError::into_inner);
        let mut kept: usize = blocks.iter().map(|b| b.layout.size()).sum();
        while kept + layout.size() > limit() && !blocks.is_empty() {
            let oldest = blocks.remove(0);
            kept -= oldest.layout.size();
            freed.push(oldest);
        }
        blocks.push(Block { ptr, layout });
    }
    freed.into_iter().for_each(Block::free);
}

/// Gives every host buffer the library keeps for later outputs back to the allocator (see
/// the module's documentation): memory held only by the cache returns to the system.
pub fn empty_host_cache() {
    let blocks = std::mem::take(&mut *BLOCKS.lock().unwrap_or_else(PoisonError::into_inner));
    blocks.into_iter().for_each(Block::free);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tensor::host_zeros;
    use crate::{Device, Tensor};

    #[test]
    fn a_dropped_large_output_comes_back_zeroed_and_the_cache_empties() {
        // A size no other test asks for, past the threshold.
        let len = FROM / 4 + 12_345;
        let mut first = host_zeros::<f32>("test", len).unwrap();
        first.fill(1.5);
        let ptr = first.as_ptr();
        drop(Tensor::from_vec(first, &[len], Device::Cpu).unwrap());
        let again = host_zeros::<f32>("test", len).unwrap();
        assert_eq!(again.as_ptr(), ptr, "the buffer was not reused");
        assert!(
            again.iter().all(|&x| x == 0.0),
            "a reused buffer is not zeroed"
        );
        // Only the same layout takes it: a tensor of another element type but the same
        // bytes, and one element fewer, allocate afresh.
        drop(Tensor::from_vec(again, &[len], Device::Cpu).unwrap());
        let layout = Layout::array::<f32>(len).unwrap();
        assert!(take_zeroed(Layout::array::<f32>(len - 1).unwrap()).is_none());
        assert!(take_zeroed(Layout::from_size_align(layout.size(), 8).unwrap()).is_none());
        empty_host_cache();
        assert!(take_zeroed(layout).is_none(), "emptied, still kept");
    }
}
