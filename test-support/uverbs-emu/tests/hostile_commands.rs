//! The emulated driver's command decoder against hostile input, as the kernel's is: truncated
//! and oversized commands, lengths that disagree with the bytes given, response pointers that
//! are null, wild or read-only, handles of the wrong type or context or already destroyed,
//! objects destroyed while in use, malformed ioctls, and random bytes. Every one returns an
//! errno; none crashes the process. With a (stand-in) HCA attached for the data path, memory
//! that is not mapped, or a ring that is not writable, is EFAULT before the HCA hears of it. Commands are written as raw bytes to the emulated
//! `/dev/infiniband/uverbs0` (no rdma-core needed), in a child started under the emulator.

use std::ffi::c_void;
use uverbs_emu::command_stream::{Stream, RESP_AREA};
use uverbs_emu::in_child_under_emulator;

// Legacy command numbers and sizes (rdma/ib_user_verbs.h).
const GET_CONTEXT: u32 = 0;
const QUERY_DEVICE: u32 = 1;
const ALLOC_PD: u32 = 3;
const DEALLOC_PD: u32 = 4;
const REG_MR: u32 = 9;
const DEREG_MR: u32 = 13;
const CREATE_CQ: u32 = 18;
const DESTROY_CQ: u32 = 20;
const EXTENDED: u32 = 0x8000_0000;
/// `RDMA_VERBS_IOCTL`: `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)` (24 bytes).
const RDMA_VERBS_IOCTL: u64 = 0xc018_1b01;

/// Memory a response may not be written to.
static READ_ONLY: [u8; 512] = [0; 512];

/// The emulated device's command file and a response area.
struct Dev(Stream);

impl Dev {
    fn open() -> Dev {
        Dev(Stream::open(c"/dev/infiniband/uverbs0").expect("open the emulated device"))
    }

    /// Writes `bytes` from `buf`; the count, or the errno.
    fn write_raw(&self, buf: *const c_void, len: usize) -> Result<usize, i32> {
        // SAFETY: a write to the emulated device; the emulator reads at most `len` bytes at
        // `buf` and answers EFAULT where they are not readable.
        let n = unsafe { libc::write(self.0.fd, buf, len) };
        match n {
            n if n >= 0 => Ok(n as usize),
            _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
        }
    }

    fn write(&self, bytes: &[u8]) -> Result<usize, i32> {
        self.write_raw(bytes.as_ptr().cast(), bytes.len())
    }

    /// A legacy command: header (`in_words` counting it), then `req`.
    fn cmd(&self, op: u32, req: &[u8], out_words: u16) -> Result<usize, i32> {
        self.write(&legacy(op, req, out_words))
    }

    /// The response area's address, as a command's first word gives it.
    fn resp_ptr(&self) -> u64 {
        self.0.resp as u64
    }

    /// The first 32-bit word of the last response (a handle, for the creating commands).
    fn handle(&self) -> u32 {
        // SAFETY: the response area is mapped while `self` lives.
        unsafe { self.0.resp.cast::<u32>().read_volatile() }
    }

    fn get_context(&self) -> Result<usize, i32> {
        let r = self.resp_ptr();
        self.cmd(GET_CONTEXT, &words(&[r]), 64)
    }

    fn alloc_pd(&self) -> u32 {
        let r = self.resp_ptr();
        self.cmd(ALLOC_PD, &words(&[r]), 8).unwrap();
        self.handle()
    }

    fn reg_mr(&self, pd: u32) -> Result<u32, i32> {
        let r = self.resp_ptr();
        let mut req = words(&[r, 0x10000, 4096, 0x10000]);
        req.extend_from_slice(&pd.to_ne_bytes());
        req.extend_from_slice(&1u32.to_ne_bytes()); // LOCAL_WRITE
        self.cmd(REG_MR, &req, 8).map(|_| self.handle())
    }

    fn destroy(&self, op: u32, handle: u32) -> Result<usize, i32> {
        self.cmd(op, &handle.to_ne_bytes(), 0)
    }
}

/// 64-bit words as bytes.
fn words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// A legacy command's bytes: `ib_uverbs_cmd_hdr` (in_words counts the whole command in 32-bit
/// words), then the request.
fn legacy(op: u32, req: &[u8], out_words: u16) -> Vec<u8> {
    let in_words = ((8 + req.len()) / 4) as u16;
    let mut b = op.to_ne_bytes().to_vec();
    b.extend_from_slice(&in_words.to_ne_bytes());
    b.extend_from_slice(&out_words.to_ne_bytes());
    b.extend_from_slice(req);
    b
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn malformed_commands_are_refused_with_an_errno() {
    if in_child_under_emulator("malformed_commands_are_refused_with_an_errno", "mlx5_0") {
        return;
    }
    let d = Dev::open();
    // Framing: shorter than a header, lengths that disagree, too large, unreadable.
    assert_eq!(d.write(&[]), Err(libc::EINVAL));
    assert_eq!(d.write(&[0; 4]), Err(libc::EINVAL));
    let mut bad_len = legacy(ALLOC_PD, &words(&[d.resp_ptr()]), 8);
    bad_len[4] = 9;
    assert_eq!(d.write(&bad_len), Err(libc::EINVAL));
    assert_eq!(d.write(&vec![0u8; (1 << 20) + 8]), Err(libc::EINVAL));
    assert_eq!(d.write_raw(16 as *const c_void, 16), Err(libc::EFAULT));
    assert_eq!(d.cmd(200, &[0; 8], 0), Err(libc::EOPNOTSUPP));
    // Nothing but GET_CONTEXT before a context exists.
    let r = d.resp_ptr();
    assert_eq!(d.cmd(ALLOC_PD, &words(&[r]), 8), Err(libc::EINVAL));

    // Response pointers: null, wild, read-only; a response buffer too small.
    assert_eq!(d.cmd(GET_CONTEXT, &words(&[0]), 64), Err(libc::EFAULT));
    assert_eq!(d.cmd(GET_CONTEXT, &words(&[16]), 64), Err(libc::EFAULT));
    let ro = READ_ONLY.as_ptr() as u64;
    assert_eq!(d.cmd(GET_CONTEXT, &words(&[ro]), 64), Err(libc::EFAULT));
    assert_eq!(d.cmd(GET_CONTEXT, &words(&[r]), 1), Err(libc::ENOSPC));
    assert!(d.get_context().is_ok());
    assert_eq!(d.get_context(), Err(libc::EINVAL), "one context per open");

    // Extended commands: truncated header, lengths that disagree, no response buffer.
    let mut ex = (EXTENDED | QUERY_DEVICE).to_ne_bytes().to_vec();
    ex.extend_from_slice(&[1, 0, 1, 0]); // in_words 1, out_words 1 (8-byte units)
    assert_eq!(d.write(&ex), Err(libc::EINVAL));
    let mut full = ex.clone();
    full.extend_from_slice(&words(&[0, 0])); // response 0, provider words 0
    assert_eq!(
        d.write(&full),
        Err(libc::EINVAL),
        "the core request is missing"
    );
    full.extend_from_slice(&[0; 8]);
    assert_eq!(
        d.write(&full),
        Err(libc::EFAULT),
        "a response without a buffer"
    );

    // Handles: none, out of range, of the wrong type, already destroyed, still in use.
    let pd = d.alloc_pd();
    assert_eq!(d.destroy(DEALLOC_PD, 0), Err(libc::EINVAL));
    assert_eq!(d.destroy(DEALLOC_PD, 1 << 20), Err(libc::EINVAL));
    assert_eq!(d.destroy(DEALLOC_PD, pd + 1), Err(libc::EINVAL));
    let mr = d.reg_mr(pd).unwrap();
    assert_eq!(d.reg_mr(pd + 7), Err(libc::EINVAL), "no such PD");
    assert_eq!(
        d.destroy(DEREG_MR, pd),
        Err(libc::EINVAL),
        "a PD is not an MR"
    );
    assert_eq!(
        d.destroy(DEALLOC_PD, pd),
        Err(libc::EBUSY),
        "the MR uses it"
    );
    assert!(d.destroy(DEREG_MR, mr).is_ok());
    assert_eq!(
        d.destroy(DEREG_MR, mr),
        Err(libc::EINVAL),
        "destroyed already"
    );
    assert!(d.destroy(DEALLOC_PD, pd).is_ok());
    // DESTROY_CQ: response pointer, then the handle.
    let mut req = words(&[r]);
    req.extend_from_slice(&[0; 8]);
    assert_eq!(d.cmd(DESTROY_CQ, &req, 2), Err(libc::EINVAL));

    // A CQ whose driver part (buffer and doorbell addresses) is cut short.
    let mut cq = words(&[r, 0]);
    cq.extend_from_slice(&[16, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    assert_eq!(d.cmd(CREATE_CQ, &cq, 8), Err(libc::EINVAL));

    // A handle of another context is not one of this context.
    let other = Dev::open();
    assert!(other.get_context().is_ok());
    let theirs = other.alloc_pd();
    let mine = d.alloc_pd();
    assert!(d.destroy(DEALLOC_PD, mine).is_ok());
    assert_eq!(d.destroy(DEALLOC_PD, mine), Err(libc::EINVAL));
    assert!(other.destroy(DEALLOC_PD, theirs).is_ok());
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn malformed_ioctls_are_refused_with_an_errno() {
    if in_child_under_emulator("malformed_ioctls_are_refused_with_an_errno", "mlx5_0") {
        return;
    }
    let d = Dev::open();
    assert!(d.get_context().is_ok());
    let ioctl = |arg: *mut c_void| {
        // SAFETY: the emulator copies the header and attributes in and answers EFAULT where
        // they are not readable.
        let rc = unsafe { libc::ioctl(d.0.fd, RDMA_VERBS_IOCTL, arg) };
        match rc {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
        }
    };
    assert_eq!(ioctl(std::ptr::null_mut()), Err(libc::EFAULT));
    assert_eq!(ioctl(16 as *mut c_void), Err(libc::EFAULT));
    // ib_uverbs_ioctl_hdr: length, object_id, method_id, num_attrs, then 16 bytes.
    let mut hdr = [0u64; 3];
    let set = |h: &mut [u64; 3], length: u16, object: u16, method: u16, attrs: u16| {
        h[0] = length as u64 | (object as u64) << 16 | (method as u64) << 32 | (attrs as u64) << 48
    };
    // Some other object: "no such method", as a kernel whose uverbs tree lacks it answers
    // (ENOTTY would say there is no ioctl interface at all).
    set(&mut hdr, 24, 0x1000, 1, 0);
    assert_eq!(ioctl(hdr.as_mut_ptr().cast()), Err(libc::EPROTONOSUPPORT));
    // MR (object 7), REG_DMABUF_MR (method 4 in kernel-headers' enum order).
    let (mr, dmabuf) = (7u16, 4u16);
    set(&mut hdr, 24, mr, dmabuf, 1000);
    assert_eq!(
        ioctl(hdr.as_mut_ptr().cast()),
        Err(libc::EINVAL),
        "too many attributes"
    );
    set(&mut hdr, 24, mr, dmabuf, 2);
    assert_eq!(
        ioctl(hdr.as_mut_ptr().cast()),
        Err(libc::EINVAL),
        "length disagrees"
    );
    // The header ends where the memory does: its attributes cannot be read.
    let guard = d.0.resp as usize + RESP_AREA - 4096;
    // SAFETY: the last page of the response area, which this test does not use otherwise.
    assert_eq!(
        unsafe { libc::mprotect(guard as *mut c_void, 4096, libc::PROT_NONE) },
        0
    );
    let at = (guard - 24) as *mut [u64; 3];
    set(&mut hdr, 24 + 2 * 16, mr, dmabuf, 2);
    // SAFETY: 24 bytes inside the response area, before the protected page.
    unsafe { at.write(hdr) };
    assert_eq!(
        ioctl(at.cast()),
        Err(libc::EFAULT),
        "attributes past the header"
    );
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn random_commands_never_crash_the_driver() {
    if in_child_under_emulator("random_commands_never_crash_the_driver", "mlx5_0") {
        return;
    }
    let d = Dev::open();
    assert!(d.get_context().is_ok());
    let r = d.resp_ptr();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut ok, mut refused) = (0, 0);
    for i in 0..20_000 {
        let len = (next() % 160) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Most commands get a plausible header (a served command, the right in_words) and a
        // response pointer into the response buffer, to get past the framing.
        if i % 4 != 0 && len >= 16 {
            let op = (next() % 28) as u32 | if i % 16 == 1 { EXTENDED } else { 0 };
            b[..4].copy_from_slice(&op.to_ne_bytes());
            b[4..6].copy_from_slice(&((len / 4) as u16).to_ne_bytes());
            b[6..8].copy_from_slice(&((next() % 130) as u16).to_ne_bytes());
            b.truncate(len / 4 * 4);
            // Now and then a response pointer that is null, wild or read-only.
            let wild = [
                0,
                16,
                u64::MAX - 7,
                next() | 1 << 63,
                READ_ONLY.as_ptr() as u64,
            ];
            let resp = match i % 8 {
                3 => wild[(next() % 5) as usize],
                _ => r,
            };
            b[8..16].copy_from_slice(&resp.to_ne_bytes());
        }
        match d.write(&b) {
            Ok(n) => {
                assert_eq!(n, b.len());
                ok += 1;
            }
            Err(e) => {
                assert!(e > 0);
                refused += 1;
            }
        }
    }
    println!("{ok} served, {refused} refused");
    assert!(ok > 0 && refused > 0, "{ok} served, {refused} refused");
}

/// Calls the attached stand-in HCA got: MRs, CQs registered and released.
static HCA_CALLS: [std::sync::atomic::AtomicU32; 4] =
    [const { std::sync::atomic::AtomicU32::new(0) }; 4];
const HCA_REG_MR: usize = 0;
const HCA_DEREG_MR: usize = 1;
const HCA_CREATE_CQ: usize = 2;
const HCA_DESTROY_CQ: usize = 3;
/// The keys and CQ number the stand-in HCA hands out.
const HCA_KEY: u32 = 0x4242;
const HCA_CQN: u32 = 0x77;

fn hca_called(what: usize) -> u32 {
    HCA_CALLS[what].load(std::sync::atomic::Ordering::Relaxed)
}

fn count(what: usize) {
    HCA_CALLS[what].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

extern "C" fn stub_reg_mr(_: i32, _: u32, _: u64, _: u64, _: u32, l: *mut u32, r: *mut u32) -> i32 {
    count(HCA_REG_MR);
    // SAFETY: the driver passes pointers to its object's key fields.
    unsafe { (l.write(HCA_KEY), r.write(HCA_KEY)) };
    0
}
extern "C" fn stub_dereg_mr(_: i32, _: u32) {
    count(HCA_DEREG_MR);
}
extern "C" fn stub_create_cq(_: i32, _: u64, _: u32, _: u64, cqn: *mut u32) -> i32 {
    count(HCA_CREATE_CQ);
    // SAFETY: the driver passes a pointer to its object's CQ number.
    unsafe { cqn.write(HCA_CQN) };
    0
}
extern "C" fn stub_destroy_cq(_: i32, _: u32) {
    count(HCA_DESTROY_CQ);
}
extern "C" fn stub_to_rtr(_: i32, _: u32, _: *const uvemu_hca_rtr) -> i32 {
    libc::EOPNOTSUPP
}
extern "C" fn stub_to_rts(_: i32, _: u32, _: *const uvemu_hca_rts) -> i32 {
    libc::EOPNOTSUPP
}
extern "C" fn stub_create_qp(_: i32, _: *const uvemu_hca_qp, _: *mut u32) -> i32 {
    libc::EOPNOTSUPP
}
extern "C" fn stub_to_init(_: i32, _: u32) -> i32 {
    libc::EOPNOTSUPP
}
extern "C" fn stub_destroy_qp(_: i32, _: u32) {}

/// The driver's HCA interface (`struct uvemu_hca_ops` and what it passes), as gdsync's soft
/// device uses it: the bindings generated from uvemu.h, kept in gdsync.
#[path = "../../../gdsync/src/device/soft/uvemu_sys.rs"]
#[allow(non_camel_case_types, dead_code, clippy::all)]
mod uvemu_sys;
use uvemu_sys::{uvemu_hca_ops, uvemu_hca_qp, uvemu_hca_rtr, uvemu_hca_rts};

static STUB_HCA: uvemu_hca_ops = uvemu_hca_ops {
    reg_mr: Some(stub_reg_mr),
    dereg_mr: Some(stub_dereg_mr),
    create_cq: Some(stub_create_cq),
    destroy_cq: Some(stub_destroy_cq),
    create_qp: Some(stub_create_qp),
    to_init: Some(stub_to_init),
    to_rtr: Some(stub_to_rtr),
    to_rts: Some(stub_to_rts),
    destroy_qp: Some(stub_destroy_qp),
    qp_state: None,
    qp_access: None,
};

/// Attaches `ops` as the driver's HCA: 0 or an errno.
fn attach(ops: *const uvemu_hca_ops) -> i32 {
    // SAFETY: dlsym with a NUL-terminated name; the preload defines it in this child.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"uvemu_attach_hca".as_ptr()) };
    assert!(!f.is_null(), "the preload has no uvemu_attach_hca");
    // SAFETY: the function uvemu.h declares, with a table that lives for the process.
    unsafe {
        let attach: extern "C" fn(*const uvemu_hca_ops) -> i32 = std::mem::transmute(f);
        attach(ops)
    }
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn an_attached_hca_is_handed_only_mapped_memory() {
    if in_child_under_emulator("an_attached_hca_is_handed_only_mapped_memory", "mlx5_0") {
        return;
    }
    assert_eq!(attach(std::ptr::null()), libc::EINVAL);
    assert_eq!(attach(&STUB_HCA), 0);
    assert_eq!(attach(&STUB_HCA), libc::EBUSY, "one HCA");
    let d = Dev::open();
    d.get_context().unwrap();
    let pd = d.alloc_pd();
    let r = d.resp_ptr();

    // A region: unmapped memory is EFAULT before the HCA hears of it (as a kernel fails to
    // pin it); mapped memory gets the HCA's keys.
    assert_eq!(d.reg_mr(pd), Err(libc::EFAULT), "0x10000 is not mapped");
    assert_eq!(hca_called(HCA_REG_MR), 0);
    let region: &'static mut [u8] = Vec::leak(vec![0u8; 3 * 4096]);
    let addr = region.as_ptr() as u64;
    let mut req = words(&[r, addr, region.len() as u64, addr]);
    req.extend_from_slice(&pd.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    d.cmd(REG_MR, &req, 8).unwrap();
    let mr = d.handle();
    // SAFETY: the response area holds `ib_uverbs_reg_mr_resp`: handle, lkey, rkey.
    let keys = unsafe { (d.0.resp.add(4).cast::<[u32; 2]>()).read_unaligned() };
    assert_eq!(keys, [HCA_KEY, HCA_KEY]);
    assert_eq!(hca_called(HCA_REG_MR), 1);
    assert!(d.destroy(DEREG_MR, mr).is_ok());
    assert_eq!(hca_called(HCA_DEREG_MR), 1);

    // A CQ: its ring (16 64-byte CQEs) and doorbell record must be writable.
    let cq = |ring: u64, dbrec: u64| {
        let mut b = words(&[r, 0]);
        b.extend_from_slice(&[15, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        b.extend_from_slice(&words(&[ring, dbrec]));
        b.extend_from_slice(&64u32.to_ne_bytes());
        b.extend_from_slice(&[0; 4]);
        b
    };
    let ring: &'static mut [u8] = Vec::leak(vec![0u8; 16 * 64 + 64]);
    let (ring, dbrec) = (ring.as_ptr() as u64, ring.as_ptr() as u64 + 16 * 64);
    let ro = READ_ONLY.as_ptr() as u64;
    assert_eq!(d.cmd(CREATE_CQ, &cq(0x10000, dbrec), 8), Err(libc::EFAULT));
    assert_eq!(d.cmd(CREATE_CQ, &cq(ro, dbrec), 8), Err(libc::EFAULT));
    assert_eq!(d.cmd(CREATE_CQ, &cq(ring, ro), 8), Err(libc::EFAULT));
    assert_eq!(hca_called(HCA_CREATE_CQ), 0);
    d.cmd(CREATE_CQ, &cq(ring, dbrec), 8).unwrap();
    let cq_handle = d.handle();
    assert_eq!(hca_called(HCA_CREATE_CQ), 1);
    let mut destroy = words(&[r]);
    destroy.extend_from_slice(&cq_handle.to_ne_bytes());
    destroy.extend_from_slice(&[0; 4]);
    d.cmd(DESTROY_CQ, &destroy, 2).unwrap();
    assert_eq!(hca_called(HCA_DESTROY_CQ), 1);
    assert!(d.destroy(DEALLOC_PD, pd).is_ok());
}

/// The `uverbs_commands` fuzz target's corpus and seeds (`fuzz/`), replayed through the same
/// reading of bytes as commands (`command_stream`), in the preload library this time: every
/// command comes back with a count or an errno.
#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn fuzz_corpus_replays() {
    if in_child_under_emulator("fuzz_corpus_replays", "mlx5_0") {
        return;
    }
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut inputs = 0;
    let mut total = uverbs_emu::command_stream::Outcome::default();
    for dir in ["corpus/uverbs_commands", "seeds/uverbs_commands"] {
        for entry in std::fs::read_dir(fuzz.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let o = uverbs_emu::command_stream::run(c"/dev/infiniband/uverbs0", &data)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            total.served += o.served;
            total.refused += o.refused;
            inputs += 1;
        }
    }
    println!("{inputs} inputs: {total:?}");
    assert!(inputs > 1, "no corpus under {}", fuzz.display());
    assert!(total.served > 0 && total.refused > 0, "{total:?}");
}

/// Makes the response buffer read-only, as another thread's `mprotect` could between the
/// driver's check of the buffer and its write of the response.
extern "C" fn protect_response(out: *mut c_void, _len: usize, _arg: *mut c_void) {
    let page = (out as usize & !4095) as *mut c_void;
    // SAFETY: the page of the test's own response area, mapped while the test runs.
    assert_eq!(unsafe { libc::mprotect(page, 4096, libc::PROT_READ) }, 0);
}

type ResponseHook = extern "C" fn(*mut c_void, usize, *mut c_void);

/// Sets the driver's hook that runs before a response is written (uvemu.h).
fn before_response(hook: Option<ResponseHook>) {
    // SAFETY: dlsym with a NUL-terminated name; the preload defines it in this child.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"uvemu_test_before_response".as_ptr()) };
    assert!(
        !f.is_null(),
        "the preload has no uvemu_test_before_response"
    );
    // SAFETY: the function uvemu.h declares.
    let rc = unsafe {
        let set: extern "C" fn(Option<ResponseHook>, *mut c_void) -> i32 = std::mem::transmute(f);
        set(hook, std::ptr::null_mut())
    };
    assert_eq!(rc, 0);
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn a_response_buffer_made_read_only_after_the_check_is_efault() {
    if in_child_under_emulator(
        "a_response_buffer_made_read_only_after_the_check_is_efault",
        "mlx5_0",
    ) {
        return;
    }
    assert_eq!(attach(&STUB_HCA), 0);
    let d = Dev::open();
    let writable = |yes: bool| {
        let prot = libc::PROT_READ | if yes { libc::PROT_WRITE } else { 0 };
        // SAFETY: the first page of the test's response area.
        assert_eq!(unsafe { libc::mprotect(d.0.resp.cast(), 4096, prot) }, 0);
    };
    // Each command fails with EFAULT and leaves nothing behind: the next one, with the
    // buffer writable again, succeeds as if the first had not been tried.
    before_response(Some(protect_response));
    assert_eq!(d.get_context(), Err(libc::EFAULT));
    writable(true);
    before_response(None);
    assert!(d.get_context().is_ok(), "no context was left by the EFAULT");

    let r = d.resp_ptr();
    before_response(Some(protect_response));
    assert_eq!(d.cmd(ALLOC_PD, &words(&[r]), 8), Err(libc::EFAULT));
    writable(true);
    before_response(None);
    let pd = d.alloc_pd();
    assert_eq!(pd, 1, "the PD of the EFAULT was not left behind");

    // A region handed to the HCA is taken back when its keys cannot be returned.
    let region: &'static mut [u8] = Vec::leak(vec![0u8; 4096]);
    let addr = region.as_ptr() as u64;
    let mut req = words(&[r, addr, region.len() as u64, addr]);
    req.extend_from_slice(&pd.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    before_response(Some(protect_response));
    assert_eq!(d.cmd(REG_MR, &req, 8), Err(libc::EFAULT));
    writable(true);
    before_response(None);
    assert_eq!(
        (hca_called(HCA_REG_MR), hca_called(HCA_DEREG_MR)),
        (1, 1),
        "the HCA let go of the region"
    );
    assert!(
        d.destroy(DEALLOC_PD, pd).is_ok(),
        "no region holds the PD any more"
    );

    // Queries and destroys too: EFAULT, and the process lives.
    before_response(Some(protect_response));
    assert_eq!(d.cmd(QUERY_DEVICE, &words(&[r]), 64), Err(libc::EFAULT));
    writable(true);
    before_response(None);
    assert!(d.cmd(QUERY_DEVICE, &words(&[r]), 64).is_ok());
}

/// Whether this process can read the byte at `addr` (without touching it).
fn readable(addr: usize) -> bool {
    let mut b = 0u8;
    let local = libc::iovec {
        iov_base: (&mut b as *mut u8).cast(),
        iov_len: 1,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: 1,
    };
    // SAFETY: the kernel reads one byte of this process at `addr` (EFAULT where unmapped).
    unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) == 1 }
}

#[test]
#[cfg_attr(
    not(uvemu_built),
    ignore = "the emulated driver's preload library was not built (needs a C compiler)"
)]
fn pinned_pages_outlive_the_processs_mapping_until_the_region_goes() {
    if in_child_under_emulator(
        "pinned_pages_outlive_the_processs_mapping_until_the_region_goes",
        "mlx5_0",
    ) {
        return;
    }
    assert_eq!(attach(&STUB_HCA), 0);
    let d = Dev::open();
    d.get_context().unwrap();
    let pd = d.alloc_pd();
    let r = d.resp_ptr();
    let len = 4 * 4096;
    // SAFETY: a fresh anonymous mapping (and below, calls on it that the driver checks).
    let (p, fixed, moved, ro) = unsafe {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let p = libc::mmap(std::ptr::null_mut(), len, rw, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        let mut req = words(&[r, p as u64 + 4096, 4096, p as u64 + 4096]);
        req.extend_from_slice(&pd.to_ne_bytes());
        req.extend_from_slice(&1u32.to_ne_bytes()); // LOCAL_WRITE
        d.cmd(REG_MR, &req, 8).unwrap();
        // What cannot be put off is refused: another mapping over the pinned page, a move,
        // taking write access away. The pages beside it are the process's to change.
        let errno = || std::io::Error::last_os_error().raw_os_error();
        let fixed = libc::mmap(p, len, rw, flags | libc::MAP_FIXED, -1, 0);
        let fixed = (fixed == libc::MAP_FAILED, errno());
        let moved = libc::mremap(p, len, 2 * len, libc::MREMAP_MAYMOVE);
        let moved = (moved == libc::MAP_FAILED, errno());
        let ro = libc::mprotect(p.cast::<u8>().add(4096).cast(), 4096, libc::PROT_READ);
        let ro = (ro == -1, errno());
        assert_eq!(libc::mprotect(p, 4096, libc::PROT_READ), 0);
        assert_eq!(libc::munmap(p, len), 0);
        (p as usize, fixed, moved, ro)
    };
    let refused = |e| (true, Some(e));
    assert_eq!(fixed, refused(libc::ENOMEM), "MAP_FIXED over a pinned page");
    assert_eq!(moved, refused(libc::ENOMEM), "mremap of a pinned page");
    assert_eq!(ro, refused(libc::EACCES), "a pinned page the HCA writes");
    // Unmapped: the pinned page stays (the HCA may still write there), the others go.
    assert!(!readable(p) && readable(p + 4096) && !readable(p + 2 * 4096));
    let mr = d.handle();
    assert!(d.destroy(DEREG_MR, mr).is_ok());
    assert!(!readable(p + 4096), "the page went with the region");
}
