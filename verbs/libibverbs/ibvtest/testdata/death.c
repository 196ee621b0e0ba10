/* A user's program, built against Debian's libibverbs-dev, whose
 * appliance is killed under it. It sets up work that cannot finish —
 * SENDs to a QP with no receive posted, receives nobody sends to — says
 * "ready" and waits: a thread asleep on a completion channel, a thread
 * asleep on the async event queue, the main thread spinning on a CQ. When
 * the appliance dies each must learn at once, as libibverbs reports a
 * device the kernel took away: IBV_EVENT_DEVICE_FATAL, the outstanding
 * work flushed (IBV_WC_WR_FLUSH_ERR, every request once, in order), the
 * channel's CQ handed over, then EIO from every call that needs the
 * device; and freeing everything still works. SIGPIPE keeps its default
 * action: a library that let its own write raise it would kill the
 * program. It prints "ok" and exits 0. */
#define _GNU_SOURCE
#include <pthread.h>

#include "ends.h"

#define NSEND 3
#define NRECV 4

static struct end a, b, w, z;
static struct ibv_comp_channel *ch;
static uint8_t buf[4096];
static struct ibv_mr *ma, *mb;

static void *channel_waiter(void *arg)
{
	(void)arg;
	struct ibv_cq *cq;
	void *cqctx;
	if (ibv_get_cq_event(ch, &cq, &cqctx))
		die("ibv_get_cq_event after the death: want the armed CQ");
	if (cq != z.cq)
		die("ibv_get_cq_event gave another CQ");
	ibv_ack_cq_events(cq, 1);
	for (int i = 0; i < NRECV; i++) {
		struct ibv_wc wc = next_wc(cq);
		if (wc.status != IBV_WC_WR_FLUSH_ERR || wc.wr_id != (uint64_t)(100 + i))
			die("receive %d: %s wr %llu, want flushed wr %d", i, ibv_wc_status_str(wc.status),
			    (unsigned long long)wc.wr_id, 100 + i);
	}
	struct ibv_wc wc;
	if (ibv_poll_cq(cq, 1, &wc) != 0)
		die("a completion more than the work posted");
	errno = 0;
	if (ibv_get_cq_event(ch, &cq, &cqctx) != -1 || errno != EIO)
		die("the second ibv_get_cq_event after the death: want EIO");
	return NULL;
}

static void *event_waiter(void *arg)
{
	struct end *e = arg;
	struct ibv_async_event ev;
	if (ibv_get_async_event(e->ctx, &ev))
		die("ibv_get_async_event");
	if (ev.event_type != IBV_EVENT_DEVICE_FATAL)
		die("event %s, want IBV_EVENT_DEVICE_FATAL", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	errno = 0;
	if (ibv_get_async_event(e->ctx, &ev) != -1 || errno != EIO)
		die("ibv_get_async_event after the fatal event: want EIO");
	return NULL;
}

int main(void)
{
	open_end(&a, "taproce0", 16);
	open_end(&b, "taproce1", 16);
	/* x = a's QP, SENDing to b's, which has no receive posted: an RNR
	 * retry count of 7 retries for ever. */
	connect_to(&a, &b);
	connect_to(&b, &a);
	/* w on a and z on b, z's receives on a CQ of a channel. */
	w = (struct end){.ctx = a.ctx, .pd = a.pd, .cq = a.cq, .gid = a.gid};
	z = (struct end){.ctx = b.ctx, .pd = b.pd, .gid = b.gid};
	if ((ch = ibv_create_comp_channel(b.ctx)) == NULL || (z.cq = ibv_create_cq(b.ctx, 16, NULL, ch, 0)) == NULL)
		die("channel and CQ");
	struct ibv_qp_init_attr ia = {.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	if ((w.qp = ibv_create_qp(a.pd, &ia)) == NULL)
		die("ibv_create_qp");
	ia.send_cq = ia.recv_cq = z.cq;
	if ((z.qp = ibv_create_qp(b.pd, &ia)) == NULL)
		die("ibv_create_qp");
	connect_to(&w, &z);
	connect_to(&z, &w);
	if ((ma = ibv_reg_mr(a.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE)) == NULL ||
	    (mb = ibv_reg_mr(b.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE)) == NULL)
		die("ibv_reg_mr");
	struct ibv_sge s = {.addr = (uintptr_t)buf, .length = 64, .lkey = ma->lkey};
	for (int i = 0; i < NSEND; i++) {
		struct ibv_send_wr wr = {.wr_id = (uint64_t)(1 + i), .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = i == 1 ? 0 : IBV_SEND_SIGNALED};
		post(&a, &wr);
	}
	struct ibv_sge rs = {.addr = (uintptr_t)buf, .length = 64, .lkey = mb->lkey};
	for (int i = 0; i < NRECV; i++) {
		struct ibv_recv_wr rwr = {.wr_id = (uint64_t)(100 + i), .sg_list = &rs, .num_sge = 1}, *bad;
		if (ibv_post_recv(z.qp, &rwr, &bad))
			die("ibv_post_recv");
	}
	if (ibv_req_notify_cq(z.cq, 0))
		die("ibv_req_notify_cq");
	pthread_t t1, t2;
	if (pthread_create(&t1, NULL, channel_waiter, NULL) || pthread_create(&t2, NULL, event_waiter, &a))
		die("pthread_create");
	struct ibv_wc wc;
	if (ibv_poll_cq(a.cq, 1, &wc) != 0)
		die("a completion before the death: %s", ibv_wc_status_str(wc.status));
	printf("ready\n");
	fflush(stdout);

	/* Spin: the flushed SENDs, unsignaled ones too, in order. */
	for (int i = 0; i < NSEND; i++) {
		wc = next_wc(a.cq);
		if (wc.status != IBV_WC_WR_FLUSH_ERR || wc.wr_id != (uint64_t)(1 + i) || wc.qp_num != a.qp->qp_num)
			die("send %d: %s wr %llu qp %u, want flushed wr %d", i, ibv_wc_status_str(wc.status),
			    (unsigned long long)wc.wr_id, wc.qp_num, 1 + i);
	}
	if (pthread_join(t1, NULL) || pthread_join(t2, NULL))
		die("pthread_join");

	/* Every call that needs the device: EIO. */
	struct ibv_send_wr wr = {.wr_id = 9, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND}, *bad;
	if (ibv_post_send(a.qp, &wr, &bad) != EIO)
		die("ibv_post_send after the death: want EIO");
	struct ibv_recv_wr rwr = {.wr_id = 10, .sg_list = &rs, .num_sge = 1}, *rbad;
	if (ibv_post_recv(z.qp, &rwr, &rbad) != EIO)
		die("ibv_post_recv after the death: want EIO");
	if (ibv_req_notify_cq(z.cq, 0) != EIO)
		die("ibv_req_notify_cq after the death: want EIO");
	errno = 0;
	if (ibv_alloc_pd(a.ctx) != NULL || errno != EIO)
		die("ibv_alloc_pd after the death: want EIO");
	struct ibv_port_attr pa;
	if (ibv_query_port(a.ctx, 1, &pa) != EIO)
		die("ibv_query_port after the death: want EIO");

	/* Freeing works. */
	if (ibv_destroy_qp(w.qp) || ibv_destroy_qp(z.qp) || ibv_destroy_qp(a.qp) || ibv_destroy_qp(b.qp))
		die("ibv_destroy_qp after the death");
	if (ibv_dereg_mr(ma) || ibv_dereg_mr(mb) || ibv_destroy_cq(z.cq) || ibv_destroy_comp_channel(ch) ||
	    ibv_destroy_cq(a.cq) || ibv_destroy_cq(b.cq) || ibv_dealloc_pd(a.pd) || ibv_dealloc_pd(b.pd))
		die("freeing after the death");
	if (ibv_close_device(a.ctx) || ibv_close_device(b.ctx))
		die("ibv_close_device after the death");
	printf("ok\n");
	return 0;
}
