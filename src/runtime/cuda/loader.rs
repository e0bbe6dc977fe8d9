//! Which module image a CUDA device loads: the cubin of its arch, else the PTX of its tier,
//! else PTX compiled by NVRTC ([`crate::kernels::image_for`]); the PTX ISA versions drivers
//! accept, and the check that a module's PTX is not newer than the driver in use.

use crate::{Error, Result};

/// The newest PTX ISA a driver of CUDA version `driver` (`major * 1000 + minor * 10`) accepts,
/// as `(major, minor)`.
pub fn max_ptx_isa(driver: u32) -> (u32, u32) {
    let (major, minor) = (driver / 1000, (driver % 1000) / 10);
    match (major, minor) {
        (11, m) => (7, m.min(8)),
        (12, m @ 0..=5) => (8, m),
        (12, m) => (8, m - 1),
        (13, m) => (9, m),
        (m, _) if m > 13 => (m - 4, 0),
        _ => (7, 0),
    }
}

pub use crate::kernels::ptx_isa;
use crate::kernels::{Family, tier_for};

/// Checks that a driver of version `driver` can load `ptx`.
pub fn check_ptx_version(ptx: &str, driver: u32) -> Result<()> {
    let needed = ptx_isa(ptx).unwrap_or((0, 0));
    let max = max_ptx_isa(driver);
    if needed <= max {
        return Ok(());
    }
    Err(Error::DriverTooOld {
        driver_major: driver / 1000,
        driver_minor: (driver % 1000) / 10,
        max_ptx: format!("{}.{}", max.0, max.1),
        needed: format!("{}.{}", needed.0, needed.1),
    })
}

/// Loads every kernel module device `ordinal` can run and resolves each of its kernels
/// (what a first launch would do), returning how many kernels resolved: a check that the
/// shipped images load on this driver and device.
pub fn check_modules(ordinal: usize) -> Result<usize> {
    super::device::CudaDevice::get(ordinal)?.check_modules()
}

/// The image each kernel family would load on device `ordinal` (e.g. `cubin sm_90`,
/// `PTX compute_80`), or why none would, without loading anything.
pub fn images(ordinal: usize) -> Vec<(Family, String)> {
    let Some((major, minor)) = super::get_device_capability(ordinal) else {
        return Vec::new();
    };
    let sm = major * 10 + minor;
    Family::ALL
        .into_iter()
        .map(|family| {
            let image = match crate::kernels::image_for(family, sm) {
                Err(e) => e.to_string(),
                // The interpreter runs the tier's PTX, whatever a driver would load.
                Ok(_) if super::is_interpreted() => format!(
                    "PTX compute_{} (interpreted)",
                    tier_for(sm).unwrap_or_default()
                ),
                Ok(image) => image.to_string(),
            };
            (family, image)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_isa_by_driver() {
        assert_eq!(max_ptx_isa(12090), (8, 8));
        assert_eq!(max_ptx_isa(12040), (8, 4));
        assert_eq!(max_ptx_isa(13000), (9, 0));
        assert_eq!(max_ptx_isa(11080), (7, 8));
    }

    #[test]
    fn too_old_driver_is_a_clear_error() {
        let ptx = "//\n.version 8.8\n.target sm_80\n";
        assert_eq!(ptx_isa(ptx), Some((8, 8)));
        assert!(check_ptx_version(ptx, 12090).is_ok());
        let err = check_ptx_version(ptx, 12040).unwrap_err().to_string();
        assert!(
            err.contains("8.4") && err.contains("8.8") && err.contains("update the NVIDIA driver"),
            "{err}"
        );
    }

    #[test]
    fn no_device_is_an_error_not_a_panic() {
        if super::super::device_count() == 0 {
            let err = check_modules(0).unwrap_err();
            assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        }
    }
}
