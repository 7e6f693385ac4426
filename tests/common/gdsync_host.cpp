// gdsync.cuh compiled for the host: stand-ins for the CUDA built-ins it uses, then the header
// itself, then extern "C" wrappers of its descriptor, kernel-driven QP and peer (also staged) functions, which the tests
// (tests/common/gds.rs) load and call from a thread that plays the kernel. So the soft device
// executes the very bytes the header writes.
//
// Stand-ins: __threadfence_system and __threadfence are full fences; volatile accesses stay
// volatile (x86 keeps their order); the acquire loads are acquire loads; gds_now_ns reads the
// monotonic clock and yields the thread first (it is read every 256 spins of a wait), to
// share a loaded test machine's cores.
#include <stdint.h>
#include <sched.h>
#include <time.h>

#define GDS_HOST 1
#define __device__
#define __forceinline__ inline __attribute__((always_inline))

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) ulonglong2 {
    unsigned long long x, y;
};

static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// A 16-byte load that bypasses stale cache lines: two volatile 8-byte loads.
static inline ulonglong2 __ldcv(const ulonglong2 *p) {
    const volatile unsigned long long *q = (const volatile unsigned long long *)p;
    return ulonglong2{q[0], q[1]};
}

static inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// Byte s[i] of the result is byte (selector nibble i) of the 8 bytes {y, x}.
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (((s >> (4 * i)) & 7) * 8)) & 0xFF) << (8 * i);
    return r;
}

static inline uint64_t gds_now_ns() {
    sched_yield();
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static inline uint32_t gds_ld_acquire32(uint64_t addr) { return __atomic_load_n((const uint32_t *)addr, __ATOMIC_ACQUIRE); }
static inline uint64_t gds_ld_acquire64(uint64_t addr) { return __atomic_load_n((const uint64_t *)addr, __ATOMIC_ACQUIRE); }
static inline void gds_st_release64(uint64_t addr, uint64_t v) { __atomic_store_n((uint64_t *)addr, v, __ATOMIC_RELEASE); }

#include "gdsync.cuh"

static_assert(sizeof(gds_wc) == 20, "gds_wc size (tests/common/gds.rs Wc)");
static_assert(offsetof(gds_wc, wqe_counter) == 12 && offsetof(gds_wc, opcode) == 14 &&
                  offsetof(gds_wc, syndrome) == 16 && offsetof(gds_wc, vendor_syndrome) == 17,
              "gds_wc layout (tests/common/gds.rs Wc)");

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int gdst_send(const gds_send_desc *d) { return gds_send(d); }
EXPORT int gdst_wait(const gds_wait_desc *d, uint64_t timeout_ns) { return gds_wait(d, timeout_ns); }
EXPORT int gdst_ring_fetch_n(const gds_desc_ring *r, uint64_t index, uint32_t n, gds_desc *out, uint64_t timeout_ns) {
    return gds_ring_fetch_n(r, index, n, out, timeout_ns);
}
EXPORT uint32_t gdst_qp_send_room(const gds_qp *qp) { return gds_qp_send_room(qp); }
EXPORT int gdst_qp_post_send(gds_qp *qp, uint32_t opcode, uint64_t laddr, uint32_t lkey, uint32_t len, uint64_t raddr,
                             uint32_t rkey, uint32_t imm, uint32_t flags) {
    return gds_qp_post_send(qp, opcode, laddr, lkey, len, raddr, rkey, imm, flags);
}
EXPORT int gdst_qp_post_send_inline(gds_qp *qp, uint32_t opcode, const void *data, uint32_t len, uint64_t raddr,
                                    uint32_t rkey, uint32_t imm, uint32_t flags) {
    return gds_qp_post_send_inline(qp, opcode, data, len, raddr, rkey, imm, flags);
}
EXPORT int gdst_qp_post_nop(gds_qp *qp, uint32_t flags) { return gds_qp_post_nop(qp, flags); }
EXPORT int gdst_qp_post_recv(gds_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey) {
    return gds_qp_post_recv(qp, addr, len, lkey);
}
EXPORT int gdst_cq_poll(gds_cq *cq, gds_wc *wc) { return gds_cq_poll(cq, wc); }
EXPORT int gdst_cq_wait(gds_cq *cq, gds_wc *wc, uint64_t timeout_ns) { return gds_cq_wait(cq, wc, timeout_ns); }
EXPORT int gdst_peer_send(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint64_t timeout_ns) {
    return gds_peer_send(p, laddr, lkey, len, timeout_ns);
}
EXPORT int gdst_peer_send_flags(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint32_t flags,
                                uint64_t timeout_ns) {
    return gds_peer_send_flags(p, laddr, lkey, len, flags, timeout_ns);
}
EXPORT int gdst_peer_prepare_send(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint32_t flags,
                                  uint64_t timeout_ns) {
    return gds_peer_prepare_send(p, laddr, lkey, len, flags, timeout_ns);
}
EXPORT int gdst_peer_ring_send(gds_peer *p) { return gds_peer_ring_send(p); }
EXPORT int gdst_peer_post_recv(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len) {
    return gds_peer_post_recv(p, laddr, lkey, len);
}
EXPORT int gdst_peer_give_credit(gds_peer *p, uint64_t timeout_ns) { return gds_peer_give_credit(p, timeout_ns); }
EXPORT int gdst_peer_recv(gds_peer *p, uint64_t laddr, uint32_t lkey, uint32_t len, uint64_t timeout_ns) {
    return gds_peer_recv(p, laddr, lkey, len, timeout_ns);
}
EXPORT int gdst_peer_wait_sends(gds_peer *p, uint64_t n, uint64_t timeout_ns) {
    return gds_peer_wait_sends(p, n, timeout_ns);
}
EXPORT int gdst_peer_wait_send(gds_peer *p, uint64_t timeout_ns) { return gds_peer_wait_send(p, timeout_ns); }
EXPORT int gdst_peer_wait_recv(gds_peer *p, uint32_t *len, uint64_t timeout_ns) {
    return gds_peer_wait_recv(p, len, timeout_ns);
}
EXPORT void gdst_copy_part(uint64_t dst, uint64_t src, uint64_t len, uint32_t part, uint32_t parts) {
    gds_copy_part(dst, src, len, part, parts);
}
EXPORT int gdst_peer_next_send_bounce(gds_peer *p, uint64_t *bounce, uint64_t timeout_ns) {
    return gds_peer_next_send_bounce(p, bounce, timeout_ns);
}
EXPORT int gdst_peer_send_bounce(gds_peer *p, uint32_t len, uint32_t flags, uint64_t timeout_ns) {
    return gds_peer_send_bounce(p, len, flags, timeout_ns);
}
EXPORT int gdst_peer_send_staged(gds_peer *p, uint64_t src, uint32_t len, uint32_t flags, uint64_t timeout_ns) {
    return gds_peer_send_staged(p, src, len, flags, timeout_ns);
}
EXPORT int gdst_peer_post_recv_staged(gds_peer *p, uint32_t len) { return gds_peer_post_recv_staged(p, len); }
EXPORT int gdst_peer_recv_staged(gds_peer *p, uint32_t len, uint64_t timeout_ns) {
    return gds_peer_recv_staged(p, len, timeout_ns);
}
EXPORT uint64_t gdst_peer_recv_bounce(const gds_peer *p) { return gds_peer_recv_bounce(p); }
EXPORT int gdst_peer_wait_recv_staged(gds_peer *p, uint64_t dst, uint32_t cap, uint32_t *len, uint64_t timeout_ns) {
    return gds_peer_wait_recv_staged(p, dst, cap, len, timeout_ns);
}
EXPORT int gdst_peer_put_flags(gds_peer *p, const gds_remote *r, uint64_t off, uint64_t laddr, uint32_t lkey,
                               uint32_t len, uint32_t flags, uint64_t timeout_ns) {
    return gds_peer_put_flags(p, r, off, laddr, lkey, len, flags, timeout_ns);
}
EXPORT int gdst_peer_get(gds_peer *p, const gds_remote *r, uint64_t off, uint64_t laddr, uint32_t lkey, uint32_t len,
                         uint64_t timeout_ns) {
    return gds_peer_get(p, r, off, laddr, lkey, len, timeout_ns);
}
EXPORT int gdst_peer_put_bounce(gds_peer *p, const gds_remote *r, uint64_t off, uint32_t len, uint32_t flags,
                                uint64_t timeout_ns) {
    return gds_peer_put_bounce(p, r, off, len, flags, timeout_ns);
}
