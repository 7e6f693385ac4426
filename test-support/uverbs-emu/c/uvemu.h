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
#include <stddef.h>
#include <stdint.h>

#define UVEMU_MAX_DEVICES 8
#define UVEMU_MAX_PORTS 4
#define UVEMU_MAX_OBJECTS 1024 /* per context; handle = index + 1 */
#define UVEMU_MAX_UAR_PAGES 64
#define UVEMU_GIDS 16 /* GID table entries per port (what QUERY_PORT reports) */

enum uvemu_obj_type { UVEMU_FREE = 0, UVEMU_PD, UVEMU_MR, UVEMU_CQ, UVEMU_QP, UVEMU_UAR };

struct uvemu_port {
	int ethernet;   /* 1: RoCE (link layer Ethernet), 0: InfiniBand */
	uint16_t lid;   /* InfiniBand LID (0 on Ethernet) */
	int active;     /* port state ACTIVE (else DOWN) */
	uint8_t gid[UVEMU_GIDS][16]; /* the GID table (from the fake sysfs) */
};

struct uvemu_device {
	char name[64];  /* mlx5_0 */
	uint64_t node_guid; /* from the fake sysfs (host order): what QUERY_DEVICE reports too */
	int nports;
	struct uvemu_port port[UVEMU_MAX_PORTS]; /* port[0] is port 1 */
};

struct uvemu_obj {
	enum uvemu_obj_type type;
	int served;     /* handed to the attached HCA (its numbers and keys are the HCA's) */
	uint32_t refs;  /* objects that name this one (MRs and QPs a PD, QPs a CQ) */
	uint32_t async_events; /* raised about it: its destroy reports the count, and libibverbs
	                        * waits until that many are acknowledged */
	union {
		struct { uint32_t pdn; } pd;
		struct { uint32_t pd; uint64_t start, length, iova; uint32_t access, lkey, rkey; int dmabuf_fd; } mr;
		struct { uint64_t buf, dbrec, user_handle; uint32_t entries, cqe_size, cqn; } cq;
		/* A dynamic UAR (MLX5_IB_OBJECT_UAR): its page id (the firmware's UAR index) and
		 * the page the process mapped at its mmap offset (0: not mapped yet). */
		struct { uint32_t page_id, type; uint64_t page; } uar;
		struct {
			uint32_t pd, send_cq, recv_cq, qpn;
			uint64_t user_handle;                  /* what async events about it carry */
			uint64_t buf, dbrec, bf_reg;           /* ring, doorbell record, BlueFlame register */
			uint64_t bf_reg2;                      /* the other register of its dynamic UAR page (0: none) */
			uint32_t sq_wqebbs, rq_wqes, rq_stride; /* rings: RQ at buf, SQ after it */
			uint32_t bfreg, uidx;
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
	int dyn_uar;                    /* the library asked for dynamic UARs (MLX5_LIB_CAP_DYN_UAR)
	                                 * and the ioctl ABI is served: no static UAR pages */
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
/* Runs `hook` (NULL: none) in every later write() command that has a response buffer, after
 * the buffer was found writable and before the response is written, with the buffer's address
 * and length: a test changes the buffer's protection there, as another thread could. */
int uvemu_test_before_response(void (*hook)(void *out, size_t len, void *arg), void *arg);

/* The data path: a soft HCA that a process under the emulator attaches (gdsync's soft device,
 * through uvemu_attach_hca()). From then on every MR, CQ and QP created is handed to it with
 * libmlx5's own buffers, and its numbers and keys are the ones libmlx5 gets: it executes the
 * WQEs libmlx5 writes when libmlx5 rings the BlueFlame register, and writes CQEs into
 * libmlx5's CQ rings. Objects created before it attached stay unserved. `dev` is the device
 * index (uvemu_device()). Each returns 0 or an errno; all are called with the driver's lock
 * held, from the thread that issued the command. */
struct uvemu_hca_qp {
	uint32_t pdn, send_cqn, recv_cqn;
	uint64_t buf, dbrec, bf_reg;        /* ring (RQ at buf, SQ after it), doorbell record, BlueFlame register */
	uint32_t rq_wqes, rq_stride, sq_wqebbs;
	uint32_t user_index;                /* libmlx5's uidx: CQEs carry it (CQE version 1) */
	uint64_t bf_reg2;                   /* 0, or a second BlueFlame register of the same page
	                                     * that may ring the QP: a QP on a dynamic UAR page
	                                     * (MLX5_QP_FLAG_UAR_PAGE_INDEX) names only the page,
	                                     * and libmlx5 rings either of its two registers */
};
#define UVEMU_ENDPOINT_LEN 72             /* gdsync's endpoint wire form */
struct uvemu_hca_rtr {                      /* INIT -> RTR */
	int32_t dest_dev;                   /* the device of this process the path's address is,
	                                     * or -1: a device of another node (peer below) */
	uint32_t dest_qpn, rq_psn, mtu;     /* mtu in bytes */
	uint8_t peer[UVEMU_ENDPOINT_LEN];   /* what that node's HCA published (uvemu_publish) */
};
struct uvemu_hca_rts {                      /* RTR -> RTS, with the IB encodings of the timers */
	uint32_t sq_psn;
	uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
};
/* In reg_mr's access flags: a dma-buf region, at its IOVA (which gdsync gives as the GPU
 * address the dma-buf exports: the HCA moves its bytes through the GPU's driver). */
#define UVEMU_MR_DMABUF (1u << 31)
struct uvemu_hca_ops {
	int (*reg_mr)(int dev, uint32_t pdn, uint64_t addr, uint64_t len, uint32_t access, uint32_t *lkey, uint32_t *rkey);
	void (*dereg_mr)(int dev, uint32_t lkey);
	int (*create_cq)(int dev, uint64_t buf, uint32_t entries, uint64_t dbrec, uint32_t *cqn);
	void (*destroy_cq)(int dev, uint32_t cqn);
	int (*create_qp)(int dev, const struct uvemu_hca_qp *qp, uint32_t *qpn);
	int (*to_init)(int dev, uint32_t qpn);
	int (*to_rtr)(int dev, uint32_t qpn, const struct uvemu_hca_rtr *rtr);
	int (*to_rts)(int dev, uint32_t qpn, const struct uvemu_hca_rts *rts);
	void (*destroy_qp)(int dev, uint32_t qpn);
	/* The QP's state as the HCA holds it (enum ib_qp_state; -1: unknown), or NULL: QUERY_QP
	 * then reports ERR once the HCA moved the QP there on its own, as a kernel asks the firmware. */
	int (*qp_state)(int dev, uint32_t qpn);
	/* The remote access the QP grants its peer (IB_ACCESS_REMOTE_WRITE/READ/ATOMIC bits of
	 * ib_uverbs_modify_qp's qp_access_flags), at INIT and at every later modify that sets
	 * them: the responder refuses what is not granted, with a remote access error NAK. */
	int (*qp_access)(int dev, uint32_t qpn, uint32_t access);
};
/* The number of emulated devices. */
int uvemu_device_count(void);
/* Attaches the HCA that serves the data path (once: EBUSY after). 0 or an errno. */
int uvemu_attach_hca(const struct uvemu_hca_ops *ops);
/* Several processes under one emulator share its devices as processes of a host share its
 * HCA: each has a share of the QP numbers, slot s owning s << 12 | 1 ..= s << 12 | 0xfff, so a
 * QP number names its process. The slot of this process (claimed on the fabric at the first
 * call, as <fabric>/node-<node>/slot-<s> holding the pid; 0 without a fabric), or a negative
 * errno (-EBUSY: all slots are taken). */
#define UVEMU_QPN_SLOT_SHIFT 12
#define UVEMU_QPN_SLOTS 16
int uvemu_qpn_slot(void);
/* Publishes how the HCA's device `dev` is reached from other processes (its endpoint, `len`
 * bytes) in the fabric directory, as <fabric>/node-<node>/dev-<dev>.<slot>: a QP given an
 * address of this device and a QP number of this process's slot is linked to it. 0 or an
 * errno (ENOENT: the tree names no fabric). */
int uvemu_publish(int dev, const uint8_t *endpoint, uint32_t len);
#endif
