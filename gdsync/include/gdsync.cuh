// gdsync.cuh: kernel-side GPUDirect Async for gdsync (Rust). Descriptors are filled by the
// host (gdsync::kernel); a kernel rings doorbells and waits for completions with them.
// The layouts below mirror the Rust #[repr(C)] types; the static_asserts are checked against
// the Rust offsets by a test, and hold when NVRTC compiles this header.
#pragma once
#ifdef __CUDACC_RTC__
typedef unsigned long long uint64_t;
typedef unsigned int uint32_t;
typedef int int32_t;
#else
#include <stdint.h>
#include <stddef.h>
#endif
#ifndef __CUDACC__
#define __align__(n) alignas(n)
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

#define GDS_COND_GEQ 0
#define GDS_COND_EQ 1
#define GDS_COND_AND 2
#define GDS_COND_NOR 3

#define GDS_DESC_SEND 1
#define GDS_DESC_WAIT 2

// Ring a QP's doorbell: store the doorbell record, fence, store the 8-byte doorbell.
struct gds_send_desc {
    uint64_t dbrec;        // address of the send doorbell-record word (BE32 counter)
    uint64_t db;           // address of the doorbell register
    uint64_t db_value;     // the 8 doorbell bytes, as a native 64-bit store writes them
    uint32_t dbrec_value;  // the doorbell-record word, as a native 32-bit store writes it
    uint32_t reserved;
};
static_assert(sizeof(gds_send_desc) == 32, "gds_send_desc size");
GDS_OFFSET_CHECK(gds_send_desc, dbrec, 0);
GDS_OFFSET_CHECK(gds_send_desc, db, 8);
GDS_OFFSET_CHECK(gds_send_desc, db_value, 16);
GDS_OFFSET_CHECK(gds_send_desc, dbrec_value, 24);

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

#ifdef __CUDACC__
__device__ __forceinline__ uint64_t gds_now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

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

// Waits until the 32-bit word at addr satisfies cond; GDS_TIMEOUT after timeout_ns.
__device__ __forceinline__ int gds_wait_value32(uint64_t addr, uint32_t value, uint32_t cond, uint64_t timeout_ns) {
    const volatile uint32_t *w = (const volatile uint32_t *)addr;
    uint64_t start = 0;
    for (uint32_t spins = 0;; spins++) {
        if (gds_test32(*w, value, cond)) {
            __threadfence_system();
            return GDS_OK;
        }
        if ((spins & 255) == 255) {
            uint64_t now = gds_now_ns();
            if (start == 0) start = now;
            else if (now - start > timeout_ns) return GDS_TIMEOUT;
        }
    }
}

// Rings the doorbell a send descriptor describes. The first fence makes data this kernel
// wrote earlier visible before the doorbell record; the second orders the record before the
// doorbell (the NIC reads the record when the doorbell rings).
__device__ __forceinline__ int gds_send(const gds_send_desc *d) {
    if (d->dbrec == 0 || d->db == 0) return GDS_INVALID;
    __threadfence_system();
    *(volatile uint32_t *)d->dbrec = d->dbrec_value;
    __threadfence_system();
    *(volatile uint64_t *)d->db = d->db_value;
    return GDS_OK;
}

// Waits for the completion a wait descriptor describes (an error completion passes too: the
// host reports it), then retires it. GDS_TIMEOUT after timeout_ns.
__device__ __forceinline__ int gds_wait(const gds_wait_desc *d, uint64_t timeout_ns) {
    int r = gds_wait_value32(d->word, d->value, d->cond, timeout_ns);
    if (r != GDS_OK) return r;
    if (d->ci_rec) *(volatile uint32_t *)d->ci_rec = d->ci_value;
    if (d->retired) *(volatile uint64_t *)d->retired = d->retired_value;
    if (d->ring_retired) *(volatile uint64_t *)d->ring_retired = d->ring_retired_value;
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
        if ((spins & 255) == 255) {
            uint64_t now = gds_now_ns();
            if (start == 0) start = now;
            else if (now - start > timeout_ns) return 0;
        }
    }
}

// Tells the host entries up to `index` (inclusive) were used, so their slots can be refilled.
__device__ __forceinline__ void gds_ring_release(const gds_desc_ring *r, uint64_t index) {
    __threadfence();  // the entries' loads are done before the slots are handed back
    *(volatile uint64_t *)r->consumed = index + 1;
}

// Copies entry `index` out of the ring (so it can be fetched ahead of its use) and releases
// its slot. GDS_TIMEOUT if the host did not fill it in time.
__device__ __forceinline__ int gds_ring_fetch(const gds_desc_ring *r, uint64_t index, gds_desc *out, uint64_t timeout_ns) {
    const gds_desc *d = gds_ring_get(r, index, timeout_ns);
    if (!d) return GDS_TIMEOUT;
    // Five independent 16-byte loads that bypass stale cache lines (__ldcv): they overlap,
    // where volatile 8-byte loads would cross PCIe one after another.
    const ulonglong2 *src = (const ulonglong2 *)d;
    ulonglong2 *dst = (ulonglong2 *)out;
    ulonglong2 v0 = __ldcv(src + 0), v1 = __ldcv(src + 1), v2 = __ldcv(src + 2), v3 = __ldcv(src + 3), v4 = __ldcv(src + 4);
    dst[0] = v0; dst[1] = v1; dst[2] = v2; dst[3] = v3; dst[4] = v4;
    gds_ring_release(r, index);
    return GDS_OK;
}

// Runs entry `index`: a send or a wait. Returns GDS_OK, GDS_TIMEOUT or GDS_INVALID.
__device__ __forceinline__ int gds_ring_run(const gds_desc_ring *r, uint64_t index, uint64_t timeout_ns) {
    gds_desc d;
    int rc = gds_ring_fetch(r, index, &d, timeout_ns);
    return rc != GDS_OK ? rc : gds_run(&d, timeout_ns);
}
#endif
