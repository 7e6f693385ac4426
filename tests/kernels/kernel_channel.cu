// Kernels of tests/gpu_kernel_channel.rs (NVRTC compiles them after gdsync.cuh);
// tests/kernel_channel.rs checks that they compile, with clang, where no GPU is.
#define TEST_MAX 128
#define TEST_SLOTS 8

__device__ __forceinline__ uint32_t test_len(uint64_t i) { return 1 + (uint32_t)((i * 37) % TEST_MAX); }
__device__ __forceinline__ uint8_t test_byte(uint64_t i, uint32_t side, uint32_t k) {
    return (uint8_t)((uint8_t)(i * 13) ^ (uint8_t)(k * 7) ^ (uint8_t)side);
}
// Message i of `side` (plain stores: the post's fence publishes them to the NIC).
__device__ void test_fill(uint64_t buf, uint64_t i, uint32_t side) {
    uint8_t *b = (uint8_t *)buf;
    for (uint32_t k = 0; k < test_len(i); k++) b[k] = test_byte(i, side, k);
}
// Bytes of message i that differ. Volatile loads: the NIC wrote the buffer behind this SM's
// L1, which does not see such writes.
__device__ uint32_t test_check(uint64_t buf, uint64_t i, uint32_t side) {
    const volatile uint8_t *b = (const volatile uint8_t *)buf;
    uint32_t bad = 0;
    for (uint32_t k = 0; k < test_len(i); k++) bad += b[k] != test_byte(i, side, k);
    return bad;
}
__device__ void test_report(uint64_t out, int rc, uint32_t bad, uint64_t done, int extra) {
    volatile uint64_t *o = (volatile uint64_t *)out;
    o[0] = (uint32_t)rc;
    o[1] = bad;
    o[2] = done;
    o[3] = (uint32_t)extra;
    __threadfence_system();
}

// ------------------------------------------------------------ QPs driven directly

__device__ int qp_send(gds_qp *q, uint64_t at, uint32_t lkey, uint64_t i, uint32_t me, uint64_t timeout_ns) {
    test_fill(at, i, me);
    int rc = gds_qp_post_send(q, GDS_OP_SEND, at, lkey, test_len(i), 0, 0, 0, GDS_SIGNALED);
    if (rc != GDS_OK) return rc;
    gds_wc wc;
    return gds_cq_wait(&q->send_cq, &wc, timeout_ns);  // the source is reused next time
}

// Side `me` of the ping-pong: buf holds the send buffer, then TEST_SLOTS receive slots.
__device__ int qp_side(gds_qp *q, uint64_t buf, uint32_t lkey, uint32_t me, uint64_t iters, uint64_t timeout_ns,
                       uint32_t *bad, uint64_t *done) {
    gds_wc wc;
    int rc;
    for (uint64_t s = 0; s < TEST_SLOTS; s++)
        if ((rc = gds_qp_post_recv(q, buf + TEST_MAX * (1 + s), TEST_MAX, lkey)) != GDS_OK) return rc;
    for (uint64_t i = 0; i < iters; i++) {
        *done = i;
        if (me == 0 && (rc = qp_send(q, buf, lkey, i, me, timeout_ns)) != GDS_OK) return rc;
        if ((rc = gds_cq_wait(&q->recv_cq, &wc, timeout_ns)) != GDS_OK) return rc;
        uint64_t slot = buf + TEST_MAX * (1 + i % TEST_SLOTS);
        *bad += (wc.byte_len != test_len(i)) + test_check(slot, i, me ^ 1);
        if ((rc = gds_qp_post_recv(q, slot, TEST_MAX, lkey)) != GDS_OK) return rc;
        if (me == 1 && (rc = qp_send(q, buf, lkey, i, me, timeout_ns)) != GDS_OK) return rc;
    }
    *done = iters;
    return GDS_OK;
}

// Two blocks of one thread: block 0 drives QP a and starts, block 1 drives b and answers.
extern "C" __global__ void qp_pingpong(gds_qp a, gds_qp b, uint64_t abuf, uint32_t alkey, uint64_t bbuf,
                                       uint32_t blkey, uint64_t iters, uint64_t timeout_ns, uint64_t out) {
    uint32_t me = blockIdx.x;
    gds_qp q = me == 0 ? a : b;
    uint32_t bad = 0;
    uint64_t done = 0;
    int rc = qp_side(&q, me == 0 ? abuf : bbuf, me == 0 ? alkey : blkey, me, iters, timeout_ns, &bad, &done);
    test_report(out + 32 * me, rc, bad, done, 0);
}

// A wait with nothing coming, then an RDMA write that fails (bad rkey or lkey), then a send
// on the failed QP.
extern "C" __global__ void qp_errors(gds_qp q0, uint64_t buf, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t out) {
    gds_qp q = q0;
    gds_wc wc;
    volatile uint64_t *o = (volatile uint64_t *)out;
    uint64_t t0 = gds_now_ns();
    o[0] = (uint32_t)gds_cq_wait(&q.recv_cq, &wc, 20000000ull);
    o[1] = gds_now_ns() - t0;
    o[2] = (uint32_t)gds_qp_post_send(&q, GDS_OP_RDMA_WRITE, buf, lkey, 64, raddr, rkey, 0, GDS_SIGNALED);
    o[3] = (uint32_t)gds_cq_wait(&q.send_cq, &wc, 10000000000ull);
    o[4] = wc.syndrome;
    o[5] = (uint32_t)gds_qp_post_send(&q, GDS_OP_SEND, buf, lkey, 8, 0, 0, 0, GDS_SIGNALED);
    o[6] = (uint32_t)gds_cq_wait(&q.send_cq, &wc, 10000000000ull);
    __threadfence_system();
}

// ------------------------------------------------------------ kernel channels (mp)

__device__ int peer_take(gds_peer *p, uint64_t at, uint64_t i, uint32_t me, uint64_t timeout_ns, uint32_t *bad) {
    uint32_t len = 0;
    int rc = gds_peer_wait_recv(p, &len, timeout_ns);
    if (rc == GDS_OK) *bad += (len != test_len(i)) + test_check(at, i, me ^ 1);
    return rc;
}

__device__ int peer_round(gds_peer *p, uint64_t buf, uint32_t lkey, uint64_t i, uint32_t me, uint64_t timeout_ns, uint32_t *bad) {
    uint64_t recv_at = buf + TEST_MAX;
    int rc = gds_peer_recv(p, recv_at, lkey, TEST_MAX, timeout_ns);
    if (rc == GDS_OK && me == 1) rc = peer_take(p, recv_at, i, me, timeout_ns, bad);
    if (rc == GDS_OK) {
        test_fill(buf, i, me);
        // One send in three signalled: the waits for the others post a NOP.
        rc = gds_peer_send_flags(p, buf, lkey, test_len(i), i % 3 == 2 ? GDS_SIGNALED : 0, timeout_ns);
    }
    if (rc == GDS_OK) rc = gds_peer_wait_send(p, timeout_ns);
    if (rc == GDS_OK && me == 0) rc = peer_take(p, recv_at, i, me, timeout_ns, bad);
    return rc;
}

// One rank's persistent kernel: ping-pongs with rank `other` through peers[other].
extern "C" __global__ void peer_pingpong(const gds_peer *peers, uint32_t me, uint32_t other, uint64_t buf, uint32_t lkey,
                                         uint64_t iters, uint64_t timeout_ns, uint64_t out) {
    gds_peer p = peers[other];
    gds_peer self = peers[me];
    int self_rc = gds_peer_send(&self, buf, lkey, 1, 1000);
    uint32_t bad = 0;
    uint64_t i = 0;
    int rc = GDS_OK;
    for (; i < iters && rc == GDS_OK; i++) rc = peer_round(&p, buf, lkey, i, me, timeout_ns, &bad);
    test_report(out, rc, bad, rc == GDS_OK ? i : i - 1, self_rc);
}

// Puts and gets from a kernel (mp windows: gds_peer_put_flags, gds_peer_get). Each round,
// rank 0 puts message i into rank 1's window (win[1]) at slot i % TEST_SLOTS, one put in three
// signalled, then sends a 1-byte notice, which takes a credit; rank 1, once the notice
// arrived, checks the put's bytes in its own window (mywin), gets test_len(i) bytes of rank
// 0's window at offset i % 64 (the host filled it with message 77 of side 0) and checks them
// once the get's wait returned, then answers with a notice. First, a put reaching past the
// peer's window is refused (out[3]).
extern "C" __global__ void peer_put_get(const gds_peer *peers, const gds_remote *win, uint32_t me, uint32_t other,
                                        uint64_t buf, uint32_t lkey, uint64_t mywin, uint64_t iters,
                                        uint64_t timeout_ns, uint64_t out) {
    gds_peer p = peers[other];
    gds_remote to = win[other];
    uint64_t src = buf, notice = buf + TEST_MAX, got = buf + 2 * TEST_MAX;
    int refused = gds_peer_put(&p, &to, to.len - 1, src, lkey, 2, timeout_ns);
    uint32_t bad = 0;
    uint64_t i = 0;
    int rc = GDS_OK;
    for (; i < iters && rc == GDS_OK; i++) {
        uint32_t len = test_len(i);
        rc = gds_peer_recv(&p, notice, lkey, TEST_MAX, timeout_ns);
        if (rc == GDS_OK && me == 0) {
            test_fill(src, i, me);
            uint32_t flags = i % 3 == 2 ? GDS_SIGNALED : 0;
            rc = gds_peer_put_flags(&p, &to, (i % TEST_SLOTS) * TEST_MAX, src, lkey, len, flags, timeout_ns);
            if (rc == GDS_OK) rc = gds_peer_send(&p, src, lkey, 1, timeout_ns);
            // The put and the notice done: src may be filled again.
            if (rc == GDS_OK) rc = gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns);
            if (rc == GDS_OK) rc = gds_peer_wait_recv(&p, nullptr, timeout_ns);
        } else if (rc == GDS_OK) {
            rc = gds_peer_wait_recv(&p, nullptr, timeout_ns);
            if (rc == GDS_OK) bad += test_check(mywin + (i % TEST_SLOTS) * TEST_MAX, i, 0);
            if (rc == GDS_OK) rc = gds_peer_get(&p, &to, i % 64, got, lkey, len, timeout_ns);
            if (rc == GDS_OK) rc = gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns);
            if (rc == GDS_OK)
                for (uint32_t k = 0; k < len; k++)
                    bad += ((const volatile uint8_t *)got)[k] != test_byte(77, 0, (uint32_t)(i % 64) + k);
            if (rc == GDS_OK) rc = gds_peer_send(&p, got, lkey, 1, timeout_ns);
            if (rc == GDS_OK) rc = gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns);
        }
    }
    test_report(out, rc, bad, rc == GDS_OK ? i : i - 1, refused);
}

// ------------------------------------------------------------ staged kernel channels (mp)
//
// Payloads in GPU memory staged through the channel's bounces by a block: thread 0 drives the
// peer, every thread fills, copies and checks. Message i is staged_len(i) bytes (up to the
// slot, which thread 0 reads from the descriptor), from sdev + staged_soff(i) and into
// rdev + staged_roff(i): odd sizes and offsets. Even messages go the block-wide way
// (gds_peer_next_send_bounce, gds_block_copy, gds_peer_send_bounce; gds_peer_wait_recv,
// gds_block_copy out of gds_peer_recv_bounce), odd ones through thread 0 alone
// (gds_peer_send_staged, gds_peer_wait_recv_staged); one send in four is signalled.

__device__ __forceinline__ uint32_t staged_len(uint64_t i, uint32_t slot) {
    return i % 50 == 7 ? slot : 1 + (uint32_t)((i * 53) % slot);
}
__device__ __forceinline__ uint64_t staged_soff(uint64_t i) { return i * 5 % 17; }
__device__ __forceinline__ uint64_t staged_roff(uint64_t i) { return i * 3 % 19; }

__device__ int staged_send(gds_peer *p, uint64_t sdev, uint64_t i, uint32_t me, uint32_t slot, uint64_t timeout_ns) {
    bool lead = threadIdx.x == 0;
    uint32_t len = staged_len(i, slot);
    uint64_t src = sdev + staged_soff(i);
    for (uint32_t k = threadIdx.x; k < len; k += blockDim.x) ((uint8_t *)src)[k] = test_byte(i, me, k);
    __syncthreads();
    uint32_t flags = i % 4 == 3 ? GDS_SIGNALED : 0;
    if (i % 2 == 1) return (int)gds_block_share(lead ? (uint32_t)gds_peer_send_staged(p, src, len, flags, timeout_ns) : 0);
    uint64_t bounce = 0;
    int rc = (int)gds_block_share(lead ? (uint32_t)gds_peer_next_send_bounce(p, &bounce, timeout_ns) : 0);
    if (rc != GDS_OK) return rc;
    gds_block_copy(gds_block_share(bounce), src, len);
    return (int)gds_block_share(lead ? (uint32_t)gds_peer_send_bounce(p, len, flags, timeout_ns) : 0);
}

__device__ int staged_take(gds_peer *p, uint64_t rdev, uint64_t i, uint32_t me, uint32_t slot, uint64_t timeout_ns,
                           uint32_t *bad) {
    bool lead = threadIdx.x == 0;
    uint64_t dst = rdev + staged_roff(i);
    uint32_t got = 0, want = staged_len(i, slot);
    int rc = GDS_OK;
    if (lead) rc = i % 2 == 1 ? gds_peer_wait_recv_staged(p, dst, slot, &got, timeout_ns) : gds_peer_wait_recv(p, &got, timeout_ns);
    rc = (int)gds_block_share((uint32_t)rc);
    if (rc != GDS_OK) return rc;
    got = (uint32_t)gds_block_share(got);
    if (i % 2 == 0) gds_block_copy(dst, gds_block_share(lead ? gds_peer_recv_bounce(p) : 0), got);
    __syncthreads();
    uint32_t wrong = lead && got != want;
    for (uint32_t k = threadIdx.x; k < want; k += blockDim.x) wrong += ((const volatile uint8_t *)dst)[k] != test_byte(i, me ^ 1, k);
    if (wrong) atomicAdd(bad, wrong);
    return GDS_OK;
}

__device__ int staged_round(gds_peer *p, uint64_t sdev, uint64_t rdev, uint64_t i, uint32_t me, uint32_t slot,
                            uint64_t timeout_ns, uint32_t *bad) {
    int rc = (int)gds_block_share(threadIdx.x == 0 ? (uint32_t)gds_peer_recv_staged(p, slot, timeout_ns) : 0);
    if (rc == GDS_OK && me == 1) rc = staged_take(p, rdev, i, me, slot, timeout_ns, bad);
    if (rc == GDS_OK) rc = staged_send(p, sdev, i, me, slot, timeout_ns);
    if (rc == GDS_OK && me == 0) rc = staged_take(p, rdev, i, me, slot, timeout_ns, bad);
    return rc;
}

// One rank's persistent kernel (one block, any number of threads): ping-pongs with rank
// `other` through its staged channel, sdev and rdev in GPU memory (slot + 32 bytes each);
// then waits for every send. Reports rc, bad bytes, rounds done and the slot size.
extern "C" __global__ void staged_pingpong(const gds_peer *peers, uint32_t me, uint32_t other, uint64_t sdev,
                                           uint64_t rdev, uint64_t iters, uint64_t timeout_ns, uint64_t out) {
    __shared__ uint32_t bad;
    gds_peer p;
    bool lead = threadIdx.x == 0;
    if (lead) {
        p = peers[other];
        bad = 0;
    }
    uint32_t slot = (uint32_t)gds_block_share(lead ? p.slot_bytes : 0);
    int rc = slot == 0 ? GDS_INVALID : GDS_OK;
    uint64_t i = 0;
    for (; i < iters && rc == GDS_OK; i++) rc = staged_round(&p, sdev, rdev, i, me, slot, timeout_ns, &bad);
    if (rc == GDS_OK && lead && p.sends > p.sends_waited) rc = gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns);
    __syncthreads();
    if (lead) test_report(out, rc, bad, rc == GDS_OK ? i : i - 1, (int)slot);
}
