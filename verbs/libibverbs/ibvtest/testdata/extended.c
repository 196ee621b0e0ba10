/* A user's program, built against Debian's libibverbs-dev, that uses the
 * extended verbs: a CQ made with ibv_create_cq_ex and polled with
 * ibv_start_poll/ibv_next_poll/ibv_end_poll, and a QP made with
 * ibv_create_qp_ex whose work goes through the work request API
 * (ibv_wr_start … ibv_wr_complete): SEND with immediate, RDMA WRITE of
 * inline data, RDMA READ and FETCH_ADD in one batch, checked at both ends;
 * a batch with a bad request fails whole; what the provider lacks
 * (timestamps, TSO) is EOPNOTSUPP. It prints "ok" and exits 0. */
#define _GNU_SOURCE
#include "ends.h"

static uint8_t abuf[4096], bbuf[4096];

int main(void)
{
	struct end a = {0}, b = {0};
	open_end(&b, "taproce1", 16);
	/* a: by hand, extended. */
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	for (int i = 0; l && i < n; i++)
		if (strcmp(ibv_get_device_name(l[i]), "taproce0") == 0)
			a.ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	if (a.ctx == NULL || (a.pd = ibv_alloc_pd(a.ctx)) == NULL || ibv_query_gid(a.ctx, 1, 1, &a.gid))
		die("open taproce0");

	struct ibv_cq_init_attr_ex ca = {.cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
	errno = 0;
	if (ibv_create_cq_ex(a.ctx, &ca) != NULL || errno != EOPNOTSUPP)
		die("a CQ with timestamps: want EOPNOTSUPP");
	ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(a.ctx, &ca);
	if (cqx == NULL)
		die("ibv_create_cq_ex");
	a.cq = ibv_cq_ex_to_cq(cqx);

	struct ibv_qp_init_attr_ex qa = {.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC, .pd = a.pd,
					 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					 .send_ops_flags = IBV_QP_EX_WITH_TSO,
					 .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1,
						 .max_inline_data = 64}};
	errno = 0;
	if (ibv_create_qp_ex(a.ctx, &qa) != NULL || errno != EOPNOTSUPP)
		die("a QP with TSO: want EOPNOTSUPP");
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
			    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	if ((a.qp = ibv_create_qp_ex(a.ctx, &qa)) == NULL)
		die("ibv_create_qp_ex");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(a.qp);
	if (qx == NULL)
		die("ibv_qp_to_qp_ex of a QP made with send ops flags");
	if (ibv_qp_to_qp_ex(b.qp) != NULL)
		die("ibv_qp_to_qp_ex of a plain QP: want NULL");
	connect_to(&a, &b);
	connect_to(&b, &a);

	unsigned acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *ma = ibv_reg_mr(a.pd, abuf, sizeof(abuf), acc), *mb = ibv_reg_mr(b.pd, bbuf, sizeof(bbuf), acc);
	if (ma == NULL || mb == NULL)
		die("ibv_reg_mr");
	for (int i = 0; i < 256; i++)
		abuf[i] = (uint8_t)i, bbuf[1024 + i] = (uint8_t)(255 - i);
	uint64_t *word = (uint64_t *)(bbuf + 2048);
	*word = 40;
	struct ibv_sge rs = {.addr = (uintptr_t)bbuf, .length = 512, .lkey = mb->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 50, .sg_list = &rs, .num_sge = 1}, *rbad;
	if (ibv_post_recv(b.qp, &rwr, &rbad))
		die("ibv_post_recv");

	/* One batch of four. */
	char text[] = "written inline";
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(qx, htonl(77));
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)abuf, 200);
	qx->wr_id = 2;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)bbuf + 512);
	ibv_wr_set_inline_data(qx, text, sizeof(text));
	memset(text, 0, sizeof(text)); /* copied already */
	qx->wr_id = 3;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qx, mb->rkey, (uintptr_t)bbuf + 1024);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)abuf + 1024, 256);
	qx->wr_id = 4;
	ibv_wr_atomic_fetch_add(qx, mb->rkey, (uintptr_t)word, 2);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)abuf + 2048, 8);
	if (ibv_wr_complete(qx))
		die("ibv_wr_complete");

	/* Polled with the extended CQ's calls. */
	enum ibv_wc_opcode want[] = {IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD};
	int got = 0;
	struct ibv_poll_cq_attr pa = {0};
	for (long spins = 0; got < 4; spins++) {
		if (spins > 200000000L)
			die("extended CQ: %d of 4 completions", got);
		int e = ibv_start_poll(cqx, &pa);
		if (e == ENOENT)
			continue;
		if (e)
			die("ibv_start_poll: %d", e);
		do {
			if (cqx->status != IBV_WC_SUCCESS || cqx->wr_id != (uint64_t)(got + 1) ||
			    ibv_wc_read_opcode(cqx) != want[got] || ibv_wc_read_qp_num(cqx) != a.qp->qp_num)
				die("completion %d: %s wr %llu opcode %d", got, ibv_wc_status_str(cqx->status),
				    (unsigned long long)cqx->wr_id, ibv_wc_read_opcode(cqx));
			if (want[got] == IBV_WC_RDMA_READ && ibv_wc_read_byte_len(cqx) != 256)
				die("READ byte_len %u", ibv_wc_read_byte_len(cqx));
			got++;
		} while (got < 4 && ibv_next_poll(cqx) == 0);
		ibv_end_poll(cqx);
	}
	struct ibv_wc wc = next_wc(b.cq);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 50 || wc.byte_len != 200 || ntohl(wc.imm_data) != 77 ||
	    memcmp(bbuf, abuf, 200) != 0)
		die("the SEND with immediate arrived wrong");
	if (strcmp((char *)bbuf + 512, "written inline") != 0)
		die("the inline WRITE landed wrong");
	if (memcmp(abuf + 1024, bbuf + 1024, 256) != 0)
		die("the READ brought wrong bytes");
	if (*(uint64_t *)(abuf + 2048) != 40 || *word != 42)
		die("FETCH_ADD: %llu, word %llu", (unsigned long long)*(uint64_t *)(abuf + 2048), (unsigned long long)*word);

	/* A batch with a bad request fails whole: nothing of it is posted. */
	struct ibv_sge many[40];
	for (int i = 0; i < 40; i++)
		many[i] = (struct ibv_sge){.addr = (uintptr_t)abuf, .length = 8, .lkey = ma->lkey};
	ibv_wr_start(qx);
	qx->wr_id = 5;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)bbuf);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)abuf, 8);
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)bbuf);
	ibv_wr_set_sge_list(qx, 40, many);
	if (ibv_wr_complete(qx) != EINVAL)
		die("a batch with 40 SGEs in a request: want EINVAL");
	/* A batch aborted is not posted either; the next one is. */
	ibv_wr_start(qx);
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)bbuf);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)abuf, 8);
	ibv_wr_abort(qx);
	ibv_wr_start(qx);
	qx->wr_id = 6;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)bbuf);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)abuf, 8);
	if (ibv_wr_complete(qx))
		die("ibv_wr_complete after a failed batch");
	for (long spins = 0;; spins++) {
		if (spins > 200000000L)
			die("no completion after a failed batch");
		if (ibv_start_poll(cqx, &pa) == 0) {
			uint64_t id = cqx->wr_id;
			ibv_end_poll(cqx);
			if (id != 6)
				die("completion of wr %llu: the failed or aborted batch was posted", (unsigned long long)id);
			break;
		}
	}
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	if (ibv_destroy_qp(a.qp) || ibv_destroy_cq(a.cq) || ibv_destroy_qp(b.qp) || ibv_destroy_cq(b.cq))
		die("destroy");
	printf("ok\n");
	return 0;
}
