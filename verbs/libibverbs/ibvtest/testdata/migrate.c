/* A user's program, built against Debian's librdmacm-dev, that moves RDMA
 * CM IDs between event channels as libfabric's verbs provider does: a
 * listener moved to a second channel takes its connect request there; a
 * client ID resolved synchronously on a channel of its own (made with no
 * channel) moves to an event channel and connects from it; a SEND crosses
 * the connection; the client ID moves back to a channel of its own
 * (synchronous again) and disconnects, and the server sees it on the
 * listener's new channel. rdma_notify answers as Linux's CM: EISCONN for
 * COMM_EST on an established connection, EINVAL on a listener or for an
 * event that is not the CM's, 0 for LID_CHANGE. Before that, rdma_getaddrinfo with neither a
 * node nor a service answers with the hints' destination, as librdmacm
 * does. Arguments: the server's address, the client's, the port. It
 * prints "ok" and exits 0. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "die.h"

static struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
		die("address %s", ip);
	return a;
}

/* expect reads the channel's next event, which must be want for id (NULL:
 * any), and acknowledges it; it returns the event's ID. */
static struct rdma_cm_id *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want, struct rdma_cm_id *id)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event, waiting for %s", rdma_event_str(want));
	if (ev->event != want || (id && ev->id != id))
		die("%s (status %d) for ID %p, want %s for %p", rdma_event_str(ev->event), ev->status, (void *)ev->id,
		    rdma_event_str(want), (void *)id);
	struct rdma_cm_id *got = ev->id;
	rdma_ack_cm_event(ev);
	return got;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = {.qp_type = IBV_QPT_RC,
				     .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	return a;
}

/* complete waits for one successful completion on cq. */
static void complete(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	for (int i = 0; i < 10000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				die("%s: %s", what, ibv_wc_status_str(wc.status));
			return;
		}
	}
	die("%s: no completion", what);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		die("usage: migrate SERVER_ADDR CLIENT_ADDR PORT");
	struct sockaddr_in srv = addr(argv[1], atoi(argv[3])), cli = addr(argv[2], 0);

	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP, .ai_dst_addr = (struct sockaddr *)&srv,
				      .ai_dst_len = sizeof(srv)}, *rai;
	if (rdma_getaddrinfo(NULL, NULL, &hints, &rai))
		die("rdma_getaddrinfo with the destination in the hints");
	if (rai->ai_dst_len != sizeof(srv) || memcmp(rai->ai_dst_addr, &srv, sizeof(srv)) != 0 ||
	    rai->ai_port_space != RDMA_PS_TCP || rai->ai_src_addr != NULL)
		die("rdma_getaddrinfo: not the hints' destination");
	rdma_freeaddrinfo(rai);

	struct rdma_event_channel *lch = rdma_create_event_channel(), *sch = rdma_create_event_channel(),
				  *cch = rdma_create_event_channel();
	if (!lch || !sch || !cch)
		die("rdma_create_event_channel");
	struct rdma_cm_id *lid, *cid;
	if (rdma_create_id(lch, &lid, NULL, RDMA_PS_TCP) || rdma_bind_addr(lid, (struct sockaddr *)&srv) ||
	    rdma_listen(lid, 4))
		die("listener");
	if (rdma_migrate_id(lid, sch) || lid->channel != sch)
		die("rdma_migrate_id of the listener");

	if (rdma_create_id(NULL, &cid, NULL, RDMA_PS_TCP))
		die("rdma_create_id without a channel");
	if (rdma_resolve_addr(cid, (struct sockaddr *)&cli, (struct sockaddr *)&srv, 2000) ||
	    rdma_resolve_route(cid, 2000))
		die("synchronous resolve");
	struct ibv_qp_init_attr ca = qp_attr();
	if (rdma_create_qp(cid, NULL, &ca))
		die("rdma_create_qp on the client");
	if (rdma_migrate_id(cid, cch) || cid->channel != cch)
		die("rdma_migrate_id of the resolved client ID");
	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7};
	if (rdma_connect(cid, &cp))
		die("rdma_connect from the new channel");

	struct rdma_cm_id *sid = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST, NULL);
	struct ibv_qp_init_attr sa = qp_attr();
	if (rdma_create_qp(sid, NULL, &sa))
		die("rdma_create_qp on the server");
	static char rbuf[64], sbuf[64] = "moved between channels";
	struct ibv_mr *rmr = ibv_reg_mr(sid->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	if (!rmr || rdma_post_recv(sid, NULL, rbuf, sizeof(rbuf), rmr))
		die("server's receive");
	if (rdma_accept(sid, &cp))
		die("rdma_accept");
	expect(cch, RDMA_CM_EVENT_ESTABLISHED, cid);
	expect(sch, RDMA_CM_EVENT_ESTABLISHED, sid);
	errno = 0;
	if (rdma_notify(sid, IBV_EVENT_COMM_EST) != -1 || errno != EISCONN)
		die("rdma_notify(COMM_EST) of an established connection, want EISCONN");
	errno = 0;
	if (rdma_notify(lid, IBV_EVENT_COMM_EST) != -1 || errno != EINVAL)
		die("rdma_notify(COMM_EST) of a listener, want EINVAL");
	errno = 0;
	if (rdma_notify(sid, IBV_EVENT_QP_FATAL) != -1 || errno != EINVAL)
		die("rdma_notify(QP_FATAL), want EINVAL");
	if (rdma_notify(cid, IBV_EVENT_LID_CHANGE))
		die("rdma_notify(LID_CHANGE)");

	struct ibv_mr *smr = ibv_reg_mr(cid->pd, sbuf, sizeof(sbuf), 0);
	if (!smr || rdma_post_send(cid, NULL, sbuf, sizeof(sbuf), smr, IBV_SEND_SIGNALED))
		die("client's send");
	complete(cid->send_cq, "send");
	complete(sid->recv_cq, "receive");
	if (strcmp(rbuf, sbuf) != 0)
		die("received %.64s", rbuf);

	if (rdma_migrate_id(cid, NULL) || cid->channel == cch || cid->channel == NULL)
		die("rdma_migrate_id to a channel of the ID's own");
	if (rdma_disconnect(cid))
		die("rdma_disconnect");
	expect(sch, RDMA_CM_EVENT_DISCONNECTED, sid);
	if (rdma_disconnect(sid))
		die("the server's rdma_disconnect");
	expect(cid->channel, RDMA_CM_EVENT_DISCONNECTED, cid);

	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	rdma_destroy_qp(cid);
	rdma_destroy_qp(sid);
	if (rdma_destroy_id(cid) || rdma_destroy_id(sid) || rdma_destroy_id(lid))
		die("rdma_destroy_id");
	rdma_destroy_event_channel(lch);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
	printf("ok\n");
	return 0;
}
