//! The fused CPU attention never allocates an Lq x Lk buffer: at L = 8192 the scores alone
//! would take 256 MiB; the peak extra memory stays far below that. (Alone in its test
//! binary, so that no other test's allocations count.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use backends::attention::SdpBackend;
use backends::{Device, SdpaOptions, Tensor, sdpa};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's layout is valid for the system allocator too.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn fused_attention_at_l_8192_stays_far_below_l_squared() {
    let (l, d) = (8192, 16);
    let t = || {
        Tensor::from_vec(
            (0..l * d)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect(),
            &[1, 1, l, d],
            Device::Cpu,
        )
        .unwrap()
    };
    let (q, k, v) = (t(), t(), t());
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = sdpa(
        &q,
        &k,
        &v,
        &SdpaOptions {
            is_causal: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(out.backend, SdpBackend::Flash);
    let extra = PEAK.load(Ordering::Relaxed) - before;
    let scores = l * l * 4;
    println!("peak extra memory {extra} bytes; the score matrix would be {scores}");
    assert!(
        extra < scores / 8,
        "peak extra memory {extra} bytes is not far below L x L ({scores})"
    );
}
