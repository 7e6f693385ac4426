//! A window as GPU kernels see it: every rank's region as a `gds_remote` ([`RemoteDesc`]) in
//! a table in pinned host memory, for puts and gets from a kernel (`gds_peer_put`,
//! `gds_peer_get`, `gds_peer_put_bounce` on a [`KernelChannels`](crate::KernelChannels)
//! peer).

use crate::Window;
use gdsync::kernel::RemoteDesc;
use gdsync::{PinnedBuffer, Result};

/// The table of a window's regions, one [`RemoteDesc`] per rank
/// ([`Window::for_kernels`]). Keep it alive while kernels read it.
#[derive(Debug)]
pub struct KernelWindow {
    table: PinnedBuffer,
    descs: Vec<RemoteDesc>,
}

impl KernelWindow {
    /// The GPUs' address of the table: pass it to a kernel as `const gds_remote *win` and
    /// put into rank `p`'s region with `gds_peer_put(&peers[p], &win[p], ..)`. (Copy the
    /// entry into a local once: each read of the table crosses PCIe.)
    pub fn table(&self) -> u64 {
        self.table.gpu_addr()
    }

    /// Rank `p`'s entry, as the table holds it.
    pub fn desc(&self, p: usize) -> Option<RemoteDesc> {
        self.descs.get(p).copied()
    }

    /// Number of ranks (entries of the table).
    pub fn size(&self) -> usize {
        self.descs.len()
    }

    /// Whether GPUs can read the table (pinned and mapped); without it a kernel cannot use it.
    pub fn gpu_mapped(&self) -> bool {
        self.table.gpu_mapped()
    }
}

impl Window {
    /// The window as kernels name it: a table with every rank's region, in pinned host
    /// memory mapped for the GPUs. Not collective: the regions were exchanged when the
    /// window was made.
    pub fn for_kernels(&self) -> Result<KernelWindow> {
        let size = self.size();
        let descs = (0..size)
            .map(|p| self.remote(p).map(RemoteDesc::from))
            .collect::<Result<Vec<_>>>()?;
        let n = std::mem::size_of::<RemoteDesc>();
        let table = PinnedBuffer::new(n * size.max(1));
        for (p, d) in descs.iter().enumerate() {
            table.write_at(n * p, d.as_bytes());
        }
        Ok(KernelWindow { table, descs })
    }
}
