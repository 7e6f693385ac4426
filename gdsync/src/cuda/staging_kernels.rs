//! The staging kernels of each GPU: their CUDA source, compiled once per GPU where staging
//! bounces are made ([`prepare_staged_copies`]), never at a copy: loading a module may wait for
//! the GPU to go idle, which a stream blocked in a wait never does. `gdsync_staged_copy` makes
//! one copy (`copy_kernel.rs`); `gdsync_run_list` runs a whole op list with its copies
//! (`list_kernel.rs`). `GDSYNC_STAGING_COPY=engine` leaves them uncompiled, and without NVRTC
//! they cannot be (the log says so): copies then go to the copy engines (`cuMemcpyAsync`).

use super::{Cuda, Function};
use crate::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The kernel: 16-byte loads and stores where source and destination share their alignment
/// mod 16, bytes otherwise. Loads bypass the caches (`__ldcv`): a bounce is rewritten by the
/// NIC between copies, which the GPU's caches do not see. A copy into a bounce (`system`)
/// ends with a system-wide fence, which makes the stores visible to the NIC before the
/// stream's next operation (a doorbell) runs; a copy into this GPU's memory, which the NIC
/// never reads on the staged path, fences at GPU scope (the system-wide fence would wait for
/// a PCIe round trip on the message's path).
const COPY_SOURCE: &str = r#"
__device__ __forceinline__ void gdsync_copy_range(unsigned char *dst, const unsigned char *src,
                                                  unsigned long long len, unsigned long long t,
                                                  unsigned long long step) {
    unsigned long long d = (unsigned long long)dst, s = (unsigned long long)src;
    unsigned long long head = len, words = 0;
    if (((d ^ s) & 15) == 0) {
        head = (16 - (d & 15)) & 15;
        if (head > len) head = len;
        words = (len - head) / 16;
    }
    for (unsigned long long i = t; i < head; i += step) dst[i] = __ldcv(src + i);
    uint4 *d4 = (uint4 *)(dst + head);
    const uint4 *s4 = (const uint4 *)(src + head);
    for (unsigned long long i = t; i < words; i += step) d4[i] = __ldcv(s4 + i);
    for (unsigned long long i = head + words * 16 + t; i < len; i += step) dst[i] = __ldcv(src + i);
}

extern "C" __global__ void gdsync_staged_copy(unsigned char *dst, const unsigned char *src,
                                              unsigned long long len, unsigned int system) {
    gdsync_copy_range(dst, src, len, blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x,
                      (unsigned long long)gridDim.x * blockDim.x);
    if (system) __threadfence_system();
    else __threadfence();
}
"#;

/// The kinds of a list kernel's ops (`gdsync_list_op::kind`), defined for the kernel's source
/// as `GDSYNC_LIST_<NAME>`: a 32-bit store, a 64-bit store (a doorbell is one), waits on a
/// 32- and a 64-bit word, a system-wide fence, a copy.
pub(super) mod kind {
    pub const W32: u32 = 1;
    pub const W64: u32 = 2;
    pub const WAIT32: u32 = 3;
    pub const WAIT64: u32 = 4;
    pub const FENCE: u32 = 5;
    pub const COPY: u32 = 6;
}

/// Ops one list-kernel launch carries (`gdsync_list::op`): a list runs as one launch, so a
/// longer one stays memory operations.
pub(super) const LIST_OPS: usize = 32;

/// The list kernel. Each op is `{kind, cond, a, b, c}`: a store (`a` address, `b` value), a
/// wait (`a` word, `b` operand, `cond`), a fence, or a copy (`a` destination, `b` source, `c`
/// bytes, `cond` 1 when the destination is memory the NIC reads: a bounce). Thread 0 stores,
/// waits and fences; the other threads pass a wait at the block barrier after it.
///
/// A store is ordered by the list's fences only, as [`Op::Write32`](crate::ops::Op::Write32)
/// promises. A stream's write fences by itself; here each ordering waits for the thread's
/// earlier stores to reach the system (a PCIe round trip), so a list pays one per barrier where
/// a release per store paid one per store. A wait is an acquire: what follows it stays after it.
///
/// A copy is ordered before every later op (`Op::Copy`):
/// - into a bounce, up to `GDS_LEAD_COPY_MAX` bytes: thread 0's alone (`gds_block_copy_out`
///   has warp 0 copy it), with a system-wide fence after it unless a fence comes next;
/// - otherwise the block's: each thread fences its stores (system-wide into a bounce, GPU-wide
///   into GPU memory) before the block barrier, and thread 0 fences system-wide after it where
///   a store comes next (a retirement the host reads).
///
/// The stream's progress word, if this launch carries it, is stored last, as a release: what
/// the list named is no longer touched once the host sees it. With `stamps` set (profiling),
/// thread 0 also writes timestamps there (`list_profile.rs`).
const LIST_SOURCE: &str = r#"
struct gdsync_list_op { unsigned int kind, cond; unsigned long long a, b, c; };
struct gdsync_list {
    unsigned int n, seq;
    unsigned long long stamps;
    unsigned long long done;
    gdsync_list_op op[GDSYNC_LIST_OPS];
};

__device__ __forceinline__ bool gdsync_list_test64(unsigned long long cur, unsigned long long v,
                                                   unsigned int cond) {
    switch (cond) {
    case GDS_COND_GEQ: return (long long)(cur - v) >= 0;
    case GDS_COND_EQ:  return cur == v;
    case GDS_COND_AND: return (cur & v) != 0;
    case GDS_COND_NOR: return ~(cur | v) != 0;
    }
    return false;
}

// A write orders nothing by itself (the list's fences do): a plain store at system scope.
__device__ __forceinline__ void gdsync_list_store(const gdsync_list_op &o) {
    if (o.kind == GDSYNC_LIST_W32)
        asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(o.a), "r"((unsigned int)o.b) : "memory");
    else
        asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(o.a), "l"(o.b) : "memory");
}

// Profiling (`stamps` non-zero, `list_profile.rs`): the global timer at the start and the end,
// then the SM's cycle counter at the start and after each op.
__device__ __forceinline__ unsigned long long gdsync_list_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void gdsync_run_list(const gdsync_list l) {
    const bool lead = threadIdx.x == 0;
    const unsigned int n = l.n < GDSYNC_LIST_OPS ? l.n : GDSYNC_LIST_OPS;
    const unsigned int last = GDSYNC_LIST_OPS - 1;
    unsigned long long *const stamps = lead ? (unsigned long long *)l.stamps : 0;
    if (stamps) {
        stamps[0] = gdsync_list_globaltimer();
        stamps[2] = clock64();
    }
    // Unrolled, so every op is read at a constant offset of the parameter (an index known
    // only at run time would copy the whole list into each thread's local memory).
#pragma unroll
    for (unsigned int i = 0; i < GDSYNC_LIST_OPS; i++) {
        if (i >= n) break;
        const gdsync_list_op o = l.op[i];
        const unsigned int next = i + 1 < n ? l.op[(i + 1) & last].kind : 0;
        switch (o.kind) {
        case GDSYNC_LIST_W32: case GDSYNC_LIST_W64:
            if (lead) gdsync_list_store(o);
            break;
        case GDSYNC_LIST_WAIT32:
            if (lead) while (!gds_test32(gds_ld_acquire32(o.a), (unsigned int)o.b, o.cond)) {}
            __syncthreads();
            break;
        case GDSYNC_LIST_WAIT64:
            if (lead) while (!gdsync_list_test64(gds_ld_acquire64(o.a), o.b, o.cond)) {}
            __syncthreads();
            break;
        case GDSYNC_LIST_FENCE: if (lead) __threadfence_system(); break;
        case GDSYNC_LIST_COPY:
            // Stores thread 0 made before (a marker in the payload) are the block's to read.
            __syncthreads();
            if (o.cond && o.c <= GDS_LEAD_COPY_MAX) {
                if (lead) {
                    gdsync_copy_range((unsigned char *)o.a, (const unsigned char *)o.b, o.c, 0, 1);
                    // A copy is ordered before every later op (`Op::Copy`): a fence next
                    // does that by itself.
                    if (next != GDSYNC_LIST_FENCE) __threadfence_system();
                }
            } else {
                gdsync_copy_range((unsigned char *)o.a, (const unsigned char *)o.b, o.c, threadIdx.x, blockDim.x);
                if (o.cond) __threadfence_system();
                else __threadfence();
            }
            __syncthreads();
            // A store next (a retirement the host reads) follows the block's copy into GPU
            // memory system-wide too: thread 0's fence covers what the barrier showed it.
            if (lead && !o.cond && (next == GDSYNC_LIST_W32 || next == GDSYNC_LIST_W64))
                __threadfence_system();
            break;
        }
        if (stamps) stamps[i + 3] = clock64();
    }
    if (lead && l.done)
        asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(l.done), "r"(l.seq) : "memory");
    if (stamps) stamps[1] = gdsync_list_globaltimer();
}
"#;

/// [`LIST_SOURCE`] with its constants defined.
fn list_source() -> String {
    use kind::*;
    format!(
        "#define GDSYNC_LIST_OPS {LIST_OPS}\n#define GDSYNC_LIST_W32 {W32}\n#define GDSYNC_LIST_W64 {W64}\n\
         #define GDSYNC_LIST_WAIT32 {WAIT32}\n#define GDSYNC_LIST_WAIT64 {WAIT64}\n\
         #define GDSYNC_LIST_FENCE {FENCE}\n#define GDSYNC_LIST_COPY {COPY}\n{LIST_SOURCE}"
    )
}

/// Which copier staged copies use (`GDSYNC_STAGING_COPY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagingCopy {
    /// A kernel on the stream (the default where NVRTC is installed).
    Kernel,
    /// `cuMemcpyAsync` (the copy engines).
    Engine,
}

impl StagingCopy {
    /// `GDSYNC_STAGING_COPY` (`kernel` | `engine`); unset: the kernel.
    pub fn from_env() -> Result<StagingCopy> {
        Ok(
            match crate::env::choice("GDSYNC_STAGING_COPY", &["kernel", "engine"])? {
                Some("engine") => StagingCopy::Engine,
                _ => StagingCopy::Kernel,
            },
        )
    }
}

/// The staging kernels of one GPU, from one module.
#[derive(Clone)]
pub(super) struct StagingKernels {
    /// `gdsync_staged_copy`: one copy.
    pub copy: Function,
    /// `gdsync_run_list`: a whole list with its copies ([`super::list_kernel`]); `None` where
    /// it did not build (the log says why).
    pub list: Option<Function>,
}

/// The staging kernels of each GPU that [`prepare_staged_copies`] compiled; `None` where it
/// could not (no NVRTC, a compile error: logged) or where the copy engines were asked for.
fn kernels() -> &'static Mutex<HashMap<i32, Option<StagingKernels>>> {
    static KERNELS: OnceLock<Mutex<HashMap<i32, Option<StagingKernels>>>> = OnceLock::new();
    KERNELS.get_or_init(Default::default)
}

/// Whether staged copies on GPU `ordinal` run as kernels: [`prepare_staged_copies`]
/// compiled them (false before it ran, without NVRTC, on a compile error, and with
/// `GDSYNC_STAGING_COPY=engine`).
pub fn staged_copy_kernels(ordinal: i32) -> bool {
    staging_kernels(ordinal).is_some()
}

/// GPU `ordinal`'s staging kernels, if [`prepare_staged_copies`] made them.
pub(super) fn staging_kernels(ordinal: i32) -> Option<StagingKernels> {
    kernels()
        .lock()
        .ok()
        .and_then(|k| k.get(&ordinal).cloned().flatten())
}

/// Compiles and loads the staging kernels on every GPU of `cuda` that has none yet.
/// Call it where staging bounces are made, before any stream waits: loading a module may
/// wait for the GPU to go idle, which a stream blocked in a memory wait never does.
pub fn prepare_staged_copies(cuda: &Arc<Cuda>) {
    for ordinal in 0..cuda.gpus.len() as i32 {
        let known = kernels().lock().map_or(true, |k| k.contains_key(&ordinal));
        if known {
            continue;
        }
        // Compiled outside the lock: a copy on another thread never waits for a compile.
        let f = compile(cuda, ordinal);
        if let Ok(mut k) = kernels().lock() {
            k.entry(ordinal).or_insert(f);
        }
    }
}

fn compile(cuda: &Arc<Cuda>, ordinal: i32) -> Option<StagingKernels> {
    match StagingCopy::from_env() {
        Ok(StagingCopy::Engine) => return None,
        Ok(StagingCopy::Kernel) => {}
        Err(e) => {
            tracing::warn!("{e}; staged copies use the copy engines");
            return None;
        }
    }
    // Both kernels in one module; where the list kernel does not build or load (it needs
    // sm_70's acquire loads and release stores), the copy kernel alone.
    let made = compile_both(cuda, ordinal).or_else(|e| {
        tracing::warn!("GPU {ordinal}: staged lists run as memory operations with copy kernels between them: {e}");
        let m = cuda.compile(ordinal, COPY_SOURCE, &[])?;
        let copy = m.function("gdsync_staged_copy")?;
        copy.load_now()?;
        Ok::<_, crate::Error>(StagingKernels { copy, list: None })
    });
    match made {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!("GPU {ordinal}: staged copies use the copy engines, whose queues streams may share (a copy behind one stream's wait can then hold up another's): {e}");
            None
        }
    }
}

/// The copy and the list kernel, compiled as one module and loaded now, not at a first launch
/// behind a stream that waits ([`Function::load_now`]).
fn compile_both(cuda: &Arc<Cuda>, ordinal: i32) -> Result<StagingKernels> {
    let m = cuda.compile(ordinal, &format!("{COPY_SOURCE}\n{}", list_source()), &[])?;
    let (copy, list) = (
        m.function("gdsync_staged_copy")?,
        m.function("gdsync_run_list")?,
    );
    copy.load_now()?;
    list.load_now()?;
    if let Ok(n @ 1..) = list.local_bytes() {
        tracing::warn!("GPU {ordinal}: the list kernel uses {n} bytes of local memory per thread (its ops should be read at constant offsets)");
    }
    Ok(StagingKernels {
        copy,
        list: Some(list),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_variable_takes_kernel_or_engine() {
        let v = |s| crate::env::choice_of("GDSYNC_STAGING_COPY", Some(s), &["kernel", "engine"]);
        assert_eq!(v("engine").unwrap(), Some("engine"));
        let e = v("dma").unwrap_err().to_string();
        assert!(
            e.contains("GDSYNC_STAGING_COPY") && e.contains("kernel or engine"),
            "{e}"
        );
    }
}
