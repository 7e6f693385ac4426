/* gdasync.h: the native C API of gdasync (GPUDirect Async: RDMA queue pairs a CUDA stream,
 * a GPU kernel or a CPU thread drives by itself).
 *
 * Conventions.
 * - Every function returns GDASYNC_OK (0) or a negative GDASYNC_ERR_* status (gdasync_cq_poll:
 *   a count, or a negative status). The message of the last call that failed on a thread is
 *   gdasync_last_error(); gdasync_status_name() names a status.
 * - Handles (gdasync_device, gdasync_pd, gdasync_cq, gdasync_qp, gdasync_mr, gdasync_prepared,
 *   gdasync_ops, gdasync_stream) are opaque values the library never dereferences. A destroyed
 *   handle, one of another type, or one the library did not make is refused with
 *   GDASYNC_ERR_HANDLE; NULL with GDASYNC_ERR_NULL. The caller owns each handle it receives and
 *   ends it with the matching destroy/free/close call; objects made from others keep those
 *   alive (a QP keeps its PD, CQs and device), so they may be destroyed in any order.
 * - Every handle may be used from any thread; calls on one QP are serialised by the library.
 * - Pointers to structures must be non-NULL (unless said otherwise) and aligned; strings must be
 *   NUL-terminated and at most 4095 bytes; arrays must hold the count given.
 * - No function lets a failure escape as a signal or an abort: an internal error (a bug in
 *   gdasync) is returned as GDASYNC_ERR_INTERNAL with its message.
 */

#ifndef GDASYNC_H
#define GDASYNC_H

/* Generated from capi/src by cbindgen (capi/tests/header.rs): do not edit. */

#include <stddef.h>
#include <stdint.h>

// Success.
#define GDASYNC_WC_SUCCESS 0

// Error status: the message was longer than the receive buffer (LOC_LEN_ERR).
#define GDASYNC_WC_LOC_LEN_ERR 1

// Error status: a malformed work request (LOC_QP_OP_ERR).
#define GDASYNC_WC_LOC_QP_OP_ERR 2

// Error status: a local key, bound or access right is wrong (LOC_PROT_ERR).
#define GDASYNC_WC_LOC_PROT_ERR 4

// Error status: the QP was in error; the work was not executed (WR_FLUSH_ERR).
#define GDASYNC_WC_WR_FLUSH_ERR 5

// Error status: the responder rejected the request (REM_INV_REQ_ERR).
#define GDASYNC_WC_REM_INV_REQ_ERR 18

// Error status: bad rkey, out of bounds, or no remote right (REM_ACCESS_ERR).
#define GDASYNC_WC_REM_ACCESS_ERR 19

// Error status: the responder could not complete the operation (REM_OP_ERR).
#define GDASYNC_WC_REM_OP_ERR 20

// Error status: the peer stopped answering (RETRY_EXC_ERR).
#define GDASYNC_WC_RETRY_EXC_ERR 21

// Error status: the responder had no receive posted (RNR_RETRY_EXC_ERR).
#define GDASYNC_WC_RNR_RETRY_EXC_ERR 22

// A completion's opcode: a send (requester).
#define GDASYNC_WC_OP_SEND 0

// An RDMA write (requester).
#define GDASYNC_WC_OP_RDMA_WRITE 1

// An RDMA read (requester).
#define GDASYNC_WC_OP_RDMA_READ 2

// A compare-and-swap (requester).
#define GDASYNC_WC_OP_COMP_SWAP 3

// A fetch-and-add (requester).
#define GDASYNC_WC_OP_FETCH_ADD 4

// A no-op (requester).
#define GDASYNC_WC_OP_NOP 5

// A send arrived (responder).
#define GDASYNC_WC_OP_RECV 128

// An RDMA write with immediate arrived (responder).
#define GDASYNC_WC_OP_RECV_RDMA_WITH_IMM 129

// The local device may write the region (receives, read and atomic results).
#define GDASYNC_ACCESS_LOCAL_WRITE 1

// Peers may RDMA-write it (needs `GDASYNC_ACCESS_LOCAL_WRITE`).
#define GDASYNC_ACCESS_REMOTE_WRITE 2

// Peers may RDMA-read it.
#define GDASYNC_ACCESS_REMOTE_READ 4

// Peers may run atomics on it (needs `GDASYNC_ACCESS_LOCAL_WRITE`).
#define GDASYNC_ACCESS_REMOTE_ATOMIC 8

// Room an endpoint string needs, its NUL included.
#define GDASYNC_ENDPOINT_MAX 256

// Most scatter/gather entries in one work request.
#define GDASYNC_MAX_SGE 16

// A send.
#define GDASYNC_WR_SEND 0

// A send with immediate data.
#define GDASYNC_WR_SEND_WITH_IMM 1

// An RDMA write.
#define GDASYNC_WR_RDMA_WRITE 2

// An RDMA write with immediate data (consumes a receive at the peer).
#define GDASYNC_WR_RDMA_WRITE_WITH_IMM 3

// An RDMA read.
#define GDASYNC_WR_RDMA_READ 4

// An 8-byte fetch-and-add.
#define GDASYNC_WR_ATOMIC_FETCH_AND_ADD 5

// An 8-byte compare-and-swap.
#define GDASYNC_WR_ATOMIC_CMP_AND_SWP 6

// No operation (completes in order).
#define GDASYNC_WR_NOP 7

// Write a completion on success (errors always complete).
#define GDASYNC_SEND_SIGNALED 1

// Copy the payload into the work request at post time.
#define GDASYNC_SEND_INLINE 2

// Wait for earlier reads and atomics first.
#define GDASYNC_SEND_FENCE 4

// Solicited event at the responder.
#define GDASYNC_SEND_SOLICITED 8

// Success.
#define GDASYNC_OK 0

// A pointer argument that must not be NULL was NULL.
#define GDASYNC_ERR_NULL -1

// A handle is not a live handle of the expected type: destroyed already, of another type,
// or never made by this library.
#define GDASYNC_ERR_HANDLE -2

// An argument is out of range or inconsistent.
#define GDASYNC_ERR_INVALID -3

// A buffer is too small, or a size does not match what the structure needs.
#define GDASYNC_ERR_SIZE -4

// The device or this build does not support the operation.
#define GDASYNC_ERR_UNSUPPORTED -5

// A wait did not pass in time.
#define GDASYNC_ERR_TIMEOUT -6

// Work completed with an error status.
#define GDASYNC_ERR_COMPLETION -7

// A queue is full: poll or wait for completions, then post again.
#define GDASYNC_ERR_AGAIN -8

// The object is in the wrong state for the call (a QP not connected or in error, a commit
// out of order, a CQ whose completions a queued wait owns, a finalized communicator).
#define GDASYNC_ERR_STATE -9

// The device, the peer, CUDA or the operating system failed.
#define GDASYNC_ERR_SYSTEM -10

// A bug in gdasync was caught (a Rust panic) before it reached the caller.
#define GDASYNC_ERR_INTERNAL -11

// A completion queue. Thread-safe; polls from several threads each take different
// completions. Destroying it while QPs use it is allowed: they keep it until destroyed.
typedef struct gdasync_cq gdasync_cq;

// An RDMA device (a soft device, or an mlx5 port). Thread-safe: any thread may use it.
// Closing it while PDs, CQs or QPs made from it live is allowed: they keep the device open
// until the last of them is destroyed.
typedef struct gdasync_device gdasync_device;

// A registered memory region. Thread-safe. The memory must stay allocated until
// `gdasync_mr_dereg`; work still naming its keys afterwards fails with a protection error.
typedef struct gdasync_mr gdasync_mr;

// An op list: memory writes, waits and barriers that ring a doorbell or wait for a
// completion, for an executor to run (`gdasync_ops_run` on this thread,
// `gdasync_stream_submit` on a stream). Running or submitting it consumes the handle.
// Op lists that ring one QP's doorbells must run in the order they were committed.
typedef struct gdasync_ops gdasync_ops;

// A protection domain. Thread-safe. Freeing it while its MRs and QPs live is allowed: they
// keep it until the last of them is destroyed.
typedef struct gdasync_pd gdasync_pd;

// A prepared send: its work request is in the QP's ring, not yet visible to the device.
// Commit it (`gdasync_qp_commit`), or free it (`gdasync_prepared_free`: it becomes a no-op
// exposed with the next commit). Commit prepared sends in the order they were prepared.
typedef struct gdasync_prepared gdasync_prepared;

// A reliable-connected queue pair. Thread-safe: calls on one QP from several threads are
// serialised by the library (posts from one thread keep their order).
typedef struct gdasync_qp gdasync_qp;

// A stream: op lists submitted to it run in order, on a CPU thread (a host stream) or on a
// GPU (a CUDA stream). Thread-safe; lists submitted from several threads run in the order
// the calls were made.
typedef struct gdasync_stream gdasync_stream;

// A completion, as `gdasync_cq_poll` and `gdasync_cq_wait` return it.
typedef struct gdasync_wc {
  // The work request's id.
  uint64_t wr_id;
  // `GDASYNC_WC_SUCCESS` (0), or the device's error syndrome (`GDASYNC_WC_*_ERR`).
  uint32_t status;
  // What completed (`GDASYNC_WC_OP_*`).
  uint32_t opcode;
  // Bytes received (receives) or read (RDMA reads; 8 for atomics).
  uint32_t byte_len;
  // Immediate data, host order (valid where `has_imm` is 1).
  uint32_t imm_data;
  // 1 where the completion carries immediate data.
  uint32_t has_imm;
  // The local QP number.
  uint32_t qp_num;
  // The remote QP number (receives).
  uint32_t src_qp;
  // The vendor syndrome of an error completion.
  uint32_t vendor_err;
} gdasync_wc;

// A CQ as a kernel drives it (`gds_cq`): where the CQEs and the consumer-index record are,
// and the kernel's working counters.
typedef struct gdasync_kernel_cq {
  // Address of the CQE ring (64-byte entries).
  uint64_t cqes;
  // Address of the CQ doorbell record's consumer-index word (BE32).
  uint64_t dbrec;
  // Address of the CQ's retired counter (native u64): the consumer index, for the host.
  uint64_t retired;
  // Address of the served ring's retired counter (native u64): send WQEBBs or receives
  // known complete, for the host and the next launch.
  uint64_t wq_retired;
  // Consumer index (free-running): the next CQE to look at.
  uint64_t ci;
  // Entries of the served ring known complete (free-running).
  uint64_t wq_ci;
  // Number of entries (a power of two).
  uint32_t entries;
  // CQ number.
  uint32_t cqn;
  // Zero.
  uint64_t reserved;
} gdasync_kernel_cq;

// A QP as a kernel drives it (`gds_qp`): rings, doorbells, both CQs and the kernel's working
// counters. Pass it to a kernel (by value, or in GPU-reachable memory); the kernel copies it
// into a local variable and one thread drives it.
typedef struct gdasync_kernel_qp {
  // Address of the send ring (64-byte WQEBBs).
  uint64_t sq;
  // Address of the receive ring.
  uint64_t rq;
  // Address of the doorbell record (`[RQ][SQ]`, BE32 each).
  uint64_t dbrec;
  // Address of the doorbell register (0 when a CPU proxy rings: see `proxy`).
  uint64_t db;
  // Address of the CPU proxy's word (0 when the GPU rings): the kernel stores its send
  // producer counter there and the proxy rings.
  uint64_t proxy;
  // Address of the state block in pinned host memory: send producer counter at +0,
  // receive producer counter at +8 (native u64), stored through by the kernel.
  uint64_t state;
  // Send producer counter in WQEBBs (free-running); every WQE a kernel posts is one WQEBB.
  uint64_t sq_pi;
  // Receive producer counter (free-running).
  uint64_t rq_pi;
  // QP number.
  uint32_t qpn;
  // Send ring size in WQEBBs (a power of two).
  uint32_t sq_wqebbs;
  // Receive ring size in WQEs (a power of two).
  uint32_t rq_wqes;
  // Receive WQE size in bytes (16 per scatter entry).
  uint32_t rq_stride;
  // Zero from the host; a kernel keeps a send it prepared there (`gds_qp_prepare_send`).
  uint64_t reserved[2];
  // The send CQ.
  struct gdasync_kernel_cq send_cq;
  // The receive CQ.
  struct gdasync_kernel_cq recv_cq;
} gdasync_kernel_qp;

// What a kernel has done with a [`DeviceQp`], as it stored it through to host memory
// (`#[repr(C)]`: the C API hands it out as `gdasync_kernel_progress`).
typedef struct gdasync_kernel_progress {
  // Sends posted (WQEBBs; one per send).
  uint64_t sends_posted;
  // Sends known complete (from the send completions the kernel consumed).
  uint64_t sends_retired;
  // Receives posted.
  uint64_t recvs_posted;
  // Receives complete.
  uint64_t recvs_retired;
  // Send CQ consumer index.
  uint64_t send_cqes;
  // Receive CQ consumer index.
  uint64_t recv_cqes;
} gdasync_kernel_progress;

// What a region is: where, how long, its keys, and whose memory.
typedef struct gdasync_mr_info {
  // Start address.
  uint64_t addr;
  // Length in bytes.
  uint64_t length;
  // Local key (scatter/gather entries).
  uint32_t lkey;
  // Remote key (what a peer needs, with the address, to write or read it).
  uint32_t rkey;
  // The GPU whose memory it is, or -1 for host memory.
  int32_t gpu;
  // Zero.
  uint32_t reserved;
} gdasync_mr_info;

// A scatter/gather entry: `length` bytes at `addr` of the region with local key `lkey`.
typedef struct gdasync_sge {
  // Start address.
  uint64_t addr;
  // Length in bytes.
  uint32_t length;
  // The region's local key.
  uint32_t lkey;
} gdasync_sge;

// A send-queue work request.
typedef struct gdasync_send_wr {
  // Returned in the completion.
  uint64_t wr_id;
  // `GDASYNC_WR_*`.
  uint32_t opcode;
  // `GDASYNC_SEND_*` flags.
  uint32_t flags;
  // The gather list (the scatter list of reads; the result word of atomics).
  const struct gdasync_sge *sg_list;
  // Entries in `sg_list` (at most `GDASYNC_MAX_SGE`).
  uint32_t num_sge;
  // Immediate data (`GDASYNC_WR_SEND_WITH_IMM`, `GDASYNC_WR_RDMA_WRITE_WITH_IMM`).
  uint32_t imm_data;
  // The peer's address (writes, reads, atomics).
  uint64_t remote_addr;
  // The peer region's remote key.
  uint32_t rkey;
  // Zero.
  uint32_t reserved;
  // The value to add (fetch-and-add) or compare with (compare-and-swap).
  uint64_t compare_add;
  // The value stored by compare-and-swap.
  uint64_t swap;
} gdasync_send_wr;

// Identifies a posted send: its place in the ring and, where it is known in advance, its
// completion's number on the send CQ (what a stream wait needs).
typedef struct gdasync_send_ticket {
  // Producer counter of the request's first block.
  uint64_t index;
  // Producer counter just after it.
  uint64_t end;
  // Its completion's number (valid where `has_cqe` is 1).
  uint64_t cqe;
  // 1 where the send is signalled and the send CQ serves this QP's sends only.
  uint32_t has_cqe;
  // Zero.
  uint32_t reserved;
} gdasync_send_ticket;

// Identifies a posted receive and, where known in advance, its completion's number.
typedef struct gdasync_recv_ticket {
  // Receive counter.
  uint64_t index;
  // Its completion's number (valid where `has_cqe` is 1).
  uint64_t cqe;
  // 1 where the receive CQ serves this QP's receives only.
  uint32_t has_cqe;
  // Zero.
  uint32_t reserved;
} gdasync_recv_ticket;

// Sizes and settings of a new QP; a field left 0 takes its default.
typedef struct gdasync_qp_attr {
  // Send ring size in 64-byte blocks (default 256).
  uint32_t send_wqebbs;
  // Receive ring size in receives (default 256).
  uint32_t recv_wqes;
  // Most SGEs per receive (default 4).
  uint32_t max_recv_sge;
  // Most bytes of inline payload per send (default 220).
  uint32_t max_inline;
  // Milliseconds outstanding work may go without an answer from the peer before it
  // completes with an error (default 5000).
  uint32_t timeout_ms;
  // Zero.
  uint32_t reserved;
} gdasync_qp_attr;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The library's version, `"MAJOR.MINOR.PATCH"`.
const char *gdasync_version(void);

// Opens a device: `"soft"` (a new soft device), `"mlx5_0"` or `"mlx5_0:2"` (an RDMA device
// and port; without a port its first active one), or NULL / `""` for the default (the one
// `GDSYNC_DEVICE` names, else the first active mlx5 port, else a soft device).
int gdasync_device_open(const char *name, struct gdasync_device **out);

// Writes the device's name (`"soft"`, `"mlx5_0"`) and a NUL into `buf` of `len` bytes.
int gdasync_device_name(struct gdasync_device *dev, char *buf, size_t len);

// Closes the handle `dev`; the device closes once nothing made from it is left.
int gdasync_device_close(struct gdasync_device *dev);

// Allocates a protection domain on `dev`.
int gdasync_pd_alloc(struct gdasync_device *dev, struct gdasync_pd **out);

// Frees the handle `pd`.
int gdasync_pd_free(struct gdasync_pd *pd);

// Creates a completion queue of at least `entries` completions (rounded up to a power of
// two).
int gdasync_cq_create(struct gdasync_device *dev, uint32_t entries, struct gdasync_cq **out);

// Destroys the handle `cq`.
int gdasync_cq_destroy(struct gdasync_cq *cq);

// Polls up to `max` completions into `wc` (room for `max`); returns how many (0: none yet),
// or a negative status. An error completion is returned like any other, its `status` set.
int gdasync_cq_poll(struct gdasync_cq *cq, struct gdasync_wc *wc, int max);

// Waits up to `timeout_ms` milliseconds for one completion and stores it in `wc`. The
// completion may carry an error status: check `wc->status`.
int gdasync_cq_wait(struct gdasync_cq *cq, struct gdasync_wc *wc, uint32_t timeout_ms);

// Hands `qp` to GPU kernels: from here on a kernel posts and polls on it through the
// descriptor written to `desc` (gdsync.cuh's `gds_qp`, byte for byte: pass it to a kernel by
// value, or copy it to memory the kernel reads), and the CPU can neither post on it nor wait
// for its completions. Refused, with the QP left to the CPU as it was, unless each of its
// CQs serves this QP alone and holds at least as many entries as the ring it serves, and
// nothing is outstanding (every send and receive completed and polled, no prepared send
// uncommitted). Connect it first: a kernel cannot.
int gdasync_qp_to_kernel(struct gdasync_qp *qp, struct gdasync_kernel_qp *desc);

// Writes the descriptor of `qp` (with a kernel) to `out`, with the counters where the last
// kernel left them, for the next launch to resume from. Take one for each launch, never
// while a kernel drives the QP.
int gdasync_qp_kernel_desc(struct gdasync_qp *qp, struct gdasync_kernel_qp *out);

// What kernels have done with `qp` (with a kernel) so far, to `out`: they store their
// counters through to host memory after every call of gdsync.cuh.
int gdasync_qp_kernel_progress(struct gdasync_qp *qp, struct gdasync_kernel_progress *out);

// Writes 1 to `out` where GPUs reach the rings, doorbells and CQs of `qp` (with a kernel),
// else 0 (no CUDA driver: a kernel cannot use the descriptor).
int gdasync_qp_kernel_gpu_mapped(struct gdasync_qp *qp, uint32_t *out);

// Takes `qp` back from the kernels, once they have ended with nothing outstanding (every
// send and receive they posted completed, and its completion consumed): the CPU posts and
// polls on from where they stopped. Refused, with the QP left with the kernel, otherwise.
int gdasync_qp_to_host(struct gdasync_qp *qp);

// Registers `length` bytes at `addr` with `access` rights (`GDASYNC_ACCESS_*`): host
// memory, or memory of a GPU the device reaches. The memory must stay allocated until
// `gdasync_mr_dereg`.
int gdasync_mr_reg(struct gdasync_pd *pd,
                   void *addr,
                   size_t length,
                   uint32_t access,
                   struct gdasync_mr **out);

// Stores what `mr` is in `info`.
int gdasync_mr_query(struct gdasync_mr *mr, struct gdasync_mr_info *info);

// Deregisters `mr`: the device no longer touches the memory.
int gdasync_mr_dereg(struct gdasync_mr *mr);

// Prepares a send: writes `wr` into the QP's ring without making it visible to the device.
int gdasync_qp_prepare_send(struct gdasync_qp *qp,
                            const struct gdasync_send_wr *wr,
                            struct gdasync_prepared **out);

// Commits the prepared send `p` (consumed on success; still prepared after a refusal):
// its ticket goes to `ticket` (may be NULL) and the op list that rings its doorbell to
// `doorbell`, for an executor to run.
int gdasync_qp_commit(struct gdasync_qp *qp,
                      struct gdasync_prepared *p,
                      struct gdasync_send_ticket *ticket,
                      struct gdasync_ops **doorbell);

// Frees a prepared send without committing it: it becomes a no-op, exposed with the next
// commit (completing as a no-op with its wr_id if it was signalled).
int gdasync_prepared_free(struct gdasync_prepared *p);

// The op list that waits for the completion of the send `ticket` names (its completion
// number must be known: `has_cqe`) and consumes it, to `out`.
int gdasync_qp_send_wait_ops(struct gdasync_qp *qp,
                             const struct gdasync_send_ticket *ticket,
                             struct gdasync_ops **out);

// The op list that waits for the completion of the receive `ticket` names and consumes
// it, to `out`.
int gdasync_qp_recv_wait_ops(struct gdasync_qp *qp,
                             const struct gdasync_recv_ticket *ticket,
                             struct gdasync_ops **out);

// Runs `ops` now on the calling thread (a wait gives up after 60 s) and frees it, whatever
// the outcome.
int gdasync_ops_run(struct gdasync_ops *ops);

// Frees `ops` without running it.
int gdasync_ops_free(struct gdasync_ops *ops);

// Creates a QP of `pd` on `send_cq` and `recv_cq` (which may be the same CQ), sized by
// `attr` (NULL: defaults). It takes receives at once; it sends once connected.
int gdasync_qp_create(struct gdasync_pd *pd,
                      struct gdasync_cq *send_cq,
                      struct gdasync_cq *recv_cq,
                      const struct gdasync_qp_attr *attr,
                      struct gdasync_qp **out);

// Destroys `qp`: its outstanding work is flushed.
int gdasync_qp_destroy(struct gdasync_qp *qp);

// The QP's number.
int gdasync_qp_num(struct gdasync_qp *qp, uint32_t *out);

// Writes the QP's endpoint, a string of at most `GDASYNC_ENDPOINT_MAX` bytes with its NUL,
// into `buf` of `len` bytes. Hand it to the peer (a socket, a file, MPI), which connects
// to it.
int gdasync_qp_endpoint(struct gdasync_qp *qp, char *buf, size_t len);

// Connects `qp` to the peer QP whose endpoint string is `endpoint`.
int gdasync_qp_connect(struct gdasync_qp *qp, const char *endpoint);

// Posts a send-queue work request from the CPU; its ticket goes to `ticket` (may be NULL).
int gdasync_qp_post_send(struct gdasync_qp *qp,
                         const struct gdasync_send_wr *wr,
                         struct gdasync_send_ticket *ticket);

// Posts a receive of `num_sge` entries at `sg_list` (none: for zero-length sends and RDMA
// writes with immediate); its ticket goes to `ticket` (may be NULL).
int gdasync_qp_post_recv(struct gdasync_qp *qp,
                         uint64_t wr_id,
                         const struct gdasync_sge *sg_list,
                         uint32_t num_sge,
                         struct gdasync_recv_ticket *ticket);

// The message of the last call that failed on this thread ("" if none has). The string
// stays valid until the next call on this thread fails; copy it to keep it.
const char *gdasync_last_error(void);

// The name of a status code (`"GDASYNC_ERR_HANDLE"`), or `"unknown status"`.
const char *gdasync_status_name(int status);

// Creates a host stream: a CPU thread that runs the lists (a wait gives up after 60 s).
int gdasync_stream_create_host(struct gdasync_stream **out);

// Creates a CUDA stream on GPU `gpu` (non-blocking, in the GPU's primary context). Its
// `CUstream` (`gdasync_stream_cuda_handle`) takes kernels and events of the program's own.
// Fails with `GDASYNC_ERR_UNSUPPORTED` where there is no CUDA driver or GPU.
int gdasync_stream_create_cuda(int gpu, struct gdasync_stream **out);

// Tells gdasync whether the job's ranks on this host run CUDA streams on more than one GPU,
// other processes' included (`spans` non-zero; one process per GPU, as under `mpirun`). CUDA
// streams then run lists without copies as small kernels (`GDSYNC_LIST_KERNEL=auto`, the
// default), as they do when one process's streams span GPUs: on a two-H200 host a stream's
// own stores cost about 3 us each while streams on both GPUs run them, whichever processes
// they belong to. Call it before creating the first CUDA stream. Returns `GDASYNC_OK`.
int gdasync_set_job_spans_gpus(int spans);

// Makes a gdasync stream of `cu_stream`, a CUDA stream (`CUstream` or `cudaStream_t`) of
// the program's own in GPU `gpu`'s primary context (the runtime API's streams are; NULL is
// the legacy default stream): lists submitted to it run in order with the program's work
// there. The stream must outlive the gdasync stream, and stays the program's (destroying
// the gdasync stream waits for its lists and leaves the CUDA stream alone).
int gdasync_stream_wrap_cuda(void *cu_stream, int gpu, struct gdasync_stream **out);

// Stores the `CUstream` of a CUDA stream at `cu_stream`: the program may launch kernels and
// record or wait for events on it, in order with the lists. Owned by `stream`.
int gdasync_stream_cuda_handle(struct gdasync_stream *stream, void **cu_stream);

// Submits `ops` to `stream`, behind everything submitted before; consumes `ops`.
int gdasync_stream_submit(struct gdasync_stream *stream, struct gdasync_ops *ops);

// Blocks until everything submitted to `stream` has run; returns the first error a list
// met (a wait that timed out), which the lists after it were skipped for.
int gdasync_stream_synchronize(struct gdasync_stream *stream);

// Destroys `stream` once what was submitted to it has run (or failed).
int gdasync_stream_destroy(struct gdasync_stream *stream);

// Posts `wr` on `stream`: prepares it now and submits the op list that rings its doorbell,
// so the send goes out when the stream reaches it. Its ticket goes to `ticket` (may be
// NULL). A QP's sends posted on a stream may not be mixed with CPU posts until the stream
// has rung them.
int gdasync_qp_post_send_on_stream(struct gdasync_qp *qp,
                                   const struct gdasync_send_wr *wr,
                                   struct gdasync_stream *stream,
                                   struct gdasync_send_ticket *ticket);

// Makes `stream` wait for the completion of the send `ticket` names (and consume it):
// what is submitted after runs once the send completed.
int gdasync_qp_wait_send_on_stream(struct gdasync_qp *qp,
                                   const struct gdasync_send_ticket *ticket,
                                   struct gdasync_stream *stream);

// Makes `stream` wait for the completion of the receive `ticket` names (and consume it).
int gdasync_qp_wait_recv_on_stream(struct gdasync_qp *qp,
                                   const struct gdasync_recv_ticket *ticket,
                                   struct gdasync_stream *stream);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* GDASYNC_H */
