// kernel_qp_host.cpp: gdasync.h and gdsync.cuh in one C++ program. QPs made through the C API
// are handed to a "kernel" with gdasync_qp_to_kernel, and the CPU plays the kernel: it calls
// gdsync.cuh's gds_qp_post_recv, gds_qp_post_send and gds_cq_wait (compiled for the host, with
// the host stand-ins of tests/common/gdsync_host.cpp) on the descriptors, and the soft device
// executes what they write. Then the QPs go back to the CPU and the C API posts on them again.
// Built and run by capi/tests/kernel_qp.rs; exits 0 when every check held, else prints the
// first that failed and exits 1.
#include "gdsync_host.cpp"  // the host stand-ins, then gdsync.cuh
#include <gdasync.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// gdasync_kernel_qp is gds_qp byte for byte.
static_assert(sizeof(gdasync_kernel_qp) == sizeof(gds_qp), "gdasync_kernel_qp size");
static_assert(sizeof(gdasync_kernel_cq) == sizeof(gds_cq), "gdasync_kernel_cq size");
#define SAME(m) static_assert(offsetof(gdasync_kernel_qp, m) == offsetof(gds_qp, m), "gdasync_kernel_qp." #m)
SAME(sq); SAME(rq); SAME(dbrec); SAME(db); SAME(proxy); SAME(state); SAME(sq_pi); SAME(rq_pi);
SAME(qpn); SAME(sq_wqebbs); SAME(rq_wqes); SAME(rq_stride); SAME(send_cq); SAME(recv_cq);
#define SAME_CQ(m) static_assert(offsetof(gdasync_kernel_cq, m) == offsetof(gds_cq, m), "gdasync_kernel_cq." #m)
SAME_CQ(cqes); SAME_CQ(dbrec); SAME_CQ(retired); SAME_CQ(wq_retired); SAME_CQ(ci); SAME_CQ(wq_ci);
SAME_CQ(entries); SAME_CQ(cqn);

#define OK(call)                                                                   \
  do {                                                                             \
    int rc_ = (call);                                                              \
    if (rc_ != GDASYNC_OK) {                                                       \
      fprintf(stderr, "line %d: %s: %d: %s\n", __LINE__, #call, rc_, gdasync_last_error()); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)
#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "line %d: %s: ", __LINE__, #cond);         \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      exit(1);                                                   \
    }                                                            \
  } while (0)
// A call that must fail with `code` and a message containing `words`.
#define REFUSED(call, code, words)                                                            \
  do {                                                                                        \
    int rc_ = (call);                                                                         \
    EXPECT(rc_ == (code) && strstr(gdasync_last_error(), words), "%d: %s", rc_, gdasync_last_error()); \
  } while (0)

static const uint64_t TIMEOUT_NS = 20000000000ull;
static const int ROUNDS = 600;  // more than the rings (256): they wrap
static const uint32_t LEN = 256;

struct side {
  gdasync_cq *scq, *rcq;
  gdasync_qp *qp;
  gdasync_mr *mr;
  gdasync_mr_info info;
  unsigned char *buf;  // [0, LEN): to send; [LEN, 2 LEN): receives land here
};

static side make_side(gdasync_device *dev, gdasync_pd *pd) {
  side s;
  OK(gdasync_cq_create(dev, 256, &s.scq));
  OK(gdasync_cq_create(dev, 256, &s.rcq));
  OK(gdasync_qp_create(pd, s.scq, s.rcq, NULL, &s.qp));
  s.buf = (unsigned char *)aligned_alloc(4096, 4096);
  EXPECT(s.buf, "aligned_alloc");
  memset(s.buf, 0, 4096);
  OK(gdasync_mr_reg(pd, s.buf, 4096, GDASYNC_ACCESS_LOCAL_WRITE | GDASYNC_ACCESS_REMOTE_WRITE, &s.mr));
  OK(gdasync_mr_query(s.mr, &s.info));
  return s;
}

// The kernel's part: ROUNDS sends a -> b of LEN bytes (even rounds sends, odd rounds RDMA writes
// with immediate), each received and checked by b.
static void play_kernel(gds_qp *qa, gds_qp *qb, side &a, side &b) {
  gds_wc wc;
  for (int i = 0; i < ROUNDS; i++) {
    for (uint32_t k = 0; k < LEN; k++) a.buf[k] = (unsigned char)(i * 7 + k);
    EXPECT(gds_qp_post_recv(qb, b.info.addr + LEN, LEN, b.info.lkey) == GDS_OK, "post_recv %d", i);
    uint32_t op = i % 2 ? GDS_OP_RDMA_WRITE_IMM : GDS_OP_SEND;
    int rc = gds_qp_post_send(qa, op, a.info.addr, a.info.lkey, LEN, b.info.addr + LEN, b.info.rkey, (uint32_t)i,
                              GDS_SIGNALED);
    EXPECT(rc == GDS_OK, "post_send %d: %d", i, rc);
    EXPECT((rc = gds_cq_wait(&qa->send_cq, &wc, TIMEOUT_NS)) == GDS_OK, "send completion %d: %#x", i, rc);
    EXPECT((rc = gds_cq_wait(&qb->recv_cq, &wc, TIMEOUT_NS)) == GDS_OK, "receive completion %d: %#x", i, rc);
    EXPECT(wc.byte_len == LEN && (i % 2 == 0 || wc.imm == (uint32_t)i), "round %d: %u bytes, imm %u", i,
           wc.byte_len, wc.imm);
    EXPECT(memcmp(a.buf, b.buf + LEN, LEN) == 0, "round %d: the bytes differ", i);
  }
}

int main() {
  gdasync_device *dev;
  gdasync_pd *pd;
  OK(gdasync_device_open("soft", &dev));
  OK(gdasync_pd_alloc(dev, &pd));
  side a = make_side(dev, pd), b = make_side(dev, pd);
  char ea[GDASYNC_ENDPOINT_MAX], eb[GDASYNC_ENDPOINT_MAX];
  OK(gdasync_qp_endpoint(a.qp, ea, sizeof ea));
  OK(gdasync_qp_endpoint(b.qp, eb, sizeof eb));
  OK(gdasync_qp_connect(a.qp, eb));
  OK(gdasync_qp_connect(b.qp, ea));

  // Refused while a receive is outstanding: the QP stays the CPU's and works on.
  gdasync_kernel_qp da, db;
  gdasync_sge sge = {b.info.addr + LEN, LEN, b.info.lkey};
  OK(gdasync_qp_post_recv(b.qp, 1, &sge, 1, NULL));
  REFUSED(gdasync_qp_to_kernel(b.qp, &db), GDASYNC_ERR_INVALID, "outstanding");
  gdasync_sge asge = {a.info.addr, 8, a.info.lkey};
  gdasync_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.opcode = GDASYNC_WR_SEND;
  wr.flags = GDASYNC_SEND_SIGNALED;
  wr.sg_list = &asge;
  wr.num_sge = 1;
  OK(gdasync_qp_post_send(a.qp, &wr, NULL));
  gdasync_wc wc;
  OK(gdasync_cq_wait(a.scq, &wc, 20000));
  OK(gdasync_cq_wait(b.rcq, &wc, 20000));
  EXPECT(wc.status == 0 && wc.byte_len == 8, "status %u, %u bytes", wc.status, wc.byte_len);

  // To the kernel.
  OK(gdasync_qp_to_kernel(a.qp, &da));
  OK(gdasync_qp_to_kernel(b.qp, &db));
  uint32_t qpn;
  OK(gdasync_qp_num(a.qp, &qpn));
  EXPECT(da.qpn == qpn && da.sq != 0 && da.send_cq.cqes != 0 && da.recv_cq.cqes != 0, "descriptor of QP %#x", qpn);
  REFUSED(gdasync_qp_post_send(a.qp, &wr, NULL), GDASYNC_ERR_STATE, "driven by a GPU kernel");
  REFUSED(gdasync_cq_poll(a.scq, &wc, 1), GDASYNC_ERR_INVALID, "consumed by a GPU kernel");
  REFUSED(gdasync_qp_to_kernel(a.qp, &da), GDASYNC_ERR_STATE, "with a kernel already");
  gds_qp qa, qb;
  memcpy(&qa, &da, sizeof qa);
  memcpy(&qb, &db, sizeof qb);
  play_kernel(&qa, &qb, a, b);

  gdasync_kernel_progress p;
  OK(gdasync_qp_kernel_progress(a.qp, &p));
  EXPECT(p.sends_posted == (uint64_t)ROUNDS + 1 && p.sends_retired == p.sends_posted && p.send_cqes == (uint64_t)ROUNDS + 1,
         "a: %llu posted, %llu retired, %llu CQEs", (unsigned long long)p.sends_posted,
         (unsigned long long)p.sends_retired, (unsigned long long)p.send_cqes);
  // A new descriptor resumes where the kernel left off.
  gdasync_kernel_qp again;
  OK(gdasync_qp_kernel_desc(a.qp, &again));
  EXPECT(again.sq_pi == qa.sq_pi && again.send_cq.ci == qa.send_cq.ci, "resumed at %llu, kernel at %llu",
         (unsigned long long)again.sq_pi, (unsigned long long)qa.sq_pi);

  // A receive left outstanding keeps b with the kernel; once it completed, b comes back.
  EXPECT(gds_qp_post_recv(&qb, b.info.addr + LEN, LEN, b.info.lkey) == GDS_OK, "post_recv");
  REFUSED(gdasync_qp_to_host(b.qp), GDASYNC_ERR_INVALID, "outstanding");
  OK(gdasync_qp_kernel_desc(b.qp, &db));  // still the kernel's
  EXPECT(gds_qp_post_send(&qa, GDS_OP_SEND, a.info.addr, a.info.lkey, 8, 0, 0, 0, GDS_SIGNALED) == GDS_OK, "send");
  gds_wc gwc;
  EXPECT(gds_cq_wait(&qa.send_cq, &gwc, TIMEOUT_NS) == GDS_OK, "send completion");
  EXPECT(gds_cq_wait(&qb.recv_cq, &gwc, TIMEOUT_NS) == GDS_OK, "receive completion");
  OK(gdasync_qp_to_host(a.qp));
  OK(gdasync_qp_to_host(b.qp));
  REFUSED(gdasync_qp_to_host(b.qp), GDASYNC_ERR_STATE, "driven by the CPU already");
  REFUSED(gdasync_qp_kernel_desc(b.qp, &db), GDASYNC_ERR_STATE, "driven by the CPU");

  // The CPU posts on from where the kernel stopped.
  for (int i = 0; i < 3; i++) {
    OK(gdasync_qp_post_recv(b.qp, 2, &sge, 1, NULL));
    OK(gdasync_qp_post_send(a.qp, &wr, NULL));
    OK(gdasync_cq_wait(a.scq, &wc, 20000));
    EXPECT(wc.status == 0, "CPU send after the kernel: status %u", wc.status);
    OK(gdasync_cq_wait(b.rcq, &wc, 20000));
    EXPECT(wc.status == 0 && wc.byte_len == 8, "CPU receive after the kernel: status %u", wc.status);
  }
  side *sides[2] = {&a, &b};
  for (side *s : sides) {
    OK(gdasync_qp_destroy(s->qp));
    OK(gdasync_mr_dereg(s->mr));
    OK(gdasync_cq_destroy(s->scq));
    OK(gdasync_cq_destroy(s->rcq));
  }
  REFUSED(gdasync_qp_to_kernel(a.qp, &da), GDASYNC_ERR_HANDLE, "not a live gdasync_qp");
  OK(gdasync_pd_free(pd));
  OK(gdasync_device_close(dev));
  printf("a kernel's part played by gdsync.cuh on the CPU: %d sends and writes on QPs made through gdasync.h\n", ROUNDS);
  return 0;
}
