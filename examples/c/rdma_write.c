/* rdma_write.c: an RDMA write and its completion wait through gdasync.h.
 *
 * Two QPs, each on a device of its own (soft devices by default, so it runs anywhere), connect
 * through endpoint strings (what two processes would send each other over a socket). The write
 * is posted on a stream and the stream waits for its completion: a host stream by default, a
 * CUDA stream on GPU 0 with --cuda. Then the same write from the CPU, its completion polled.
 *
 *   cc -std=c99 -O2 rdma_write.c $(pkg-config --cflags --libs gdasync) -o rdma_write
 *   ./rdma_write [--cuda] [--device NAME]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c99 (example.h) */
#include <gdasync.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"

/* One side: a device, a PD, its CQs and a QP. */
struct side {
  gdasync_device *dev;
  gdasync_pd *pd;
  gdasync_cq *send_cq, *recv_cq;
  gdasync_qp *qp;
  char endpoint[GDASYNC_ENDPOINT_MAX];
};

static void open_side(struct side *s, const char *device) {
  CHECK(gdasync_device_open(device, &s->dev));
  CHECK(gdasync_pd_alloc(s->dev, &s->pd));
  /* A send CQ of the QP's own: a stream waits for a send's completion by its number. */
  CHECK(gdasync_cq_create(s->dev, 64, &s->send_cq));
  CHECK(gdasync_cq_create(s->dev, 64, &s->recv_cq));
  CHECK(gdasync_qp_create(s->pd, s->send_cq, s->recv_cq, NULL, &s->qp));
  CHECK(gdasync_qp_endpoint(s->qp, s->endpoint, sizeof s->endpoint));
}

static void close_side(struct side *s) {
  CHECK(gdasync_qp_destroy(s->qp));
  CHECK(gdasync_cq_destroy(s->send_cq));
  CHECK(gdasync_cq_destroy(s->recv_cq));
  CHECK(gdasync_pd_free(s->pd));
  CHECK(gdasync_device_close(s->dev));
}

int main(int argc, char **argv) {
  const char *device = "soft";
  int cuda = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--cuda") == 0) cuda = 1;
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
    else { fprintf(stderr, "usage: %s [--cuda] [--device NAME]\n", argv[0]); return 2; }
  }
  struct side a, b;
  open_side(&a, device);
  open_side(&b, device);
  /* Endpoints are strings: between processes they travel over any channel. */
  CHECK(gdasync_qp_connect(a.qp, b.endpoint));
  CHECK(gdasync_qp_connect(b.qp, a.endpoint));

  static const char message[] = "written by the NIC, rung by a stream";
  char *src = malloc(64), *dst = calloc(1, 64);
  if (!src || !dst) return 1;
  memcpy(src, message, sizeof message);
  gdasync_mr *src_mr, *dst_mr;
  gdasync_mr_info si, di;
  CHECK(gdasync_mr_reg(a.pd, src, 64, 0, &src_mr));
  CHECK(gdasync_mr_reg(b.pd, dst, 64, GDASYNC_ACCESS_LOCAL_WRITE | GDASYNC_ACCESS_REMOTE_WRITE, &dst_mr));
  CHECK(gdasync_mr_query(src_mr, &si));
  CHECK(gdasync_mr_query(dst_mr, &di)); /* di.addr and di.rkey: what b would send a */

  gdasync_sge sge = {si.addr, (uint32_t)sizeof message, si.lkey};
  gdasync_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 1;
  wr.opcode = GDASYNC_WR_RDMA_WRITE;
  wr.flags = GDASYNC_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.remote_addr = di.addr;
  wr.rkey = di.rkey;

  /* On a stream: the doorbell and the completion wait run there, no CPU call in between. */
  gdasync_stream *stream;
  if (cuda) CHECK(gdasync_stream_create_cuda(0, &stream));
  else CHECK(gdasync_stream_create_host(&stream));
  gdasync_send_ticket ticket;
  CHECK(gdasync_qp_post_send_on_stream(a.qp, &wr, stream, &ticket));
  CHECK(gdasync_qp_wait_send_on_stream(a.qp, &ticket, stream));
  CHECK(gdasync_stream_synchronize(stream));
  if (memcmp(dst, message, sizeof message) != 0) {
    fprintf(stderr, "the stream's write did not land: %.*s\n", (int)sizeof message, dst);
    return 1;
  }
  printf("%s stream: RDMA write of %zu bytes rung and completed: \"%s\"\n",
         cuda ? "CUDA" : "host", sizeof message, dst);

  /* From the CPU: post, then wait for the completion on the CQ. */
  memset(dst, 0, 64);
  wr.wr_id = 2;
  CHECK(gdasync_qp_post_send(a.qp, &wr, NULL));
  gdasync_wc wc;
  CHECK(gdasync_cq_wait(a.send_cq, &wc, 5000));
  if (wc.status != GDASYNC_WC_SUCCESS || wc.wr_id != 2 || memcmp(dst, message, sizeof message) != 0) {
    fprintf(stderr, "CPU write: completion status %u, wr_id %llu\n", wc.status, (unsigned long long)wc.wr_id);
    return 1;
  }
  printf("CPU: RDMA write of %zu bytes completed (wr_id %llu)\n", sizeof message, (unsigned long long)wc.wr_id);

  CHECK(gdasync_stream_destroy(stream));
  CHECK(gdasync_mr_dereg(src_mr));
  CHECK(gdasync_mr_dereg(dst_mr));
  close_side(&a);
  close_side(&b);
  free(src);
  free(dst);
  return 0;
}
