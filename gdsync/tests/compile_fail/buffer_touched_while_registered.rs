//! While a `MemoryRegion` exists the buffer is reached only through it (the device may write
//! into it at any time): the slice cannot be read or written directly.
use gdsync::Access;

fn main() {
    let dev = gdsync::Device::soft().unwrap();
    let pd = dev.alloc_pd();
    let mut buf = vec![0u8; 64];
    let mr = pd.register(&mut buf, Access::ALL).unwrap();
    buf[0] = 1;
    drop(mr);
}
