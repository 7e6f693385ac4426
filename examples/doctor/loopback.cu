// The doctor's kernel-initiated loopback (NVRTC compiles it after gdsync.cuh; tests/doctor.rs
// checks that it compiles, with clang, where no GPU is).
//
// Write i copies `msg` bytes from src + off to raddr + off (off = (i % slots) * msg), posted by
// this thread and waited for on the send CQ; the time from the post to the completion, in ns
// of the GPU's global timer, goes into times[i]. rc: 1 when all completed, 1000 + code else.
extern "C" __global__ void doctor_writes(gds_qp q, uint64_t src, uint32_t lkey, uint64_t raddr,
        uint32_t rkey, uint32_t msg, uint32_t slots, uint64_t iters, uint64_t times,
        uint64_t timeout_ns, uint64_t rc_addr) {
    int rc = GDS_OK;
    gds_wc wc;
    for (uint64_t i = 0; i < iters && rc == GDS_OK; i++) {
        uint64_t off = (i % slots) * msg;
        uint64_t t0 = gds_now_ns();
        rc = gds_qp_post_send(&q, GDS_OP_RDMA_WRITE, src + off, lkey, msg, raddr + off, rkey, 0,
                              GDS_SIGNALED);
        if (rc == GDS_OK) rc = gds_cq_wait(&q.send_cq, &wc, timeout_ns);
        ((volatile uint64_t *)times)[i] = gds_now_ns() - t0;
    }
    gds_signal32(rc_addr, rc ? 1000 + rc : 1);
}
