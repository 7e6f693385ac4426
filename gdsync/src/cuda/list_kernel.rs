//! A staged op list as one kernel on the stream, instead of memory-operation batches with
//! copy kernels between them.
//!
//! A staged send's list is a copy into a bounce and then the doorbell stores; a staged
//! receive's is the completion wait and then a copy out of its bounce. Run as memory
//! operations with a copy kernel between them, each half costs the stream a switch between its
//! memory-operation queue and a kernel, which on an H200 delays the kernel by 3–5 µs each time
//! (docs/benchmarks.md). `gdsync_run_list` runs the whole list in one block of threads
//! instead: thread 0 makes the stores, the waits and the fences, in list order, and the block
//! copies between them. Kernels follow kernels on a stream without that switch.
//!
//! What runs here is what the memory operations would run: the same words, values and
//! conditions, at the GPUs' addresses of the memory the list keeps alive, with the list's
//! barriers as system-wide fences. A wait spins in the kernel where a memory operation would
//! park the stream; like it, it passes on an error completion (the owner bit moves) and has no
//! timeout of its own (`CudaStream::synchronize_within` names the wait that holds a stream).
//! Lists that this cannot run the same way stay memory operations: copies larger than
//! [`LIST_COPY_MAX`] (one block copies them slower than a grid; misaligned ones past 4 KiB),
//! memory a kernel cannot reach, waits on a GPU that must flush inbound RDMA writes before a
//! wait passes (a kernel cannot flush), and lists of more than 32 operations (one launch's
//! worth; a staged message's list has about ten). `GDSYNC_LIST_KERNEL=off` keeps every list as memory operations.
//!
//! Lists without copies stay memory operations while the process's streams are all on one GPU
//! and the job has not said its ranks span GPUs (`GDSYNC_LIST_KERNEL=auto`, the default; `all`
//! runs them as this kernel always). On one GPU neither way wins everywhere (H200, p50 half
//! round trips and µs per iteration, docs/benchmarks.md): gdsync's stream lists cost about the
//! same either way (8-byte write ping-pong 5.05 µs as list kernels, 5.19 as memory operations)
//! and four ranks of stencil2d sharing the GPU leave a slow mode that memory operations fall
//! into one run in two or three (28.1–29.0 against 28.4 or 36.7–38.8), but `mp`'s send takes
//! 6.14 against 5.25: a list kernel costs a launch, holds a warp while it waits, and each
//! barrier in it waits for the thread's earlier stores to reach the system. With streams on two
//! GPUs of one process at once, a stream's own stores cost about 3 µs each (`stream_span.rs`)
//! and list kernels win.

use super::staging_kernels::{kind, staging_kernels, LIST_OPS};
use super::stream::ListKernel;
use super::Function;
use super::{CudaStream, InboundWrites, KernelArg};
use crate::mem::{gpu_addr_in, gpu_mapped_in};
use crate::ops::{Op, Ops};
use crate::Result;

/// Largest copy a list kernel makes; lists with a larger one run as memory operations and
/// copy kernels (a grid copies large payloads faster than one block).
pub const LIST_COPY_MAX: u64 = 32 << 10;
/// Largest copy a list kernel makes between addresses that differ in alignment mod 16 (read
/// byte by byte).
const MISALIGNED_COPY_MAX: u64 = 4 << 10;
/// Most threads of a list kernel's block (a copy of [`LIST_COPY_MAX`] takes four steps).
const LIST_BLOCK: u32 = 512;

/// Threads for a list whose largest copy is `bytes`: one 16-byte access each, whole warps,
/// at most [`LIST_BLOCK`]. A list without copies takes one warp: a kernel waiting in a stream
/// holds its threads on an SM, and small blocks let many streams wait at once.
fn block_for(bytes: u64) -> u32 {
    (bytes.div_ceil(16).div_ceil(32) * 32).clamp(32, u64::from(LIST_BLOCK)) as u32
}

/// One op, as the kernel reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ListOp {
    kind: u32,
    cond: u32,
    a: u64,
    b: u64,
    c: u64,
}
const _: () = assert!(std::mem::size_of::<ListOp>() == 32);

/// One launch's parameter: up to [`LIST_OPS`] ops and the progress word to store after them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ListParams {
    n: u32,
    seq: u32,
    /// Where to write the launch's timestamps (profiling: `list_profile.rs`), or 0.
    stamps: u64,
    done: u64,
    op: [ListOp; LIST_OPS],
}
const _: () = assert!(std::mem::size_of::<ListParams>() == 24 + 32 * LIST_OPS);

// SAFETY: `#[repr(C)]` plain data laid out as `gdsync_list` (sizes asserted above; fields in
// the kernel's order and of its types).
unsafe impl KernelArg for ListParams {}

/// `ops` as the kernel's ops, at the GPUs' addresses of the memory the list keeps alive.
fn encode(ops: &Ops) -> Vec<ListOp> {
    let at = |addr| gpu_addr_in(ops.kept(), addr);
    ops.as_slice()
        .iter()
        .map(|op| match *op {
            Op::Write32 { addr, value } => ListOp {
                kind: kind::W32,
                a: at(addr),
                b: value.into(),
                ..Default::default()
            },
            Op::Write64 { addr, value } | Op::Doorbell { addr, value } => ListOp {
                kind: kind::W64,
                a: at(addr),
                b: value,
                ..Default::default()
            },
            Op::Wait32 { addr, value, cond } => ListOp {
                kind: kind::WAIT32,
                cond: cond.code(),
                a: at(addr),
                b: value.into(),
                c: 0,
            },
            Op::Wait64 { addr, value, cond } => ListOp {
                kind: kind::WAIT64,
                cond: cond.code(),
                a: at(addr),
                b: value,
                c: 0,
            },
            Op::Barrier => ListOp {
                kind: kind::FENCE,
                ..Default::default()
            },
            Op::Copy { dst, src, len } => ListOp {
                kind: kind::COPY,
                cond: 0,
                a: at(dst),
                b: at(src),
                c: len,
            },
        })
        .collect()
}

/// The launch that runs `ops` (at most [`LIST_OPS`]), storing the progress word `mark`
/// (address, sequence number) last where given, and its timestamps at `stamps` (0: none).
fn params(ops: &[ListOp], mark: Option<(u64, u32)>, stamps: u64) -> ListParams {
    let mut p = ListParams {
        n: ops.len() as u32,
        stamps,
        ..Default::default()
    };
    p.op[..ops.len()].copy_from_slice(ops);
    if let Some((done, seq)) = mark {
        p.done = done;
        p.seq = seq;
    }
    p
}

impl CudaStream {
    /// Runs `ops` (a list with copies) as a list kernel, if this stream may (see the module's
    /// header and [`ListKernel`]); else hands `ops` back for the memory-operation path.
    pub(super) fn run_list_by_kernel(&self, ops: Ops) -> Result<std::result::Result<(), Ops>> {
        let Some((list, encoded)) = self.list_plan(&ops) else {
            tracing::trace!(ops = ops.len(), "a staged list as memory operations");
            return Ok(Err(ops));
        };
        let n = ops.len();
        let largest = encoded
            .iter()
            .filter(|e| e.kind == kind::COPY)
            .map(|e| e.c)
            .max();
        let block = block_for(largest.unwrap_or(0));
        tracing::trace!(ops = n, block, "a staged list as list kernels");
        let stamps = self
            .list_profile()
            .map_or(0, |p| p.row_for(encoded.iter().map(|e| e.kind).collect()));
        self.enqueue_launched(ops, n, |mark| {
            let params = params(&encoded, mark, stamps);
            let mut args = list.launch_builder(self);
            args.arg(&params);
            // SAFETY: one parameter of the kernel's type (`gdsync_list`); the addresses are the
            // GPUs' addresses of memory the list keeps alive until the stream has passed it
            // (`enqueue_launched` holds the list until then), the stream's own progress
            // word, or the stream's profile rows (kept as long as the stream).
            unsafe { args.launch(1, block) }
        })?;
        Ok(Ok(()))
    }

    /// Runs the list kernel once with no ops, if this GPU has it (a new stream's warm-up: see
    /// `CudaStream::warm_up`; on a driver without `cuFuncLoad` this also loads its code
    /// before any stream waits).
    pub(super) fn warm_list_kernel(&self) -> Result<()> {
        let Some(list) = staging_kernels(self.ordinal()).and_then(|k| k.list) else {
            return Ok(());
        };
        let params = ListParams::default();
        let mut args = list.launch_builder(self);
        args.arg(&params);
        // SAFETY: a parameter of the kernel's type with no ops and no progress word: the
        // kernel touches no memory.
        unsafe { args.launch(1, 32) }
    }

    /// The list kernel and the encoded ops that run `ops` (a list with copies), or `None`
    /// where the list must stay memory operations (see the module's header).
    fn list_plan(&self, ops: &Ops) -> Option<(Function, Vec<ListOp>)> {
        // One launch per list: a list longer than one launch carries stays memory operations.
        if self.list_kernel() == ListKernel::Off || ops.len() > LIST_OPS {
            return None;
        }
        let waits = ops.as_slice().iter().any(Op::is_wait);
        if waits && self.caps().inbound_writes(true) == InboundWrites::Flush {
            return None;
        }
        let list = staging_kernels(self.ordinal())?.list?;
        let reaches = |gpu_addr| self.kernel_reaches(self.cuda().memory_kind(gpu_addr));
        let mut encoded = encode(ops);
        for (e, op) in encoded.iter_mut().zip(ops.as_slice()) {
            match *op {
                Op::Copy { dst, src, len } => {
                    // Bytes that cannot move 16 at a time are read one by one: past a few KiB
                    // a grid of copy threads is the faster way.
                    let bytewise = (dst ^ src) & 15 != 0 && len > MISALIGNED_COPY_MAX;
                    if len > LIST_COPY_MAX || bytewise {
                        return None;
                    }
                    e.cond = self.kernel_copy_fence(e.a, e.b)?;
                }
                Op::Barrier => {}
                // A store or a wait on memory the list keeps mapped for the GPUs is what a
                // stream's memory operation would reach too; anything else is checked (a
                // kernel faulting on it would poison the context).
                Op::Write32 { addr, .. }
                | Op::Write64 { addr, .. }
                | Op::Doorbell { addr, .. }
                | Op::Wait32 { addr, .. }
                | Op::Wait64 { addr, .. } => {
                    if !gpu_mapped_in(ops.kept(), addr) && !reaches(e.a) {
                        return None;
                    }
                }
            }
        }
        Some((list, encoded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::WaitCond;

    fn list(ops: &[Op]) -> Ops {
        let mut l = Ops::new();
        for op in ops {
            // SAFETY: the list is only encoded, never run.
            unsafe { l.push_raw(*op) };
        }
        l
    }

    #[test]
    fn each_op_is_encoded_as_the_kernel_reads_it() {
        let l = list(&[
            Op::Wait32 {
                addr: 0x1000,
                value: 7,
                cond: WaitCond::Eq,
            },
            Op::Write32 {
                addr: 0x2000,
                value: 9,
            },
            Op::Copy {
                dst: 0x3000,
                src: 0x4000,
                len: 13,
            },
            Op::Barrier,
            Op::Doorbell {
                addr: 0x5000,
                value: u64::MAX,
            },
            Op::Wait64 {
                addr: 0x6000,
                value: 1 << 40,
                cond: WaitCond::Geq,
            },
        ]);
        let e = encode(&l);
        let kinds: Vec<u32> = e.iter().map(|o| o.kind).collect();
        assert_eq!(kinds, [3, 1, 6, 5, 2, 4]);
        assert_eq!((e[0].a, e[0].b, e[0].cond), (0x1000, 7, 1));
        assert_eq!((e[2].a, e[2].b, e[2].c), (0x3000, 0x4000, 13));
        assert_eq!((e[4].a, e[4].b), (0x5000, u64::MAX));
        assert_eq!((e[5].b, e[5].cond), (1 << 40, 0));
    }

    #[test]
    fn blocks_are_whole_warps_sized_for_the_largest_copy() {
        assert_eq!(block_for(0), 32);
        assert_eq!(block_for(8), 32);
        assert_eq!(block_for(4096), 256);
        assert_eq!(block_for(4097), 288);
        assert_eq!(block_for(LIST_COPY_MAX), LIST_BLOCK);
        assert_eq!(block_for(u64::MAX), LIST_BLOCK);
    }

    #[test]
    fn a_launch_carries_its_ops_and_the_progress_word_only_when_asked() {
        let ops = vec![
            ListOp {
                kind: kind::FENCE,
                ..Default::default()
            };
            3
        ];
        let p = params(&ops, Some((0xd0, 42)), 0);
        assert_eq!((p.n, p.done, p.seq), (3, 0xd0, 42));
        assert_eq!(p.op[2].kind, kind::FENCE);
        assert_eq!(p.op[3], ListOp::default());
        assert_eq!(params(&ops, None, 0).done, 0);
        assert_eq!(params(&ops, None, 0x100).stamps, 0x100);
    }

    #[test]
    fn the_variable_takes_staged_or_off() {
        let v = |s| crate::env::choice_of("GDSYNC_LIST_KERNEL", Some(s), &["staged", "off"]);
        assert_eq!(v("off").unwrap(), Some("off"));
        let e = v("memops").unwrap_err().to_string();
        assert!(e.contains("GDSYNC_LIST_KERNEL") && e.contains("off"), "{e}");
    }
}
