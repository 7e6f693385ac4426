//! The buffer argument of mp.h's two-sided calls: one buffer (`buf`, `size`), or a
//! `struct iovec` list of blocks (LibMP's vector calls). The communicator moves one buffer per
//! message, so the blocks must follow one another in memory and travel as that one buffer;
//! blocks apart are refused, where LibMP gathered them.

use crate::args;
use crate::status::{Fail, Res};
use std::ffi::{c_int, c_void};

/// At most this many blocks in one vector call (LibMP's default limit of gathered blocks).
pub const MP_IOV_MAX: c_int = 30;

/// A two-sided call's buffer: `size` bytes at `buf`, or the `nblocks` blocks at `v`.
#[derive(Clone, Copy)]
pub(crate) enum Src {
    Buf(*mut c_void, c_int),
    Vec(*mut libc::iovec, c_int),
}

impl Src {
    /// The one buffer: its start and size (not yet checked against a registration).
    pub(crate) fn buffer(self) -> Res<(*mut c_void, c_int)> {
        match self {
            Src::Buf(buf, size) => Ok((buf, size)),
            Src::Vec(v, n) => one_run(v, n),
        }
    }
}

/// The one buffer the `n` blocks at `v` make, each starting where the one before ends.
fn one_run(v: *mut libc::iovec, n: c_int) -> Res<(*mut c_void, c_int)> {
    if !(1..=MP_IOV_MAX).contains(&n) {
        return Err(Fail::invalid(format!(
            "nblocks {n}: pass 1 to MP_IOV_MAX ({MP_IOV_MAX}) blocks"
        )));
    }
    let blocks = args::array(
        v as *const libc::iovec,
        n as usize,
        MP_IOV_MAX as usize,
        "v",
    )?;
    let start = blocks[0].iov_base as usize;
    let mut end = start;
    for (i, b) in blocks.iter().enumerate() {
        if b.iov_base as usize != end {
            return Err(Fail::invalid(format!(
                "block {i} starts at {:#x}, not where block {} ends ({end:#x}): the blocks must follow one another in memory (blocks apart are not gathered)",
                b.iov_base as usize,
                i.saturating_sub(1)
            )));
        }
        end = end
            .checked_add(b.iov_len)
            .ok_or_else(|| Fail::invalid("the blocks' lengths overflow"))?;
    }
    let size = c_int::try_from(end - start).map_err(|_| {
        Fail::invalid(format!(
            "the blocks hold {} bytes, more than an int",
            end - start
        ))
    })?;
    Ok((blocks[0].iov_base, size))
}
