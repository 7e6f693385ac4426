//! A remote buffer as a kernel names it (`gds_remote`): where `gds_peer_put`, `gds_peer_get`
//! and `gds_peer_put_bounce` write or read at the peer, and how far they may go.

use crate::RemoteBuf;

/// One rank's region as a kernel sees it (`gds_remote`): a [`RemoteBuf`] in `#[repr(C)]`
/// form. The device functions refuse (`GDS_INVALID`) a put or get that would reach past
/// `len`, before anything is posted; the peer's device checks the access again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteDesc {
    /// The region's address at its rank.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Zero.
    pub reserved: u32,
}
const _: () = assert!(std::mem::size_of::<RemoteDesc>() == 24);

impl From<RemoteBuf> for RemoteDesc {
    fn from(r: RemoteBuf) -> Self {
        RemoteDesc {
            addr: r.addr,
            len: r.len,
            rkey: r.rkey,
            reserved: 0,
        }
    }
}

impl RemoteDesc {
    /// The descriptor's bytes, as a kernel reads them from a table in memory.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: #[repr(C)] of integers only with no padding (8 + 8 + 4 + 4 bytes, the size
        // assertion above), so every byte is initialised; the slice borrows self.
        unsafe {
            std::slice::from_raw_parts(
                self as *const Self as *const u8,
                std::mem::size_of::<Self>(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_buffer_keeps_its_fields_in_the_order_the_header_reads() {
        let d = RemoteDesc::from(RemoteBuf {
            addr: 0x1122_3344_5566_7788,
            len: 4096,
            rkey: 0xabcd,
        });
        let b = d.as_bytes();
        assert_eq!(u64::from_ne_bytes(b[0..8].try_into().unwrap()), d.addr);
        assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 4096);
        assert_eq!(u32::from_ne_bytes(b[16..20].try_into().unwrap()), 0xabcd);
        assert_eq!(&b[20..24], &[0; 4]);
    }
}
