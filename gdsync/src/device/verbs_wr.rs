//! Posting and polling through libmlx5 itself: `ibv_post_send` and `ibv_post_recv` with
//! gdsync's work requests translated to verbs ones, and `ibv_poll_cq`. gdsync's data path
//! writes WQEs and reads CQEs with its own code; these let rdma-core's encoder and decoder do
//! the same work, so that the two can be compared byte for byte and the device's execution
//! checked against what rdma-core produced and reads back. Also a region's SGEs and remote
//! addresses as gdsync's work requests name them.
//!
//! This is glue between the queue layer's work requests and the mlx5 backend, kept out of
//! both: the mlx5 provider knows rdma-core, not the queue layer.

use super::mlx5::{sys, Cq, Mr, Qp, RdmaError, RdmaResult};
use crate::wr::{RecvWr, RemoteAddr, SendFlags, SendWr, Sge, WrOp};

/// The verbs send flags for gdsync's; `INLINE_HOST` (a gdsync choice, not a verbs flag) is
/// refused rather than guessed.
fn send_flags(f: SendFlags) -> RdmaResult<u32> {
    if f.contains(SendFlags::INLINE_HOST) {
        return Err(RdmaError::InvalidArgument(
            "INLINE_HOST has no verbs equivalent: say INLINE or nothing".into(),
        ));
    }
    let pairs = [
        (SendFlags::SIGNALED, sys::IBV_SEND_SIGNALED),
        (SendFlags::INLINE, sys::IBV_SEND_INLINE),
        (SendFlags::FENCE, sys::IBV_SEND_FENCE),
        (SendFlags::SOLICITED, sys::IBV_SEND_SOLICITED),
    ];
    Ok(pairs
        .iter()
        .filter(|(ours, _)| f.contains(*ours))
        .fold(0, |acc, (_, verbs)| acc | verbs))
}

fn verbs_sges(sges: &[Sge]) -> Vec<sys::ibv_sge> {
    sges.iter()
        .map(|g| sys::ibv_sge {
            addr: g.addr,
            length: g.len,
            lkey: g.lkey,
        })
        .collect()
}

/// `wr` as a verbs send work request (its scatter/gather list in `sges`, which must outlive
/// the result's use).
fn verbs_send_wr(wr: &SendWr, sges: &mut [sys::ibv_sge]) -> RdmaResult<sys::ibv_send_wr> {
    let mut v = sys::ibv_send_wr {
        wr_id: wr.wr_id,
        sg_list: sges.as_mut_ptr(),
        num_sge: sges.len() as i32,
        send_flags: send_flags(wr.flags)?,
        ..Default::default()
    };
    // Verbs' imm_data is in network order: its bytes are the big-endian immediate, which is
    // what gdsync's writer puts into the WQE.
    let imm = |v: &mut sys::ibv_send_wr, i: u32| v.__bindgen_anon_1.imm_data = i.to_be();
    let rdma = |v: &mut sys::ibv_send_wr, r: RemoteAddr| {
        v.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: r.addr,
            rkey: r.rkey,
        }
    };
    let atomic = |v: &mut sys::ibv_send_wr, r: RemoteAddr, compare_add, swap| {
        v.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: r.addr,
            compare_add,
            swap,
            rkey: r.rkey,
        }
    };
    v.opcode = match wr.op {
        WrOp::Send => sys::IBV_WR_SEND,
        WrOp::SendImm(i) => {
            imm(&mut v, i);
            sys::IBV_WR_SEND_WITH_IMM
        }
        WrOp::Write(r) => {
            rdma(&mut v, r);
            sys::IBV_WR_RDMA_WRITE
        }
        WrOp::WriteImm(r, i) => {
            rdma(&mut v, r);
            imm(&mut v, i);
            sys::IBV_WR_RDMA_WRITE_WITH_IMM
        }
        WrOp::Read(r) => {
            rdma(&mut v, r);
            sys::IBV_WR_RDMA_READ
        }
        WrOp::FetchAdd { remote, add } => {
            atomic(&mut v, remote, add, 0);
            sys::IBV_WR_ATOMIC_FETCH_AND_ADD
        }
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            atomic(&mut v, remote, compare, swap);
            sys::IBV_WR_ATOMIC_CMP_AND_SWP
        }
        WrOp::Nop => {
            return Err(RdmaError::InvalidArgument(
                "ibv_post_send has no NOP opcode".into(),
            ))
        }
    };
    Ok(v)
}

impl Qp {
    /// libmlx5's own `ibv_post_send` of `wrs` (chained, one doorbell): libmlx5 writes the WQEs
    /// into this QP's send ring and rings the doorbell (BlueFlame for a single small WQE).
    ///
    /// # Safety
    /// The memory every SGE and remote address names must stay allocated and registered
    /// until the work completes: the HCA reads and writes it (inline payload is copied at
    /// the call).
    pub unsafe fn verbs_post_send(&self, wrs: &[SendWr]) -> RdmaResult<()> {
        let mut sges: Vec<Vec<sys::ibv_sge>> = wrs.iter().map(|w| verbs_sges(&w.sges)).collect();
        let mut chain = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(w, s)| verbs_send_wr(w, s))
            .collect::<RdmaResult<Vec<_>>>()?;
        let Some(first) = link(&mut chain, |w, next| w.next = next) else {
            return Ok(());
        };
        let qp = self.raw.as_ptr();
        let mut bad = std::ptr::null_mut();
        // SAFETY: FFI on the live QP, through the provider's post_send (what verbs.h's inline
        // ibv_post_send calls); the chain and its SGE lists outlive the call.
        let rc = match (*(*qp).context).ops.post_send {
            Some(post) => post(qp, first, &mut bad),
            None => libc::EOPNOTSUPP,
        };
        RdmaError::check("ibv_post_send", rc)
    }

    /// libmlx5's own `ibv_post_recv` of `wrs` (chained): it writes the scatter lists into
    /// this QP's receive ring and updates the doorbell record.
    ///
    /// # Safety
    /// The memory every SGE names must stay allocated and registered until the receive
    /// completes: the HCA writes into it.
    pub unsafe fn verbs_post_recv(&self, wrs: &[RecvWr]) -> RdmaResult<()> {
        let mut sges: Vec<Vec<sys::ibv_sge>> = wrs.iter().map(|w| verbs_sges(&w.sges)).collect();
        let mut chain: Vec<sys::ibv_recv_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(w, s)| sys::ibv_recv_wr {
                wr_id: w.wr_id,
                next: std::ptr::null_mut(),
                sg_list: s.as_mut_ptr(),
                num_sge: s.len() as i32,
            })
            .collect();
        let Some(first) = link(&mut chain, |w, next| w.next = next) else {
            return Ok(());
        };
        let qp = self.raw.as_ptr();
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in verbs_post_send, through the provider's post_recv.
        let rc = match (*(*qp).context).ops.post_recv {
            Some(post) => post(qp, first, &mut bad),
            None => libc::EOPNOTSUPP,
        };
        RdmaError::check("ibv_post_recv", rc)
    }
}

/// A work completion as libmlx5's `ibv_poll_cq` decoded it (`struct ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// `ibv_wc_status` (0: success).
    pub status: u32,
    /// `ibv_wc_opcode`: 0 send, 1 RDMA write, 2 RDMA read, 3 compare-and-swap,
    /// 4 fetch-and-add, 128 receive, 129 receive of an RDMA write with immediate.
    pub opcode: u32,
    /// Bytes received (receives), read or fetched.
    pub byte_len: u32,
    /// The immediate (host order), where the completion carries one.
    pub imm: Option<u32>,
    /// The local QP number.
    pub qp_num: u32,
    /// The vendor syndrome of an error completion.
    pub vendor_err: u32,
}

impl Cq {
    /// libmlx5's own `ibv_poll_cq`: up to `max` completions, decoded by rdma-core from the
    /// CQEs the HCA wrote (and the CQ's consumer index advanced by it).
    pub fn verbs_poll(&self, max: usize) -> RdmaResult<Vec<VerbsCompletion>> {
        let mut wc = vec![sys::ibv_wc::default(); max];
        let cq = self.raw.as_ptr();
        let n = i32::try_from(max).unwrap_or(i32::MAX);
        // SAFETY: FFI on the live CQ through the provider's poll_cq (what verbs.h's inline
        // ibv_poll_cq calls), with room for `n` entries.
        let got = unsafe {
            match (*(*cq).context).ops.poll_cq {
                Some(poll) => poll(cq, n, wc.as_mut_ptr()),
                None => -libc::EOPNOTSUPP,
            }
        };
        if got < 0 {
            return Err(RdmaError::Verbs {
                call: "ibv_poll_cq",
                errno: -got,
            });
        }
        wc.truncate(got as usize);
        Ok(wc
            .iter()
            .map(|w| VerbsCompletion {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                byte_len: w.byte_len,
                // SAFETY: imm_data is the member libmlx5 fills when the flag says so.
                imm: (w.wc_flags & sys::IBV_WC_WITH_IMM != 0)
                    .then(|| u32::from_be(unsafe { w.__bindgen_anon_1.imm_data })),
                qp_num: w.qp_num,
                vendor_err: w.vendor_err,
            })
            .collect())
    }
}

/// Links the work requests of `chain` in order (the last one's `next` stays null); returns
/// the first, or `None` for an empty chain.
fn link<T>(chain: &mut [T], set_next: impl Fn(&mut T, *mut T)) -> Option<*mut T> {
    for i in 1..chain.len() {
        let next: *mut T = &mut chain[i];
        set_next(&mut chain[i - 1], next);
    }
    chain.first_mut().map(|w| w as *mut T)
}

impl Mr<'_> {
    /// `len` bytes at offset `off` of the region, as a local SGE. Not checked against the
    /// region's bounds: as with `ibv_sge`, the device checks what a work request names.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr().wrapping_add(off),
            len,
            lkey: self.lkey(),
        }
    }

    /// Byte `off` of the region, as a peer addresses it in RDMA and atomic requests (not
    /// checked: the peer's device checks it).
    pub fn remote(&self, off: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr().wrapping_add(off),
            rkey: self.rkey(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemoteAddr;

    #[test]
    fn send_flags_map_to_verbs_and_inline_host_is_refused() {
        let f = send_flags(SendFlags::SIGNALED | SendFlags::FENCE | SendFlags::INLINE).unwrap();
        assert_eq!(
            f,
            sys::IBV_SEND_SIGNALED | sys::IBV_SEND_FENCE | sys::IBV_SEND_INLINE
        );
        assert_eq!(send_flags(SendFlags::empty()).unwrap(), 0);
        assert!(send_flags(SendFlags::INLINE_HOST).is_err());
    }

    #[test]
    fn work_requests_translate_with_their_operands() {
        let r = RemoteAddr {
            addr: 0x1000,
            rkey: 0x22,
        };
        let w = verbs_send_wr(&SendWr::write_imm(r, 0x0102_0304), &mut []).unwrap();
        assert_eq!(w.opcode, sys::IBV_WR_RDMA_WRITE_WITH_IMM);
        // SAFETY: reading the union members just written.
        unsafe {
            assert_eq!(w.__bindgen_anon_1.imm_data.to_ne_bytes(), [1, 2, 3, 4]);
            assert_eq!((w.wr.rdma.remote_addr, w.wr.rdma.rkey), (0x1000, 0x22));
        }
        let w = verbs_send_wr(&SendWr::compare_swap(r, 5, 6), &mut []).unwrap();
        // SAFETY: as above.
        let a = unsafe { w.wr.atomic };
        assert_eq!((a.compare_add, a.swap, a.rkey), (5, 6, 0x22));
        assert!(verbs_send_wr(&SendWr::nop(), &mut []).is_err());
    }

    #[test]
    fn a_chain_links_in_order() {
        let mut chain = vec![sys::ibv_recv_wr::default(); 3];
        let first = link(&mut chain, |w, next| w.next = next).unwrap();
        let at = |i: usize| &chain[i] as *const sys::ibv_recv_wr;
        assert_eq!(first.cast_const(), at(0));
        assert_eq!(chain[0].next.cast_const(), at(1));
        assert_eq!(chain[1].next.cast_const(), at(2));
        assert!(chain[2].next.is_null());
        assert!(link(&mut Vec::<sys::ibv_recv_wr>::new(), |w, n| w.next = n).is_none());
    }
}
