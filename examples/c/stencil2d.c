/* stencil2d.c: a 2D Jacobi stencil (each interior point becomes the mean of its four
 * neighbours, the outer edge fixed) on an N x N grid split into bands of rows, one band a rank,
 * with the halo rows exchanged between neighbouring ranks through mp.h (mp_irecv, mp_isend,
 * mp_wait_all) every iteration. At the end each rank compares its band with the same sweeps run
 * serially on the whole grid: they must agree to the bit.
 *
 * With --stream host the halo sends are prepared (mp_send_prepare) and posted on a stream in one
 * call (mp_isend_post_all_on_stream), and the stream waits for the sends and the receives
 * (mp_wait_all_on_stream), as a GPU code would queue its next sweep behind them; the CPU then
 * releases the requests with mp_wait_all. With --stream cuda the stream is a CUDA stream of
 * the program's own on GPU 0 (made through the CUDA driver, loaded at run time: no CUDA headers
 * or toolkit needed to build); without a GPU it prints "skipped: no GPU" and exits 0.
 *
 * The ranks are processes. Started alone, it starts --ranks copies of itself (default 2); under
 * mpirun or srun each rank finds its rank and size in the launcher's environment (export the
 * same GDSYNC_JOB_SECRET to every rank). No MPI library is needed.
 *
 *   cc -std=c99 -O2 stencil2d.c $(pkg-config --cflags --libs gdasync) -o stencil2d
 *   ./stencil2d [--n N] [--iters K] [--ranks R] [--stream host|cuda]
 *
 * Built with -DUSE_MPI (mpicc), it starts as a LibMP program does: MPI_Init, then
 * mp_init(MPI_COMM_WORLD, ...); run it with mpirun -np R.
 */
#define _POSIX_C_SOURCE 200809L
#ifdef USE_MPI
#include <mpi.h> /* before mp.h: mp.h then defines LibMP's mp_init(MPI_Comm, ...) */
#endif
#include <mp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "example.h"

/* The grid's starting value at global row i, column j (edges included): varied enough that a
 * halo row taken from the wrong place or the wrong iteration changes the result. */
static double initial(int i, int j) { return (double)((i * 7 + j * 13) % 17) / 16.0 + (double)i / 1024.0; }

/* One Jacobi sweep over rows 1..rows of a grid with cols interior columns (cols + 2 wide):
 * out gets the mean of in's four neighbours. The same code serves the bands and the serial
 * reference, so equal inputs give equal bits. */
static void sweep(const double *in, double *out, int rows, int cols) {
  int w = cols + 2;
  for (int i = 1; i <= rows; i++)
    for (int j = 1; j <= cols; j++)
      out[i * w + j] = (in[(i - 1) * w + j] + in[(i + 1) * w + j] + in[i * w + j - 1] + in[i * w + j + 1]) * 0.25;
}

/* The whole grid after iters sweeps, computed by this process alone. */
static double *serial(int n, int iters) {
  int w = n + 2;
  double *a = malloc(sizeof(double) * w * w), *b = malloc(sizeof(double) * w * w);
  if (!a || !b) exit(1);
  for (int i = 0; i < w; i++)
    for (int j = 0; j < w; j++) a[i * w + j] = b[i * w + j] = initial(i, j);
  for (int k = 0; k < iters; k++) {
    sweep(a, b, n, n);
    double *t = a;
    a = b;
    b = t;
  }
  free(b);
  return a;
}

/* The stream of the halo sends: NULL for the CPU, MP_HOST_STREAM, or a CUDA stream. */
static struct CUstream_st *stream;

/* Exchanges the halo rows of grid g (rows + 2 rows of w doubles, inside reg) with the ranks
 * above (up) and below (down); -1 where there is none. */
static void exchange(double *g, int rows, int w, int up, int down, mp_reg_t *reg) {
  mp_request_t req[4];
  uint32_t n = 0;
  int bytes = (int)(sizeof(double) * w);
  /* The receives first: a send goes out once its receive is posted. */
  if (up >= 0) CHECK(mp_irecv(&g[0], bytes, up, reg, &req[n++]));
  if (down >= 0) CHECK(mp_irecv(&g[(rows + 1) * w], bytes, down, reg, &req[n++]));
  if (!stream) {
    if (up >= 0) CHECK(mp_isend(&g[w], bytes, up, reg, &req[n++]));
    if (down >= 0) CHECK(mp_isend(&g[rows * w], bytes, down, reg, &req[n++]));
  } else {
    /* LibMP's split: prepare the sends, post them on the stream in one call. */
    uint32_t first = n;
    if (up >= 0) CHECK(mp_send_prepare(&g[w], bytes, up, reg, &req[n++]));
    if (down >= 0) CHECK(mp_send_prepare(&g[rows * w], bytes, down, reg, &req[n++]));
    if (n > first) CHECK(mp_isend_post_all_on_stream(n - first, &req[first], stream));
    if (n) CHECK(mp_wait_all_on_stream(n, req, stream));
  }
  if (n) CHECK(mp_wait_all(n, req));
}

/* Runs iters sweeps on this rank's band and checks it against the serial grid: 0 if equal. */
static int run(int me, int size, int n, int iters) {
  int w = n + 2, lo = me * n / size, rows = (me + 1) * n / size - lo;
  int up = me > 0 ? me - 1 : -1, down = me + 1 < size ? me + 1 : -1;
  size_t cells = (size_t)(rows + 2) * w;
  double *mem = malloc(2 * cells * sizeof(double)), *a = mem, *b = mem + cells;
  mp_reg_t reg;
  if (!mem) return 1;
  /* Band row r is global row lo + r (row 0 and row rows + 1: halo, or the fixed edge). */
  for (int r = 0; r < rows + 2; r++)
    for (int j = 0; j < w; j++) a[r * w + j] = b[r * w + j] = initial(lo + r, j);
  CHECK(mp_register(mem, 2 * cells * sizeof(double), &reg));
  CHECK(mp_barrier());
  double start = now_us();
  for (int k = 0; k < iters; k++) {
    exchange(a, rows, w, up, down, &reg);
    sweep(a, b, rows, n);
    double *t = a;
    a = b;
    b = t;
  }
  double per_iter = (now_us() - start) / (iters > 0 ? iters : 1);
  double *ref = serial(n, iters);
  int bad = memcmp(&a[w], &ref[(lo + 1) * w], sizeof(double) * rows * w) != 0;
  if (bad) fprintf(stderr, "rank %d: rows %d..%d differ from the serial sweeps\n", me, lo + 1, lo + rows);
  if (me == 0)
    printf("mp.h stencil2d (halo sends %s): %dx%d grid, %d ranks, %d iterations, %.1f us an iteration; "
           "rank 0's band %s\n",
           !stream ? "from the CPU" : stream == MP_HOST_STREAM ? "on a host stream" : "on a CUDA stream", n, n, size, iters, per_iter, bad ? "DIFFERS from the serial result" : "equals the serial result bit for bit");
  free(ref);
  CHECK(mp_barrier());
  CHECK(mp_deregister(&reg));
  free(mem);
  return bad;
}

int main(int argc, char **argv) {
  int n = 64, iters = 50, ranks = 2, gpu = -1;
  const char *on = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) n = atoi(argv[++i]);
    else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) iters = atoi(argv[++i]);
    else if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) ranks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--stream") == 0 && i + 1 < argc) on = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--n N] [--iters K] [--ranks R] [--stream host|cuda]\n", argv[0]);
      return 2;
    }
  }
  if (n < 1 || n > 4096 || iters < 0) { fprintf(stderr, "--n 1..4096, --iters >= 0\n"); return 2; }
  if (on && strcmp(on, "host") == 0) {
    stream = MP_HOST_STREAM;
  } else if (on && strcmp(on, "cuda") == 0) {
    /* Each rank makes its own (the launcher's probe too: it exits here where there is no GPU). */
    const char *why = NULL;
    stream = cuda_stream_on_gpu0(&why);
    if (!stream && strncmp(why, "could not", 9) != 0) { printf("skipped: no GPU (%s)\n", why); return 0; }
    if (!stream) { fprintf(stderr, "--stream cuda: %s\n", why); return 1; }
    gpu = 0;
  } else if (on) {
    fprintf(stderr, "--stream host or --stream cuda, not %s\n", on);
    return 2;
  }
#ifdef USE_MPI
  (void)ranks;
  MPI_Init(&argc, &argv);
  CHECK(mp_init(MPI_COMM_WORLD, NULL, 0, MP_INIT_DEFAULT, gpu));
#else
  if (!launched_by_someone()) return launch(argv, ranks);
  CHECK(mp_init_env(MP_INIT_DEFAULT, gpu));
#endif
  int me = 0, size = 0;
  CHECK(mp_query_rank(&me, &size));
  if (size > n) { fprintf(stderr, "%d ranks for %d rows: at most one rank a row\n", size, n); return 1; }
  int bad = run(me, size, n, iters);
  CHECK(mp_finalize());
#ifdef USE_MPI
  MPI_Finalize();
#endif
  return bad;
}
