/* uvemu.c - an emulated kernel driver for the real libibverbs + libmlx5 (LD_PRELOAD).
 *
 * rdma-core finds devices through RDMA netlink, else through sysfs under $SYSFS_PATH; it opens
 * /dev/infiniband/uverbsN, and for each ioctl method the kernel answers EPROTONOSUPPORT (or
 * all of them, ENOTTY) it speaks the legacy write() command ABI. This library:
 *   - refuses socket(AF_NETLINK, NETLINK_RDMA), so that sysfs discovery runs;
 *   - fakes stat/open/fstat/close of /dev/infiniband/uverbsN for each device the fake sysfs
 *     lists (a memfd dressed as character device 231:192+N);
 *   - serves RDMA_VERBS_IOCTL's native verbs methods for the objects below (GET_CONTEXT,
 *     QUERY_PORT, QUERY_GID_ENTRY/TABLE, ASYNC_EVENT_ALLOC, CQ/QP create and destroy, MR and
 *     PD destroy: what libibverbs tries first, each run through its write() command's
 *     handler where it has one) and
 *     DEVICE/INVOKE_WRITE (the write() commands below carried as ioctl attributes, which
 *     libibverbs uses for the commands without a native method; $UVEMU_ABI=write turns all
 *     of these off, for the legacy ABI) and MR/REG_DMABUF_MR (ioctl-only); answers
 *     other methods with EPROTONOSUPPORT, as a kernel without the method does: libibverbs then
 *     falls back to INVOKE_WRITE or write(), or skips what the device lacks;
 *   - serves the write() commands of the control path with mlx5 driver data, keeping every
 *     object in per-context tables (uvemu.h) with the checks the kernel makes: handles of the
 *     right type and context, references that forbid destroying a PD or CQ still in use, QP
 *     state transitions with their required attributes, response lengths honoured;
 *   - backs UAR mmaps with anonymous shared pages and records them;
 *   - raises async events (port up/down, QP fatal, CQ error) on the contexts' async fds when
 *     a test asks through uvemu_set_port_state() / uvemu_qp_fatal() (uvemu.h) /
 *     uvemu_cq_error() (below);
 *   - counts the commands it serves by kind (a ConnectX's kernel driver turns most of them
 *     into firmware commands: QUERY_QP, MODIFY_QP, CREATE_CQ...), for tests to read through
 *     uvemu_command_count() (below);
 *   - hands every MR, CQ and QP, with libmlx5's own rings, doorbell records and BlueFlame
 *     register, to the soft HCA a process attached (uvemu_attach_hca(), uvemu.h), which then
 *     serves the data path; without one, nothing executes WQEs. Where $UVEMU_HCA names a
 *     library (scripts/with-emulated-hca names gdasync's test-support/emulated-hca), a process's
 *     first open of a uverbs device with no HCA attached loads it and attaches its soft HCA, so
 *     any verbs program is served (see auto_hca());
 *   - pins what it hands to the HCA, as a kernel does: the process's munmap, mremap, mprotect,
 *     mmap(MAP_FIXED), free and realloc of pinned pages are put off or refused until the
 *     object is destroyed (see "pinned memory" below);
 *   - writes every response with a fault-safe copy (EFAULT, never a crash);
 *   - links QPs to devices of other processes through the fabric directory (the emulators of
 *     a host are its nodes; uverbs-emu's fabric.rs): a path whose GID or LID names another
 *     node's device is given to the HCA with the endpoint that node's HCA published there.
 * UVEMU_LOG=1 traces every command to stderr.
 */
#define _GNU_SOURCE
#include "uvemu.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <stdint.h>
#include <time.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <malloc.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/mlx5-abi.h>
#include <rdma/mlx5_user_ioctl_cmds.h>
#include <rdma/mlx5_user_ioctl_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#define DEV_PREFIX "/dev/infiniband/uverbs"
#define DEV_MAJOR 231
#define DEV_MINOR0 192
#define MAX_CONTEXTS 64
#define BFREGS_PER_PAGE 2   /* legacy static UARs: two BlueFlame registers per 4 KiB page */
#define MAX_CMD_BYTES (1u << 20) /* a write() command larger than any verbs command */
#define MAX_IOCTL_ATTRS 64
/* mmap commands of the entries the kernel inserts (MLX5_IB_MMAP_OFFSET_START in the kernel's
 * mlx5_ib.h): a dynamic UAR's mmap offset carries this command and the entry's index. */
#define MMAP_OFFSET_START 9
/* A dynamic UAR's page id: the firmware's UAR index, past the static pages' ones. */
#define DYN_UAR_PAGE_ID(handle) (UVEMU_MAX_UAR_PAGES + (handle))
/* The bfreg index a QP on a dynamic UAR is answered with (MLX5_IB_INVALID_BFREG). */
#define INVALID_BFREG (1u << 31)

/* Mask bits, as enum ib_qp_attr_mask names them (not in the uapi headers). */
enum {
	IB_QP_STATE_MASK = 1, IB_QP_ACCESS_FLAGS_MASK = 8, IB_QP_PKEY_INDEX_MASK = 16, IB_QP_PORT_MASK = 32,
	IB_QP_AV_MASK = 128, IB_QP_PATH_MTU_MASK = 256, IB_QP_TIMEOUT_MASK = 512, IB_QP_RETRY_CNT_MASK = 1024,
	IB_QP_RNR_RETRY_MASK = 2048, IB_QP_RQ_PSN_MASK = 4096, IB_QP_MAX_QP_RD_ATOMIC_MASK = 8192,
	IB_QP_MIN_RNR_TIMER_MASK = 32768, IB_QP_SQ_PSN_MASK = 65536, IB_QP_MAX_DEST_RD_ATOMIC_MASK = 131072,
	IB_QP_DEST_QPN_MASK = 1048576,
};

/* QP states and link layers, as enum ib_qp_state and the port's link_layer name them. */
enum { QPS_RESET = 0, QPS_INIT = 1, QPS_RTR = 2, QPS_RTS = 3, QPS_ERR = 6 };
enum { LINK_LAYER_INFINIBAND = 1, LINK_LAYER_ETHERNET = 2 };
/* Async event types, as enum ib_event_type names them (not in the uapi headers either). */
enum { IB_EVENT_CQ_ERR = 0, IB_EVENT_QP_FATAL = 1, IB_EVENT_PORT_ACTIVE = 9, IB_EVENT_PORT_ERR = 10 };

static int (*r_open)(const char *, int, ...);
static int (*r_close)(int);
static int (*r_ioctl)(int, unsigned long, ...);
static ssize_t (*r_write)(int, const void *, size_t);
static void *(*r_mmap)(void *, size_t, int, int, int, off_t);
static int (*r_socket)(int, int, int);
static int (*r_stat)(const char *, struct stat *);
static int (*r_fstat)(int, struct stat *);
#ifdef UVEMU_PRELOAD
static void (*r_free)(void *);
static void *(*r_realloc)(void *, size_t);
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
/* Recursive: the attached HCA runs under it and may itself call hooked functions on the
 * emulator's fds. Calls on other fds never take it (is_cmd_fd). */
static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static const struct uvemu_hca_ops *hca; /* the data path, once attached */
static void hca_release_all(struct uvemu_context *c);
static int abi_ioctl(void);
static void pins_before_fork(void);
static void pins_after_fork(void);
static const struct uvemu_port *port_of(const struct uvemu_context *c, uint32_t port);
static int logging;
static int node;           /* this emulator's node number on the fabric (0: none) */
static char fabric[400];   /* the fabric directory ("": none) */
/* Dynamic UARs allocated (MLX5_IB_OBJECT_UAR) and QPs created on one, since the start. */
static uint64_t dyn_uars_made, dyn_uar_qps_made;
static int ndevices;
static struct uvemu_device devices[UVEMU_MAX_DEVICES];
static struct uvemu_context contexts[MAX_CONTEXTS];
/* The async event file of each context went to the caller (write GET_CONTEXT returns it;
 * native GET_CONTEXT leaves it to ASYNC_EVENT_ALLOC). Indexed as contexts[]. */
static int async_given[MAX_CONTEXTS];
static uint32_t next_qpn = 0x100, next_cqn = 0x400, next_key = 0x1000, next_pdn = 0x10;

static void L(const char *fmt, ...)
{
	if (!logging) return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "[uvemu] ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* ------------------------------------------------------------------ devices from sysfs */

/* First line of $SYSFS_PATH/<rel>, or "" (returns 0 when absent). */
static int read_sysfs(const char *rel, char *out, size_t n)
{
	const char *root = getenv("SYSFS_PATH");
	char path[512];
	out[0] = 0;
	if (!root || snprintf(path, sizeof(path), "%s/%s", root, rel) >= (int)sizeof(path)) return 0;
	FILE *f = fopen(path, "r");
	if (!f) return 0;
	if (!fgets(out, (int)n, f)) out[0] = 0;
	fclose(f);
	out[strcspn(out, "\n")] = 0;
	return 1;
}

/* The value of environment variable `name` (a test's setting of a device limit), or `def`. */
static uint32_t env_u32(const char *name, uint32_t def)
{
	const char *e = getenv(name);
	return e && *e ? (uint32_t)strtoul(e, NULL, 0) : def;
}

/* A GUID as sysfs writes it ("0c42:a103:0001:0001"), in host order (0 if malformed). */
static uint64_t guid_of(const char *text)
{
	unsigned a, b, c, d;
	if (sscanf(text, "%4x:%4x:%4x:%4x", &a, &b, &c, &d) != 4) return 0;
	return (uint64_t)a << 48 | (uint64_t)b << 32 | (uint64_t)c << 16 | d;
}

static void load_devices(void)
{
	char rel[256], v[64];
	for (int d = 0; d < UVEMU_MAX_DEVICES; d++) {
		snprintf(rel, sizeof(rel), "class/infiniband_verbs/uverbs%d/ibdev", d);
		if (!read_sysfs(rel, v, sizeof(v)) || !v[0]) break;
		struct uvemu_device *dev = &devices[ndevices++];
		snprintf(dev->name, sizeof(dev->name), "%s", v);
		snprintf(rel, sizeof(rel), "class/infiniband/%s/node_guid", dev->name);
		dev->node_guid = read_sysfs(rel, v, sizeof(v)) ? guid_of(v) : 0;
		for (int p = 1; p <= UVEMU_MAX_PORTS; p++) {
			snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%d/link_layer", dev->name, p);
			if (!read_sysfs(rel, v, sizeof(v))) break;
			struct uvemu_port *port = &dev->port[dev->nports++];
			port->ethernet = !strcmp(v, "Ethernet");
			snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%d/lid", dev->name, p);
			port->lid = read_sysfs(rel, v, sizeof(v)) ? (uint16_t)strtoul(v, NULL, 0) : 0;
			snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%d/state", dev->name, p);
			port->active = read_sysfs(rel, v, sizeof(v)) && v[0] == '4';
			for (int i = 0; i < UVEMU_GIDS; i++) {
				snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%d/gids/%d", dev->name, p, i);
				if (!read_sysfs(rel, v, sizeof(v)) || inet_pton(AF_INET6, v, port->gid[i]) != 1)
					memset(port->gid[i], 0, 16);
			}
		}
		L("device uverbs%d = %s, %d port(s)", d, dev->name, dev->nports);
	}
}

static void init(void)
{
	r_open = dlsym(RTLD_NEXT, "open");
	r_close = dlsym(RTLD_NEXT, "close");
	r_ioctl = dlsym(RTLD_NEXT, "ioctl");
	r_write = dlsym(RTLD_NEXT, "write");
	r_mmap = dlsym(RTLD_NEXT, "mmap");
	r_socket = dlsym(RTLD_NEXT, "socket");
	r_stat = dlsym(RTLD_NEXT, "stat");
	r_fstat = dlsym(RTLD_NEXT, "fstat");
#ifdef UVEMU_PRELOAD
	r_realloc = dlsym(RTLD_NEXT, "realloc");
	r_free = dlsym(RTLD_NEXT, "free");
#endif
	pthread_atfork(pins_before_fork, pins_after_fork, pins_after_fork);
	const char *e = getenv("UVEMU_LOG");
	logging = e && strcmp(e, "0") != 0;
	load_devices();
	char v[16];
	node = read_sysfs("uvemu/node", v, sizeof(v)) ? atoi(v) : 0;
	if (!read_sysfs("uvemu/fabric", fabric, sizeof(fabric))) fabric[0] = 0;
}

static void ensure_init(void) { pthread_once(&once, init); }

/* Every process served: where $UVEMU_HCA names a library exporting
 * `int gdasync_emulated_hca_attach(void)` (gdasync's test-support/emulated-hca, which
 * scripts/with-emulated-hca builds and names), the first open of a uverbs device in a process
 * with no HCA attached yet loads it and attaches its soft HCA, so any verbs program's work
 * executes. It runs at that open, never at start: shells and programs that never open a uverbs
 * device load nothing. A gdasync process attaches its own soft HCA before it opens a device
 * (serve_emulated_driver()), and then nothing is loaded; one that opened a device first finds
 * this HCA attached when it asks (uvemu_hca_attached()) and is served by it: never two. Called without the lock held (the
 * attach takes it); a failure is reported on stderr and the process runs unserved. */
int uvemu_hca_attached(void);
/* The loaded soft HCA's gdasync_emulated_hca_progress, where it has one (see ibv_open_device). */
static void (*hca_progress)(void);
/* Its count of RDMA writes taken in as responder (gdasync_emulated_hca_writes_taken_in), where it
 * has one. */
static uint64_t (*hca_writes_taken_in)(void);
static pthread_once_t auto_hca_once = PTHREAD_ONCE_INIT;
static void auto_hca(void)
{
	const char *path = getenv("UVEMU_HCA");
	if (!path || !*path || uvemu_hca_attached()) return;
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	int (*attach)(void) = lib ? (int (*)(void))dlsym(lib, "gdasync_emulated_hca_attach") : NULL;
	if (!attach) {
		fprintf(stderr, "uvemu: UVEMU_HCA=%s: %s: no soft HCA serves this process\n", path,
			lib ? "no gdasync_emulated_hca_attach" : dlerror());
		return;
	}
	int rc = attach();
	L("soft HCA from %s: %s", path, rc ? strerror(rc) : "attached");
	if (rc) fprintf(stderr, "uvemu: the soft HCA of %s did not attach: %s\n", path, strerror(rc));
	else {
		hca_progress = (void (*)(void))dlsym(lib, "gdasync_emulated_hca_progress");
		hca_writes_taken_in = (uint64_t (*)(void))dlsym(lib, "gdasync_emulated_hca_writes_taken_in");
	}
}

/* Threads lent to the loaded soft HCA. A software RDMA provider runs its data path on the
 * threads that post and poll; the soft HCA does so for gdasync's own processes, and here for
 * any verbs program it was loaded into: ibv_open_device is wrapped, and the contexts it opens
 * get a post_send and a post_recv that run the HCA's pending rounds after posting, and a
 * poll_cq that runs them when the CQ was empty and polls again (gdasync_emulated_hca_progress:
 * gdsync::lend_thread, a no-op unless the soft engines progress on shared threads, on machines
 * with few cores, and a few loads unless a doorbell or a packet is waiting). A doorbell is
 * then served at once, and a packet for a thread that polls its CQ is taken in by that thread,
 * instead of at an engine thread's next look (on a busy 2-core machine tens of microseconds
 * later). Posts through the ibv_wr_* API (perftest's default) ring the doorbell in libmlx5
 * itself; their next poll_cq serves them. $UVEMU_LEND chooses: "all" (the default), "post"
 * (post_send and post_recv only), "0" (none). The slots are those of struct ibv_context_ops
 * after the context's device pointer (libibverbs' stable ABI: poll_cq is its 12th function
 * pointer, post_send and post_recv its 26th and 27th). */
typedef int (*poll_cq_fn)(void *cq, int n, void *wc);
typedef int (*post_fn)(void *q, void *wr, void **bad);
enum { OPS_AT = 1, POLL_CQ = OPS_AT + 11, POST_SEND = OPS_AT + 25, POST_RECV = OPS_AT + 26 };
static poll_cq_fn real_poll_cq;
static post_fn real_post_send, real_post_recv;

/* A poll that lingers. In a ping-pong over RDMA writes (ib_write_lat) each side spins on
 * memory for the peer's write and calls poll_cq only for its own write's completion: the
 * peer's next write then lands while nobody lends a thread, and waits for the engine thread's
 * next look (tens of microseconds on a busy machine). So where this thread saw a peer's RDMA
 * write land within its last LINGER_POLLS empty polls (writes both ways), an empty poll keeps
 * lending the thread for up to $UVEMU_LINGER_US microseconds (60; 0: never), and returns as
 * soon as a write landed (its data is then in memory) or the time is up, with any
 * completions found meanwhile. Sends, reads and atomics do not count: a program waiting for a
 * send polls its CQ (and lends its thread there); one that only reads or gets responses never
 * lingers, and pays one load. A thread whose peer stopped writing stops lingering after
 * LINGER_POLLS polls (about a millisecond). */
#define LINGER_POLLS 16u
/* $UVEMU_LINGER_US: the longest linger in microseconds (default 60; 0: never linger). */
static uint64_t linger_ns = 60000;
static __thread uint64_t writes_seen;
static __thread unsigned quiet_polls;

static uint64_t mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Whether a peer's write landed since this thread last looked. */
static int write_landed(void)
{
	uint64_t in = hca_writes_taken_in();
	if (in == writes_seen) return 0;
	writes_seen = in;
	quiet_polls = 0;
	return 1;
}

/* Reads $UVEMU_LINGER_US, once per process: a value that is no number of microseconds up to
 * 1 s gets a one-line error and the default stays. */
static void read_linger(void)
{
	const char *linger = getenv("UVEMU_LINGER_US");
	if (!linger || !*linger) return;
	char *end;
	errno = 0;
	unsigned long long us = strtoull(linger, &end, 10);
	if (errno || *end || us > 1000000)
		fprintf(stderr, "uvemu: UVEMU_LINGER_US=%s is not a number of microseconds up to 1000000 "
			"(0: never linger); lingering up to %llu us\n",
			linger, (unsigned long long)(linger_ns / 1000));
	else
		linger_ns = us * 1000;
}

static int lent_poll_cq(void *cq, int n, void *wc)
{
	int got = real_poll_cq(cq, n, wc);
	if (got != 0) return got;
	hca_progress();
	got = real_poll_cq(cq, n, wc);
	if (!hca_writes_taken_in || !linger_ns || got < 0 || write_landed() || writes_seen == 0 ||
	    ++quiet_polls > LINGER_POLLS)
		return got;
	uint64_t start = mono_ns();
	do {
		hca_progress();
		if (got == 0) got = real_poll_cq(cq, n, wc);
		if (got < 0 || write_landed()) break;
	} while (mono_ns() - start < linger_ns);
	if (got == 0) got = real_poll_cq(cq, n, wc);
	return got;
}

static int lent_post_send(void *qp, void *wr, void **bad)
{
	int rc = real_post_send(qp, wr, bad);
	hca_progress();
	return rc;
}

static int lent_post_recv(void *qp, void *wr, void **bad)
{
	int rc = real_post_recv(qp, wr, bad);
	hca_progress();
	return rc;
}

/* Swaps one slot for its lent form when it holds the function the first context held
 * (a context of another provider keeps its own). */
static void lend_slot(void **slot, void **real, void *lent)
{
	void *cur = *slot;
	if (!cur || cur == lent) return;
	void *expected = NULL;
	__atomic_compare_exchange_n(real, &expected, cur, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
	if (__atomic_load_n(real, __ATOMIC_ACQUIRE) == cur) *slot = lent;
}

void *ibv_open_device(void *dev)
{
	static void *(*real)(void *);
	if (!real) real = (void *(*)(void *))dlsym(RTLD_NEXT, "ibv_open_device");
	void *ctx = real ? real(dev) : NULL;
	const char *lend = getenv("UVEMU_LEND");
	if (!lend || !*lend) lend = "all";
	if (!ctx || !hca_progress || strcmp(lend, "0") == 0) return ctx;
	void **slots = ctx;
	lend_slot(&slots[POST_SEND], (void **)&real_post_send, (void *)lent_post_send);
	lend_slot(&slots[POST_RECV], (void **)&real_post_recv, (void *)lent_post_recv);
	int poll = strcmp(lend, "all") == 0;
	static pthread_once_t linger_once = PTHREAD_ONCE_INIT;
	pthread_once(&linger_once, read_linger);
	if (poll) lend_slot(&slots[POLL_CQ], (void **)&real_poll_cq, (void *)lent_poll_cq);
	L("ibv_open_device: post_send, post_recv%s lend their threads to the soft HCA",
	  poll ? " and poll_cq" : "");
	return ctx;
}

/* The device index of /dev/infiniband/uverbsN, or -1. */
static int device_of_path(const char *path)
{
	if (!path || strncmp(path, DEV_PREFIX, strlen(DEV_PREFIX))) return -1;
	char *end;
	long n = strtol(path + strlen(DEV_PREFIX), &end, 10);
	return (*end || end == path + strlen(DEV_PREFIX) || n < 0 || n >= ndevices) ? -1 : (int)n;
}

/* The command fds of the open contexts (fd + 1; 0: none), read without the lock: the calls
 * hooked for every fd (write, close, fstat, ioctl, mmap) take the lock only for these, so that
 * no thread's own I/O waits for a command the HCA serves under the lock (an RTR to a peer
 * process waits for that peer, whose TCP link this process's threads may be setting up). */
static int cmd_fds[MAX_CONTEXTS];
static int is_cmd_fd(int fd)
{
	for (int i = 0; fd >= 0 && i < MAX_CONTEXTS; i++)
		if (__atomic_load_n(&cmd_fds[i], __ATOMIC_ACQUIRE) == fd + 1) return 1;
	return 0;
}

static struct uvemu_context *context_of(int fd)
{
	for (int i = 0; i < MAX_CONTEXTS; i++)
		if (contexts[i].in_use && contexts[i].cmd_fd == fd) return &contexts[i];
	return NULL;
}

const struct uvemu_context *uvemu_context(int fd) { return context_of(fd); }
const struct uvemu_device *uvemu_device(int index)
{
	return index >= 0 && index < ndevices ? &devices[index] : NULL;
}

static void fake_chr(struct stat *st, int dev)
{
	memset(st, 0, sizeof(*st));
	st->st_mode = S_IFCHR | 0666;
	st->st_rdev = makedev(DEV_MAJOR, DEV_MINOR0 + dev);
	st->st_blksize = 4096;
}

/* ------------------------------------------------------------------ libc entry points */

int socket(int domain, int type, int protocol)
{
	ensure_init();
	if (domain == AF_NETLINK && protocol == NETLINK_RDMA) {
		L("socket(AF_NETLINK, NETLINK_RDMA) -> EPROTONOSUPPORT (sysfs discovery)");
		errno = EPROTONOSUPPORT;
		return -1;
	}
	return r_socket(domain, type, protocol);
}

int stat(const char *path, struct stat *st)
{
	ensure_init();
	int dev = device_of_path(path);
	if (dev >= 0) { fake_chr(st, dev); return 0; }
	return r_stat(path, st);
}
int stat64(const char *path, struct stat64 *st) __attribute__((alias("stat")));

int fstat(int fd, struct stat *st)
{
	ensure_init();
	if (!is_cmd_fd(fd)) return r_fstat(fd, st);
	pthread_mutex_lock(&lock);
	struct uvemu_context *c = context_of(fd);
	int dev = c ? c->dev : -1;
	pthread_mutex_unlock(&lock);
	if (dev >= 0) { fake_chr(st, dev); return 0; }
	return r_fstat(fd, st);
}
int fstat64(int fd, struct stat64 *st) __attribute__((alias("fstat")));

int open(const char *path, int flags, ...)
{
	ensure_init();
	mode_t mode = 0;
	if (flags & (O_CREAT | O_TMPFILE)) {
		va_list ap;
		va_start(ap, flags);
		mode = va_arg(ap, int);
		va_end(ap);
	}
	int dev = device_of_path(path);
	if (dev < 0) return r_open(path, flags, mode);
	int fd = memfd_create("uverbs", (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
	if (fd < 0) return -1;
	pthread_mutex_lock(&lock);
	struct uvemu_context *c = NULL;
	for (int i = 0; i < MAX_CONTEXTS && !c; i++)
		if (!contexts[i].in_use) c = &contexts[i];
	if (c) {
		memset(c, 0, sizeof(*c));
		c->in_use = 1;
		c->cmd_fd = fd;
		c->dev = dev;
		c->async_rd = c->async_wr = -1;
		__atomic_store_n(&cmd_fds[c - contexts], fd + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
	if (!c) { r_close(fd); errno = EMFILE; return -1; }
	L("open(%s) -> fd %d (%s)", path, fd, devices[dev].name);
	pthread_once(&auto_hca_once, auto_hca);
	return fd;
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int close(int fd)
{
	ensure_init();
	if (!is_cmd_fd(fd)) return r_close(fd);
	pthread_mutex_lock(&lock);
	struct uvemu_context *c = context_of(fd);
	if (c) {
		/* The kernel tears down whatever the process left; UAR pages stay mapped until
		 * libmlx5 unmaps them (it did before closing). */
		if (c->async_wr >= 0) r_close(c->async_wr);
		hca_release_all(c);
		L("close(cmd fd %d): context of %s released", fd, devices[c->dev].name);
		c->in_use = 0;
		__atomic_store_n(&cmd_fds[c - contexts], 0, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lock);
	return r_close(fd);
}

/* ------------------------------------------------------------------ the caller's memory */

/* The kernel answers a bad pointer in a command with EFAULT (copy_from_user, copy_to_user),
 * never a crash; so does the emulator: it moves the caller's bytes through a pipe of its own,
 * and the kernel checks both ends (write() from unreadable memory and read() into unwritable
 * memory fail with EFAULT), with no permission needed. Called with the lock held. */
static int copy_pipe[2] = { -1, -1 };

static void drain_copy_pipe(void)
{
	char b[4096];
	while (read(copy_pipe[0], b, sizeof(b)) > 0) {}
}

static int user_copy(void *dst, const void *src, size_t n)
{
	if (copy_pipe[0] < 0 && pipe2(copy_pipe, O_CLOEXEC | O_NONBLOCK) < 0) return errno;
	for (size_t off = 0; off < n; off += 4096) {
		size_t k = n - off < 4096 ? n - off : 4096; /* at most PIPE_BUF: all or nothing */
		if (r_write(copy_pipe[1], (const char *)src + off, k) != (ssize_t)k ||
		    read(copy_pipe[0], (char *)dst + off, k) != (ssize_t)k) {
			drain_copy_pipe();
			return EFAULT;
		}
	}
	return 0;
}

/* Whether the caller's `n` bytes at `p` can be written: read, then written back unchanged. */
static int user_writable(void *p, size_t n)
{
	char tmp[4096];
	for (size_t off = 0; off < n; off += sizeof(tmp)) {
		size_t k = n - off < sizeof(tmp) ? n - off : sizeof(tmp);
		int rc = user_copy(tmp, (char *)p + off, k);
		if (!rc) rc = user_copy((char *)p + off, tmp, k);
		if (rc) return rc;
	}
	return 0;
}

/* ------------------------------------------------------------------ pinned memory */

/* A kernel pins the pages of a region and of the rings it hands to the HCA: they stay with the
 * HCA until the object is destroyed, whatever the process does with its mapping. On a
 * ConnectX, a write that arrives after the process unmapped a registered buffer lands in the
 * pinned pages, which the process no longer sees: no crash, no error. The soft HCA writes at
 * the process's virtual addresses, so the emulator keeps those addresses mapped instead: an
 * unmapping of pinned pages (munmap, a shrinking mremap, free() or realloc() of the heap
 * block that holds them) is put off until the last object that pins them is destroyed. What
 * cannot be put off is refused, as no kernel would: MAP_FIXED over pinned pages, an mremap
 * that would move or grow them (ENOMEM), and an mprotect that takes away access the HCA uses
 * (EACCES). Unmappings glibc makes inside itself (other than through free() and realloc())
 * cannot be seen by a preload. The table has its own lock, never held while calling out, so
 * that no thread's free() waits for a command. */
#define MAX_PINS 4096
#define MAX_PUT_OFF 4096
#define PAGE_DOWN(a) ((a) & ~4095ull)
#define PAGE_UP(a) (((a) + 4095ull) & ~4095ull)
struct span { uint64_t start, end; int writable; };
static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;
static struct span pins[MAX_PINS];    /* bytes pinned by served objects (their pages are), by start */
static uint64_t max_end[MAX_PINS];    /* the highest end of pins[0..=i]: an overlap is a search */
static int npins;                     /* read without the lock: 0 is the fast path */
static struct span unmapped[MAX_PUT_OFF]; /* pages the process unmapped while pinned */
static int nunmapped;
static void *unfreed[MAX_PUT_OFF];    /* heap blocks freed while they held pinned pages */
static int nunfreed;

/* A fork while another thread holds pin_lock would leave it held in the child, whose first
 * free() would then wait for ever: the lock is taken across fork(), as malloc takes its own. */
static void pins_before_fork(void) { pthread_mutex_lock(&pin_lock); }
static void pins_after_fork(void) { pthread_mutex_unlock(&pin_lock); }

/* Whether `n` bytes at `a` can be rounded out to pages without overflow. */
static int fits(uint64_t a, uint64_t n) { return a <= UINT64_MAX - 4096 && n <= UINT64_MAX - 4096 - a; }

/* Whether [a, e) meets pinned bytes (`writable`: only pins the HCA writes); for page-aligned
 * [a, e), whether it meets a pinned page. Under pin_lock. Every free() asks, so the common
 * question is a binary search, not a walk of the table. A heap block is kept only if it holds
 * pinned bytes: malloc gives back no page that a block in use (the pinned one) shares. */
static int pinned(uint64_t a, uint64_t e, int writable)
{
	int lo = 0, hi = npins; /* the pins starting before e are pins[0..lo) */
	while (lo < hi) {
		int mid = (lo + hi) / 2;
		if (pins[mid].start < e) lo = mid + 1;
		else hi = mid;
	}
	if (!lo || max_end[lo - 1] <= a) return 0;
	for (int i = 0; writable && i < lo; i++)
		if (a < pins[i].end && pins[i].writable) return 1;
	return !writable;
}

/* Recomputes max_end from pins[from] on. Under pin_lock. */
static void pins_changed(int from)
{
	for (int i = from; i < npins; i++)
		max_end[i] = i && max_end[i - 1] > pins[i].end ? max_end[i - 1] : pins[i].end;
}

/* Unmaps the pages of [a, e) that nothing pins; the pinned ones are kept, to be unmapped when
 * their last pin goes (beyond MAX_PUT_OFF ranges they stay mapped). Under pin_lock. */
static void unmap_unpinned(uint64_t a, uint64_t e)
{
	for (uint64_t cur = a; cur < e;) {
		uint64_t cover = 0, next = e;
		for (int i = 0; i < npins; i++) {
			uint64_t s = PAGE_DOWN(pins[i].start), t = PAGE_UP(pins[i].end);
			if (s <= cur && t > cur && t > cover) cover = t;
			else if (s > cur && s < next) next = s;
		}
		if (cover) {
			uint64_t end = cover < e ? cover : e;
			if (nunmapped < MAX_PUT_OFF) unmapped[nunmapped++] = (struct span){ cur, end, 0 };
			cur = end;
		} else {
			syscall(SYS_munmap, (void *)(uintptr_t)cur, (size_t)(next - cur));
			cur = next;
		}
	}
}

/* Pins the pages of `n` bytes at `p` for a served object: 0 or ENOMEM (the table is full). */
static int pin(uint64_t p, uint64_t n, int writable)
{
	if (!n || !fits(p, n)) return EINVAL;
	pthread_mutex_lock(&pin_lock);
	int rc = npins < MAX_PINS ? 0 : ENOMEM;
	if (!rc) {
		int at = 0;
		while (at < npins && pins[at].start <= p) at++;
		memmove(&pins[at + 1], &pins[at], (size_t)(npins - at) * sizeof(pins[0]));
		pins[at] = (struct span){ p, p + n, writable };
		__atomic_store_n(&npins, npins + 1, __ATOMIC_RELEASE);
		pins_changed(at);
	}
	pthread_mutex_unlock(&pin_lock);
	return rc;
}

#ifdef UVEMU_PRELOAD
extern void __libc_free(void *);
/* The allocator's own free (never this library's, so it never comes back here). */
static void real_free(void *b) { (r_free ? r_free : __libc_free)(b); }
#else
static void real_free(void *b) { free(b); }
#endif

/* Lets go of a pin of pin(p, n): what the process unmapped or freed meanwhile, and nothing
 * else pins, is unmapped or freed now. */
static void unpin(uint64_t p, uint64_t n)
{
	uint64_t a = p, e = p + n;
	pthread_mutex_lock(&pin_lock);
	for (int i = 0; i < npins; i++)
		if (pins[i].start == a && pins[i].end == e) {
			memmove(&pins[i], &pins[i + 1], (size_t)(npins - i - 1) * sizeof(pins[0]));
			__atomic_store_n(&npins, npins - 1, __ATOMIC_RELEASE);
			pins_changed(i);
			break;
		}
	int kept = nunmapped;
	nunmapped = 0;
	for (int i = 0; i < kept; i++) {
		struct span s = unmapped[i];
		unmap_unpinned(s.start, s.end); /* appends what is still pinned */
	}
	int n_unfreed = nunfreed;
	nunfreed = 0;
	for (int i = 0; i < n_unfreed; i++) {
		void *b = unfreed[i];
		uint64_t at = (uint64_t)(uintptr_t)b;
		if (pinned(at, at + malloc_usable_size(b), 0)) unfreed[nunfreed++] = b;
		else real_free(b);
	}
	pthread_mutex_unlock(&pin_lock);
}

/* Pins (`on`) or lets go of a served CQ's ring and doorbell record: 0 or ENOMEM. */
static int pin_cq(const struct uvemu_obj *o, int on)
{
	uint64_t ring = (uint64_t)o->u.cq.entries * 64;
	if (!on) { unpin(o->u.cq.buf, ring); unpin(o->u.cq.dbrec, 8); return 0; }
	int rc = pin(o->u.cq.buf, ring, 1);
	if (!rc && (rc = pin(o->u.cq.dbrec, 8, 1))) unpin(o->u.cq.buf, ring);
	return rc;
}

/* The same for a served QP's ring (RQ, then SQ) and doorbell record. */
static int pin_qp(const struct uvemu_obj *o, int on)
{
	uint64_t ring = (uint64_t)o->u.qp.rq_wqes * o->u.qp.rq_stride + (uint64_t)o->u.qp.sq_wqebbs * 64;
	/* A dynamic UAR page stays while a QP on it lives (its UAR may be destroyed and the page
	 * unmapped before: the kernel frees the UAR at the last unmap, and the HCA watches it). */
	uint64_t bf = o->u.qp.bf_reg2 ? o->u.qp.bf_reg : 0;
	if (!on) { unpin(o->u.qp.buf, ring); unpin(o->u.qp.dbrec, 8); if (bf) unpin(bf, 8); return 0; }
	int rc = pin(o->u.qp.buf, ring, 0);
	if (!rc && (rc = pin(o->u.qp.dbrec, 8, 1))) unpin(o->u.qp.buf, ring);
	if (!rc && bf && (rc = pin(bf, 8, 0))) { unpin(o->u.qp.buf, ring); unpin(o->u.qp.dbrec, 8); }
	return rc;
}

#ifdef UVEMU_PRELOAD
/* The process's unmappings, checked against the pins (only in the preload library: a fuzz
 * target that links the driver in keeps its own allocator's hooks). */
extern void *__libc_realloc(void *, size_t);

int munmap(void *addr, size_t len)
{
	uint64_t a = (uint64_t)(uintptr_t)addr;
	if (!__atomic_load_n(&npins, __ATOMIC_ACQUIRE) || (a & 4095) || !len || !fits(a, len))
		return (int)syscall(SYS_munmap, addr, len);
	pthread_mutex_lock(&pin_lock);
	int hit = pinned(a, PAGE_UP(a + len), 0);
	if (hit) unmap_unpinned(a, PAGE_UP(a + len));
	pthread_mutex_unlock(&pin_lock);
	if (!hit) return (int)syscall(SYS_munmap, addr, len);
	L("munmap(%p, %zu): pages pinned by a registered region or ring stay until it is destroyed", addr, len);
	return 0;
}

void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	void *to = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : NULL;
	va_end(ap);
	uint64_t a = (uint64_t)(uintptr_t)old, t = (uint64_t)(uintptr_t)to;
	int hit = 0, shrink = !(flags & MREMAP_FIXED) && PAGE_UP(new_len) <= PAGE_UP(old_len) && new_len;
	if (__atomic_load_n(&npins, __ATOMIC_ACQUIRE) && !(a & 4095) && fits(a, old_len) && fits(t, new_len)) {
		pthread_mutex_lock(&pin_lock);
		hit = pinned(a, PAGE_UP(a + old_len), 0) || (to && pinned(PAGE_DOWN(t), PAGE_UP(t + new_len), 0));
		if (hit && shrink) unmap_unpinned(a + PAGE_UP(new_len), a + PAGE_UP(old_len));
		pthread_mutex_unlock(&pin_lock);
	}
	if (!hit) return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, to);
	if (shrink) return old;
	L("mremap(%p, %zu -> %zu): pinned pages cannot move or grow -> ENOMEM", old, old_len, new_len);
	errno = ENOMEM;
	return MAP_FAILED;
}

int mprotect(void *addr, size_t len, int prot)
{
	uint64_t a = (uint64_t)(uintptr_t)addr;
	int hit = 0;
	if (__atomic_load_n(&npins, __ATOMIC_ACQUIRE) && fits(a, len) &&
	    (prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE)) {
		pthread_mutex_lock(&pin_lock);
		uint64_t e = PAGE_UP(a + len);
		a = PAGE_DOWN(a);
		hit = pinned(a, e, 0) && (!(prot & PROT_READ) || pinned(a, e, 1));
		pthread_mutex_unlock(&pin_lock);
	}
	if (!hit) return (int)syscall(SYS_mprotect, addr, len, prot);
	L("mprotect(%p, %zu, %#x): the HCA uses these pinned pages -> EACCES", addr, len, prot);
	errno = EACCES;
	return -1;
}

void free(void *p)
{
	if (!p) return;
	if (!__atomic_load_n(&npins, __ATOMIC_ACQUIRE)) { real_free(p); return; }
	uint64_t a = (uint64_t)(uintptr_t)p;
	pthread_mutex_lock(&pin_lock);
	int hit = pinned(a, a + malloc_usable_size(p), 0);
	if (hit && nunfreed < MAX_PUT_OFF) unfreed[nunfreed++] = p; /* else kept for good */
	pthread_mutex_unlock(&pin_lock);
	if (!hit) real_free(p);
}

void *realloc(void *p, size_t n)
{
	void *(*f)(void *, size_t) = r_realloc ? r_realloc : __libc_realloc;
	if (!p || !__atomic_load_n(&npins, __ATOMIC_ACQUIRE)) return f(p, n);
	uint64_t a = (uint64_t)(uintptr_t)p;
	size_t old = malloc_usable_size(p);
	pthread_mutex_lock(&pin_lock);
	int hit = pinned(a, a + old, 0);
	pthread_mutex_unlock(&pin_lock);
	if (!hit) return f(p, n);
	/* The block moves; the old one stays with its pinned pages (free() puts it off). */
	void *q = n ? malloc(n) : NULL;
	if (n && !q) return NULL;
	if (q) memcpy(q, p, old < n ? old : n);
	free(p);
	return q;
}
#endif

/* ------------------------------------------------------------------ object tables */

static struct uvemu_obj *obj_get(struct uvemu_context *c, uint32_t handle, enum uvemu_obj_type t)
{
	if (handle == 0 || handle > UVEMU_MAX_OBJECTS) return NULL;
	struct uvemu_obj *o = &c->obj[handle - 1];
	return o->type == t ? o : NULL;
}

/* A free slot of type `t`; its handle in *handle. */
static struct uvemu_obj *obj_new(struct uvemu_context *c, enum uvemu_obj_type t, uint32_t *handle)
{
	for (uint32_t i = 0; i < UVEMU_MAX_OBJECTS; i++)
		if (c->obj[i].type == UVEMU_FREE) {
			memset(&c->obj[i], 0, sizeof(c->obj[i]));
			c->obj[i].type = t;
			*handle = i + 1;
			return &c->obj[i];
		}
	return NULL;
}

/* Destroys `handle` of type `t` if nothing refers to it: 0, ENOENT-like EINVAL or EBUSY. */
static int obj_destroy(struct uvemu_context *c, uint32_t handle, enum uvemu_obj_type t)
{
	struct uvemu_obj *o = obj_get(c, handle, t);
	if (!o) return EINVAL;
	if (o->refs) return EBUSY;
	struct uvemu_obj *pd = NULL, *scq = NULL, *rcq = NULL;
	if (t == UVEMU_MR) pd = obj_get(c, o->u.mr.pd, UVEMU_PD);
	if (t == UVEMU_QP) {
		pd = obj_get(c, o->u.qp.pd, UVEMU_PD);
		scq = obj_get(c, o->u.qp.send_cq, UVEMU_CQ);
		rcq = obj_get(c, o->u.qp.recv_cq, UVEMU_CQ);
	}
	if (pd) pd->refs--;
	if (scq) scq->refs--;
	if (rcq) rcq->refs--;
	o->type = UVEMU_FREE;
	return 0;
}

/* ------------------------------------------------------------------ the data path's HCA */

int uvemu_device_count(void)
{
	ensure_init();
	return ndevices;
}

int uvemu_attach_hca(const struct uvemu_hca_ops *ops)
{
	ensure_init();
	pthread_mutex_lock(&lock);
	int rc = !ops ? EINVAL : hca ? EBUSY : 0;
	if (!rc) hca = ops;
	pthread_mutex_unlock(&lock);
	L("HCA attached: %s", rc ? strerror(rc) : "the data path is served");
	return rc;
}

/* Whether a HCA serves the data path (1) or none yet (0): a gdasync process that opened a device
 * before it asked to serve it finds the soft HCA auto_hca() loaded there, and is served by it. */
int uvemu_hca_attached(void)
{
	ensure_init();
	pthread_mutex_lock(&lock);
	int attached = hca != NULL;
	pthread_mutex_unlock(&lock);
	return attached;
}

/* The record of device `dev` of node `n`, served by the process of QPN slot `slot`, in the
 * fabric directory, or 0 where there is none. */
static int fabric_record(char *path, size_t size, int n, int dev, int slot)
{
	return fabric[0] && n > 0 &&
	       snprintf(path, size, "%s/node-%d/dev-%d.%d", fabric, n, dev, slot) < (int)size;
}

static int qpn_slot = -1; /* this process's share of the QP numbers, once claimed */
static char slot_dir[512];

static void release_slot(void)
{
	char owner[540];
	snprintf(owner, sizeof(owner), "%s/owner", slot_dir);
	unlink(owner);
	rmdir(slot_dir);
}

/* Whether the slot folder `dir` names an owner that no longer runs (a crashed process). */
static int slot_owner_gone(const char *dir)
{
	char path[540], v[16] = { 0 };
	snprintf(path, sizeof(path), "%s/owner", dir);
	int fd = r_open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) return 0;
	ssize_t got = read(fd, v, sizeof(v) - 1);
	r_close(fd);
	int pid = got > 0 ? atoi(v) : 0;
	return pid > 0 && kill(pid, 0) && errno == ESRCH;
}

static int claim_slot(void)
{
	if (!fabric[0] || node <= 0) return 0;
	for (int s = 0; s < UVEMU_QPN_SLOTS; s++) {
		char dir[512], owner[540], pid[16];
		if (snprintf(dir, sizeof(dir), "%s/node-%d/slot-%d", fabric, node, s) >= (int)sizeof(dir))
			return -ENAMETOOLONG;
		if (slot_owner_gone(dir)) {
			snprintf(owner, sizeof(owner), "%s/owner", dir);
			unlink(owner);
			rmdir(dir);
		}
		if (mkdir(dir, 0700)) {
			if (errno == EEXIST) continue;
			return -errno;
		}
		snprintf(owner, sizeof(owner), "%s/owner", dir);
		int fd = r_open(owner, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd < 0) return -errno;
		int n = snprintf(pid, sizeof(pid), "%d", (int)getpid());
		ssize_t w = r_write(fd, pid, n);
		r_close(fd);
		if (w != n) return -EIO;
		memcpy(slot_dir, dir, sizeof(dir));
		atexit(release_slot);
		L("QP number slot %d of node %d claimed", s, node);
		return s;
	}
	L("all %d QP number slots of node %d are taken", UVEMU_QPN_SLOTS, node);
	return -EBUSY;
}

int uvemu_qpn_slot(void)
{
	ensure_init();
	pthread_mutex_lock(&lock);
	if (qpn_slot < 0) {
		int s = claim_slot();
		if (s < 0) {
			pthread_mutex_unlock(&lock);
			return s;
		}
		qpn_slot = s;
	}
	pthread_mutex_unlock(&lock);
	return qpn_slot;
}

int uvemu_publish(int dev, const uint8_t *endpoint, uint32_t len)
{
	ensure_init();
	char path[512], tmp[540];
	if (dev < 0 || dev >= ndevices || !endpoint || len != UVEMU_ENDPOINT_LEN) return EINVAL;
	int slot = uvemu_qpn_slot();
	if (slot < 0) return -slot;
	if (!fabric_record(path, sizeof(path), node, dev, slot)) return ENOENT;
	snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
	int fd = r_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) return errno;
	ssize_t w = r_write(fd, endpoint, len);
	int e = w == (ssize_t)len ? 0 : w < 0 ? errno : EIO;
	r_close(fd);
	if (!e && rename(tmp, path)) e = errno; /* readers see the whole record or none */
	if (e) unlink(tmp);
	L("device %d published at %s: %s", dev, path, e ? strerror(e) : "ok");
	return e;
}

/* The endpoint the process of QP `qpn` of node `n` published for its device `dev`, into
 * `out`: 0 or ENETUNREACH. */
static int fabric_peer(int n, int dev, uint32_t qpn, uint8_t out[UVEMU_ENDPOINT_LEN])
{
	char path[512];
	if (!fabric_record(path, sizeof(path), n, dev, (int)(qpn >> UVEMU_QPN_SLOT_SHIFT)))
		return ENETUNREACH;
	int fd = r_open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) return ENETUNREACH;
	ssize_t got = read(fd, out, UVEMU_ENDPOINT_LEN);
	r_close(fd);
	return got == UVEMU_ENDPOINT_LEN ? 0 : ENETUNREACH;
}

/* The node a QP's destination address names (the LID, or the GID where the path has a GRH,
 * as the fake sysfs derives them), with the device in `dev`; 0 where it names none. */
static int path_node(const struct uvemu_obj *o, int *dev)
{
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
	static const uint8_t link_local[13] = { 0xfe, 0x80, [8] = 0x0e, 0x42, 0xa1, 0xff, 0xfe };
	const uint8_t *g = o->u.qp.dgid;
	if (!o->u.qp.is_global) { *dev = (o->u.qp.dlid >> 2) & 7; return o->u.qp.dlid >> 5; }
	if (!memcmp(g, mapped, 12) && g[12] == 10) { *dev = g[13]; return g[15]; }
	if (!memcmp(g, link_local, 13)) { *dev = g[14]; return g[13]; }
	return 0;
}

/* Whether the caller's `n` bytes at `p` are mapped (the kernel pins them, or fails with
 * EFAULT): one byte of each page is read. */
static int user_mapped(uint64_t p, uint64_t n)
{
	char b;
	if (n > UINT64_MAX - p) return EFAULT;
	for (uint64_t a = p & ~4095ull; a < p + n; a += 4096)
		if (user_copy(&b, (const void *)(uintptr_t)(a < p ? p : a), 1)) return EFAULT;
	return 0;
}

/* The device of this process whose port has the QP's destination address (the LID, or the
 * GID where the path has a GRH), or -1 (it may be another node's: path_node). */
static int path_device(const struct uvemu_context *c, const struct uvemu_obj *o)
{
	static const uint8_t none[16];
	const struct uvemu_port *own = port_of(c, o->u.qp.port);
	if (!own) return -1;
	for (int d = 0; d < ndevices; d++)
		for (int p = 0; p < devices[d].nports; p++) {
			const struct uvemu_port *x = &devices[d].port[p];
			if (x->ethernet != own->ethernet) continue;
			if (!o->u.qp.is_global && !x->ethernet && x->lid == o->u.qp.dlid) return d;
			for (int i = 0; o->u.qp.is_global && i < UVEMU_GIDS; i++)
				if (memcmp(x->gid[i], none, 16) && !memcmp(x->gid[i], o->u.qp.dgid, 16)) return d;
		}
	return -1;
}

/* Tells the HCA of a served QP's move from `cur` to `next` (its attributes already in `o`). */
static int hca_transition(struct uvemu_context *c, struct uvemu_obj *o, uint8_t cur, uint8_t next)
{
	uint32_t qpn = o->u.qp.qpn;
	if (cur == QPS_RESET && next == QPS_INIT) return hca->to_init(c->dev, qpn);
	if (cur == QPS_INIT && next == QPS_RTR) {
		struct uvemu_hca_rtr r = { .dest_dev = path_device(c, o), .dest_qpn = o->u.qp.dest_qpn,
					   .rq_psn = o->u.qp.rq_psn, .mtu = 128u << o->u.qp.path_mtu };
		int own = (int)(r.dest_qpn >> UVEMU_QPN_SLOT_SHIFT) == (qpn_slot < 0 ? 0 : qpn_slot);
		if (r.dest_dev >= 0 && (own || !fabric[0])) return hca->to_rtr(c->dev, qpn, &r);
		int dev = r.dest_dev, n = node;
		if (dev < 0) n = path_node(o, &dev);
		if ((n == node && own) || fabric_peer(n, dev, r.dest_qpn, r.peer)) {
			L("   no device of this process or of the fabric has the path's address and QP");
			return ENETUNREACH;
		}
		L("   the path is device %d of node %d, QP %#x of slot %u: linked through the fabric",
		  dev, n, r.dest_qpn, r.dest_qpn >> UVEMU_QPN_SLOT_SHIFT);
		r.dest_dev = -1;
		return hca->to_rtr(c->dev, qpn, &r);
	}
	if (cur == QPS_RTR && next == QPS_RTS) {
		struct uvemu_hca_rts r = { .sq_psn = o->u.qp.sq_psn, .timeout = o->u.qp.timeout,
					   .retry_cnt = o->u.qp.retry_cnt, .rnr_retry = o->u.qp.rnr_retry,
					   .min_rnr_timer = o->u.qp.min_rnr_timer };
		return hca->to_rts(c->dev, qpn, &r);
	}
	L("   (the HCA keeps QP %#x's state: %u -> %u is not passed on)", qpn, cur, next);
	return 0;
}

/* Hands a served object's end to the HCA (after its destroy, or at the context's close). */
static void hca_release(const struct uvemu_context *c, const struct uvemu_obj *o)
{
	if (!o->served) return;
	if (o->type == UVEMU_QP) hca->destroy_qp(c->dev, o->u.qp.qpn);
	if (o->type == UVEMU_CQ) hca->destroy_cq(c->dev, o->u.cq.cqn);
	if (o->type == UVEMU_MR) hca->dereg_mr(c->dev, o->u.mr.lkey);
	/* The HCA no longer uses them: the pages go back to the process. */
	if (o->type == UVEMU_QP) pin_qp(o, 0);
	if (o->type == UVEMU_CQ) pin_cq(o, 0);
	if (o->type == UVEMU_MR && o->u.mr.dmabuf_fd < 0) unpin(o->u.mr.start, o->u.mr.length);
}

/* A context closed with objects left: the HCA lets go of them, QPs before the CQs and MRs
 * they use, as the kernel tears them down. */
static void hca_release_all(struct uvemu_context *c)
{
	const enum uvemu_obj_type order[] = { UVEMU_QP, UVEMU_CQ, UVEMU_MR };
	for (int k = 0; k < 3; k++)
		for (int i = 0; i < UVEMU_MAX_OBJECTS; i++)
			if (c->obj[i].type == order[k]) {
				hca_release(c, &c->obj[i]);
				c->obj[i].type = UVEMU_FREE;
			}
}

/* ------------------------------------------------------------------ write() commands */

struct cmd {
	struct uvemu_context *c;
	uint32_t op;
	int ex;
	const void *in;  size_t in_len;   /* core request */
	const void *din; size_t din_len;  /* mlx5 request */
	void *out;       size_t out_len;  /* core response (user buffer) */
	void *dout;      size_t dout_len; /* mlx5 response */
};

/* Copies a response of `size` bytes into the caller's buffer of `room` bytes (the rest
 * zeroed), as copy_to_user does: 0, or EFAULT where the buffer is not writable now (another
 * thread may have changed its protection since frame() checked it). */
static int put(void *dst, size_t room, const void *src, size_t size)
{
	static const char zeros[4096];
	if (!dst) return 0;
	int rc = user_copy(dst, src, room < size ? room : size);
	for (size_t off = size; !rc && off < room; off += sizeof(zeros)) {
		size_t k = room - off < sizeof(zeros) ? room - off : sizeof(zeros);
		rc = user_copy((char *)dst + off, zeros, k);
	}
	return rc;
}

/* A response in two parts (core, then mlx5's): 0 or EFAULT. */
static int respond(struct cmd *m, const void *r, size_t size, const void *d, size_t dsize)
{
	int rc = put(m->out, m->out_len, r, size);
	return rc || !d ? rc : put(m->dout, m->dout_len, d, dsize);
}

static const struct uvemu_port *port_of(const struct uvemu_context *c, uint32_t port)
{
	const struct uvemu_device *d = &devices[c->dev];
	return port >= 1 && port <= (uint32_t)d->nports ? &d->port[port - 1] : NULL;
}

static void device_attr(const struct uvemu_context *c, struct ib_uverbs_query_device_resp *r)
{
	memset(r, 0, sizeof(*r));
	r->fw_ver = (22ULL << 32) | (36ULL << 16) | 1010;
	/* The GUID sysfs shows (it names the emulator's fabric node: unique across emulators). */
	r->node_guid = __builtin_bswap64(devices[c->dev].node_guid);
	r->sys_image_guid = r->node_guid;
	r->max_mr_size = ~0ULL;
	r->page_size_cap = ~0xfffULL;
	r->vendor_id = 0x02c9;
	r->vendor_part_id = 4125;
	/* BAD_PKEY_CNTR, BAD_QKEY_CNTR, CHANGE_PHY_PORT, PORT_ACTIVE_EVENT, SYS_IMAGE_GUID,
	 * RC_RNR_NAK_GEN: not memory windows, XRC, UD checksums, APM, fast registration or flow
	 * steering, which the soft HCA does not serve (max_mw, max_ah, max_srq, multicast are 0). */
	r->max_qp = 1 << 18; r->max_qp_wr = 1 << 15; r->device_cap_flags = 0x1c26;
	r->max_sge = 30; r->max_sge_rd = 30; r->max_cq = 1 << 24; r->max_cqe = (1 << 22) - 1;
	r->max_mr = 1 << 24; r->max_pd = 1 << 24; r->max_qp_rd_atom = 16;
	r->max_res_rd_atom = 16 << 18; r->max_qp_init_rd_atom = 16;
	r->atomic_cap = env_u32("UVEMU_ATOMIC_CAP", 1); /* 0: IBV_ATOMIC_NONE, as some HCAs report */
	r->max_pkeys = 128;
	r->local_ca_ack_delay = 16;
	r->phys_port_cnt = (uint8_t)devices[c->dev].nports;
}

static int cmd_get_context(struct cmd *m)
{
	struct mlx5_ib_alloc_ucontext_req_v2 rq = {0};
	memcpy(&rq, m->din, m->din_len < sizeof(rq) ? m->din_len : sizeof(rq));
	if (m->c->async_rd >= 0) return EINVAL; /* one context per open */
	uint32_t bfregs = rq.total_num_bfregs ? rq.total_num_bfregs : 4;
	if (bfregs > UVEMU_MAX_UAR_PAGES * BFREGS_PER_PAGE || bfregs < rq.num_low_latency_bfregs + 2) return EINVAL;
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0) return errno;
	m->c->async_rd = p[0];
	m->c->async_wr = p[1];
	/* A library that can allocate UARs itself gets none here, as a current kernel answers it
	 * (tot_bfregs 0): it allocates them through MLX5_IB_OBJECT_UAR, which only the ioctl ABI
	 * serves; a kernel of the legacy ABI knows nothing of the capability. */
	m->c->dyn_uar = abi_ioctl() && m->din_len >= offsetof(struct mlx5_ib_alloc_ucontext_req_v2, lib_caps) + 8 &&
			(rq.lib_caps & MLX5_LIB_CAP_DYN_UAR);
	m->c->tot_bfregs = m->c->dyn_uar ? 0 : bfregs;
	struct ib_uverbs_get_context_resp r = { .async_fd = (uint32_t)p[0], .num_comp_vectors = 4 };
	struct mlx5_ib_alloc_ucontext_resp d = {0};
	d.qp_tab_size = 1 << 18; d.bf_reg_size = 512;
	d.tot_bfregs = m->c->tot_bfregs;
	d.cache_line_size = 64; d.max_rq_desc_sz = 512;
	/* The largest send WQE: 1024 bytes (64 segments of 16), as ConnectX-4 and later report;
	 * UVEMU_MAX_SQ_DESC_SZ sets another, for tests of a device with smaller WQEs. */
	d.max_sq_desc_sz = env_u32("UVEMU_MAX_SQ_DESC_SZ", 1024);
	d.max_send_wqebb = 1 << 15; d.max_recv_wr = 1 << 15;
	d.num_ports = (uint16_t)devices[m->c->dev].nports;
	d.cqe_version = rq.max_cqe_version ? 1 : 0;
	d.cmds_supp_uhw = MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE | MLX5_USER_CMDS_SUPP_UHW_CREATE_AH;
	d.eth_min_inline = MLX5_USER_INLINE_MODE_NONE + 1;
	d.log_uar_size = 12; d.num_uars_per_page = 1;
	d.response_length = (uint32_t)(m->dout_len < sizeof(d) ? m->dout_len : sizeof(d));
	if (respond(m, &r, sizeof(r), &d, sizeof(d))) {
		/* The caller never learns of the context: it is not made (as the kernel aborts it). */
		r_close(p[0]);
		r_close(p[1]);
		m->c->async_rd = m->c->async_wr = -1;
		m->c->tot_bfregs = 0;
		return EFAULT;
	}
	async_given[m->c - contexts] = 1;
	L("   bfregs=%u (low latency %u, dynamic UARs %d) cqe_version=%u -> async_fd=%d", bfregs,
	  rq.num_low_latency_bfregs, m->c->dyn_uar, d.cqe_version, p[0]);
	return 0;
}

static int cmd_query_device(struct cmd *m)
{
	if (!m->ex) {
		struct ib_uverbs_query_device_resp r;
		device_attr(m->c, &r);
		return put(m->out, m->out_len, &r, sizeof(r));
	}
	const struct ib_uverbs_ex_query_device *q = m->in;
	if (m->in_len >= sizeof(*q) && (q->comp_mask || q->reserved)) return EINVAL; /* a shorter one reads as zeros */
	struct ib_uverbs_ex_query_device_resp r = {0};
	device_attr(m->c, &r.base);
	r.response_length = (uint32_t)(m->out_len < sizeof(r) ? m->out_len : sizeof(r));
	struct mlx5_ib_query_device_resp d = {0};
	d.response_length = (uint32_t)(m->dout_len < sizeof(d) ? m->dout_len : sizeof(d));
	return respond(m, &r, sizeof(r), &d, sizeof(d));
}

static int cmd_query_port(struct cmd *m)
{
	const struct ib_uverbs_query_port *q = m->in;
	const struct uvemu_port *p = port_of(m->c, q->port_num);
	if (!p) return EINVAL;
	struct ib_uverbs_query_port_resp r = {0};
	r.port_cap_flags = p->ethernet ? 0x04010000 : 0x2651e848;
	r.max_msg_sz = 1 << 30; r.gid_tbl_len = UVEMU_GIDS; r.pkey_tbl_len = 1;
	r.state = p->active ? 4 /* ACTIVE */ : 1 /* DOWN */;
	r.max_mtu = 5; r.active_mtu = p->ethernet ? 4 /* 2048: a 4200-byte Ethernet MTU */ : 5;
	r.lid = p->lid; r.sm_lid = p->ethernet ? 0 : 1; r.lmc = 0;
	r.active_width = 2; r.active_speed = 64; r.phys_state = p->active ? 5 : 3;
	r.link_layer = p->ethernet ? LINK_LAYER_ETHERNET : LINK_LAYER_INFINIBAND;
	L("   port %u: %s, %s", q->port_num, p->ethernet ? "Ethernet" : "InfiniBand", p->active ? "ACTIVE" : "DOWN");
	return put(m->out, m->out_len, &r, sizeof(r));
}

/* An object made for a command whose response could not be written: the caller never learns
 * its handle, so it is unmade (the HCA lets go of it) and the command fails with EFAULT, as
 * the kernel aborts an object whose response copy_to_user refused. */
static int created_unanswered(struct uvemu_context *c, uint32_t handle, enum uvemu_obj_type t)
{
	struct uvemu_obj gone = *obj_get(c, handle, t);
	obj_destroy(c, handle, t);
	hca_release(c, &gone);
	L("   the response buffer is not writable: handle %u unmade -> EFAULT", handle);
	return EFAULT;
}

static int cmd_alloc_pd(struct cmd *m)
{
	uint32_t h;
	struct uvemu_obj *o = obj_new(m->c, UVEMU_PD, &h);
	if (!o) return ENOMEM;
	o->u.pd.pdn = next_pdn++;
	struct ib_uverbs_alloc_pd_resp r = { .pd_handle = h };
	struct mlx5_ib_alloc_pd_resp d = { .pdn = o->u.pd.pdn };
	if (respond(m, &r, sizeof(r), &d, sizeof(d))) return created_unanswered(m->c, h, UVEMU_PD);
	L("   -> pd %u (pdn %#x)", h, o->u.pd.pdn);
	return 0;
}

/* Access flags the kernel accepts: remote write and atomics need local write. */
static int access_ok(uint32_t a)
{
	int needs_local = a & (IB_UVERBS_ACCESS_REMOTE_WRITE | IB_UVERBS_ACCESS_REMOTE_ATOMIC);
	return !(needs_local && !(a & IB_UVERBS_ACCESS_LOCAL_WRITE));
}

static struct uvemu_obj *new_mr(struct uvemu_context *c, uint32_t pd_handle, uint32_t access,
				uint32_t *handle, int *err)
{
	struct uvemu_obj *pd = obj_get(c, pd_handle, UVEMU_PD);
	*err = !pd || !access_ok(access) ? EINVAL : 0;
	/* On-demand paging: the device reports no ODP capabilities, and a kernel whose device
	 * has none refuses the flag (ib_check_mr_access) rather than pin the pages silently. */
	if (!*err && (access & IB_UVERBS_ACCESS_ON_DEMAND)) *err = EOPNOTSUPP;
	if (*err) return NULL;
	struct uvemu_obj *o = obj_new(c, UVEMU_MR, handle);
	if (!o) { *err = ENOMEM; return NULL; }
	pd->refs++;
	o->u.mr.pd = pd_handle;
	o->u.mr.access = access;
	o->u.mr.lkey = o->u.mr.rkey = next_key;
	o->u.mr.dmabuf_fd = -1;
	next_key += 0x100;
	return o;
}

static int cmd_reg_mr(struct cmd *m)
{
	const struct ib_uverbs_reg_mr *q = m->in;
	if (!q->length) return EINVAL;
	uint32_t h;
	int err;
	struct uvemu_obj *o = new_mr(m->c, q->pd_handle, q->access_flags, &h, &err);
	if (!o) return err;
	o->u.mr.start = q->start; o->u.mr.length = q->length; o->u.mr.iova = q->hca_va;
	if (hca) {
		/* The HCA addresses a region by its virtual address (no separate IOVA). */
		int rc = q->hca_va != q->start ? EOPNOTSUPP
		       : pin(q->start, q->length, !!(q->access_flags & IB_UVERBS_ACCESS_LOCAL_WRITE));
		/* Pinned before the check, so that the pages cannot go between the two. */
		if (!rc && (rc = user_mapped(q->start, q->length))) unpin(q->start, q->length);
		if (!rc && (rc = hca->reg_mr(m->c->dev, obj_get(m->c, q->pd_handle, UVEMU_PD)->u.pd.pdn, q->start,
					     q->length, q->access_flags, &o->u.mr.lkey, &o->u.mr.rkey)))
			unpin(q->start, q->length);
		if (rc) {
			obj_destroy(m->c, h, UVEMU_MR);
			return rc;
		}
		o->served = 1;
	}
	struct ib_uverbs_reg_mr_resp r = { .mr_handle = h, .lkey = o->u.mr.lkey, .rkey = o->u.mr.rkey };
	if (put(m->out, m->out_len, &r, sizeof(r))) return created_unanswered(m->c, h, UVEMU_MR);
	L("   %#llx + %llu pd %u access %#x -> mr %u key %#x", (unsigned long long)q->start,
	  (unsigned long long)q->length, q->pd_handle, q->access_flags, h, r.lkey);
	return 0;
}

/* The dynamic UAR of context `c` whose page id is `page_id`, or NULL. */
static const struct uvemu_obj *dyn_uar_of_page(struct uvemu_context *c, uint32_t page_id)
{
	if (page_id <= UVEMU_MAX_UAR_PAGES) return NULL;
	return obj_get(c, page_id - UVEMU_MAX_UAR_PAGES, UVEMU_UAR);
}

static int cmd_create_cq(struct cmd *m)
{
	const struct mlx5_ib_create_cq *d = m->din;
	if (m->din_len < offsetof(struct mlx5_ib_create_cq, cqe_size) + sizeof(d->cqe_size)) return EINVAL;
	uint32_t cqe = m->ex ? ((const struct ib_uverbs_ex_create_cq *)m->in)->cqe
			     : ((const struct ib_uverbs_create_cq *)m->in)->cqe;
	if (cqe == 0 || cqe >= (1u << 22) || !d->buf_addr || !d->db_addr ||
	    (d->cqe_size != 64 && d->cqe_size != 128))
		return EINVAL;
	/* Without static UAR pages a CQ must name the UAR page its arm doorbell uses. */
	int page_index = m->din_len >= offsetof(struct mlx5_ib_create_cq, uar_page_index) + 2 &&
			 (d->flags & MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX);
	if (m->c->dyn_uar && (!page_index || !dyn_uar_of_page(m->c, d->uar_page_index))) return EINVAL;
	uint32_t h;
	struct uvemu_obj *o = obj_new(m->c, UVEMU_CQ, &h);
	if (!o) return ENOMEM;
	o->u.cq.buf = d->buf_addr; o->u.cq.dbrec = d->db_addr;
	o->u.cq.user_handle = m->ex ? ((const struct ib_uverbs_ex_create_cq *)m->in)->user_handle
				    : ((const struct ib_uverbs_create_cq *)m->in)->user_handle;
	o->u.cq.entries = cqe + 1; o->u.cq.cqe_size = d->cqe_size; o->u.cq.cqn = next_cqn++;
	if (hca) {
		/* The HCA writes 64-byte CQEs; the ring and its doorbell record must be writable
		 * (checked once pinned, so that they cannot go between the check and the HCA). */
		int rc = d->cqe_size != 64 ? EOPNOTSUPP : pin_cq(o, 1), pinned_now = !rc;
		if (!rc) rc = user_writable((void *)(uintptr_t)d->buf_addr, (size_t)(cqe + 1) * 64);
		if (!rc) rc = user_writable((void *)(uintptr_t)d->db_addr, 8);
		if (!rc) rc = hca->create_cq(m->c->dev, d->buf_addr, cqe + 1, d->db_addr, &o->u.cq.cqn);
		if (rc && pinned_now) pin_cq(o, 0);
		if (rc) {
			o->type = UVEMU_FREE;
			return rc;
		}
		o->served = 1;
	}
	struct ib_uverbs_ex_create_cq_resp r = {0};
	r.base.cq_handle = h; r.base.cqe = cqe;
	r.response_length = (uint32_t)m->out_len;
	struct mlx5_ib_create_cq_resp dr = { .cqn = o->u.cq.cqn };
	if (respond(m, &r, sizeof(r), &dr, sizeof(dr))) return created_unanswered(m->c, h, UVEMU_CQ);
	L("   %u CQEs of %u B, ring %#llx dbrec %#llx -> cq %u (cqn %#x)", cqe + 1, d->cqe_size,
	  (unsigned long long)d->buf_addr, (unsigned long long)d->db_addr, h, o->u.cq.cqn);
	return 0;
}

/* The BlueFlame register a new QP gets: the non-low-latency bfregs past bfreg 0 (which has
 * no BlueFlame buffer), in turn. */
static uint32_t next_bfreg(struct uvemu_context *c, uint32_t n)
{
	uint32_t shared = c->tot_bfregs > 5 ? c->tot_bfregs - 5 : 1; /* 4 low-latency + bfreg 0 */
	return 1 + n % shared;
}

/* Hands a new QP to the HCA: libmlx5's ring (RQ first, then SQ, as libmlx5 lays it out),
 * doorbell record and BlueFlame register; the QP number becomes the HCA's. */
static int hca_create_qp(struct uvemu_context *c, struct uvemu_obj *o)
{
	const uint32_t max_wqes = 1u << 16;
	uint32_t rq = o->u.qp.rq_wqes, sq = o->u.qp.sq_wqebbs;
	if (rq > max_wqes || (rq & (rq - 1)) || sq > max_wqes || !o->u.qp.bf_reg) return EINVAL;
	struct uvemu_hca_qp q = {
		.pdn = obj_get(c, o->u.qp.pd, UVEMU_PD)->u.pd.pdn,
		.send_cqn = obj_get(c, o->u.qp.send_cq, UVEMU_CQ)->u.cq.cqn,
		.recv_cqn = obj_get(c, o->u.qp.recv_cq, UVEMU_CQ)->u.cq.cqn,
		.buf = o->u.qp.buf, .dbrec = o->u.qp.dbrec, .bf_reg = o->u.qp.bf_reg,
		.rq_wqes = rq, .rq_stride = o->u.qp.rq_stride, .sq_wqebbs = sq, .user_index = o->u.qp.uidx,
		.bf_reg2 = o->u.qp.bf_reg2,
	};
	if (!obj_get(c, o->u.qp.send_cq, UVEMU_CQ)->served || !obj_get(c, o->u.qp.recv_cq, UVEMU_CQ)->served)
		return EINVAL; /* CQs made before the HCA attached */
	int rc = pin_qp(o, 1); /* first, so that the pages cannot go between the check and the HCA */
	if (rc) return rc;
	rc = user_writable((void *)(uintptr_t)q.buf, (size_t)rq * q.rq_stride + (size_t)sq * 64);
	if (!rc) rc = user_writable((void *)(uintptr_t)q.dbrec, 8);
	if (!rc) rc = hca->create_qp(c->dev, &q, &o->u.qp.qpn);
	if (rc) pin_qp(o, 0);
	return rc;
}

static int cmd_create_qp(struct cmd *m)
{
	const struct mlx5_ib_create_qp *d = m->din;
	if (m->din_len < offsetof(struct mlx5_ib_create_qp, flags)) return EINVAL;
	const struct ib_uverbs_create_qp *q = m->in; /* the extended form starts the same way */
	if (m->ex) return EOPNOTSUPP;
	if (q->qp_type != IB_UVERBS_QPT_RC) return EOPNOTSUPP;
	struct uvemu_obj *pd = obj_get(m->c, q->pd_handle, UVEMU_PD);
	struct uvemu_obj *scq = obj_get(m->c, q->send_cq_handle, UVEMU_CQ);
	struct uvemu_obj *rcq = obj_get(m->c, q->recv_cq_handle, UVEMU_CQ);
	if (!pd || !scq || !rcq || q->srq_handle || !d->buf_addr || !d->db_addr) return EINVAL;
	if (!d->sq_wqe_count || (d->sq_wqe_count & (d->sq_wqe_count - 1)) || d->rq_wqe_shift > 12) return EINVAL;
	/* A QP on a dynamic UAR names its page; a context without static pages must (the kernel
	 * has no bfreg to give it). The HCA watches the page: it must be mapped. */
	const struct uvemu_obj *dyn = NULL;
	if (m->din_len >= offsetof(struct mlx5_ib_create_qp, bfreg_index) + 4 && (d->flags & MLX5_QP_FLAG_UAR_PAGE_INDEX)) {
		dyn = dyn_uar_of_page(m->c, d->bfreg_index);
		if (!dyn || !dyn->u.uar.page) return EINVAL;
	} else if (m->c->dyn_uar) {
		return EINVAL;
	}
	uint32_t h;
	struct uvemu_obj *o = obj_new(m->c, UVEMU_QP, &h);
	if (!o) return ENOMEM;
	pd->refs++; scq->refs++; rcq->refs++;
	o->u.qp.pd = q->pd_handle; o->u.qp.send_cq = q->send_cq_handle; o->u.qp.recv_cq = q->recv_cq_handle;
	o->u.qp.qpn = next_qpn++;
	o->u.qp.user_handle = q->user_handle;
	o->u.qp.buf = d->buf_addr; o->u.qp.dbrec = d->db_addr;
	o->u.qp.sq_wqebbs = d->sq_wqe_count; o->u.qp.rq_wqes = d->rq_wqe_count;
	o->u.qp.rq_stride = 1u << d->rq_wqe_shift;
	if (m->din_len >= offsetof(struct mlx5_ib_create_qp, uidx) + sizeof(d->uidx)) o->u.qp.uidx = d->uidx;
	o->u.qp.state = QPS_RESET;
	if (dyn) {
		/* The QP names only the page: libmlx5 rings either of its two BlueFlame registers. */
		o->u.qp.bfreg = INVALID_BFREG;
		o->u.qp.bf_reg = dyn->u.uar.page + 0x800;
		o->u.qp.bf_reg2 = dyn->u.uar.page + 0x800 + 0x100 * 2;
	} else {
		o->u.qp.bfreg = next_bfreg(m->c, o->u.qp.qpn);
		uint32_t page = o->u.qp.bfreg / BFREGS_PER_PAGE;
		if (page < UVEMU_MAX_UAR_PAGES && m->c->uar[page])
			o->u.qp.bf_reg = (uint64_t)(uintptr_t)m->c->uar[page] + 0x800 + (o->u.qp.bfreg % BFREGS_PER_PAGE) * 0x100 * 2;
	}
	if (hca) {
		int rc = hca_create_qp(m->c, o);
		if (rc) {
			obj_destroy(m->c, h, UVEMU_QP);
			return rc;
		}
		o->served = 1;
	}
	struct ib_uverbs_create_qp_resp r = {0};
	r.qp_handle = h; r.qpn = o->u.qp.qpn;
	r.max_send_wr = q->max_send_wr; r.max_recv_wr = q->max_recv_wr;
	r.max_send_sge = q->max_send_sge; r.max_recv_sge = q->max_recv_sge;
	r.max_inline_data = q->max_inline_data;
	/* The index as the kernel reports it (adjust_bfregn): libmlx5 numbers 4 bfregs per UAR
	 * page, of which the first 2 are the page's non-fast-path BlueFlame registers. */
	struct mlx5_ib_create_qp_resp dr = {
		.bfreg_index = dyn ? INVALID_BFREG : o->u.qp.bfreg / BFREGS_PER_PAGE * 4 + o->u.qp.bfreg % BFREGS_PER_PAGE
	};
	if (respond(m, &r, sizeof(r), &dr, sizeof(dr))) return created_unanswered(m->c, h, UVEMU_QP);
	dyn_uar_qps_made += !!dyn;
	L("   RC pd %u cq %u/%u ring %#llx (SQ %u WQEBBs, RQ %u x %u B) dbrec %#llx flags %#x -> qp %u qpn %#x bfreg %u",
	  q->pd_handle, q->send_cq_handle, q->recv_cq_handle, (unsigned long long)d->buf_addr, d->sq_wqe_count,
	  d->rq_wqe_count, o->u.qp.rq_stride, (unsigned long long)d->db_addr, d->flags, h, r.qpn, o->u.qp.bfreg);
	L("   user index %#x, BlueFlame register %#llx", o->u.qp.uidx, (unsigned long long)o->u.qp.bf_reg);
	return 0;
}

/* The attributes a transition requires (IB spec, as the kernel's ib_modify_qp_is_ok). */
static int transition_ok(uint8_t cur, uint8_t next, uint32_t mask)
{
	const uint32_t init = IB_QP_PKEY_INDEX_MASK | IB_QP_PORT_MASK | IB_QP_ACCESS_FLAGS_MASK;
	const uint32_t rtr = IB_QP_AV_MASK | IB_QP_PATH_MTU_MASK | IB_QP_DEST_QPN_MASK | IB_QP_RQ_PSN_MASK |
			     IB_QP_MAX_DEST_RD_ATOMIC_MASK | IB_QP_MIN_RNR_TIMER_MASK;
	const uint32_t rts = IB_QP_SQ_PSN_MASK | IB_QP_TIMEOUT_MASK | IB_QP_RETRY_CNT_MASK |
			     IB_QP_RNR_RETRY_MASK | IB_QP_MAX_QP_RD_ATOMIC_MASK;
	if (next == QPS_RESET || next == QPS_ERR) return 1;
	if (cur == QPS_RESET && next == QPS_INIT) return (mask & init) == init;
	if (cur == QPS_INIT && next == QPS_INIT) return 1;
	if (cur == QPS_INIT && next == QPS_RTR) return (mask & rtr) == rtr;
	if (cur == QPS_RTR && next == QPS_RTS) return (mask & rts) == rts;
	if (cur == QPS_RTS && next == QPS_RTS) return 1;
	return 0;
}


static int cmd_modify_qp(struct cmd *m)
{
	const struct ib_uverbs_modify_qp *q =
		m->ex ? &((const struct ib_uverbs_ex_modify_qp *)m->in)->base : m->in;
	struct uvemu_obj *o = obj_get(m->c, q->qp_handle, UVEMU_QP);
	if (!o) return EINVAL;
	uint8_t cur = o->u.qp.state;
	uint8_t next = (q->attr_mask & IB_QP_STATE_MASK) ? q->qp_state : cur;
	if (next > QPS_ERR || !transition_ok(cur, next, q->attr_mask)) {
		L("   qp %u: %u -> %u with mask %#x refused", q->qp_handle, cur, next, q->attr_mask);
		return EINVAL;
	}
	if (q->attr_mask & IB_QP_PORT_MASK) {
		if (!port_of(m->c, q->port_num)) return EINVAL;
		o->u.qp.port = q->port_num;
	}
	if (q->attr_mask & IB_QP_AV_MASK) {
		const struct uvemu_port *p = port_of(m->c, q->dest.port_num ? q->dest.port_num : o->u.qp.port);
		if (!p || (p->ethernet && !q->dest.is_global)) return EINVAL; /* RoCE needs a GRH */
		memcpy(o->u.qp.dgid, q->dest.dgid, 16);
		o->u.qp.dlid = q->dest.dlid;
		o->u.qp.is_global = q->dest.is_global;
		o->u.qp.sgid_index = q->dest.sgid_index;
		o->u.qp.hop_limit = q->dest.hop_limit;
		o->u.qp.traffic_class = q->dest.traffic_class;
		o->u.qp.sl = q->dest.sl;
	}
	if (q->attr_mask & IB_QP_PATH_MTU_MASK) {
		if (q->path_mtu < 1 || q->path_mtu > 5) return EINVAL;
		o->u.qp.path_mtu = q->path_mtu;
	}
	if (q->attr_mask & IB_QP_ACCESS_FLAGS_MASK) o->u.qp.access = q->qp_access_flags;
	if (q->attr_mask & IB_QP_DEST_QPN_MASK) o->u.qp.dest_qpn = q->dest_qp_num & 0xffffff;
	if (q->attr_mask & IB_QP_RQ_PSN_MASK) o->u.qp.rq_psn = q->rq_psn & 0xffffff;
	if (q->attr_mask & IB_QP_SQ_PSN_MASK) o->u.qp.sq_psn = q->sq_psn & 0xffffff;
	if (q->attr_mask & IB_QP_TIMEOUT_MASK) o->u.qp.timeout = q->timeout;
	if (q->attr_mask & IB_QP_RETRY_CNT_MASK) o->u.qp.retry_cnt = q->retry_cnt;
	if (q->attr_mask & IB_QP_RNR_RETRY_MASK) o->u.qp.rnr_retry = q->rnr_retry;
	if (q->attr_mask & IB_QP_MIN_RNR_TIMER_MASK) o->u.qp.min_rnr_timer = q->min_rnr_timer;
	if (q->attr_mask & IB_QP_MAX_QP_RD_ATOMIC_MASK) o->u.qp.max_rd_atomic = q->max_rd_atomic;
	if (q->attr_mask & IB_QP_MAX_DEST_RD_ATOMIC_MASK) o->u.qp.max_dest_rd_atomic = q->max_dest_rd_atomic;
	if (o->served && next != cur) {
		int rc = hca_transition(m->c, o, cur, next);
		if (rc) {
			L("   qp %u: %u -> %u refused by the HCA: %s", q->qp_handle, cur, next, strerror(rc));
			return rc;
		}
	}
	if (o->served && (q->attr_mask & IB_QP_ACCESS_FLAGS_MASK) && hca->qp_access) {
		int rc = hca->qp_access(m->c->dev, o->u.qp.qpn, o->u.qp.access);
		if (rc) return rc;
	}
	o->u.qp.state = next;
	if (m->ex && m->out) {
		struct ib_uverbs_ex_modify_qp_resp r = { .response_length = (uint32_t)(m->out_len < sizeof(r) ? m->out_len : sizeof(r)) };
		if (put(m->out, m->out_len, &r, sizeof(r))) return EFAULT; /* the move happened */
	}
	L("   qp %u: %u -> %u (mask %#x, dest qpn %#x, mtu %u, port %u)", q->qp_handle, cur, next, q->attr_mask,
	  o->u.qp.dest_qpn, o->u.qp.path_mtu, o->u.qp.port);
	return 0;
}

static int cmd_query_qp(struct cmd *m)
{
	const struct ib_uverbs_query_qp *q = m->in;
	struct uvemu_obj *o = obj_get(m->c, q->qp_handle, UVEMU_QP);
	if (!o) return EINVAL;
	struct ib_uverbs_query_qp_resp r = {0};
	r.qp_state = r.cur_qp_state = o->u.qp.state;
	if (hca && hca->qp_state && hca->qp_state(m->c->dev, o->u.qp.qpn) == QPS_ERR)
		r.qp_state = r.cur_qp_state = QPS_ERR; /* failed on the HCA's own account */
	r.path_mtu = o->u.qp.path_mtu; r.port_num = o->u.qp.port;
	r.dest_qp_num = o->u.qp.dest_qpn; r.rq_psn = o->u.qp.rq_psn; r.sq_psn = o->u.qp.sq_psn;
	r.qp_access_flags = o->u.qp.access; r.timeout = o->u.qp.timeout;
	r.retry_cnt = o->u.qp.retry_cnt; r.rnr_retry = o->u.qp.rnr_retry; r.min_rnr_timer = o->u.qp.min_rnr_timer;
	memcpy(r.dest.dgid, o->u.qp.dgid, 16);
	r.dest.dlid = o->u.qp.dlid; r.dest.is_global = o->u.qp.is_global; r.dest.sgid_index = o->u.qp.sgid_index;
	r.dest.hop_limit = o->u.qp.hop_limit; r.dest.traffic_class = o->u.qp.traffic_class; r.dest.sl = o->u.qp.sl;
	r.dest.port_num = o->u.qp.port;
	r.max_rd_atomic = o->u.qp.max_rd_atomic; r.max_dest_rd_atomic = o->u.qp.max_dest_rd_atomic;
	return put(m->out, m->out_len, &r, sizeof(r));
}

/* DEALLOC_PD, DEREG_MR: the handle is the first word; DESTROY_CQ/QP: after the response
 * pointer, with a response of the async events raised about the object (completion events
 * are never raised: there are no completion channels). */
static int cmd_destroy(struct cmd *m, enum uvemu_obj_type t, int has_response)
{
	const uint32_t *w = m->in;
	uint32_t h = has_response ? w[2] : w[0];
	struct uvemu_obj *o = obj_get(m->c, h, t);
	uint32_t events = o ? o->async_events : 0;
	struct uvemu_obj gone = o ? *o : (struct uvemu_obj){0};
	int rc = obj_destroy(m->c, h, t);
	if (!rc) hca_release(m->c, &gone);
	L("   handle %u -> %s", h, rc ? strerror(rc) : "destroyed");
	/* The object is gone either way, as in the kernel; the count is lost with the response. */
	if (!rc && t == UVEMU_CQ) {
		struct ib_uverbs_destroy_cq_resp r = { .async_events_reported = events };
		rc = put(m->out, m->out_len, &r, sizeof(r));
	} else if (!rc && t == UVEMU_QP) {
		struct ib_uverbs_destroy_qp_resp r = { .events_reported = events };
		rc = put(m->out, m->out_len, &r, sizeof(r));
	}
	return rc;
}

/* Commands served, by ib_user_verbs.h command number (legacy and extended alike). */
static uint64_t cmd_count[IB_USER_VERBS_CMD_COMMAND_MASK + 1];
/* Those of them served through DEVICE/INVOKE_WRITE (the ioctl ABI). */
static uint64_t ioctl_cmd_count[IB_USER_VERBS_CMD_COMMAND_MASK + 1];

static int do_cmd(struct cmd *m)
{
	cmd_count[m->op & IB_USER_VERBS_CMD_COMMAND_MASK]++;
	switch (m->op) {
	case IB_USER_VERBS_CMD_GET_CONTEXT: return cmd_get_context(m);
	case IB_USER_VERBS_CMD_QUERY_DEVICE: return cmd_query_device(m);
	case IB_USER_VERBS_CMD_QUERY_PORT: return cmd_query_port(m);
	case IB_USER_VERBS_CMD_ALLOC_PD: return cmd_alloc_pd(m);
	case IB_USER_VERBS_CMD_DEALLOC_PD: return cmd_destroy(m, UVEMU_PD, 0);
	case IB_USER_VERBS_CMD_REG_MR: return cmd_reg_mr(m);
	case IB_USER_VERBS_CMD_DEREG_MR: return cmd_destroy(m, UVEMU_MR, 0);
	case IB_USER_VERBS_CMD_CREATE_CQ: return cmd_create_cq(m);
	case IB_USER_VERBS_CMD_DESTROY_CQ: return cmd_destroy(m, UVEMU_CQ, 1);
	case IB_USER_VERBS_CMD_CREATE_QP: return cmd_create_qp(m);
	case IB_USER_VERBS_CMD_MODIFY_QP: return cmd_modify_qp(m);
	case IB_USER_VERBS_CMD_QUERY_QP: return cmd_query_qp(m);
	case IB_USER_VERBS_CMD_DESTROY_QP: return cmd_destroy(m, UVEMU_QP, 1);
	default: return EOPNOTSUPP;
	}
}

/* Core request and response sizes of the legacy commands served. */
static void core_sizes(uint32_t op, size_t *req, size_t *resp)
{
	*req = *resp = 0;
#define S(cmd, rq, rs) case IB_USER_VERBS_CMD_##cmd: *req = sizeof(struct rq); *resp = rs; break
	switch (op) {
	S(GET_CONTEXT, ib_uverbs_get_context, sizeof(struct ib_uverbs_get_context_resp));
	S(QUERY_DEVICE, ib_uverbs_query_device, sizeof(struct ib_uverbs_query_device_resp));
	S(QUERY_PORT, ib_uverbs_query_port, sizeof(struct ib_uverbs_query_port_resp));
	S(ALLOC_PD, ib_uverbs_alloc_pd, sizeof(struct ib_uverbs_alloc_pd_resp));
	S(DEALLOC_PD, ib_uverbs_dealloc_pd, 0);
	S(REG_MR, ib_uverbs_reg_mr, sizeof(struct ib_uverbs_reg_mr_resp));
	S(DEREG_MR, ib_uverbs_dereg_mr, 0);
	S(CREATE_CQ, ib_uverbs_create_cq, sizeof(struct ib_uverbs_create_cq_resp));
	S(DESTROY_CQ, ib_uverbs_destroy_cq, sizeof(struct ib_uverbs_destroy_cq_resp));
	S(CREATE_QP, ib_uverbs_create_qp, sizeof(struct ib_uverbs_create_qp_resp));
	S(MODIFY_QP, ib_uverbs_modify_qp, 0);
	S(QUERY_QP, ib_uverbs_query_qp, sizeof(struct ib_uverbs_query_qp_resp));
	S(DESTROY_QP, ib_uverbs_destroy_qp, sizeof(struct ib_uverbs_destroy_qp_resp));
	}
#undef S
}

/* The same for the extended commands served: the core request (without the extended header)
 * and the shortest response the kernel takes (through response_length). */
static void core_sizes_ex(uint32_t op, size_t *req, size_t *resp)
{
	*req = *resp = 0;
	if (op == IB_USER_VERBS_CMD_QUERY_DEVICE) {
		*req = sizeof(struct ib_uverbs_ex_query_device);
		*resp = offsetof(struct ib_uverbs_ex_query_device_resp, response_length) + 4;
	} else if (op == IB_USER_VERBS_CMD_MODIFY_QP) {
		*req = sizeof(struct ib_uverbs_ex_modify_qp);
		*resp = offsetof(struct ib_uverbs_ex_modify_qp_resp, response_length) + 4;
	}
}

/* Frames one write() (its bytes copied in already): headers, core and driver parts, with the
 * kernel's length checks; the response buffer must be writable. */
static int frame(struct cmd *m, const void *buf, size_t count)
{
	const struct ib_uverbs_cmd_hdr *h = buf;
	if (count < sizeof(*h)) return EINVAL;
	m->ex = !!(h->command & IB_USER_VERBS_CMD_FLAG_EXTENDED);
	m->op = h->command & IB_USER_VERBS_CMD_COMMAND_MASK;
	if (!m->ex) {
		size_t creq, cresp;
		core_sizes(m->op, &creq, &cresp);
		if (!creq) return EOPNOTSUPP;
		size_t in_bytes = h->in_words * 4u, out_bytes = h->out_words * 4u;
		if (in_bytes != count || count < sizeof(*h) + creq) return EINVAL;
		m->in = (const char *)buf + sizeof(*h);
		m->in_len = creq;
		m->din = (const char *)m->in + creq;
		m->din_len = count - sizeof(*h) - creq;
		if (cresp) {
			uint64_t resp = *(const uint64_t *)m->in; /* every such request starts with it */
			if (!resp) return EFAULT;
			if (out_bytes < cresp) return ENOSPC;
			m->out = (void *)(uintptr_t)resp;
			m->out_len = cresp;
			m->dout = (char *)m->out + cresp;
			m->dout_len = out_bytes - cresp;
			return user_writable(m->out, out_bytes);
		}
		return 0;
	}
	const struct ib_uverbs_ex_cmd_hdr *eh = (const void *)(h + 1);
	size_t hdr = sizeof(*h) + sizeof(*eh);
	if (count < hdr) return EINVAL;
	size_t cin = h->in_words * 8u, cout = h->out_words * 8u;
	size_t pin = eh->provider_in_words * 8u, pout = eh->provider_out_words * 8u;
	if (hdr + cin + pin != count) return EINVAL;
	m->in = (const char *)buf + hdr; m->in_len = cin;
	m->din = (const char *)m->in + cin; m->din_len = pin;
	m->out = (void *)(uintptr_t)eh->response; m->out_len = cout;
	m->dout = m->out ? (char *)m->out + cout : NULL; m->dout_len = m->out ? pout : 0;
	if ((cout || pout) && (!m->out || user_writable(m->out, cout + pout))) return EFAULT;
	/* Extended commands served: QUERY_DEVICE (its core request is comp_mask + reserved). */
	if (m->op != IB_USER_VERBS_CMD_QUERY_DEVICE && m->op != IB_USER_VERBS_CMD_MODIFY_QP) return EOPNOTSUPP;
	if (m->op == IB_USER_VERBS_CMD_MODIFY_QP && cin < sizeof(struct ib_uverbs_ex_modify_qp)) return EINVAL;
	return 0;
}

/* A test's hook, run between the framing's checks and the command (uvemu.h). */
static void (*before_response)(void *out, size_t len, void *arg);
static void *before_response_arg;

int uvemu_test_before_response(void (*hook)(void *out, size_t len, void *arg), void *arg)
{
	ensure_init();
	pthread_mutex_lock(&lock);
	before_response = hook;
	before_response_arg = arg;
	pthread_mutex_unlock(&lock);
	return 0;
}

static ssize_t uv_write(struct uvemu_context *c, const void *buf, size_t count)
{
	struct cmd m = { .c = c };
	/* The command is read once, into memory of our own, as the kernel copies it in. */
	void *req = count <= MAX_CMD_BYTES ? malloc(count ? count : 1) : NULL;
	int rc = count > MAX_CMD_BYTES ? EINVAL : !req ? ENOMEM : user_copy(req, buf, count);
	if (!rc) rc = frame(&m, req, count);
	if (!rc && m.op != IB_USER_VERBS_CMD_GET_CONTEXT && c->async_rd < 0) rc = EINVAL; /* no context yet */
	L("write(fd %d, %zu B) %s%u", c->cmd_fd, count, m.ex ? "EX_" : "", m.op);
	if (!rc && before_response && m.out) before_response(m.out, m.out_len + m.dout_len, before_response_arg);
	if (!rc) rc = do_cmd(&m);
	free(req);
	if (rc) { L("   -> %s", strerror(rc)); errno = rc; return -1; }
	return (ssize_t)count;
}

ssize_t write(int fd, const void *buf, size_t count)
{
	ensure_init();
	if (!is_cmd_fd(fd)) return r_write(fd, buf, count);
	pthread_mutex_lock(&lock);
	struct uvemu_context *c = context_of(fd);
	if (!c) { pthread_mutex_unlock(&lock); return r_write(fd, buf, count); }
	ssize_t n = uv_write(c, buf, count);
	int e = errno;
	pthread_mutex_unlock(&lock);
	errno = e;
	return n;
}

/* ------------------------------------------------------------------ async events */

/* Queues an event on context `c`'s async fd (what libibverbs' ibv_get_async_event reads). */
static int raise_event(struct uvemu_context *c, uint32_t type, uint64_t element)
{
	struct ib_uverbs_async_event_desc ev = { .element = element, .event_type = type };
	if (c->async_wr < 0) return ENODEV;
	ssize_t n = r_write(c->async_wr, &ev, sizeof(ev));
	L("async event %u (element %#llx) on cmd fd %d", type, (unsigned long long)element, c->cmd_fd);
	return n == (ssize_t)sizeof(ev) ? 0 : EIO;
}

int uvemu_set_port_state(const char *name, int port, int active)
{
	ensure_init();
	int rc = ENODEV;
	pthread_mutex_lock(&lock);
	for (int d = 0; d < ndevices; d++) {
		if (!name || strcmp(devices[d].name, name)) continue;
		if (port < 1 || port > devices[d].nports) { rc = EINVAL; break; }
		devices[d].port[port - 1].active = !!active;
		rc = 0;
		for (int i = 0; i < MAX_CONTEXTS && !rc; i++)
			if (contexts[i].in_use && contexts[i].dev == d && contexts[i].async_wr >= 0)
				rc = raise_event(&contexts[i], active ? IB_EVENT_PORT_ACTIVE : IB_EVENT_PORT_ERR, (uint64_t)port);
		break;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The QP or CQ object numbered `num` (a QPN or CQN) of any context in use, with its context
 * in `*ctx`; NULL if none. Called with `lock` held. */
static struct uvemu_obj *find_numbered(int type, uint32_t num, struct uvemu_context **ctx)
{
	for (int i = 0; i < MAX_CONTEXTS; i++) {
		if (!contexts[i].in_use) continue;
		for (int h = 0; h < UVEMU_MAX_OBJECTS; h++) {
			struct uvemu_obj *o = &contexts[i].obj[h];
			if (o->type != type) continue;
			if ((type == UVEMU_QP ? o->u.qp.qpn : o->u.cq.cqn) != num) continue;
			*ctx = &contexts[i];
			return o;
		}
	}
	return NULL;
}

int uvemu_qp_fatal(uint32_t qpn)
{
	ensure_init();
	int rc = ENOENT;
	struct uvemu_context *ctx;
	pthread_mutex_lock(&lock);
	struct uvemu_obj *o = find_numbered(UVEMU_QP, qpn, &ctx);
	if (o) {
		o->u.qp.state = QPS_ERR;
		rc = raise_event(ctx, IB_EVENT_QP_FATAL, o->u.qp.user_handle);
		o->async_events += !rc;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* Test controls beside uvemu.h's (declared here: the header is the soft HCA's interface,
 * whose Rust bindings are generated from it). Each returns 0 or an errno. */

/* Raises IBV_EVENT_CQ_ERR about the CQ numbered `cqn` on its context, as a HCA does when a
 * CQ overruns. Only the event: the HCA serving the data path is not told. */
int uvemu_cq_error(uint32_t cqn)
{
	ensure_init();
	int rc = ENOENT;
	struct uvemu_context *ctx;
	pthread_mutex_lock(&lock);
	struct uvemu_obj *o = find_numbered(UVEMU_CQ, cqn, &ctx);
	if (o) {
		rc = raise_event(ctx, IB_EVENT_CQ_ERR, o->u.cq.user_handle);
		o->async_events += !rc;
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The number of commands numbered `op` (ib_user_verbs.h: IB_USER_VERBS_CMD_QUERY_QP...)
 * this process's contexts were served, in `*count`. */
int uvemu_command_count(uint32_t op, uint64_t *count)
{
	if (op > IB_USER_VERBS_CMD_COMMAND_MASK || !count) return EINVAL;
	pthread_mutex_lock(&lock);
	*count = cmd_count[op];
	pthread_mutex_unlock(&lock);
	return 0;
}

/* The number of commands numbered `op` served through the ioctl ABI (DEVICE/INVOKE_WRITE),
 * in `*count`: tests tell which ABI libibverbs took. */
int uvemu_ioctl_command_count(uint32_t op, uint64_t *count)
{
	if (op > IB_USER_VERBS_CMD_COMMAND_MASK || !count) return EINVAL;
	pthread_mutex_lock(&lock);
	*count = ioctl_cmd_count[op];
	pthread_mutex_unlock(&lock);
	return 0;
}

/* The dynamic UARs this process's contexts allocated and the QPs made on them, in `*uars` and
 * `*qps`: tests tell which UARs libmlx5 took. */
int uvemu_dyn_uar_count(uint64_t *uars, uint64_t *qps)
{
	if (!uars || !qps) return EINVAL;
	pthread_mutex_lock(&lock);
	*uars = dyn_uars_made;
	*qps = dyn_uar_qps_made;
	pthread_mutex_unlock(&lock);
	return 0;
}

/* ------------------------------------------------------------------ ioctl, mmap */

/* MR/REG_DMABUF_MR: the one ioctl-only method (ibv_reg_dmabuf_mr). */
static int reg_dmabuf_mr(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	uint64_t v[UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY + 1] = {0};
	struct ib_uverbs_attr *a[UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY + 1] = {0};
	for (int i = 0; i < h->num_attrs; i++) {
		struct ib_uverbs_attr *x = &h->attrs[i];
		if (x->attr_id > UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY) return EINVAL;
		a[x->attr_id] = x;
		v[x->attr_id] = x->data; /* inline values (<= 8 bytes) and handles */
	}
	for (int i = 0; i <= UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY; i++)
		if (!a[i]) return EINVAL;
	if (a[UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY]->len < 4 || a[UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY]->len < 4 ||
	    !v[UVERBS_ATTR_REG_DMABUF_MR_LENGTH])
		return EINVAL;
	/* The key outputs are checked before the region exists, so a bad pointer leaves none. */
	if (user_writable((void *)(uintptr_t)v[UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY], 4) ||
	    user_writable((void *)(uintptr_t)v[UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY], 4))
		return EFAULT;
	uint32_t handle;
	int err;
	struct uvemu_obj *o = new_mr(c, (uint32_t)v[UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE],
				     (uint32_t)v[UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS], &handle, &err);
	if (!o) return err;
	o->u.mr.start = v[UVERBS_ATTR_REG_DMABUF_MR_OFFSET];
	o->u.mr.length = v[UVERBS_ATTR_REG_DMABUF_MR_LENGTH];
	o->u.mr.iova = v[UVERBS_ATTR_REG_DMABUF_MR_IOVA];
	o->u.mr.dmabuf_fd = (int)v[UVERBS_ATTR_REG_DMABUF_MR_FD];
	if (hca) {
		int rc = hca->reg_mr(c->dev, obj_get(c, (uint32_t)v[UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE], UVEMU_PD)->u.pd.pdn,
				     o->u.mr.iova, o->u.mr.length, o->u.mr.access | UVEMU_MR_DMABUF,
				     &o->u.mr.lkey, &o->u.mr.rkey);
		if (rc) {
			obj_destroy(c, handle, UVEMU_MR);
			return rc;
		}
		o->served = 1;
	}
	a[UVERBS_ATTR_REG_DMABUF_MR_HANDLE]->data = handle;
	if (user_copy((void *)(uintptr_t)a[UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY]->data, &o->u.mr.lkey, 4) ||
	    user_copy((void *)(uintptr_t)a[UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY]->data, &o->u.mr.rkey, 4))
		return created_unanswered(c, handle, UVEMU_MR);
	a[UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY]->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	a[UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY]->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	L("ioctl MR/REG_DMABUF_MR fd %d offset %#llx len %llu -> mr %u key %#x", o->u.mr.dmabuf_fd,
	  (unsigned long long)o->u.mr.start, (unsigned long long)o->u.mr.length, handle, o->u.mr.lkey);
	return 0;
}

/* The ABI this run serves: $UVEMU_ABI "write" answers every ioctl method but REG_DMABUF_MR
 * with EPROTONOSUPPORT (a kernel without them); anything else (default) serves INVOKE_WRITE. */
static int abi_ioctl(void)
{
	static int abi = -1;
	if (abi < 0) {
		const char *e = getenv("UVEMU_ABI");
		abi = !(e && !strcmp(e, "write"));
		L("ABI: %s", abi ? "ioctl" : "write");
	}
	return abi;
}

/* Sorts one method's attributes by the `n` ids it knows (into a[], in that order) as the kernel
 * validates them: reserved bits zero, no id twice, an unknown id refused with EPROTONOSUPPORT
 * when marked mandatory and skipped otherwise. */
static int sort_attrs(struct ib_uverbs_ioctl_hdr *h, const uint16_t *ids, int n, struct ib_uverbs_attr **a)
{
	for (int i = 0; i < h->num_attrs; i++) {
		struct ib_uverbs_attr *x = &h->attrs[i];
		if (x->attr_data.reserved || (x->flags & ~UVERBS_ATTR_F_MANDATORY)) return EINVAL;
		int k = 0;
		while (k < n && ids[k] != x->attr_id) k++;
		if (k == n) {
			if (x->flags & UVERBS_ATTR_F_MANDATORY) return EPROTONOSUPPORT;
			continue;
		}
		if (a[k]) return EINVAL;
		a[k] = x;
	}
	return 0;
}

/* INVOKE_WRITE's attributes, found by id: core in/out, command, driver in/out. */
enum { IW_CORE_IN, IW_CORE_OUT, IW_CMD, IW_UHW_IN, IW_UHW_OUT, IW_N };

static int invoke_write_attrs(struct ib_uverbs_ioctl_hdr *h, struct ib_uverbs_attr *a[IW_N])
{
	static const uint16_t ids[IW_N] = { UVERBS_ATTR_CORE_IN, UVERBS_ATTR_CORE_OUT, UVERBS_ATTR_WRITE_CMD,
					    UVERBS_ATTR_UHW_IN, UVERBS_ATTR_UHW_OUT };
	int rc = sort_attrs(h, ids, IW_N, a);
	return rc ? rc : a[IW_CORE_IN] && a[IW_CMD] ? 0 : EINVAL;
}

/* A pointer attribute's input bytes (inline up to 8, else at its user pointer) into a fresh
 * buffer of at least `min` bytes (the len field is 16 bits: bounded). */
static void *attr_bytes(const struct ib_uverbs_attr *x, size_t min, int *err)
{
	size_t len = x ? x->len : 0;
	if (len < min) { *err = EINVAL; return NULL; }
	char *b = calloc(1, len + 1);
	if (!b) { *err = ENOMEM; return NULL; }
	if (len <= 8) memcpy(b, &x->data, len);
	else if (user_copy(b, (void *)(uintptr_t)x->data, len)) { free(b); *err = EFAULT; return NULL; }
	return b;
}

/* DEVICE/INVOKE_WRITE: a legacy write() command carried over ioctl, its request and response
 * in separate core and driver attributes (libibverbs' path once ioctl answers). */
static int invoke_write(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	struct ib_uverbs_attr *a[IW_N] = {0};
	int rc = invoke_write_attrs(h, a);
	if (rc) return rc;
	uint64_t cmd = a[IW_CMD]->data;
	struct cmd m = { .c = c, .op = (uint32_t)(cmd & IB_USER_VERBS_CMD_COMMAND_MASK),
			 .ex = !!(cmd & IB_USER_VERBS_CMD_FLAG_EXTENDED) };
	size_t creq, cresp;
	if (cmd & ~(uint64_t)(IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_COMMAND_MASK)) return EOPNOTSUPP;
	(m.ex ? core_sizes_ex : core_sizes)(m.op, &creq, &cresp);
	if (!creq) return EOPNOTSUPP;
	if (m.op != IB_USER_VERBS_CMD_GET_CONTEXT && c->async_rd < 0) return EINVAL; /* no context yet */
	struct ib_uverbs_attr *o = a[IW_CORE_OUT], *d = a[IW_UHW_OUT];
	if (cresp && (!o || o->len < cresp)) return ENOSPC;
	if ((o && user_writable((void *)(uintptr_t)o->data, o->len)) ||
	    (d && user_writable((void *)(uintptr_t)d->data, d->len)))
		return EFAULT;
	void *in = attr_bytes(a[IW_CORE_IN], creq, &rc), *din = in ? attr_bytes(a[IW_UHW_IN], 0, &rc) : NULL;
	if (din) {
		m.in = in; m.in_len = creq;
		m.din = din; m.din_len = a[IW_UHW_IN] ? a[IW_UHW_IN]->len : 0;
		/* An extended command's response may be longer than its minimum (it says how much
		 * it wrote in response_length). */
		m.out = o ? (void *)(uintptr_t)o->data : NULL; m.out_len = m.ex && o ? o->len : cresp;
		m.dout = d ? (void *)(uintptr_t)d->data : NULL; m.dout_len = d ? d->len : 0;
		L("ioctl DEVICE/INVOKE_WRITE %u", m.op);
		rc = do_cmd(&m);
		ioctl_cmd_count[m.op] += !rc;
	}
	free(in);
	free(din);
	for (int k = IW_CORE_OUT; !rc && k < IW_N; k += IW_UHW_OUT - IW_CORE_OUT)
		if (a[k]) a[k]->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	return rc;
}

/* MLX5_IB_OBJECT_UAR's attributes: the new handle, the type (BF or NC), then the outputs. */
enum { UA_HANDLE, UA_TYPE, UA_OFFSET, UA_LENGTH, UA_PAGE_ID, UA_N };

/* The mmap offset of dynamic UAR `handle`, as the kernel encodes its mmap entries: the
 * command in bits 8..15 of the page offset, the entry's index around it. */
static uint64_t dyn_uar_offset(uint32_t handle)
{
	return ((uint64_t)(handle >> 8) << 16 | MMAP_OFFSET_START << 8 | (handle & 0xff)) << 12;
}

/* MLX5_IB_OBJECT_UAR/UAR_OBJ_ALLOC: a UAR page of the process's own (a current libmlx5 asks
 * one for its CQs' doorbells, NC, and one per two QPs, BF); the process maps it at the
 * returned offset and names its page id in CREATE_CQ/CREATE_QP. */
static int uar_alloc(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const uint16_t ids[UA_N] = { MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE,
					    MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH,
					    MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID };
	static const uint16_t out_len[UA_N] = { 0, 0, 8, 4, 4 };
	struct ib_uverbs_attr *a[UA_N] = {0};
	int rc = sort_attrs(h, ids, UA_N, a);
	for (int k = 0; !rc && k < UA_N; k++)
		if (!a[k] || a[k]->len < out_len[k]) rc = EINVAL;
	if (rc) return rc;
	uint64_t type = a[UA_TYPE]->data;
	if (type != MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF && type != MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC) return EOPNOTSUPP;
	for (int k = UA_OFFSET; k < UA_N; k++)
		if (user_writable((void *)(uintptr_t)a[k]->data, out_len[k])) return EFAULT;
	uint32_t handle;
	struct uvemu_obj *o = obj_new(c, UVEMU_UAR, &handle);
	if (!o) return ENOMEM;
	o->u.uar.page_id = DYN_UAR_PAGE_ID(handle);
	o->u.uar.type = (uint32_t)type;
	uint64_t offset = dyn_uar_offset(handle);
	uint32_t length = 4096;
	if (user_copy((void *)(uintptr_t)a[UA_OFFSET]->data, &offset, 8) ||
	    user_copy((void *)(uintptr_t)a[UA_LENGTH]->data, &length, 4) ||
	    user_copy((void *)(uintptr_t)a[UA_PAGE_ID]->data, &o->u.uar.page_id, 4)) {
		o->type = UVEMU_FREE;
		return EFAULT;
	}
	a[UA_HANDLE]->data = handle;
	for (int k = UA_OFFSET; k < UA_N; k++) a[k]->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	dyn_uars_made++;
	L("ioctl UAR/UAR_OBJ_ALLOC %s -> uar %u page id %u offset %#llx", type ? "NC" : "BF", handle,
	  o->u.uar.page_id, (unsigned long long)offset);
	return 0;
}

/* MLX5_IB_OBJECT_UAR/UAR_OBJ_DESTROY: the handle goes; as in the kernel, QPs and CQs on the
 * page are not asked (the firmware's UAR lives until the process unmaps the page, and the
 * emulator keeps a page a served QP watches until the QP is destroyed). */
static int uar_destroy(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const uint16_t ids[1] = { MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE };
	struct ib_uverbs_attr *a[1] = {0};
	int rc = sort_attrs(h, ids, 1, a);
	if (rc || !a[0]) return rc ? rc : EINVAL;
	uint64_t handle = a[0]->data;
	if (!handle || handle > UVEMU_MAX_OBJECTS || c->obj[handle - 1].type == UVEMU_FREE) return ENOENT;
	if (c->obj[handle - 1].type != UVEMU_UAR) return EINVAL;
	c->obj[handle - 1].type = UVEMU_FREE;
	L("ioctl UAR/UAR_OBJ_DESTROY uar %llu", (unsigned long long)handle);
	return 0;
}

/* ------------------------------------------------------------------ native ioctl methods */

/* The verbs methods a current kernel serves natively and libibverbs tries before
 * INVOKE_WRITE (execute_ioctl_fallback): each decodes its attributes as the kernel's uverbs
 * core does and runs the same handler as its write() command (one implementation, two
 * decoders). Commands served this way, by the write() command number they stand for. */
static uint64_t native_cmd_count[IB_USER_VERBS_CMD_COMMAND_MASK + 1];

/* How an attribute is given: an object handle (in, or out for a new one), a file descriptor
 * (in, or out), an inline constant, a typed input, an output buffer. */
enum { NA_IDR, NA_IDR_NEW, NA_FD, NA_FD_NEW, NA_CONST, NA_IN, NA_OUT };
struct nat_spec { uint16_t id; uint8_t kind, mandatory; uint16_t min, max; };
#define NAT_MAX 24 /* attributes a method knows, at most */

/* Sorts and checks one method's attributes against its spec (the kernel's rules): unknown
 * mandatory EPROTONOSUPPORT, a required one missing, an input shorter than its type, an
 * output shorter than its minimum or a handle wider than 32 bits EINVAL, an input longer than
 * its type with non-zero bytes past it EOPNOTSUPP. */
static int nat_attrs(struct ib_uverbs_ioctl_hdr *h, const struct nat_spec *s, int n, struct ib_uverbs_attr **a)
{
	uint16_t ids[NAT_MAX];
	if (n > NAT_MAX) return EINVAL;
	for (int k = 0; k < n; k++) ids[k] = s[k].id;
	int rc = sort_attrs(h, ids, n, a);
	for (int k = 0; !rc && k < n; k++) {
		const struct ib_uverbs_attr *x = a[k];
		if (!x) { rc = s[k].mandatory ? EINVAL : 0; continue; }
		switch (s[k].kind) {
		case NA_IDR: case NA_IDR_NEW: case NA_FD: case NA_FD_NEW:
			if (x->data >> 32) rc = EINVAL;
			break;
		case NA_CONST:
			if (x->len < 1 || x->len > 8) rc = EINVAL;
			break;
		case NA_OUT:
			if (x->len < s[k].min) rc = EINVAL;
			else if (x->len && user_writable((void *)(uintptr_t)x->data, x->len)) rc = EFAULT;
			break;
		default:
			if (x->len < s[k].min) rc = EINVAL;
		}
		if (rc) L("   attribute %#x (len %u, data %#llx) refused: %s", x->attr_id, x->len,
			  (unsigned long long)x->data, strerror(rc));
	}
	return rc;
}

/* An input attribute's bytes (NA_IN) into `dst` of `size` bytes, zero-filled: EFAULT for an
 * unreadable pointer, EOPNOTSUPP for non-zero bytes past `size` (the kernel's zero-trailing
 * rule). Absent: zeros. */
static int nat_in(const struct ib_uverbs_attr *x, void *dst, size_t size)
{
	memset(dst, 0, size);
	if (!x) return 0;
	int rc = 0;
	char *b = attr_bytes(x, 0, &rc);
	if (!b) return rc;
	for (size_t i = size; i < x->len; i++)
		if (b[i]) rc = EOPNOTSUPP;
	if (!rc) memcpy(dst, b, x->len < size ? x->len : size);
	free(b);
	return rc;
}

/* An inline constant (NA_CONST) or a handle or fd: the value, zero when absent. */
static uint64_t nat_val(const struct ib_uverbs_attr *x)
{
	if (!x) return 0;
	if (x->len && x->len < 8) return x->data & ((1ull << (8 * x->len)) - 1);
	return x->data;
}

/* Writes an output attribute (the prefix its buffer holds, as uverbs_copy_to): 0 or EFAULT. */
static int nat_out(struct ib_uverbs_attr *x, const void *src, size_t size)
{
	if (!x) return 0;
	int rc = put((void *)(uintptr_t)x->data, x->len < size ? x->len : size, src, x->len < size ? x->len : size);
	if (!rc) x->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	return rc;
}

/* The driver's data (UHW_IN/UHW_OUT) of a native method into a command: its bytes copied in
 * (at least `min` bytes of buffer, zero-filled), its response buffer named. */
static int nat_uhw(struct cmd *m, struct ib_uverbs_attr *in, struct ib_uverbs_attr *out, size_t min, void **din)
{
	size_t len = in ? in->len : 0;
	*din = calloc(1, (len > min ? len : min) + 1);
	if (!*din) return ENOMEM;
	int rc = in ? nat_in(in, *din, len) : 0;
	m->din = *din; m->din_len = len;
	m->dout = out ? (void *)(uintptr_t)out->data : NULL; m->dout_len = out ? out->len : 0;
	if (out) out->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	return rc;
}

/* Runs a native method's command through the write() command's handler, counted as native. */
static int nat_run(struct cmd *m, const char *name)
{
	L("ioctl %s", name);
	int rc = do_cmd(m);
	native_cmd_count[m->op] += !rc;
	return rc;
}

/* DEVICE/GET_CONTEXT: the context, without its async event file (ASYNC_EVENT_ALLOC makes it). */
static int nat_get_context(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[] = {
		{ UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS, NA_OUT, 0, 4, 0 },
		{ UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT, NA_OUT, 0, 8, 0 },
		{ UVERBS_ATTR_UHW_IN, NA_IN, 0, 0, 0 }, { UVERBS_ATTR_UHW_OUT, NA_OUT, 0, 0, 0 },
	};
	struct ib_uverbs_attr *a[4] = {0};
	int rc = nat_attrs(h, s, 4, a);
	if (rc) return rc;
	struct ib_uverbs_get_context core = {0};
	struct cmd m = { .c = c, .op = IB_USER_VERBS_CMD_GET_CONTEXT, .in = &core, .in_len = sizeof(core) };
	void *din = NULL;
	rc = nat_uhw(&m, a[2], a[3], 0, &din);
	if (!rc) rc = nat_run(&m, "DEVICE/GET_CONTEXT");
	free(din);
	if (rc) return rc;
	async_given[c - contexts] = 0;
	/* No optional MR access flags are known here: libibverbs then masks them, as the write
	 * ABI (which cannot say) makes it. */
	uint32_t vectors = 4;
	uint64_t core_support = 0;
	if (nat_out(a[0], &vectors, 4) || nat_out(a[1], &core_support, 8)) {
		/* The caller never learns of the context: it is not made, as on the write path. */
		r_close(c->async_rd);
		r_close(c->async_wr);
		c->async_rd = c->async_wr = -1;
		c->tot_bfregs = 0;
		return EFAULT;
	}
	return 0;
}

/* ASYNC_EVENT/ASYNC_EVENT_ALLOC: the context's async event file (one per context here). */
static int nat_async_alloc(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[] = { { UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE, NA_FD_NEW, 1, 0, 0 } };
	struct ib_uverbs_attr *a[1] = {0};
	int rc = nat_attrs(h, s, 1, a);
	if (rc) return rc;
	if (async_given[c - contexts]) return EINVAL; /* the emulator keeps one file per context */
	async_given[c - contexts] = 1;
	a[0]->data = (uint64_t)c->async_rd;
	L("ioctl ASYNC_EVENT/ASYNC_EVENT_ALLOC -> fd %d", c->async_rd);
	return 0;
}

/* DEVICE/QUERY_PORT: the port's attributes (ib_uverbs_query_port_resp_ex). */
static int nat_query_port(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[] = {
		{ UVERBS_ATTR_QUERY_PORT_PORT_NUM, NA_CONST, 1, 0, 0 },
		{ UVERBS_ATTR_QUERY_PORT_RESP, NA_OUT, 1, sizeof(struct ib_uverbs_query_port_resp_ex), 0 },
	};
	struct ib_uverbs_attr *a[2] = {0};
	int rc = nat_attrs(h, s, 2, a);
	if (rc) return rc;
	uint64_t port = nat_val(a[0]);
	if (port > 0xff) return EINVAL;
	struct ib_uverbs_query_port q = { .port_num = (uint8_t)port };
	struct ib_uverbs_query_port_resp_ex r = {0};
	struct cmd m = { .c = c, .op = IB_USER_VERBS_CMD_QUERY_PORT, .in = &q, .in_len = sizeof(q),
			 .out = &r.legacy_resp, .out_len = sizeof(r.legacy_resp) };
	rc = nat_run(&m, "DEVICE/QUERY_PORT");
	/* A current kernel's response ends with active_speed_ex (a u32 at byte 44, where older
	 * uapi headers have reserved bytes): the port's speed, which rdma-core 50 reads. */
	_Static_assert(sizeof(r) == 48, "ib_uverbs_query_port_resp_ex is 48 bytes");
	uint32_t speed_ex = r.legacy_resp.active_speed;
	memcpy((char *)&r + 44, &speed_ex, 4);
	return rc ? rc : nat_out(a[1], &r, sizeof(r));
}

/* GID entry `index` of `port` as the kernel's GID cache holds it: the GID, its type (from the
 * table's sysfs types file, as the kernel's attributes are shown there) and its network
 * device's index (RoCE; 0 on InfiniBand). 0, EINVAL (no such port or index) or ENODATA (an
 * empty entry). */
static int gid_entry(const struct uvemu_context *c, uint32_t port, uint32_t index, struct ib_uverbs_gid_entry *e)
{
	const struct uvemu_port *p = port_of(c, port);
	if (!p || index >= UVEMU_GIDS) return EINVAL;
	static const uint8_t empty[16];
	if (!memcmp(p->gid[index], empty, 16)) return ENODATA;
	memset(e, 0, sizeof(*e));
	memcpy(e->gid, p->gid[index], 16);
	e->gid_index = index;
	e->port_num = port;
	char rel[256], v[64];
	const char *dev = devices[c->dev].name;
	snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%u/gid_attrs/types/%u", dev, port, index);
	int v2 = read_sysfs(rel, v, sizeof(v)) && !strcmp(v, "RoCE v2");
	e->gid_type = !p->ethernet ? IB_UVERBS_GID_TYPE_IB : v2 ? IB_UVERBS_GID_TYPE_ROCE_V2 : IB_UVERBS_GID_TYPE_ROCE_V1;
	snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%u/gid_attrs/ndevs/%u", dev, port, index);
	e->netdev_ifindex = p->ethernet && read_sysfs(rel, v, sizeof(v)) && v[0] ? if_nametoindex(v) : 0;
	return 0;
}

/* DEVICE/QUERY_GID_ENTRY: one GID entry (ibv_query_gid_ex). No flags are defined (EINVAL). */
static int nat_query_gid_entry(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[] = {
		{ UVERBS_ATTR_QUERY_GID_ENTRY_PORT, NA_CONST, 1, 0, 0 },
		{ UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, NA_CONST, 1, 0, 0 },
		{ UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, NA_IN, 1, 4, 4 },
		{ UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, NA_OUT, 1, sizeof(struct ib_uverbs_gid_entry), 0 },
	};
	struct ib_uverbs_attr *a[4] = {0};
	uint32_t flags = 0;
	int rc = nat_attrs(h, s, 4, a);
	if (!rc) rc = nat_in(a[2], &flags, 4);
	if (rc) return rc;
	uint64_t port = nat_val(a[0]), index = nat_val(a[1]);
	if (flags || port > UINT32_MAX || index > UINT32_MAX) return EINVAL;
	struct ib_uverbs_gid_entry e;
	rc = gid_entry(c, (uint32_t)port, (uint32_t)index, &e);
	L("ioctl DEVICE/QUERY_GID_ENTRY port %llu index %llu -> %s", (unsigned long long)port,
	  (unsigned long long)index, rc ? strerror(rc) : "ok");
	return rc ? rc : nat_out(a[3], &e, sizeof(e));
}

/* DEVICE/QUERY_GID_TABLE: every valid GID entry of every port (ibv_query_gid_table), each in
 * an element of the caller's size (the prefix of the entry, zero-filled past it): EINVAL for
 * an element size of 0, a buffer not a whole number of elements or too small for them all. */
static int nat_query_gid_table(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[] = {
		{ UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, NA_CONST, 1, 0, 0 },
		{ UVERBS_ATTR_QUERY_GID_TABLE_FLAGS, NA_IN, 0, 4, 4 },
		{ UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, NA_OUT, 1, 0, 0 },
		{ UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES, NA_OUT, 1, 8, 0 },
	};
	struct ib_uverbs_attr *a[4] = {0};
	uint32_t flags = 0;
	int rc = nat_attrs(h, s, 4, a);
	if (!rc) rc = nat_in(a[1], &flags, 4);
	if (rc) return rc;
	uint64_t size = nat_val(a[0]), len = a[2]->len;
	if (flags || !size || size > len || len % size) return EINVAL;
	uint64_t n = 0;
	char *out = (char *)(uintptr_t)a[2]->data;
	for (uint32_t port = 1; port <= (uint32_t)devices[c->dev].nports; port++)
		for (uint32_t i = 0; i < UVEMU_GIDS; i++) {
			struct ib_uverbs_gid_entry e;
			if (gid_entry(c, port, i, &e)) continue;
			if ((n + 1) * size > len) return EINVAL; /* more entries than the buffer holds */
			if (put(out + n * size, size, &e, size < sizeof(e) ? size : sizeof(e))) return EFAULT;
			n++;
		}
	a[2]->flags |= UVERBS_ATTR_F_VALID_OUTPUT;
	L("ioctl DEVICE/QUERY_GID_TABLE -> %llu entries", (unsigned long long)n);
	return nat_out(a[3], &n, 8);
}

/* An event file named in a create (EVENT_FD): the context's own async event file, or EINVAL. */
static int nat_event_fd(const struct uvemu_context *c, const struct ib_uverbs_attr *x)
{
	return !x || (int64_t)x->data == c->async_rd ? 0 : EINVAL;
}

enum { NCQ_HANDLE, NCQ_CQE, NCQ_USER, NCQ_CHANNEL, NCQ_VECTOR, NCQ_FLAGS, NCQ_RESP_CQE, NCQ_EVENT_FD,
       NCQ_UAR_INDEX, NCQ_UHW_IN, NCQ_UHW_OUT, NCQ_N };

/* CQ/CQ_CREATE: the CQ, as CREATE_CQ makes it; mlx5's UAR index attribute names the page of
 * its arm doorbell (as the flag in mlx5's request does). Flags (the extended command's) and
 * completion channels are not served: EOPNOTSUPP and EINVAL (no such channel). */
static int nat_cq_create(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[NCQ_N] = {
		{ UVERBS_ATTR_CREATE_CQ_HANDLE, NA_IDR_NEW, 1, 0, 0 }, { UVERBS_ATTR_CREATE_CQ_CQE, NA_IN, 1, 4, 4 },
		{ UVERBS_ATTR_CREATE_CQ_USER_HANDLE, NA_IN, 1, 8, 8 }, { UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL, NA_FD, 0, 0, 0 },
		{ UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, NA_IN, 1, 4, 4 }, { UVERBS_ATTR_CREATE_CQ_FLAGS, NA_IN, 0, 4, 4 },
		{ UVERBS_ATTR_CREATE_CQ_RESP_CQE, NA_OUT, 1, 4, 0 }, { UVERBS_ATTR_CREATE_CQ_EVENT_FD, NA_FD, 0, 0, 0 },
		{ UVERBS_ATTR_UHW_OUT + 1 /* MLX5_IB_ATTR_CREATE_CQ_UAR_INDEX */, NA_IN, 0, 4, 4 },
		{ UVERBS_ATTR_UHW_IN, NA_IN, 0, 0, 0 }, { UVERBS_ATTR_UHW_OUT, NA_OUT, 0, 0, 0 },
	};
	struct ib_uverbs_attr *a[NCQ_N] = {0};
	int rc = nat_attrs(h, s, NCQ_N, a);
	struct ib_uverbs_create_cq q = { .comp_channel = -1 };
	uint32_t flags = 0, uar_index = 0;
	if (!rc) rc = nat_in(a[NCQ_CQE], &q.cqe, 4);
	if (!rc) rc = nat_in(a[NCQ_USER], &q.user_handle, 8);
	if (!rc) rc = nat_in(a[NCQ_VECTOR], &q.comp_vector, 4);
	if (!rc) rc = nat_in(a[NCQ_FLAGS], &flags, 4);
	if (!rc) rc = nat_in(a[NCQ_UAR_INDEX], &uar_index, 4);
	if (!rc) rc = flags ? EOPNOTSUPP : a[NCQ_CHANNEL] ? EINVAL : nat_event_fd(c, a[NCQ_EVENT_FD]);
	if (rc) return rc;
	struct ib_uverbs_create_cq_resp r = {0};
	struct cmd m = { .c = c, .op = IB_USER_VERBS_CMD_CREATE_CQ, .in = &q, .in_len = sizeof(q),
			 .out = &r, .out_len = sizeof(r) };
	void *din = NULL;
	rc = nat_uhw(&m, a[NCQ_UHW_IN], a[NCQ_UHW_OUT], sizeof(struct mlx5_ib_create_cq), &din);
	if (!rc && a[NCQ_UAR_INDEX]) {
		struct mlx5_ib_create_cq *d = din;
		d->flags |= MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX;
		d->uar_page_index = (uint16_t)uar_index;
		if (uar_index > 0xffff) rc = EINVAL;
		if (m.din_len < sizeof(*d)) m.din_len = sizeof(*d);
	}
	if (!rc) rc = nat_run(&m, "CQ/CQ_CREATE");
	free(din);
	if (rc) return rc;
	a[NCQ_HANDLE]->data = r.cq_handle;
	return nat_out(a[NCQ_RESP_CQE], &r.cqe, 4) ? created_unanswered(c, r.cq_handle, UVEMU_CQ) : 0;
}

/* CQ/CQ_DESTROY, QP/QP_DESTROY, MR/MR_DESTROY, PD/PD_DESTROY: the object goes, as its write()
 * command makes it go; the CQ's and QP's response reports the async events raised about it. */
static int nat_destroy(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h, uint32_t op, enum uvemu_obj_type t,
		       int has_response, const char *name)
{
	/* Every destroy method numbers its handle 0 and its response 1. */
	const struct nat_spec s[] = { { 0, NA_IDR, 1, 0, 0 },
				      { 1, NA_OUT, 1, t == UVEMU_CQ ? sizeof(struct ib_uverbs_destroy_cq_resp)
								    : sizeof(struct ib_uverbs_destroy_qp_resp), 0 } };
	struct ib_uverbs_attr *a[2] = {0};
	int rc = nat_attrs(h, s, has_response ? 2 : 1, a);
	if (rc) return rc;
	/* The write() request: the handle first (PD, MR) or after the response pointer (CQ, QP). */
	uint32_t w[4] = {0};
	w[has_response ? 2 : 0] = (uint32_t)a[0]->data;
	union { struct ib_uverbs_destroy_cq_resp cq; struct ib_uverbs_destroy_qp_resp qp; } r = {0};
	struct cmd m = { .c = c, .op = op, .in = w, .in_len = sizeof(w), .out = has_response ? &r : NULL,
			 .out_len = t == UVEMU_CQ ? sizeof(r.cq) : sizeof(r.qp) };
	rc = nat_run(&m, name);
	return rc || !has_response ? rc : nat_out(a[1], &r, m.out_len);
}

static int nat_cq_destroy(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	return nat_destroy(c, h, IB_USER_VERBS_CMD_DESTROY_CQ, UVEMU_CQ, 1, "CQ/CQ_DESTROY");
}
static int nat_qp_destroy(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	return nat_destroy(c, h, IB_USER_VERBS_CMD_DESTROY_QP, UVEMU_QP, 1, "QP/QP_DESTROY");
}
static int nat_mr_destroy(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	return nat_destroy(c, h, IB_USER_VERBS_CMD_DEREG_MR, UVEMU_MR, 0, "MR/MR_DESTROY");
}
static int nat_pd_destroy(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	return nat_destroy(c, h, IB_USER_VERBS_CMD_DEALLOC_PD, UVEMU_PD, 0, "PD/PD_DESTROY");
}

enum { NQP_HANDLE, NQP_XRCD, NQP_PD, NQP_SRQ, NQP_SCQ, NQP_RCQ, NQP_IND, NQP_USER, NQP_CAP, NQP_TYPE,
       NQP_FLAGS, NQP_SRC_QPN, NQP_EVENT_FD, NQP_RESP_CAP, NQP_RESP_QPN, NQP_UHW_IN, NQP_UHW_OUT, NQP_N };
_Static_assert(NQP_N <= NAT_MAX && NCQ_N <= NAT_MAX, "a method knows more attributes than nat_attrs sorts");

/* QP/QP_CREATE's attributes into CREATE_QP's request: 0 or an errno. What CREATE_QP cannot
 * say (XRC, RSS, a source QPN, create flags but SQ_SIG_ALL) is not served: EOPNOTSUPP, as the
 * extended command answers; an SRQ handle names no SRQ: EINVAL. */
static int nat_qp_request(const struct uvemu_context *c, struct ib_uverbs_attr **a, struct ib_uverbs_create_qp *q)
{
	struct ib_uverbs_qp_cap cap;
	uint32_t flags = 0;
	int rc = nat_in(a[NQP_CAP], &cap, sizeof(cap));
	if (!rc) rc = nat_in(a[NQP_USER], &q->user_handle, 8);
	if (!rc) rc = nat_in(a[NQP_FLAGS], &flags, 4);
	if (rc) return rc;
	if (a[NQP_XRCD] || a[NQP_IND] || a[NQP_SRC_QPN] || (flags & ~IB_UVERBS_QP_CREATE_SQ_SIG_ALL)) return EOPNOTSUPP;
	if (a[NQP_SRQ] || nat_val(a[NQP_TYPE]) > 0xff) return EINVAL;
	q->pd_handle = (uint32_t)nat_val(a[NQP_PD]);
	q->send_cq_handle = (uint32_t)nat_val(a[NQP_SCQ]);
	q->recv_cq_handle = (uint32_t)nat_val(a[NQP_RCQ]);
	q->max_send_wr = cap.max_send_wr; q->max_recv_wr = cap.max_recv_wr;
	q->max_send_sge = cap.max_send_sge; q->max_recv_sge = cap.max_recv_sge;
	q->max_inline_data = cap.max_inline_data;
	q->sq_sig_all = !!(flags & IB_UVERBS_QP_CREATE_SQ_SIG_ALL);
	q->qp_type = (uint8_t)nat_val(a[NQP_TYPE]);
	return nat_event_fd(c, a[NQP_EVENT_FD]);
}

/* QP/QP_CREATE: the QP, as CREATE_QP makes it (mlx5's request in UHW_IN). */
static int nat_qp_create(struct uvemu_context *c, struct ib_uverbs_ioctl_hdr *h)
{
	static const struct nat_spec s[NQP_N] = {
		{ UVERBS_ATTR_CREATE_QP_HANDLE, NA_IDR_NEW, 1, 0, 0 }, { UVERBS_ATTR_CREATE_QP_XRCD_HANDLE, NA_IDR, 0, 0, 0 },
		{ UVERBS_ATTR_CREATE_QP_PD_HANDLE, NA_IDR, 0, 0, 0 }, { UVERBS_ATTR_CREATE_QP_SRQ_HANDLE, NA_IDR, 0, 0, 0 },
		{ UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, NA_IDR, 0, 0, 0 }, { UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, NA_IDR, 0, 0, 0 },
		{ UVERBS_ATTR_CREATE_QP_IND_TABLE_HANDLE, NA_IDR, 0, 0, 0 }, { UVERBS_ATTR_CREATE_QP_USER_HANDLE, NA_IN, 1, 8, 8 },
		{ UVERBS_ATTR_CREATE_QP_CAP, NA_IN, 1, sizeof(struct ib_uverbs_qp_cap), sizeof(struct ib_uverbs_qp_cap) },
		{ UVERBS_ATTR_CREATE_QP_TYPE, NA_CONST, 1, 0, 0 }, { UVERBS_ATTR_CREATE_QP_FLAGS, NA_IN, 0, 4, 4 },
		{ UVERBS_ATTR_CREATE_QP_SOURCE_QPN, NA_IN, 0, 4, 4 }, { UVERBS_ATTR_CREATE_QP_EVENT_FD, NA_FD, 0, 0, 0 },
		{ UVERBS_ATTR_CREATE_QP_RESP_CAP, NA_OUT, 1, sizeof(struct ib_uverbs_qp_cap), 0 },
		{ UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, NA_OUT, 1, 4, 0 },
		{ UVERBS_ATTR_UHW_IN, NA_IN, 0, 0, 0 }, { UVERBS_ATTR_UHW_OUT, NA_OUT, 0, 0, 0 },
	};
	struct ib_uverbs_attr *a[NQP_N] = {0};
	struct ib_uverbs_create_qp q = {0};
	int rc = nat_attrs(h, s, NQP_N, a);
	if (!rc) rc = nat_qp_request(c, a, &q);
	if (rc) return rc;
	struct ib_uverbs_create_qp_resp r = {0};
	struct cmd m = { .c = c, .op = IB_USER_VERBS_CMD_CREATE_QP, .in = &q, .in_len = sizeof(q),
			 .out = &r, .out_len = sizeof(r) };
	void *din = NULL;
	rc = nat_uhw(&m, a[NQP_UHW_IN], a[NQP_UHW_OUT], 0, &din);
	if (!rc) rc = nat_run(&m, "QP/QP_CREATE");
	free(din);
	if (rc) return rc;
	a[NQP_HANDLE]->data = r.qp_handle;
	struct ib_uverbs_qp_cap cap = { r.max_send_wr, r.max_recv_wr, r.max_send_sge, r.max_recv_sge, r.max_inline_data };
	if (nat_out(a[NQP_RESP_CAP], &cap, sizeof(cap)) || nat_out(a[NQP_RESP_QPN], &r.qpn, 4))
		return created_unanswered(c, r.qp_handle, UVEMU_QP);
	return 0;
}

/* The number of commands numbered `op` served through their native ioctl methods (QP_CREATE
 * for CREATE_QP...), in `*count`: tests tell that libibverbs did not fall back. */
int uvemu_native_command_count(uint32_t op, uint64_t *count)
{
	if (op > IB_USER_VERBS_CMD_COMMAND_MASK || !count) return EINVAL;
	pthread_mutex_lock(&lock);
	*count = native_cmd_count[op];
	pthread_mutex_unlock(&lock);
	return 0;
}

/* The native method of (object, method) that the ioctl ABI serves, or NULL. */
static int (*native_handler(uint16_t object, uint16_t method))(struct uvemu_context *, struct ib_uverbs_ioctl_hdr *)
{
	static const struct { uint16_t object, method; int (*fn)(struct uvemu_context *, struct ib_uverbs_ioctl_hdr *); } t[] = {
		{ UVERBS_OBJECT_DEVICE, UVERBS_METHOD_GET_CONTEXT, nat_get_context },
		{ UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_PORT, nat_query_port },
		{ UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_ENTRY, nat_query_gid_entry },
		{ UVERBS_OBJECT_DEVICE, UVERBS_METHOD_QUERY_GID_TABLE, nat_query_gid_table },
		{ UVERBS_OBJECT_ASYNC_EVENT, UVERBS_METHOD_ASYNC_EVENT_ALLOC, nat_async_alloc },
		{ UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY, nat_pd_destroy },
		{ UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY, nat_mr_destroy },
		{ UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_CREATE, nat_cq_create },
		{ UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY, nat_cq_destroy },
		{ UVERBS_OBJECT_QP, UVERBS_METHOD_QP_CREATE, nat_qp_create },
		{ UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY, nat_qp_destroy },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (t[i].object == object && t[i].method == method) return t[i].fn;
	return NULL;
}

/* The method of this ioctl that the run serves, or NULL (EPROTONOSUPPORT). */
static int (*ioctl_handler(const struct ib_uverbs_ioctl_hdr *h))(struct uvemu_context *, struct ib_uverbs_ioctl_hdr *)
{
	if (h->object_id == UVERBS_OBJECT_MR && h->method_id == UVERBS_METHOD_REG_DMABUF_MR) return reg_dmabuf_mr;
	if (!abi_ioctl()) return NULL;
	if (h->object_id == UVERBS_OBJECT_DEVICE && h->method_id == UVERBS_METHOD_INVOKE_WRITE) return invoke_write;
	if (h->object_id == MLX5_IB_OBJECT_UAR && h->method_id == MLX5_IB_METHOD_UAR_OBJ_ALLOC) return uar_alloc;
	if (h->object_id == MLX5_IB_OBJECT_UAR && h->method_id == MLX5_IB_METHOD_UAR_OBJ_DESTROY) return uar_destroy;
	return native_handler(h->object_id, h->method_id);
}

/* One RDMA_VERBS_IOCTL: its header and attributes copied in (with the kernel's length check),
 * the method run, the attributes copied back (outputs, flags). Methods other than
 * REG_DMABUF_MR answer EPROTONOSUPPORT, as a kernel whose uverbs tree lacks the object or
 * method: libibverbs falls back to write() for that method, or skips what it cannot do. */
static int ioctl_method(struct uvemu_context *c, void *arg)
{
	union {
		struct ib_uverbs_ioctl_hdr h;
		char bytes[sizeof(struct ib_uverbs_ioctl_hdr) + MAX_IOCTL_ATTRS * sizeof(struct ib_uverbs_attr)];
	} local;
	struct ib_uverbs_ioctl_hdr *h = &local.h, *user = arg;
	if (user_copy(h, user, sizeof(*h))) return EFAULT;
	int (*method)(struct uvemu_context *, struct ib_uverbs_ioctl_hdr *) = ioctl_handler(h);
	if (!method) {
		L("ioctl object %#x method %#x -> EPROTONOSUPPORT", h->object_id, h->method_id);
		return EPROTONOSUPPORT;
	}
	size_t attrs = h->num_attrs * sizeof(h->attrs[0]);
	if (h->num_attrs > MAX_IOCTL_ATTRS || h->length != sizeof(*h) + attrs) return EINVAL;
	if (h->reserved1 || h->reserved2) return EPROTONOSUPPORT;
	if (user_copy(h->attrs, user->attrs, attrs)) return EFAULT;
	if (method != invoke_write && method != nat_get_context && c->async_rd < 0) return EINVAL; /* no context yet */
	int rc = method(c, h);
	if (rc) L("ioctl object %#x method %#x -> %s", h->object_id, h->method_id, strerror(rc));
	return rc ? rc : user_copy(user->attrs, h->attrs, attrs);
}

int ioctl(int fd, unsigned long req, ...)
{
	ensure_init();
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!is_cmd_fd(fd)) return r_ioctl(fd, req, arg);
	pthread_mutex_lock(&lock);
	struct uvemu_context *c = context_of(fd);
	if (!c) { pthread_mutex_unlock(&lock); return r_ioctl(fd, req, arg); }
	int rc = req == RDMA_VERBS_IOCTL ? ioctl_method(c, arg) : ENOTTY;
	pthread_mutex_unlock(&lock);
	if (rc) { errno = rc; return -1; }
	return 0;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	ensure_init();
	uint64_t at = (uint64_t)(uintptr_t)addr;
	if ((flags & MAP_FIXED) && __atomic_load_n(&npins, __ATOMIC_ACQUIRE) && fits(at, len)) {
		pthread_mutex_lock(&pin_lock);
		int hit = pinned(PAGE_DOWN(at), PAGE_UP(at + len), 0);
		pthread_mutex_unlock(&pin_lock);
		if (hit) {
			L("mmap(%p, %zu, MAP_FIXED): over pages pinned by a registered region or ring -> ENOMEM", addr, len);
			errno = ENOMEM;
			return MAP_FAILED;
		}
	}
	if (!is_cmd_fd(fd)) return r_mmap(addr, len, prot, flags, fd, off);
	pthread_mutex_lock(&lock);
	struct uvemu_context *c = context_of(fd);
	if (!c) { pthread_mutex_unlock(&lock); return r_mmap(addr, len, prot, flags, fd, off); }
	unsigned long pgoff = (unsigned long)off / 4096;
	/* mlx5 encodes the command in bits 8..15 of the page offset (MLX5_IB_MMAP_CMD_SHIFT) */
	unsigned long cmd = (pgoff >> 8) & 0xff, index = (pgoff & 0xff) | ((pgoff >> 16) << 8);
	void *p = MAP_FAILED;
	int err = EINVAL;
	/* A dynamic UAR's page, mapped once (a second mapping would be a page the HCA does not
	 * watch: refused). */
	struct uvemu_obj *dyn = cmd == MMAP_OFFSET_START ? obj_get(c, (uint32_t)index, UVEMU_UAR) : NULL;
	if (cmd == MLX5_IB_MMAP_REGULAR_PAGE && len == 4096 && index < UVEMU_MAX_UAR_PAGES &&
	    index * BFREGS_PER_PAGE < c->tot_bfregs && !c->uar[index]) {
		p = r_mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED) c->uar[index] = p;
		err = errno;
	} else if (dyn && len == 4096 && !dyn->u.uar.page) {
		p = r_mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED) dyn->u.uar.page = (uint64_t)(uintptr_t)p;
		err = errno;
	}
	L("mmap(fd %d, cmd %lu, index %lu) -> %p", fd, cmd, index, p);
	pthread_mutex_unlock(&lock);
	if (p == MAP_FAILED) errno = err;
	return p;
}
void *mmap64(void *, size_t, int, int, int, off_t) __attribute__((alias("mmap")));
