/* example.h: what the C examples share. CHECK(call) exits with the library's last error when a
 * call fails (mp_last_error() after mp.h, gdasync_last_error() after gdasync.h); now_us() reads
 * the monotonic clock. For the mp.h examples without USE_MPI, launch(argv, n) starts the ranks
 * on this host: n copies of the program (with GDSYNC_RANK, GDSYNC_SIZE, GDSYNC_ROOT on a free
 * loopback port and a fresh GDSYNC_JOB_SECRET set), and waits for them;
 * launched_by_someone() says whether this process is already a rank (started by launch,
 * mpirun, PMI or srun). cuda_driver_on_gpu0() loads the CUDA driver with GPU 0's context current;
 * cuda_stream_on_gpu0() makes a CUDA stream for the mp.h examples' --stream cuda. Header-only: the examples include it with #include "example.h" (after
 * mp.h or gdasync.h) and need nothing else to build. */
#ifndef GDASYNC_EXAMPLES_EXAMPLE_H
#define GDASYNC_EXAMPLES_EXAMPLE_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(MP_SUCCESS)
#define CHECK(call)                                                        \
  do {                                                                     \
    if ((call) != MP_SUCCESS) {                                            \
      fprintf(stderr, "%s failed: %s\n", #call, mp_last_error());          \
      exit(1);                                                             \
    }                                                                      \
  } while (0)
#elif defined(GDASYNC_H)
#define CHECK(call)                                                                                  \
  do {                                                                                               \
    int rc_ = (call);                                                                                \
    if (rc_ != GDASYNC_OK) {                                                                         \
      fprintf(stderr, "%s failed: %s: %s\n", #call, gdasync_status_name(rc_), gdasync_last_error()); \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)
#endif

static inline double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

#include <dlfcn.h>
/* The CUDA driver API, loaded at run time (declared here: no CUDA headers or toolkit needed to
 * build), with GPU 0's primary context made current on this thread: the library's handle for
 * dlsym, or NULL where there is no CUDA driver or GPU (why says which). */
static inline void *cuda_driver_on_gpu0(const char **why) {
  typedef int (*init_t)(unsigned);
  typedef int (*count_t)(int *);
  typedef int (*retain_t)(void **, int);
  typedef int (*set_t)(void *);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  void *ctx = NULL;
  int gpus = 0;
  *why = "no CUDA driver (libcuda.so.1)";
  if (!lib) return NULL;
  init_t init = (init_t)dlsym(lib, "cuInit");
  count_t count = (count_t)dlsym(lib, "cuDeviceGetCount");
  retain_t retain = (retain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
  set_t set = (set_t)dlsym(lib, "cuCtxSetCurrent");
  *why = "no GPU";
  if (!init || !count || init(0) || count(&gpus) || gpus < 1) return NULL;
  *why = "could not make GPU 0's primary context current";
  if (!retain || !set || retain(&ctx, 0) || set(ctx)) return NULL;
  return lib;
}

#if defined(MP_SUCCESS)
/* A CUDA stream on GPU 0 for mp.h's stream calls; NULL where there is no CUDA driver or GPU
 * (why says which). */
static inline struct CUstream_st *cuda_stream_on_gpu0(const char **why) {
  typedef int (*create_t)(struct CUstream_st **, unsigned);
  struct CUstream_st *s = NULL;
  void *lib = cuda_driver_on_gpu0(why);
  if (!lib) return NULL;
  create_t create = (create_t)dlsym(lib, "cuStreamCreate");
  *why = "could not make a CUDA stream on GPU 0";
  /* CU_STREAM_NON_BLOCKING = 1 */
  if (!create || create(&s, 1)) return NULL;
  return s;
}
#endif

#if defined(MP_SUCCESS) && !defined(USE_MPI)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define LAUNCH_MAX_RANKS 16

static int launched_by_someone(void) {
  return getenv("GDSYNC_RANK") || getenv("OMPI_COMM_WORLD_RANK") || getenv("PMI_RANK") || getenv("SLURM_PROCID");
}

/* Starts n ranks of this program (argv as given) and waits for them: 0 when all succeeded. */
static int launch(char **argv, int n) {
  unsigned char key[32];
  char secret[65], root[32], size[8];
  if (n < 1 || n > LAUNCH_MAX_RANKS) { fprintf(stderr, "launch: 1 to %d ranks, not %d\n", LAUNCH_MAX_RANKS, n); return 1; }
  FILE *r = fopen("/dev/urandom", "rb");
  if (!r || fread(key, 1, sizeof key, r) != sizeof key) { perror("/dev/urandom"); return 1; }
  fclose(r);
  for (int i = 0; i < 32; i++) snprintf(secret + 2 * i, 3, "%02x", key[i]);
  /* A free loopback port for rank 0 to listen on. */
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  socklen_t alen = sizeof a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &alen)) {
    perror("picking a port");
    return 1;
  }
  snprintf(root, sizeof root, "127.0.0.1:%d", ntohs(a.sin_port));
  snprintf(size, sizeof size, "%d", n);
  close(s);
  pid_t pids[LAUNCH_MAX_RANKS];
  for (int rank = 0; rank < n; rank++) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      char rs[8];
      snprintf(rs, sizeof rs, "%d", rank);
      setenv("GDSYNC_RANK", rs, 1);
      setenv("GDSYNC_SIZE", size, 1);
      setenv("GDSYNC_ROOT", root, 1);
      setenv("GDSYNC_JOB_SECRET", secret, 1);
      execv("/proc/self/exe", argv);
      perror("execv");
      _exit(127);
    }
  }
  int failed = 0;
  for (int rank = 0; rank < n; rank++) {
    int st;
    if (pids[rank] < 0 || waitpid(pids[rank], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d failed\n", rank);
      failed = 1;
    }
  }
  return failed;
}

#endif /* MP_SUCCESS && !USE_MPI */

#endif /* GDASYNC_EXAMPLES_EXAMPLE_H */
