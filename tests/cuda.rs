//! On a machine with an NVIDIA GPU: every generated CUDA module loads into the driver for
//! device 0 (embedded PTX or NVRTC at run time) and exposes each variant's entry point.
//! Without one, each test prints why it was skipped.

#![cfg(feature = "cuda")]

use backends::cuda;
use backends::kernels::{ENTRIES, Family};

/// Device 0, or `None` after printing why not.
fn gpu() -> Option<usize> {
    if cuda::device_count() == 0 {
        eprintln!(
            "skipped: no CUDA device ({})",
            cuda::unavailable_reason().unwrap_or("the driver reports none")
        );
        return None;
    }
    Some(0)
}

#[test]
fn every_cuda_module_loads_and_has_its_entry_points() {
    let Some(device) = gpu() else { return };
    let (major, minor) = cuda::get_device_capability(device).expect("a present device");
    for family in Family::ALL {
        let entries: Vec<_> = ENTRIES
            .iter()
            .filter(|e| e.key.family() == family)
            .filter(|e| {
                e.cuda
                    .as_ref()
                    .is_some_and(|c| c.min_sm <= major * 10 + minor)
            })
            .collect();
        if entries.is_empty() {
            continue;
        }
        let module = cuda::loader::module(device, family)
            .unwrap_or_else(|e| panic!("{family} on sm_{major}{minor}: {e}"));
        for entry in entries {
            module
                .load_function(entry.name)
                .unwrap_or_else(|e| panic!("{}: {e:?}", entry.name));
        }
    }
}

#[test]
fn the_device_reports_its_capability_and_name() {
    let Some(device) = gpu() else { return };
    let (major, _) = cuda::get_device_capability(device).expect("a capability");
    assert!(major >= 5, "sm_{major}x is older than any CUDA 12 target");
    assert!(!cuda::get_device_name(device).unwrap_or_default().is_empty());
}
