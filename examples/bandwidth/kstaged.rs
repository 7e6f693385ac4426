//! The kernel trigger's staged path: `bandwidth --trigger kernel --mem device --op write` where
//! the device cannot DMA GPU memory (the soft device; an mlx5 device without dma-buf or peer
//! memory), or with `--staging on`.
//!
//! One launch of `bw_staged` (bandwidth.cu) per phase (a size's warm-up, then its timed
//! messages) runs a block of [`THREADS`] threads: thread 0 drives rank 0's QP as `bw` does,
//! and the whole block copies each `--chunk`-byte chunk of a message out of GPU memory into a
//! pinned host bounce of rank 0, made visible system-wide before thread 0 rings the doorbell
//! of the chunk's RDMA write with immediate into the same bounce of rank 1. The chunks take
//! the `--bounces` bounces in turn, so the block copies chunk k + 1 while chunk k is on the
//! wire. A bounce is filled again only once the write that read it completed (rank 0's side)
//! and rank 1 credited the chunk it carried (rank 1's side: its copy into GPU memory is
//! done). Rank 1 is the same CPU thread as for the cpu and stream triggers (`staged.rs`): it
//! copies each arrived chunk into its GPU buffer on a stream of its own and writes the count
//! of chunks copied into rank 0's credit word, which the kernel reads.
//!
//! [`schedule`] mirrors the kernel's arithmetic (bounce, bytes and waits of every chunk), for
//! the host's bookkeeping and the tests of its reuse rules. tests/kernel_channel.rs runs the
//! kernel itself, built for the host as a block of one thread, against the soft device.

use super::gpu::{describe, DONE, KERNEL, KERNEL_WAIT_NS, RC, SENT};
use super::staged::Stage;
use super::{Plan, Stall, TIMEOUT};
use crate::common::payload::Payload;
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{CudaStream, Function, Module};
use gdasync::gdsync::kernel::{code, DeviceQp};
use gdasync::gdsync::staging::Staging;
use gdasync::gdsync::{MemoryRegion, PinnedBuffer, Qp, RemoteBuf, SignalWords};
use std::sync::mpsc;

/// Threads of `bw_staged`'s block: thread 0 drives the QP, all of them copy.
pub(crate) const THREADS: u32 = 512;
/// The result word that says which wait failed (`BWS_STEP` in bandwidth.cu), and its values.
const STEP: usize = 5;
const STEP_CREDIT: u64 = 1;
const STEP_WRITTEN: u64 = 2;
const STEP_POST: u64 = 3;

/// One chunk of a `bw_staged` launch, as the kernel handles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KernelChunk {
    /// Position in the launch (from 0).
    pub at: usize,
    /// Sequence number in the run: the write's immediate, what credits count.
    pub seq: usize,
    /// The bounce it goes through, on both ranks.
    pub bounce: usize,
    /// Bytes `offset..offset + len` of its message.
    pub offset: usize,
    pub len: usize,
    /// The credit word's value thread 0 waits for before the block fills the bounce (rank 1
    /// copied in the chunk that used it last), if any.
    pub credit_before: Option<usize>,
    /// Writes of this launch that must have completed before the block fills the bounce
    /// (the write that read it last among them), if any.
    pub written_before: Option<usize>,
}

/// The chunks of a launch of `n` messages of `size` bytes whose first chunk is chunk `first`
/// of the run, in the kernel's order.
pub(crate) fn schedule(
    chunk: usize,
    bounces: usize,
    size: usize,
    n: usize,
    first: usize,
) -> impl Iterator<Item = KernelChunk> {
    let count = size.div_ceil(chunk.max(1));
    (0..n * count).map(move |at| {
        let seq = first + at;
        let offset = (at % count) * chunk;
        KernelChunk {
            at,
            seq,
            bounce: seq % bounces,
            offset,
            len: chunk.min(size - offset),
            credit_before: (seq + 1).checked_sub(bounces).filter(|&c| c > 0),
            written_before: (at + 1).checked_sub(bounces).filter(|&c| c > 0),
        }
    })
}

/// The chunk size the kernel cuts with, given `--chunk` and the bytes between bounces: the
/// bounces are as small as the largest message where it is below a chunk, and every message
/// is then one chunk, cut the same either way (the kernel refuses chunks over a bounce).
fn kernel_chunk(chunk: usize, slot: usize) -> usize {
    chunk.min(slot)
}

/// What a failed `bw_staged` says.
fn failure(rc: i32, step: u64, sent: u64, chunks: usize) -> String {
    let what = match (rc, step) {
        (code::TIMEOUT, STEP_CREDIT) => format!(
            "rank 1 credited no chunk for {} s (it did not copy a chunk in, or its credit write was lost)",
            KERNEL_WAIT_NS / 1_000_000_000
        ),
        (code::TIMEOUT, STEP_WRITTEN) => format!(
            "no write completed for {} s",
            KERNEL_WAIT_NS / 1_000_000_000
        ),
        (_, STEP_POST) => format!("posting a write failed: {}", describe(rc)),
        _ => describe(rc),
    };
    format!("the staged kernel failed after posting {sent} of {chunks} chunks: {what}")
}

/// Rank 0 on the kernel trigger: the kernel, its QP, its bounces and payload, the credit word
/// rank 1 writes, and the chunks sent since the start.
pub(crate) struct KernelPush<'a> {
    f: Function,
    stream: CudaStream,
    dq: DeviceQp,
    words: SignalWords,
    stage: &'a Stage,
    src: u64,
    /// Rank 0's bounces: the GPUs' address (the block's copies), the NIC's, the key, and the
    /// bytes between slots.
    out_gpu: u64,
    out_nic: u64,
    lkey: u32,
    slot: usize,
    /// Rank 1's bounces.
    remote: RemoteBuf,
    credit: &'a PinnedBuffer,
    seq: usize,
}

impl<'a> KernelPush<'a> {
    /// Compiles the kernel and hands it rank 0's QP.
    pub(crate) fn new(
        plan: &Plan,
        stage: &'a Stage,
        q0: Qp,
        bounce: (&Staging, &MemoryRegion),
        remote: RemoteBuf,
        src: &Payload,
        credit: &'a PinnedBuffer,
    ) -> Result<KernelPush<'a>> {
        let module = Module::compile(plan.gpu(0), KERNEL)
            .context("compile the bandwidth kernels with NVRTC")?;
        let dq = q0.into_device()?;
        let (st, mr) = bounce;
        if !dq.gpu_mapped() || !st.bounce().gpu_mapped() || !credit.gpu_mapped() {
            bail!("rank 0's rings, bounces or credit word are not reachable from the GPU (mapping pinned host memory failed)");
        }
        Ok(KernelPush {
            f: module.function("bw_staged")?,
            stream: CudaStream::new(plan.gpu(0))?,
            dq,
            words: SignalWords::new(STEP + 1),
            stage,
            src: src.addr(),
            out_gpu: st.bounce().gpu_addr(),
            out_nic: mr.addr(),
            lkey: mr.lkey(),
            slot: st.chunk(),
            remote,
            credit,
            seq: 0,
        })
    }

    /// One launch: `n` messages of `size` bytes; returns once every chunk is credited and
    /// rank 1 reported its phase (`done`), or with the first failure of either rank.
    pub(crate) fn phase(
        &mut self,
        size: usize,
        n: u64,
        done: &mpsc::Receiver<Result<()>>,
    ) -> Result<()> {
        let (chunk, bounces) = (self.stage.chunk, self.stage.bounces);
        let chunks = schedule(chunk, bounces, size, n as usize, self.seq).count();
        for w in 0..=STEP {
            self.words.store64(w, 0);
        }
        self.launch(size, n)?;
        // The kernel's own waits time out first; the stall check only catches a kernel that
        // never ran. A failure of rank 1 ends the phase at once.
        let (mut stall, mut rank1) = (Stall::new(), false);
        while self.words.load64(DONE) == 0 {
            if let Ok(r) = done.try_recv() {
                r?;
                rank1 = true;
            }
            let pr = self.dq.progress();
            let credited = self.credit_value();
            stall.check(
                pr.sends_posted + pr.send_cqes + credited,
                "the staged kernel",
            )?;
            std::thread::yield_now();
        }
        self.stream.synchronize()?;
        let (rc, sent) = (self.words.load64(RC) as i32, self.words.load64(SENT));
        if rc != code::OK {
            bail!(failure(rc, self.words.load64(STEP), sent, chunks));
        }
        if sent != chunks as u64 {
            bail!("the staged kernel posted {sent} chunks, not {chunks}");
        }
        if !rank1 {
            done.recv_timeout(TIMEOUT)
                .context("rank 1 did not finish")??;
        }
        self.seq += chunks;
        Ok(())
    }

    /// The credit word: chunks rank 1 copied in since the start.
    fn credit_value(&self) -> u64 {
        let mut b = [0u8; 8];
        self.credit.read_at(0, &mut b);
        u64::from_ne_bytes(b)
    }

    fn launch(&self, size: usize, n: u64) -> Result<()> {
        let q = self.dq.desc();
        let chunk = kernel_chunk(self.stage.chunk, self.slot) as u64;
        let (sdev, size) = (self.src, size as u64);
        let (slot, bounces, first) = (self.slot as u64, self.stage.bounces as u32, self.seq as u64);
        let (out_gpu, out_nic, lkey) = (self.out_gpu, self.out_nic, self.lkey);
        let (raddr, rkey) = (self.remote.addr, self.remote.rkey);
        let (credit, words) = (self.credit.gpu_addr(), self.words.gpu_addr(0));
        let timeout = KERNEL_WAIT_NS;
        let mut l = self.f.launch_builder(&self.stream);
        l.arg(&q)
            .arg(&sdev)
            .arg(&size)
            .arg(&n)
            .arg(&chunk)
            .arg(&slot);
        l.arg(&bounces)
            .arg(&first)
            .arg(&out_gpu)
            .arg(&out_nic)
            .arg(&lkey);
        l.arg(&raddr)
            .arg(&rkey)
            .arg(&credit)
            .arg(&words)
            .arg(&timeout);
        // SAFETY: the parameters match `bw_staged` in bandwidth.cu; the QP, payload, bounces,
        // credit and result words outlive the kernel (it is waited for in `phase`, and on
        // failure the process ends without freeing them: exit_now).
        unsafe { l.launch(1, THREADS)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdasync::gdsync::ChunkPlan;

    /// Chunk sizes, bounce counts and message sizes around chunk boundaries.
    fn shapes() -> Vec<(usize, usize, usize)> {
        let mut v = Vec::new();
        for (chunk, bounces) in [(256 << 10, 4), (1024, 2), (1024, 3), (1000, 5), (4096, 64)] {
            for size in [1, chunk - 1, chunk, chunk + 1, 4 * chunk + 3, 1_048_579] {
                v.push((chunk, bounces, size));
            }
        }
        v
    }

    /// The kernel's chunks are the host pipeline's (`ChunkPlan`): the same bytes, bounces and
    /// sequence numbers message after message, and the same credit before a bounce's reuse.
    #[test]
    fn kernel_schedule_matches_the_chunk_plan() {
        for (chunk, bounces, size) in shapes() {
            let first = 7;
            let got: Vec<KernelChunk> = schedule(chunk, bounces, size, 3, first).collect();
            let plan = ChunkPlan::new(size, chunk, bounces).unwrap();
            let mut want = Vec::new();
            let mut seq = first;
            for _ in 0..3 {
                let p = plan.starting_at(seq);
                want.extend(p.chunks());
                seq += p.count();
            }
            assert_eq!(got.len(), want.len(), "{chunk} {bounces} {size}");
            for (g, w) in got.iter().zip(&want) {
                let at = (g.seq, g.bounce, g.offset, g.len);
                assert_eq!(
                    at,
                    (w.seq, w.bounce, w.offset, w.len),
                    "{chunk} {bounces} {size}"
                );
                let plan = ChunkPlan::new(size, chunk, bounces).unwrap();
                let owed = plan.starting_at(w.seq - w.index).must_be_credited(w.index);
                assert_eq!(g.credit_before, owed.map(|s| s + 1), "{g:?}");
            }
        }
    }

    /// Where every message is shorter than a chunk the bounces shrink to the largest, and
    /// the kernel cuts with the bounce size: the same chunks as the receiver's cut.
    #[test]
    fn a_kernel_cut_at_the_bounce_size_matches_the_chunk_size_cut() {
        let (chunk, max) = (1 << 20, 65536);
        let cut = kernel_chunk(chunk, max);
        assert!(cut <= max);
        for size in [1, 4096, 65535, 65536] {
            let by_bounce: Vec<_> = schedule(cut, 4, size, 9, 3).collect();
            let by_chunk: Vec<_> = schedule(chunk, 4, size, 9, 3).collect();
            assert_eq!(by_bounce, by_chunk, "{size}");
        }
        assert_eq!(kernel_chunk(256 << 10, 1 << 20), 256 << 10);
    }

    /// Bounce reuse: when a chunk fills a bounce, the chunk that used it last is credited
    /// (rank 1 copied it in) and, if this launch wrote it, its write completed; the previous
    /// launch drained all. And the pipeline stays double-buffered: a chunk never waits for
    /// the write of the chunk just before it, and never for a write not yet posted.
    #[test]
    fn a_bounce_is_reused_only_after_its_write_completed_and_was_credited() {
        for (chunk, bounces, size) in shapes() {
            let mut first = 0;
            for n in [1usize, 2, 5] {
                let mut last: Vec<Option<KernelChunk>> = vec![None; bounces];
                for c in schedule(chunk, bounces, size, n, first) {
                    if let Some(prev) = last[c.bounce] {
                        assert!(
                            c.credit_before >= Some(prev.seq + 1),
                            "{c:?} after {prev:?}"
                        );
                        assert!(
                            c.written_before >= Some(prev.at + 1),
                            "{c:?} after {prev:?}"
                        );
                    } else if c.seq >= bounces {
                        // Last used by an earlier launch: credited before this one's fill.
                        assert!(c.credit_before >= Some(c.seq + 1 - bounces), "{c:?}");
                    }
                    assert!(c.written_before.is_none_or(|w| w < c.at), "{c:?}");
                    assert!(c.credit_before.is_none_or(|w| w < c.seq), "{c:?}");
                    last[c.bounce] = Some(c);
                }
                first += n * size.div_ceil(chunk);
            }
        }
    }
}
