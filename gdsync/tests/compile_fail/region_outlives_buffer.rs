//! A `MemoryRegion` borrows its buffer: it cannot outlive it (the device would write into
//! freed memory).
use gdsync::{Access, MemoryRegion, ProtectionDomain};

fn region(pd: &ProtectionDomain) -> MemoryRegion<'static> {
    let mut buf = vec![0u8; 64];
    pd.register(&mut buf, Access::ALL).unwrap()
}

fn main() {
    let dev = gdsync::Device::soft().unwrap();
    let _mr = region(&dev.alloc_pd());
}
