//! Where a tensor lives and a kernel runs.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};
use backends_spec::rules::DeviceKind;

/// A device: the CPU, a wgpu adapter (by index in [`crate::runtime::wgpu::adapters::list`]) or a CUDA
/// device (by ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// A wgpu adapter (Vulkan, Metal or DX12).
    Wgpu(usize),
    /// A CUDA device.
    Cuda(usize),
}

impl Device {
    /// Its kind, without the index.
    pub fn kind(self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Wgpu(_) => DeviceKind::Wgpu,
            Device::Cuda(_) => DeviceKind::Cuda,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Wgpu(i) => write!(f, "wgpu:{i}"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses `cpu`, `cuda`, `cuda:N`, `wgpu`, `wgpu:N` (index 0 when omitted).
    fn from_str(text: &str) -> Result<Self> {
        let unknown = || Error::UnknownOption {
            option: "device",
            got: text.to_string(),
            accepted: "cpu, cuda, cuda:N, wgpu, wgpu:N".to_string(),
        };
        let (kind, index) = match text.split_once(':') {
            Some((kind, index)) => (kind, index.parse::<usize>().map_err(|_| unknown())?),
            None => (text, 0),
        };
        match kind.to_ascii_lowercase().as_str() {
            "cpu" if !text.contains(':') => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(index)),
            "wgpu" => Ok(Device::Wgpu(index)),
            _ => Err(unknown()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_spellings() {
        for d in [Device::Cpu, Device::Wgpu(1), Device::Cuda(3)] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda(0));
        for bad in ["gpu", "cuda:x", "cpu:1", ""] {
            let err = bad.parse::<Device>().unwrap_err().to_string();
            assert!(err.contains("cpu, cuda"), "{bad}: {err}");
        }
    }
}
