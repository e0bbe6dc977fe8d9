//! Loading kernel modules onto a CUDA device: the PTX of a family for the device's
//! architecture, once the driver is known to accept its ISA version.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};

use super::device::CudaDevice;
use crate::kernels::{self, Family};
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

/// The `.version` line of a PTX text, as `(major, minor)`.
pub fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".version"))?;
    let (major, minor) = line.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.trim().parse().ok()?))
}

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

/// The module of `family` on device `ordinal` (see [`CudaDevice::module`]).
pub fn module(ordinal: usize, family: Family) -> Result<Arc<CudaModule>> {
    CudaDevice::get(ordinal)?.module(family)
}

/// Loads the module of `family` into `context` (device `ordinal`): its PTX for the device's
/// architecture, once the driver's PTX ISA is checked.
pub(super) fn load(
    context: &Arc<CudaContext>,
    ordinal: usize,
    family: Family,
) -> Result<Arc<CudaModule>> {
    let (major, minor) = super::get_device_capability(ordinal).unwrap_or((0, 0));
    let ptx = kernels::ptx_for(family, major * 10 + minor)?;
    if let Some(driver) = super::driver_version() {
        check_ptx_version(&ptx, driver)?;
    }
    crate::core::verbose::creation_event(|| format!("load module {family} on cuda:{ordinal}"));
    context
        .load_module(cudarc::nvrtc::Ptx::from_src(ptx.into_owned()))
        .map_err(|e| Error::Driver {
            call: "cuModuleLoadData",
            detail: format!("{e:?}"),
        })
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
            let err = module(0, Family::Gemm).unwrap_err();
            assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        }
    }
}
