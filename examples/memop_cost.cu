// The step sequences of pingpong's kernels that memop_cost times (NVRTC compiles this after
// gdsync.cuh; tests/kernel_channel.rs checks that it compiles, with clang, where no GPU is).
//
// n rounds of one kind of step on pinned host words at w (bytes 0..64 stored, 64 polled:
// always satisfied); the GPU's clock for all rounds goes to out. Kinds: 0 the --raw floor's
// marker store to the peer (gds_signal32), 1 the marker then a send as gds_send rings it with
// no "rung to", 2 the same with "rung to", 3 a satisfied poll (gds_wait_value32), 4 a
// satisfied completion wait that retires (gds_wait: consumer index and retired counter).
extern "C" __global__ void seq(int kind, uint64_t n, uint64_t w, uint64_t out) {
    gds_send_desc s = {};
    s.dbrec = w; s.db = w + 8; s.db_value = 1; s.dbrec_value = 1;
    if (kind == 2) { s.rung = w + 16; s.rung_value = 1; }
    gds_wait_desc d = {};
    d.word = w + 64; d.cond = GDS_COND_GEQ; d.ci_rec = w + 24; d.ci_value = 1;
    d.retired = w + 32; d.retired_value = 1;
    uint64_t t0 = gds_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        if (kind == 0) gds_signal32(w + 40, (uint32_t)i);
        if (kind == 1 || kind == 2) { *(volatile uint32_t *)(w + 40) = (uint32_t)i; gds_send(&s); }
        if (kind == 3) gds_wait_value32(w + 64, 0, GDS_COND_GEQ, 1000000000ull);
        if (kind == 4) gds_wait(&d, 1000000000ull);
    }
    *(volatile uint64_t *)out = gds_now_ns() - t0;
}
