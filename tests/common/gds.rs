//! The real `gdsync.cuh`, compiled for the host and called from Rust: a thread that plays the
//! kernel calls these functions with the descriptors the host filled (`QpDesc`, `PeerDesc`),
//! and the soft device executes the very bytes the header writes (WQEs, doorbell records,
//! doorbells, CQ consumer indices, credits).
//!
//! `gdsync_host.cpp` (beside this file) gives the header host stand-ins for the CUDA built-ins
//! and exports `extern "C"` wrappers; clang++ builds it once into a shared library under the
//! target folder (named by a hash of its sources, so an edit rebuilds it), which is loaded
//! with `dlopen`. The tests that use it are ignored where clang++ was missing when they were
//! built (`cfg(clang_cuda)`, set by build.rs). The bandwidth example's kernels are built the
//! same way into a library of their own ([`bw_staged`]), for a block of one thread.

use gdasync::gdsync::format::{CqeOpcode, Opcode};
use gdasync::gdsync::kernel::{CqDesc, PeerDesc, QpDesc, RemoteDesc, RingDesc, SendDesc, WaitDesc};
use std::ffi::{c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `GDS_SIGNALED`, `GDS_FENCE`, `GDS_SOLICITED`: the header's flags (its own API, not
/// the `fm_ce_se` bits they become).
pub const SIGNALED: u32 = 1;
pub const FENCE: u32 = 2;
pub const SOLICITED: u32 = 4;

/// Constants named as the header names them (`GDS_OP_*`, `GDS_WC_*`), from the format's enums.
macro_rules! named {
    ($t:ty, $enum:ident: $($name:ident = $v:ident),*) => { $(pub const $name: $t = $enum::$v as $t;)* };
}
named!(u32, Opcode: OP_NOP = Nop, OP_RDMA_WRITE = RdmaWrite, OP_RDMA_WRITE_IMM = RdmaWriteImm,
    OP_SEND = Send, OP_SEND_IMM = SendImm, OP_RDMA_READ = RdmaRead);
named!(u8, CqeOpcode: WC_SEND_DONE = Req, WC_RECV_WRITE_IMM = RespWrImm, WC_RECV = RespSend,
    WC_RECV_IMM = RespSendImm, WC_REQ_ERR = ReqErr, WC_RESP_ERR = RespErr);

/// `gds_wc` (its layout is asserted in gdsync_host.cpp).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wc {
    pub byte_len: u32,
    pub imm: u32,
    pub qpn: u32,
    pub wqe_counter: u16,
    pub opcode: u8,
    pub wqe_opcode: u8,
    pub syndrome: u8,
    pub vendor_syndrome: u8,
    pub reserved: u16,
}

type Qp = *mut QpDesc;
type Peer = *mut PeerDesc;

/// The exported functions, by name.
struct Lib {
    send: unsafe extern "C" fn(*const SendDesc) -> c_int,
    wait: unsafe extern "C" fn(*const WaitDesc, u64) -> c_int,
    ring_fetch_n: unsafe extern "C" fn(*const RingDesc, u64, u32, *mut DescEntry, u64) -> c_int,
    qp_send_room: unsafe extern "C" fn(*const QpDesc) -> u32,
    qp_post_send: unsafe extern "C" fn(Qp, u32, u64, u32, u32, u64, u32, u32, u32) -> c_int,
    qp_post_send_inline:
        unsafe extern "C" fn(Qp, u32, *const c_void, u32, u64, u32, u32, u32) -> c_int,
    qp_post_nop: unsafe extern "C" fn(Qp, u32) -> c_int,
    qp_post_recv: unsafe extern "C" fn(Qp, u64, u32, u32) -> c_int,
    cq_poll: unsafe extern "C" fn(*mut CqDesc, *mut Wc) -> c_int,
    cq_wait: unsafe extern "C" fn(*mut CqDesc, *mut Wc, u64) -> c_int,
    peer_send: unsafe extern "C" fn(Peer, u64, u32, u32, u64) -> c_int,
    peer_send_flags: unsafe extern "C" fn(Peer, u64, u32, u32, u32, u64) -> c_int,
    peer_prepare_send: unsafe extern "C" fn(Peer, u64, u32, u32, u32, u64) -> c_int,
    peer_ring_send: unsafe extern "C" fn(Peer) -> c_int,
    peer_post_recv: unsafe extern "C" fn(Peer, u64, u32, u32) -> c_int,
    peer_give_credit: unsafe extern "C" fn(Peer, u64) -> c_int,
    peer_recv: unsafe extern "C" fn(Peer, u64, u32, u32, u64) -> c_int,
    peer_wait_sends: unsafe extern "C" fn(Peer, u64, u64) -> c_int,
    peer_wait_send: unsafe extern "C" fn(Peer, u64) -> c_int,
    peer_wait_recv: unsafe extern "C" fn(Peer, *mut u32, u64) -> c_int,
    copy_part: unsafe extern "C" fn(u64, u64, u64, u32, u32),
    peer_next_send_bounce: unsafe extern "C" fn(Peer, *mut u64, u64) -> c_int,
    peer_send_bounce: unsafe extern "C" fn(Peer, u32, u32, u64) -> c_int,
    peer_send_staged: unsafe extern "C" fn(Peer, u64, u32, u32, u64) -> c_int,
    peer_post_recv_staged: unsafe extern "C" fn(Peer, u32) -> c_int,
    peer_recv_staged: unsafe extern "C" fn(Peer, u32, u64) -> c_int,
    peer_recv_bounce: unsafe extern "C" fn(*const PeerDesc) -> u64,
    peer_wait_recv_staged: unsafe extern "C" fn(Peer, u64, u32, *mut u32, u64) -> c_int,
    peer_put_flags:
        unsafe extern "C" fn(Peer, *const RemoteDesc, u64, u64, u32, u32, u32, u64) -> c_int,
    peer_get: unsafe extern "C" fn(Peer, *const RemoteDesc, u64, u64, u32, u32, u64) -> c_int,
    peer_put_bounce: unsafe extern "C" fn(Peer, *const RemoteDesc, u64, u32, u32, u64) -> c_int,
}

const INCLUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/gdsync/include");
const SOURCE: &str = include_str!("gdsync_host.cpp");

/// Builds the library (once per source hash) and returns its path.
fn build() -> PathBuf {
    build_named("gdsync_host", SOURCE)
}

/// Builds `source` (C++ that includes gdsync.cuh) into a shared library named after `name`,
/// once per hash of the source and the header, and returns its path.
fn build_named(name: &str, source: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (source, gdasync::gdsync::kernel::HEADER).hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let lib = dir.join(format!("lib{name}-{:016x}.so", h.finish()));
    if lib.exists() {
        return lib;
    }
    let src = dir.join(format!("{name}-{}.cpp", std::process::id()));
    std::fs::write(&src, source).unwrap();
    let tmp = dir.join(format!("lib{name}-{}.so.tmp", std::process::id()));
    let out = std::process::Command::new("clang++")
        .args([
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-shared",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .args(["-Wno-pragma-once-outside-header", "-I", INCLUDE, "-o"])
        .arg(&tmp)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "clang++ (which builds gdsync.cuh for the host) did not start: {e}; install it \
                 (apt-get install clang), or touch build.rs to mark these tests ignored"
            )
        });
    let _ = std::fs::remove_file(&src);
    assert!(
        out.status.success(),
        "gdsync.cuh does not compile for the host:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &lib).unwrap();
    lib
}

// Each transmute's target is the type of the field it fills.
#[allow(clippy::missing_transmute_annotations)]
fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = CString::new(build().into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; the library is never closed.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(
            !h.is_null(),
            "dlopen of the host build of gdsync.cuh failed"
        );
        macro_rules! sym {
            ($name:ident) => {{
                let n = CString::new(concat!("gdst_", stringify!($name))).unwrap();
                // SAFETY: a loaded library and a NUL-terminated name.
                let p = unsafe { libc::dlsym(h, n.as_ptr()) };
                assert!(!p.is_null(), "gdst_{} missing", stringify!($name));
                // SAFETY: gdsync_host.cpp defines the symbol with the signature of the field.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }};
        }
        Lib {
            send: sym!(send),
            wait: sym!(wait),
            ring_fetch_n: sym!(ring_fetch_n),
            qp_send_room: sym!(qp_send_room),
            qp_post_send: sym!(qp_post_send),
            qp_post_send_inline: sym!(qp_post_send_inline),
            qp_post_nop: sym!(qp_post_nop),
            qp_post_recv: sym!(qp_post_recv),
            cq_poll: sym!(cq_poll),
            cq_wait: sym!(cq_wait),
            peer_send: sym!(peer_send),
            peer_send_flags: sym!(peer_send_flags),
            peer_prepare_send: sym!(peer_prepare_send),
            peer_ring_send: sym!(peer_ring_send),
            peer_post_recv: sym!(peer_post_recv),
            peer_give_credit: sym!(peer_give_credit),
            peer_recv: sym!(peer_recv),
            peer_wait_sends: sym!(peer_wait_sends),
            peer_wait_send: sym!(peer_wait_send),
            peer_wait_recv: sym!(peer_wait_recv),
            copy_part: sym!(copy_part),
            peer_next_send_bounce: sym!(peer_next_send_bounce),
            peer_send_bounce: sym!(peer_send_bounce),
            peer_send_staged: sym!(peer_send_staged),
            peer_post_recv_staged: sym!(peer_post_recv_staged),
            peer_recv_staged: sym!(peer_recv_staged),
            peer_recv_bounce: sym!(peer_recv_bounce),
            peer_wait_recv_staged: sym!(peer_wait_recv_staged),
            peer_put_flags: sym!(peer_put_flags),
            peer_get: sym!(peer_get),
            peer_put_bounce: sym!(peer_put_bounce),
        }
    })
}

// Every call below: the descriptors point at rings, doorbells and counters in pinned host
// memory that the DeviceQp / KernelChannels the test holds keep alive; one thread drives one
// descriptor, as the header requires.

/// `gds_send`: rings the doorbell a commit's send descriptor describes (its op list, which
/// the caller holds, keeps the memory alive).
pub fn send(d: &SendDesc) -> i32 {
    // SAFETY: a descriptor of a commit whose op list the caller keeps alive (above).
    unsafe { (lib().send)(d) }
}

/// A descriptor-ring entry as the header copies it out (`gds_desc`: 80 bytes, 16-aligned).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct DescEntry(pub [u8; 80]);

impl DescEntry {
    /// The 64-bit word at byte `off`.
    pub fn u64_at(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.0[off..off + 8].try_into().unwrap())
    }
}

/// `gds_ring_fetch_n`: copies `out.len()` entries of the descriptor ring from `index` on into
/// `out` and releases their slots.
pub fn ring_fetch_n(r: &RingDesc, index: u64, out: &mut [DescEntry], timeout_ns: u64) -> i32 {
    // SAFETY: a ring the caller's DescRing keeps alive, and room for out.len() entries.
    unsafe { (lib().ring_fetch_n)(r, index, out.len() as u32, out.as_mut_ptr(), timeout_ns) }
}

/// `gds_wait`: waits for the completion a wait descriptor describes, then retires it.
pub fn wait(d: &WaitDesc, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor of a wait whose op list the caller keeps alive (above).
    unsafe { (lib().wait)(d, timeout_ns) }
}

/// `gds_qp_send_room`.
pub fn qp_send_room(qp: &QpDesc) -> u32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().qp_send_room)(qp) }
}

/// `gds_qp_post_send`.
#[allow(clippy::too_many_arguments)]
pub fn qp_post_send(
    qp: &mut QpDesc,
    opcode: u32,
    laddr: u64,
    lkey: u32,
    len: u32,
    raddr: u64,
    rkey: u32,
    imm: u32,
    flags: u32,
) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().qp_post_send)(qp, opcode, laddr, lkey, len, raddr, rkey, imm, flags) }
}

/// `gds_qp_post_send_inline`, with `data` as the payload.
pub fn qp_post_send_inline(
    qp: &mut QpDesc,
    opcode: u32,
    data: &[u8],
    raddr: u64,
    rkey: u32,
    imm: u32,
    flags: u32,
) -> i32 {
    let (p, n) = (data.as_ptr() as *const c_void, data.len() as u32);
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().qp_post_send_inline)(qp, opcode, p, n, raddr, rkey, imm, flags) }
}

/// `gds_qp_post_nop`.
pub fn qp_post_nop(qp: &mut QpDesc, flags: u32) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().qp_post_nop)(qp, flags) }
}

/// `gds_qp_post_recv`.
pub fn qp_post_recv(qp: &mut QpDesc, addr: u64, len: u32, lkey: u32) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().qp_post_recv)(qp, addr, len, lkey) }
}

/// `gds_cq_poll`.
pub fn cq_poll(cq: &mut CqDesc, wc: &mut Wc) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().cq_poll)(cq, wc) }
}

/// `gds_cq_wait`.
pub fn cq_wait(cq: &mut CqDesc, wc: &mut Wc, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().cq_wait)(cq, wc, timeout_ns) }
}

/// `gds_peer_send`.
pub fn peer_send(p: &mut PeerDesc, laddr: u64, lkey: u32, len: u32, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_send)(p, laddr, lkey, len, timeout_ns) }
}

/// `gds_peer_send_flags`.
pub fn peer_send_flags(
    p: &mut PeerDesc,
    laddr: u64,
    lkey: u32,
    len: u32,
    flags: u32,
    timeout_ns: u64,
) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_send_flags)(p, laddr, lkey, len, flags, timeout_ns) }
}

/// `gds_peer_prepare_send`.
pub fn peer_prepare_send(
    p: &mut PeerDesc,
    laddr: u64,
    lkey: u32,
    len: u32,
    flags: u32,
    timeout_ns: u64,
) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_prepare_send)(p, laddr, lkey, len, flags, timeout_ns) }
}

/// `gds_peer_ring_send`.
pub fn peer_ring_send(p: &mut PeerDesc) -> i32 {
    // SAFETY: as peer_prepare_send.
    unsafe { (lib().peer_ring_send)(p) }
}

/// `gds_peer_post_recv`.
pub fn peer_post_recv(p: &mut PeerDesc, laddr: u64, lkey: u32, len: u32) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_post_recv)(p, laddr, lkey, len) }
}

/// `gds_peer_give_credit`.
pub fn peer_give_credit(p: &mut PeerDesc, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_give_credit)(p, timeout_ns) }
}

/// `gds_peer_recv`.
pub fn peer_recv(p: &mut PeerDesc, laddr: u64, lkey: u32, len: u32, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_recv)(p, laddr, lkey, len, timeout_ns) }
}

/// `gds_peer_wait_sends`.
pub fn peer_wait_sends(p: &mut PeerDesc, n: u64, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_wait_sends)(p, n, timeout_ns) }
}

/// `gds_peer_wait_send`.
pub fn peer_wait_send(p: &mut PeerDesc, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_wait_send)(p, timeout_ns) }
}

/// `gds_peer_wait_recv`; `len` None passes a null pointer (the header then skips the byte
/// count).
pub fn peer_wait_recv(p: &mut PeerDesc, len: Option<&mut u32>, timeout_ns: u64) -> i32 {
    let len = len.map_or(std::ptr::null_mut(), |l| l as *mut u32);
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_wait_recv)(p, len, timeout_ns) }
}

/// `gds_copy_part` for every part of `parts` in turn (a block's threads, one after another):
/// `src` into `dst`, which must be as long.
pub fn copy_parts(dst: &mut [u8], src: &[u8], parts: u32) {
    assert_eq!(dst.len(), src.len());
    let (d, s, n) = (
        dst.as_mut_ptr() as u64,
        src.as_ptr() as u64,
        src.len() as u64,
    );
    for part in 0..parts {
        // SAFETY: both ranges are live slices of n bytes that do not overlap.
        unsafe { (lib().copy_part)(d, s, n, part, parts) }
    }
}

/// `gds_peer_next_send_bounce`: the bounce's address, or the code.
pub fn peer_next_send_bounce(p: &mut PeerDesc, timeout_ns: u64) -> Result<u64, i32> {
    let mut at = 0u64;
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    match unsafe { (lib().peer_next_send_bounce)(p, &mut at, timeout_ns) } {
        0 => Ok(at),
        rc => Err(rc),
    }
}

/// `gds_peer_send_bounce`.
pub fn peer_send_bounce(p: &mut PeerDesc, len: u32, flags: u32, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_send_bounce)(p, len, flags, timeout_ns) }
}

/// `gds_peer_send_staged`, from `src`.
pub fn peer_send_staged(p: &mut PeerDesc, src: &[u8], flags: u32, timeout_ns: u64) -> i32 {
    let (at, len) = (src.as_ptr() as u64, src.len() as u32);
    // SAFETY: as above; `src` is a live slice of `len` bytes the header only reads.
    unsafe { (lib().peer_send_staged)(p, at, len, flags, timeout_ns) }
}

/// `gds_peer_post_recv_staged`.
pub fn peer_post_recv_staged(p: &mut PeerDesc, len: u32) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_post_recv_staged)(p, len) }
}

/// `gds_peer_recv_staged`.
pub fn peer_recv_staged(p: &mut PeerDesc, len: u32, timeout_ns: u64) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_recv_staged)(p, len, timeout_ns) }
}

/// `gds_peer_recv_bounce`.
pub fn peer_recv_bounce(p: &PeerDesc) -> u64 {
    // SAFETY: the header only reads the descriptor.
    unsafe { (lib().peer_recv_bounce)(p) }
}

/// `gds_peer_wait_recv_staged` into `dst` (its length is the capacity); `len` None passes a
/// null pointer.
pub fn peer_wait_recv_staged(
    p: &mut PeerDesc,
    dst: &mut [u8],
    len: Option<&mut u32>,
    timeout_ns: u64,
) -> i32 {
    let len = len.map_or(std::ptr::null_mut(), |l| l as *mut u32);
    let (at, cap) = (dst.as_mut_ptr() as u64, dst.len() as u32);
    // SAFETY: as above; `dst` is a live slice of `cap` bytes the header writes at most.
    unsafe { (lib().peer_wait_recv_staged)(p, at, cap, len, timeout_ns) }
}

/// `gds_peer_put_flags`: `len` bytes at `laddr` (registered with `lkey`) into `r` at `off`.
#[allow(clippy::too_many_arguments)]
pub fn peer_put_flags(
    p: &mut PeerDesc,
    r: &RemoteDesc,
    off: u64,
    laddr: u64,
    lkey: u32,
    len: u32,
    flags: u32,
    timeout_ns: u64,
) -> i32 {
    // SAFETY: as above; `laddr` lies in a registered buffer the caller holds until the put
    // completed, and the header only reads `r`.
    unsafe { (lib().peer_put_flags)(p, r, off, laddr, lkey, len, flags, timeout_ns) }
}

/// `gds_peer_get`: `len` bytes of `r` at `off` into `laddr` (registered with `lkey`).
pub fn peer_get(
    p: &mut PeerDesc,
    r: &RemoteDesc,
    off: u64,
    laddr: u64,
    lkey: u32,
    len: u32,
    timeout_ns: u64,
) -> i32 {
    // SAFETY: as `peer_put_flags`; the device writes `laddr` before the get's completion.
    unsafe { (lib().peer_get)(p, r, off, laddr, lkey, len, timeout_ns) }
}

/// `gds_peer_put_bounce`: the taken send bounce's first `len` bytes into `r` at `off`.
pub fn peer_put_bounce(
    p: &mut PeerDesc,
    r: &RemoteDesc,
    off: u64,
    len: u32,
    flags: u32,
    timeout_ns: u64,
) -> i32 {
    // SAFETY: a descriptor the caller drives alone, whose memory it keeps alive (above).
    unsafe { (lib().peer_put_bounce)(p, r, off, len, flags, timeout_ns) }
}

/// The bandwidth example's kernels on the host, for a block of one thread (thread 0 drives
/// the QP and copies alone): the stand-ins of gdsync_host.cpp, then the block functions the
/// header leaves out of host builds, then bandwidth.cu as it is.
const BANDWIDTH_HOST: &str = r#"
#define __global__
struct gdst_dim3 { unsigned x, y, z; };
static const gdst_dim3 threadIdx = {0, 0, 0};
static inline uint64_t gds_block_share(uint64_t v) { return v; }
static inline void gds_block_copy(uint64_t dst, uint64_t src, uint64_t len) {
    gds_copy_part(dst, src, len, 0, 1);
    __threadfence_system();
}
"#;

/// `bw_staged`'s parameters, in its order (bandwidth.cu says what each is).
pub type BwStaged = unsafe extern "C" fn(
    QpDesc,
    u64,
    u64,
    u64,
    u64,
    u64,
    u32,
    u64,
    u64,
    u64,
    u32,
    u64,
    u32,
    u64,
    u64,
    u64,
);

/// `bw_staged` of examples/bandwidth/bandwidth.cu, built for the host.
pub fn bw_staged() -> BwStaged {
    static F: OnceLock<usize> = OnceLock::new();
    let p = *F.get_or_init(|| {
        let source = format!(
            "{SOURCE}\n{BANDWIDTH_HOST}\n{}",
            include_str!("../../examples/bandwidth/bandwidth.cu")
        );
        let path = build_named("bandwidth_host", &source);
        let path = CString::new(path.into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; the library is never closed.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(
            !h.is_null(),
            "dlopen of the host build of bandwidth.cu failed"
        );
        let name = CString::new("bw_staged").unwrap();
        // SAFETY: a loaded library and a NUL-terminated name.
        let f = unsafe { libc::dlsym(h, name.as_ptr()) };
        assert!(!f.is_null(), "bw_staged missing");
        f as usize
    });
    // SAFETY: bandwidth.cu defines bw_staged (extern "C") with these parameters; the library
    // stays loaded.
    unsafe { std::mem::transmute::<usize, BwStaged>(p) }
}
