/* Completion channels and completion queues. A CQ is a ring the appliance
 * fills with completions; polling reads it without a system call. A
 * channel is an eventfd the appliance writes when a CQ armed with
 * ibv_req_notify_cq gets a completion; ibv_get_cq_event reads it. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "taproce.h"

TP_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct tp_context *c = tp_ctx(context);
	struct taproce_handle_reply rep;
	int fd, nfds = 1;
	if (tp_call(c, TAPROCE_OP_CREATE_CHANNEL, NULL, 0, &rep, sizeof(rep), NULL, 0, &fd, &nfds) < 0)
		return NULL;
	if (tp_errno(rep.errnum)) {
		for (int i = 0; i < nfds; i++)
			close(fd);
		return NULL;
	}
	if (nfds != 1) {
		errno = EIO;
		return NULL;
	}
	/* A channel's fd blocks, as rdma-core's: ibv_get_cq_event waits on it
	 * unless the program made it non-blocking. The appliance's eventfd
	 * comes non-blocking; its writes never wait either way. */
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && (fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	struct tp_comp_channel *ch = calloc(1, sizeof(*ch));
	if (ch == NULL) {
		close(fd);
		tp_destroy_handle(c, TAPROCE_OP_DESTROY_CHANNEL, rep.handle);
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.context = context;
	ch->ch.fd = fd;
	ch->h = rep.handle;
	pthread_mutex_init(&ch->mu, NULL);
	tp_handles_add(c, rep.handle, TP_CHANNEL, ch);
	return &ch->ch;
}

TP_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct tp_comp_channel *ch = tp_container_of(channel, struct tp_comp_channel, ch);
	pthread_mutex_lock(&ch->mu);
	size_t n = ch->ncqs;
	pthread_mutex_unlock(&ch->mu);
	if (n > 0) {
		errno = EBUSY;
		return EBUSY;
	}
	struct tp_context *c = tp_ctx(channel->context);
	int e = tp_destroy_handle(c, TAPROCE_OP_DESTROY_CHANNEL, ch->h);
	if (e)
		return e;
	tp_handles_del(c, ch->h); /* before the fd closes: tp_device_died writes it */
	close(channel->fd);
	pthread_mutex_destroy(&ch->mu);
	free(ch->cqs);
	free(ch);
	return 0;
}

static void channel_add(struct tp_comp_channel *ch, struct tp_cq *cq)
{
	pthread_mutex_lock(&ch->mu);
	if (ch->ncqs == ch->capcqs) {
		size_t cap = ch->capcqs ? 2 * ch->capcqs : 4;
		struct tp_cq **p = realloc(ch->cqs, cap * sizeof(*p));
		if (p != NULL) {
			ch->cqs = p;
			ch->capcqs = cap;
		}
	}
	if (ch->ncqs < ch->capcqs)
		ch->cqs[ch->ncqs++] = cq;
	pthread_mutex_unlock(&ch->mu);
}

static void channel_del(struct tp_comp_channel *ch, struct tp_cq *cq)
{
	pthread_mutex_lock(&ch->mu);
	for (size_t i = 0; i < ch->ncqs; i++) {
		if (ch->cqs[i] == cq) {
			ch->cqs[i] = ch->cqs[--ch->ncqs];
			break;
		}
	}
	pthread_mutex_unlock(&ch->mu);
}

static struct tp_cq *create_cq(struct ibv_context *context, int cqe, void *cq_context, struct ibv_comp_channel *channel,
			       int comp_vector)
{
	struct tp_context *c = tp_ctx(context);
	if (cqe <= 0 || comp_vector < 0 || comp_vector >= context->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct tp_comp_channel *ch = channel ? tp_container_of(channel, struct tp_comp_channel, ch) : NULL;
	struct taproce_create_cq_request req = {.depth = (uint32_t)cqe, .channel = ch ? ch->h : 0};
	struct taproce_create_cq_reply rep;
	int fd, nfds = 1;
	if (tp_call(c, TAPROCE_OP_CREATE_CQ, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, &fd, &nfds) < 0)
		return NULL;
	if (tp_errno(rep.errnum)) {
		for (int i = 0; i < nfds; i++)
			close(fd);
		return NULL;
	}
	struct tp_cq *q = NULL;
	uint8_t *mem = nfds == 1 ? tp_map_region(fd, rep.size) : NULL;
	if (mem == NULL)
		goto fail;
	q = calloc(1, sizeof(*q));
	if (q == NULL)
		goto fail;
	if (rep.size <= TAPROCE_STATE_BYTES || tp_ring_attach(&q->ring, mem + TAPROCE_STATE_BYTES, rep.size - TAPROCE_STATE_BYTES) < 0 ||
	    q->ring.slot_size != TAPROCE_CQE_SLOT)
		goto fail;
	q->region = mem;
	q->size = rep.size;
	q->state = mem;
	q->h = rep.handle;
	q->ch = ch;
	q->yield = !c->attr.polls;
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
	q->cq.context = context;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.handle = rep.handle;
	q->cq.cqe = (int)rep.depth;
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	pthread_mutex_init(&q->xlock, NULL);
	if (ch)
		channel_add(ch, q);
	tp_handles_add(c, rep.handle, TP_CQ, q);
	return q;
fail:
	if (mem)
		munmap(mem, rep.size);
	free(q);
	tp_destroy_handle(c, TAPROCE_OP_DESTROY_CQ, rep.handle);
	errno = EIO;
	return NULL;
}

TP_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	struct tp_cq *q = create_cq(context, cqe, cq_context, channel, comp_vector);
	return q ? &q->cq : NULL;
}
TP_DEFAULT_VERSION(ibv_create_cq, "IBVERBS_1.1");

/* The extended CQ: ibv_start_poll takes the first completion (and the
 * poll's lock), ibv_next_poll the next, ibv_end_poll ends the poll; the
 * read_ functions read the completion the poll is at. Polling is
 * tp_poll_cq's, one completion at a time, so that work flushed after the
 * appliance's death comes the same way. */

static inline struct tp_cq *tp_cqx(struct ibv_cq_ex *cq) { return tp_container_of(cq, struct tp_cq, cqx); }

static int cqx_next(struct ibv_cq_ex *cq)
{
	struct tp_cq *q = tp_cqx(cq);
	int n = tp_poll_cq(&q->cq, 1, &q->cur);
	if (n < 0)
		return EIO;
	if (n == 0)
		return ENOENT;
	cq->wr_id = q->cur.wr_id;
	cq->status = q->cur.status;
	return 0;
}

static int cqx_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	struct tp_cq *q = tp_cqx(cq);
	if (attr->comp_mask) {
		errno = EINVAL;
		return EINVAL;
	}
	if (!q->single)
		pthread_mutex_lock(&q->xlock);
	int e = cqx_next(cq);
	/* With nothing to poll the poll is over: no ibv_end_poll follows. */
	if (e != 0 && !q->single)
		pthread_mutex_unlock(&q->xlock);
	return e;
}

static void cqx_end_poll(struct ibv_cq_ex *cq)
{
	struct tp_cq *q = tp_cqx(cq);
	if (!q->single)
		pthread_mutex_unlock(&q->xlock);
}

static enum ibv_wc_opcode cqx_opcode(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.opcode; }
static uint32_t cqx_vendor_err(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.vendor_err; }
static uint32_t cqx_byte_len(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.byte_len; }
static __be32 cqx_imm_data(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.imm_data; }
static uint32_t cqx_qp_num(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.qp_num; }
static uint32_t cqx_src_qp(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.src_qp; }
static unsigned int cqx_wc_flags(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.wc_flags; }
static uint32_t cqx_slid(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.slid; }
static uint8_t cqx_sl(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.sl; }
static uint8_t cqx_dlid_path_bits(struct ibv_cq_ex *cq) { return tp_cqx(cq)->cur.dlid_path_bits; }

/* The completion fields an extended CQ can report: rxe's, without
 * timestamps. */
#define TP_CQX_WC_FLAGS                                                                                                \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |                 \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS)

struct ibv_cq_ex *tp_create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr)
{
	if (attr->wc_flags & ~(uint64_t)TP_CQX_WC_FLAGS) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if ((attr->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->cqe > INT32_MAX) {
		errno = EINVAL;
		return NULL;
	}
	struct tp_cq *q = create_cq(context, (int)attr->cqe, attr->cq_context, attr->channel, (int)attr->comp_vector);
	if (q == NULL)
		return NULL;
	struct ibv_cq_ex *x = &q->cqx;
	q->single = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
	x->start_poll = cqx_start_poll;
	x->next_poll = cqx_next;
	x->end_poll = cqx_end_poll;
	x->read_opcode = cqx_opcode;
	x->read_vendor_err = cqx_vendor_err;
	x->read_byte_len = cqx_byte_len;
	x->read_imm_data = cqx_imm_data;
	x->read_qp_num = cqx_qp_num;
	x->read_src_qp = cqx_src_qp;
	x->read_wc_flags = cqx_wc_flags;
	x->read_slid = cqx_slid;
	x->read_sl = cqx_sl;
	x->read_dlid_path_bits = cqx_dlid_path_bits;
	return x;
}

TP_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	/* The ring's size is the appliance's; a request it already holds
	 * succeeds, as a provider that rounds up does. */
	if (cqe > 0 && cqe <= cq->cqe)
		return 0;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}
TP_DEFAULT_VERSION(ibv_resize_cq, "IBVERBS_1.1");

TP_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct tp_cq *q = tp_container_of(cq, struct tp_cq, cq);
	struct tp_context *c = tp_ctx(cq->context);
	int e = tp_destroy_handle(c, TAPROCE_OP_DESTROY_CQ, q->h);
	if (e)
		return e; /* EBUSY while QPs use it */
	if (q->ch)
		channel_del(q->ch, q);
	tp_handles_del(c, q->h);
	pthread_spin_lock(&q->lock);
	q->destroyed = 1;
	pthread_spin_unlock(&q->lock);
	munmap(q->region, q->size);
	pthread_spin_destroy(&q->lock);
	pthread_mutex_destroy(&q->xlock);
	pthread_mutex_destroy(&cq->mutex);
	pthread_cond_destroy(&cq->cond);
	free(q);
	return 0;
}
TP_DEFAULT_VERSION(ibv_destroy_cq, "IBVERBS_1.1");

/* tp_yield_every is how many empty polls in a row go by between two
 * sched_yield calls while the appliance sleeps: internal/spin.Spinner's
 * number. */
enum { tp_yield_every = 8 };

/* While the appliance polls, completions that stream in (a bandwidth
 * test's) are found without a system call; a wait longer than
 * tp_starved_ns — an answer from the network, or the appliance off the
 * processor this program's polling keeps when busy pollers outnumber
 * processors — makes the program give its processor away (sched_yield)
 * every tp_yield_every empty polls from then on, as the Go library's
 * busy-polling clients always do. Never yielding, a latency test on two
 * processors waited time slices for each answer (4.35 ms); yielding after
 * 50 µs it waited 90 µs where taproce perf took 20 µs; after 5 µs, 21 µs
 * (docs/performance-log.md). The clock is read (vDSO, no system call)
 * every tp_clock_every empty polls. */
enum { tp_clock_every = 64 };
static const int64_t tp_starved_ns = 5000;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int tp_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct tp_cq *q = tp_container_of(cq, struct tp_cq, cq);
	if (n <= 0)
		return 0;
	pthread_spin_lock(&q->lock);
	uint64_t have = tp_ring_len(&q->ring);
	if (have > (uint64_t)n)
		have = (uint64_t)n;
	for (uint64_t i = 0; i < have; i++) {
		const uint8_t *s = tp_ring_peek_at(&q->ring, i);
		struct ibv_wc *w = &wc[i];
		w->wr_id = tp_get64(s + TAPROCE_CQE_WR_ID);
		w->status = (enum ibv_wc_status)s[TAPROCE_CQE_STATUS];
		w->opcode = (enum ibv_wc_opcode)s[TAPROCE_CQE_OPCODE];
		w->vendor_err = tp_get32(s + TAPROCE_CQE_VENDOR_ERR);
		w->byte_len = tp_get32(s + TAPROCE_CQE_BYTE_LEN);
		w->qp_num = tp_get32(s + TAPROCE_CQE_QP_NUM);
		w->src_qp = tp_get32(s + TAPROCE_CQE_SRC_QP);
		w->wc_flags = tp_get32(s + TAPROCE_CQE_WC_FLAGS);
		/* The ring carries the immediate as the number the wire holds
		 * big-endian; imm_data is in network order, invalidated_rkey
		 * (the same word) a number. */
		uint32_t word = tp_get32(s + TAPROCE_CQE_IMM);
		w->imm_data = (w->wc_flags & IBV_WC_WITH_IMM) ? htobe32(word) : word;
		w->pkey_index = tp_get16(s + TAPROCE_CQE_PKEY_INDEX);
		w->slid = tp_get16(s + TAPROCE_CQE_SLID);
		w->sl = s[TAPROCE_CQE_SL];
		w->dlid_path_bits = s[TAPROCE_CQE_DLID_PATH_BITS];
	}
	tp_ring_release(&q->ring, have);
	int yield = 0;
	if (have > 0) {
		q->empty = 0;
		q->starved = 0;
	} else {
		unsigned e = ++q->empty;
		if (q->yield || q->starved) {
			yield = e % tp_yield_every == 0;
		} else if (e % tp_clock_every == 0) {
			int64_t t = now_ns();
			if (e == tp_clock_every)
				q->empty_since = t;
			else if (t - q->empty_since > tp_starved_ns)
				q->starved = 1;
		}
	}
	pthread_spin_unlock(&q->lock);
	/* The appliance gone: its completions are all read; what it never
	 * finished completes flushed. */
	if (have == 0 && atomic_load(&tp_ctx(cq->context)->dead))
		return tp_flush_cq(tp_ctx(cq->context), cq, wc, n);
	/* As the Go library's busy-polling clients (internal/spin): a program
	 * that polls without end would keep a sleeping (or starved) appliance
	 * off the processors it needs to make the completion it waits for. */
	if (yield)
		sched_yield();
	return (int)have;
}

static void ring_channel(struct tp_comp_channel *ch)
{
	const uint64_t one = 1;
	ssize_t n;
	do
		n = write(ch->ch.fd, &one, sizeof(one));
	while (n < 0 && errno == EINTR);
}

int tp_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct tp_cq *q = tp_container_of(cq, struct tp_cq, cq);
	if (q->ch == NULL)
		return EINVAL;
	if (atomic_load(&tp_ctx(cq->context)->dead))
		return EIO;
	uint32_t *armed = (uint32_t *)(q->state + TAPROCE_CQ_ARMED);
	uint32_t *fired = (uint32_t *)(q->state + TAPROCE_CQ_FIRED);
	tp_store32(armed, solicited_only ? 2u : 1u);
	/* A completion that came before arming would signal nothing: look. */
	pthread_spin_lock(&q->lock);
	uint64_t have = tp_ring_len(&q->ring);
	pthread_spin_unlock(&q->lock);
	if (have > 0 && tp_xchg32(armed, 0) != 0) {
		tp_store32(fired, 1);
		ring_channel(q->ch);
	}
	return 0;
}

TP_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct tp_comp_channel *ch = tp_container_of(channel, struct tp_comp_channel, ch);
	for (;;) {
		pthread_mutex_lock(&ch->mu);
		for (size_t i = 0; i < ch->ncqs; i++) {
			struct tp_cq *q = ch->cqs[i];
			if (tp_xchg32((uint32_t *)(q->state + TAPROCE_CQ_FIRED), 0) != 0) {
				pthread_mutex_unlock(&ch->mu);
				*cq = &q->cq;
				*cq_context = q->cq.cq_context;
				return 0;
			}
		}
		/* The appliance gone: each CQ armed still gets its event, for
		 * the program to poll its flushed work; then EIO. */
		if (atomic_load(&tp_ctx(channel->context)->dead)) {
			for (size_t i = 0; i < ch->ncqs; i++) {
				struct tp_cq *q = ch->cqs[i];
				if (tp_xchg32((uint32_t *)(q->state + TAPROCE_CQ_ARMED), 0) != 0) {
					pthread_mutex_unlock(&ch->mu);
					*cq = &q->cq;
					*cq_context = q->cq.cq_context;
					return 0;
				}
			}
			pthread_mutex_unlock(&ch->mu);
			errno = EIO;
			return -1;
		}
		pthread_mutex_unlock(&ch->mu);
		uint64_t v;
		/* A signal that interrupts the read ends the call with EINTR, as
		 * rdma-core's read of the channel does: qperf's timer (SIGALRM)
		 * ends its wait for a completion that will not come. */
		ssize_t n = read(channel->fd, &v, sizeof(v));
		if (n != sizeof(v))
			return -1; /* EAGAIN on a non-blocking channel, EINTR, as rdma-core */
	}
}
TP_DEFAULT_VERSION(ibv_get_cq_event, "IBVERBS_1.1");

TP_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}
TP_DEFAULT_VERSION(ibv_ack_cq_events, "IBVERBS_1.1");
