/* mp.h: LibMP's API (version 2.0) on gdasync, so that programs written for LibMP build
 * against libgdasync unchanged where the functions below are all they use; what is not
 * provided (yet) is listed in docs/c.md, as are the differences in behaviour.
 *
 * Written by hand in LibMP's shapes (opaque pointer types, enums, inline helpers); the test
 * capi/tests/header.rs checks that the functions declared here are exactly the mp_ functions
 * the library exports, that the constants have the library's values, and that the header
 * compiles as C99 and C++17 with -Wall -Wextra -Werror -pedantic.
 *
 * Conventions: functions return MP_SUCCESS (0) or MP_FAILURE (1); mp_last_error() holds the
 * message of the last call that failed on the calling thread. A call before mp_init_env (or
 * after mp_finalize) fails with a message saying so. Handles (mp_reg_t, mp_request_t,
 * mp_window_t) are opaque values the library never dereferences: a released, destroyed or
 * foreign handle fails with a message, never undefined behaviour. One thread at a time per
 * process calls mp functions (as with LibMP); their messages are per thread.
 */
#ifndef GDASYNC_MP_H
#define GDASYNC_MP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define MP_SUCCESS 0
#define MP_FAILURE 1

#define MP_API_MAJOR_VERSION 2
#define MP_API_MINOR_VERSION 0
#define MP_API_VERSION ((MP_API_MAJOR_VERSION << 16) | MP_API_MINOR_VERSION)
/* Whether version v has this major version and at least this minor version. */
#define MP_API_VERSION_COMPATIBLE(v) \
  (((int)((unsigned)(v) >> 16) == MP_API_MAJOR_VERSION) && ((int)((unsigned)(v) & 0xffffu) >= MP_API_MINOR_VERSION))

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_param {
  MP_PARAM_VERSION,
  MP_NUM_PARAMS
} mp_param_t;

/* Stores parameter param's value at value (MP_PARAM_VERSION: MP_API_VERSION). */
int mp_query_param(mp_param_t param, int *value);

struct mp_reg;
struct mp_request;
struct mp_window;
/* A registration: released by mp_deregister. */
typedef struct mp_reg *mp_reg_t;
/* An outstanding operation: released by mp_wait or mp_wait_all (each request once). */
typedef struct mp_request *mp_request_t;
/* A window: every rank's exposed region; destroyed by mp_window_destroy. */
typedef struct mp_window *mp_window_t;

/* Init flags. LibMP numbered them 1, 2, 3, 4 and tested them as bit masks (so
 * MP_INIT_TX_CQ_ON_GPU meant WQ_ON_GPU | RX_CQ_ON_GPU); here they are bits. gdasync keeps
 * its queues in pinned host memory mapped for the GPU: the flags are accepted and change
 * nothing; any other bit is refused. */
enum mp_init_flags {
  MP_INIT_DEFAULT = 0,
  MP_INIT_WQ_ON_GPU = 1 << 0,
  MP_INIT_RX_CQ_ON_GPU = 1 << 1,
  MP_INIT_TX_CQ_ON_GPU = 1 << 2,
  MP_INIT_DBREC_ON_GPU = 1 << 3
};

/* Not in LibMP: initialises without MPI, over gdasync's TCP bootstrap. Rank, size, rank 0's
 * address and the job's secret come from the environment: GDSYNC_RANK and GDSYNC_SIZE (or
 * those mpirun, PMI or srun set), GDSYNC_ROOT (default 127.0.0.1:29510) and
 * GDSYNC_JOB_SECRET (64 hex digits, the same in every rank). Collective; every rank is
 * connected to every other. gpu_id: the GPU of stream calls, or -1. The device is the one
 * GDSYNC_DEVICE names, else the first active mlx5 port, else the soft device. */
int mp_init_env(int flags, int gpu_id);

/* Not in LibMP: the two halves of mp_init below, for launchers of other kinds. mp_job_new
 * writes a new job's description (rank 0's address: GDSYNC_ROOT, else a free loopback port,
 * one host; and a fresh secret) into buf of at least MP_JOB_MAX bytes; every rank then calls
 * mp_init_job with rank 0's description. */
#define MP_JOB_MAX 192
int mp_job_new(char *buf, size_t len);
int mp_init_job(int rank, int size, const char *job, int flags, int gpu_id);

/* LibMP's mp_init, when <mpi.h> is included before this header (and MP_NO_MPI_INIT is not
 * defined): MPI carries rank 0's job description to every rank of comm, and the ranks connect
 * over gdasync's TCP bootstrap (MPI is used for nothing else). Every rank of comm connects to
 * every other: peers and count are not needed. Across hosts, set GDSYNC_ROOT on rank 0 to an
 * address the others reach. */
#if defined(MPI_VERSION) && !defined(MP_NO_MPI_INIT)
static inline int mp_init(MPI_Comm comm, int *peers, int count, int flags, int gpu_id) {
  char job[MP_JOB_MAX];
  int rank, size;
  (void)peers;
  (void)count;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS) return MP_FAILURE;
  job[0] = 0;
  if (rank == 0 && mp_job_new(job, sizeof job) != MP_SUCCESS) job[0] = 0;
  if (MPI_Bcast(job, (int)sizeof job, MPI_CHAR, 0, comm) != MPI_SUCCESS) return MP_FAILURE;
  return mp_init_job(rank, size, job, flags, gpu_id);
}
#endif

/* Ends this process's part (collective). LibMP's returned void; this one reports whether a
 * peer failed before the end. */
int mp_finalize(void);

/* Not in LibMP: this process's rank and the number of ranks (either pointer may be NULL). */
int mp_query_rank(int *rank, int *size);

/* Not in LibMP: the message of the last mp call that failed on this thread ("" if none). */
const char *mp_last_error(void);

/* Registers length bytes at addr (host memory, or GPU memory the device reaches) for sends,
 * receives, puts and gets. The memory must stay allocated until mp_deregister, which sets
 * *reg to NULL. */
int mp_register(void *addr, size_t length, mp_reg_t *reg);
int mp_deregister(mp_reg_t *reg);

/* Two-sided messages, matched per peer in posting order (no tags). buf..buf+size must lie
 * inside *mp_reg. A send goes out once the peer has posted a receive for it (credits: a send
 * never meets an empty receive queue, where LibMP relied on RNR retries); a message longer
 * than the receive fails both requests. */
int mp_irecv(void *buf, int size, int peer, mp_reg_t *mp_reg, mp_request_t *req);
int mp_isend(void *buf, int size, int peer, mp_reg_t *mp_reg, mp_request_t *req);

/* Waits on the CPU for requests to complete and releases them. A failed request (its peer
 * gone, an error completion) fails the call with a message naming the peer; waits never
 * block forever (60 s). */
int mp_wait(mp_request_t *req);
int mp_wait_all(uint32_t count, mp_request_t *req);

/* Moves the requests on without blocking: returns how many are complete (still to be
 * released by mp_wait or mp_wait_all), or -1 with mp_last_error() on failure. */
int mp_progress_all(uint32_t count, mp_request_t *req);

/* One-sided: windows are created collectively (every rank, each with its region). */
int mp_window_create(void *addr, size_t size, mp_window_t *window_t);
int mp_window_destroy(mp_window_t *window_t);

enum mp_put_flags {
  /* Accepted: gdasync inlines small payloads from host memory by itself. */
  MP_PUT_INLINE = 1 << 0,
  /* LibMP's unsignalled put, whose request could not be waited for. Here the put is
   * signalled anyway: wait for its request like any other. */
  MP_PUT_NOWAIT = 1 << 1
};

/* Writes size bytes at src (inside *src_reg) into peer's part of *dst_window_t at byte displ,
 * or reads them from it into dst; the bounds are checked against the peer's region. */
int mp_iput(void *src, int size, mp_reg_t *src_reg, int peer, size_t displ, mp_window_t *dst_window_t,
            mp_request_t *req, int flags);
int mp_iget(void *dst, int size, mp_reg_t *dst_reg, int peer, size_t displ, mp_window_t *src_window_t,
            mp_request_t *req);

enum mp_wait_flags {
  MP_WAIT_GEQ = 0, /* until *ptr >= value (unsigned) */
  MP_WAIT_EQ,      /* until *ptr == value (LibMP tested *ptr > value: fixed) */
  MP_WAIT_AND      /* until *ptr & value is not 0 */
};

/* LibMP's vector calls, limited: the nblocks blocks at v (1 to MP_IOV_MAX, inside *mp_reg)
 * must follow one another in memory (each iov_base where the block before ends), and travel as
 * that one buffer; blocks apart are refused with a message (LibMP gathered up to 30 blocks
 * from anywhere in the registration). A receive matches a send of any shape whose size fits. */
#define MP_IOV_MAX 30
int mp_isendv(struct iovec *v, int nblocks, int peer, mp_reg_t *mp_reg, mp_request_t *req);
int mp_irecvv(struct iovec *v, int nblocks, int peer, mp_reg_t *mp_reg, mp_request_t *req);

/* Waits on the CPU until the word at ptr meets value under flags; fails after 60 s. */
int mp_wait32(uint32_t *ptr, uint32_t value, int flags);

/* Not in LibMP (which left barriers to MPI): waits until every rank has called it. */
int mp_barrier(void);

/* The stream family. A stream is the program's own CUDA stream (a cudaStream_t or CUstream,
 * of the primary context of the GPU given to mp_init_env; 0 is the legacy default stream),
 * kept by the library until mp_finalize (it must live that long), or MP_HOST_STREAM. The
 * stream waits (for the peer's credit, for completions) run on the GPU: the CPU is not in the
 * loop. Requests must still be released by mp_wait or mp_wait_all, as in LibMP. */
struct CUstream_st;
/* Not in LibMP: a CPU thread of the library's that runs the lists in order, as a CUDA
 * stream would (for machines without a GPU, and tests). */
#define MP_HOST_STREAM ((struct CUstream_st *)UINTPTR_MAX)

/* Sends from the stream (it waits there for the peer's receive, then rings the doorbell);
 * mp_send_on_stream also makes the stream wait for the send's completion. */
int mp_send_on_stream(void *buf, int size, int peer, mp_reg_t *mp_reg, mp_request_t *req,
                      struct CUstream_st *stream);
int mp_isend_on_stream(void *buf, int size, int peer, mp_reg_t *mp_reg, mp_request_t *req,
                       struct CUstream_st *stream);
/* mp_isend_on_stream of the blocks at v, as mp_isendv takes them. */
int mp_isendv_on_stream(struct iovec *v, int nblocks, int peer, mp_reg_t *mp_reg, mp_request_t *req,
                        struct CUstream_st *stream);
/* Makes the stream wait for requests posted on a stream; they are complete once it passed. */
int mp_wait_on_stream(mp_request_t *req, struct CUstream_st *stream);
int mp_wait_all_on_stream(uint32_t count, mp_request_t *req, struct CUstream_st *stream);
/* Makes the stream wait until the word at ptr meets value under flags (MP_WAIT_GEQ is
 * wrap-aware here, as CUDA's stream waits are). The word must stay valid until the stream
 * passed the wait, and a CUDA stream must reach it (device memory, or registered host memory). */
int mp_wait32_on_stream(uint32_t *ptr, uint32_t value, int flags, struct CUstream_st *stream);
/* Not in LibMP: a barrier the stream runs. The stream stores this rank's arrival at its
 * partners and waits for theirs; the CPU returns at once, and what the stream runs after it
 * runs once every rank reached the barrier. Every rank calls it (on a stream of its own). */
int mp_barrier_on_stream(struct CUstream_st *stream);
static inline int mp_wait_dword_geq_on_stream(uint32_t *ptr, uint32_t value, struct CUstream_st *stream) {
  return mp_wait32_on_stream(ptr, value, MP_WAIT_GEQ, stream);
}
static inline int mp_wait_dword_eq_on_stream(uint32_t *ptr, uint32_t value, struct CUstream_st *stream) {
  return mp_wait32_on_stream(ptr, value, MP_WAIT_EQ, stream);
}
/* mp_iput posted by the stream (it rings when it gets there). */
int mp_iput_on_stream(void *src, int size, mp_reg_t *src_reg, int peer, size_t displ,
                      mp_window_t *dst_window_t, mp_request_t *req, int flags,
                      struct CUstream_st *stream);

/* Not in LibMP: put with signal. Writes size bytes at src (inside *src_reg) into peer's part
 * of *dst_window_t at byte displ, then the 8-byte word at signal (inside *signal_reg; its value
 * is read at the call) at byte signal_displ (8-byte aligned) of the same window: the peer sees
 * the signal only after the data (wait on its low 32 bits with mp_wait32 or
 * mp_wait32_on_stream). The request goes to *req. */
int mp_iput_signal(void *src, int size, mp_reg_t *src_reg, int peer, size_t displ, mp_window_t *dst_window_t,
                   uint64_t *signal, mp_reg_t *signal_reg, size_t signal_displ, mp_request_t *req);
int mp_iput_signal_on_stream(void *src, int size, mp_reg_t *src_reg, int peer, size_t displ,
                             mp_window_t *dst_window_t, uint64_t *signal, mp_reg_t *signal_reg,
                             size_t signal_displ, mp_request_t *req, struct CUstream_st *stream);

/* LibMP's split API, for batching: a prepare checks its arguments and makes a request that
 * holds the send or put; a post hands prepared requests to a stream, which (for sends) waits
 * there for the peer's receive, then rings. The work request is written when posted (LibMP
 * wrote it when prepared). A request is posted once; waiting for one never posted fails
 * (post it first); released by mp_wait or mp_wait_all as any other. */
int mp_send_prepare(void *buf, int size, int peer, mp_reg_t *mp_reg, mp_request_t *req);
/* mp_send_prepare of the blocks at v, as mp_isendv takes them. */
int mp_sendv_prepare(struct iovec *v, int nblocks, int peer, mp_reg_t *mp_reg, mp_request_t *req);
/* mp_send_post_on_stream also makes the stream wait for the send's completion. */
int mp_send_post_on_stream(mp_request_t *req, struct CUstream_st *stream);
int mp_isend_post_on_stream(mp_request_t *req, struct CUstream_st *stream);
int mp_send_post_all_on_stream(uint32_t count, mp_request_t *req, struct CUstream_st *stream);
int mp_isend_post_all_on_stream(uint32_t count, mp_request_t *req, struct CUstream_st *stream);
int mp_put_prepare(void *src, int size, mp_reg_t *src_reg, int peer, size_t displ, mp_window_t *dst_window_t,
                   mp_request_t *req, int flags);
int mp_iput_post_on_stream(mp_request_t *req, struct CUstream_st *stream);
int mp_iput_post_all_on_stream(uint32_t count, mp_request_t *req, struct CUstream_st *stream);

/* LibMP's descriptor queue: sends, completion waits and 32-bit waits and writes collected on
 * the host, then handed to a stream in one list by mp_desc_queue_post_on_stream (adjacent
 * doorbells of one peer ring once). A queue is used by one thread at a time.
 * - add_send takes a request from mp_send_prepare or mp_put_prepare; its work request is
 *   written at the post, in the queue's order (LibMP wrote it when prepared).
 * - add_wait_send/add_wait_recv take a request posted on a stream, or a send added to this
 *   queue before; the stream waits for its completion (release it with mp_wait as usual).
 * - add_wait_value32 takes MP_WAIT_GEQ, MP_WAIT_EQ or MP_WAIT_AND (LibMP also passed NOR:
 *   refused); add_write_value32 writes after the stream's earlier work. Their words must stay
 *   valid until the stream passed them.
 * - post_on_stream: flags must be 0 (LibMP ignored them); an empty queue posts nothing and
 *   succeeds; the queue is empty afterwards. A refused descriptor is reported with those
 *   before it posted, and it and those after it kept in the queue.
 * - At most MP_DESC_QUEUE_MAX descriptors wait in one queue. mp_desc_queue_free drops descriptors not
 *   posted (their requests stay prepared) and sets *dq to NULL; a freed queue is refused. */
#define MP_DESC_QUEUE_MAX 65536
struct mp_desc_queue;
typedef struct mp_desc_queue *mp_desc_queue_t;
int mp_desc_queue_alloc(mp_desc_queue_t *dq);
int mp_desc_queue_free(mp_desc_queue_t *dq);
int mp_desc_queue_add_send(mp_desc_queue_t *dq, mp_request_t *req);
int mp_desc_queue_add_wait_send(mp_desc_queue_t *dq, mp_request_t *req);
int mp_desc_queue_add_wait_recv(mp_desc_queue_t *dq, mp_request_t *req);
int mp_desc_queue_add_wait_value32(mp_desc_queue_t *dq, uint32_t *ptr, uint32_t value, int flags);
int mp_desc_queue_add_write_value32(mp_desc_queue_t *dq, uint32_t *ptr, uint32_t value);
int mp_desc_queue_post_on_stream(struct CUstream_st *stream, mp_desc_queue_t *dq, int flags);

#ifdef __cplusplus
}
#endif

#endif /* GDASYNC_MP_H */
