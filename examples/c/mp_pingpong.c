/* mp_pingpong.c: a LibMP-style ping-pong between two ranks through mp.h, then a window put
 * with a flag word the receiver waits for (mp_wait32), and a put with signal. With --stream host or --stream cuda the
 * sends and puts are posted on a stream (LibMP's *_on_stream family): the library's host
 * stream, or a CUDA stream of the program's own on GPU 0 (made through the CUDA driver,
 * loaded at run time: no CUDA headers or toolkit needed to build).
 *
 * The ranks are processes. Started alone, it starts two copies of itself (with GDSYNC_RANK,
 * GDSYNC_SIZE, GDSYNC_ROOT and GDSYNC_JOB_SECRET set) and waits for them; under mpirun or
 * srun each rank finds its rank and size in the launcher's environment (export the same
 * GDSYNC_JOB_SECRET to every rank). No MPI library is needed.
 *
 *   cc -std=c99 -O2 mp_pingpong.c $(pkg-config --cflags --libs gdasync) -ldl -o mp_pingpong
 *   ./mp_pingpong [ROUNDS] [--stream host|cuda]
 *
 * Built with -DUSE_MPI (mpicc), it starts as a LibMP program does: MPI_Init, then
 * mp_init(MPI_COMM_WORLD, ...); run it with mpirun -np 2.
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

#define LEN 64


/* The stream of the sends and puts: NULL for the CPU, else MP_HOST_STREAM or a CUDA stream. */
static struct CUstream_st *stream;

/* A send of len bytes at p to peer: from the CPU, or posted on the stream. */
static void send_to(char *p, int len, int peer, mp_reg_t *reg, mp_request_t *req) {
  if (!stream) {
    CHECK(mp_isend(p, len, peer, reg, req));
    return;
  }
  CHECK(mp_isend_on_stream(p, len, peer, reg, req, stream));
  CHECK(mp_wait_all_on_stream(1, req, stream)); /* the stream waits for its completion */
}

/* Rank 0 sends and waits for the echo; rank 1 echoes. */
static void pingpong(int me, int rounds, char *buf, mp_reg_t *reg) {
  int peer = 1 - me;
  char *out = buf, *in = buf + LEN;
  double start = now_us();
  for (int i = 0; i < rounds; i++) {
    mp_request_t req[2];
    if (me == 0) {
      memset(out, (char)i, LEN);
      CHECK(mp_irecv(in, LEN, peer, reg, &req[0])); /* the receive before the send */
      send_to(out, LEN, peer, reg, &req[1]);
      CHECK(mp_wait_all(2, req));
      if (in[0] != (char)i || in[LEN - 1] != (char)i) {
        fprintf(stderr, "round %d: echo %d\n", i, in[0]);
        exit(1);
      }
    } else {
      CHECK(mp_irecv(in, LEN, peer, reg, &req[0]));
      CHECK(mp_wait(&req[0]));
      memcpy(out, in, LEN);
      send_to(out, LEN, peer, reg, &req[1]);
      CHECK(mp_wait(&req[1]));
    }
  }
  if (me == 0)
    printf("mp.h ping-pong (sends %s): %d round trips of %d bytes between 2 processes, %.2f us half round trip\n",
           !stream ? "from the CPU" : stream == MP_HOST_STREAM ? "on a host stream" : "on a CUDA stream",
           rounds, LEN, (now_us() - start) / rounds / 2);
}

/* Rank 0 puts a message into rank 1's window, then a flag word after it; rank 1 waits for
 * the flag with mp_wait32 (one connection delivers in order: the data is there). */
static void put_and_flag(int me, char *buf, mp_reg_t *reg) {
  static const char message[] = "put into rank 1's window through mp.h";
  uint32_t *win_mem = calloc(32, sizeof(uint32_t)); /* word 0: the flag; bytes 16..: data; 64: a signal; 72..: data */
  mp_window_t win;
  mp_request_t req[2];
  if (!win_mem) exit(1);
  CHECK(mp_window_create(win_mem, 32 * sizeof(uint32_t), &win));
  if (me == 0) {
    uint32_t *flag = (uint32_t *)buf;
    memcpy(buf + 16, message, sizeof message);
    *flag = 1;
    if (stream) {
      CHECK(mp_iput_on_stream(buf + 16, (int)sizeof message, reg, 1, 16, &win, &req[0], 0, stream));
      /* The flag through LibMP's split: prepared now, posted on the stream after the data. */
      CHECK(mp_put_prepare(flag, 4, reg, 1, 0, &win, &req[1], 0));
      CHECK(mp_iput_post_on_stream(&req[1], stream));
      CHECK(mp_wait_on_stream(&req[1], stream));
    } else {
      CHECK(mp_iput(buf + 16, (int)sizeof message, reg, 1, 16, &win, &req[0], 0));
      CHECK(mp_iput(flag, 4, reg, 1, 0, &win, &req[1], 0));
    }
    CHECK(mp_wait_all(2, req));
    /* The message again at byte 72, with a signal (2) at byte 64 written after it. */
    uint64_t *signal = (uint64_t *)(buf + 8);
    *signal = 2;
    if (stream)
      CHECK(mp_iput_signal_on_stream(buf + 16, (int)sizeof message, reg, 1, 72, &win, signal, reg, 64, &req[0], stream));
    else
      CHECK(mp_iput_signal(buf + 16, (int)sizeof message, reg, 1, 72, &win, signal, reg, 64, &req[0]));
    CHECK(mp_wait(&req[0]));
  } else {
    CHECK(mp_wait32(&win_mem[0], 1, MP_WAIT_EQ));
    if (memcmp((char *)win_mem + 16, message, sizeof message) != 0) {
      fprintf(stderr, "the put did not land\n");
      exit(1);
    }
    printf("mp.h window: rank 1 saw the flag, then \"%s\"\n", (char *)win_mem + 16);
    CHECK(mp_wait32(&win_mem[16], 2, MP_WAIT_EQ)); /* the signal's low half (little-endian) */
    if (memcmp((char *)win_mem + 72, message, sizeof message) != 0) {
      fprintf(stderr, "the put with signal did not land before its signal\n");
      exit(1);
    }
    printf("mp.h put with signal: rank 1 saw the signal, and the data before it\n");
  }
  CHECK(mp_barrier());
  CHECK(mp_window_destroy(&win));
  free(win_mem);
}

int main(int argc, char **argv) {
  int rounds = 1000, gpu = -1;
  const char *on = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--stream") == 0 && i + 1 < argc) on = argv[++i];
    else if (atoi(argv[i]) > 0) rounds = atoi(argv[i]);
    else { fprintf(stderr, "usage: %s [ROUNDS] [--stream host|cuda]\n", argv[0]); return 2; }
  }
#ifdef USE_MPI
  MPI_Init(&argc, &argv);
#else
  if (!launched_by_someone()) return launch(argv, 2);
#endif
  int version = 0, me = 0, size = 0;
  CHECK(mp_query_param(MP_PARAM_VERSION, &version));
  if (!MP_API_VERSION_COMPATIBLE(version)) return 1;
  if (on && strcmp(on, "cuda") == 0) {
    const char *why = NULL;
    stream = cuda_stream_on_gpu0(&why);
    if (!stream) { fprintf(stderr, "--stream cuda: %s\n", why); exit(1); }
    gpu = 0;
  } else if (on && strcmp(on, "host") == 0) {
    stream = MP_HOST_STREAM;
  } else if (on) {
    fprintf(stderr, "--stream host or --stream cuda, not %s\n", on);
    return 2;
  }
#ifdef USE_MPI
  CHECK(mp_init(MPI_COMM_WORLD, NULL, 0, MP_INIT_DEFAULT, gpu));
#else
  CHECK(mp_init_env(MP_INIT_DEFAULT, gpu));
#endif
  CHECK(mp_query_rank(&me, &size));
  if (size != 2) { fprintf(stderr, "run it with 2 ranks, not %d\n", size); return 1; }
  char *buf = calloc(1, 2 * LEN);
  mp_reg_t reg;
  if (!buf) return 1;
  CHECK(mp_register(buf, 2 * LEN, &reg));
  pingpong(me, rounds, buf, &reg);
  put_and_flag(me, buf, &reg);
  CHECK(mp_deregister(&reg));
  CHECK(mp_finalize());
  /* After mp_finalize every call fails with a message, none crashes. */
  if (mp_barrier() != MP_FAILURE || strstr(mp_last_error(), "finalized") == NULL) {
    fprintf(stderr, "a call after mp_finalize: %s\n", mp_last_error());
    return 1;
  }
  free(buf);
#ifdef USE_MPI
  MPI_Finalize();
#endif
  return 0;
}
