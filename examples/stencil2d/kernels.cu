// The GPU kernels of stencil2d (NVRTC compiles them after gdsync.cuh, with --fmad=false so
// that every variant computes the same bits as the CPU; tests/stencil.rs checks that they
// compile, with clang, where no GPU is).
//
// Sides are numbered as grid::Side: 0 north (row 0), 1 south (row nx + 1), 2 west (column 0),
// 3 east (column ny + 1). A grid is (nx + 2) x (ny + 2) doubles, row-major, one-cell halo.

typedef unsigned long long u64;

// The update, in the order the CPU evaluates it (grid::update): north, south, west, east.
__device__ __forceinline__ double upd_vals(double c, double n, double s, double w, double e, double c0, double c1) {
    double sum = (n + s) + (w + e);
    return c0 * c + c1 * sum;
}

__device__ __forceinline__ void upd(const double *__restrict__ cur, double *__restrict__ nxt, long i, long s,
                                    double c0, double c1) {
    nxt[i] = upd_vals(cur[i], cur[i - s], cur[i + s], cur[i - 1], cur[i + 1], c0, c1);
}

#define FOR_EACH(k, n) \
    for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < (n); k += (long)gridDim.x * blockDim.x)

// Ring cell k (numbered as grid::ring_cell) of an nx x ny block: its row and column.
__device__ __forceinline__ void ring_cell(long k, int nx, int ny, long *r, long *c) {
    long top = (long)ny * min(nx, 2);
    if (k < ny) {
        *r = 1;
        *c = 1 + k;
    } else if (nx > 1 && k < 2L * ny) {
        *r = nx;
        *c = 1 + k - ny;
    } else {
        long j = k - top, rows = nx - 2;
        if (j < rows) {
            *r = 2 + j;
            *c = 1;
        } else {
            *r = 2 + j - rows;
            *c = ny;
        }
    }
}

__device__ __forceinline__ long ring_len(int nx, int ny) {
    return (long)ny * min(nx, 2) + (long)max(nx - 2, 0) * min(ny, 2);
}

// Owned cells touching no halo: rows 2..nx-1, columns 2..ny-1.
extern "C" __global__ void interior(u64 cur, u64 nxt, int nx, int ny, double c0, double c1) {
    long w = ny - 2, h = nx - 2, s = ny + 2;
    if (w <= 0 || h <= 0) return;
    FOR_EACH(k, w * h) {
        long r = 2 + k / w, c = 2 + k % w;
        upd((const double *)cur, (double *)nxt, r * s + c, s, c0, c1);
    }
}

// ------------------------------------------------------------ the halo exchange

// One side's channel (gpu.rs: SideArgs). len 0: no neighbour on that side.
// Iteration i sends from send + (i % nsend) * len and receives into recv + (i % nrecv) * len.
struct StencilSide {
    u64 send, recv;
    unsigned send_lkey, recv_lkey, len, peer;
    unsigned nsend, nrecv;
};
static_assert(sizeof(StencilSide) == 40, "StencilSide size");

__device__ __forceinline__ double *send_buf(const StencilSide &d, long i) {
    return (double *)(d.send + (u64)(i % d.nsend) * d.len);
}
__device__ __forceinline__ double *recv_buf(const StencilSide &d, long i) {
    return (double *)(d.recv + (u64)(i % d.nrecv) * d.len);
}

// Everything the persistent kernel needs (gpu.rs: PersistentArgs), passed by value.
struct StencilRun {
    StencilSide side[4];
    u64 peers;       // const gds_peer *, indexed by rank (pinned host memory)
    u64 grid[2];
    u64 bar;         // 3 words of device memory: arrivals, generation, abort
    u64 status;      // 2 words of pinned host memory: error code, iteration
    long first, end;  // iterations
    u64 timeout_ns;
    int nx, ny;
    // The halos live in GPU memory the NIC cannot reach: the channels are staged (block 0
    // copies each send buffer into a bounce before its send, each received bounce into the
    // receive buffer after its wait).
    int staged, pad;
    // --trace: STENCIL_STEPS + 1 words of pinned host memory (0: no trace), see StepTimes.
    u64 trace;
};
static_assert(sizeof(StencilRun) == 248, "StencilRun size");

// --trace: block 0's thread 0 (the one that drives the channels) adds up the GPU's time in
// each step of its iterations: send, interior, wait (the halos, the sends whose buffers the
// ring packs next, staged copies in), barrier, ring, barrier, receives (posts and credits).
// Written to the trace words once, after the last iteration, with the iteration count last.
#define STENCIL_STEPS 7
struct StepTimes {
    bool on;
    u64 at;
    u64 spent[STENCIL_STEPS];
    __device__ StepTimes(bool on) : on(on), at(on ? gds_now_ns() : 0) {
        for (int s = 0; s < STENCIL_STEPS; s++) spent[s] = 0;
    }
    // The step `s` ends now.
    __device__ __forceinline__ void end(int s) {
        if (!on) return;
        u64 now = gds_now_ns();
        spent[s] += now - at;
        at = now;
    }
    __device__ void publish(const StencilRun &a) const {
        if (!on) return;
        volatile u64 *w = (volatile u64 *)a.trace;
        for (int s = 0; s < STENCIL_STEPS; s++) w[s] = spent[s];
        w[STENCIL_STEPS] = (u64)(a.end - a.first);
        __threadfence_system();
    }
};

// The persistent kernel's error codes beyond gdsync's (GDS_*); gpu.rs decodes them.
#define STENCIL_BARRIER_TIMEOUT 0x1001  // a grid barrier waited longer than timeout_ns
#define STENCIL_SHORT_MESSAGE 0x1002    // a halo message had the wrong length

__device__ void stencil_fail(const StencilRun &a, int rc, long i) {
    volatile unsigned *st = (volatile unsigned *)a.status;
    if (atomicCAS((unsigned *)a.bar + 2, 0u, 1u) == 0u) {
        st[1] = (unsigned)i;
        st[0] = (unsigned)rc;
        __threadfence_system();
    }
}

// A grid-wide barrier (the kernel is launched cooperatively, so every block is resident).
// Returns false, in every thread of the block, when the kernel must stop: an error anywhere,
// or this barrier timed out.
__device__ bool grid_sync(const StencilRun &a, unsigned *gen, long i) {
    __shared__ int go;
    unsigned *bar = (unsigned *)a.bar;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g = *gen;
        __threadfence();
        if (atomicAdd(&bar[0], 1u) == gridDim.x - 1) {
            atomicExch(&bar[0], 0u);
            __threadfence();
            atomicExch(&bar[1], g + 1);
        } else {
            uint64_t start = 0;
            for (unsigned spins = 0; *(volatile unsigned *)&bar[1] == g; spins++) {
                if (*(volatile unsigned *)&bar[2]) break;
                if (gds_expired(spins, &start, a.timeout_ns)) {
                    stencil_fail(a, STENCIL_BARRIER_TIMEOUT, i);
                    break;
                }
            }
        }
        __threadfence();
        *gen = g + 1;
        go = *(volatile unsigned *)&bar[2] == 0;
    }
    __syncthreads();
    return go;
}

// Reads that bypass L1: other blocks (and the NIC) wrote these values since this SM last
// read the same lines.
__device__ __forceinline__ double ld(const double *p) { return __ldcg(p); }

// A halo value: from the receive buffer of that side when it has a neighbour (the message
// is never copied into the grid), else from the grid (the fixed global boundary).
__device__ __forceinline__ double halo(const StencilRun &a, const double *cur, int side, long i, long k, long at) {
    const StencilSide &sd = a.side[side];
    if (sd.len) return __ldcv(recv_buf(sd, i) + k);
    return ld(cur + at);
}

// One ring cell of iteration `it`, reading halos from the receive buffers; its value also
// goes into the send buffers of the next iteration when `pack`. Returns whether it stored
// into a send buffer.
__device__ bool ring_update(const StencilRun &a, const double *cur, double *nxt, long r, long c, long it, bool pack,
                            double c0, double c1) {
    long s = a.ny + 2, i = r * s + c;
    double n = r == 1 ? halo(a, cur, 0, it, c - 1, i - s) : ld(cur + i - s);
    double so = r == a.nx ? halo(a, cur, 1, it, c - 1, i + s) : ld(cur + i + s);
    double w = c == 1 ? halo(a, cur, 2, it, r - 1, i - 1) : ld(cur + i - 1);
    double e = c == a.ny ? halo(a, cur, 3, it, r - 1, i + 1) : ld(cur + i + 1);
    double v = upd_vals(ld(cur + i), n, so, w, e, c0, c1);
    nxt[i] = v;
    bool stored = false;
    if (pack) {
        const StencilSide *sd = a.side;
        if (r == 1 && sd[0].len) send_buf(sd[0], it + 1)[c - 1] = v, stored = true;
        if (r == a.nx && sd[1].len) send_buf(sd[1], it + 1)[c - 1] = v, stored = true;
        if (c == 1 && sd[2].len) send_buf(sd[2], it + 1)[r - 1] = v, stored = true;
        if (c == a.ny && sd[3].len) send_buf(sd[3], it + 1)[r - 1] = v, stored = true;
    }
    return stored;
}

// The owned edges of iteration i's grid into its send buffers (the first iteration's: later
// ones are packed by ring_update). Returns whether this thread stored into one.
__device__ bool pack_edges(const StencilRun &a, long i) {
    const double *g = (const double *)a.grid[i & 1];
    const StencilSide *sd = a.side;
    long s = a.ny + 2;
    bool stored = false;
    FOR_EACH(k, max(a.nx, a.ny)) {
        if (k < a.ny && sd[0].len) send_buf(sd[0], i)[k] = ld(g + s + 1 + k), stored = true;
        if (k < a.ny && sd[1].len) send_buf(sd[1], i)[k] = ld(g + a.nx * s + 1 + k), stored = true;
        if (k < a.nx && sd[2].len) send_buf(sd[2], i)[k] = ld(g + (1 + k) * s + 1), stored = true;
        if (k < a.nx && sd[3].len) send_buf(sd[3], i)[k] = ld(g + (1 + k) * s + a.ny), stored = true;
    }
    return stored;
}

extern "C" __global__ void pack(StencilRun a, long i) { pack_edges(a, i); }

// Staged channels, by block 0 (every thread of it; `comm` is its thread 0, the one that drives
// the channels, and `rc` that thread's status, shared with the block): each side's send
// buffer of iteration i into the bounce of its next send, then the send. Returns the status.
__device__ int send_staged(const StencilRun &a, gds_peer *peer, long i, bool comm, int rc) {
    for (int d = 0; d < 4; d++) {
        const StencilSide &sd = a.side[d];
        if (!sd.len) continue;
        uint64_t bounce = 0;
        if (comm && rc == GDS_OK) rc = gds_peer_next_send_bounce(&peer[d], &bounce, a.timeout_ns);
        bounce = gds_block_share(rc == GDS_OK ? bounce : 0);
        if (bounce) gds_block_copy_out(bounce, (u64)send_buf(sd, i), sd.len);
        if (comm && rc == GDS_OK) rc = gds_peer_send_bounce(&peer[d], sd.len, GDS_SIGNALED, a.timeout_ns);
    }
    return rc;
}

// Staged channels, by block 0 after its thread 0 waited for side d's receive of iteration i:
// the bounce it landed in, into that iteration's receive buffer (what the ring reads).
__device__ void copy_in_staged(const StencilRun &a, const gds_peer *peer, int d, long i, bool comm, int rc) {
    const StencilSide &sd = a.side[d];
    uint64_t bounce = gds_block_share(comm && rc == GDS_OK ? gds_peer_recv_bounce(&peer[d]) : 0);
    if (bounce) gds_block_copy_in((u64)recv_buf(sd, i), bounce, sd.len);
}

// The ring cells of iteration i (host and stream triggers): halos straight from the receive
// buffers (no unpack), and the next iteration's edges packed on the way (no pack kernel).
extern "C" __global__ void ring(StencilRun a, long i, int pack_next, double c0, double c1) {
    const double *cur = (const double *)a.grid[i & 1];
    double *nxt = (double *)a.grid[1 - (i & 1)];
    FOR_EACH(k, ring_len(a.nx, a.ny)) {
        long r, c;
        ring_cell(k, a.nx, a.ny, &r, &c);
        ring_update(a, cur, nxt, r, c, i, pack_next != 0, c0, c1);
    }
}

// The whole block of iteration i in one launch (`--overlap off`): the ring cells as `ring`
// does them (halos from the receive buffers, the next sends packed), then the interior.
extern "C" __global__ void whole(StencilRun a, long i, int pack_next, double c0, double c1) {
    const double *cur = (const double *)a.grid[i & 1];
    double *nxt = (double *)a.grid[1 - (i & 1)];
    long nr = ring_len(a.nx, a.ny), w = a.ny - 2, h = a.nx - 2, s = a.ny + 2;
    long ni = w > 0 && h > 0 ? w * h : 0;
    FOR_EACH(k, nr + ni) {
        if (k < nr) {
            long r, c;
            ring_cell(k, a.nx, a.ny, &r, &c);
            ring_update(a, cur, nxt, r, c, i, pack_next != 0, c0, c1);
        } else {
            long j = k - nr, r = 2 + j / w, c = 2 + j % w;
            upd(cur, nxt, r * s + c, s, c0, c1);
        }
    }
}

// The thread that drives side d's channel (gds_peer_*): with direct channels thread 0 of
// block d (of block d % blocks, on a grid of fewer than 4), so that the sides' reads across
// PCIe and their system fences overlap on different SMs; with staged channels thread 0 of
// block 0 drives every side (block 0 copies each halo between its steps).
__device__ __forceinline__ bool drives(const StencilRun &a, int d) {
    unsigned block = a.staged ? 0u : (unsigned)d % gridDim.x;
    return blockIdx.x == block && threadIdx.x == 0;
}

// One rank's iterations first..end in one kernel. Thread 0 of up to four blocks drives the
// channels (drives()); every thread computes. Per iteration: sends (buffers packed by the previous
// iteration) -> interior -> wait for the halos, and for the sends whose buffers the ring packs
// next -> barrier -> ring cells from the received halos, packing the next sends -> barrier ->
// (every other iteration) receives for iterations i + 2 and i + 3, with one credit.
// Launched with gpu.rs's BLOCK (256) threads per block. The bound keeps its registers to what
// lets 4 blocks share an SM: the cells are a memory-bound loop that needs warps in flight,
// and the channel code, which would take more registers, runs on one thread per side.
extern "C" __global__ void __launch_bounds__(256, 4) persistent(StencilRun a, double c0, double c1) {
    __shared__ unsigned gen;
    __shared__ gds_peer peer[4];
    // Thread 0 of block 0: the staged channels' driver, and the one --trace times.
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;
    if (threadIdx.x == 0) gen = *(volatile unsigned *)((unsigned *)a.bar + 1);
    int rc = GDS_OK;
    // Each driving thread's copy of its channels, in its block's shared memory.
    for (int d = 0; d < 4; d++)
        if (a.side[d].len && drives(a, d)) peer[d] = ((const gds_peer *)a.peers)[a.side[d].peer];
    for (int d = 0; d < 4 && rc == GDS_OK; d++) {
        if (!a.side[d].len || !drives(a, d)) continue;
        for (long i = a.first; i < a.end && i < a.first + 2 && rc == GDS_OK; i++)
            rc = a.staged ? gds_peer_recv_staged(&peer[d], a.side[d].len, a.timeout_ns)
                          : gds_peer_recv(&peer[d], (u64)recv_buf(a.side[d], i), a.side[d].recv_lkey, a.side[d].len,
                                          a.timeout_ns);
    }
    if (rc != GDS_OK) stencil_fail(a, rc, a.first);
    // The first iteration's send buffers, from its grid. The NIC reads them from host memory:
    // publish this thread's stores.
    if (pack_edges(a, a.first)) __threadfence_system();
    if (!grid_sync(a, &gen, a.first)) return;
    StepTimes t(lead && a.trace);
    for (long i = a.first; i < a.end; i++) {
        int p = (int)(i & 1);
        const double *cur = (const double *)a.grid[p];
        double *nxt = (double *)a.grid[1 - p];
        if (a.staged && blockIdx.x == 0) {
            rc = send_staged(a, peer, i, lead, rc);
            if (lead && rc != GDS_OK) stencil_fail(a, rc, i);
        } else if (!a.staged) {
            for (int d = 0; d < 4 && rc == GDS_OK; d++)
                if (a.side[d].len && drives(a, d))
                    rc = gds_peer_send(&peer[d], (u64)send_buf(a.side[d], i), a.side[d].send_lkey, a.side[d].len,
                                       a.timeout_ns);
            if (rc != GDS_OK) stencil_fail(a, rc, i);
        }
        t.end(0);
        {
            long w = a.ny - 2, h = a.nx - 2, s = a.ny + 2;
            if (w >= (long)blockDim.x && h > 0) {
                // Rows at least a block wide: a block per row in turn, its threads along the
                // row (no division per cell, loads coalesced, the row's cells independent).
                for (long r = 2 + blockIdx.x; r < h + 2; r += gridDim.x) {
                    const double *in = cur + r * s;
                    double *out = nxt + r * s;
#pragma unroll 4
                    for (long c = 2 + threadIdx.x; c < w + 2; c += blockDim.x)
                        out[c] = upd_vals(ld(in + c), ld(in + c - s), ld(in + c + s), ld(in + c - 1), ld(in + c + 1),
                                          c0, c1);
                }
            } else if (w > 0 && h > 0) {
                FOR_EACH(k, w * h) {
                    long r = 2 + k / w, c = 2 + k % w, at = r * s + c;
                    nxt[at] = upd_vals(ld(cur + at), ld(cur + at - s), ld(cur + at + s), ld(cur + at - 1),
                                       ld(cur + at + 1), c0, c1);
                }
            }
        }
        t.end(1);
        // A halo's byte count is read in the first iteration of a launch only: reading it
        // costs the wait a second read across PCIe and a system fence, and every message of a
        // side has the same length. A message longer than its receive fails the wait with
        // an error completion in any iteration.
        const bool check_len = i == a.first;
        if (a.staged && blockIdx.x == 0) {
            // Block 0 copies each halo in after its wait; sends need no wait here (a bounce
            // waits for its previous send itself, and the send buffers were copied out).
            for (int d = 0; d < 4; d++) {
                if (!a.side[d].len) continue;
                unsigned got = a.side[d].len;
                if (lead && rc == GDS_OK) rc = gds_peer_wait_recv(&peer[d], check_len ? &got : nullptr, a.timeout_ns);
                if (lead && rc == GDS_OK && got != a.side[d].len) rc = STENCIL_SHORT_MESSAGE;
                copy_in_staged(a, peer, d, i, lead, rc);
            }
            if (lead && rc == GDS_OK && i + 1 == a.end)
                for (int d = 0; d < 4 && rc == GDS_OK; d++)
                    if (a.side[d].len && peer[d].sends > peer[d].sends_waited)
                        rc = gds_peer_wait_sends(&peer[d], peer[d].sends - peer[d].sends_waited, a.timeout_ns);
            if (lead && rc != GDS_OK) stencil_fail(a, rc, i);
        } else if (!a.staged && rc == GDS_OK) {
            for (int d = 0; d < 4 && rc == GDS_OK; d++) {
                if (!a.side[d].len || !drives(a, d)) continue;
                unsigned got = a.side[d].len;
                rc = gds_peer_wait_recv(&peer[d], check_len ? &got : nullptr, a.timeout_ns);
                if (rc == GDS_OK && got != a.side[d].len) rc = STENCIL_SHORT_MESSAGE;
                // This iteration's ring packs buffer (i + 1) % nsend, which iteration
                // i + 1 - nsend sent: that send and the older ones must be complete, the
                // nsend - 1 newest may still be read by the NIC (their completions are not on
                // the iteration's path). The last iteration waits for every send.
                uint64_t keep = i + 1 < a.end ? a.side[d].nsend - 1 : 0;
                while (rc == GDS_OK && peer[d].sends - peer[d].sends_waited > keep)
                    rc = gds_peer_wait_send(&peer[d], a.timeout_ns);
            }
            if (rc != GDS_OK) stencil_fail(a, rc, i);
        }
        t.end(2);
        if (!grid_sync(a, &gen, i)) return;
        t.end(3);
        bool stored = false;
        bool pack = i + 1 < a.end;
        FOR_EACH(k, ring_len(a.nx, a.ny)) {
            long r, c;
            ring_cell(k, a.nx, a.ny, &r, &c);
            stored |= ring_update(a, cur, nxt, r, c, i, pack, c0, c1);
        }
        if (stored) __threadfence_system();
        t.end(4);
        if (!grid_sync(a, &gen, i)) return;
        t.end(5);
        // This iteration's halos are read. Every other iteration: receives for iterations
        // i + 2 and i + 3 under one credit (one credit write for two receives). Their buffers
        // were last read by iterations i - 4 and i - 3 (nrecv = 6); at most 3 receives are
        // then posted ahead (i + 1 .. i + 3), within the channel's depth of 4.
        if (i + 2 < a.end && ((i - a.first) & 1) == 0) {
            for (int d = 0; d < 4 && rc == GDS_OK; d++) {
                const StencilSide &sd = a.side[d];
                if (!sd.len || !drives(a, d)) continue;
                if (a.staged) {
                    rc = gds_peer_post_recv_staged(&peer[d], sd.len);
                    if (rc == GDS_OK && i + 3 < a.end) rc = gds_peer_post_recv_staged(&peer[d], sd.len);
                } else {
                    rc = gds_peer_post_recv(&peer[d], (u64)recv_buf(sd, i + 2), sd.recv_lkey, sd.len);
                    if (rc == GDS_OK && i + 3 < a.end)
                        rc = gds_peer_post_recv(&peer[d], (u64)recv_buf(sd, i + 3), sd.recv_lkey, sd.len);
                }
                if (rc == GDS_OK) rc = gds_peer_give_credit(&peer[d], a.timeout_ns);
            }
            if (rc != GDS_OK) stencil_fail(a, rc, i);
        }
        t.end(6);
    }
    t.publish(a);
}
