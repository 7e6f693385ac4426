//! The mlx5 data-path formats, byte for byte: send and receive WQEs and their segments (one
//! writer and one reader each), CQEs, opcodes, syndromes, doorbell values and ring-index
//! arithmetic.
//!
//! Pure types, no I/O. Every multi-byte field is big-endian in memory, as the HCA reads it;
//! [`Be16`], [`Be32`] and [`Be64`] keep that visible in the types. Immediate data and inline
//! payload are opaque bytes and pass through unswapped. The layouts follow rdma-core's
//! `mlx5dv.h` (see `docs/soft-device.md` for the sources); sizes are asserted at compile time.

mod cqe;
mod doorbell;
mod index;
mod opcode;
mod recv_wqe;
mod send_wqe;
mod wqe;

pub use cqe::{Cqe64, CqeOwner, CQE_INIT_OP_OWN, CQE_OWNER_WORD_OFFSET, CQE_SIZE};
pub use doorbell::{
    cq_ci_value, doorbell_end, doorbell_value, qp_dbrec_value, DBREC_CQ_CI, DBREC_RQ, DBREC_SQ,
};
pub use index::{
    advance16, catch_up24, cq_full24, idx16, idx16_diff, reached, reached16, wqebbs_for_ds,
};
pub use opcode::{CompletionOp, CqeOpcode, Opcode, Syndrome};
pub use recv_wqe::RecvWqe;
pub(crate) use send_wqe::{write_fixed, write_inline_seg};
pub use send_wqe::{CommonData, CommonWqe, SendWqe, WqeData};
pub use wqe::{
    AtomicSeg, CtrlSeg, DataSeg, DataSegIter, DataSegs, FmCeSe, InlineHeader, RaddrSeg, WqeError,
    INLINE_SEG_FLAG, INVALID_LKEY, MAX_INLINE_DATA, MAX_WQE_DS, MAX_WQE_WQEBBS, SEG_SIZE, WQEBB,
};

/// A big-endian 16-bit field as it lies in memory.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Be16([u8; 2]);
/// A big-endian 32-bit field as it lies in memory.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Be32([u8; 4]);
/// A big-endian 64-bit field as it lies in memory.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Be64([u8; 8]);

macro_rules! be_impl {
    ($t:ident, $int:ty) => {
        impl $t {
            /// Stores `v` big-endian.
            pub const fn new(v: $int) -> Self {
                Self(v.to_be_bytes())
            }
            /// The value in host order.
            pub const fn get(self) -> $int {
                <$int>::from_be_bytes(self.0)
            }
            /// The raw bytes, as in memory.
            pub const fn bytes(self) -> [u8; core::mem::size_of::<$int>()] {
                self.0
            }
            /// The value a native (little-endian on x86) load of these bytes gives: what a
            /// memory operation must write or compare to produce these bytes.
            pub const fn native(self) -> $int {
                <$int>::from_ne_bytes(self.0)
            }
        }
        impl core::fmt::Debug for $t {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}({:#x})", stringify!($t), self.get())
            }
        }
    };
}
be_impl!(Be16, u16);
be_impl!(Be32, u32);
be_impl!(Be64, u64);

const _: () = assert!(core::mem::size_of::<Be16>() == 2);
const _: () = assert!(core::mem::size_of::<Be32>() == 4);
const _: () = assert!(core::mem::size_of::<Be64>() == 8);
#[cfg(test)]
mod c_header;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wqe_tests;
