/* taproce's librdmacm.so.1: rdma-core's RDMA CM API over the appliance's
 * control socket (verbs/abi/cm.go), beside taproce's libibverbs.so.1.
 * Internal declarations. */
#ifndef TAPROCE_CMA_H
#define TAPROCE_CMA_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdint.h>

#include "abi.h"
#include "msg.h"

#define TP_EXPORT __attribute__((visibility("default")))

/* An event channel: a control connection whose session owns the channel's
 * IDs, and the session's event socket, the channel's fd. */
struct tp_channel {
	struct rdma_event_channel ch;
	int sock;
	uint32_t seq;
	pthread_mutex_t mu; /* serialises calls on sock, guards ids */
	struct tp_id *ids;
	atomic_int readers; /* threads in rdma_get_cm_event's recv */
	atomic_int closing; /* rdma_destroy_event_channel has begun */
};

/* An ID. The application sees id; the rest is the library's. */
struct tp_id {
	struct rdma_cm_id id;
	struct tp_channel *chan;
	uint32_t handle; /* the appliance's */
	int sync;        /* the calls wait for their events (made without a channel) */
	int own_chan;    /* the channel is the ID's own, closed with it */
	struct tp_id *next;

	pthread_mutex_t mu;
	pthread_cond_t cond;
	unsigned gotten, acked; /* events handed out and acknowledged */
	struct ibv_sa_path_rec path;
	struct ibv_qp_init_attr *qp_init; /* rdma_create_ep's, for rdma_get_request */
	int own_cqs;                      /* send_cq and recv_cq are the library's */
	uint8_t req_resp_res, req_init_depth; /* a connect request's, for rdma_accept(id, NULL) */
	uint8_t tos;
	int tos_set;
	struct ibv_ece ece;
};

/* An event as rdma_get_cm_event hands it out, with its private data. */
struct tp_event {
	struct rdma_cm_event ev;
	uint8_t private_data[TAPROCE_CM_MAX_PRIVATE_DATA];
};

#define tp_id_of(p) ((struct tp_id *)(p))

int tp_cm_call(struct tp_channel *c, uint16_t op, const void *req, size_t req_len, void *rep, size_t rep_len,
	       int *fds_out, int *nfds_out);
int tp_cm_errno(int32_t e);

#endif /* TAPROCE_CMA_H */
