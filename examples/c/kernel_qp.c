/* kernel_qp.c: a CUDA kernel drives queue pairs made through gdasync.h.
 *
 * The CPU makes two QPs on the soft device, connects them and hands both to GPU kernels
 * (gdasync_qp_to_kernel). One kernel thread then runs ROUNDS rounds: it fills a 64-byte message,
 * RDMA-writes it with an immediate (the round) from QP a into QP b's buffer, waits for the
 * write's completion on a's send CQ and for the immediate on b's receive CQ, and checks the bytes.
 * The kernel is compiled at run time by NVRTC after gdsync.cuh (installed beside gdasync.h); the
 * CUDA driver and NVRTC are loaded at run time, so building needs no CUDA toolkit or headers.
 * Back on the CPU, the QPs are taken back (gdasync_qp_to_host) and the CPU writes once more.
 * Without a GPU it prints "skipped: no GPU" and exits 0.
 *
 *   cc -std=c99 -O2 kernel_qp.c $(pkg-config --cflags --libs gdasync) -ldl \
 *      -DGDASYNC_INCLUDE_DIR="\"$(pkg-config --variable=includedir gdasync)\"" -o kernel_qp
 *   ./kernel_qp [ROUNDS]
 *
 * GDASYNC_INCLUDE_DIR in the environment overrides where gdsync.cuh is read from.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <gdasync.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"

#ifndef GDASYNC_INCLUDE_DIR
#define GDASYNC_INCLUDE_DIR "/usr/local/include"
#endif

#define MSG 64

/* The kernel: one thread drives both QPs (a writes, b receives the immediate). Waits time out
 * after 2 s, so a lost completion ends the kernel with an error instead of a hang. */
static const char *KERNEL_SRC =
    "#include \"gdsync.cuh\"\n"
    "// aptr/bptr: the buffers as this kernel addresses them; aaddr/baddr: as the NIC does.\n"
    "extern \"C\" __global__ void drive(gds_qp a0, gds_qp b0, uint64_t aptr, uint64_t aaddr, uint32_t alkey,\n"
    "                                  uint64_t bptr, uint64_t baddr, uint32_t blkey, uint32_t brkey,\n"
    "                                  uint64_t rounds, uint64_t out) {\n"
    "  if (threadIdx.x != 0 || blockIdx.x != 0) return;\n"
    "  gds_qp a = a0, b = b0;\n"
    "  gds_wc wc;\n"
    "  int rc = GDS_OK;\n"
    "  uint64_t i = 0, bad = 0;\n"
    "  for (; i < rounds && rc == GDS_OK; i++) {\n"
    "    // 8-byte words: each load of host memory from the GPU is a round trip over PCIe.\n"
    "    volatile uint64_t *src = (volatile uint64_t *)aptr;\n"
    "    for (uint32_t k = 0; k < 8; k++) src[k] = i * 13 + k;\n"
    "    rc = gds_qp_post_recv(&b, baddr + 2048, 64, blkey);  /* a write with immediate takes a receive */\n"
    "    if (rc == GDS_OK) rc = gds_qp_post_send(&a, GDS_OP_RDMA_WRITE_IMM, aaddr, alkey, 64, baddr, brkey,\n"
    "                                            (uint32_t)i, GDS_SIGNALED);\n"
    "    if (rc == GDS_OK) rc = gds_cq_wait(&a.send_cq, &wc, 2000000000ull);\n"
    "    if (rc == GDS_OK) rc = gds_cq_wait(&b.recv_cq, &wc, 2000000000ull);\n"
    "    if (rc != GDS_OK) break;\n"
    "    bad += wc.opcode != GDS_WC_RECV_WRITE_IMM || wc.imm != (uint32_t)i;\n"
    "    volatile uint64_t *dst = (volatile uint64_t *)bptr;\n"
    "    for (uint32_t k = 0; k < 8; k++) bad += dst[k] != i * 13 + k;\n"
    "  }\n"
    "  volatile uint64_t *o = (volatile uint64_t *)out;\n"
    "  o[0] = (uint32_t)rc;\n"
    "  o[1] = bad;\n"
    "  o[2] = i;\n"
    "  __threadfence_system();\n"
    "}\n";

/* The few CUDA driver and NVRTC calls used, declared here (no toolkit headers needed). */
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_attr_t)(int *, int, int);
typedef int (*cu_host_alloc_t)(void **, size_t, unsigned);
typedef int (*cu_host_devptr_t)(unsigned long long *, void *, unsigned);
typedef int (*cu_module_load_t)(void **, const void *);
typedef int (*cu_module_fn_t)(void **, void *, const char *);
typedef int (*cu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **);
typedef int (*cu_sync_t)(void);
typedef int (*rtc_create_t)(void **, const char *, const char *, int, const char *const *, const char *const *);
typedef int (*rtc_compile_t)(void *, int, const char *const *);
typedef int (*rtc_size_t)(void *, size_t *);
typedef int (*rtc_get_t)(void *, char *);
typedef int (*rtc_destroy_t)(void **);

static struct {
  cu_device_get_t device_get;
  cu_attr_t attr;
  cu_host_alloc_t host_alloc;
  cu_host_devptr_t host_devptr;
  cu_module_load_t module_load;
  cu_module_fn_t module_fn;
  cu_launch_t launch;
  cu_sync_t sync;
} cu;

static void *sym(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (!f) { fprintf(stderr, "%s: %s\n", name, dlerror()); exit(1); }
  return f;
}

#define CU(call)                                                   \
  do {                                                             \
    int rc_ = (call);                                              \
    if (rc_ != 0) { fprintf(stderr, "%s: CUDA error %d\n", #call, rc_); exit(1); } \
  } while (0)

/* Loads the CUDA driver's calls with GPU 0's primary context current (example.h): 0 where
 * there is no GPU (why says which). */
static int cuda_open(int *major, int *minor, const char **why) {
  void *lib = cuda_driver_on_gpu0(why);
  if (!lib) return 0;
  cu.device_get = (cu_device_get_t)sym(lib, "cuDeviceGet");
  cu.attr = (cu_attr_t)sym(lib, "cuDeviceGetAttribute");
  cu.host_alloc = (cu_host_alloc_t)sym(lib, "cuMemHostAlloc");
  cu.host_devptr = (cu_host_devptr_t)sym(lib, "cuMemHostGetDevicePointer_v2");
  cu.module_load = (cu_module_load_t)sym(lib, "cuModuleLoadData");
  cu.module_fn = (cu_module_fn_t)sym(lib, "cuModuleGetFunction");
  cu.launch = (cu_launch_t)sym(lib, "cuLaunchKernel");
  cu.sync = (cu_sync_t)sym(lib, "cuCtxSynchronize");
  int dev;
  CU(cu.device_get(&dev, 0));
  CU(cu.attr(major, 75, dev)); /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  CU(cu.attr(minor, 76, dev)); /* ..._MINOR */
  return 1;
}

/* The whole of a file, NUL-terminated. */
static char *slurp(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) { fprintf(stderr, "%s: cannot open (is gdasync installed with its CUDA header? set GDASYNC_INCLUDE_DIR)\n", path); exit(1); }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)len + 1);
  if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) { fprintf(stderr, "%s: read failed\n", path); exit(1); }
  text[len] = 0;
  fclose(f);
  return text;
}

/* Compiles KERNEL_SRC with NVRTC for compute capability major.minor: the PTX. */
static char *compile(int major, int minor) {
  const char *names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW);
  if (!lib) { fprintf(stderr, "NVRTC (libnvrtc.so) is not installed: the kernel cannot be compiled\n"); exit(1); }
  const char *dir = getenv("GDASYNC_INCLUDE_DIR") ? getenv("GDASYNC_INCLUDE_DIR") : GDASYNC_INCLUDE_DIR;
  const char *hdr_names[] = {"gdsync.cuh", "gdsync_format.h"};
  const char *hdrs[] = {slurp(dir, hdr_names[0]), slurp(dir, hdr_names[1])};
  void *prog = NULL;
  if (((rtc_create_t)sym(lib, "nvrtcCreateProgram"))(&prog, KERNEL_SRC, "kernel_qp.cu", 2, hdrs, hdr_names) != 0) {
    fprintf(stderr, "nvrtcCreateProgram failed\n");
    exit(1);
  }
  char arch[64];
  snprintf(arch, sizeof arch, "--gpu-architecture=compute_%d%d", major, minor);
  const char *opts[] = {arch, "-std=c++17"};
  int rc = ((rtc_compile_t)sym(lib, "nvrtcCompileProgram"))(prog, 2, opts);
  size_t n = 0;
  ((rtc_size_t)sym(lib, "nvrtcGetProgramLogSize"))(prog, &n);
  if (rc != 0) {
    char *log = malloc(n + 1);
    ((rtc_get_t)sym(lib, "nvrtcGetProgramLog"))(prog, log);
    fprintf(stderr, "NVRTC could not compile the kernel:\n%s\n", log);
    exit(1);
  }
  ((rtc_size_t)sym(lib, "nvrtcGetPTXSize"))(prog, &n);
  char *ptx = malloc(n);
  ((rtc_get_t)sym(lib, "nvrtcGetPTX"))(prog, ptx);
  ((rtc_destroy_t)sym(lib, "nvrtcDestroyProgram"))(&prog);
  free((void *)hdrs[0]);
  free((void *)hdrs[1]);
  return ptx;
}

/* One side: a QP with its own CQs, and pinned memory registered for it. */
struct side {
  gdasync_cq *send_cq, *recv_cq;
  gdasync_qp *qp;
  gdasync_mr *mr;
  gdasync_mr_info info;
  uint8_t *buf;             /* host address */
  unsigned long long gpu;   /* the same memory, as the GPU addresses it */
  gdasync_kernel_qp desc;   /* the QP, as a kernel drives it */
};

static void open_side(gdasync_device *dev, gdasync_pd *pd, struct side *s) {
  CHECK(gdasync_cq_create(dev, 256, &s->send_cq));
  CHECK(gdasync_cq_create(dev, 256, &s->recv_cq));
  CHECK(gdasync_qp_create(pd, s->send_cq, s->recv_cq, NULL, &s->qp));
  /* CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP: pinned, and mapped for the GPU. */
  CU(cu.host_alloc((void **)&s->buf, 4096, 1 | 2));
  CU(cu.host_devptr(&s->gpu, s->buf, 0));
  memset(s->buf, 0, 4096);
  CHECK(gdasync_mr_reg(pd, s->buf, 4096, GDASYNC_ACCESS_LOCAL_WRITE | GDASYNC_ACCESS_REMOTE_WRITE, &s->mr));
  CHECK(gdasync_mr_query(s->mr, &s->info));
}

static void connect_sides(struct side *a, struct side *b) {
  char ea[GDASYNC_ENDPOINT_MAX], eb[GDASYNC_ENDPOINT_MAX];
  CHECK(gdasync_qp_endpoint(a->qp, ea, sizeof ea));
  CHECK(gdasync_qp_endpoint(b->qp, eb, sizeof eb));
  CHECK(gdasync_qp_connect(a->qp, eb));
  CHECK(gdasync_qp_connect(b->qp, ea));
}

/* The CPU's write with immediate from a to b once the QPs are back: its completions polled. */
static void cpu_write(struct side *a, struct side *b) {
  gdasync_sge dst = {b->info.addr + 2048, 64, b->info.lkey};
  CHECK(gdasync_qp_post_recv(b->qp, 7, &dst, 1, NULL));
  memset(a->buf, 0x5a, MSG);
  gdasync_sge src = {a->info.addr, MSG, a->info.lkey};
  gdasync_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 8;
  wr.opcode = GDASYNC_WR_RDMA_WRITE_WITH_IMM;
  wr.flags = GDASYNC_SEND_SIGNALED;
  wr.sg_list = &src;
  wr.num_sge = 1;
  wr.imm_data = 0xC0FFEE;
  wr.remote_addr = b->info.addr;
  wr.rkey = b->info.rkey;
  CHECK(gdasync_qp_post_send(a->qp, &wr, NULL));
  gdasync_wc wc;
  if (gdasync_cq_wait(a->send_cq, &wc, 2000) != GDASYNC_OK || wc.status != GDASYNC_WC_SUCCESS) {
    fprintf(stderr, "the CPU's write did not complete: %s\n", gdasync_last_error());
    exit(1);
  }
  if (gdasync_cq_wait(b->recv_cq, &wc, 2000) != GDASYNC_OK || wc.status != GDASYNC_WC_SUCCESS || wc.imm_data != 0xC0FFEE || b->buf[MSG - 1] != 0x5a) {
    fprintf(stderr, "the CPU's write did not arrive intact: %s\n", gdasync_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  unsigned long long rounds = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000;
  int major = 0, minor = 0;
  if (argc > 2 || rounds == 0) { fprintf(stderr, "usage: %s [ROUNDS]\n", argv[0]); return 2; }
  const char *why = "";
  if (!cuda_open(&major, &minor, &why)) {
    /* No driver or no GPU: nothing to run here. A GPU whose context cannot be made: a failure. */
    if (strncmp(why, "no ", 3) != 0) { fprintf(stderr, "CUDA: %s\n", why); return 1; }
    printf("skipped: no GPU (%s)\n", why);
    return 0;
  }
  char *ptx = compile(major, minor);
  void *module = NULL, *fn = NULL;
  CU(cu.module_load(&module, ptx));
  CU(cu.module_fn(&fn, module, "drive"));

  gdasync_device *dev;
  gdasync_pd *pd;
  struct side a, b;
  CHECK(gdasync_device_open("soft", &dev));
  CHECK(gdasync_pd_alloc(dev, &pd));
  open_side(dev, pd, &a);
  open_side(dev, pd, &b);
  connect_sides(&a, &b);
  CHECK(gdasync_qp_to_kernel(a.qp, &a.desc));
  CHECK(gdasync_qp_to_kernel(b.qp, &b.desc));
  uint32_t mapped = 0;
  CHECK(gdasync_qp_kernel_gpu_mapped(a.qp, &mapped));
  if (!mapped) { fprintf(stderr, "the QP's rings are not mapped for the GPU\n"); return 1; }

  uint64_t *out;
  unsigned long long out_gpu;
  CU(cu.host_alloc((void **)&out, 64, 1 | 2));
  CU(cu.host_devptr(&out_gpu, out, 0));
  memset(out, 0xff, 64);
  unsigned long long aaddr = a.info.addr, baddr = b.info.addr;
  uint32_t alkey = a.info.lkey, blkey = b.info.lkey, brkey = b.info.rkey;
  void *params[] = {&a.desc, &b.desc, &a.gpu, &aaddr, &alkey, &b.gpu, &baddr, &blkey, &brkey, &rounds, &out_gpu};
  double t0 = now_us();
  CU(cu.launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
  CU(cu.sync());
  double took = now_us() - t0;
  if (out[0] != 0 || out[1] != 0 || out[2] != rounds) {
    fprintf(stderr, "kernel: status %llu, %llu bad words or immediates, %llu of %llu rounds\n",
            (unsigned long long)out[0], (unsigned long long)out[1], (unsigned long long)out[2], rounds);
    return 1;
  }
  gdasync_kernel_progress p;
  CHECK(gdasync_qp_kernel_progress(a.qp, &p));
  if (p.sends_posted != rounds || p.sends_retired != rounds) {
    fprintf(stderr, "progress of a: %llu sends posted, %llu retired\n", (unsigned long long)p.sends_posted,
            (unsigned long long)p.sends_retired);
    return 1;
  }
  printf("a CUDA kernel drove 2 QPs made through gdasync.h: %llu RDMA writes with immediate, checked, %.2f us each\n",
         rounds, took / (double)rounds);
  CHECK(gdasync_qp_to_host(a.qp));
  CHECK(gdasync_qp_to_host(b.qp));
  cpu_write(&a, &b);
  printf("back on the CPU: a write with immediate, checked\n");
  struct side *sides[] = {&a, &b};
  for (int i = 0; i < 2; i++) {
    CHECK(gdasync_qp_destroy(sides[i]->qp));
    CHECK(gdasync_mr_dereg(sides[i]->mr));
    CHECK(gdasync_cq_destroy(sides[i]->send_cq));
    CHECK(gdasync_cq_destroy(sides[i]->recv_cq));
  }
  CHECK(gdasync_pd_free(pd));
  CHECK(gdasync_device_close(dev));
  return 0;
}
