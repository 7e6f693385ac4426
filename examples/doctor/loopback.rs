//! The doctor's loopback steps: two RC queue pairs of one device port connected to each
//! other, and a few thousand RDMA writes through them — posted by the CPU, rung by a CUDA
//! stream, or posted by a CUDA kernel — into host memory and into GPU memory. Each write
//! covers one 64-byte slot of a 4 KiB region with a pattern; afterwards the whole region is
//! read back and compared byte for byte with the source. The time from post to completion of
//! each write gives the p50.

use crate::common::cli::{Mem, Trigger};
use crate::common::stats::Stats;
use anyhow::{bail, Context, Result};
use gdasync::gdsync::cuda::{CudaStream, DeviceBuffer, Module};
use gdasync::gdsync::exec::Executor;
use gdasync::gdsync::kernel::code;
use gdasync::gdsync::{
    Access, Cq, Device, MemoryRegion, PinnedBuffer, ProtectionDomain, Qp, QpConfig, SendWr,
    SignalWords,
};
use std::time::{Duration, Instant};

/// Bytes per write.
const MSG: usize = 64;
/// Slots of the region: the writes cycle through them, so every byte is written.
const SLOTS: usize = 64;
/// The region written.
const REGION: usize = MSG * SLOTS;
/// How long one write may take before the step fails.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The kernel of the kernel-initiated writes.
pub const KERNEL: &str = include_str!("loopback.cu");

/// What a loopback step measured.
pub struct Outcome {
    /// Median time from post to completion, µs.
    pub p50_us: f64,
    pub writes: usize,
    /// The first byte of the region that differs from the source, and both values.
    pub mismatch: Option<(usize, u8, u8)>,
}

/// The source pattern: no zero byte (the target starts zeroed), and no period short enough
/// for a write into the wrong slot to match.
pub fn pattern() -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..REGION)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8 | 1
        })
        .collect()
}

/// The first difference between what landed and what was sent.
pub fn first_difference(sent: &[u8], landed: &[u8]) -> Option<(usize, u8, u8)> {
    sent.iter()
        .zip(landed)
        .position(|(a, b)| a != b)
        .map(|i| (i, sent[i], landed[i]))
}

/// The write target: pinned host memory or GPU 0's memory.
enum Target {
    Host(PinnedBuffer),
    Gpu(DeviceBuffer),
}

impl Target {
    fn new(mem: Mem) -> Result<Target> {
        Ok(match mem {
            Mem::Host => Target::Host(PinnedBuffer::new(REGION)),
            Mem::Device => Target::Gpu(DeviceBuffer::alloc(0, REGION)?),
        })
    }
    fn register<'a>(&'a self, pd: &ProtectionDomain) -> Result<MemoryRegion<'a>> {
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = match self {
            Target::Host(b) => pd.register_pinned(b, access)?,
            Target::Gpu(b) => pd
                .register_device(b, access)
                .context("registering GPU memory")?,
        };
        mr.try_write_at(0, &[0; REGION])?;
        Ok(mr)
    }
}

/// Two QPs of `dev` connected to each other; `a` posts, its send CQ is `scq`.
struct Pair {
    a: Qp,
    _b: Qp,
    scq: Cq,
    _cqs: [Cq; 2],
}

fn pair(dev: &Device, pd: &ProtectionDomain) -> Result<Pair> {
    let (scq, rcq, cqb) = (
        dev.create_cq(256)?,
        dev.create_cq(256)?,
        dev.create_cq(256)?,
    );
    let mut a = pd.create_qp(&scq, &rcq, &QpConfig::default())?;
    let mut b = pd.create_qp(&cqb, &cqb, &QpConfig::default())?;
    a.connect(&b.endpoint())?;
    b.connect(&a.endpoint())?;
    Ok(Pair {
        a,
        _b: b,
        scq,
        _cqs: [rcq, cqb],
    })
}

/// Write `i`: slot `i % SLOTS` of the source to the same slot of the target.
fn write(i: usize, src: &MemoryRegion, dst: &MemoryRegion) -> SendWr {
    let off = (i % SLOTS) * MSG;
    SendWr::write(dst.remote().at(off as u64)).sge(src.sge(off..off + MSG))
}

/// `writes` RDMA writes from host memory into `mem` on a fresh pair of QPs of `dev`, driven
/// by `trigger` (CPU, stream or kernel), checked byte for byte.
pub fn run(dev: &Device, trigger: Trigger, mem: Mem, writes: usize) -> Result<Outcome> {
    let pd = dev.alloc_pd();
    let p = pair(dev, &pd)?;
    let sent = pattern();
    let src = PinnedBuffer::new(REGION);
    src.write_at(0, &sent);
    let src_mr = pd.register_pinned(&src, Access::empty())?;
    let target = Target::new(mem)?;
    let dst_mr = target.register(&pd)?;
    let times = match trigger {
        Trigger::Cpu | Trigger::Host => cpu_writes(p, &src_mr, &dst_mr, writes),
        Trigger::Stream => stream_writes(p, &src_mr, &dst_mr, writes),
        Trigger::Kernel => kernel_writes(p, &src_mr, &dst_mr, writes),
    };
    let times = match times {
        Err(e) if e.is::<Stalled>() => {
            // A stream still waits on the pair and may write the target: keep both.
            std::mem::forget(dst_mr);
            std::mem::forget(target);
            std::mem::forget(src_mr);
            std::mem::forget(src);
            return Err(e);
        }
        r => r?,
    };
    let mut landed = vec![0u8; REGION];
    dst_mr.try_read_at(0, &mut landed)?;
    let n = times.len();
    Ok(Outcome {
        p50_us: Stats::new(MSG, times, 0.0).p50,
        writes: n,
        mismatch: first_difference(&sent, &landed),
    })
}

/// The CPU posts each write and polls its completion.
fn cpu_writes(
    mut p: Pair,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    writes: usize,
) -> Result<Vec<f64>> {
    let mut times = Vec::with_capacity(writes);
    for i in 0..writes {
        let t0 = Instant::now();
        p.a.post_send(&write(i, src, dst))?;
        p.scq
            .wait_one(TIMEOUT)
            .with_context(|| format!("write {i}"))?
            .ok()
            .with_context(|| format!("write {i}"))?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(times)
}

/// The CPU prepares each write; a CUDA stream on GPU 0 rings its doorbell and waits for its
/// completion; the CPU watches the stream's progress.
fn stream_writes(
    p: Pair,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    writes: usize,
) -> Result<Vec<f64>> {
    let stream = CudaStream::new(0)?;
    let r = executor_writes(p, src, dst, writes, &stream, || stream.synchronize());
    if r.as_ref().is_err_and(|e| e.is::<Stalled>()) {
        // Destroying a stream that still waits is not worth the risk: the process ends soon.
        std::mem::forget(stream);
    }
    r
}

/// A stream wait that did not pass within [`TIMEOUT`]: what it left behind (the queue pair,
/// the memory) must not be freed while the stream waits, so the doctor ends after saying so.
#[derive(Debug)]
pub struct Stalled(pub String);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stalled {}

/// Each write prepared by the CPU, its doorbell and completion wait handed to `exec`, then a
/// progress word the CPU watches for (with a deadline: a stream's wait has none); `sync`
/// waits for `exec` once all have passed.
fn executor_writes<E: Executor>(
    mut p: Pair,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    writes: usize,
    exec: &E,
    sync: impl Fn() -> gdasync::gdsync::Result<()>,
) -> Result<Vec<f64>> {
    let progress = SignalWords::new(1);
    let mut times = Vec::with_capacity(writes);
    for i in 0..writes {
        let prepared = p.a.prepare_send(&write(i, src, dst))?;
        let (ticket, doorbell) = p.a.commit(prepared).map_err(|e| e.error)?;
        let t0 = Instant::now();
        exec.submit(doorbell)?;
        exec.submit(p.a.send_wait_ops(&ticket)?)?;
        exec.submit(progress.write64(0, i as u64 + 1))?;
        while progress.load64(0) != i as u64 + 1 {
            if t0.elapsed() > TIMEOUT {
                let why = format!(
                    "write {i}: its completion wait did not pass within {TIMEOUT:?} ({}); the doctor stops here, as the stream still waits",
                    p.a.describe()
                );
                std::mem::forget(p);
                std::mem::forget(progress);
                return Err(Stalled(why).into());
            }
            std::hint::spin_loop();
        }
        times.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    sync()?;
    // A wait passes on an error completion too (the byte check would see the write missing):
    // name the error instead.
    p.scq.check().context("the writes' completions")?;
    Ok(times)
}

/// One thread of a CUDA kernel on GPU 0 posts every write and waits for each completion.
fn kernel_writes(
    p: Pair,
    src: &MemoryRegion,
    dst: &MemoryRegion,
    writes: usize,
) -> Result<Vec<f64>> {
    let module = Module::compile(0, KERNEL)?;
    let stream = CudaStream::new(0)?;
    let q = p.a.into_device()?;
    let (stamps, rc) = (PinnedBuffer::new(writes * 8), PinnedBuffer::new(8));
    let desc = q.desc();
    let (s, lkey, raddr, rkey) = (src.addr(), src.lkey(), dst.addr(), dst.rkey());
    let (msg, slots, n) = (MSG as u32, SLOTS as u32, writes as u64);
    let (t, timeout, r) = (stamps.addr(), TIMEOUT.as_nanos() as u64, rc.addr());
    let f = module.function("doctor_writes")?;
    let mut l = f.launch_builder(&stream);
    l.arg(&desc).arg(&s).arg(&lkey).arg(&raddr).arg(&rkey);
    l.arg(&msg)
        .arg(&slots)
        .arg(&n)
        .arg(&t)
        .arg(&timeout)
        .arg(&r);
    // SAFETY: the arguments match doctor_writes's parameters; the QP, the regions and the
    // pinned words outlive the kernel (the stream is synchronised before any is dropped).
    unsafe { l.launch(1, 1)? };
    stream.synchronize()?;
    let mut word = [0u8; 8];
    rc.read_at(0, &mut word);
    let rc = u32::from_le_bytes([word[0], word[1], word[2], word[3]]) as i32;
    if rc != 1 {
        let code = rc - 1000;
        bail!(
            "the kernel's writes ended with code {code} ({})",
            if code == code::TIMEOUT {
                "a completion did not come"
            } else {
                "an error completion or a full ring"
            }
        );
    }
    let mut raw = vec![0u8; writes * 8];
    stamps.read_at(0, &mut raw);
    drop(q);
    Ok(raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64 / 1e3)
        .collect())
}

/// Whether `trigger` and `mem` can run here, and if not why (a SKIP).
pub fn cannot_run(trigger: Trigger, mem: Mem, gpu: bool, nvrtc: bool) -> Option<&'static str> {
    if (trigger.gpu() || mem == Mem::Device) && !gpu {
        return Some("no GPU");
    }
    if trigger == Trigger::Kernel && !nvrtc {
        return Some("no NVRTC (kernel-initiated needs it)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_has_no_zero_and_no_short_period() {
        let p = pattern();
        assert_eq!(p.len(), REGION);
        assert!(p.iter().all(|&b| b != 0));
        for shift in (MSG..REGION).step_by(MSG) {
            assert_ne!(
                p[..MSG],
                p[shift..shift + MSG],
                "slot {shift} repeats slot 0"
            );
        }
    }

    #[test]
    fn one_wrong_byte_is_found() {
        let p = pattern();
        let mut q = p.clone();
        assert_eq!(first_difference(&p, &q), None);
        q[1234] ^= 0x40;
        assert_eq!(first_difference(&p, &q), Some((1234, p[1234], q[1234])));
    }

    /// The kernel step's pair meets what handing a QP to a kernel asks (dedicated CQs as
    /// large as the rings): on the process's default device (the soft device; under
    /// `scripts/with-emulated-hca`, mlx5_0, whose libmlx5 sizes the rings itself).
    #[test]
    fn the_pair_can_be_handed_to_a_kernel() {
        let dev = Device::default().unwrap();
        let pd = dev.alloc_pd();
        let p = pair(&dev, &pd).unwrap();
        p.a.into_device().unwrap();
    }

    /// The stream step's loop, with a host stream in the CUDA stream's place: the waits
    /// retire the ring and the CQ (256 entries) over many more writes than either holds.
    #[test]
    fn the_stream_loop_retires_what_it_waits_for() {
        let dev = Device::default().unwrap();
        let pd = dev.alloc_pd();
        let p = pair(&dev, &pd).unwrap();
        let sent = pattern();
        let src = PinnedBuffer::new(REGION);
        src.write_at(0, &sent);
        let src_mr = pd.register_pinned(&src, Access::empty()).unwrap();
        let target = Target::new(Mem::Host).unwrap();
        let dst_mr = target.register(&pd).unwrap();
        let hs = gdasync::gdsync::exec::HostStream::new().unwrap();
        let times = executor_writes(p, &src_mr, &dst_mr, 1000, &hs, || hs.synchronize()).unwrap();
        assert_eq!(times.len(), 1000);
        let mut landed = vec![0u8; REGION];
        dst_mr.try_read_at(0, &mut landed).unwrap();
        assert_eq!(first_difference(&sent, &landed), None);
    }

    /// A write that completes in error (here: into a region without remote write access)
    /// fails the stream step, naming the error, although the stream's wait passed.
    #[test]
    fn an_error_completion_under_a_stream_fails_the_step() {
        let dev = Device::soft().unwrap();
        let pd = dev.alloc_pd();
        let p = pair(&dev, &pd).unwrap();
        let src = PinnedBuffer::new(REGION);
        let src_mr = pd.register_pinned(&src, Access::empty()).unwrap();
        let dst_mr = pd.register_pinned(&src, Access::empty()).unwrap();
        let hs = gdasync::gdsync::exec::HostStream::new().unwrap();
        let e = executor_writes(p, &src_mr, &dst_mr, 10, &hs, || hs.synchronize()).unwrap_err();
        assert!(!e.is::<Stalled>(), "{e:#}");
        let msg = format!("{e:#}");
        assert!(msg.starts_with("the writes' completions: "), "{msg}");
    }

    #[test]
    fn cpu_writes_on_the_soft_device_land_byte_for_byte() {
        let dev = Device::soft().unwrap();
        let o = run(&dev, Trigger::Cpu, Mem::Host, 200).unwrap();
        assert_eq!(o.writes, 200);
        assert_eq!(o.mismatch, None);
        assert!(o.p50_us > 0.0);
    }
}
