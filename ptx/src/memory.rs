//! Global memory of the interpreted device: allocations at distinct addresses, written
//! and read by the host (upload, download, write, free) and by kernels (`exec`).

/// Global memory: allocations at distinct, 256-byte aligned addresses.
#[derive(Debug, Default)]
pub struct Memory {
    /// Each allocation's address and bytes, by address.
    pub(crate) allocations: Vec<(u64, Vec<u8>)>,
}

/// Where the first allocation starts (0 stays an invalid address).
const FIRST_ADDRESS: u64 = 1 << 32;

impl Memory {
    /// A new allocation holding `bytes`; returns its address.
    pub fn upload(&mut self, bytes: &[u8]) -> u64 {
        let base = self.allocations.last().map_or(FIRST_ADDRESS, |(b, v)| {
            (b + v.len() as u64 + 256).next_multiple_of(256)
        });
        self.allocations.push((base, bytes.to_vec()));
        base
    }

    /// The `len` bytes at `address`, if they lie in one allocation.
    pub fn download(&self, address: u64, len: usize) -> Option<&[u8]> {
        let (buffer, offset) = self.locate(address, len)?;
        Some(&self.allocations[buffer].1[offset..offset + len])
    }

    /// Overwrites the `bytes.len()` bytes at `address`; false (nothing written) unless
    /// they lie in one allocation.
    pub fn write(&mut self, address: u64, bytes: &[u8]) -> bool {
        let Some((buffer, offset)) = self.locate(address, bytes.len()) else {
            return false;
        };
        self.allocations[buffer].1[offset..offset + bytes.len()].copy_from_slice(bytes);
        true
    }

    /// Frees the allocation that starts at `address`; false where none does.
    pub fn free(&mut self, address: u64) -> bool {
        let Some(i) = self
            .allocations
            .iter()
            .position(|(base, _)| *base == address)
        else {
            return false;
        };
        self.allocations.remove(i);
        true
    }

    /// The allocation holding the `len` bytes at `address`, and their offset in it.
    pub(crate) fn locate(&self, address: u64, len: usize) -> Option<(usize, usize)> {
        self.allocations
            .iter()
            .position(|(base, bytes)| {
                address >= *base && address - base + len as u64 <= bytes.len() as u64
            })
            .map(|i| (i, (address - self.allocations[i].0) as usize))
    }
}
