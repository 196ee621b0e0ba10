/* taproce's libibverbs.so.1: rdma-core's ABI over the appliance's control
 * socket and shared rings (verbs/abi). Internal declarations. */
#ifndef TAPROCE_H
#define TAPROCE_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "abi.h"
#include "msg.h"
#include "ring.h"

#define TP_EXPORT __attribute__((visibility("default")))
#define TP_UNUSED __attribute__((unused))

/* TP_DEFAULT_VERSION binds a function libibverbs exports twice to its
 * default version, so that its old name's node (IBVERBS_1.0, compat.c)
 * does not claim it. */
#define TP_DEFAULT_VERSION(name, ver) __asm__(".symver " #name ", " #name "@@@" ver)

#define tp_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* rdma-core's driver.h, which libibverbs-dev does not install, numbers
 * the GID types of ibv_query_gid_type so. */
enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};

/* A device of the appliance, as ibv_get_device_list hands it out. Devices
 * live until the process ends, as rdma-core's do once listed. */
struct tp_device {
	struct ibv_device dev;
	uint64_t guid;
	int usable;
	struct tp_device *next;
};

/* Kinds of the objects an event may name. */
enum tp_kind { TP_QP = 1, TP_CQ, TP_SRQ, TP_CHANNEL };

struct tp_handle_entry {
	uint32_t h;
	enum tp_kind kind;
	void *obj;
};

/* An open device: the connection to the appliance (requests serialised by
 * mu, one reply each), the event socket that is async_fd, and the
 * appliance's doorbell (kick_fd). */
struct tp_context {
	pthread_mutex_t mu;
	int sock;
	uint32_t seq;
	int kick_fd;
	struct taproce_device_attr attr;
	struct taproce_port_attr port;
	/* handles names the objects events may refer to; under mu. */
	struct tp_handle_entry *handles;
	size_t nhandles, caphandles;
	/* dead is set once the appliance is gone: the event socket's end,
	 * which the watcher thread waits for (stop_fd ends it), or a request
	 * that found the connection's end. See verbs/abi's "When the
	 * appliance dies" for what the library makes of it. */
	atomic_int dead;
	pthread_t watcher;
	int stop_fd;
	int fatal_reported;
	/* graves holds the last destroyed QPs (tp_qp.destroyed); under mu. */
	struct tp_qp *graves[64];
	unsigned ngraves;
	struct verbs_context vctx; /* last: its ibv_context is the last field */
};

static inline struct tp_context *tp_ctx(struct ibv_context *c)
{
	return tp_container_of(c, struct tp_context, vctx.context);
}

struct tp_pd {
	struct ibv_pd pd;
	uint32_t h;
};

struct tp_mr {
	struct ibv_mr mr;
	uint32_t h;
	uintptr_t start, end; /* the pages the appliance maps */
	struct tp_mr *next;   /* in mr.c's list of live regions */
};

struct tp_comp_channel {
	struct ibv_comp_channel ch;
	uint32_t h;
	pthread_mutex_t mu;
	struct tp_cq **cqs;
	size_t ncqs, capcqs;
};

struct tp_cq {
	/* An ibv_cq_ex begins as an ibv_cq does (ibv_cq_ex_to_cq casts). */
	union {
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;
	};
	uint32_t h;
	uint8_t *region;
	size_t size;
	uint8_t *state;
	struct tp_ring ring;
	pthread_spinlock_t lock;
	struct tp_comp_channel *ch;
	int destroyed;
	/* empty counts the polls in a row that found nothing, since
	 * empty_since (ns; under lock); starved says they have lasted long
	 * enough for the program to give its processor away (cq.c). */
	unsigned empty;
	int64_t empty_since;
	int starved;
	/* yield says to give the processor away now and then while polling
	 * finds nothing: the appliance sleeps for want of work and needs a
	 * processor a busy-polling program would keep from it. */
	int yield;
	/* The extended CQ's polling (ibv_start_poll … ibv_end_poll): the
	 * completion it is at, and the lock a poll holds from its start to
	 * its end (not taken for IBV_CREATE_CQ_ATTR_SINGLE_THREADED). */
	struct ibv_wc cur;
	pthread_mutex_t xlock;
	int single;
};

struct tp_qp {
	struct ibv_qp_ex qpx; /* qpx.qp_base is the ibv_qp */
	uint32_t h;
	uint8_t *region;
	size_t size;
	uint8_t *state;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
	pthread_spinlock_t slock, rlock;
	struct tp_ring sq, rq;
	uint64_t sent, recvd;
	int has_srq;
	/* The work request API (ibv_wr_*, ex set): the requests of the
	 * batch ibv_wr_start began, the one being built (xpending), the first
	 * error, which ibv_wr_complete returns. Under slock, which the batch
	 * holds from ibv_wr_start to its end. */
	int ex, xpending, xerr;
	uint64_t xn;
	struct ibv_send_wr xwr;
	struct ibv_sge xsge[TAPROCE_MAX_SGE];
	uint8_t xinline[TAPROCE_MAX_INLINE];
	/* After the appliance's death, the work from sflushed (rflushed) on
	 * has not yet been completed with IBV_WC_WR_FLUSH_ERR. */
	uint64_t sflushed, rflushed;
	/* destroyed is set, under both locks, by ibv_destroy_qp, which keeps
	 * the structure a while (tp_context.graves) so that a program posting
	 * to the QP after destroying it gets EINVAL, not freed memory. */
	int destroyed;
};

struct tp_srq {
	struct ibv_srq srq;
	uint32_t h;
	uint8_t *region;
	size_t size;
	uint8_t *state;
	uint32_t max_wr, max_sge, limit;
	pthread_spinlock_t lock;
	struct tp_ring rq;
	uint64_t recvd;
};

struct tp_ah {
	struct ibv_ah ah;
	uint32_t h;
};


/* ctl.c: tp_call is tp_call_sock on the context's socket, serialised,
 * and EIO for good once the appliance is gone. */
int tp_call(struct tp_context *c, uint16_t op, const void *req, size_t req_len, void *rep, size_t rep_len,
	    const int *fds, int nfds, int *fds_out, int *nfds_out);

/* tp_errno turns a reply's errno field into the function's return: 0, or
 * the positive errno (also set in errno). */
int tp_errno(int32_t e);
/* tp_destroy_handle destroys an object; once the device is dead, it
 * succeeds. */
int tp_destroy_handle(struct tp_context *c, uint16_t op, uint32_t h);
void tp_kick(struct tp_context *c);
void tp_handles_add(struct tp_context *c, uint32_t h, enum tp_kind kind, void *obj);
void tp_handles_del(struct tp_context *c, uint32_t h);
void *tp_handles_find(struct tp_context *c, uint32_t h, enum tp_kind kind);
/* tp_device_died marks the context's device dead and wakes every
 * completion channel's waiter. */
void tp_device_died(struct tp_context *c);
/* tp_flush_cq, once the device is dead, completes up to n outstanding
 * work requests of the QPs whose send or receive CQ is cq with
 * IBV_WC_WR_FLUSH_ERR, and returns how many it wrote to wc. */
int tp_flush_cq(struct tp_context *c, struct ibv_cq *cq, struct ibv_wc *wc, int n);
/* qp.c: a send request checked against the QP and written to a slot;
 * the QP's state. */
int tp_check_send(const struct tp_qp *q, const struct ibv_send_wr *wr);
int tp_put_send(const struct tp_qp *q, uint8_t *s, const struct ibv_send_wr *wr);
uint32_t tp_qp_state(const struct tp_qp *q);
/* wr.c: the work request API. tp_wr_ops is the IBV_QP_EX_WITH_* a QP
 * type can send; tp_wr_init sets a QP's ibv_qp_ex up for them. */
uint64_t tp_wr_ops(enum ibv_qp_type t);
void tp_wr_init(struct tp_qp *q);
/* tp_qp_free frees a destroyed QP's structure (NULL: nothing). */
void tp_qp_free(struct tp_qp *q);
/* tp_map_region maps the one shared region a reply carries. */
uint8_t *tp_map_region(int fd, uint64_t size);

/* Operations of ibv_context_ops and verbs_context. */
int tp_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int tp_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int tp_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int tp_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int tp_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int tp_query_port_ex(struct ibv_context *c, uint8_t port, struct ibv_port_attr *attr, size_t len);
int tp_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in, struct ibv_device_attr_ex *attr,
		       size_t len);
struct ibv_qp *tp_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *attr);
struct ibv_cq_ex *tp_create_cq_ex(struct ibv_context *c, struct ibv_cq_init_attr_ex *attr);

#endif /* TAPROCE_H */
