// The kernels of pingpong's GPU triggers (NVRTC compiles them after gdsync.cuh;
// tests/kernel_channel.rs checks that they compile, with clang, where no GPU is).
//
// Message m of a run carries the 32-bit marker m in its last 4 bytes: rank 0 sends odd
// markers, rank 1 answers with even ones. Rank 0 stores the GPU's global timer after each
// round trip into times[i]; the host turns consecutive stamps into half round trips.

// ------------------------------------------------------------ --api gdsync --trigger kernel

// After the send of iteration i of pp, by the whole warp: fetches what comes next in the
// ring in one go (gds_ring_fetch_warp) while the message is out (the send's completion wait,
// every sig_every-th; the receive wait, rank 0's for this answer and rank 1's for the next
// message; the next send), then lane 0 waits for a signalled send's completion. The code is
// the same in every lane.
__device__ int pp_next(const gds_desc_ring *ring, uint64_t *idx, uint64_t i, uint64_t iters, uint64_t sig_every,
        int rank, int ring_waits, gds_desc *w, gds_desc *rw, gds_desc *snd, uint64_t timeout_ns) {
    bool sig = i % sig_every == sig_every - 1, more = i + 1 < iters;
    bool recv = ring_waits && (rank == 0 || more);
    gds_desc next[3];
    uint32_t n = (uint32_t)sig + (uint32_t)recv + (uint32_t)more, k = 0;
    if (n) {
        int rc = gds_ring_fetch_warp(ring, *idx, n, next, timeout_ns);
        if (rc) return rc;
        *idx += n;
    }
    if (sig) *w = next[k++];
    if (recv) *rw = next[k++];
    if (more) *snd = next[k++];
    int rc = sig && (threadIdx.x & 31) == 0 ? gds_wait(&w->wait, timeout_ns) : GDS_OK;
    return __shfl_sync(0xFFFFFFFFu, rc, 0);
}

// One rank of the pingpong, run by one warp: lane 0 stores, rings and waits; the whole warp
// fetches the descriptors (gds_ring_fetch_warp), in the order the host pushed them, as early
// as possible (before the wait that precedes their use) and together where several come at
// once (pp_next), so their transfer from host memory is off the critical path. Lane 0's
// codes are passed to the warp (__shfl_sync), so all lanes leave together.
extern "C" __global__ void pp(gds_desc_ring ring, int rank, uint64_t iters, uint64_t sig_every,
        int ring_waits, int raw, uint64_t my_word, uint64_t out_word, uint64_t times,
        uint64_t timeout_ns, uint64_t rc_addr) {
    const bool lead = (threadIdx.x & 31) == 0;
    uint64_t idx = 0;
    gds_desc snd, w, rw, first[2];
    int rc = GDS_OK;
#define LEAD(x) do { rc = __shfl_sync(0xFFFFFFFFu, lead ? (x) : GDS_OK, 0); if (rc) goto out; } while (0)
#define AWAIT() LEAD(ring_waits ? gds_wait(&rw.wait, timeout_ns) : gds_wait_value32(my_word, theirs, GDS_COND_EQ, timeout_ns))
    if (!raw && iters > 0) {
        // Rank 1's first receive wait, then the first send.
        uint32_t n = rank == 1 && ring_waits ? 2 : 1;
        rc = gds_ring_fetch_warp(&ring, idx, n, first, timeout_ns);
        if (rc) goto out;
        idx += n;
        if (n == 2) rw = first[0];
        snd = first[n - 1];
    }
    for (uint64_t i = 0; i < iters; i++) {
        uint32_t mine = (uint32_t)(2 * i + 1 + rank), theirs = (uint32_t)(2 * i + 2 - rank);
        if (rank == 1) AWAIT();
        if (raw) {
            if (lead) gds_signal32(out_word, mine);
        } else {
            if (lead) *(volatile uint32_t *)out_word = mine;
            LEAD(gds_send(&snd.send));
            rc = pp_next(&ring, &idx, i, iters, sig_every, rank, ring_waits, &w, &rw, &snd, timeout_ns);
            if (rc) goto out;
        }
        if (rank == 0) {
            AWAIT();
            if (lead) ((volatile uint64_t *)times)[i] = gds_now_ns();
        }
    }
out:
    if (lead) gds_signal32(rc_addr, rc ? 1000 + rc : 1);
#undef LEAD
#undef AWAIT
}

// pp with its payloads in GPU memory staged through pinned bounces (--mem device where the
// NIC cannot reach GPU memory): warp 0 drives the loop as pp does (lane 0 sends and waits, the
// warp fetches the descriptors together, pp_next); the block copies the message out of GPU
// memory (sdev) into the send bounce before the send (gds_block_copy_out: warp 0 alone up to
// 256 bytes), and the received message out of the receive bounce into GPU memory (rdev) after
// its wait (gds_block_copy_in). With ll (--proto ll, writes of up to GDS_LL_MAX bytes) the
// message travels as LL lines instead (gds_block_ll_pack), and every thread polls its lines of
// the receive bounce (gds_block_ll_recv): no marker wait, and no read of the bounce after it.
// Warp 0 shares each step's code with the block (pp_share), so that all threads leave
// together on an error.
__device__ int pp_share(int rc) { return (int)gds_block_share((uint32_t)rc); }

extern "C" __global__ void pp_staged(gds_desc_ring ring, int rank, uint64_t iters, uint64_t sig_every,
        int ring_waits, uint64_t my_word, uint64_t sdev, uint64_t out_bounce, uint64_t rdev,
        uint64_t in_bounce, uint64_t size, uint64_t times, uint64_t timeout_ns, uint64_t rc_addr, int ll) {
    uint64_t idx = 0;
    gds_desc snd, w, rw, first[2];
    int rc = GDS_OK;
    const bool lead = threadIdx.x == 0, warp0 = threadIdx.x < 32;
    // In warp 0: lane 0's step, its code passed to the warp (skipped after an error).
#define LEAD(x) do { if (!rc) rc = __shfl_sync(0xFFFFFFFFu, lead ? (x) : GDS_OK, 0); } while (0)
#define SHARE() do { rc = pp_share(rc); if (rc) goto out; } while (0)
#define AWAIT() LEAD(ring_waits ? gds_wait(&rw.wait, timeout_ns) : gds_wait_value32(my_word, theirs, GDS_COND_EQ, timeout_ns))
    // An LL message (--proto ll, writes only): every thread polls its lines of the receive
    // bounce and writes their data into GPU memory; no marker wait and no copy in after it.
#define RECV_LL() do { int r_ = gds_block_ll_recv(rdev, in_bounce, size, theirs, timeout_ns); if (!rc) rc = r_; SHARE(); } while (0)
    if (warp0 && iters > 0) {
        // Rank 1's first receive wait, then the first send.
        uint32_t n = rank == 1 && ring_waits ? 2 : 1;
        rc = gds_ring_fetch_warp(&ring, idx, n, first, timeout_ns);
        idx += n;
        if (n == 2) rw = first[0];
        snd = first[n - 1];
    }
    SHARE();
    for (uint64_t i = 0; i < iters; i++) {
        uint32_t mine = (uint32_t)(2 * i + 1 + rank), theirs = (uint32_t)(2 * i + 2 - rank);
        if (rank == 1) {
            if (ll) {
                RECV_LL();
            } else {
                if (warp0) AWAIT();
                SHARE();
                gds_block_copy_in(rdev, in_bounce, size);
            }
        }
        if (lead) *(volatile uint32_t *)(sdev + size - 4) = mine;
        if (size > GDS_LEAD_COPY_MAX) __syncthreads();  // the block copies the marker too
        if (ll) {
            gds_block_ll_pack(out_bounce, sdev, size, mine);
        } else {
            gds_block_copy_out(out_bounce, sdev, size);
        }
        if (warp0) {
            LEAD(gds_send(&snd.send));
            if (!rc) rc = pp_next(&ring, &idx, i, iters, sig_every, rank, ring_waits, &w, &rw, &snd, timeout_ns);
            if (rank == 0 && !ll) AWAIT();
        }
        SHARE();
        if (rank == 0) {
            if (ll) {
                RECV_LL();
            } else {
                gds_block_copy_in(rdev, in_bounce, size);
            }
            if (lead) ((volatile uint64_t *)times)[i] = gds_now_ns();
        }
    }
out:
    if (lead) gds_signal32(rc_addr, rc ? 1000 + rc : 1);
#undef LEAD
#undef SHARE
#undef AWAIT
#undef RECV_LL
}

// --api gdsync --op read: rank 0's reads of the peer's buffer (rank 1 launches nothing), run
// by one warp as pp is. Each read's descriptors are the read's WQE and the wait for its
// completion; the wait and the next read are fetched together by the warp
// (gds_ring_fetch_warp) while the read is on the wire. Lane 0 stamps the GPU's timer after
// each completion: one read's round trip per sample.
extern "C" __global__ void pp_read(gds_desc_ring ring, uint64_t iters, uint64_t times, uint64_t timeout_ns,
        uint64_t rc_addr) {
    const bool lead = (threadIdx.x & 31) == 0;
    uint64_t idx = 0;
    gds_desc next[2];  // the read's wait, then the next read
    gds_desc rd;
    int rc = GDS_OK;
#define LEAD(x) do { rc = __shfl_sync(0xFFFFFFFFu, lead ? (x) : GDS_OK, 0); if (rc) goto out; } while (0)
    if (iters > 0) {
        rc = gds_ring_fetch_warp(&ring, idx++, 1, &rd, timeout_ns);
        if (rc) goto out;
    }
    for (uint64_t i = 0; i < iters; i++) {
        LEAD(gds_send(&rd.send));
        uint32_t n = i + 1 < iters ? 2 : 1;
        rc = gds_ring_fetch_warp(&ring, idx, n, next, timeout_ns);
        if (rc) goto out;
        idx += n;
        LEAD(gds_wait(&next[0].wait, timeout_ns));
        if (lead) ((volatile uint64_t *)times)[i] = gds_now_ns();
        rd = next[1];
    }
out:
    if (lead) gds_signal32(rc_addr, rc ? 1000 + rc : 1);
#undef LEAD
}

// The GPU step of --trigger host (launched and synchronised every iteration).
extern "C" __global__ void step() {}

// ------------------------------------------------------------ --api mp --trigger kernel

// Result words (8 bytes each) of mp_pp, written when it ends, then MP_DONE set to 1.
#define MP_DONE 0
#define MP_RC 1     // GDS_OK, a GDS_* code, or MP_WRONG_LENGTH
#define MP_AT 2     // the iteration it stopped at (iters when done)
#define MP_STEP 3   // the call that failed: MP_STEP_*
#define MP_LEN 4    // bytes of the last message received
#define MP_WORDS 5
#define MP_STEP_RECV 1       // gds_peer_post_recv
#define MP_STEP_SEND 2       // gds_peer_send_flags
#define MP_STEP_WAIT_SEND 3  // gds_peer_wait_sends
#define MP_STEP_WAIT_RECV 4  // gds_peer_wait_recv
#define MP_STEP_CREDIT 5     // gds_peer_give_credit
#define MP_STEP_PUT 6        // gds_peer_put_flags
#define MP_STEP_WAIT_MARKER 7  // the wait for the peer's marker (gds_wait_value32)
#define MP_STEP_GET 8        // gds_peer_get
#define MP_WRONG_LENGTH 0x1000  // a message of another length than size arrived

// The result words, then MP_DONE.
__device__ void mp_report(uint64_t result, int rc, uint64_t at, uint32_t step, uint32_t len) {
    volatile uint64_t *res = (volatile uint64_t *)result;
    res[MP_RC] = (uint32_t)rc;
    res[MP_AT] = at;
    res[MP_STEP] = step;
    res[MP_LEN] = len;
    gds_signal64(result + 8 * MP_DONE, 1);
}

// One rank of `pingpong --api mp --trigger kernel`: the loop of pp through the rank's kernel
// channel to `peer` (peers[peer], mp::Comm::kernel_channels): receives with credits, sends,
// completions, all driven by this one thread; every wait gives up after timeout_ns and the
// kernel reports the code and where it stopped instead of spinning forever. The bookkeeping
// (completions of earlier sends, the consumed receive posted again) and the next send's
// preparation (gds_peer_prepare_send: its credit, its WQE) come right after each send, while
// the peer is busy, as pp fetches its descriptors there; after the wait the send is only rung
// (gds_peer_ring_send). As pp, it signals one send in sig_every (and the last) and waits for
// sends only after those; and it gives the peer one credit per recv_batch receives posted
// again (1 <= recv_batch <= ahead), not one each.
extern "C" __global__ void mp_pp(const gds_peer *peers, uint32_t rank, uint32_t peer, uint64_t sbuf,
        uint32_t slkey, uint64_t rbuf, uint32_t rlkey, uint32_t size, uint64_t iters, uint32_t ahead,
        uint32_t recv_batch, uint64_t sig_every, uint64_t times, uint64_t timeout_ns, uint64_t result) {
    gds_peer p = peers[peer];
    uint64_t i = 0;
    uint32_t step = 0, len = 0;
    int rc = size < 4 || recv_batch == 0 || recv_batch > ahead || sig_every == 0 ? GDS_INVALID : GDS_OK;
#define MP_CHECK(s, x) do { step = (s); rc = (x); if (rc) goto out; } while (0)
    // The byte count is read for the last message only (a wait that reads it crosses PCIe
    // twice, as pp's waits do not); a message longer than its receive fails the wait with an
    // error completion either way.
#define MP_TAKE() do { \
        bool last = i + 1 == iters; \
        MP_CHECK(MP_STEP_WAIT_RECV, gds_peer_wait_recv(&p, last ? &len : nullptr, timeout_ns)); \
        if (last && len != size) { rc = MP_WRONG_LENGTH; goto out; } \
    } while (0)
    if (rc) goto out;
    // Send k prepared: signalled one in sig_every, and the last.
#define MP_PREPARE(k) MP_CHECK(MP_STEP_SEND, gds_peer_prepare_send(&p, sbuf, slkey, size, \
        (k) % sig_every == sig_every - 1 || (k) + 1 == iters ? GDS_SIGNALED : 0, timeout_ns))
    // Receives posted ahead, with one credit: it reaches the peer long before its sends need it.
    while (p.recvs < iters && p.recvs < ahead) MP_CHECK(MP_STEP_RECV, gds_peer_post_recv(&p, rbuf, rlkey, size));
    MP_CHECK(MP_STEP_CREDIT, gds_peer_give_credit(&p, timeout_ns));
    if (iters > 0) MP_PREPARE(0);
    for (; i < iters; i++) {
        if (rank == 1) MP_TAKE();
        *(volatile uint32_t *)(sbuf + size - 4) = (uint32_t)(2 * i + 1 + rank);
        MP_CHECK(MP_STEP_SEND, gds_peer_ring_send(&p));
        // The peer now works on this message. The previous send, if signalled, completed
        // long ago (its answer came): its completion finishes the sends up to it. The receive
        // consumed last (rank 0) or just now (rank 1) is posted again, as long as iterations
        // remain that need one, and credited in batches (the peer has ahead - recv_batch
        // credits in hand, at least); the last receive's credit goes at once. Then the next
        // send is prepared (nothing else is posted until it is rung).
        if (i > 0 && (i - 1) % sig_every == sig_every - 1)
            MP_CHECK(MP_STEP_WAIT_SEND, gds_peer_wait_sends(&p, p.sends - 1 - p.sends_waited, timeout_ns));
        if ((rank == 1 || i > 0) && p.recvs < iters) {
            MP_CHECK(MP_STEP_RECV, gds_peer_post_recv(&p, rbuf, rlkey, size));
            if (p.recvs - p.credited >= recv_batch || p.recvs == iters)
                MP_CHECK(MP_STEP_CREDIT, gds_peer_give_credit(&p, timeout_ns));
        }
        if (i + 1 < iters) MP_PREPARE(i + 1);
        if (rank == 0) {
            MP_TAKE();
            ((volatile uint64_t *)times)[i] = gds_now_ns();
        }
    }
    // The sends not waited for yet; the last one is signalled.
    if (p.sends > p.sends_waited) MP_CHECK(MP_STEP_WAIT_SEND, gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns));
out:
    mp_report(result, rc, i, step, len);
#undef MP_CHECK
#undef MP_TAKE
#undef MP_PREPARE
}

// One rank of `pingpong --api mp --op write --trigger kernel`: pp's write loop through the
// rank's kernel channel to `peer`: each message is put into the peer's window (win[peer]:
// its receive buffer, mp::Window::for_kernels) with gds_peer_put_flags, and the answer is
// awaited by its marker in this rank's receive buffer (rbuf), as pp awaits it. No receives
// and no credits: a put takes none. One put in sig_every (and the last) signalled, its
// completion waited for one iteration later, as mp_pp does with its sends. Results as mp_pp's.
extern "C" __global__ void mp_pp_put(const gds_peer *peers, const gds_remote *win, uint32_t rank, uint32_t peer,
        uint64_t sbuf, uint32_t slkey, uint64_t rbuf, uint32_t size, uint64_t iters, uint64_t sig_every,
        uint64_t times, uint64_t timeout_ns, uint64_t result) {
    gds_peer p = peers[peer];
    gds_remote to = win[peer];  // one read across PCIe, not one per put
    uint64_t i = 0, word = rbuf + size - 4;
    uint32_t step = 0;
    int rc = size < 4 || sig_every == 0 ? GDS_INVALID : GDS_OK;
#define MP_CHECK(s, x) do { step = (s); rc = (x); if (rc) goto out; } while (0)
    if (rc) goto out;
    for (; i < iters; i++) {
        uint32_t mine = (uint32_t)(2 * i + 1 + rank), theirs = (uint32_t)(2 * i + 2 - rank);
        if (rank == 1) MP_CHECK(MP_STEP_WAIT_MARKER, gds_wait_value32(word, theirs, GDS_COND_EQ, timeout_ns));
        *(volatile uint32_t *)(sbuf + size - 4) = mine;
        bool signaled = i % sig_every == sig_every - 1 || i + 1 == iters;
        MP_CHECK(MP_STEP_PUT, gds_peer_put_flags(&p, &to, 0, sbuf, slkey, size, signaled ? GDS_SIGNALED : 0, timeout_ns));
        if (i > 0 && (i - 1) % sig_every == sig_every - 1)
            MP_CHECK(MP_STEP_WAIT_SEND, gds_peer_wait_sends(&p, p.sends - 1 - p.sends_waited, timeout_ns));
        if (rank == 0) {
            MP_CHECK(MP_STEP_WAIT_MARKER, gds_wait_value32(word, theirs, GDS_COND_EQ, timeout_ns));
            ((volatile uint64_t *)times)[i] = gds_now_ns();
        }
    }
    if (p.sends > p.sends_waited) MP_CHECK(MP_STEP_WAIT_SEND, gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns));
out:
    mp_report(result, rc, i, step, 0);
#undef MP_CHECK
}

// Rank 0 of `pingpong --api mp --op read --trigger kernel` (rank 1 launches nothing): gets
// `size` bytes of the peer's window (win[peer]: its receive buffer) into dst with
// gds_peer_get and waits for each (gds_peer_wait_send) before the next, stamping the GPU's
// timer after each: one get's round trip per sample. Results as mp_pp's.
extern "C" __global__ void mp_pp_get(const gds_peer *peers, const gds_remote *win, uint32_t peer, uint64_t dst,
        uint32_t dlkey, uint32_t size, uint64_t iters, uint64_t times, uint64_t timeout_ns, uint64_t result) {
    gds_peer p = peers[peer];
    gds_remote from = win[peer];  // one read across PCIe, not one per get
    uint64_t i = 0;
    uint32_t step = 0;
    int rc = size == 0 ? GDS_INVALID : GDS_OK;
#define MP_CHECK(s, x) do { step = (s); rc = (x); if (rc) goto out; } while (0)
    if (rc) goto out;
    for (; i < iters; i++) {
        MP_CHECK(MP_STEP_GET, gds_peer_get(&p, &from, 0, dst, dlkey, size, timeout_ns));
        MP_CHECK(MP_STEP_WAIT_SEND, gds_peer_wait_send(&p, timeout_ns));
        ((volatile uint64_t *)times)[i] = gds_now_ns();
    }
out:
    mp_report(result, rc, i, step, 0);
#undef MP_CHECK
}

// mp_pp with its payloads in GPU memory staged through the channel's bounces (--mem device
// where the NIC cannot reach GPU memory; mp::Comm::kernel_channels_staged): thread 0 drives
// the channel as mp_pp does (receives posted ahead into their bounces, credits in batches,
// one send in sig_every signalled); the block copies the message out of GPU memory (sdev)
// into the next send bounce before the send, and the received message out of its bounce into
// GPU memory (rdev) after its wait, as pp_staged does. Thread 0 shares each step's code with
// the block, so all threads leave together on an error. Results as mp_pp's.
extern "C" __global__ void mp_pp_staged(const gds_peer *peers, uint32_t rank, uint32_t peer, uint64_t sdev,
        uint64_t rdev, uint32_t size, uint64_t iters, uint32_t ahead, uint32_t recv_batch, uint64_t sig_every,
        uint64_t times, uint64_t timeout_ns, uint64_t result) {
    gds_peer p;
    bool lead = threadIdx.x == 0;
    if (lead) p = peers[peer];
    uint64_t i = 0;
    uint32_t step = 0, len = 0;
    int rc = size < 4 || recv_batch == 0 || recv_batch > ahead || sig_every == 0 ? GDS_INVALID : GDS_OK;
    // Thread 0 only: runs x as step s unless an earlier step failed.
#define MP_DO(s, x) do { if (rc == GDS_OK) { step = (s); rc = (x); } } while (0)
#define MP_SHARE() do { rc = (int)gds_block_share((uint32_t)rc); if (rc) goto out; } while (0)
#define MP_TAKE() do { \
        bool last = i + 1 == iters; \
        MP_DO(MP_STEP_WAIT_RECV, gds_peer_wait_recv(&p, last ? &len : nullptr, timeout_ns)); \
        if (rc == GDS_OK && last && len != size) rc = MP_WRONG_LENGTH; \
    } while (0)
#define MP_COPY_IN() gds_block_copy_in(rdev, gds_block_share(lead ? gds_peer_recv_bounce(&p) : 0), size)
    // The bounce of the next send, taken while the peer works on the message before it (its
    // wait for an earlier send's completion is then off the message's path).
    uint64_t bounce = 0;
    if (lead) {
        while (rc == GDS_OK && p.recvs < iters && p.recvs < ahead) MP_DO(MP_STEP_RECV, gds_peer_post_recv_staged(&p, size));
        MP_DO(MP_STEP_CREDIT, gds_peer_give_credit(&p, timeout_ns));
        if (iters > 0) MP_DO(MP_STEP_SEND, gds_peer_next_send_bounce(&p, &bounce, timeout_ns));
    }
    MP_SHARE();
    bounce = gds_block_share(bounce);
    for (; i < iters; i++) {
        if (rank == 1) {
            if (lead) MP_TAKE();
            MP_SHARE();
            MP_COPY_IN();
        }
        if (lead) *(volatile uint32_t *)(sdev + size - 4) = (uint32_t)(2 * i + 1 + rank);
        if (size > GDS_LEAD_COPY_MAX) __syncthreads();  // the block copies the marker too
        gds_block_copy_out(bounce, sdev, size);
        uint64_t next = 0;
        if (lead) {
            bool signaled = i % sig_every == sig_every - 1 || i + 1 == iters;
            MP_DO(MP_STEP_SEND, gds_peer_send_bounce(&p, size, signaled ? GDS_SIGNALED : 0, timeout_ns));
            // The bookkeeping of mp_pp, while the peer works on the message. The receive
            // posted again takes the bounce of the one consumed last, already copied out.
            if (i > 0 && (i - 1) % sig_every == sig_every - 1)
                MP_DO(MP_STEP_WAIT_SEND, gds_peer_wait_sends(&p, p.sends - 1 - p.sends_waited, timeout_ns));
            if ((rank == 1 || i > 0) && p.recvs < iters) {
                MP_DO(MP_STEP_RECV, gds_peer_post_recv_staged(&p, size));
                if (p.recvs - p.credited >= recv_batch || p.recvs == iters)
                    MP_DO(MP_STEP_CREDIT, gds_peer_give_credit(&p, timeout_ns));
            }
            if (i + 1 < iters) MP_DO(MP_STEP_SEND, gds_peer_next_send_bounce(&p, &next, timeout_ns));
            if (rank == 0) MP_TAKE();
        }
        MP_SHARE();
        bounce = gds_block_share(next);
        if (rank == 0) {
            MP_COPY_IN();
            if (lead) ((volatile uint64_t *)times)[i] = gds_now_ns();
        }
    }
    if (lead && p.sends > p.sends_waited) MP_DO(MP_STEP_WAIT_SEND, gds_peer_wait_sends(&p, p.sends - p.sends_waited, timeout_ns));
out:
    if (lead) mp_report(result, rc, i, step, len);
#undef MP_DO
#undef MP_SHARE
#undef MP_TAKE
#undef MP_COPY_IN
}
