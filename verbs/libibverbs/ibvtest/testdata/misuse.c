/* A user's program, built against Debian's libibverbs-dev, that misuses
 * the verbs the ways programs do by mistake, and checks each answer is
 * libibverbs' own (as Linux rxe gives it): an errno from the call, or an
 * error completion, or an async event — never a crash or a hang. It
 * prints "ok" and exits 0 when every answer was right. */
#define _GNU_SOURCE
#include <poll.h>
#include <sys/mman.h>

#include "ends.h"

#define N 65536

/* step says on stderr what comes next: a crash or a hang names it. */
static void step(const char *what) { fprintf(stderr, "misuse: %s\n", what); }

static const unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

static void want_status(struct ibv_cq *cq, enum ibv_wc_status want, uint64_t wr_id, const char *what)
{
	struct ibv_wc wc = next_wc(cq);
	if (wc.status != want || wc.wr_id != wr_id)
		die("%s: completion %s for wr %llu, want %s for %llu", what, ibv_wc_status_str(wc.status),
		    (unsigned long long)wc.wr_id, ibv_wc_status_str(want), (unsigned long long)wr_id);
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		die("ibv_query_qp");
	return a.qp_state;
}

static void pair(struct end *a, struct end *b, int cqe)
{
	memset(a, 0, sizeof(*a));
	memset(b, 0, sizeof(*b));
	open_end(a, "taproce0", cqe);
	open_end(b, "taproce1", cqe);
	connect_to(a, b);
	connect_to(b, a);
}

static void close_end(struct end *e)
{
	if (e->qp && ibv_destroy_qp(e->qp))
		die("ibv_destroy_qp");
	if (ibv_destroy_cq(e->cq) || ibv_dealloc_pd(e->pd) || ibv_close_device(e->ctx))
		die("closing an end");
}

static struct ibv_send_wr write_wr(uint64_t id, struct ibv_sge *s, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return wr;
}

int main(void)
{
	uint8_t *abuf = mmap(NULL, 4 * N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *bbuf = mmap(NULL, 4 * N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (abuf == MAP_FAILED || bbuf == MAP_FAILED)
		die("mmap");
	struct end a, b;
	struct ibv_send_wr *bad;
	struct ibv_recv_wr *rbad;

	step("RESET");
	/* Posting to a QP in RESET: EINVAL, the first request returned. */
	{
		open_end(&a, "taproce0", 16);
		struct ibv_mr *m = ibv_reg_mr(a.pd, abuf, N, all);
		struct ibv_sge s = {.addr = (uintptr_t)abuf, .length = 64, .lkey = m->lkey};
		struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND};
		struct ibv_recv_wr rwr = {.wr_id = 2, .sg_list = &s, .num_sge = 1};
		bad = NULL;
		rbad = NULL;
		if (ibv_post_send(a.qp, &wr, &bad) != EINVAL || bad != &wr)
			die("post send in RESET: want EINVAL");
		if (ibv_post_recv(a.qp, &rwr, &rbad) != EINVAL || rbad != &rwr)
			die("post recv in RESET: want EINVAL");
		/* A PD with a region, a CQ with a QP: EBUSY. */
		if (ibv_dealloc_pd(a.pd) != EBUSY)
			die("ibv_dealloc_pd of a PD in use: want EBUSY");
		if (ibv_destroy_cq(a.cq) != EBUSY)
			die("ibv_destroy_cq of a CQ in use: want EBUSY");
		ibv_dereg_mr(m);
		close_end(&a);
	}

	pair(&a, &b, 16);
	struct ibv_mr *ma = ibv_reg_mr(a.pd, abuf, N, all), *mb = ibv_reg_mr(b.pd, bbuf, N, all);
	if (ma == NULL || mb == NULL)
		die("ibv_reg_mr");
	struct ibv_sge s = {.addr = (uintptr_t)abuf, .length = 64, .lkey = ma->lkey};

	step("queue limits");
	/* More scatter entries than the QP was made for: EINVAL; more
	 * requests than it holds: ENOMEM at the first that does not fit. */
	{
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr ia;
		if (ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &ia))
			die("ibv_query_qp");
		struct ibv_sge many[64];
		for (int i = 0; i < 64; i++)
			many[i] = s;
		struct ibv_send_wr wr = write_wr(3, many, (uintptr_t)bbuf, mb->rkey);
		wr.num_sge = (int)ia.cap.max_send_sge + 1;
		if (wr.num_sge > 64 || ibv_post_send(a.qp, &wr, &bad) != EINVAL || bad != &wr)
			die("%d SGEs on a QP of %u: want EINVAL", wr.num_sge, ia.cap.max_send_sge);
		struct ibv_send_wr wrs[40];
		for (int i = 0; i < 40; i++) {
			wrs[i] = write_wr(100 + i, &s, (uintptr_t)bbuf, mb->rkey);
			wrs[i].send_flags = 0;
			wrs[i].next = i < 39 ? &wrs[i + 1] : NULL;
		}
		if (ibv_post_send(a.qp, wrs, &bad) != ENOMEM || bad != &wrs[16])
			die("40 requests on a QP of 16: want ENOMEM at the 17th (got bad at %ld)", bad ? (long)(bad - wrs) : -1L);
		/* The 16 that fit complete; a signaled one behind them tells. */
		struct ibv_send_wr last = write_wr(200, &s, (uintptr_t)bbuf, mb->rkey);
		for (int tries = 0; ibv_post_send(a.qp, &last, &bad) == ENOMEM; tries++)
			if (tries > 100000000)
				die("the send queue never drained");
		want_status(a.cq, IBV_WC_SUCCESS, 200, "a write behind a full queue");
	}

	step("bad rkey");
	/* A bad rkey: the requester sees a remote access error, and the QP
	 * goes to the error state, its later work flushed. */
	{
		struct ibv_send_wr wr = write_wr(4, &s, (uintptr_t)bbuf, mb->rkey ^ 0x5a5a00);
		struct ibv_send_wr wr2 = write_wr(5, &s, (uintptr_t)bbuf, mb->rkey);
		wr.next = &wr2;
		if (ibv_post_send(a.qp, &wr, &bad))
			die("ibv_post_send");
		want_status(a.cq, IBV_WC_REM_ACCESS_ERR, 4, "bad rkey");
		want_status(a.cq, IBV_WC_WR_FLUSH_ERR, 5, "after a bad rkey");
		if (qp_state(a.qp) != IBV_QPS_ERR)
			die("after a remote access error the QP is not in ERR");
		/* Posting in ERR is allowed; the work is flushed. */
		struct ibv_send_wr wr3 = write_wr(6, &s, (uintptr_t)bbuf, mb->rkey);
		if (ibv_post_send(a.qp, &wr3, &bad))
			die("post send in ERR: want success");
		want_status(a.cq, IBV_WC_WR_FLUSH_ERR, 6, "posted in ERR");
		struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &s, .num_sge = 1};
		if (ibv_post_recv(a.qp, &rwr, &rbad))
			die("post recv in ERR: want success");
		want_status(a.cq, IBV_WC_WR_FLUSH_ERR, 7, "receive posted in ERR");
	}
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	close_end(&a);
	close_end(&b);

	step("bad lkey");
	/* A bad lkey, and an SGE beyond its region: local protection errors. */
	for (int k = 0; k < 2; k++) {
		pair(&a, &b, 16);
		ma = ibv_reg_mr(a.pd, abuf, N, all);
		mb = ibv_reg_mr(b.pd, bbuf, N, all);
		struct ibv_sge bs = {.addr = (uintptr_t)abuf, .length = 64, .lkey = ma->lkey + 0x100};
		if (k == 1)
			bs = (struct ibv_sge){.addr = (uintptr_t)abuf + N - 32, .length = 64, .lkey = ma->lkey};
		struct ibv_send_wr wr = write_wr(8, &bs, (uintptr_t)bbuf, mb->rkey);
		if (ibv_post_send(a.qp, &wr, &bad))
			die("ibv_post_send");
		want_status(a.cq, IBV_WC_LOC_PROT_ERR, 8, k == 0 ? "bad lkey" : "SGE beyond its region");
		ibv_dereg_mr(ma);
		ibv_dereg_mr(mb);
		close_end(&a);
		close_end(&b);
	}

	step("dereg in use");
	/* Deregistering a region a request is still using: the call
	 * succeeds, the request completes one way or the other. */
	{
		pair(&a, &b, 16);
		ma = ibv_reg_mr(a.pd, abuf, 4 * N, all);
		mb = ibv_reg_mr(b.pd, bbuf, 4 * N, all);
		struct ibv_sge big = {.addr = (uintptr_t)abuf, .length = 4 * N, .lkey = ma->lkey};
		struct ibv_send_wr wr = write_wr(9, &big, (uintptr_t)bbuf, mb->rkey);
		if (ibv_post_send(a.qp, &wr, &bad))
			die("ibv_post_send");
		if (ibv_dereg_mr(ma))
			die("ibv_dereg_mr of a region in use");
		struct ibv_wc wc = next_wc(a.cq);
		if (wc.wr_id != 9 || (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_LOC_PROT_ERR))
			die("a write from a deregistered region: %s", ibv_wc_status_str(wc.status));
		ibv_dereg_mr(mb);

		step("destroyed QP");
		/* Posting to a destroyed QP: EINVAL, not a crash. */
		struct ibv_qp *qp = a.qp;
		if (ibv_destroy_qp(qp))
			die("ibv_destroy_qp");
		a.qp = NULL;
		if (ibv_post_send(qp, &wr, &bad) != EINVAL)
			die("post send to a destroyed QP: want EINVAL");
		struct ibv_recv_wr rwr = {.wr_id = 10, .sg_list = &s, .num_sge = 1};
		if (ibv_post_recv(qp, &rwr, &rbad) != EINVAL)
			die("post recv to a destroyed QP: want EINVAL");
		close_end(&a);
		close_end(&b);
	}

	step("CQ overrun");
	/* A CQ overrun: more completions than the CQ holds, unpolled. The
	 * program hears IBV_EVENT_CQ_ERR for that CQ. */
	{
		pair(&a, &b, 4);
		ma = ibv_reg_mr(a.pd, abuf, N, all);
		mb = ibv_reg_mr(b.pd, bbuf, N, all);
		s.lkey = ma->lkey;
		int n = a.cq->cqe + 4;
		for (int i = 0; i < n; i++) {
			struct ibv_send_wr wr = write_wr(300 + i, &s, (uintptr_t)bbuf, mb->rkey);
			while (ibv_post_send(a.qp, &wr, &bad) == ENOMEM)
				usleep(100);
		}
		struct pollfd p = {.fd = a.ctx->async_fd, .events = POLLIN};
		if (poll(&p, 1, 20000) != 1)
			die("no async event after a CQ overrun");
		struct ibv_async_event ev;
		if (ibv_get_async_event(a.ctx, &ev))
			die("ibv_get_async_event");
		if (ev.event_type != IBV_EVENT_CQ_ERR || ev.element.cq != a.cq)
			die("after a CQ overrun: event %s, want %s", ibv_event_type_str(ev.event_type),
			    ibv_event_type_str(IBV_EVENT_CQ_ERR));
		ibv_ack_async_event(&ev);
		struct ibv_wc wcs[8];
		if (ibv_poll_cq(a.cq, 8, wcs) < 0)
			die("ibv_poll_cq after an overrun");
		ibv_dereg_mr(ma);
		ibv_dereg_mr(mb);
		close_end(&a);
		close_end(&b);
	}
	printf("ok\n");
	return 0;
}
