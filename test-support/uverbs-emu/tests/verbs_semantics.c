/* verbs_semantics.c - checks, through plain libibverbs calls, that the emulated HCA behaves as
 * a ConnectX does where a verbs program looks. Built and run by tests/semantics.rs under
 * scripts/with-emulated-hca (each process under its own emulator, with the soft HCA loaded).
 *
 *   verbs_semantics query    one node GUID, the same in sysfs and ibv_query_device; an ODP
 *                            region refused (EOPNOTSUPP) where the device reports no ODP;
 *                            max_mw / max_srq agree with the capability flags; the sysfs rate
 *                            agrees with the port's width and speed; an ioctl method the
 *                            device does not serve answers EPROTONOSUPPORT/EOPNOTSUPP
 *   verbs_semantics access   a responder QP refuses RDMA write, read and atomics its access
 *                            flags do not grant (IBV_WC_REM_ACCESS_ERR at the requester),
 *                            and takes each once granted
 *   verbs_semantics offset   a QP whose ring a parent domain's allocator places 512 bytes into
 *                            a page is created and moves a send and a write
 *   verbs_semantics peer     one RC QP driven by line commands on stdin (see peer()), for the
 *                            two-process checks: RTR never waits for the peer, a peer's clean
 *                            exit leaves the survivor's receives posted
 * Exits 0 when every check passed; prints "FAIL ..." and exits 1 otherwise.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define BUF 4096
#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static int failed;
#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL "); printf(__VA_ARGS__); printf("\n"); failed = 1; } } while (0)
#define MUST(cond, what) do { if (!(cond)) { printf("FAIL %s: %s\n", what, strerror(errno)); exit(1); } } while (0)

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static struct ibv_context *open_first(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n > 0, "no emulated device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	MUST(ctx, "ibv_open_device");
	ibv_free_device_list(list);
	return ctx;
}

static void read_sysfs(const char *rel, char *out, size_t n)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", getenv("SYSFS_PATH") ? getenv("SYSFS_PATH") : "/sys", rel);
	FILE *f = fopen(path, "r");
	MUST(f, path);
	MUST(fgets(out, (int)n, f), path);
	fclose(f);
	out[strcspn(out, "\n")] = 0;
}

/* ------------------------------------------------------------------------------ query */

static int width_lanes(uint8_t w) { return w == 1 ? 1 : w == 2 ? 4 : w == 4 ? 8 : w == 8 ? 12 : w == 16 ? 2 : 0; }

static void lane_speed(uint8_t s, int *gbps, const char **name)
{
	switch (s) {
	case 1: *gbps = 2; *name = "SDR"; return; /* 2.5 */
	case 2: *gbps = 5; *name = "DDR"; return;
	case 4: *gbps = 10; *name = "QDR"; return;
	case 16: *gbps = 14; *name = "FDR"; return;
	case 32: *gbps = 25; *name = "EDR"; return;
	case 64: *gbps = 50; *name = "HDR"; return;
	case 128: *gbps = 100; *name = "NDR"; return;
	default: *gbps = 0; *name = "?";
	}
}

/* A node GUID (network order) as sysfs writes it. */
static void guid_text(uint64_t be, char out[64])
{
	uint64_t g = be64toh(be);
	snprintf(out, 64, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48), (unsigned)(g >> 32) & 0xffff,
		 (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
}

static int query(void)
{
	struct ibv_context *ctx = open_first();
	const char *name = ibv_get_device_name(ctx->device);
	struct ibv_device_attr a;
	MUST(!ibv_query_device(ctx, &a), "ibv_query_device");
	char rel[256], text[128];
	snprintf(rel, sizeof(rel), "class/infiniband/%s/node_guid", name);
	read_sysfs(rel, text, sizeof(text));
	char mine[64];
	guid_text(a.node_guid, mine);
	CHECK(!strcmp(mine, text), "node GUID: ibv_query_device says %s, sysfs %s", mine, text);
	CHECK(ibv_get_device_guid(ctx->device) == a.node_guid, "ibv_get_device_guid disagrees with ibv_query_device");
	int mw_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	CHECK(!(a.device_cap_flags & mw_flags) == !a.max_mw, "max_mw %d with memory-window flags %#x", a.max_mw,
	      a.device_cap_flags & mw_flags);
	CHECK(!(a.device_cap_flags & (IBV_DEVICE_XRC | IBV_DEVICE_SRQ_RESIZE)) || a.max_srq,
	      "XRC/SRQ flags %#x with max_srq 0", a.device_cap_flags);
	/* An SRQ the device reports it has must be one it serves. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd, "ibv_alloc_pd");
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(!srq == !a.max_srq, "max_srq %d but ibv_create_srq %s", a.max_srq, srq ? "works" : "fails");
	if (srq) ibv_destroy_srq(srq);
	/* On-demand paging: a device without ODP capabilities refuses an ODP region. */
	struct ibv_device_attr_ex ax;
	MUST(!ibv_query_device_ex(ctx, NULL, &ax), "ibv_query_device_ex");
	if (!(ax.odp_caps.general_caps & IBV_ODP_SUPPORT)) {
		static char odp[4096];
		struct ibv_mr *mr = ibv_reg_mr(pd, odp, sizeof(odp), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
		CHECK(!mr && errno == EOPNOTSUPP, "an ODP region on a device without ODP: %s",
		      mr ? "registered" : strerror(errno));
		if (mr) ibv_dereg_mr(mr);
	}
	/* Address handles: UD is not served, so max_ah is 0 and none is made. */
	CHECK(a.max_ah == 0, "max_ah %d, but the device serves no UD", a.max_ah);
	struct ibv_port_attr p;
	MUST(!ibv_query_port(ctx, 1, &p), "ibv_query_port");
	int gbps;
	const char *sp;
	lane_speed(p.active_speed, &gbps, &sp);
	char want[64];
	snprintf(want, sizeof(want), "%d Gb/sec (%dX %s)", gbps * width_lanes(p.active_width), width_lanes(p.active_width), sp);
	snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/1/rate", name);
	read_sysfs(rel, text, sizeof(text));
	CHECK(!strcmp(want, text), "sysfs rate \"%s\", but the port is %s (width %u, speed %u)", text, want,
	      p.active_width, p.active_speed);
	/* An ioctl method the device does not serve (the device object's QUERY_CONTEXT here):
	 * answered as a kernel without it answers, not ENOTTY ("no ioctl interface at all"). */
	struct ib_uverbs_ioctl_hdr h = { .length = sizeof(h), .object_id = UVERBS_OBJECT_DEVICE,
					 .method_id = UVERBS_METHOD_QUERY_CONTEXT };
	int rc = ioctl(ctx->cmd_fd, RDMA_VERBS_IOCTL, &h);
	CHECK(rc < 0 && (errno == EPROTONOSUPPORT || errno == EOPNOTSUPP),
	      "an unserved ioctl method answered %d (%s), not EPROTONOSUPPORT or EOPNOTSUPP", rc, strerror(errno));
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return failed;
}

/* -------------------------------------------------------------------- one process, two QPs */

struct qp {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
};

struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_pd *qp_pd; /* the PD QPs are created on (a parent domain, or pd) */
	union ibv_gid gid;
};

static void make_qp(struct pair *p, struct qp *q)
{
	q->cq = ibv_create_cq(p->ctx, 16, NULL, NULL, 0);
	MUST(q->cq, "ibv_create_cq");
	struct ibv_qp_init_attr ia = { .send_cq = q->cq, .recv_cq = q->cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	q->qp = ibv_create_qp(p->qp_pd, &ia);
	MUST(q->qp, "ibv_create_qp");
	MUST(!posix_memalign((void **)&q->buf, 4096, BUF), "posix_memalign");
	memset(q->buf, 0, BUF);
	q->mr = ibv_reg_mr(p->pd, q->buf, BUF, ALL_ACCESS);
	MUST(q->mr, "ibv_reg_mr");
}

static int to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dest_qpn, const union ibv_gid *dgid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest_qpn,
				 .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = *dgid, .hop_limit = 1 } } };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp)
{
	/* timeout 18: about 1 s per try on a ConnectX (4.096 us << 18), 8 tries: room for a busy
	 * machine between a send posted before the peer's RTR and the link it waits for */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .timeout = 18, .retry_cnt = 7, .rnr_retry = 7,
				 .sq_psn = 0, .max_rd_atomic = 1 };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Connects a (granting all) and b (granting `b_access`) to each other on this device. */
static void connect_pair(struct pair *p, struct qp *a, struct qp *b, int b_access)
{
	MUST(!to_init(a->qp, ALL_ACCESS) && !to_init(b->qp, b_access), "INIT");
	MUST(!to_rtr(a->qp, b->qp->qp_num, &p->gid) && !to_rtr(b->qp, a->qp->qp_num, &p->gid), "RTR");
	MUST(!to_rts(a->qp) && !to_rts(b->qp), "RTS");
}

/* The next completion on `cq` within 5 s (status -1: none). */
static struct ibv_wc poll_one(struct ibv_cq *cq, double limit_ms)
{
	struct ibv_wc wc = { .status = -1 };
	double end = now_ms() + limit_ms;
	while (now_ms() < end)
		if (ibv_poll_cq(cq, 1, &wc) == 1) return wc;
	wc.status = -1;
	return wc;
}

static void free_qp(struct qp *q)
{
	ibv_destroy_qp(q->qp);
	ibv_destroy_cq(q->cq);
	ibv_dereg_mr(q->mr);
	free(q->buf);
}

static void open_pair(struct pair *p)
{
	p->ctx = open_first();
	p->pd = ibv_alloc_pd(p->ctx);
	MUST(p->pd, "ibv_alloc_pd");
	p->qp_pd = p->pd;
	MUST(!ibv_query_gid(p->ctx, 1, 0, &p->gid), "ibv_query_gid");
}

/* Posts one request of `op` from a to b's buffer; its completion's status. */
static int one_request(struct qp *a, struct qp *b, enum ibv_wr_opcode op)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = 8, .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = (uintptr_t)b->buf;
		wr.wr.atomic.rkey = b->mr->rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
		wr.wr.rdma.rkey = b->mr->rkey;
	}
	MUST(!ibv_post_send(a->qp, &wr, &bad), "ibv_post_send");
	return poll_one(a->cq, 5000).status;
}

static int access_flags(void)
{
	struct pair p;
	open_pair(&p);
	const struct { enum ibv_wr_opcode op; int needs; const char *name; } ops[] = {
		{ IBV_WR_RDMA_WRITE, IBV_ACCESS_REMOTE_WRITE, "RDMA write" },
		{ IBV_WR_RDMA_READ, IBV_ACCESS_REMOTE_READ, "RDMA read" },
		{ IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_ACCESS_REMOTE_ATOMIC, "fetch-and-add" },
	};
	for (int i = 0; i < 3; i++)
		for (int granted = 0; granted < 2; granted++) {
			struct qp a, b;
			make_qp(&p, &a);
			make_qp(&p, &b);
			/* Everything but the right the request needs, or everything. */
			connect_pair(&p, &a, &b, granted ? ALL_ACCESS : ALL_ACCESS & ~ops[i].needs);
			int st = one_request(&a, &b, ops[i].op);
			int want = granted ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR;
			CHECK(st == want, "%s to a QP %s it: status %d (%s), expected %s", ops[i].name,
			      granted ? "granting" : "not granting", st, st < 0 ? "none" : ibv_wc_status_str(st),
			      ibv_wc_status_str(want));
			free_qp(&a);
			free_qp(&b);
		}
	ibv_dealloc_pd(p.pd);
	ibv_close_device(p.ctx);
	return failed;
}

/* ------------------------------------------------------------------------------ offset */

static void *ring_at_512(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
	(void)pd; (void)ctx; (void)align;
	if (type != MLX5DV_RES_TYPE_QP) return IBV_ALLOCATOR_USE_DEFAULT;
	char *base;
	if (posix_memalign((void **)&base, 4096, size + 4096)) return NULL;
	memset(base, 0, size + 4096);
	return base + 512; /* inside the page, as an allocator packing small rings may place it */
}

static void free_ring(struct ibv_pd *pd, void *ctx, void *ptr, uint64_t type)
{
	(void)pd; (void)ctx;
	if (type == MLX5DV_RES_TYPE_QP) free((char *)ptr - 512);
}

static int offset(void)
{
	struct pair p;
	open_pair(&p);
	struct ibv_parent_domain_init_attr pa = { .pd = p.pd, .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
						  .alloc = ring_at_512, .free = free_ring };
	p.qp_pd = ibv_alloc_parent_domain(p.ctx, &pa);
	MUST(p.qp_pd, "ibv_alloc_parent_domain");
	struct qp a, b;
	make_qp(&p, &a);
	make_qp(&p, &b);
	connect_pair(&p, &a, &b, ALL_ACCESS);
	strcpy(a.buf, "sent 512 B in");
	struct ibv_sge rs = { .addr = (uintptr_t)b.buf + 64, .length = 64, .lkey = b.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	MUST(!ibv_post_recv(b.qp, &rw, &rbad), "ibv_post_recv");
	struct ibv_sge ss = { .addr = (uintptr_t)a.buf, .length = 16, .lkey = a.mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	MUST(!ibv_post_send(a.qp, &sw, &sbad), "ibv_post_send");
	int st = poll_one(a.cq, 5000).status;
	CHECK(st == IBV_WC_SUCCESS, "send from a QP whose ring is at a sub-page offset: status %d", st);
	st = poll_one(b.cq, 5000).status;
	CHECK(st == IBV_WC_SUCCESS, "receive on a QP whose ring is at a sub-page offset: status %d", st);
	CHECK(!strcmp(b.buf + 64, "sent 512 B in"), "the received bytes differ: \"%.16s\"", b.buf + 64);
	st = one_request(&a, &b, IBV_WR_RDMA_WRITE);
	CHECK(st == IBV_WC_SUCCESS, "write from a QP whose ring is at a sub-page offset: status %d", st);
	free_qp(&a);
	free_qp(&b);
	ibv_dealloc_pd(p.qp_pd);
	ibv_dealloc_pd(p.pd);
	ibv_close_device(p.ctx);
	return failed;
}

/* Two QPs, each on a parent domain with a thread domain of its own: libmlx5 gives each thread
 * domain a dedicated BlueFlame register of a dynamic UAR (one page, its two registers), names
 * the page in CREATE_QP and rings the register it chose. Under the legacy ABI the thread
 * domain is refused, as an old kernel without dynamic UARs makes libmlx5 refuse it. */
static int thread_domains(void)
{
	struct pair p;
	open_pair(&p);
	struct ibv_device_attr_ex ex;
	CHECK(!ibv_query_device_ex(p.ctx, NULL, &ex) && ex.orig_attr.max_qp > 0, "ibv_query_device_ex: %s",
	      strerror(errno));
	struct ibv_td_init_attr ta = {0};
	struct ibv_td *td[2] = { ibv_alloc_td(p.ctx, &ta), ibv_alloc_td(p.ctx, &ta) };
	const char *abi = getenv("UVEMU_ABI");
	if (abi && !strcmp(abi, "write")) {
		CHECK(!td[0], "a thread domain on the legacy ABI (no dynamic UARs)");
		ibv_dealloc_pd(p.pd);
		ibv_close_device(p.ctx);
		return failed;
	}
	MUST(td[0] && td[1], "ibv_alloc_td");
	struct ibv_pd *pd[2];
	struct qp q[2];
	for (int i = 0; i < 2; i++) {
		struct ibv_parent_domain_init_attr pa = { .pd = p.pd, .td = td[i] };
		pd[i] = ibv_alloc_parent_domain(p.ctx, &pa);
		MUST(pd[i], "ibv_alloc_parent_domain");
		p.qp_pd = pd[i];
		make_qp(&p, &q[i]);
	}
	connect_pair(&p, &q[0], &q[1], ALL_ACCESS);
	int (*count)(uint64_t *, uint64_t *) = (int (*)(uint64_t *, uint64_t *))dlsym(RTLD_DEFAULT, "uvemu_dyn_uar_count");
	uint64_t uars = 0, qps = 0;
	MUST(count && !count(&uars, &qps), "uvemu_dyn_uar_count");
	CHECK(qps == 2 && uars >= 2, "%llu dynamic UARs, %llu QPs on one", (unsigned long long)uars,
	      (unsigned long long)qps);
	/* Each rings its own register: a send each way, a write each way. */
	for (int i = 0; i < 2; i++) {
		struct qp *a = &q[i], *b = &q[1 - i];
		snprintf(a->buf, 32, "from the thread domain %d", i);
		struct ibv_sge rs = { .addr = (uintptr_t)b->buf + 64, .length = 64, .lkey = b->mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
		MUST(!ibv_post_recv(b->qp, &rw, &rbad), "ibv_post_recv");
		struct ibv_sge ss = { .addr = (uintptr_t)a->buf, .length = 32, .lkey = a->mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *sbad;
		MUST(!ibv_post_send(a->qp, &sw, &sbad), "ibv_post_send");
		int st = poll_one(a->cq, 5000).status;
		CHECK(st == IBV_WC_SUCCESS, "send from thread domain %d: status %d", i, st);
		st = poll_one(b->cq, 5000).status;
		CHECK(st == IBV_WC_SUCCESS, "receive from thread domain %d: status %d", i, st);
		CHECK(!strcmp(b->buf + 64, a->buf), "the received bytes differ: \"%.32s\"", b->buf + 64);
		st = one_request(a, b, IBV_WR_RDMA_WRITE);
		CHECK(st == IBV_WC_SUCCESS, "write from thread domain %d: status %d", i, st);
	}
	for (int i = 0; i < 2; i++) {
		free_qp(&q[i]);
		ibv_dealloc_pd(pd[i]);
		CHECK(!ibv_dealloc_td(td[i]), "ibv_dealloc_td");
	}
	ibv_dealloc_pd(p.pd);
	ibv_close_device(p.ctx);
	return failed;
}

/* -------------------------------------------------------------------------------- peer */

static void gid_text(const union ibv_gid *g, char out[33])
{
	for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", g->raw[i]);
}

static int gid_parse(const char *t, union ibv_gid *g)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(t + 2 * i, "%2x", &v) != 1) return -1;
		g->raw[i] = (uint8_t)v;
	}
	return 0;
}

/* One QP with RECVS receives posted at INIT, driven by commands on stdin, one a line, each
 * answered with one line on stdout:
 *   peer QPN GID   the peer's address        -> "ok"
 *   rtr            INIT -> RTR, timed        -> "rtr MS" or "FAIL ..."
 *   rts            RTR -> RTS                -> "ok"
 *   post           a send, not waited for    -> "ok"
 *   wait           the send's completion     -> "send STATUS"
 *   recv           a receive's completion    -> "recv STATUS" (-1: none within 5 s)
 *   quiet MS       receive completions in MS -> "quiet N STATE" (N completions; QP state)
 *   guid           the device's node GUID    -> "guid GUID"
 *   exit           destroys all and exits 0 (a clean exit) */
#define RECVS 4
static int peer(void)
{
	struct pair p;
	open_pair(&p);
	struct qp q;
	make_qp(&p, &q);
	MUST(!to_init(q.qp, ALL_ACCESS), "INIT");
	for (int i = 0; i < RECVS; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)q.buf + 256 * (i + 1), .length = 64, .lkey = q.mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		MUST(!ibv_post_recv(q.qp, &w, &bad), "ibv_post_recv");
	}
	char gid[33], line[256], arg[64];
	gid_text(&p.gid, gid);
	printf("addr %u %s\n", q.qp->qp_num, gid);
	fflush(stdout);
	uint32_t dqpn = 0;
	union ibv_gid dgid;
	while (fgets(line, sizeof(line), stdin)) {
		if (sscanf(line, "peer %u %40s", &dqpn, arg) == 2 && !gid_parse(arg, &dgid)) {
			printf("ok\n");
		} else if (!strncmp(line, "rtr", 3)) {
			double t = now_ms();
			if (to_rtr(q.qp, dqpn, &dgid)) printf("FAIL RTR: %s\n", strerror(errno));
			else printf("rtr %.0f\n", now_ms() - t);
		} else if (!strncmp(line, "rts", 3)) {
			printf(to_rts(q.qp) ? "FAIL RTS\n" : "ok\n");
		} else if (!strncmp(line, "post", 4)) {
			struct ibv_sge s = { .addr = (uintptr_t)q.buf, .length = 8, .lkey = q.mr->lkey };
			struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED }, *bad;
			printf(ibv_post_send(q.qp, &w, &bad) ? "FAIL post\n" : "ok\n");
		} else if (!strncmp(line, "wait", 4)) {
			printf("send %d\n", poll_one(q.cq, 10000).status);
		} else if (!strncmp(line, "recv", 4)) {
			printf("recv %d\n", poll_one(q.cq, 5000).status);
		} else if (sscanf(line, "quiet %63s", arg) == 1) {
			int n = 0;
			double end = now_ms() + atof(arg);
			struct ibv_wc wc;
			while (now_ms() < end) n += ibv_poll_cq(q.cq, 1, &wc) == 1;
			struct ibv_qp_attr a;
			struct ibv_qp_init_attr ia;
			int st = ibv_query_qp(q.qp, &a, IBV_QP_STATE, &ia) ? -1 : (int)a.qp_state;
			printf("quiet %d %d\n", n, st);
		} else if (!strncmp(line, "guid", 4)) {
			struct ibv_device_attr da;
			char g[64];
			MUST(!ibv_query_device(p.ctx, &da), "ibv_query_device");
			guid_text(da.node_guid, g);
			printf("guid %s\n", g);
		} else if (!strncmp(line, "exit", 4)) {
			break;
		} else {
			printf("FAIL unknown command %s", line);
		}
		fflush(stdout);
	}
	free_qp(&q);
	ibv_dealloc_pd(p.pd);
	ibv_close_device(p.ctx);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *mode = argc > 1 ? argv[1] : "";
	if (!strcmp(mode, "query")) return query();
	if (!strcmp(mode, "access")) return access_flags();
	if (!strcmp(mode, "offset")) return offset();
	if (!strcmp(mode, "td")) return thread_domains();
	if (!strcmp(mode, "peer")) return peer();
	fprintf(stderr, "usage: %s query|access|offset|td|peer\n", argv[0]);
	return 2;
}
