// The kernels of `bandwidth --trigger kernel` (NVRTC compiles them after gdsync.cuh;
// tests/kernel_channel.rs checks that they compile, with clang, where no GPU is, and runs
// bw_staged built for the host, as a block of one thread, against the soft device).
//
// bw: one thread drives rank 0's QP: it composes each WQE, rings the doorbell and polls the
// send CQ itself, keeping at most `window` messages uncompleted.
// bw_staged (--mem device where the NIC cannot reach GPU memory): thread 0 drives the QP the
// same way while the whole block copies each chunk of a message out of GPU memory into a
// pinned host bounce before its write (staged.rs and kstaged.rs say the rest).
// Every wait gives up after timeout_ns and the kernel reports the code instead of spinning
// forever.

// Result words (8 bytes each) at `words`: written at the end, then DONE set to 1.
#define BW_DONE 0
#define BW_RC 1
#define BW_T0 2
#define BW_T1 3
#define BW_SENT 4
// Written by the host: receives rank 1 has posted for this launch (sends only).
#define BW_CREDIT 5

struct bw_run {
    uint32_t opcode;
    uint64_t laddr, raddr;
    uint32_t lkey, rkey, len, window, sig_every;
    uint64_t credit;      // address of the credit word, 0 unless sending
    uint64_t credits;     // last credit value read
    uint64_t sent;        // messages posted in this launch
    uint64_t timeout_ns;
};

// Waits until rank 1 has a receive posted for message `r->sent` (the credit word counts them);
// reads host memory only when the last value read is used up.
__device__ int bw_wait_credit(bw_run *r) {
    uint64_t start = 0;
    for (uint32_t spins = 0; r->credits <= r->sent; spins++) {
        r->credits = *(const volatile uint64_t *)r->credit;
        if (r->credits <= r->sent && gds_expired(spins, &start, r->timeout_ns)) return GDS_TIMEOUT;
    }
    return GDS_OK;
}

// Posts n messages, at most r->window uncompleted, signalling every sig_every-th and the
// last; returns once all of them completed.
__device__ int bw_phase(gds_qp *q, bw_run *r, uint64_t n) {
    uint64_t posted = 0;
    for (;;) {
        uint64_t outstanding = q->sq_pi - q->send_cq.wq_ci;
        if (posted == n && outstanding == 0) return GDS_OK;
        if (posted < n && outstanding < r->window) {
            int rc = r->credit ? bw_wait_credit(r) : GDS_OK;
            if (rc != GDS_OK) return rc;
            uint32_t flags = (posted + 1 == n || (posted + 1) % r->sig_every == 0) ? GDS_SIGNALED : 0;
            rc = gds_qp_post_send(q, r->opcode, r->laddr, r->lkey, r->len, r->raddr, r->rkey, 0, flags);
            if (rc != GDS_OK) return rc;
            posted++;
            r->sent++;
            continue;
        }
        gds_wc wc;
        int rc = gds_cq_wait(&q->send_cq, &wc, r->timeout_ns);
        if (rc != GDS_OK) return rc;
    }
}

// op: 0 RDMA write, 1 RDMA read, 2 send. Runs `warm` messages, then times `iters` more.
extern "C" __global__ void bw(gds_qp q0, uint32_t op, uint64_t laddr, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                              uint32_t len, uint64_t warm, uint64_t iters, uint32_t window, uint32_t sig_every,
                              uint64_t words, uint64_t timeout_ns) {
    gds_qp q = q0;
    bw_run r;
    r.opcode = op == 0 ? GDS_OP_RDMA_WRITE : op == 1 ? GDS_OP_RDMA_READ : GDS_OP_SEND;
    r.laddr = laddr;
    r.raddr = raddr;
    r.lkey = lkey;
    r.rkey = rkey;
    r.len = len;
    r.window = window;
    r.sig_every = sig_every;
    r.credit = op == 2 ? words + 8 * BW_CREDIT : 0;
    r.credits = 0;
    r.sent = 0;
    r.timeout_ns = timeout_ns;
    volatile uint64_t *w = (volatile uint64_t *)words;
    int rc = (op > 2 || window == 0 || sig_every == 0 || sig_every > window) ? GDS_INVALID : GDS_OK;
    if (rc == GDS_OK) rc = bw_phase(&q, &r, warm);
    uint64_t t0 = gds_now_ns();
    if (rc == GDS_OK) rc = bw_phase(&q, &r, iters);
    uint64_t t1 = gds_now_ns();
    w[BW_RC] = (uint32_t)rc;
    w[BW_T0] = t0;
    w[BW_T1] = t1;
    w[BW_SENT] = r.sent;
    gds_signal64(words + 8 * BW_DONE, 1);
}

// ------------------------------------------------------------------------------ staged

// Result words of bw_staged (8 bytes each), besides BW_DONE, BW_RC and BW_SENT (chunks
// posted): the wait that failed, if one did.
#define BWS_STEP 5
#define BWS_STEP_CREDIT 1   // rank 1 did not credit a chunk (copy it in) in time
#define BWS_STEP_WRITTEN 2  // a write did not complete in time (or completed in error)
#define BWS_STEP_POST 3     // gds_qp_post_send refused the write

// Waits until the credit word (chunks rank 1 has copied in since the start) reaches `want`;
// reads host memory only while the last value read (*seen) falls short.
__device__ int bws_wait_credit(uint64_t credit, uint64_t want, uint64_t *seen, uint64_t timeout_ns) {
    uint64_t start = 0;
    for (uint32_t spins = 0; *seen < want; spins++) {
        *seen = gds_ld_acquire64(credit);
        if (*seen < want && gds_expired(spins, &start, timeout_ns)) return GDS_TIMEOUT;
    }
    return GDS_OK;
}

// Waits until the send ring's first `upto` WQEBBs (free-running count) completed: one WQEBB
// per chunk write, so the write of WQEBB upto - 1 has read its bounce.
__device__ int bws_wait_written(gds_qp *q, uint64_t upto, uint64_t timeout_ns) {
    while ((long long)(q->send_cq.wq_ci - upto) < 0) {
        gds_wc wc;
        int rc = gds_cq_wait(&q->send_cq, &wc, timeout_ns);
        if (rc != GDS_OK) return rc;
    }
    return GDS_OK;
}

// Moves n messages of `size` bytes from GPU memory (sdev) to rank 1, each cut into chunks of
// at most `chunk` bytes. Chunk j of the launch is chunk s = first + j of the run; it goes
// through bounce b = s % bounces (slot bytes apart: out_gpu + b * slot for the block's copy,
// out_nic + b * slot for the NIC) as an RDMA write with immediate s into the same bounce of
// rank 1 (raddr + b * slot), every write signalled. Before bounce b is filled again, thread 0
// waits until rank 1 has credited chunk s - bounces (its copy in is done: rank 1's bounce is
// free) and until the write of chunk j - bounces of this launch completed (rank 0's bounce
// is free; the previous launch ended with all of its writes completed and credited). With
// two bounces or more, chunk j + 1 is copied while chunk j is on the wire. The launch ends
// once every write completed and every chunk is credited. Results: BW_RC, BW_SENT (chunks
// posted), BWS_STEP, then BW_DONE set to 1.
extern "C" __global__ void bw_staged(gds_qp q0, uint64_t sdev, uint64_t size, uint64_t n, uint64_t chunk,
                                     uint64_t slot, uint32_t bounces, uint64_t first, uint64_t out_gpu,
                                     uint64_t out_nic, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t credit,
                                     uint64_t words, uint64_t timeout_ns) {
    bool lead = threadIdx.x == 0;
    gds_qp q = q0;  // thread 0's to drive
    uint64_t base = q.sq_pi, seen = 0, posted = 0;
    uint32_t step = 0;
    int rc = (size == 0 || chunk == 0 || chunk > slot || bounces < 2 || size > 0x7FFFFFFFull) ? GDS_INVALID : GDS_OK;
    uint64_t count = chunk ? (size + chunk - 1) / chunk : 0, total = n * count;
    for (uint64_t j = 0; j < total; j++) {
        uint64_t s = first + j, b = s % bounces;
        uint64_t off = (j % count) * chunk, len = size - off < chunk ? size - off : chunk;
        if (lead && rc == GDS_OK && s >= bounces) {
            step = BWS_STEP_CREDIT;
            rc = bws_wait_credit(credit, s - bounces + 1, &seen, timeout_ns);
            if (rc == GDS_OK && j >= bounces) {
                step = BWS_STEP_WRITTEN;
                rc = bws_wait_written(&q, base + j - bounces + 1, timeout_ns);
            }
        }
        // Every thread leaves at the same chunk when thread 0 failed.
        rc = (int)gds_block_share((uint32_t)rc);
        if (rc != GDS_OK) break;
        gds_block_copy(out_gpu + b * slot, sdev + off, len);
        if (lead) {
            step = BWS_STEP_POST;
            rc = gds_qp_post_send(&q, GDS_OP_RDMA_WRITE_IMM, out_nic + b * slot, lkey, (uint32_t)len, raddr + b * slot,
                                  rkey, (uint32_t)s, GDS_SIGNALED);
            if (rc == GDS_OK) posted++;
        }
    }
    if (!lead) return;
    if (rc == GDS_OK) {
        step = BWS_STEP_WRITTEN;
        rc = bws_wait_written(&q, base + posted, timeout_ns);
    }
    if (rc == GDS_OK) {
        step = BWS_STEP_CREDIT;
        rc = bws_wait_credit(credit, first + total, &seen, timeout_ns);
    }
    volatile uint64_t *w = (volatile uint64_t *)words;
    w[BW_RC] = (uint32_t)rc;
    w[BW_SENT] = posted;
    w[BWS_STEP] = rc == GDS_OK ? 0 : step;
    gds_signal64(words + 8 * BW_DONE, 1);
}
