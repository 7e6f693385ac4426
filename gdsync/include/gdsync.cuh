// gdsync.cuh: kernel-side GPUDirect Async for gdsync (Rust). Descriptors are filled by the
// host (gdsync::kernel); a kernel rings doorbells and waits for completions with them
// (gds_send, gds_wait, gds_ring_run), or drives a whole QP by itself: composes the WQEs,
// rings, and polls the CQs (gds_qp_post_send, gds_qp_post_recv, gds_cq_poll, gds_cq_wait).
// The layouts below mirror the Rust #[repr(C)] types; the static_asserts are checked against
// the Rust offsets by a test, and hold when NVRTC compiles this header. The mlx5 format's
// constants (opcodes, CQE offsets, WQE sizes) come from gdsync_format.h, generated from the
// Rust format module (gdsync::format).
//
// Tests compile this header for the host too (GDS_HOST defined, with host stand-ins for the
// CUDA built-ins and for gds_now_ns, gds_ld_acquire32, gds_ld_acquire64 and gds_st_release64),
// and run its functions against the soft device.
#pragma once
#ifdef __CUDACC_RTC__
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned char uint8_t;
typedef int int32_t;
#else
#include <stdint.h>
#include <stddef.h>
#endif
#ifndef __CUDACC__
#define __align__(n) alignas(n)
#endif
// Where this header is compiled as one text (gdsync::kernel::HEADER, as NVRTC gets it), the
// generated header comes first and the include is skipped.
#ifndef GDSYNC_FORMAT_H
#include "gdsync_format.h"
#endif
// NVRTC has no offsetof: there, GDS_OFFSET_CHECK is a no-op and only sizes are checked (the
// Rust test checks the offsets written here against the Rust types).
#ifdef __CUDACC_RTC__
#define GDS_OFFSET_CHECK(t, m, off)
#else
#define GDS_OFFSET_CHECK(t, m, off) static_assert(offsetof(t, m) == off, #t "." #m)
#endif

#define GDS_OK 0
#define GDS_TIMEOUT 1
#define GDS_INVALID 2
#define GDS_FULL 3          // the ring has no free slot: consume completions first
#define GDS_EMPTY 4         // gds_cq_poll: no new completion
#define GDS_ERR_CQE 0x100   // GDS_ERR_CQE | syndrome: an error completion (mlx5 syndrome)
#define GDS_IS_CQE_ERROR(rc) (((rc) & ~0xFF) == GDS_ERR_CQE)
#define GDS_SYNDROME(rc) ((rc) & 0xFF)

#define GDS_COND_GEQ 0
#define GDS_COND_EQ 1
#define GDS_COND_AND 2
#define GDS_COND_NOR 3

#define GDS_DESC_SEND 1
#define GDS_DESC_WAIT 2

// Ring a QP's doorbell: fence (what the kernel stored before, the payload, is visible first),
// store the doorbell record, fence, store the 8-byte doorbell, then the
// QP's "rung to" word (after the doorbell: a CPU post of the QP reads it to know this
// doorbell is out). Where GPUs cannot reach the doorbell (a CPU proxy rings it), dbrec is 0
// and db is the proxy's request word: the one store asks the proxy to ring (and the proxy
// stores "rung to").
struct gds_send_desc {
    uint64_t dbrec;        // address of the send doorbell-record word (BE32 counter), or 0
    uint64_t db;           // address of the doorbell register, or the proxy's request word
    uint64_t db_value;     // the 8 doorbell bytes, as a native 64-bit store writes them
    uint32_t dbrec_value;  // the doorbell-record word, as a native 32-bit store writes it
    uint32_t reserved;
    uint64_t rung;         // address of the QP's "rung to" word (native u64), or 0 (none: Ringers::Executors)
    uint64_t rung_value;   // the producer counter the doorbell exposes sends up to
};
static_assert(sizeof(gds_send_desc) == 48, "gds_send_desc size");
GDS_OFFSET_CHECK(gds_send_desc, dbrec, 0);
GDS_OFFSET_CHECK(gds_send_desc, db, 8);
GDS_OFFSET_CHECK(gds_send_desc, db_value, 16);
GDS_OFFSET_CHECK(gds_send_desc, dbrec_value, 24);
GDS_OFFSET_CHECK(gds_send_desc, rung, 32);
GDS_OFFSET_CHECK(gds_send_desc, rung_value, 40);

// Wait until a 32-bit word satisfies a condition (for a completion: the CQE word at offset 60
// and its owner bit), then retire: store the CQ consumer index and the retired counters.
struct gds_wait_desc {
    uint64_t word;               // address of the 32-bit word to watch
    uint64_t ci_rec;             // CQ doorbell record (0: none)
    uint64_t retired;            // CQ retired counter (0: none)
    uint64_t retired_value;
    uint64_t ring_retired;       // QP ring retired counter (0: none)
    uint64_t ring_retired_value;
    uint32_t value;              // operand of the condition
    uint32_t cond;               // GDS_COND_*
    uint32_t ci_value;           // the doorbell-record word, as a native store writes it
    uint32_t reserved;
};
static_assert(sizeof(gds_wait_desc) == 64, "gds_wait_desc size");
GDS_OFFSET_CHECK(gds_wait_desc, word, 0);
GDS_OFFSET_CHECK(gds_wait_desc, ci_rec, 8);
GDS_OFFSET_CHECK(gds_wait_desc, retired, 16);
GDS_OFFSET_CHECK(gds_wait_desc, retired_value, 24);
GDS_OFFSET_CHECK(gds_wait_desc, ring_retired, 32);
GDS_OFFSET_CHECK(gds_wait_desc, ring_retired_value, 40);
GDS_OFFSET_CHECK(gds_wait_desc, value, 48);
GDS_OFFSET_CHECK(gds_wait_desc, cond, 52);
GDS_OFFSET_CHECK(gds_wait_desc, ci_value, 56);

// One entry of a descriptor ring. The host writes the body, then seq = index + 1.
struct __align__(16) gds_desc {
    uint64_t seq;
    uint32_t kind;               // GDS_DESC_SEND or GDS_DESC_WAIT
    uint32_t reserved;
    union {
        gds_send_desc send;
        gds_wait_desc wait;
    };
};
static_assert(sizeof(gds_desc) == 80, "gds_desc size");
GDS_OFFSET_CHECK(gds_desc, seq, 0);
GDS_OFFSET_CHECK(gds_desc, kind, 8);
GDS_OFFSET_CHECK(gds_desc, send, 16);

// A ring of descriptors the host keeps filling while a persistent kernel consumes them.
struct gds_desc_ring {
    uint64_t descs;      // address of cap gds_desc entries
    uint64_t consumed;   // address of the host-visible count of consumed entries
    uint32_t cap;
    uint32_t reserved;
};
static_assert(sizeof(gds_desc_ring) == 24, "gds_desc_ring size");
GDS_OFFSET_CHECK(gds_desc_ring, descs, 0);
GDS_OFFSET_CHECK(gds_desc_ring, consumed, 8);
GDS_OFFSET_CHECK(gds_desc_ring, cap, 16);

// A CQ a kernel consumes. ci and wq_ci are the kernel's working counters; the functions
// store them through to `retired` and `wq_retired` (host memory) after every completion.
struct gds_cq {
    uint64_t cqes;        // CQE ring: `entries` entries of 64 bytes
    uint64_t dbrec;       // consumer-index word of the CQ doorbell record (BE32)
    uint64_t retired;     // host copy of ci (native u64)
    uint64_t wq_retired;  // host copy of wq_ci (native u64)
    uint64_t ci;          // consumer index: next CQE to look at (free-running)
    uint64_t wq_ci;       // entries of the served ring known complete (send WQEBBs / receives)
    uint32_t entries;     // a power of two
    uint32_t cqn;
    uint64_t reserved;
};
static_assert(sizeof(gds_cq) == 64, "gds_cq size");
GDS_OFFSET_CHECK(gds_cq, cqes, 0);
GDS_OFFSET_CHECK(gds_cq, dbrec, 8);
GDS_OFFSET_CHECK(gds_cq, retired, 16);
GDS_OFFSET_CHECK(gds_cq, wq_retired, 24);
GDS_OFFSET_CHECK(gds_cq, ci, 32);
GDS_OFFSET_CHECK(gds_cq, wq_ci, 40);
GDS_OFFSET_CHECK(gds_cq, entries, 48);
GDS_OFFSET_CHECK(gds_cq, cqn, 52);

// A QP a kernel drives (gdsync::kernel::DeviceQp::desc). ONE THREAD DRIVES ONE QP (it may drive
// others too; two threads never share one): copy the descriptor into a local variable of that
// thread and pass its address to every call; the counters in it are that thread's working
// copy (stored through to host memory, `state`, so the host sees progress and the next launch
// resumes). Every WQE posted here is one 64-byte WQEBB.
struct gds_qp {
    uint64_t sq;          // send ring: sq_wqebbs WQEBBs of 64 bytes
    uint64_t rq;          // receive ring: rq_wqes WQEs of rq_stride bytes
    uint64_t dbrec;       // doorbell record: [RQ][SQ], BE32 each
    uint64_t db;          // doorbell register (0: a CPU proxy rings, see proxy)
    uint64_t proxy;       // CPU proxy word (0: the GPU rings): gets the send producer counter
    uint64_t state;       // host copies of sq_pi (+0) and rq_pi (+8), native u64
    uint64_t sq_pi;       // send producer counter in WQEBBs (free-running)
    uint64_t rq_pi;       // receive producer counter (free-running)
    uint32_t qpn;
    uint32_t sq_wqebbs;   // a power of two
    uint32_t rq_wqes;     // a power of two
    uint32_t rq_stride;   // bytes per receive WQE (16 per scatter entry)
    uint64_t reserved[2]; // zero from the host; a send prepared ahead: its doorbell, and 1 | its flags << 8 (gds_qp_prepare_send)
    gds_cq send_cq;       // completions of this QP's sends only
    gds_cq recv_cq;       // completions of this QP's receives only
};
static_assert(sizeof(gds_qp) == 224, "gds_qp size");
GDS_OFFSET_CHECK(gds_qp, sq, 0);
GDS_OFFSET_CHECK(gds_qp, rq, 8);
GDS_OFFSET_CHECK(gds_qp, dbrec, 16);
GDS_OFFSET_CHECK(gds_qp, db, 24);
GDS_OFFSET_CHECK(gds_qp, proxy, 32);
GDS_OFFSET_CHECK(gds_qp, state, 40);
GDS_OFFSET_CHECK(gds_qp, sq_pi, 48);
GDS_OFFSET_CHECK(gds_qp, rq_pi, 56);
GDS_OFFSET_CHECK(gds_qp, qpn, 64);
GDS_OFFSET_CHECK(gds_qp, sq_wqebbs, 68);
GDS_OFFSET_CHECK(gds_qp, rq_wqes, 72);
GDS_OFFSET_CHECK(gds_qp, rq_stride, 76);
GDS_OFFSET_CHECK(gds_qp, send_cq, 96);
GDS_OFFSET_CHECK(gds_qp, recv_cq, 160);

// Send opcodes: the mlx5 WQE opcodes GDS_OP_* of gdsync_format.h. gds_qp_post_send takes
// GDS_OP_SEND, _SEND_IMM, _RDMA_WRITE, _RDMA_WRITE_IMM and _RDMA_READ (GDS_OP_NOP:
// gds_qp_post_nop).
// Flags of gds_qp_post_send. Signal at least one send per ring's worth: slots are freed
// only by completions (an unsignalled send completes with the next signalled one).
#define GDS_SIGNALED 1u
#define GDS_FENCE 2u       // wait for earlier reads to complete first
#define GDS_SOLICITED 4u
// Internal to the peer functions: the submit also stores the receive counter into the doorbell
// record, after the fence that publishes the WQEs (receives staged by gds_qp_stage_recv).
#define GDS_RING_RECV 0x100u
// Most inline payload: what keeps an inline RDMA write in one WQEBB (ctrl 16 + raddr 16 +
// 4-byte header + 28).
#define GDS_MAX_INLINE (GDS_WQEBB - 2 * GDS_SEG_SIZE - GDS_INLINE_HEADER_SIZE)
static_assert(GDS_MAX_INLINE == 28, "GDS_MAX_INLINE");
// gds_wc.opcode: the CQE opcode.
#define GDS_WC_SEND_DONE GDS_CQE_OP_REQ              // a send, write or read of this QP completed
#define GDS_WC_RECV_WRITE_IMM GDS_CQE_OP_RESP_WR_IMM  // an RDMA write with immediate arrived (took a receive)
#define GDS_WC_RECV GDS_CQE_OP_RESP_SEND             // a send arrived
#define GDS_WC_RECV_IMM GDS_CQE_OP_RESP_SEND_IMM     // a send with immediate arrived
#define GDS_WC_REQ_ERR GDS_CQE_OP_REQ_ERR
#define GDS_WC_RESP_ERR GDS_CQE_OP_RESP_ERR

// One completion, as gds_cq_poll decodes it.
struct gds_wc {
    uint32_t byte_len;     // bytes received (receives) or read (RDMA read)
    uint32_t imm;          // immediate data, host order (GDS_WC_RECV_IMM, _WRITE_IMM)
    uint32_t qpn;
    uint16_t wqe_counter;  // send ring index (requester) or receive index (responder)
    uint8_t opcode;        // GDS_WC_*
    uint8_t wqe_opcode;    // requester: the GDS_OP_* of the completed send
    uint8_t syndrome;      // error completions: the mlx5 syndrome (0 otherwise)
    uint8_t vendor_syndrome;
    uint16_t reserved;
};

// The state block of a gds_peer (pinned host memory): its counters, stored through.
struct gds_peer_state {
    uint64_t sends;
    uint64_t sends_done;
    uint64_t sends_waited;
    uint64_t recvs;
    uint64_t recvs_waited;
    uint32_t error;
    uint32_t reserved;
    uint64_t one_sided;
    uint64_t reserved2;
};
static_assert(sizeof(gds_peer_state) == 64, "gds_peer_state size");
GDS_OFFSET_CHECK(gds_peer_state, sends, 0);
GDS_OFFSET_CHECK(gds_peer_state, sends_done, 8);
GDS_OFFSET_CHECK(gds_peer_state, sends_waited, 16);
GDS_OFFSET_CHECK(gds_peer_state, recvs, 24);
GDS_OFFSET_CHECK(gds_peer_state, recvs_waited, 32);
GDS_OFFSET_CHECK(gds_peer_state, error, 40);
GDS_OFFSET_CHECK(gds_peer_state, one_sided, 48);

// A connection to one peer with receiver-ready credits (mp: Comm::kernel_channels). One
// thread drives one peer, with a local copy, as for gds_qp. Sends match the peer's receives
// in order (FIFO). A send waits for a credit: the peer's count of receives posted for it,
// which the peer writes with an inline RDMA write (gds_peer_give_credit: one write may cover
// many receives). Sends may go unsignalled (gds_peer_send_flags): fewer completions to write
// and poll; waits still count every send (see gds_peer_poll_send). Puts and gets
// (gds_peer_put, gds_peer_get) go on the same send ring without a credit: they count as sends
// for waits (gds_peer_wait_send(s)) and complete in order with them.
struct gds_peer {
    gds_qp qp;                    // a QP dedicated to this peer
    uint64_t credit;              // my credit word: receives the peer posted for me (it writes)
    uint64_t remote_credit;       // at the peer: its credit word for me (I write my receive count)
    uint64_t state;               // gds_peer_state in pinned host memory
    uint64_t sends;               // sends posted, puts and gets included
    uint64_t sends_done;          // send completions consumed
    uint64_t sends_waited;        // send completions returned by gds_peer_wait_send
    uint64_t recvs;               // receives posted
    uint64_t recvs_waited;        // receive completions returned by gds_peer_wait_recv
    uint64_t credits;             // last credit value read
    uint32_t remote_credit_rkey;
    uint32_t rank;                // the peer's rank
    uint32_t error;               // first error (GDS_ERR_CQE | syndrome), sticky
    uint32_t reserved;
    // Working state of the kernel, not stored through (a new descriptor starts at 0, which
    // costs at most one repeated credit write and one NOP):
    uint64_t credited;            // receives the last credit write announced
    uint64_t signaled_pi;         // sq_pi right after the latest signalled WQE (0: none)
    uint64_t signaled_sends;      // sends posted up to and including that WQE
    // Staging (mp: Comm::kernel_channels_staged), for payloads in GPU memory the NIC cannot
    // reach: rings of pinned host bounces registered with the channel's device, send_slots
    // for sends and recv_slots for receives of slot_bytes each (all 0: not staged). A send
    // or receive uses the slot of its number (sends % send_slots, recvs % recv_slots).
    uint64_t send_bounce;         // the GPUs' address of the send slots (where kernels copy)
    uint64_t recv_bounce;         // the GPUs' address of the receive slots
    uint64_t send_bounce_nic;     // the address of the send slots the registration covers (WQEs name it)
    uint64_t recv_bounce_nic;     // the address of the receive slots the registration covers
    uint32_t send_bounce_lkey;
    uint32_t recv_bounce_lkey;
    uint32_t slot_bytes;          // bytes per slot: the longest staged message
    uint32_t send_slots;
    uint32_t recv_slots;
    uint32_t reserved2;
    uint64_t one_sided;           // puts and gets among the sends (they take no credit)
};
static_assert(sizeof(gds_peer) == 400, "gds_peer size");
GDS_OFFSET_CHECK(gds_peer, qp, 0);
GDS_OFFSET_CHECK(gds_peer, credit, 224);
GDS_OFFSET_CHECK(gds_peer, remote_credit, 232);
GDS_OFFSET_CHECK(gds_peer, state, 240);
GDS_OFFSET_CHECK(gds_peer, sends, 248);
GDS_OFFSET_CHECK(gds_peer, sends_done, 256);
GDS_OFFSET_CHECK(gds_peer, sends_waited, 264);
GDS_OFFSET_CHECK(gds_peer, recvs, 272);
GDS_OFFSET_CHECK(gds_peer, recvs_waited, 280);
GDS_OFFSET_CHECK(gds_peer, credits, 288);
GDS_OFFSET_CHECK(gds_peer, remote_credit_rkey, 296);
GDS_OFFSET_CHECK(gds_peer, rank, 300);
GDS_OFFSET_CHECK(gds_peer, error, 304);
GDS_OFFSET_CHECK(gds_peer, credited, 312);
GDS_OFFSET_CHECK(gds_peer, signaled_pi, 320);
GDS_OFFSET_CHECK(gds_peer, signaled_sends, 328);
GDS_OFFSET_CHECK(gds_peer, send_bounce, 336);
GDS_OFFSET_CHECK(gds_peer, recv_bounce, 344);
GDS_OFFSET_CHECK(gds_peer, send_bounce_nic, 352);
GDS_OFFSET_CHECK(gds_peer, recv_bounce_nic, 360);
GDS_OFFSET_CHECK(gds_peer, send_bounce_lkey, 368);
GDS_OFFSET_CHECK(gds_peer, recv_bounce_lkey, 372);
GDS_OFFSET_CHECK(gds_peer, slot_bytes, 376);
GDS_OFFSET_CHECK(gds_peer, send_slots, 380);
GDS_OFFSET_CHECK(gds_peer, recv_slots, 384);
GDS_OFFSET_CHECK(gds_peer, one_sided, 392);

// A remote buffer a kernel puts into or gets from (gds_peer_put, gds_peer_get): one rank's
// region of an mp window (mp: Window::for_kernels), as gdsync::RemoteBuf.
struct gds_remote {
    uint64_t addr;                // the region's address at its rank
    uint64_t len;                 // its length in bytes
    uint32_t rkey;
    uint32_t reserved;
};
static_assert(sizeof(gds_remote) == 24, "gds_remote size");
GDS_OFFSET_CHECK(gds_remote, addr, 0);
GDS_OFFSET_CHECK(gds_remote, len, 8);
GDS_OFFSET_CHECK(gds_remote, rkey, 16);

#if defined(__CUDACC__) || defined(GDS_HOST)
#ifndef GDS_HOST
__device__ __forceinline__ uint64_t gds_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#endif

__device__ __forceinline__ bool gds_test32(uint32_t cur, uint32_t value, uint32_t cond) {
    switch (cond) {
    case GDS_COND_GEQ: return (int32_t)(cur - value) >= 0;
    case GDS_COND_EQ:  return cur == value;
    case GDS_COND_AND: return (cur & value) != 0;
    case GDS_COND_NOR: return ~(cur | value) != 0;
    }
    return false;
}

// Stores a 32-bit value to host or device memory, visible system-wide.
__device__ __forceinline__ void gds_signal32(uint64_t addr, uint32_t value) {
    __threadfence_system();
    *(volatile uint32_t *)addr = value;
    __threadfence_system();
}

__device__ __forceinline__ void gds_signal64(uint64_t addr, uint64_t value) {
    __threadfence_system();
    *(volatile uint64_t *)addr = value;
    __threadfence_system();
}

// Staging (payloads in GPU memory where the NIC cannot reach it go through pinned host bounce
// buffers): copies this thread's share, as thread `part` of `parts`, of len bytes from src to
// dst (ranges that do not overlap), 16 bytes at a time where both are 16-byte aligned, else
// byte by byte. Loads bypass stale cache lines: src may be a bounce the NIC has just written.
__device__ __forceinline__ void gds_copy_part(uint64_t dst, uint64_t src, uint64_t len, uint32_t part, uint32_t parts) {
    uint64_t j = part;
    if (((dst | src) & 15) == 0) {
        uint64_t whole = len & ~(uint64_t)15;
        for (uint64_t i = (uint64_t)part * 16; i < whole; i += (uint64_t)parts * 16)
            *(ulonglong2 *)(dst + i) = __ldcv((const ulonglong2 *)(src + i));
        j += whole;
    }
    for (; j < len; j += parts) *(volatile uint8_t *)(dst + j) = *(const volatile uint8_t *)(src + j);
}

#ifndef GDS_HOST
// Copies len bytes from src to dst with every thread of the calling block (all of them call
// it, with the same arguments): a payload out of GPU memory into a bounce before the doorbell
// that sends it, or out of a bounce after the wait for its arrival. When it returns, the
// bytes are visible system-wide (to the NIC) and to every thread of the block.
__device__ __forceinline__ void gds_block_copy(uint64_t dst, uint64_t src, uint64_t len) {
    gds_copy_part(dst, src, len, threadIdx.x, blockDim.x);
    __threadfence_system();
    __syncthreads();
}

// Payloads up to this many bytes are copied into a send bounce by warp 0 alone, without a
// fence of their own (gds_block_copy_out).
#define GDS_LEAD_COPY_MAX 256

// The lanes of the calling block's warp 0 (fewer than 32 in a smaller block), for
// gds_warp0_mask and the copies warp 0 makes alone.
__device__ __forceinline__ uint32_t gds_warp0_lanes() { return blockDim.x < 32 ? blockDim.x : 32; }

// The __syncwarp mask of warp 0's lanes (gds_warp0_lanes).
__device__ __forceinline__ uint32_t gds_warp0_mask() {
    uint32_t lanes = gds_warp0_lanes();
    return lanes == 32 ? 0xFFFFFFFFu : (1u << lanes) - 1;
}

// gds_block_copy for a payload out of GPU memory into a bounce that thread 0 then sends (its
// gds_send, gds_peer_send_bounce or gds_qp_post_send comes next). A small payload (up to
// GDS_LEAD_COPY_MAX bytes) is copied by warp 0 alone (one thread's loads of GPU memory would go
// one after another, about 0.2 us each on an H200), with no fence of its own: the warp's
// barrier orders its lanes' stores before thread 0's send, and the system-wide fence that send
// makes before its doorbell record orders them before the doorbell, so the copy costs no PCIe
// round trip of its own. A larger one is copied by the whole block as gds_block_copy copies
// it. Every thread of the block calls it; only thread 0 may rely on the bytes when it returns
// (it sends them).
__device__ __forceinline__ void gds_block_copy_out(uint64_t dst, uint64_t src, uint64_t len) {
    if (len <= GDS_LEAD_COPY_MAX) {
        if (threadIdx.x >= 32) return;
        __syncwarp(gds_warp0_mask());  // what thread 0 wrote into src (a marker) is seen by every lane
        gds_copy_part(dst, src, len, threadIdx.x, gds_warp0_lanes());
        __syncwarp(gds_warp0_mask());
        return;
    }
    gds_block_copy(dst, src, len);
}

// gds_block_copy for a payload out of a bounce into GPU memory that only this GPU's threads
// read next (the NIC never reads it: that is why it was staged): when it returns the bytes are
// visible to every thread of the GPU, without the system-wide fence (which waits for the
// block's stores to reach the host, a PCIe round trip on the message's path).
__device__ __forceinline__ void gds_block_copy_in(uint64_t dst, uint64_t src, uint64_t len) {
    gds_copy_part(dst, src, len, threadIdx.x, blockDim.x);
    __threadfence();
    __syncthreads();
}

// Thread 0's v, returned to every thread of the calling block (all of them call it): how the
// thread that drives a peer hands the others a bounce's address, a length or a return code.
__device__ __forceinline__ uint64_t gds_block_share(uint64_t v) {
    __shared__ uint64_t shared_v;
    __syncthreads();
    if (threadIdx.x == 0) shared_v = v;
    __syncthreads();
    return shared_v;
}
#endif

// For spin loops: call once per spin; true once timeout_ns have passed since the clock was
// first read (it is read every 256 spins, so a loop that ends sooner never reads it).
__device__ __forceinline__ bool gds_expired(uint32_t spins, uint64_t *start, uint64_t timeout_ns) {
    if ((spins & 255) != 255) return false;
    uint64_t now = gds_now_ns();
    if (*start == 0) {
        *start = now;
        return false;
    }
    return now - *start > timeout_ns;
}

// Loads with acquire semantics at system scope: this thread's later loads and stores are not
// performed before them, so data the NIC (or the host) wrote before the word is seen after
// it, and a store that hands a slot back follows the read of the slot. A full fence
// (__threadfence_system) would also wait for this thread's earlier stores to reach the
// system: about a microsecond on the H200, per wait.
#ifndef GDS_HOST
__device__ __forceinline__ uint32_t gds_ld_acquire32(uint64_t addr) {
    uint32_t v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
    return v;
}

__device__ __forceinline__ uint64_t gds_ld_acquire64(uint64_t addr) {
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(addr) : "memory");
    return v;
}

// A store that the thread's earlier accesses, MMIO included, are performed before, as seen
// from the whole system (a release at system scope: lighter than __threadfence_system then a
// store, which would also order later accesses).
__device__ __forceinline__ void gds_st_release64(uint64_t addr, uint64_t v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(addr), "l"(v) : "memory");
}
#endif

// Waits until the 32-bit word at addr satisfies cond; GDS_TIMEOUT after timeout_ns. What was
// written before the word is visible after it (acquire).
__device__ __forceinline__ int gds_wait_value32(uint64_t addr, uint32_t value, uint32_t cond, uint64_t timeout_ns) {
    uint64_t start = 0;
    for (uint32_t spins = 0;; spins++) {
        if (gds_test32(gds_ld_acquire32(addr), value, cond)) return GDS_OK;
        if (gds_expired(spins, &start, timeout_ns)) return GDS_TIMEOUT;
    }
}

#ifndef GDS_HOST
// LL ("low latency", as NCCL's protocol of that name): a small staged payload travels as
// 8-byte lines, 4 bytes of data then a 4-byte flag, and the receiver polls the lines
// themselves. A NIC writes each naturally aligned 8 bytes of a payload in one piece (the soft
// device too), and a GPU loads an aligned 8-byte word in one piece, so a line that shows the
// message's flag holds the message's data: no marker to wait for first, and no second read of
// the bounce across PCIe after it (about 1.4 us on an H200). Twice the bytes on the wire; for
// payloads up to GDS_LL_MAX bytes. The flag must differ from every flag the bounce held
// before: a sequence number that starts at 1 over a zeroed bounce (0 is what a zeroed line
// holds), and a bounce zeroed again before the 32-bit sequence wraps.
#define GDS_LL_MAX 1024

// The bytes on the wire (and in each bounce) of an LL message of len payload bytes.
__device__ __forceinline__ uint64_t gds_ll_bytes(uint64_t len) { return (len + 3) / 4 * 8; }

// How many of the len payload bytes line k carries (4, or fewer in the last line).
__device__ __forceinline__ uint64_t gds_ll_data_bytes(uint64_t len, uint64_t k) {
    return len - 4 * k < 4 ? len - 4 * k : 4;
}

// Line k of the payload at src (len bytes): its data bytes, zero-padded, with flag above them.
__device__ __forceinline__ uint64_t gds_ll_line(uint64_t src, uint64_t len, uint64_t k, uint32_t flag) {
    uint64_t at = 4 * k, n = gds_ll_data_bytes(len, k);
    uint32_t d = 0;
    if (n == 4 && (src & 3) == 0) {
        d = *(const volatile uint32_t *)(src + at);
    } else {
        for (uint64_t j = 0; j < n; j++) d |= (uint32_t)((const volatile uint8_t *)src)[at + j] << (8 * j);
    }
    return ((uint64_t)flag << 32) | d;
}

// Packs len bytes (len <= GDS_LL_MAX) of GPU memory at src into LL lines at dst (a send
// bounce, 8-aligned) under flag, for thread 0 to send next; every thread of the block calls it.
// Up to GDS_LEAD_COPY_MAX bytes warp 0 alone packs them, a line per lane at a time (one thread's
// loads of GPU memory would go one after another, about 0.2 us each on an H200), and the
// warp's barrier orders its lanes' lines before thread 0's send, whose fence orders them
// before the doorbell record; a larger payload the whole block packs, fenced system-wide.
__device__ __forceinline__ void gds_block_ll_pack(uint64_t dst, uint64_t src, uint64_t len, uint32_t flag) {
    uint64_t lines = (len + 3) / 4;
    bool warp = len <= GDS_LEAD_COPY_MAX;
    if (warp && threadIdx.x >= 32) return;
    if (warp) __syncwarp(gds_warp0_mask());  // what thread 0 wrote into src (a marker) is seen by every lane
    uint32_t step = warp ? gds_warp0_lanes() : blockDim.x;
    for (uint64_t k = threadIdx.x; k < lines; k += step)
        *(volatile uint64_t *)(dst + 8 * k) = gds_ll_line(src, len, k, flag);
    if (warp) {
        __syncwarp(gds_warp0_mask());
        return;
    }
    __threadfence_system();
    __syncthreads();
}

// Waits for an LL message of len bytes under flag at src (a receive bounce, 8-aligned) and
// writes its data to dst (GPU memory); every thread of the block calls it, and each polls its
// own lines. Returns GDS_OK to every thread once every line has arrived and the data is
// visible to the GPU's threads, GDS_TIMEOUT (to every thread) if a thread's lines had not all
// arrived after timeout_ns; then the lines that had arrived are in dst already.
__device__ __forceinline__ int gds_block_ll_recv(uint64_t dst, uint64_t src, uint64_t len, uint32_t flag,
        uint64_t timeout_ns) {
    uint64_t lines = (len + 3) / 4, start = 0;
    uint32_t spins = 0;
    bool late = false;
    for (uint64_t k = threadIdx.x; k < lines && !late; k += blockDim.x) {
        uint64_t v;
        for (;; spins++) {
            v = *(const volatile uint64_t *)(src + 8 * k);
            if ((uint32_t)(v >> 32) == flag) break;
            if (gds_expired(spins, &start, timeout_ns)) { late = true; break; }
        }
        if (late) break;
        uint64_t at = 4 * k, n = gds_ll_data_bytes(len, k);
        if (n == 4 && (dst & 3) == 0) {
            *(uint32_t *)(dst + at) = (uint32_t)v;
        } else {
            for (uint64_t j = 0; j < n; j++) ((uint8_t *)dst)[at + j] = (uint8_t)(v >> (8 * j));
        }
    }
    __threadfence();
    return __syncthreads_or(late) ? GDS_TIMEOUT : GDS_OK;
}
#endif

// Rings the doorbell a send descriptor describes. The first fence makes data this kernel
// wrote earlier visible before the doorbell record; the second orders the record before the
// doorbell (the NIC reads the record when the doorbell rings).
__device__ __forceinline__ int gds_send(const gds_send_desc *d) {
    if (d->db == 0) return GDS_INVALID;
    __threadfence_system();
    if (d->dbrec) {
        *(volatile uint32_t *)d->dbrec = d->dbrec_value;
        __threadfence_system();
    }
    *(volatile uint64_t *)d->db = d->db_value;
    if (d->rung) {
        // A release store at system scope: the doorbell is performed before "rung to" is
        // seen (what a fence then a store would give, without a full sequential fence).
        // rung is 0 for a QP whose CPU posts never interleave with its commits
        // (Ringers::Executors): no CPU post reads the word then, and one that comes later
        // learns that this doorbell is out from a completion at or beyond it (the NIC
        // executes only what a doorbell exposed), so nothing needs ordering after the
        // doorbell and the send costs the same two system fences as a --raw marker store.
        gds_st_release64(d->rung, d->rung_value);
    }
    return GDS_OK;
}

// Waits for the completion a wait descriptor describes (an error completion passes too: the
// host reports it), then retires it. GDS_TIMEOUT after timeout_ns.
__device__ __forceinline__ int gds_wait(const gds_wait_desc *d, uint64_t timeout_ns) {
    int r = gds_wait_value32(d->word, d->value, d->cond, timeout_ns);
    if (r != GDS_OK) return r;
    if (d->ci_rec) *(volatile uint32_t *)d->ci_rec = d->ci_value;
    if (d->retired || d->ring_retired) {
        // The consumer index before the retired counters: a CPU that sees a ring's slots
        // handed back posts into them, and the CQ must have room for their completions.
        __threadfence_system();
        if (d->retired) *(volatile uint64_t *)d->retired = d->retired_value;
        if (d->ring_retired) *(volatile uint64_t *)d->ring_retired = d->ring_retired_value;
    }
    return GDS_OK;
}

// Runs a descriptor (a send or a wait).
__device__ __forceinline__ int gds_run(const gds_desc *d, uint64_t timeout_ns) {
    return d->kind == GDS_DESC_SEND ? gds_send(&d->send)
         : d->kind == GDS_DESC_WAIT ? gds_wait(&d->wait, timeout_ns)
         : GDS_INVALID;
}

// Takes entry `index` of a descriptor ring, waiting (up to timeout_ns) for the host to fill it.
__device__ __forceinline__ const gds_desc *gds_ring_get(const gds_desc_ring *r, uint64_t index, uint64_t timeout_ns) {
    const gds_desc *d = (const gds_desc *)r->descs + (index % r->cap);
    const volatile uint64_t *seq = (const volatile uint64_t *)&d->seq;
    uint64_t start = 0;
    for (uint32_t spins = 0;; spins++) {
        if (*seq == index + 1) {
            __threadfence();  // the entry's body is read after its seq
            return d;
        }
        if (gds_expired(spins, &start, timeout_ns)) return 0;
    }
}

// Tells the host entries up to `index` (inclusive) were used, so their slots can be refilled.
__device__ __forceinline__ void gds_ring_release(const gds_desc_ring *r, uint64_t index) {
    __threadfence();  // the entries' loads are done before the slots are handed back
    *(volatile uint64_t *)r->consumed = index + 1;
}

// Most entries gds_ring_fetch_n copies at once.
#define GDS_RING_FETCH_MAX 4

// Copies entries index .. index + n - 1 out of the ring with one thread (1 <= n <=
// GDS_RING_FETCH_MAX and the ring's capacity) and releases their slots. It waits for the last
// entry only (the host fills entries in order, so the ones before it are filled as well) and
// releases once, but the loads are the thread's: five 16-byte loads per entry, which go out
// one after another (about 1.1-1.5 us each on an H200, memop_cost), so the cost grows with n.
// A kernel that can spare a warp fetches with gds_ring_fetch_warp. GDS_TIMEOUT if the host did
// not fill them in time (nothing is released); GDS_INVALID for a bad n.
__device__ __forceinline__ int gds_ring_fetch_n(const gds_desc_ring *r, uint64_t index, uint32_t n, gds_desc *out,
                                                uint64_t timeout_ns) {
    if (n == 0 || n > GDS_RING_FETCH_MAX || n > r->cap) return GDS_INVALID;
    if (!gds_ring_get(r, index + n - 1, timeout_ns)) return GDS_TIMEOUT;
    // Every load issued before any is used (loads that bypass stale cache lines, __ldcv).
    ulonglong2 v[GDS_RING_FETCH_MAX][5];
#pragma unroll
    for (uint32_t k = 0; k < GDS_RING_FETCH_MAX; k++) {
        if (k < n) {
            const ulonglong2 *src = (const ulonglong2 *)((const gds_desc *)r->descs + (index + k) % r->cap);
#pragma unroll
            for (int j = 0; j < 5; j++) v[k][j] = __ldcv(src + j);
        }
    }
#pragma unroll
    for (uint32_t k = 0; k < GDS_RING_FETCH_MAX; k++) {
        if (k < n) {
            ulonglong2 *dst = (ulonglong2 *)(out + k);
#pragma unroll
            for (int j = 0; j < 5; j++) dst[j] = v[k][j];
        }
    }
    gds_ring_release(r, index + n - 1);
    return GDS_OK;
}

// Copies entry `index` out of the ring (so it can be fetched ahead of its use) and releases
// its slot: gds_ring_fetch_n of one entry. GDS_TIMEOUT if the host did not fill it in time.
__device__ __forceinline__ int gds_ring_fetch(const gds_desc_ring *r, uint64_t index, gds_desc *out, uint64_t timeout_ns) {
    return gds_ring_fetch_n(r, index, 1, out, timeout_ns);
}

#ifndef GDS_HOST
// gds_ring_fetch_n by a whole warp: every lane of the calling warp calls it (converged, with
// the same arguments) and every lane gets the entries. A thread's loads from host memory go
// out one after another, about 1.1-1.5 us each on an H200, and an entry takes five
// (memop_cost); a warp's lanes load theirs at once. So lane 0 waits for the last entry, then
// each of the first 5n lanes loads one 16-byte part, and the parts are passed to every lane
// (__shfl_sync): a fetch of up to GDS_RING_FETCH_MAX entries costs about two loads' time.
// Codes as gds_ring_fetch_n, the same in every lane.
__device__ __forceinline__ int gds_ring_fetch_warp(const gds_desc_ring *r, uint64_t index, uint32_t n, gds_desc *out,
                                                   uint64_t timeout_ns) {
    const uint32_t all = 0xFFFFFFFFu, lane = threadIdx.x & 31;
    if (n == 0 || n > GDS_RING_FETCH_MAX || n > r->cap) return GDS_INVALID;
    int rc = GDS_OK;
    if (lane == 0 && !gds_ring_get(r, index + n - 1, timeout_ns)) rc = GDS_TIMEOUT;
    rc = __shfl_sync(all, rc, 0);
    if (rc) return rc;
    ulonglong2 part = {0, 0};
    if (lane < 5 * n) part = __ldcv((const ulonglong2 *)((const gds_desc *)r->descs + (index + lane / 5) % r->cap) + lane % 5);
    ulonglong2 *dst = (ulonglong2 *)out;
#pragma unroll
    for (uint32_t c = 0; c < 5 * GDS_RING_FETCH_MAX; c++) {
        ulonglong2 v;
        v.x = __shfl_sync(all, part.x, c);
        v.y = __shfl_sync(all, part.y, c);
        if (c < 5 * n) dst[c] = v;
    }
    __syncwarp(all);
    if (lane == 0) gds_ring_release(r, index + n - 1);
    return GDS_OK;
}
#endif

// Runs entry `index`: a send or a wait. Returns GDS_OK, GDS_TIMEOUT or GDS_INVALID.
__device__ __forceinline__ int gds_ring_run(const gds_desc_ring *r, uint64_t index, uint64_t timeout_ns) {
    gds_desc d;
    int rc = gds_ring_fetch(r, index, &d, timeout_ns);
    return rc != GDS_OK ? rc : gds_run(&d, timeout_ns);
}
// ---------------------------------------------------------------- a QP driven by a kernel
//
// One thread drives one QP (and its two CQs): the gds_qp is that thread's working copy. The
// rings, CQs and doorbells are in pinned host memory (the soft device) or NIC memory.

__device__ __forceinline__ uint32_t gds_bswap32(uint32_t x) { return __byte_perm(x, 0, 0x0123); }

// A data segment {BE32 len, BE32 lkey, BE64 addr} as four native words.
__device__ __forceinline__ void gds_seg_data(uint32_t *w, uint64_t addr, uint32_t len, uint32_t lkey) {
    w[0] = gds_bswap32(len);
    w[1] = gds_bswap32(lkey);
    w[2] = gds_bswap32((uint32_t)(addr >> 32));
    w[3] = gds_bswap32((uint32_t)addr);
}

// A remote-address segment {BE64 raddr, BE32 rkey, 0}.
__device__ __forceinline__ void gds_seg_raddr(uint32_t *w, uint64_t raddr, uint32_t rkey) {
    w[0] = gds_bswap32((uint32_t)(raddr >> 32));
    w[1] = gds_bswap32((uint32_t)raddr);
    w[2] = gds_bswap32(rkey);
    w[3] = 0;
}

// Send-ring slots free, given the completions consumed so far.
__device__ __forceinline__ uint32_t gds_qp_send_room(const gds_qp *qp) {
    return qp->sq_wqebbs - (uint32_t)(qp->sq_pi - qp->send_cq.wq_ci);
}

// Stores the receive counter into the doorbell record, where the NIC reads it (receives have
// no doorbell), and its host copy. The WQEs must be published first (a system fence).
__device__ __forceinline__ void gds_qp_publish_recvs(gds_qp *qp) {
    *(volatile uint32_t *)(qp->dbrec + 4 * GDS_DBREC_RQ) = gds_bswap32((uint32_t)(qp->rq_pi & 0xFFFF));
    *(volatile uint64_t *)(qp->state + 8) = qp->rq_pi;
}

// Whether a send is prepared and not rung yet: gds_qp_prepare_send keeps its doorbell in
// reserved[0] and 1 | its flags << 8 in reserved[1]; every other post on the send queue is
// refused meanwhile.
__device__ __forceinline__ bool gds_qp_prepared(const gds_qp *qp) { return qp->reserved[1] != 0; }

// Internal (gds_qp_submit, gds_qp_store_send; no refusal of its own): fills the control
// segment (w[0..3]) of a WQE of `ds` units and stores the WQE in the next send slot, without
// ringing: the doorbell it needs (its control segment's first 8 bytes).
__device__ __forceinline__ uint64_t gds_qp_store_wqe(gds_qp *qp, uint32_t opcode, uint32_t *w, uint32_t ds, uint32_t imm, uint32_t flags) {
    uint32_t fm_ce_se = ((flags & GDS_SIGNALED) ? GDS_FM_CE_SE_CQ_UPDATE : 0u) |
                        ((flags & GDS_SOLICITED) ? GDS_FM_CE_SE_SOLICITED : 0u) |
                        ((flags & GDS_FENCE) ? GDS_FM_CE_SE_FENCE : 0u);
    w[0] = gds_bswap32(((uint32_t)(qp->sq_pi & 0xFFFF) << 8) | opcode);
    w[1] = gds_bswap32((qp->qpn << 8) | ds);
    w[2] = fm_ce_se << 24;  // byte 11; signature and stream id (bytes 8..10) stay 0
    w[3] = (opcode == GDS_OP_SEND_IMM || opcode == GDS_OP_RDMA_WRITE_IMM) ? gds_bswap32(imm) : 0;
    uint4 *slot = (uint4 *)(qp->sq + (qp->sq_pi & (qp->sq_wqebbs - 1)) * GDS_WQEBB);
    for (uint32_t i = 0; i < ds; i++) slot[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    qp->sq_pi++;
    return ((uint64_t)w[1] << 32) | w[0];
}

// Internal (gds_qp_submit, gds_qp_post_send, gds_qp_ring_prepared): rings the WQEs stored up
// to sq_pi, the last with doorbell `db`: (data, WQEs) -> fence -> doorbell record -> fence ->
// doorbell. The first fence also publishes data this thread wrote for the NIC to read.
__device__ __forceinline__ void gds_qp_ring(gds_qp *qp, uint64_t db, uint32_t flags) {
    __threadfence_system();
    if (flags & GDS_RING_RECV) gds_qp_publish_recvs(qp);
    if (qp->proxy) {
        *(volatile uint64_t *)qp->proxy = qp->sq_pi;  // the CPU proxy rings
    } else {
        *(volatile uint32_t *)(qp->dbrec + 4 * GDS_DBREC_SQ) = gds_bswap32((uint32_t)(qp->sq_pi & 0xFFFF));
        __threadfence_system();
        // The doorbell carries the first 8 bytes of the WQE's control segment.
        *(volatile uint64_t *)qp->db = db;
    }
    *(volatile uint64_t *)qp->state = qp->sq_pi;
}

// Stores a WQE of `ds` units (gds_qp_store_wqe) and rings it (gds_qp_ring). GDS_INVALID while
// a send is prepared (gds_qp_prepare_send): this doorbell would expose it before its data.
__device__ __forceinline__ int gds_qp_submit(gds_qp *qp, uint32_t opcode, uint32_t *w, uint32_t ds, uint32_t imm, uint32_t flags) {
    if (gds_qp_prepared(qp)) return GDS_INVALID;
    gds_qp_ring(qp, gds_qp_store_wqe(qp, opcode, w, ds, imm, flags), flags);
    return GDS_OK;
}

__device__ __forceinline__ bool gds_op_remote(uint32_t opcode) {
    return opcode == GDS_OP_RDMA_WRITE || opcode == GDS_OP_RDMA_WRITE_IMM || opcode == GDS_OP_RDMA_READ;
}

// Checks a send of `len` bytes (at most max_len) and fills its remote-address segment:
// GDS_OK with *ds units of w used, GDS_INVALID (unknown opcode, descriptor without doorbell)
// or GDS_FULL (the send ring has no free slot).
__device__ __forceinline__ int gds_qp_begin_send(const gds_qp *qp, uint32_t opcode, uint32_t len, uint32_t max_len,
                                                 uint64_t raddr, uint32_t rkey, uint32_t *w, uint32_t *ds) {
    if (!(opcode == GDS_OP_SEND || opcode == GDS_OP_SEND_IMM || gds_op_remote(opcode)) || len > max_len ||
        qp->sq == 0 || (qp->db == 0 && qp->proxy == 0) || gds_qp_prepared(qp))
        return GDS_INVALID;
    if (gds_qp_send_room(qp) == 0) return GDS_FULL;
    *ds = 1;
    if (gds_op_remote(opcode)) gds_seg_raddr(&w[4 * (*ds)++], raddr, rkey);
    return GDS_OK;
}

// Posts a send, send with immediate, RDMA write (+ immediate) or RDMA read of `len` bytes at
// laddr/lkey (raddr/rkey for the remote side; ignored for sends). GDS_FULL, writing
// nothing, when the send ring has no free slot: consume send completions (gds_cq_poll on
// qp->send_cq) and try again. GDS_INVALID for an unknown opcode or a descriptor without a
// doorbell.
// Internal (gds_qp_post_send, gds_qp_prepare_send): checks and stores the WQE of a send with
// one data segment, without ringing; *db gets its doorbell. Codes as gds_qp_post_send.
__device__ __forceinline__ int gds_qp_store_send(gds_qp *qp, uint32_t opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
                                                 uint64_t raddr, uint32_t rkey, uint32_t imm, uint32_t flags, uint64_t *db) {
    uint32_t w[12];
    uint32_t ds;
    int rc = gds_qp_begin_send(qp, opcode, len, 0x7FFFFFFFu, raddr, rkey, w, &ds);
    if (rc != GDS_OK) return rc;
    if (len > 0) gds_seg_data(&w[4 * ds++], laddr, len, lkey);  // no zero-length segment
    *db = gds_qp_store_wqe(qp, opcode, w, ds, imm, flags);
    return GDS_OK;
}

__device__ __forceinline__ int gds_qp_post_send(gds_qp *qp, uint32_t opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
                                                uint64_t raddr, uint32_t rkey, uint32_t imm, uint32_t flags) {
    uint64_t db;
    int rc = gds_qp_store_send(qp, opcode, laddr, lkey, len, raddr, rkey, imm, flags, &db);
    if (rc == GDS_OK) gds_qp_ring(qp, db, flags);
    return rc;
}

// Like gds_qp_post_send, but only stores the WQE: gds_qp_ring_prepared rings it later, once
// its data is ready. A thread that waits before its send (for the message it answers) can
// prepare the send before the wait, while it has time: on the message's path it then only
// rings (two fences, the doorbell record and the doorbell, as for a send a CPU prepared),
// where gds_qp_post_send also composes and stores the WQE. One send prepared at a time: until
// it is rung, every other post on the send queue is refused (GDS_INVALID, before any wait for
// room), as its doorbell would expose the prepared send before its data, and so is a second
// prepare; receives may still be posted. A prepared send the kernel never rings is dropped:
// the host's copy of sq_pi is stored when it rings, so the next launch overwrites its slot.
// Codes as gds_qp_post_send.
__device__ __forceinline__ int gds_qp_prepare_send(gds_qp *qp, uint32_t opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
                                                   uint64_t raddr, uint32_t rkey, uint32_t imm, uint32_t flags) {
    // (gds_qp_begin_send refuses while a send is prepared.)
    int rc = gds_qp_store_send(qp, opcode, laddr, lkey, len, raddr, rkey, imm, flags, &qp->reserved[0]);
    if (rc == GDS_OK) qp->reserved[1] = 1 | ((uint64_t)flags << 8);
    return rc;
}

// Rings the send gds_qp_prepare_send stored (its data must be in place). GDS_INVALID if none is.
__device__ __forceinline__ int gds_qp_ring_prepared(gds_qp *qp) {
    if (!gds_qp_prepared(qp)) return GDS_INVALID;
    qp->reserved[1] = 0;
    gds_qp_ring(qp, qp->reserved[0], 0);
    return GDS_OK;
}

// Like gds_qp_post_send, with up to GDS_MAX_INLINE bytes copied from `data` (any memory this
// thread can read) into the WQE: no registration needed, and `data` may be reused at once.
// Sends and RDMA writes only.
__device__ __forceinline__ int gds_qp_post_send_inline(gds_qp *qp, uint32_t opcode, const void *data, uint32_t len,
                                                       uint64_t raddr, uint32_t rkey, uint32_t imm, uint32_t flags) {
    if (opcode == GDS_OP_RDMA_READ) return GDS_INVALID;
    uint32_t w[16] = {0};
    uint32_t ds;
    int rc = gds_qp_begin_send(qp, opcode, len, GDS_MAX_INLINE, raddr, rkey, w, &ds);
    if (rc != GDS_OK) return rc;
    w[4 * ds] = gds_bswap32(len | GDS_INLINE_SEG_FLAG);  // inline header, payload after it
    unsigned char *payload = (unsigned char *)&w[4 * ds] + GDS_INLINE_HEADER_SIZE;
    for (uint32_t i = 0; i < len; i++) payload[i] = ((const unsigned char *)data)[i];
    ds += (GDS_INLINE_HEADER_SIZE + len + GDS_SEG_SIZE - 1) / GDS_SEG_SIZE;
    return gds_qp_submit(qp, opcode, w, ds, imm, flags);
}

// Posts a NOP: a WQE of one control segment that moves no data. Signalled, its completion
// tells that every WQE posted before it completed (work completes in order), e.g. unsignalled
// sends with no signalled WQE after them. GDS_FULL or GDS_INVALID as gds_qp_post_send.
__device__ __forceinline__ int gds_qp_post_nop(gds_qp *qp, uint32_t flags) {
    if (qp->sq == 0 || (qp->db == 0 && qp->proxy == 0) || gds_qp_prepared(qp)) return GDS_INVALID;
    if (gds_qp_send_room(qp) == 0) return GDS_FULL;
    uint32_t w[4];
    return gds_qp_submit(qp, GDS_OP_NOP, w, 1, 0, flags);
}

// Posts a receive of up to `len` bytes into addr/lkey (len 0: a receive for a message
// without payload or for an RDMA write with immediate). GDS_FULL when the receive ring has
// no free slot: consume receive completions first. Receives have no doorbell: the NIC
// reads the receive counter of the doorbell record.
__device__ __forceinline__ int gds_qp_stage_recv(gds_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey);
__device__ __forceinline__ int gds_qp_post_recv(gds_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey) {
    int rc = gds_qp_stage_recv(qp, addr, len, lkey);
    if (rc != GDS_OK) return rc;
    __threadfence_system();  // the WQE before the counter the NIC reads
    gds_qp_publish_recvs(qp);
    return GDS_OK;
}

// Stores a receive WQE as gds_qp_post_recv does, without telling the NIC: it sees the receive
// once the counter is published (gds_qp_publish_recvs after a system fence; the peer
// functions do it in the fence of their next credit write).
__device__ __forceinline__ int gds_qp_stage_recv(gds_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey) {
    if (len > 0x7FFFFFFFu || qp->rq == 0) return GDS_INVALID;
    if (qp->rq_pi - qp->recv_cq.wq_ci >= qp->rq_wqes) return GDS_FULL;
    uint4 *wqe = (uint4 *)(qp->rq + (qp->rq_pi & (qp->rq_wqes - 1)) * qp->rq_stride);
    uint32_t n = 0;
    if (len > 0) {
        uint32_t w[4];
        gds_seg_data(w, addr, len, lkey);
        wqe[n++] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (n * GDS_SEG_SIZE < qp->rq_stride) wqe[n] = make_uint4(0, gds_bswap32(GDS_INVALID_LKEY), 0, 0);  // list terminator
    qp->rq_pi++;
    return GDS_OK;
}

// Payloads in GPU memory: a ConnectX writes them peer-to-peer while the CQE goes to host
// memory, so seeing the CQE here implies seeing the payload only on a GPU whose
// GPU_DIRECT_RDMA_WRITES_ORDERING is at least 100 (owner; the H100 and H200 report 100). A
// kernel cannot flush inbound writes itself; the host refuses GPU-memory write targets where
// the GPU neither orders nor flushes them (docs/hardware.md). Every address in gds_qp/gds_cq
// is the GPUs' address of the memory (cuMemHostGetDevicePointer), filled in by the host.
//
// Consumes the next completion if the NIC wrote it: GDS_OK (wc filled), GDS_EMPTY, or
// GDS_ERR_CQE | syndrome for an error completion (wc filled too; the QP is then in error and
// its later work completes with GDS_ERR_CQE | 0x05, flushed). A CQE is new when its opcode
// is not INVALID and its owner bit equals the pass parity of ci. Then stores the consumer
// index to the CQ doorbell record (so the NIC may reuse the slot) and the host copies.
// With body == false, wc->byte_len and wc->imm are left 0: the poll reads one aligned 8-byte
// word (bytes 56..63: QPN and WQE opcode, WQE counter, owner and opcode), one read across
// PCIe, where the byte count and immediate (bytes 32..47) take a second one after the owner
// is seen, and a fence. An error CQE's syndromes (bytes 54, 55) are read after the owner too.
//
// The poll reads the CQE's bytes 32..63 at most: the 8-byte word at GDS_CQE_SOP_DROP_QPN_OFFSET
// (which holds the owner word), then two 16-byte loads (lo: 32..47, hi: 48..63).
static_assert(GDS_CQE_SOP_DROP_QPN_OFFSET % 8 == 0 && GDS_CQE_SOP_DROP_QPN_OFFSET + 8 == GDS_CQE_SIZE,
              "sop_drop_qpn and the owner word are the CQE's last 8 bytes");
static_assert(GDS_CQE_WQE_COUNTER_OFFSET == GDS_CQE_OWNER_WORD_OFFSET &&
                  GDS_CQE_OP_OWN_OFFSET == GDS_CQE_OWNER_WORD_OFFSET + 3,
              "the owner word is wqe_counter (BE16), signature, op_own");
static_assert(GDS_CQE_IMM_OFFSET >= 32 && GDS_CQE_BYTE_CNT_OFFSET >= 32 && GDS_CQE_VENDOR_SYNDROME_OFFSET >= 32 &&
                  GDS_CQE_IMM_OFFSET % 4 == 0 && GDS_CQE_BYTE_CNT_OFFSET % 4 == 0,
              "the fields a poll reads lie in bytes 32..63");
// The 8-byte word of bytes 32..63 that holds byte `off` (a constant: this folds away).
__device__ __forceinline__ uint64_t gds_cqe_word(ulonglong2 lo, ulonglong2 hi, uint32_t off) {
    return off < 40 ? lo.x : off < 48 ? lo.y : off < 56 ? hi.x : hi.y;
}
// The CQE field at byte `off` in the low bits (a native load: little-endian).
#define GDS_CQE_FIELD(lo, hi, off) (gds_cqe_word(lo, hi, off) >> (((off) & 7) * 8))
__device__ __forceinline__ int gds_cq_poll_fields(gds_cq *cq, gds_wc *wc, bool body) {
    uint64_t e = cq->cqes + (cq->ci & (cq->entries - 1)) * GDS_CQE_SIZE;
    // One 8-byte load polls the owner byte and brings the fields beside it; acquire: the rest
    // of the CQE, the data it completes and the stores below come after it.
    uint64_t tail = gds_ld_acquire64(e + GDS_CQE_SOP_DROP_QPN_OFFSET);
    // wqe_counter (BE16), signature, op_own
    uint32_t word60 = (uint32_t)(tail >> ((GDS_CQE_OWNER_WORD_OFFSET - GDS_CQE_SOP_DROP_QPN_OFFSET) * 8));
    uint32_t op_own = word60 >> ((GDS_CQE_OP_OWN_OFFSET - GDS_CQE_OWNER_WORD_OFFSET) * 8);
    if ((op_own >> 4) == GDS_CQE_OP_INVALID ||
        (op_own & GDS_CQE_OWNER_MASK) != (uint32_t)((cq->ci & cq->entries) != 0))
        return GDS_EMPTY;
    uint32_t opcode = op_own >> 4;
    bool err = opcode == GDS_WC_REQ_ERR || opcode == GDS_WC_RESP_ERR;
    // Two independent 16-byte loads (bytes 32..63) when more is needed: they overlap, and a
    // fence keeps them before the store that hands the slot back.
    ulonglong2 lo = {0, 0}, hi = {0, 0};
    if (body || err) {
        lo = __ldcv((const ulonglong2 *)(e + 32));
        hi = __ldcv((const ulonglong2 *)(e + 48));
        __threadfence_system();
    }
    uint16_t counter = (uint16_t)(((word60 & 0xFF) << 8) | ((word60 >> 8) & 0xFF));
    uint32_t sop = gds_bswap32((uint32_t)tail);  // sop_drop_qpn: WQE opcode | QPN
    wc->byte_len = err || !body ? 0 : gds_bswap32((uint32_t)GDS_CQE_FIELD(lo, hi, GDS_CQE_BYTE_CNT_OFFSET));
    wc->imm = body ? gds_bswap32((uint32_t)GDS_CQE_FIELD(lo, hi, GDS_CQE_IMM_OFFSET)) : 0;
    wc->qpn = sop & 0xFFFFFF;
    wc->wqe_counter = counter;
    wc->opcode = (uint8_t)opcode;
    wc->wqe_opcode = (opcode == GDS_WC_SEND_DONE || opcode == GDS_WC_REQ_ERR) ? (uint8_t)(sop >> 24) : 0;
    wc->syndrome = err ? (uint8_t)GDS_CQE_FIELD(lo, hi, GDS_CQE_SYNDROME_OFFSET) : 0;
    wc->vendor_syndrome = err ? (uint8_t)GDS_CQE_FIELD(lo, hi, GDS_CQE_VENDOR_SYNDROME_OFFSET) : 0;
    wc->reserved = 0;
    cq->ci++;
    // Work completes in order: everything up to this WQE (one slot each) is done.
    cq->wq_ci += (uint16_t)(counter + 1 - (uint16_t)cq->wq_ci);
    *(volatile uint32_t *)(cq->dbrec + 4 * GDS_DBREC_CQ_CI) = gds_bswap32((uint32_t)(cq->ci & 0xFFFFFF));
    *(volatile uint64_t *)cq->retired = cq->ci;
    *(volatile uint64_t *)cq->wq_retired = cq->wq_ci;
    return err ? (GDS_ERR_CQE | wc->syndrome) : GDS_OK;
}

// gds_cq_poll_fields with every field of wc.
__device__ __forceinline__ int gds_cq_poll(gds_cq *cq, gds_wc *wc) { return gds_cq_poll_fields(cq, wc, true); }

// Waits for the next completion: what gds_cq_poll returns, or GDS_TIMEOUT after timeout_ns.
// An error completion ends the wait as well (it never hangs on a failed QP).
__device__ __forceinline__ int gds_cq_wait(gds_cq *cq, gds_wc *wc, uint64_t timeout_ns) {
    uint64_t start = 0;
    for (uint32_t spins = 0;; spins++) {
        int rc = gds_cq_poll(cq, wc);
        if (rc != GDS_EMPTY) return rc;
        if (gds_expired(spins, &start, timeout_ns)) return GDS_TIMEOUT;
    }
}
// ---------------------------------------------------------------- a peer, with credits

// The state block: each counter is stored through after it changes (one posted write to host
// memory), for the host to read progress and the next launch to resume.
__device__ __forceinline__ volatile gds_peer_state *gds_peer_host(const gds_peer *p) {
    return (volatile gds_peer_state *)p->state;
}

// Records the channel's first error (sticky).
__device__ __forceinline__ void gds_peer_fail(gds_peer *p, int rc) {
    if (p->error == 0) gds_peer_host(p)->error = p->error = (uint32_t)rc;
}

// Flags for a WQE of the peer's send ring: those asked for, plus GDS_SIGNALED once half a ring
// of WQEs would go unsignalled. So a full ring always holds a signalled WQE whose completion
// frees it, whatever the caller signals.
__device__ __forceinline__ uint32_t gds_peer_wqe_flags(const gds_peer *p, uint32_t flags) {
    return p->qp.sq_pi + 1 - p->signaled_pi >= p->qp.sq_wqebbs / 2 ? flags | GDS_SIGNALED : flags;
}

// Call after posting a WQE with `flags` (and counting it, if a send): remembers the latest
// signalled WQE, whose completion tells exactly how many sends are done.
__device__ __forceinline__ void gds_peer_posted(gds_peer *p, uint32_t flags) {
    if (!(flags & GDS_SIGNALED)) return;
    p->signaled_pi = p->qp.sq_pi;
    p->signaled_sends = p->sends;
}

// Consumes one send completion if there is one. Work completes in order, so a completion
// (of a send, credit write or NOP) tells that every WQE before wq_ci is done: the sends among
// them are at least all but those still outstanding, and exactly signaled_sends once the
// latest signalled WQE is done. sends_done counts completed sends only. The first error is
// kept (sticky).
__device__ __forceinline__ int gds_peer_poll_send(gds_peer *p) {
    gds_wc wc;
    int rc = gds_cq_poll_fields(&p->qp.send_cq, &wc, false);  // sends carry no byte count
    if (rc == GDS_EMPTY) return rc;
    uint64_t outstanding = p->qp.sq_pi - p->qp.send_cq.wq_ci;
    uint64_t done = p->sends > outstanding ? p->sends - outstanding : 0;
    if (p->qp.send_cq.wq_ci >= p->signaled_pi && p->signaled_sends > done) done = p->signaled_sends;
    if (done > p->sends_done) gds_peer_host(p)->sends_done = p->sends_done = done;
    if (rc != GDS_OK) gds_peer_fail(p, rc);
    return rc;
}

// GDS_INVALID for an entry that is no peer (e.g. this rank's own), the channel's error once
// it failed, else GDS_OK.
__device__ __forceinline__ int gds_peer_check(const gds_peer *p) {
    if (p->credit == 0) return GDS_INVALID;
    return p->error ? (int)p->error : GDS_OK;
}

// Consumes a send completion, if one came, to free send slots or finish a send: GDS_OK to go
// on, GDS_TIMEOUT once timeout_ns passed without any (spins/start: the caller's loop), or the
// channel's error.
__device__ __forceinline__ int gds_peer_make_room(gds_peer *p, uint32_t spins, uint64_t *start, uint64_t timeout_ns) {
    if (p->error) return p->error;
    if (gds_peer_poll_send(p) == GDS_EMPTY && gds_expired(spins, start, timeout_ns)) return GDS_TIMEOUT;
    return p->error ? (int)p->error : GDS_OK;
}

// Posts a work request (opcode, laddr/lkey, len; raddr/rkey for writes and reads) on the
// peer's send ring once the ring has room (consumes send completions meanwhile), and counts
// it as a send: GDS_OK, GDS_TIMEOUT (nothing posted), or the channel's error. With
// `prepare`, only stores it (gds_qp_prepare_send).
__device__ __forceinline__ int gds_peer_post(gds_peer *p, uint32_t opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
                                             uint64_t raddr, uint32_t rkey, uint32_t flags, uint64_t timeout_ns,
                                             bool prepare = false) {
    uint64_t start = 0;
    for (uint32_t spins = 0;; spins++) {
        uint32_t f = gds_peer_wqe_flags(p, flags);
        int rc = prepare ? gds_qp_prepare_send(&p->qp, opcode, laddr, lkey, len, raddr, rkey, 0, f)
                         : gds_qp_post_send(&p->qp, opcode, laddr, lkey, len, raddr, rkey, 0, f);
        if (rc == GDS_FULL) rc = gds_peer_make_room(p, spins, &start, timeout_ns);
        else if (rc == GDS_OK && prepare) {
            // Counted now (the credit of a later send needs it); published, and remembered
            // as the latest signalled WQE if it is one, when it is rung (gds_peer_ring_send).
            ++p->sends;
            return GDS_OK;
        } else if (rc == GDS_OK) {
            gds_peer_host(p)->sends = ++p->sends;
            gds_peer_posted(p, f);
            return GDS_OK;
        }
        if (rc != GDS_OK) return rc;
    }
}

// Posts a send of `len` bytes at laddr/lkey to the peer once it has a receive posted for it
// (waits for the credit), and once the send ring has room (consumes send completions). The
// message lands in the peer's next receive. `flags`: GDS_SIGNALED or 0 (and GDS_FENCE,
// GDS_SOLICITED). An unsignalled send costs no completion to write and poll; it completes
// with the next signalled WQE, and gds_peer_wait_send finishes it with a NOP if none
// follows. GDS_TIMEOUT after timeout_ns (nothing posted), or the channel's error.
__device__ __forceinline__ int gds_peer_send_flags(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint32_t flags,
                                                   uint64_t timeout_ns, bool prepare = false) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    if (gds_qp_prepared(&p->qp)) return GDS_INVALID;  // a send is prepared: ring it first
    uint64_t start = 0;
    // The messages sent so far, puts and gets left out: each took one of the peer's receives.
    uint64_t messages = p->sends - p->one_sided;
    for (uint32_t spins = 0; p->credits < messages + 1; spins++) {
        p->credits = *(const volatile uint64_t *)p->credit;
        if (p->credits < messages + 1 && gds_expired(spins, &start, timeout_ns)) return GDS_TIMEOUT;
    }
    return gds_peer_post(p, GDS_OP_SEND, laddr, lkey, len, 0, 0, flags, timeout_ns, prepare);
}

// gds_peer_send_flags, except that the send is only prepared: its WQE stored, the peer's
// credit and the ring's room already waited for, and gds_peer_ring_send rings it once its
// `len` bytes at laddr are in place. A thread that answers messages prepares its next send
// while the peer works and rings it right after the wait (on an H200 with the soft device,
// pingpong's mp kernel loop at 8 B: 4.9 -> 4.0 us per message). The send counts as posted
// from here: ring it before waiting for it. Until it is rung, the channel posts nothing else
// on its send queue: a credit write, a put or get, a second send, and a wait for sends that
// needs a NOP (its last send unsignalled with nothing signalled rung after it, or the
// prepared send itself) fail with GDS_INVALID at once; receives may still be posted (they
// reach the NIC with the next credit write, after the ring). A send prepared and never rung
// is dropped when the kernel ends: neither the QP's nor the channel's host copies count it,
// and the next launch starts without it.
__device__ __forceinline__ int gds_peer_prepare_send(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint32_t flags,
                                                     uint64_t timeout_ns) {
    return gds_peer_send_flags(p, laddr, lkey, len, flags, timeout_ns, true);
}

// Rings the send gds_peer_prepare_send prepared: GDS_OK, GDS_INVALID if none is, or the
// channel's error (the send is then not rung).
__device__ __forceinline__ int gds_peer_ring_send(gds_peer *p) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    uint32_t f = (uint32_t)(p->qp.reserved[1] >> 8);
    rc = gds_qp_ring_prepared(&p->qp);
    if (rc != GDS_OK) return rc;
    gds_peer_host(p)->sends = p->sends;
    gds_peer_posted(p, f);
    return GDS_OK;
}

// gds_peer_send_flags with GDS_SIGNALED: every send completes on its own.
__device__ __forceinline__ int gds_peer_send(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint64_t timeout_ns) {
    return gds_peer_send_flags(p, laddr, lkey, len, GDS_SIGNALED, timeout_ns);
}

// Posts a put (GDS_OP_RDMA_WRITE) or a get (GDS_OP_RDMA_READ) of `len` bytes between
// laddr/lkey and `r` at byte `off`, once the send ring has room. No credit: the peer posts
// nothing for it. GDS_INVALID (nothing posted) when off + len lies outside `r`; GDS_TIMEOUT,
// or the channel's error, as gds_peer_send_flags.
__device__ __forceinline__ int gds_peer_one_sided(gds_peer *p, uint32_t opcode, const gds_remote *r, uint64_t off,
                                                  uint64_t laddr, uint32_t lkey, uint32_t len, uint32_t flags,
                                                  uint64_t timeout_ns) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    if (off > r->len || len > r->len - off || gds_qp_prepared(&p->qp)) return GDS_INVALID;
    rc = gds_peer_post(p, opcode, laddr, lkey, len, r->addr + off, r->rkey, flags, timeout_ns);
    if (rc == GDS_OK) gds_peer_host(p)->one_sided = ++p->one_sided;
    return rc;
}

// Writes `len` bytes at laddr/lkey into the remote buffer `r` (one rank's region of an mp
// window: Window::for_kernels) at byte `off`: an RDMA write on the peer's connection, which
// takes no credit and needs no receive at the peer. It counts as a send: it completes in
// order with the sends (gds_peer_wait_send(s) waits for it; GDS_SIGNALED or 0 as for
// gds_peer_send_flags), and the peer's own view of the bytes comes from whatever the
// peer awaits (a marker in the payload's last word, a later message). laddr may be reused
// once it completed. GDS_INVALID (nothing posted) when off + len lies outside `r`;
// GDS_TIMEOUT (the send ring stayed full), or the channel's error.
__device__ __forceinline__ int gds_peer_put_flags(gds_peer *p, const gds_remote *r, uint64_t off, uint64_t laddr,
                                                  uint32_t lkey, uint32_t len, uint32_t flags, uint64_t timeout_ns) {
    return gds_peer_one_sided(p, GDS_OP_RDMA_WRITE, r, off, laddr, lkey, len, flags, timeout_ns);
}

// gds_peer_put_flags with GDS_SIGNALED.
__device__ __forceinline__ int gds_peer_put(gds_peer *p, const gds_remote *r, uint64_t off, uint64_t laddr,
                                            uint32_t lkey, uint32_t len, uint64_t timeout_ns) {
    return gds_peer_put_flags(p, r, off, laddr, lkey, len, GDS_SIGNALED, timeout_ns);
}

// Reads `len` bytes of the remote buffer `r` at byte `off` into laddr/lkey: an RDMA read,
// signalled. Its bytes are in place once gds_peer_wait_send(s) returned it (it counts as a
// send, as gds_peer_put does). A put or send after it that must not overtake it takes
// GDS_FENCE. Codes as gds_peer_put_flags.
__device__ __forceinline__ int gds_peer_get(gds_peer *p, const gds_remote *r, uint64_t off, uint64_t laddr,
                                            uint32_t lkey, uint32_t len, uint64_t timeout_ns) {
    return gds_peer_one_sided(p, GDS_OP_RDMA_READ, r, off, laddr, lkey, len, GDS_SIGNALED, timeout_ns);
}

// Posts a receive of up to `len` bytes into laddr/lkey for the peer's next send, without a
// credit: the peer cannot use it before gds_peer_give_credit. GDS_FULL when the receive ring
// is full (wait for receives first). The WQE is only stored: the next credit write publishes
// it to the NIC (one fence for every receive it covers and the write), before the peer can
// send into it.
__device__ __forceinline__ int gds_peer_post_recv(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    rc = gds_qp_stage_recv(&p->qp, laddr, len, lkey);
    if (rc != GDS_OK) return rc;
    gds_peer_host(p)->recvs = ++p->recvs;
    return GDS_OK;
}

// Gives the peer credit for every receive posted so far: one inline RDMA write of the receive
// count into its credit word, however many receives it covers (nothing if none was posted
// since the last credit). The receives go to the NIC first: the write's fence publishes
// their WQEs with its own, and the receive counter is stored before the write's doorbell.
// GDS_TIMEOUT if the send ring stayed full for timeout_ns (nothing written: call again), or
// the channel's error.
__device__ __forceinline__ int gds_peer_give_credit(gds_peer *p, uint64_t timeout_ns) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK || p->credited == p->recvs) return rc;
    if (gds_qp_prepared(&p->qp)) return GDS_INVALID;  // a send is prepared: ring it first
    uint64_t start = 0;
    for (uint32_t spins = 0;; spins++) {
        uint32_t f = gds_peer_wqe_flags(p, 0) | GDS_RING_RECV;
        rc = gds_qp_post_send_inline(&p->qp, GDS_OP_RDMA_WRITE, &p->recvs, 8, p->remote_credit, p->remote_credit_rkey, 0, f);
        if (rc == GDS_FULL) rc = gds_peer_make_room(p, spins, &start, timeout_ns);
        else if (rc == GDS_OK) {
            p->credited = p->recvs;
            gds_peer_posted(p, f);
            return GDS_OK;
        }
        if (rc != GDS_OK) return rc;
    }
}

// gds_peer_post_recv then gds_peer_give_credit: a receive with its own credit. GDS_FULL as
// gds_peer_post_recv; GDS_TIMEOUT as gds_peer_give_credit (the receive is then posted, and
// the next credit covers it).
__device__ __forceinline__ int gds_peer_recv(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint64_t timeout_ns) {
    int rc = gds_peer_post_recv(p, laddr, lkey, len);
    return rc != GDS_OK ? rc : gds_peer_give_credit(p, timeout_ns);
}

// Waits until the first `target` sends (target <= sends) completed, consuming completions;
// if the last of them is unsignalled and no signalled WQE follows it, posts a signalled NOP
// (its completion tells that the sends before it completed). GDS_OK, GDS_TIMEOUT, or the
// channel's error (a failed send, or any earlier failure).
__device__ __forceinline__ int gds_peer_wait_done(gds_peer *p, uint64_t target, uint64_t timeout_ns) {
    uint64_t start = 0;
    for (uint32_t spins = 0; p->sends_done < target; spins++) {
        if (p->signaled_sends < target && p->error == 0) {
            int rc = gds_qp_post_nop(&p->qp, GDS_SIGNALED);
            if (rc == GDS_OK) gds_peer_posted(p, GDS_SIGNALED);
            else if (rc != GDS_FULL) return rc;
        }
        int rc = gds_peer_make_room(p, spins, &start, timeout_ns);
        if (rc != GDS_OK) return rc;
    }
    return p->error ? (int)p->error : GDS_OK;
}

// Waits until the next n sends not yet waited for (1 <= n <= sends - sends_waited) completed
// (gds_peer_wait_done: a NOP finishes a trailing unsignalled send). GDS_INVALID for a bad n;
// GDS_TIMEOUT; or the channel's error (a failed send, or any earlier failure).
__device__ __forceinline__ int gds_peer_wait_sends(gds_peer *p, uint64_t n, uint64_t timeout_ns) {
    if (p->credit == 0 || n == 0 || n > p->sends - p->sends_waited) return GDS_INVALID;
    uint64_t target = p->sends_waited + n;
    int rc = gds_peer_wait_done(p, target, timeout_ns);
    if (rc != GDS_OK) return rc;
    gds_peer_host(p)->sends_waited = p->sends_waited = target;
    return GDS_OK;
}

// Waits for the oldest send not yet waited for to complete: gds_peer_wait_sends(p, 1, ..).
// GDS_INVALID if every send was waited for.
__device__ __forceinline__ int gds_peer_wait_send(gds_peer *p, uint64_t timeout_ns) {
    return gds_peer_wait_sends(p, 1, timeout_ns);
}

// Waits for the oldest receive not yet waited for; *len gets the bytes received (len may be
// null: the wait then skips reading the byte count, one read across PCIe less).
// GDS_INVALID if every receive was waited for; GDS_TIMEOUT; or the channel's error (e.g. a
// message longer than the receive: GDS_ERR_CQE | 0x01).
__device__ __forceinline__ int gds_peer_wait_recv(gds_peer *p, uint32_t *len, uint64_t timeout_ns) {
    if (p->credit == 0 || p->recvs_waited == p->recvs) return GDS_INVALID;
    if (p->error) return p->error;
    gds_wc wc;
    uint64_t start = 0;
    int rc;
    for (uint32_t spins = 0;; spins++) {
        rc = gds_cq_poll_fields(&p->qp.recv_cq, &wc, len != nullptr);
        if (rc != GDS_EMPTY) break;
        if (gds_expired(spins, &start, timeout_ns)) return GDS_TIMEOUT;
    }
    if (rc != GDS_OK) {
        gds_peer_fail(p, rc);
        return rc;
    }
    gds_peer_host(p)->recvs_waited = ++p->recvs_waited;
    if (len) *len = wc.byte_len;
    return GDS_OK;
}
// ---------------------------------------------------------------- a staged peer
//
// Where the NIC cannot reach GPU memory (the soft device; an mlx5 device without dma-buf or
// peer memory), a staged channel (mp: Comm::kernel_channels_staged) moves payloads through
// its pinned host bounces: a send copies the payload from GPU memory into the bounce of the
// next send, then sends the bounce; a receive lands in the bounce of its number and is copied
// out after its wait. The thread that drives the peer calls the functions below; the copies
// may take every thread of a block (gds_block_copy_out before the send, gds_block_copy_in
// after the wait; thread 0 shares the bounce's address with gds_block_share), or the driving
// thread alone (gds_peer_send_staged,
// gds_peer_wait_recv_staged). Staged and direct sends and receives may be mixed on one channel.

// Whether the channel has bounces (a descriptor from Comm::kernel_channels_staged).
__device__ __forceinline__ bool gds_peer_staged(const gds_peer *p) {
    return p->slot_bytes != 0 && p->send_slots != 0 && p->recv_slots != 0;
}

// Slot `n` of a ring of `slots` bounces of slot_bytes at `base`.
__device__ __forceinline__ uint64_t gds_peer_slot(const gds_peer *p, uint64_t base, uint64_t n, uint32_t slots) {
    return base + (n % slots) * (uint64_t)p->slot_bytes;
}

// The bounce of the next send (*bounce: its GPUs' address, slot_bytes long), once the send
// that used it before has completed (consumes completions; if that send is unsignalled with no
// signalled WQE after it, posts a signalled NOP). Copy the payload into it, then send it with
// gds_peer_send_bounce. Calling it again before that send returns the same bounce at once.
// GDS_INVALID for an entry that is no peer or a channel without bounces; GDS_TIMEOUT (the
// previous send did not complete within timeout_ns); or the channel's error.
__device__ __forceinline__ int gds_peer_next_send_bounce(gds_peer *p, uint64_t *bounce, uint64_t timeout_ns) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    if (!gds_peer_staged(p)) return GDS_INVALID;
    if (p->sends >= p->send_slots) {
        rc = gds_peer_wait_done(p, p->sends - p->send_slots + 1, timeout_ns);
        if (rc != GDS_OK) return rc;
    }
    *bounce = gds_peer_slot(p, p->send_bounce, p->sends, p->send_slots);
    return GDS_OK;
}

// Sends the first `len` bytes of the bounce gds_peer_next_send_bounce returned (copied into
// it by this thread, or by its block before a gds_block_copy_out returned), as gds_peer_send_flags
// does (waits for a credit; `flags` GDS_SIGNALED or 0). GDS_INVALID when len > slot_bytes, the
// channel has no bounces, or the bounce was not taken with gds_peer_next_send_bounce (its
// previous send not known complete); GDS_TIMEOUT (nothing sent: call again, the bounce keeps
// its bytes); or the channel's error.
__device__ __forceinline__ int gds_peer_send_bounce(gds_peer *p, uint32_t len, uint32_t flags, uint64_t timeout_ns) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    if (!gds_peer_staged(p) || len > p->slot_bytes || p->sends_done + p->send_slots <= p->sends) return GDS_INVALID;
    uint64_t at = gds_peer_slot(p, p->send_bounce_nic, p->sends, p->send_slots);
    return gds_peer_send_flags(p, at, p->send_bounce_lkey, len, flags, timeout_ns);
}

// Puts the first `len` bytes of the bounce gds_peer_next_send_bounce returned into `r` at
// byte `off`, as gds_peer_put_flags does (no credit; waited for as a send): a staged put,
// for a payload in GPU memory the NIC cannot reach. GDS_INVALID as gds_peer_send_bounce, or
// when off + len lies outside `r`; otherwise the codes of gds_peer_put_flags.
__device__ __forceinline__ int gds_peer_put_bounce(gds_peer *p, const gds_remote *r, uint64_t off, uint32_t len,
                                                   uint32_t flags, uint64_t timeout_ns) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    if (!gds_peer_staged(p) || len > p->slot_bytes || p->sends_done + p->send_slots <= p->sends) return GDS_INVALID;
    uint64_t at = gds_peer_slot(p, p->send_bounce_nic, p->sends, p->send_slots);
    return gds_peer_put_flags(p, r, off, at, p->send_bounce_lkey, len, flags, timeout_ns);
}

// One thread's staged send: takes the next send bounce, copies len bytes from src (GPU
// memory, or any memory this thread reads) into it and sends it. GDS_INVALID when len >
// slot_bytes (nothing waited for or sent); otherwise the codes of gds_peer_next_send_bounce
// and gds_peer_send_bounce. src may be reused when it returns.
__device__ __forceinline__ int gds_peer_send_staged(gds_peer *p, uint64_t src, uint32_t len, uint32_t flags,
                                                    uint64_t timeout_ns) {
    if (len > p->slot_bytes) return GDS_INVALID;
    uint64_t bounce = 0;
    int rc = gds_peer_next_send_bounce(p, &bounce, timeout_ns);
    if (rc != GDS_OK) return rc;
    gds_copy_part(bounce, src, len, 0, 1);
    return gds_peer_send_bounce(p, len, flags, timeout_ns);
}

// Posts the next receive, of up to len bytes (len <= slot_bytes), into the bounce of its
// number, without a credit (gds_peer_give_credit; gds_peer_recv_staged gives one). The slot is
// free once the receive that used it before was waited for: GDS_FULL while recv_slots
// receives are posted and not waited for (wait for one first); GDS_INVALID for len >
// slot_bytes or a channel without bounces; or the channel's error.
__device__ __forceinline__ int gds_peer_post_recv_staged(gds_peer *p, uint32_t len) {
    int rc = gds_peer_check(p);
    if (rc != GDS_OK) return rc;
    if (!gds_peer_staged(p) || len > p->slot_bytes) return GDS_INVALID;
    if (p->recvs - p->recvs_waited >= p->recv_slots) return GDS_FULL;
    return gds_peer_post_recv(p, gds_peer_slot(p, p->recv_bounce_nic, p->recvs, p->recv_slots), p->recv_bounce_lkey, len);
}

// gds_peer_post_recv_staged then gds_peer_give_credit (codes as gds_peer_recv).
__device__ __forceinline__ int gds_peer_recv_staged(gds_peer *p, uint32_t len, uint64_t timeout_ns) {
    int rc = gds_peer_post_recv_staged(p, len);
    return rc != GDS_OK ? rc : gds_peer_give_credit(p, timeout_ns);
}

// The GPUs' address of the bounce that holds the message of the latest receive
// gds_peer_wait_recv returned (0 if none yet or the channel has no bounces): copy it out
// (gds_block_copy_in, gds_copy_part). Its bytes stay until a receive is posted into that slot
// again: the recv_slots-th receive posted after it.
__device__ __forceinline__ uint64_t gds_peer_recv_bounce(const gds_peer *p) {
    if (!gds_peer_staged(p) || p->recvs_waited == 0) return 0;
    return gds_peer_slot(p, p->recv_bounce, p->recvs_waited - 1, p->recv_slots);
}

// One thread's staged receive: waits for the oldest receive not yet waited for (a staged one),
// then copies its message out of the bounce into dst (GPU memory, or any memory this thread
// writes), which has room for cap bytes; *len (may be null) gets its length. GDS_INVALID for
// a channel without bounces, or a message longer than cap (then nothing is copied; the
// receive counts as waited for, *len tells its length and gds_peer_recv_bounce where it is);
// otherwise the codes of gds_peer_wait_recv.
__device__ __forceinline__ int gds_peer_wait_recv_staged(gds_peer *p, uint64_t dst, uint32_t cap, uint32_t *len,
                                                         uint64_t timeout_ns) {
    if (!gds_peer_staged(p)) return GDS_INVALID;
    uint32_t n = 0;
    int rc = gds_peer_wait_recv(p, &n, timeout_ns);
    if (rc != GDS_OK) return rc;
    if (len) *len = n;
    if (n > cap) return GDS_INVALID;
    gds_copy_part(dst, gds_peer_recv_bounce(p), n, 0, 1);
    return GDS_OK;
}
#endif
