// The kernel of capi/tests/gpu_kernel_qp.rs (NVRTC compiles it after gdsync.cuh); capi/tests/kernel_qp.rs
// checks that it compiles, with clang, where no GPU is.
// One thread drives both QPs: message i (64 bytes) goes from a to b, and b checks it.
extern "C" __global__ void c_api_qp(gds_qp a0, gds_qp b0, uint64_t abuf, uint32_t alkey, uint64_t bbuf,
                                    uint32_t blkey, uint64_t rounds, uint64_t out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    gds_qp a = a0, b = b0;
    gds_wc wc;
    int rc = GDS_OK;
    uint64_t i = 0, bad = 0;
    for (; i < rounds && rc == GDS_OK; i++) {
        volatile uint8_t *src = (volatile uint8_t *)abuf;
        for (uint32_t k = 0; k < 64; k++) src[k] = (uint8_t)(i * 7 + k);
        rc = gds_qp_post_recv(&b, bbuf + 64, 64, blkey);
        if (rc == GDS_OK) rc = gds_qp_post_send(&a, GDS_OP_SEND, abuf, alkey, 64, 0, 0, 0, GDS_SIGNALED);
        if (rc == GDS_OK) rc = gds_cq_wait(&a.send_cq, &wc, 10000000000ull);
        if (rc == GDS_OK) rc = gds_cq_wait(&b.recv_cq, &wc, 10000000000ull);
        if (rc != GDS_OK) break;
        volatile uint8_t *dst = (volatile uint8_t *)(bbuf + 64);
        for (uint32_t k = 0; k < 64; k++) bad += dst[k] != (uint8_t)(i * 7 + k);
    }
    volatile uint64_t *o = (volatile uint64_t *)out;
    o[0] = (uint32_t)rc;
    o[1] = bad;
    o[2] = i;
    __threadfence_system();
}
