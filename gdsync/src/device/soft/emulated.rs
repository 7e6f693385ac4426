//! The soft device as the HCA behind the emulated kernel driver (the `uverbs-emu` test
//! crate): a process that runs under that driver attaches one soft device per emulated
//! device ([`serve_emulated_driver`]), and the driver hands it every MR, CQ and QP that
//! rdma-core's libmlx5 creates, with libmlx5's own rings, doorbell records and BlueFlame
//! register. The soft engine then executes the WQEs libmlx5's `ibv_post_send` writes and
//! writes the CQEs libmlx5's `ibv_poll_cq` reads: rdma-core's own encoder and decoder run
//! against the soft device, as they would against a ConnectX.
//!
//! The driver calls the functions here through a table of C function pointers (`struct
//! uvemu_hca_ops` in uverbs-emu's `c/uvemu.h`), with its lock held and after pinning the
//! memory it names (the process's unmapping of those pages is put off until the object is
//! destroyed, as a kernel pins them) and checking it is mapped and writable.
//!
//! A path's address (the GID or LID given to `ibv_modify_qp`) names a device of this process,
//! or one of another process under another emulator of the host (a node of the emulators'
//! fabric): each process publishes its devices' endpoints there when it attaches, and the
//! driver hands a QP bound elsewhere the peer's endpoint. The two soft devices then link as
//! any two soft devices of two processes do (shared memory on one host, TCP where
//! `GDSYNC_SOFT_LINK=tcp` asks for it), and the death of the peer's process fails the QPs.

use super::device::{DriverQp, SoftDevice};
use super::qp_numbers::QpNumbers;
use crate::mem::RingMem;
use crate::provider::Endpoint;
use crate::provider::*;
use crate::provider::{rnr_delay, transport_timeout, LinkPolicy};
use crate::Error;
use std::ffi::c_int;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// One soft device per emulated device, by device index.
static HCAS: OnceLock<Vec<Arc<SoftDevice>>> = OnceLock::new();

/// The driver's C interface, generated from its header (`uvemu.h`).
#[path = "uvemu_sys.rs"]
#[allow(non_camel_case_types, dead_code, clippy::all)]
mod sys;
use sys::{uvemu_hca_ops, uvemu_hca_qp, uvemu_hca_rtr, uvemu_hca_rts};

static OPS: uvemu_hca_ops = uvemu_hca_ops {
    reg_mr: Some(reg_mr),
    dereg_mr: Some(dereg_mr),
    create_cq: Some(create_cq),
    destroy_cq: Some(destroy_cq),
    create_qp: Some(create_qp),
    to_init: Some(to_init),
    to_rtr: Some(to_rtr),
    to_rts: Some(to_rts),
    destroy_qp: Some(destroy_qp),
    qp_state: Some(qp_state),
    qp_access: Some(qp_access),
};

/// The endpoint a peer's process published travels in `uvemu_hca_rtr` as gdsync's wire form.
const _: () = assert!(sys::UVEMU_ENDPOINT_LEN as usize == Endpoint::WIRE_LEN);

/// Processes under one emulator share its devices' QP numbers, as processes of a host share
/// an HCA's: slot `s` (of `QPN_SLOTS`, from the driver) numbers its QPs `s << 12 | 1 ..=
/// s << 12 | 0xfff`, so that a QP number tells the driver which process serves it.
const QPN_SLOT_SHIFT: u32 = sys::UVEMU_QPN_SLOT_SHIFT;
const QPN_SLOTS: c_int = sys::UVEMU_QPN_SLOTS as c_int;
const QPN_SLOT_SIZE: u32 = (1 << QPN_SLOT_SHIFT) - 1;

/// Makes this process's soft devices the HCA of the emulated RDMA driver it runs under: from
/// now on, the MRs, CQs and QPs libmlx5 creates on the emulated devices are served by soft
/// devices (one per emulated device), so work posted through libmlx5 executes and completes.
/// Returns the number of devices served; calling it again changes nothing. Fails where the
/// process does not run under the emulated driver.
pub fn serve_emulated_driver() -> std::result::Result<usize, String> {
    if let Some(h) = HCAS.get() {
        return Ok(h.len());
    }
    let count: unsafe extern "C" fn() -> c_int = driver_fn(c"uvemu_device_count")?;
    let attach: unsafe extern "C" fn(*const uvemu_hca_ops) -> c_int =
        driver_fn(c"uvemu_attach_hca")?;
    // SAFETY: the driver's function, as uvemu.h declares it.
    let n = unsafe { count() }.max(0) as usize;
    if attached_by_driver() {
        return Ok(n);
    }
    let slot: unsafe extern "C" fn() -> c_int = driver_fn(c"uvemu_qpn_slot")?;
    // SAFETY: as above.
    let slot = match unsafe { slot() } {
        s @ 0..QPN_SLOTS => s as u32,
        e => {
            return Err(format!(
                "the emulated driver gave this process no share of its QP numbers: {} ({QPN_SLOTS} processes at most share one emulator)",
                std::io::Error::from_raw_os_error(-e)
            ))
        }
    };
    let devices = (0..n)
        .map(|_| {
            SoftDevice::spawn_numbering(QpNumbers::within(slot << QPN_SLOT_SHIFT, QPN_SLOT_SIZE))
        })
        .collect::<crate::Result<Vec<_>>>()
        .map_err(|e| format!("soft devices for the emulated driver: {e}"))?;
    for d in &devices {
        // A verbs program's RTR returns at once, as on a ConnectX, even where it moves to
        // RTR before its peer (ibv_rc_pingpong's server does).
        d.link_lazily();
    }
    if HCAS.set(devices).is_err() {
        return Ok(n); // another thread attached meanwhile
    }
    // SAFETY: the driver's function, with a table that lives for the whole process.
    match unsafe { attach(&OPS) } {
        0 => {
            publish_endpoints();
            // SAFETY: registers a function without arguments that lives as long as the process.
            unsafe { libc::atexit(stop_hcas) };
            Ok(n)
        }
        e => Err(format!(
            "the emulated driver refused the soft HCA: {}",
            std::io::Error::from_raw_os_error(e)
        )),
    }
}

/// Whether the driver already has a HCA: the soft HCA it loads into a process that opened a
/// device first (`$UVEMU_HCA`, under `scripts/with-emulated-hca`), another copy of this code
/// that serves this process as this one would. A driver without the query has none loaded.
fn attached_by_driver() -> bool {
    driver_fn::<unsafe extern "C" fn() -> c_int>(c"uvemu_hca_attached")
        // SAFETY: the driver's function, taking nothing (uvemu.c).
        .is_ok_and(|attached| unsafe { attached() } == 1)
}

/// At exit, the soft HCAs stop and close their links in order, so that peer processes see
/// a device that went away, not a process that died mid-run (a warning there).
extern "C" fn stop_hcas() {
    for h in HCAS.get().into_iter().flatten() {
        h.stop();
    }
}

/// Publishes each device's endpoint on the emulators' fabric, so that processes under other
/// emulators reach this process's devices; without a fabric (or a driver that predates it),
/// QPs link within this process only.
fn publish_endpoints() {
    type Publish = unsafe extern "C" fn(c_int, *const u8, u32) -> c_int;
    let Ok(publish) = driver_fn::<Publish>(c"uvemu_publish") else {
        return;
    };
    for (dev, h) in HCAS.get().into_iter().flatten().enumerate() {
        let ep = h.endpoint(0).to_bytes();
        // SAFETY: the driver's function, with the endpoint's bytes and their length.
        let rc = unsafe { publish(dev as c_int, ep.as_ptr(), ep.len() as u32) };
        if rc != 0 {
            tracing::warn!(
                "emulated driver: device {dev} is not reachable from other processes: {}",
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
}

/// The emulated driver's function `name`, or why it is not there.
fn driver_fn<F: Copy>(name: &std::ffi::CStr) -> std::result::Result<F, String> {
    // SAFETY: dlsym with a NUL-terminated name, searching the loaded objects.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if f.is_null() {
        return Err("this process is not running under the emulated RDMA driver".into());
    }
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of_val(&f));
    // SAFETY: `F` is the function-pointer type uvemu.h declares for `name`.
    Ok(unsafe { std::mem::transmute_copy(&f) })
}

/// The soft device serving emulated device `dev`.
fn hca(dev: c_int) -> Option<&'static Arc<SoftDevice>> {
    HCAS.get()?.get(usize::try_from(dev).ok()?)
}

/// A command's outcome as the errno the driver returns (the reason logged).
fn errno(what: &str, r: crate::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!("emulated driver: the soft HCA refused {what}: {e}");
            match e {
                Error::Unreachable(_) => libc::ENETUNREACH,
                Error::InvalidArgument(_) => libc::EINVAL,
                _ => libc::ENOMEM,
            }
        }
    }
}

/// Runs `f` on device `dev`'s soft HCA, or answers ENODEV.
fn on(dev: c_int, what: &str, f: impl FnOnce(&SoftDevice) -> crate::Result<()>) -> c_int {
    match hca(dev) {
        Some(h) => errno(what, f(h)),
        None => libc::ENODEV,
    }
}

/// Pages the driver checked (mapped, writable) and the offset of `addr` in them.
fn foreign(addr: u64, len: usize) -> (Arc<RingMem>, usize) {
    // SAFETY: the driver checked the range is mapped and writable; libmlx5 frees it only
    // after the destroy that makes the device let go of it (destroy_qp waits for the
    // engine; a CQ is destroyed only once no QP uses it).
    let (mem, off) = unsafe { RingMem::foreign(addr, len) };
    (Arc::new(mem), off)
}

/// A ring must start on a page: the device's ring offsets count from 0.
fn page_aligned(what: &str, addr: u64) -> crate::Result<()> {
    match addr % crate::mem::page_size() as u64 {
        0 => Ok(()),
        _ => Err(Error::invalid(format!(
            "{what} at {addr:#x} does not start on a page"
        ))),
    }
}

extern "C" fn reg_mr(
    dev: c_int,
    pd: u32,
    addr: u64,
    len: u64,
    access: u32,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    on(dev, "a memory region", |h| {
        let memory = match access & sys::UVEMU_MR_DMABUF {
            0 => MrMemory::Host,
            // A dma-buf the process exported from GPU memory: its IOVA is the GPU address,
            // whose bytes the soft device moves through the CUDA driver. (The emulated driver
            // serves libmlx5 and has no CUDA handle of its own: it classifies the address with
            // the process's default one, which the exporter's shares the primary contexts of.)
            _ => match crate::cuda::MemoryKind::of(addr) {
                crate::cuda::MemoryKind::Device { ordinal } => {
                    MrMemory::Gpu(crate::cuda::Cuda::get()?.gpu_ctx(ordinal)?)
                }
                _ => {
                    return Err(Error::Unsupported(format!(
                        "a dma-buf region at IOVA {addr:#x}: the emulated driver serves dma-bufs of CUDA device memory at their GPU address only"
                    )))
                }
            },
        };
        let spec = MrSpec {
            pd,
            addr,
            len,
            access: Access::from_bits_truncate(access & !sys::UVEMU_MR_DMABUF),
            memory,
        };
        let keys = h.reg_mr(&spec)?;
        // SAFETY: the driver passes pointers to its object's key fields.
        unsafe { (lkey.write(keys.lkey), rkey.write(keys.rkey)) };
        Ok(())
    })
}

extern "C" fn dereg_mr(dev: c_int, lkey: u32) {
    if let Some(h) = hca(dev) {
        h.dereg_mr(lkey);
    }
}

extern "C" fn create_cq(dev: c_int, buf: u64, entries: u32, dbrec: u64, cqn: *mut u32) -> c_int {
    on(dev, "a CQ", |h| {
        page_aligned("the CQ ring", buf)?;
        if !entries.is_power_of_two() {
            return Err(Error::invalid(format!("{entries} CQEs: not a power of 2")));
        }
        let (ring, _) = foreign(buf, entries as usize * crate::format::CQE_SIZE);
        let (mem, off) = foreign(dbrec, 8);
        let dbrec = MemAt { mem, off };
        let mem = Some(CqMem { ring, dbrec });
        let created = h.create_cq(CqSpec { entries, mem })?;
        // SAFETY: the driver passes a pointer to its object's CQ number.
        unsafe { cqn.write(created.cqn) };
        Ok(())
    })
}

extern "C" fn destroy_cq(dev: c_int, cqn: u32) {
    if let Some(h) = hca(dev) {
        h.destroy_cq(cqn);
    }
}

extern "C" fn create_qp(dev: c_int, q: *const uvemu_hca_qp, qpn: *mut u32) -> c_int {
    // SAFETY: the driver passes a filled uvemu_hca_qp.
    let q = unsafe { &*q };
    on(dev, "a QP", |h| {
        // The ring may start anywhere in its page (a parent domain's allocator places it at
        // a sub-page offset, which an mlx5 kernel accepts): its offset there is the RQ's.
        let rq_bytes = q.rq_wqes as usize * q.rq_stride as usize;
        let (buf, rq_off) = foreign(
            q.buf,
            rq_bytes + q.sq_wqebbs as usize * crate::format::WQEBB,
        );
        let sq_off = rq_off + rq_bytes;
        let (db_mem, db_off) = foreign(q.dbrec, 8);
        let (bf_mem, bf_off) = foreign(q.bf_reg, 8);
        // A QP on a dynamic UAR page may be rung at the page's other bfreg too, further on in
        // the same page (the device refuses one past the page).
        let pair = match q.bf_reg2.checked_sub(q.bf_reg) {
            _ if q.bf_reg2 == 0 => None,
            Some(d) if d < crate::mem::page_size() as u64 => Some(bf_off + d as usize),
            _ => {
                return Err(Error::invalid(format!(
                    "second doorbell register {:#x} not after {:#x} in its page",
                    q.bf_reg2, q.bf_reg
                )))
            }
        };
        let mem = QpMem {
            buf,
            sq_off,
            dbrec: MemAt {
                mem: db_mem,
                off: db_off,
            },
        };
        let driver = DriverQp {
            doorbell: MemAt {
                mem: bf_mem,
                off: bf_off,
            },
            pair,
            user_index: q.user_index,
            rq_off,
        };
        let spec = QpSpec {
            pd: q.pdn,
            rq_wqes: q.rq_wqes,
            rq_stride: q.rq_stride,
            sq_wqebbs: q.sq_wqebbs,
            max_inline: 0,
            send_cqn: q.send_cqn,
            recv_cqn: q.recv_cqn,
            mem: Some(mem),
        };
        let created = h.create_qp_with(spec, Some(driver))?;
        // SAFETY: the driver passes a pointer to its object's QP number.
        unsafe { qpn.write(created.qpn) };
        Ok(())
    })
}

extern "C" fn to_init(dev: c_int, qpn: u32) -> c_int {
    on(dev, "INIT", |h| h.modify_qp(qpn, QpModify::Init))
}

extern "C" fn to_rtr(dev: c_int, qpn: u32, r: *const uvemu_hca_rtr) -> c_int {
    // SAFETY: the driver passes a filled uvemu_hca_rtr.
    let r = unsafe { &*r };
    let remote = match r.dest_dev {
        // A device of another process, as it published itself.
        -1 => match Endpoint::from_bytes(&r.peer) {
            Ok(ep) => Endpoint {
                qpn: r.dest_qpn,
                ..ep
            },
            Err(e) => return errno("RTR", Err(e)),
        },
        d => match hca(d) {
            // A device of this process: no TCP address is needed to reach it.
            Some(peer) => Endpoint {
                host: crate::provider::host_id(),
                pid: std::process::id(),
                device: peer.uid(),
                qpn: r.dest_qpn,
                addr: None,
                link: LinkPolicy::default(),
                port: None,
            },
            None => return libc::ENETUNREACH,
        },
    };
    on(dev, "RTR", |h| {
        h.modify_qp(
            qpn,
            QpModify::Rtr(QpPath {
                remote,
                rq_psn: r.rq_psn,
                mtu: r.mtu,
                route: Default::default(),
            }),
        )
    })
}

extern "C" fn to_rts(dev: c_int, qpn: u32, r: *const uvemu_hca_rts) -> c_int {
    // SAFETY: the driver passes a filled uvemu_hca_rts.
    let r = unsafe { &*r };
    let timers = QpTimers {
        sq_psn: r.sq_psn,
        timeout: give_up_after(r.timeout, r.retry_cnt),
        retry_cnt: r.retry_cnt,
        // IB's 7 retries forever, which the soft device spells u8::MAX.
        rnr_retry: if r.rnr_retry >= 7 {
            u8::MAX
        } else {
            r.rnr_retry
        },
        min_rnr_timer: rnr_delay(r.min_rnr_timer),
    };
    on(dev, "RTS", |h| h.modify_qp(qpn, QpModify::Rts(timers)))
}

extern "C" fn destroy_qp(dev: c_int, qpn: u32) {
    if let Some(h) = hca(dev) {
        h.destroy_qp(qpn);
    }
}

/// The remote access a QP grants (`IB_ACCESS_REMOTE_WRITE/READ/ATOMIC`, the values of
/// `ibv_access_flags`), set at INIT and by any later modify that names access flags.
extern "C" fn qp_access(dev: c_int, qpn: u32, access: u32) -> c_int {
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let granted = Access::from_bits_truncate(access) & remote;
    on(dev, "QP access flags", |h| h.set_qp_access(qpn, granted))
}

/// The QP's state as the soft HCA holds it (`enum ib_qp_state`; -1 for no such device): the
/// driver's QUERY_QP reports an error state the HCA entered on its own.
extern "C" fn qp_state(dev: c_int, qpn: u32) -> c_int {
    const IB_QPS_ERR: c_int = 6;
    match hca(dev).map(|h| h.query_qp(qpn).state) {
        None => -1,
        Some(HwQpState::Error) => IB_QPS_ERR,
        Some(s) => s as c_int,
    }
}

/// How long a QP waits for an answer before it fails: a ConnectX retransmits `retry_cnt`
/// times, each after the transport timeout, before it reports retries exceeded. The soft
/// link loses nothing, so the soft HCA waits the whole span once.
fn give_up_after(timeout: u8, retry_cnt: u8) -> Duration {
    transport_timeout(timeout) * (u32::from(retry_cnt.min(7)) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uvemu_bindings_match_the_header() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../test-support/uverbs-emu/c/uvemu.h"
        );
        let header = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(
            crate::provider::fnv1a(&header),
            sys::UVEMU_H_FNV1A,
            "uvemu.h changed since uvemu_sys.rs was generated from it: run scripts/regen-uvemu-bindings"
        );
    }

    #[test]
    fn outside_the_emulated_driver_nothing_is_served() {
        let e = serve_emulated_driver().unwrap_err();
        assert!(
            e.contains("not running under the emulated RDMA driver"),
            "{e}"
        );
    }

    /// A QP spec over `owner`'s pages, as the driver would build it from libmlx5's memory,
    /// with the doorbell register at `bf_off` of a foreign page.
    fn foreign_qp(owner: &RingMem, cqn: u32, bf_off: usize) -> (QpSpec, DriverQp) {
        let (buf, _) = foreign(owner.addr(0), 2 * crate::mem::page_size());
        let (db, db_off) = foreign(owner.addr(0x1000), 8);
        let (bf, _) = foreign(owner.addr(0x2000), 8);
        let spec = QpSpec {
            pd: 1,
            rq_wqes: 16,
            rq_stride: 32,
            sq_wqebbs: 16,
            max_inline: 0,
            send_cqn: cqn,
            recv_cqn: cqn,
            mem: Some(QpMem {
                buf,
                sq_off: 512,
                dbrec: MemAt {
                    mem: db,
                    off: db_off,
                },
            }),
        };
        let driver = DriverQp {
            doorbell: MemAt {
                mem: bf,
                off: bf_off,
            },
            pair: None,
            user_index: 7,
            rq_off: 0,
        };
        (spec, driver)
    }

    #[test]
    fn foreign_rings_are_served_and_never_freed() {
        let owner = RingMem::host(4 * crate::mem::page_size());
        let dev = SoftDevice::spawn().unwrap();
        let (ring, off) = foreign(owner.addr(0x3000), 64 * 8);
        assert_eq!(off, 0);
        let (dbrec, dbrec_off) = foreign(owner.addr(0x1040), 8);
        assert_eq!((dbrec_off, dbrec.len()), (0x40, crate::mem::page_size()));
        let dbrec = MemAt {
            mem: dbrec,
            off: dbrec_off,
        };
        let mem = Some(CqMem { ring, dbrec });
        let cqn = dev.create_cq(CqSpec { entries: 8, mem }).unwrap().cqn;
        let create_qp = |(spec, driver)| dev.create_qp_with(spec, Some(driver));
        // A register whose second half would leave the page is refused, not trusted.
        let e = create_qp(foreign_qp(&owner, cqn, 0xF00)).err().unwrap();
        assert!(e.to_string().contains("doorbell register"), "{e}");
        let qp = create_qp(foreign_qp(&owner, cqn, 0x800)).unwrap();
        assert_eq!(
            qp.doorbell.addr(),
            owner.addr(0x2800),
            "the register it was given"
        );
        dev.destroy_qp(qp.qpn);
        dev.destroy_cq(cqn);
        drop(dev);
        // The foreign wrappers are gone; the owner's pages are still its own.
        owner.write(0x2800, &[1; 8]);
        let mut back = [0u8; 8];
        owner.read(0x2800, &mut back);
        assert_eq!(back, [1; 8]);
    }

    #[test]
    fn ib_timer_encodings() {
        assert_eq!(give_up_after(14, 7), Duration::from_nanos(8 * (4096 << 14)));
        assert_eq!(give_up_after(14, 0), transport_timeout(14));
    }
}
