/* The work request API (ibv_wr_start … ibv_wr_complete) of a QP made with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS. A batch holds the send queue's lock
 * from ibv_wr_start to ibv_wr_complete or ibv_wr_abort; each ibv_wr_<op>
 * begins a request that the ibv_wr_set_* calls after it complete, and is
 * checked and written to its slot as ibv_post_send writes one when the
 * next begins or the batch completes. Nothing reaches the appliance
 * before ibv_wr_complete, which returns the batch's first error (and
 * posts none of it), as rdma-core's providers do. */
#include <errno.h>
#include <string.h>

#include "taproce.h"

static inline struct tp_qp *qx(struct ibv_qp_ex *x) { return tp_container_of(x, struct tp_qp, qpx); }

uint64_t tp_wr_ops(enum ibv_qp_type t)
{
	uint64_t uc = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
		      IBV_QP_EX_WITH_SEND_WITH_IMM;
	switch (t) {
	case IBV_QPT_RC:
		return uc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV;
	case IBV_QPT_UC:
		return uc;
	case IBV_QPT_UD:
		return IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	default:
		return 0;
	}
}

/* finish writes the request being built to its slot. */
static void finish(struct tp_qp *q)
{
	if (!q->xpending)
		return;
	q->xpending = 0;
	if (q->xerr)
		return;
	int err = tp_check_send(q, &q->xwr);
	uint64_t retired = tp_load64((uint64_t *)(q->state + TAPROCE_QP_SEND_RETIRED));
	uint8_t *slot = NULL;
	if (!err && q->sent + q->xn - retired >= q->max_send_wr)
		err = ENOMEM;
	if (!err && (slot = tp_ring_reserve_taken(&q->sq, q->xn)) == NULL)
		err = ENOMEM;
	if (!err)
		err = tp_put_send(q, slot, &q->xwr);
	if (err)
		q->xerr = err;
	else
		q->xn++;
}

static void begin(struct ibv_qp_ex *x, enum ibv_wr_opcode op)
{
	struct tp_qp *q = qx(x);
	finish(q);
	memset(&q->xwr, 0, sizeof(q->xwr));
	q->xwr.wr_id = x->wr_id;
	q->xwr.send_flags = x->wr_flags;
	q->xwr.opcode = op;
	q->xwr.sg_list = q->xsge;
	q->xpending = 1;
}

static void wr_start(struct ibv_qp_ex *x)
{
	struct tp_qp *q = qx(x);
	pthread_spin_lock(&q->slock);
	q->xn = 0;
	q->xpending = 0;
	q->xerr = 0;
	if (q->destroyed)
		q->xerr = EINVAL;
	else if (atomic_load(&tp_ctx(x->qp_base.context)->dead))
		q->xerr = EIO;
	else if (tp_qp_state(q) < IBV_QPS_RTS)
		q->xerr = EINVAL;
}

static int wr_complete(struct ibv_qp_ex *x)
{
	struct tp_qp *q = qx(x);
	finish(q);
	int err = q->xerr, wake = 0;
	if (!err) {
		q->sent += q->xn;
		wake = tp_ring_commit(&q->sq, q->xn);
	}
	pthread_spin_unlock(&q->slock);
	if (wake)
		tp_kick(tp_ctx(x->qp_base.context));
	return err;
}

static void wr_abort(struct ibv_qp_ex *x) { pthread_spin_unlock(&qx(x)->slock); }

static void wr_send(struct ibv_qp_ex *x) { begin(x, IBV_WR_SEND); }

static void wr_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	begin(x, IBV_WR_SEND_WITH_IMM);
	qx(x)->xwr.imm_data = imm;
}

static void wr_send_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	begin(x, IBV_WR_SEND_WITH_INV);
	qx(x)->xwr.invalidate_rkey = rkey;
}

static void rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr)
{
	begin(x, op);
	qx(x)->xwr.wr.rdma.rkey = rkey;
	qx(x)->xwr.wr.rdma.remote_addr = addr;
}

static void wr_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr) { rdma(x, IBV_WR_RDMA_WRITE, rkey, addr); }

static void wr_rdma_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, __be32 imm)
{
	rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr);
	qx(x)->xwr.imm_data = imm;
}

static void wr_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr) { rdma(x, IBV_WR_RDMA_READ, rkey, addr); }

static void atomic(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr, uint64_t cmp_add,
		   uint64_t swap)
{
	begin(x, op);
	struct tp_qp *q = qx(x);
	q->xwr.wr.atomic.rkey = rkey;
	q->xwr.wr.atomic.remote_addr = addr;
	q->xwr.wr.atomic.compare_add = cmp_add;
	q->xwr.wr.atomic.swap = swap;
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	atomic(x, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t add)
{
	atomic(x, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

/* The operations the QP was not made for: the batch fails. */
static void unsupported(struct ibv_qp_ex *x)
{
	struct tp_qp *q = qx(x);
	finish(q);
	if (!q->xerr)
		q->xerr = EOPNOTSUPP;
}
static void wr_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	(void)mw, (void)rkey, (void)info;
	unsupported(x);
}
static void wr_local_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	(void)rkey;
	unsupported(x);
}
static void wr_send_tso(struct ibv_qp_ex *x, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	(void)hdr, (void)hdr_sz, (void)mss;
	unsupported(x);
}
static void wr_set_xrc_srqn(struct ibv_qp_ex *x, uint32_t srqn)
{
	(void)srqn;
	unsupported(x);
}
static void wr_atomic_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, const void *data)
{
	(void)rkey, (void)addr, (void)data;
	unsupported(x);
}

/* set_failed: a setter with no request begun fails the batch. */
static int set_failed(struct tp_qp *q)
{
	if (q->xpending)
		return 0;
	if (!q->xerr)
		q->xerr = EINVAL;
	return 1;
}

static void wr_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct tp_qp *q = qx(x);
	if (set_failed(q))
		return;
	q->xwr.wr.ud.ah = ah;
	q->xwr.wr.ud.remote_qpn = qpn;
	q->xwr.wr.ud.remote_qkey = qkey;
}

static void wr_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct tp_qp *q = qx(x);
	if (set_failed(q))
		return;
	q->xsge[0] = (struct ibv_sge){.addr = addr, .length = length, .lkey = lkey};
	q->xwr.num_sge = 1;
}

static void wr_set_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *sg)
{
	struct tp_qp *q = qx(x);
	if (set_failed(q))
		return;
	if (n > TAPROCE_MAX_SGE) {
		q->xerr = EINVAL;
		return;
	}
	memcpy(q->xsge, sg, n * sizeof(*sg));
	q->xwr.num_sge = (int)n;
}

/* Inline data is copied now: the program may reuse its buffers as soon as
 * the call returns. */
static void wr_set_inline_data_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *bufs)
{
	struct tp_qp *q = qx(x);
	if (set_failed(q))
		return;
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		if (bufs[i].length > sizeof(q->xinline) - total) {
			q->xerr = EINVAL;
			return;
		}
		memcpy(q->xinline + total, bufs[i].addr, bufs[i].length);
		total += bufs[i].length;
	}
	q->xsge[0] = (struct ibv_sge){.addr = (uintptr_t)q->xinline, .length = (uint32_t)total};
	q->xwr.num_sge = 1;
	q->xwr.send_flags |= IBV_SEND_INLINE;
}

static void wr_set_inline_data(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf b = {.addr = addr, .length = length};
	wr_set_inline_data_list(x, 1, &b);
}

void tp_wr_init(struct tp_qp *q)
{
	struct ibv_qp_ex *x = &q->qpx;
	q->ex = 1;
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_send_inv = wr_send_inv;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = wr_atomic_fetch_add;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_local_inv = wr_local_inv;
	x->wr_send_tso = wr_send_tso;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
	x->wr_atomic_write = wr_atomic_write;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
}
