//! The CUDA header's text, as kernels are compiled with it: a leaf that the kernel
//! descriptors ([`crate::kernel::HEADER`] re-exports it) and the NVRTC glue
//! ([`crate::cuda::Module::compile`]) both use.

/// The CUDA header with the device functions (`gds_send`, `gds_wait`, `gds_ring_run`, ...):
/// `gdsync/include/gdsync_format.h` (the format's constants, generated from [`crate::format`])
/// followed by `gdsync/include/gdsync.cuh`, which then skips its include of the former, so
/// the text compiles alone (as NVRTC gets it, [`crate::cuda::Module::compile`]).
pub const HEADER: &str = concat!(
    include_str!("../include/gdsync_format.h"),
    include_str!("../include/gdsync.cuh")
);
