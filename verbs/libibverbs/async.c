/* Asynchronous events: the appliance sends them on the context's event
 * socket, which is ibv_context.async_fd. The socket's end — the appliance
 * gone — is IBV_EVENT_DEVICE_FATAL, once. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "taproce.h"

static int qp_event(uint32_t t)
{
	return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR ||
	       t == IBV_EVENT_COMM_EST || t == IBV_EVENT_SQ_DRAINED || t == IBV_EVENT_PATH_MIG ||
	       t == IBV_EVENT_PATH_MIG_ERR || t == IBV_EVENT_QP_LAST_WQE_REACHED;
}

TP_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct tp_context *c = tp_ctx(context);
	for (;;) {
		uint8_t buf[TAPROCE_HEADER_LEN + sizeof(struct taproce_event) + 16];
		ssize_t n = recv(context->async_fd, buf, sizeof(buf), 0);
		if (n < 0)
			return -1; /* EAGAIN on a non-blocking fd, EINTR on a signal, as rdma-core */
		if (n == 0) {
			atomic_store(&c->dead, 1);
			if (c->fatal_reported) {
				errno = EIO;
				return -1;
			}
			c->fatal_reported = 1;
			memset(event, 0, sizeof(*event));
			event->event_type = IBV_EVENT_DEVICE_FATAL;
			return 0;
		}
		struct taproce_header h;
		struct taproce_event e;
		if ((size_t)n != sizeof(h) + sizeof(e))
			continue;
		memcpy(&h, buf, sizeof(h));
		memcpy(&e, buf + sizeof(h), sizeof(e));
		if (h.magic != TAPROCE_ABI_MAGIC || h.op != TAPROCE_OP_EVENT || !(h.flags & TAPROCE_FLAG_EVENT))
			continue;
		memset(event, 0, sizeof(*event));
		event->event_type = (enum ibv_event_type)e.type;
		if (qp_event(e.type)) {
			struct tp_qp *q = tp_handles_find(c, e.handle, TP_QP);
			if (q == NULL)
				continue; /* destroyed meanwhile */
			event->element.qp = &q->qpx.qp_base;
		} else if (e.type == IBV_EVENT_CQ_ERR) {
			struct tp_cq *q = tp_handles_find(c, e.handle, TP_CQ);
			if (q == NULL)
				continue;
			event->element.cq = &q->cq;
		} else if (e.type == IBV_EVENT_SRQ_ERR || e.type == IBV_EVENT_SRQ_LIMIT_REACHED) {
			struct tp_srq *s = tp_handles_find(c, e.handle, TP_SRQ);
			if (s == NULL)
				continue;
			event->element.srq = &s->srq;
		} else {
			event->element.port_num = (int)e.port;
		}
		if (e.type == IBV_EVENT_DEVICE_FATAL) {
			atomic_store(&c->dead, 1);
			c->fatal_reported = 1;
		}
		return 0;
	}
}
TP_DEFAULT_VERSION(ibv_get_async_event, "IBVERBS_1.1");

TP_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	pthread_mutex_t *mu = NULL;
	pthread_cond_t *cond = NULL;
	uint32_t *done = NULL;
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR:
		mu = &event->element.cq->mutex, cond = &event->element.cq->cond,
		done = &event->element.cq->async_events_completed;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		mu = &event->element.srq->mutex, cond = &event->element.srq->cond, done = &event->element.srq->events_completed;
		break;
	default:
		if (qp_event(event->event_type))
			mu = &event->element.qp->mutex, cond = &event->element.qp->cond,
			done = &event->element.qp->events_completed;
	}
	if (mu == NULL)
		return;
	pthread_mutex_lock(mu);
	++*done;
	pthread_cond_signal(cond);
	pthread_mutex_unlock(mu);
}
TP_DEFAULT_VERSION(ibv_ack_async_event, "IBVERBS_1.1");
