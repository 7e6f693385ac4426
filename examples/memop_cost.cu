// The step sequences of pingpong's kernels that memop_cost times (NVRTC compiles this after
// gdsync.cuh; tests/kernel_channel.rs checks that it compiles, with clang, where no GPU is).
//
// n rounds of one kind of step on pinned host words at w (bytes 0..64 stored, 64 polled:
// always satisfied); the GPU's clock for all rounds goes to out. Kinds: 0 the --raw floor's
// marker store to the peer (gds_signal32), 1 the marker then a send as gds_send rings it with
// no "rung to", 2 the same with "rung to", 3 a satisfied poll (gds_wait_value32), 4 a
// satisfied completion wait that retires (gds_wait: consumer index and retired counter), 5 a
// descriptor fetch of a filled entry (gds_ring_fetch), 6 and 7 two and three entries in one
// gds_ring_fetch_n, 8 one 16-byte load that bypasses the cache (__ldcv), 9 five of them
// issued together (one entry's worth), 10 five 8-byte ld.relaxed.sys, 11 five lanes of the
// warp loading 16 bytes each at once, 12 and 13 one and two entries fetched by the warp
// (gds_ring_fetch_warp), 14 the marker then a send as mp's kernel channels post it
// (gds_qp_post_send: the WQE composed and stored, then rung), 15 seven more stores before the
// marker and send of kind 1, 16 a completion wait (gds_wait) then the marker and send (a pp
// rank's answer), 17 the same as mp's channel answers (a satisfied poll, the four stores of
// gds_peer_wait_recv, the marker, gds_qp_post_send), 18 kind 14 on a send ring of 128
// WQEBBs (each send writes a line it has not written for 127 sends, as an mp channel's ring
// of that depth does). Kinds 11-13 run on the whole warp, the
// others on lane 0. The ring's entries lie at w + 256 (80 bytes each, the host fills their
// sequence numbers), its consumed counter at w + 512; kinds 14 and 17 use a send ring of four
// WQEBBs at w + 768 and the QP's host copies at w + 576.
extern "C" __global__ void seq(int kind, uint64_t n, uint64_t w, uint64_t out) {
    bool warp = kind >= 11 && kind <= 13;
    if (!warp && threadIdx.x != 0) return;
    gds_send_desc s = {};
    s.dbrec = w; s.db = w + 8; s.db_value = 1; s.dbrec_value = 1;
    if (kind == 2) { s.rung = w + 16; s.rung_value = 1; }
    gds_wait_desc d = {};
    d.word = w + 64; d.cond = GDS_COND_GEQ; d.ci_rec = w + 24; d.ci_value = 1;
    d.retired = w + 32; d.retired_value = 1;
    gds_desc_ring ring = {w + 256, w + 512, 8, 0};
    gds_qp qp = {};
    qp.sq = w + 768; qp.dbrec = w; qp.db = w + 8; qp.state = w + 576; qp.sq_wqebbs = 4; qp.qpn = 1;
    if (kind == 18) { qp.sq = w + 1280; qp.sq_wqebbs = 128; }
    gds_desc e[3];
    uint64_t sink = 0;
    uint64_t t0 = gds_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        if (kind == 0) gds_signal32(w + 40, (uint32_t)i);
        if (kind == 1 || kind == 2) { *(volatile uint32_t *)(w + 40) = (uint32_t)i; gds_send(&s); }
        if (kind == 3) gds_wait_value32(w + 64, 0, GDS_COND_GEQ, 1000000000ull);
        if (kind == 4) gds_wait(&d, 1000000000ull);
        if (kind == 5) { gds_ring_fetch(&ring, 0, e, 1000000000ull); sink += e[0].seq; }
        if (kind == 6 || kind == 7) { gds_ring_fetch_n(&ring, 0, kind - 4, e, 1000000000ull); sink += e[kind - 5].seq; }
        if (kind == 8) sink += __ldcv((const ulonglong2 *)(w + 256)).x;
        if (kind == 9) {
            const ulonglong2 *p = (const ulonglong2 *)(w + 256);
            ulonglong2 a = __ldcv(p), b = __ldcv(p + 1), c = __ldcv(p + 2), d2 = __ldcv(p + 3), f = __ldcv(p + 4);
            sink += a.x + b.y + c.x + d2.y + f.x;
        }
        if (kind == 10) {
            uint64_t a, b, c, d2, f;
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(a) : "l"(w + 256) : "memory");
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(b) : "l"(w + 272) : "memory");
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(c) : "l"(w + 288) : "memory");
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(d2) : "l"(w + 304) : "memory");
            asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(f) : "l"(w + 320) : "memory");
            sink += a + b + c + d2 + f;
        }
        if (kind == 11) {
            ulonglong2 a = __ldcv((const ulonglong2 *)(w + 256) + (threadIdx.x % 5));
            __syncwarp();
            sink += a.x;
        }
        if (kind == 14 || kind == 17 || kind == 18) {
            if (kind == 17) {
                gds_wait_value32(w + 64, 0, GDS_COND_GEQ, 1000000000ull);
                for (int j = 0; j < 4; j++) *(volatile uint64_t *)(w + 600 + 8 * j) = i;
            }
            *(volatile uint32_t *)(w + 40) = (uint32_t)i;
            qp.send_cq.wq_ci = qp.sq_pi;  // the ring always has room
            gds_qp_post_send(&qp, GDS_OP_SEND, w + 40, 1, 8, 0, 0, 0, 0);
        }
        if (kind == 15 || kind == 16) {
            if (kind == 15) for (int j = 0; j < 7; j++) *(volatile uint64_t *)(w + 600 + 8 * j) = i;
            if (kind == 16) gds_wait(&d, 1000000000ull);
            *(volatile uint32_t *)(w + 40) = (uint32_t)i;
            gds_send(&s);
        }
        if (kind == 12 || kind == 13) { gds_ring_fetch_warp(&ring, 0, kind - 11, e, 1000000000ull); sink += e[kind - 12].seq; }
    }
    if (threadIdx.x == 0) *(volatile uint64_t *)out = gds_now_ns() - t0;
    if (threadIdx.x == 0) *(volatile uint64_t *)(w + 48) = sink;
}
