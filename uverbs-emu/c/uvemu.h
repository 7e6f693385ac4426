/* uvemu.h - the emulated kernel driver's object tables.
 *
 * Everything a HCA would know about the objects libmlx5 created through the emulated
 * /dev/infiniband/uverbsN: per device context, its UAR pages, PDs, MRs, CQs (CQE ring and
 * doorbell record addresses) and QPs (ring, doorbell record, BlueFlame register, state and
 * connection attributes). A soft HCA serving the data path reads these tables
 * (uvemu_context()) instead of hardware registers.
 */
#ifndef UVEMU_H
#define UVEMU_H
#include <stdint.h>

#define UVEMU_MAX_DEVICES 8
#define UVEMU_MAX_PORTS 4
#define UVEMU_MAX_OBJECTS 1024 /* per context; handle = index + 1 */
#define UVEMU_MAX_UAR_PAGES 64

enum uvemu_obj_type { UVEMU_FREE = 0, UVEMU_PD, UVEMU_MR, UVEMU_CQ, UVEMU_QP };

struct uvemu_port {
	int ethernet;   /* 1: RoCE (link layer Ethernet), 0: InfiniBand */
	uint16_t lid;   /* InfiniBand LID (0 on Ethernet) */
	int active;     /* port state ACTIVE (else DOWN) */
};

struct uvemu_device {
	char name[64];  /* mlx5_0 */
	int nports;
	struct uvemu_port port[UVEMU_MAX_PORTS]; /* port[0] is port 1 */
};

struct uvemu_obj {
	enum uvemu_obj_type type;
	uint32_t refs;  /* objects that name this one (MRs and QPs a PD, QPs a CQ) */
	uint32_t async_events; /* raised about it: its destroy reports the count, and libibverbs
	                        * waits until that many are acknowledged */
	union {
		struct { uint32_t pdn; } pd;
		struct { uint32_t pd; uint64_t start, length, iova; uint32_t access, lkey, rkey; int dmabuf_fd; } mr;
		struct { uint64_t buf, dbrec, user_handle; uint32_t entries, cqe_size, cqn; } cq;
		struct {
			uint32_t pd, send_cq, recv_cq, qpn;
			uint64_t user_handle;                  /* what async events about it carry */
			uint64_t buf, dbrec, bf_reg;           /* ring, doorbell record, BlueFlame register */
			uint32_t sq_wqebbs, rq_wqes, rq_stride; /* rings: RQ at buf, SQ after it */
			uint32_t bfreg;
			uint8_t state, port, path_mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer;
			uint8_t max_rd_atomic, max_dest_rd_atomic, hop_limit, traffic_class, sl;
			uint32_t dest_qpn, rq_psn, sq_psn, access;
			uint8_t dgid[16];
			uint16_t dlid;
			uint8_t is_global, sgid_index;
		} qp;
	} u;
};

struct uvemu_context {
	int in_use;
	int cmd_fd, async_rd, async_wr; /* async events: ib_uverbs_async_event_desc into async_wr */
	int dev;                        /* index into the device table */
	uint32_t tot_bfregs;
	void *uar[UVEMU_MAX_UAR_PAGES]; /* UAR page stand-ins, by page index */
	struct uvemu_obj obj[UVEMU_MAX_OBJECTS];
};

/* The context served on command fd `fd`, or NULL. */
const struct uvemu_context *uvemu_context(int fd);
/* The device table (from the fake sysfs under SYSFS_PATH). */
const struct uvemu_device *uvemu_device(int index);

/* Test controls, called through dlsym by a process running under the emulator; each returns
 * 0 or an errno. */
/* Sets port `port` (from 1) of device `name` ACTIVE or DOWN, as the link going up or down
 * would, and raises IBV_EVENT_PORT_ACTIVE or IBV_EVENT_PORT_ERR on every context of it. */
int uvemu_set_port_state(const char *name, int port, int active);
/* Moves the QP numbered `qpn` to the error state and raises IBV_EVENT_QP_FATAL on its
 * context, as a HCA does for an error it cannot report in a completion. */
int uvemu_qp_fatal(uint32_t qpn);
#endif
