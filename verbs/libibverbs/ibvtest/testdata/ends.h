/* What the test programs share: two ends on the two devices of one
 * appliance, each an RC QP connected to the other's, and ways to wait for
 * their completions. A header of the tests', compiled into each. */
#ifndef ENDS_H
#define ENDS_H

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "die.h"

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

static inline void open_end(struct end *e, const char *name, int cqe)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (l == NULL)
		die("ibv_get_device_list");
	for (int i = 0; i < n; i++)
		if (strcmp(ibv_get_device_name(l[i]), name) == 0)
			e->ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	if (e->ctx == NULL)
		die("open %s", name);
	if ((e->pd = ibv_alloc_pd(e->ctx)) == NULL)
		die("ibv_alloc_pd");
	if ((e->cq = ibv_create_cq(e->ctx, cqe, NULL, NULL, 0)) == NULL)
		die("ibv_create_cq");
	struct ibv_qp_init_attr ia = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	if ((e->qp = ibv_create_qp(e->pd, &ia)) == NULL)
		die("ibv_create_qp");
	if (ibv_query_gid(e->ctx, 1, 1, &e->gid))
		die("ibv_query_gid");
}

static inline void connect_to(struct end *e, struct end *peer)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_MAX_QP_RD_ATOMIC))
		die("to RTS");
}

/* next_wc waits for the next completion on cq, whatever its status. */
static inline struct ibv_wc next_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long spins = 0;; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			return wc;
		if (spins > 200000000L)
			die("no completion");
	}
}

static inline struct ibv_wc wait_wc(struct end *e, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	for (long spins = 0;; spins++) {
		int n = ibv_poll_cq(e->cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1)
			break;
		if (spins > 200000000L)
			die("no completion");
	}
	if (wc.status != IBV_WC_SUCCESS)
		die("completion %s (opcode %d)", ibv_wc_status_str(wc.status), wc.opcode);
	if (wc.opcode != op)
		die("completion opcode %d, want %d", wc.opcode, op);
	return wc;
}

static inline void post(struct end *e, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	if (ibv_post_send(e->qp, wr, &bad))
		die("ibv_post_send");
}

#endif /* ENDS_H */
