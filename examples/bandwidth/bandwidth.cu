// The kernel of `bandwidth --trigger kernel` (NVRTC compiles it after gdsync.cuh;
// tests/kernel_channel.rs checks that it compiles, with clang, where no GPU is).
//
// One thread drives rank 0's QP: it composes each WQE, rings the doorbell and polls the send
// CQ itself, keeping at most `window` messages uncompleted. Every wait gives up after
// timeout_ns and the kernel reports the code instead of spinning forever.

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
