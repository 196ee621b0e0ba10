/* Queue pairs, shared receive queues and address handles. Posting writes
 * work requests into rings the appliance drains, and rings its doorbell
 * only when it sleeps: no system call while it polls. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "taproce.h"

#define tp_qp_of(q) tp_container_of(q, struct tp_qp, qpx.qp_base)

static int attach_rings(struct tp_qp *q, uint8_t *mem, uint64_t size, uint64_t sq_off, uint64_t rq_off)
{
	if (sq_off < TAPROCE_STATE_BYTES || rq_off <= sq_off || rq_off >= size)
		return -1;
	if (tp_ring_attach(&q->sq, mem + sq_off, rq_off - sq_off) < 0 || q->sq.slot_size != TAPROCE_SEND_SLOT)
		return -1;
	if (tp_ring_attach(&q->rq, mem + rq_off, size - rq_off) < 0 || q->rq.slot_size != TAPROCE_RECV_SLOT)
		return -1;
	return 0;
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct tp_context *c = tp_ctx(pd->context);
	struct tp_pd *p = tp_container_of(pd, struct tp_pd, pd);
	if (a->send_cq == NULL || a->recv_cq == NULL ||
	    (a->qp_type != IBV_QPT_RC && a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_UD)) {
		errno = a->qp_type == IBV_QPT_RC || a->qp_type == IBV_QPT_UC || a->qp_type == IBV_QPT_UD ? EINVAL : EOPNOTSUPP;
		return NULL;
	}
	struct tp_cq *scq = tp_container_of(a->send_cq, struct tp_cq, cq);
	struct tp_cq *rcq = tp_container_of(a->recv_cq, struct tp_cq, cq);
	struct tp_srq *srq = a->srq ? tp_container_of(a->srq, struct tp_srq, srq) : NULL;
	struct taproce_create_qp_request req = {
		.pd = p->h, .send_cq = scq->h, .recv_cq = rcq->h, .srq = srq ? srq->h : 0, .type = (uint8_t)a->qp_type,
		.sig_all = a->sq_sig_all ? 1 : 0,
		.caps = {.max_send_wr = a->cap.max_send_wr, .max_recv_wr = a->cap.max_recv_wr, .max_send_sge = a->cap.max_send_sge,
			 .max_recv_sge = a->cap.max_recv_sge, .max_inline = a->cap.max_inline_data}};
	struct taproce_create_qp_reply rep;
	int fd, nfds = 1;
	if (tp_call(c, TAPROCE_OP_CREATE_QP, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, &fd, &nfds) < 0)
		return NULL;
	if (tp_errno(rep.errnum)) {
		for (int i = 0; i < nfds; i++)
			close(fd);
		return NULL;
	}
	struct tp_qp *q = NULL;
	uint8_t *mem = nfds == 1 ? tp_map_region(fd, rep.size) : NULL;
	if (mem == NULL)
		goto fail;
	q = calloc(1, sizeof(*q));
	if (q == NULL || attach_rings(q, mem, rep.size, rep.sq_off, rep.rq_off) < 0)
		goto fail;
	q->region = mem;
	q->size = rep.size;
	q->state = mem;
	q->h = rep.handle;
	q->max_send_wr = rep.caps.max_send_wr;
	q->max_recv_wr = rep.caps.max_recv_wr;
	q->max_send_sge = rep.caps.max_send_sge;
	q->max_recv_sge = rep.caps.max_recv_sge;
	q->max_inline = rep.caps.max_inline;
	q->has_srq = srq != NULL;
	pthread_spin_init(&q->slock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&q->rlock, PTHREAD_PROCESS_PRIVATE);
	struct ibv_qp *qp = &q->qpx.qp_base;
	qp->context = pd->context;
	qp->qp_context = a->qp_context;
	qp->pd = pd;
	qp->send_cq = a->send_cq;
	qp->recv_cq = a->recv_cq;
	qp->srq = a->srq;
	qp->handle = rep.handle;
	qp->qp_num = rep.qpn;
	qp->state = IBV_QPS_RESET;
	qp->qp_type = a->qp_type;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	/* What the QP got, as rdma-core reports it back in the init attr. */
	a->cap.max_send_wr = rep.caps.max_send_wr;
	a->cap.max_recv_wr = rep.caps.max_recv_wr;
	a->cap.max_send_sge = rep.caps.max_send_sge;
	a->cap.max_recv_sge = rep.caps.max_recv_sge;
	a->cap.max_inline_data = rep.caps.max_inline;
	tp_handles_add(c, rep.handle, TP_QP, q);
	return qp;
fail:
	if (mem)
		munmap(mem, rep.size);
	free(q);
	tp_destroy_handle(c, TAPROCE_OP_DESTROY_QP, rep.handle);
	errno = EIO;
	return NULL;
}

TP_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	return create_qp(pd, qp_init_attr);
}
TP_DEFAULT_VERSION(ibv_create_qp, "IBVERBS_1.1");

struct ibv_qp *tp_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *a)
{
	(void)context;
	/* The work request API of ibv_qp_ex (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
	 * for what the QP's type can send; the rest (create flags, XRC, RSS,
	 * …) are a provider's options this one lacks. */
	uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || (a->comp_mask & ~known) ||
	    ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	int ex = (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
	if (ex && (a->send_ops_flags & ~tp_wr_ops(a->qp_type))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr ia = {.qp_context = a->qp_context, .send_cq = a->send_cq, .recv_cq = a->recv_cq,
				      .srq = a->srq, .cap = a->cap, .qp_type = a->qp_type, .sq_sig_all = a->sq_sig_all};
	struct ibv_qp *qp = create_qp(a->pd, &ia);
	if (qp == NULL)
		return NULL;
	a->cap = ia.cap;
	if (ex)
		tp_wr_init(tp_qp_of(qp));
	return qp;
}

TP_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct tp_qp *q = tp_qp_of(qp);
	return q->ex ? &q->qpx : NULL; /* NULL: not made with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS */
}

TP_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct tp_qp *q = tp_qp_of(qp);
	struct taproce_modify_qp_request req = {.handle = q->h, .mask = (uint32_t)attr_mask};
	struct taproce_qp_attr *a = &req.attr;
	a->state = (uint8_t)attr->qp_state;
	a->cur_state = (uint8_t)attr->cur_qp_state;
	a->path_mtu = (uint8_t)attr->path_mtu;
	a->timeout = attr->timeout;
	a->retry_cnt = attr->retry_cnt;
	a->rnr_retry = attr->rnr_retry;
	a->min_rnr_timer = attr->min_rnr_timer;
	a->max_rd_atomic = attr->max_rd_atomic;
	a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	a->port = attr_mask & IBV_QP_AV ? attr->ah_attr.port_num : attr->port_num;
	if (attr_mask & IBV_QP_PORT)
		a->port = attr->port_num;
	a->sgid_index = attr->ah_attr.grh.sgid_index;
	a->hop_limit = attr->ah_attr.grh.hop_limit;
	a->tclass = attr->ah_attr.grh.traffic_class;
	a->pkey_index = attr->pkey_index;
	a->access = attr->qp_access_flags;
	a->qkey = attr->qkey;
	a->dest_qpn = attr->dest_qp_num;
	a->rqpsn = attr->rq_psn;
	a->sqpsn = attr->sq_psn;
	a->flow_label = attr->ah_attr.grh.flow_label;
	memcpy(a->dgid, attr->ah_attr.grh.dgid.raw, 16);
	if ((attr_mask & IBV_QP_AV) && !attr->ah_attr.is_global) {
		/* RoCE needs the GRH: an address vector without one cannot be
		 * routed, as the kernel refuses it. */
		errno = EINVAL;
		return EINVAL;
	}
	struct taproce_errno_reply rep;
	if (tp_call(tp_ctx(qp->context), TAPROCE_OP_MODIFY_QP, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		return errno;
	if (rep.errnum)
		return tp_errno(rep.errnum);
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}
TP_DEFAULT_VERSION(ibv_modify_qp, "IBVERBS_1.1");

TP_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	(void)attr_mask;
	struct tp_qp *q = tp_qp_of(qp);
	struct taproce_handle_request req = {.handle = q->h};
	struct taproce_query_qp_reply rep;
	if (tp_call(tp_ctx(qp->context), TAPROCE_OP_QUERY_QP, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		return errno;
	if (rep.errnum)
		return tp_errno(rep.errnum);
	const struct taproce_qp_attr *a = &rep.attr;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = (enum ibv_qp_state)a->state;
	attr->cur_qp_state = (enum ibv_qp_state)a->state;
	attr->path_mtu = (enum ibv_mtu)a->path_mtu;
	attr->path_mig_state = IBV_MIG_MIGRATED;
	attr->qkey = a->qkey;
	attr->rq_psn = a->rqpsn;
	attr->sq_psn = a->sqpsn;
	attr->dest_qp_num = a->dest_qpn;
	attr->qp_access_flags = a->access;
	attr->cap.max_send_wr = rep.caps.max_send_wr;
	attr->cap.max_recv_wr = rep.caps.max_recv_wr;
	attr->cap.max_send_sge = rep.caps.max_send_sge;
	attr->cap.max_recv_sge = rep.caps.max_recv_sge;
	attr->cap.max_inline_data = rep.caps.max_inline;
	memcpy(attr->ah_attr.grh.dgid.raw, a->dgid, 16);
	attr->ah_attr.grh.flow_label = a->flow_label;
	attr->ah_attr.grh.sgid_index = a->sgid_index;
	attr->ah_attr.grh.hop_limit = a->hop_limit;
	attr->ah_attr.grh.traffic_class = a->tclass;
	attr->ah_attr.is_global = 1;
	attr->ah_attr.port_num = a->port;
	attr->pkey_index = a->pkey_index;
	attr->max_rd_atomic = a->max_rd_atomic;
	attr->max_dest_rd_atomic = a->max_dest_rd_atomic;
	attr->min_rnr_timer = a->min_rnr_timer;
	attr->port_num = a->port;
	attr->timeout = a->timeout;
	attr->retry_cnt = a->retry_cnt;
	attr->rnr_retry = a->rnr_retry;
	qp->state = attr->qp_state;
	if (init_attr) {
		memset(init_attr, 0, sizeof(*init_attr));
		init_attr->qp_context = qp->qp_context;
		init_attr->send_cq = qp->send_cq;
		init_attr->recv_cq = qp->recv_cq;
		init_attr->srq = qp->srq;
		init_attr->cap = attr->cap;
		init_attr->qp_type = qp->qp_type;
	}
	return 0;
}
TP_DEFAULT_VERSION(ibv_query_qp, "IBVERBS_1.1");

TP_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct tp_qp *q = tp_qp_of(qp);
	struct tp_context *c = tp_ctx(qp->context);
	int e = tp_destroy_handle(c, TAPROCE_OP_DESTROY_QP, q->h);
	if (e)
		return e;
	tp_handles_del(c, q->h);
	pthread_spin_lock(&q->slock);
	pthread_spin_lock(&q->rlock);
	munmap(q->region, q->size);
	q->region = q->state = NULL;
	q->destroyed = 1;
	pthread_spin_unlock(&q->rlock);
	pthread_spin_unlock(&q->slock);
	pthread_mutex_lock(&c->mu);
	struct tp_qp *old = c->graves[c->ngraves % 64];
	c->graves[c->ngraves++ % 64] = q;
	pthread_mutex_unlock(&c->mu);
	tp_qp_free(old);
	return 0;
}

/* flush_ring completes the work in [from, to) of ring r flushed, up to
 * n of it, into wc; it returns how many. */
static int flush_ring(struct tp_ring *r, uint64_t *from, uint64_t to, uint32_t qpn, enum ibv_wc_opcode op,
		      struct ibv_wc *wc, int n)
{
	int k = 0;
	for (; *from < to && k < n; ++*from, k++) {
		wc[k] = (struct ibv_wc){.wr_id = tp_get64(tp_ring_slot(r, *from)), .status = IBV_WC_WR_FLUSH_ERR,
					.opcode = op, .qp_num = qpn};
	}
	return k;
}

int tp_flush_cq(struct tp_context *c, struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int k = 0;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nhandles && k < n; i++) {
		if (c->handles[i].kind != TP_QP)
			continue;
		struct tp_qp *q = c->handles[i].obj;
		struct ibv_qp *qp = &q->qpx.qp_base;
		if (qp->send_cq == cq) {
			pthread_spin_lock(&q->slock);
			uint64_t retired = tp_load64((uint64_t *)(q->state + TAPROCE_QP_SEND_RETIRED));
			if (q->sflushed < retired)
				q->sflushed = retired;
			k += flush_ring(&q->sq, &q->sflushed, q->sent, qp->qp_num, IBV_WC_SEND, wc + k, n - k);
			pthread_spin_unlock(&q->slock);
		}
		if (qp->recv_cq == cq && !q->has_srq && k < n) {
			pthread_spin_lock(&q->rlock);
			uint64_t retired = tp_load64((uint64_t *)(q->state + TAPROCE_QP_RECV_RETIRED));
			if (q->rflushed < retired)
				q->rflushed = retired;
			k += flush_ring(&q->rq, &q->rflushed, q->recvd, qp->qp_num, IBV_WC_RECV, wc + k, n - k);
			pthread_spin_unlock(&q->rlock);
		}
	}
	pthread_mutex_unlock(&c->mu);
	return k;
}

void tp_qp_free(struct tp_qp *q)
{
	if (q == NULL)
		return;
	pthread_spin_destroy(&q->slock);
	pthread_spin_destroy(&q->rlock);
	pthread_mutex_destroy(&q->qpx.qp_base.mutex);
	pthread_cond_destroy(&q->qpx.qp_base.cond);
	free(q);
}
TP_DEFAULT_VERSION(ibv_destroy_qp, "IBVERBS_1.1");

uint32_t tp_qp_state(const struct tp_qp *q)
{
	return tp_load32((uint32_t *)(q->state + TAPROCE_QP_STATE_WORD));
}

int tp_check_send(const struct tp_qp *q, const struct ibv_send_wr *wr)
{
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_send_sge || wr->num_sge > TAPROCE_MAX_SGE)
		return EINVAL;
	switch (q->qpx.qp_base.qp_type) {
	case IBV_QPT_UD:
		if ((wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) || wr->wr.ud.ah == NULL)
			return EINVAL;
		break;
	case IBV_QPT_UC:
		if (wr->opcode > IBV_WR_SEND_WITH_IMM)
			return EINVAL;
		break;
	case IBV_QPT_RC:
		if (wr->opcode > IBV_WR_ATOMIC_FETCH_AND_ADD && wr->opcode != IBV_WR_SEND_WITH_INV)
			return EINVAL;
		if ((wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) &&
		    (wr->num_sge != 1 || wr->sg_list[0].length != 8))
			return EINVAL;
		break;
	default:
		return EINVAL;
	}
	return 0;
}

/* put_send writes wr into a send slot; the inline data, when asked for,
 * is gathered from the SGEs now, as libibverbs lets the caller reuse
 * them once ibv_post_send returns. */
int tp_put_send(const struct tp_qp *q, uint8_t *s, const struct ibv_send_wr *wr)
{
	memset(s, 0, TAPROCE_SWQE_SGL);
	tp_put64(s + TAPROCE_SWQE_WR_ID, wr->wr_id);
	s[TAPROCE_SWQE_OPCODE] = (uint8_t)wr->opcode;
	tp_put32(s + TAPROCE_SWQE_FLAGS, wr->send_flags);
	/* imm_data is in network order, as it goes on the wire; the ring
	 * carries the number the appliance writes big-endian (ImmDt), as
	 * invalidate_rkey is a number already. */
	uint32_t imm = wr->opcode == IBV_WR_SEND_WITH_INV ? wr->invalidate_rkey : be32toh(wr->imm_data);
	tp_put32(s + TAPROCE_SWQE_IMM, imm);
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		tp_put64(s + TAPROCE_SWQE_REMOTE_ADDR, wr->wr.rdma.remote_addr);
		tp_put32(s + TAPROCE_SWQE_RKEY, wr->wr.rdma.rkey);
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		tp_put64(s + TAPROCE_SWQE_REMOTE_ADDR, wr->wr.atomic.remote_addr);
		tp_put32(s + TAPROCE_SWQE_RKEY, wr->wr.atomic.rkey);
		tp_put64(s + TAPROCE_SWQE_COMPARE_ADD, wr->wr.atomic.compare_add);
		tp_put64(s + TAPROCE_SWQE_SWAP, wr->wr.atomic.swap);
		break;
	default:
		break;
	}
	if (q->qpx.qp_base.qp_type == IBV_QPT_UD) {
		struct tp_ah *ah = tp_container_of(wr->wr.ud.ah, struct tp_ah, ah);
		tp_put32(s + TAPROCE_SWQE_AH, ah->h);
		tp_put32(s + TAPROCE_SWQE_REMOTE_QPN, wr->wr.ud.remote_qpn);
		tp_put32(s + TAPROCE_SWQE_REMOTE_QKEY, wr->wr.ud.remote_qkey);
	}
	if (wr->send_flags & IBV_SEND_INLINE) {
		uint32_t total = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			uint32_t n = wr->sg_list[i].length;
			if (total + n > q->max_inline || total + n > TAPROCE_MAX_INLINE)
				return EINVAL;
			memcpy(s + TAPROCE_SWQE_INLINE + total, (const void *)(uintptr_t)wr->sg_list[i].addr, n);
			total += n;
		}
		tp_put32(s + TAPROCE_SWQE_INLINE_LEN, total);
		s[TAPROCE_SWQE_NUM_SGE] = 0;
		return 0;
	}
	s[TAPROCE_SWQE_NUM_SGE] = (uint8_t)wr->num_sge;
	for (int i = 0; i < wr->num_sge; i++) {
		uint8_t *g = s + TAPROCE_SWQE_SGL + i * TAPROCE_SGE_SIZE;
		tp_put64(g + TAPROCE_SGE_ADDR, wr->sg_list[i].addr);
		tp_put32(g + TAPROCE_SGE_LENGTH, wr->sg_list[i].length);
		tp_put32(g + TAPROCE_SGE_LKEY, wr->sg_list[i].lkey);
	}
	return 0;
}

int tp_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct tp_qp *q = tp_qp_of(qp);
	struct tp_context *c = tp_ctx(qp->context);
	int err = 0;
	uint64_t n = 0;
	pthread_spin_lock(&q->slock);
	if (q->destroyed) {
		pthread_spin_unlock(&q->slock);
		*bad_wr = wr;
		errno = EINVAL;
		return EINVAL;
	}
	uint32_t st = tp_qp_state(q);
	if (atomic_load(&c->dead))
		err = EIO;
	else if (st < IBV_QPS_RTS)
		err = EINVAL; /* as rxe: from RTS on, and in ERR the work is flushed */
	uint64_t retired = tp_load64((uint64_t *)(q->state + TAPROCE_QP_SEND_RETIRED));
	for (; wr && !err; wr = wr->next) {
		if ((err = tp_check_send(q, wr)) != 0)
			break;
		if (q->sent + n - retired >= q->max_send_wr) {
			err = ENOMEM;
			break;
		}
		uint8_t *slot = tp_ring_reserve_taken(&q->sq, n);
		if (slot == NULL) {
			err = ENOMEM;
			break;
		}
		if ((err = tp_put_send(q, slot, wr)) != 0)
			break;
		n++;
	}
	q->sent += n;
	int wake = tp_ring_commit(&q->sq, n);
	pthread_spin_unlock(&q->slock);
	if (wake)
		tp_kick(c);
	if (err) {
		*bad_wr = wr;
		errno = err;
	}
	return err;
}

static int post_recv_ring(struct tp_ring *ring, uint64_t *posted, uint64_t retired, uint32_t depth, uint32_t max_sge,
			  struct ibv_recv_wr **wrp, uint64_t *np)
{
	uint64_t n = 0;
	int err = 0;
	struct ibv_recv_wr *wr = *wrp;
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge || wr->num_sge > TAPROCE_MAX_SGE) {
			err = EINVAL;
			break;
		}
		if (*posted + n - retired >= depth) {
			err = ENOMEM;
			break;
		}
		uint8_t *s = tp_ring_reserve_taken(ring, n);
		if (s == NULL) {
			err = ENOMEM;
			break;
		}
		tp_put64(s + TAPROCE_RWQE_WR_ID, wr->wr_id);
		tp_put32(s + TAPROCE_RWQE_NUM_SGE, (uint32_t)wr->num_sge);
		tp_put32(s + TAPROCE_RWQE_NUM_SGE + 4, 0);
		for (int i = 0; i < wr->num_sge; i++) {
			uint8_t *g = s + TAPROCE_RWQE_SGL + i * TAPROCE_SGE_SIZE;
			tp_put64(g + TAPROCE_SGE_ADDR, wr->sg_list[i].addr);
			tp_put32(g + TAPROCE_SGE_LENGTH, wr->sg_list[i].length);
			tp_put32(g + TAPROCE_SGE_LKEY, wr->sg_list[i].lkey);
		}
		n++;
	}
	*posted += n;
	*wrp = wr;
	*np = n;
	return err;
}

int tp_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct tp_qp *q = tp_qp_of(qp);
	struct tp_context *c = tp_ctx(qp->context);
	int err = 0;
	uint64_t n = 0;
	pthread_spin_lock(&q->rlock);
	if (q->destroyed)
		err = EINVAL;
	else if (atomic_load(&c->dead))
		err = EIO;
	else if (q->has_srq || tp_qp_state(q) == IBV_QPS_RESET)
		err = EINVAL;
	else {
		uint64_t retired = tp_load64((uint64_t *)(q->state + TAPROCE_QP_RECV_RETIRED));
		err = post_recv_ring(&q->rq, &q->recvd, retired, q->max_recv_wr, q->max_recv_sge, &wr, &n);
	}
	int wake = tp_ring_commit(&q->rq, n);
	pthread_spin_unlock(&q->rlock);
	if (wake)
		tp_kick(c);
	if (err) {
		*bad_wr = wr;
		errno = err;
	}
	return err;
}

/* Shared receive queues. */

TP_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *a)
{
	struct tp_context *c = tp_ctx(pd->context);
	struct tp_pd *p = tp_container_of(pd, struct tp_pd, pd);
	if (a->attr.max_wr == 0 || a->attr.max_sge > TAPROCE_MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	struct taproce_create_srq_request req = {.pd = p->h, .max_wr = a->attr.max_wr, .max_sge = TAPROCE_MAX_SGE,
						 .limit = a->attr.srq_limit};
	struct taproce_create_srq_reply rep;
	int fd, nfds = 1;
	if (tp_call(c, TAPROCE_OP_CREATE_SRQ, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, &fd, &nfds) < 0)
		return NULL;
	if (tp_errno(rep.errnum)) {
		for (int i = 0; i < nfds; i++)
			close(fd);
		return NULL;
	}
	struct tp_srq *s = NULL;
	uint8_t *mem = nfds == 1 ? tp_map_region(fd, rep.size) : NULL;
	if (mem == NULL)
		goto fail;
	s = calloc(1, sizeof(*s));
	if (s == NULL || rep.rq_off < TAPROCE_STATE_BYTES || rep.rq_off >= rep.size ||
	    tp_ring_attach(&s->rq, mem + rep.rq_off, rep.size - rep.rq_off) < 0 || s->rq.slot_size != TAPROCE_RECV_SLOT)
		goto fail;
	s->region = mem;
	s->size = rep.size;
	s->state = mem;
	s->h = rep.handle;
	s->max_wr = rep.max_wr;
	s->max_sge = TAPROCE_MAX_SGE;
	s->limit = a->attr.srq_limit;
	pthread_spin_init(&s->lock, PTHREAD_PROCESS_PRIVATE);
	s->srq.context = pd->context;
	s->srq.srq_context = a->srq_context;
	s->srq.pd = pd;
	s->srq.handle = rep.handle;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	a->attr.max_wr = rep.max_wr;
	a->attr.max_sge = TAPROCE_MAX_SGE;
	tp_handles_add(c, rep.handle, TP_SRQ, s);
	return &s->srq;
fail:
	if (mem)
		munmap(mem, rep.size);
	free(s);
	tp_destroy_handle(c, TAPROCE_OP_DESTROY_SRQ, rep.handle);
	errno = EIO;
	return NULL;
}
TP_DEFAULT_VERSION(ibv_create_srq, "IBVERBS_1.1");

TP_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	struct tp_srq *s = tp_container_of(srq, struct tp_srq, srq);
	if (mask & IBV_SRQ_MAX_WR) {
		errno = EINVAL; /* a shared receive queue does not resize */
		return EINVAL;
	}
	if (!(mask & IBV_SRQ_LIMIT))
		return 0;
	struct taproce_modify_srq_request req = {.handle = s->h, .limit = attr->srq_limit};
	struct taproce_errno_reply rep;
	if (tp_call(tp_ctx(srq->context), TAPROCE_OP_MODIFY_SRQ, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		return errno;
	if (rep.errnum)
		return tp_errno(rep.errnum);
	s->limit = attr->srq_limit;
	return 0;
}
TP_DEFAULT_VERSION(ibv_modify_srq, "IBVERBS_1.1");

TP_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct tp_srq *s = tp_container_of(srq, struct tp_srq, srq);
	attr->max_wr = s->max_wr;
	attr->max_sge = s->max_sge;
	attr->srq_limit = s->limit;
	return 0;
}
TP_DEFAULT_VERSION(ibv_query_srq, "IBVERBS_1.1");

TP_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct tp_srq *s = tp_container_of(srq, struct tp_srq, srq);
	struct tp_context *c = tp_ctx(srq->context);
	int e = tp_destroy_handle(c, TAPROCE_OP_DESTROY_SRQ, s->h);
	if (e)
		return e;
	tp_handles_del(c, s->h);
	pthread_spin_lock(&s->lock);
	munmap(s->region, s->size);
	pthread_spin_unlock(&s->lock);
	pthread_spin_destroy(&s->lock);
	pthread_mutex_destroy(&srq->mutex);
	pthread_cond_destroy(&srq->cond);
	free(s);
	return 0;
}
TP_DEFAULT_VERSION(ibv_destroy_srq, "IBVERBS_1.1");

int tp_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct tp_srq *s = tp_container_of(srq, struct tp_srq, srq);
	struct tp_context *c = tp_ctx(srq->context);
	uint64_t n = 0;
	int err;
	pthread_spin_lock(&s->lock);
	if (atomic_load(&c->dead))
		err = EIO;
	else {
		uint64_t retired = tp_load64((uint64_t *)(s->state + TAPROCE_SRQ_RETIRED));
		err = post_recv_ring(&s->rq, &s->recvd, retired, s->max_wr, s->max_sge, &wr, &n);
	}
	int wake = tp_ring_commit(&s->rq, n);
	pthread_spin_unlock(&s->lock);
	if (wake)
		tp_kick(c);
	if (err) {
		*bad_wr = wr;
		errno = err;
	}
	return err;
}

/* Address handles. */

TP_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct tp_pd *p = tp_container_of(pd, struct tp_pd, pd);
	if (!attr->is_global) {
		errno = EINVAL; /* RoCE needs the GRH */
		return NULL;
	}
	struct taproce_create_ah_request req = {.pd = p->h, .sgid_index = attr->grh.sgid_index, .hop_limit = attr->grh.hop_limit,
						.tclass = attr->grh.traffic_class, .port = attr->port_num,
						.flow_label = attr->grh.flow_label};
	memcpy(req.dgid, attr->grh.dgid.raw, 16);
	struct taproce_handle_reply rep;
	if (tp_call(tp_ctx(pd->context), TAPROCE_OP_CREATE_AH, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		return NULL;
	if (tp_errno(rep.errnum))
		return NULL;
	struct tp_ah *ah = calloc(1, sizeof(*ah));
	if (ah == NULL) {
		tp_destroy_handle(tp_ctx(pd->context), TAPROCE_OP_DESTROY_AH, rep.handle);
		errno = ENOMEM;
		return NULL;
	}
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->ah.handle = rep.handle;
	ah->h = rep.handle;
	return &ah->ah;
}
TP_DEFAULT_VERSION(ibv_create_ah, "IBVERBS_1.1");

TP_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	struct tp_ah *a = tp_container_of(ah, struct tp_ah, ah);
	int e = tp_destroy_handle(tp_ctx(ah->context), TAPROCE_OP_DESTROY_AH, a->h);
	if (e)
		return e;
	free(a);
	return 0;
}
TP_DEFAULT_VERSION(ibv_destroy_ah, "IBVERBS_1.1");

TP_EXPORT int ibv_init_ah_from_wc(struct ibv_context *context, uint8_t port_num, struct ibv_wc *wc, struct ibv_grh *grh,
				  struct ibv_ah_attr *ah_attr)
{
	(void)context;
	memset(ah_attr, 0, sizeof(*ah_attr));
	if (!(wc->wc_flags & IBV_WC_GRH)) {
		errno = EINVAL;
		return -1;
	}
	/* The GRH area holds the sender's IP header: for RoCE v2 over IPv4 the
	 * 20-byte IPv4 header in its last bytes, else the IPv6 header. */
	const uint8_t *g = (const uint8_t *)grh;
	union ibv_gid sgid;
	if ((g[20] >> 4) == 4) {
		memset(sgid.raw, 0, 10);
		sgid.raw[10] = sgid.raw[11] = 0xff;
		memcpy(sgid.raw + 12, g + 20 + 12, 4);
	} else {
		memcpy(sgid.raw, grh->sgid.raw, 16);
	}
	ah_attr->grh.dgid = sgid;
	ah_attr->grh.sgid_index = 1;
	ah_attr->grh.hop_limit = 0xff;
	ah_attr->is_global = 1;
	ah_attr->port_num = port_num;
	/* Which of our GIDs it came to picks the source GID. */
	union ibv_gid ours;
	for (int i = 0; i < TAPROCE_MAX_GIDS; i++) {
		if (ibv_query_gid(context, port_num, i, &ours) < 0)
			break;
		const uint8_t *dst = (g[20] >> 4) == 4 ? g + 20 + 16 : grh->dgid.raw;
		size_t len = (g[20] >> 4) == 4 ? 4 : 16;
		if (memcmp((g[20] >> 4) == 4 ? ours.raw + 12 : ours.raw, dst, len) == 0) {
			ah_attr->grh.sgid_index = (uint8_t)i;
			break;
		}
	}
	return 0;
}

TP_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh, uint8_t port_num)
{
	struct ibv_ah_attr attr;
	if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) < 0)
		return NULL;
	return ibv_create_ah(pd, &attr);
}
