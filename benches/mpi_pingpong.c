/* mpi_pingpong.c: the Open MPI baseline next to `pingpong --api mp`.
 *
 * Half round trip of MPI_Send/MPI_Recv between two ranks, with host buffers, or with device
 * buffers staged through pinned host memory the way users of a non-CUDA-aware MPI write it:
 * cuMemcpyDtoH -> MPI_Send, MPI_Recv -> cuMemcpyHtoD, per message. The CUDA driver is loaded
 * at run time (dlopen), so only mpicc is needed to build it:
 *
 *   mpicc -O2 -o mpi_pingpong benches/mpi_pingpong.c -ldl
 *   mpirun --allow-run-as-root -np 2 ./mpi_pingpong --mem host|device --sizes 8,4096 --iters 20000 [--json]
 *
 * Prints a table like pingpong's, or with --json one JSON line per size (the fields pingpong
 * --json uses, plus "impl":"openmpi" and "staged"): medians and percentiles of per-iteration
 * samples after warm-up iterations.
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
static CUresult (*cuCtxSetCurrent)(void *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemAllocHost)(void **, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);

static void die(const char *what) {
    fprintf(stderr, "mpi_pingpong: %s\n", what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

#define CU(x) do { if ((x) != 0) die(#x " failed"); } while (0)

static void load_cuda(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) die("--mem device needs the CUDA driver (libcuda.so.1)");
#define SYM(v, name) do { *(void **)&v = dlsym(h, name); if (!v) die("missing " name); } while (0)
    SYM(cuInit, "cuInit");
    SYM(cuDeviceGet, "cuDeviceGet");
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuMemAlloc, "cuMemAlloc_v2");
    SYM(cuMemAllocHost, "cuMemAllocHost_v2");
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    int dev;
    void *ctx;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) die("run with exactly 2 ranks");
    int device = 0, json = 0;
    long iters = 20000, warm = 1000;
    char sizes_arg[256] = "8,4096";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mem") && i + 1 < argc) device = !strcmp(argv[++i], "device");
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warm = atol(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) snprintf(sizes_arg, sizeof sizes_arg, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else die("usage: mpi_pingpong [--mem host|device] [--sizes a,b,..] [--iters N] [--warmup N] [--json]");
    }
    if (iters < 1) die("--iters must be at least 1");
    if (device) load_cuda();
    size_t max = 0;
    for (char *p = sizes_arg; *p;) {
        size_t s = strtoull(p, &p, 10);
        if (s > max) max = s;
        if (*p == ',') p++;
        else if (*p) die("bad --sizes");
    }
    if (max == 0) max = 1;
    /* Host buffers (pinned when staging, as a careful user would), device buffers. */
    char *sh, *rh;
    CUdeviceptr sd = 0, rd = 0;
    if (device) {
        CU(cuMemAllocHost((void **)&sh, max));
        CU(cuMemAllocHost((void **)&rh, max));
        CU(cuMemAlloc(&sd, max));
        CU(cuMemAlloc(&rd, max));
    } else {
        sh = malloc(max);
        rh = malloc(max);
        if (!sh || !rh) die("out of memory");
    }
    memset(sh, rank + 1, max);
    double *t = malloc(sizeof(double) * (size_t)(warm + iters));
    if (!t) die("out of memory");
    if (rank == 0 && !json) {
        printf("# mpi_pingpong: Open MPI send/recv, mem %s%s\n", device ? "device" : "host",
               device ? " (staged through pinned host memory)" : "");
        printf("%10s %10s %10s %10s %10s %10s\n", "bytes", "iters", "t_min[us]", "t_p50[us]", "t_avg[us]", "t_p99[us]");
    }
    for (char *p = sizes_arg; *p;) {
        size_t bytes = strtoull(p, &p, 10);
        if (*p == ',') p++;
        int peer = 1 - rank;
        MPI_Barrier(MPI_COMM_WORLD);
        for (long i = 0; i < warm + iters; i++) {
            double t0 = MPI_Wtime();
            if (rank == 0) {
                if (device) CU(cuMemcpyDtoH(sh, sd, bytes));
                MPI_Send(sh, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                MPI_Recv(rh, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (device) CU(cuMemcpyHtoD(rd, rh, bytes));
            } else {
                MPI_Recv(rh, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (device) CU(cuMemcpyHtoD(rd, rh, bytes));
                if (device) CU(cuMemcpyDtoH(sh, sd, bytes));
                MPI_Send(sh, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            }
            t[i] = (MPI_Wtime() - t0) * 1e6 / 2.0;
        }
        if (rank == 0) {
            double *s = t + warm;
            double sum = 0;
            for (long i = 0; i < iters; i++) sum += s[i];
            qsort(s, (size_t)iters, sizeof(double), cmp);
            double p50 = s[(iters - 1) / 2], avg = sum / (double)iters, p99 = s[(long)((double)(iters - 1) * 0.99)];
            if (json)
                printf("{\"impl\":\"openmpi\",\"op\":\"send\",\"mem\":\"%s\",\"staged\":%s,\"bytes\":%zu,"
                       "\"iters\":%ld,\"t_min_us\":%.3f,\"t_p50_us\":%.3f,\"t_avg_us\":%.3f,\"t_p99_us\":%.3f}\n",
                       device ? "device" : "host", device ? "true" : "false", bytes, iters, s[0], p50, avg, p99);
            else
                printf("%10zu %10ld %10.3f %10.3f %10.3f %10.3f\n", bytes, iters, s[0], p50, avg, p99);
            fflush(stdout);
        }
    }
    free(t);
    MPI_Finalize();
    return 0;
}
