//! Who rings the NIC's doorbell when a stream or kernel posts: the GPU itself, or a CPU proxy
//! thread the GPU signals through a host word (for when the GPU may not write the doorbell
//! page, e.g. a UAR that cannot be mapped without `PeerMappingOverride` or root).

use crate::backoff::Backoff;
use crate::mem::RingMem;
use crate::provider::{MemAt, Provider};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// Who rings the doorbell for GPU-posted work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NicHandler {
    /// The GPU (stream or kernel) stores the doorbell record and the doorbell itself.
    Gpu,
    /// The GPU stores the new producer index to a host word; a CPU proxy thread rings.
    Cpu,
}

impl NicHandler {
    /// The handler `GDSYNC_NIC_HANDLER` (auto | gpu | cpu) asks for; `None` for auto or unset.
    pub fn from_env() -> Result<Option<NicHandler>> {
        Ok(
            match crate::env::choice("GDSYNC_NIC_HANDLER", &["auto", "gpu", "cpu"])? {
                Some("gpu") => Some(NicHandler::Gpu),
                Some("cpu") => Some(NicHandler::Cpu),
                _ => None,
            },
        )
    }

    /// The handler for a soft device, and why: `GDSYNC_NIC_HANDLER` if set, else the GPU
    /// (the soft device's doorbell page is pinned host memory, which GPUs can always write).
    pub fn choose_soft() -> Result<(NicHandler, &'static str)> {
        Ok(match Self::from_env()? {
            Some(h) => (h, "set by GDSYNC_NIC_HANDLER"),
            None => (
                NicHandler::Gpu,
                "auto: the soft device's doorbell page is pinned host memory the GPU can write",
            ),
        })
    }
}

/// The handler for a QP whose device says whether GPUs can store to its doorbell register
/// (`gpu_doorbell`: the page is mapped for GPUs and CUDA gave its device address), and why:
/// `GDSYNC_NIC_HANDLER` (`env`) if set, else the GPU where it can, else the CPU proxy, with
/// the device's reason. A GPU asked for where it cannot ring gets the CPU proxy, and says so:
/// it would store to an address it has no mapping of.
pub(crate) fn choose(
    env: Option<NicHandler>,
    gpu_doorbell: &std::result::Result<(), String>,
) -> (NicHandler, String) {
    match (env, gpu_doorbell) {
        (Some(NicHandler::Gpu), Err(why)) => (
            NicHandler::Cpu,
            format!("GDSYNC_NIC_HANDLER=gpu, but {why}"),
        ),
        (Some(h), _) => (h, "set by GDSYNC_NIC_HANDLER".into()),
        (None, Ok(())) => (
            NicHandler::Gpu,
            "auto: GPUs can store to the device's doorbell page".into(),
        ),
        (None, Err(why)) => (NicHandler::Cpu, format!("auto: {why}")),
    }
}

/// Logs who rings for GPU-posted work, once per process and handler: a CPU proxy at warn level
/// (a thread polls for the GPU's requests, which costs a core and a hop of latency), the GPU
/// at debug level.
pub(crate) fn log_choice(h: NicHandler, why: &str) {
    static LOGGED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];
    if LOGGED[h as usize].swap(true, Ordering::Relaxed) {
        return;
    }
    match h {
        NicHandler::Gpu => tracing::debug!("NIC handler: the GPU rings the doorbell ({why})"),
        NicHandler::Cpu => tracing::warn!(
            "NIC handler: a CPU proxy thread rings the doorbell for GPU-posted work ({why}): it costs a CPU core and adds latency"
        ),
    }
}

/// What the proxy rings for one QP: the word the GPU stores its producer index to, the send
/// doorbell record, the doorbell register, and the "rung to" word it stores after the
/// doorbell (what a CPU post of the QP reads to know the proxy's doorbell is out).
pub(crate) struct ProxyTarget {
    pub qpn: u32,
    pub request: MemAt,
    pub sq_dbrec: MemAt,
    pub doorbell: MemAt,
    pub rung: MemAt,
    /// The register is write-combining device memory: fence around the store.
    pub doorbell_wc: bool,
    /// How to ring (the queue layer's doorbell sequence): record, register, "rung to",
    /// write-combining, QPN, the producer counter the GPU asked for.
    pub ring: RingFn,
}

/// How the proxy rings a QP's doorbell (see [`ProxyTarget::ring`]).
pub(crate) type RingFn = fn(&AtomicU32, &AtomicU64, &AtomicU64, bool, u32, u64);

/// The QPs a proxy watches.
#[derive(Default)]
struct Targets {
    /// Held weakly through their QP's control page (gone with the QP).
    targets: Vec<(Weak<RingMem>, Arc<ProxyTarget>)>,
    /// Counts changes, so the proxy thread knows when to take a new copy.
    generation: u64,
}

/// The CPU proxy of one device: a thread that rings doorbells GPUs asked for.
#[derive(Default)]
pub(crate) struct Proxy {
    qps: Mutex<Targets>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts watching `qp`'s proxy word (and the thread, on first use).
    pub(crate) fn watch(
        self: &Arc<Self>,
        target: ProxyTarget,
        dev: &Arc<dyn Provider>,
    ) -> Result<()> {
        let life = Arc::downgrade(&target.request.mem);
        let mut qps = self.qps.lock();
        // Destroyed QPs leave (the list would otherwise grow with every QP ever watched).
        qps.targets.retain(|(w, _)| w.strong_count() > 0);
        qps.targets.push((life, Arc::new(target)));
        qps.generation += 1;
        drop(qps);
        let mut t = self.thread.lock();
        if t.is_none() {
            tracing::debug!("{}: CPU proxy thread started", dev.name());
            let me = Arc::downgrade(self);
            let dev = Arc::downgrade(dev);
            let stop = self.stop.clone();
            *t = Some(
                std::thread::Builder::new()
                    .name("gdsync-proxy".into())
                    .spawn(move || run(me, dev, stop))
                    .map_err(|e| Error::os("spawn CPU proxy thread", e))?,
            );
        }
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.get_mut().take() {
            // The last reference may be dropped by the proxy thread itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn run(me: Weak<Proxy>, dev: Weak<dyn Provider>, stop: Arc<AtomicBool>) {
    let mut backoff = Backoff::default();
    let mut rung: Vec<(Weak<RingMem>, Arc<ProxyTarget>, u64)> = Vec::new();
    let mut seen = 0;
    while !stop.load(Ordering::Acquire) {
        let Some(p) = me.upgrade() else { return };
        {
            let qps = p.qps.lock();
            if qps.generation != seen {
                seen = qps.generation;
                let last = |t: &Arc<ProxyTarget>| {
                    rung.iter()
                        .find(|(_, r, _)| Arc::ptr_eq(r, t))
                        .map_or(0, |(_, _, l)| *l)
                };
                rung = qps
                    .targets
                    .iter()
                    .map(|(w, t)| (w.clone(), t.clone(), last(t)))
                    .collect();
            }
        }
        drop(p);
        let mut work = false;
        for (w, qp, last) in rung.iter_mut() {
            let Some(_alive) = w.upgrade() else { continue };
            let want = qp.request.mem.u64(qp.request.off).load(Ordering::Acquire);
            if want != *last {
                // What the GPU would have stored: the doorbell record, then a doorbell whose
                // index is the new producer index (as NVSHMEM and DOCA ring), and after its
                // second fence "rung to".
                (qp.ring)(
                    qp.sq_dbrec.mem.u32(qp.sq_dbrec.off),
                    qp.doorbell.mem.u64(qp.doorbell.off),
                    qp.rung.mem.u64(qp.rung.off),
                    qp.doorbell_wc,
                    qp.qpn,
                    want,
                );
                *last = want;
                work = true;
            }
        }
        if work {
            if let Some(d) = dev.upgrade() {
                d.kick();
            }
            backoff.reset();
        } else {
            backoff.snooze();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doorbell_page_without_a_gpu_address_is_rung_by_the_cpu_proxy_and_says_why() {
        let no = Err("the doorbell page of mlx5_0 cannot be mapped for GPUs (cuMemHostGetDevicePointer failed)".to_string());
        for env in [None, Some(NicHandler::Gpu)] {
            let (h, why) = choose(env, &no);
            assert_eq!(h, NicHandler::Cpu, "{env:?}");
            assert!(why.contains("cuMemHostGetDevicePointer"), "{why}");
        }
        assert_eq!(choose(Some(NicHandler::Cpu), &Ok(())).0, NicHandler::Cpu);
        assert_eq!(choose(None, &Ok(())).0, NicHandler::Gpu);
    }
}
