/* The RDMA CM: event channels, IDs, and the QP transitions librdmacm makes
 * for its applications, over the appliance's CM ops (verbs/abi/cm.go).
 * What rdma-core's librdmacm asks the kernel's ucma, this asks the
 * appliance; what it does itself (moving QPs with rdma_init_qp_attr's
 * attributes, the active side's ESTABLISHED), this does the same. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cma.h"

/* Devices opened for IDs, as librdmacm keeps them open while loaded. */
struct tp_dev {
	char name[IBV_SYSFS_NAME_MAX];
	struct ibv_context *ctx;
	struct ibv_pd *pd; /* the default PD of rdma_create_qp with none */
	struct tp_dev *next;
};

static pthread_mutex_t devs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tp_dev *devs;

/* dev_named returns the device of that name, opened; NULL with errno. */
static struct tp_dev *dev_named(const char *name)
{
	pthread_mutex_lock(&devs_mu);
	struct tp_dev *d;
	for (d = devs; d; d = d->next)
		if (strcmp(d->name, name) == 0)
			goto out;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (list == NULL)
		goto out;
	for (int i = 0; i < n; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) != 0)
			continue;
		struct ibv_context *ctx = ibv_open_device(list[i]);
		if (ctx == NULL)
			break;
		d = calloc(1, sizeof(*d));
		if (d == NULL) {
			ibv_close_device(ctx);
			break;
		}
		snprintf(d->name, sizeof(d->name), "%s", name);
		d->ctx = ctx;
		d->next = devs;
		devs = d;
		break;
	}
	ibv_free_device_list(list);
	if (d == NULL && errno == 0)
		errno = ENODEV;
out:
	pthread_mutex_unlock(&devs_mu);
	return d;
}

static struct tp_dev *dev_of(struct ibv_context *ctx)
{
	pthread_mutex_lock(&devs_mu);
	struct tp_dev *d = devs;
	while (d && d->ctx != ctx)
		d = d->next;
	pthread_mutex_unlock(&devs_mu);
	return d;
}

static struct ibv_pd *default_pd(struct ibv_context *ctx)
{
	struct tp_dev *d = dev_of(ctx);
	if (d == NULL) {
		errno = EINVAL;
		return NULL;
	}
	pthread_mutex_lock(&devs_mu);
	if (d->pd == NULL)
		d->pd = ibv_alloc_pd(ctx);
	struct ibv_pd *pd = d->pd;
	pthread_mutex_unlock(&devs_mu);
	return pd;
}

TP_EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context **out = calloc((size_t)n + 1, sizeof(*out));
	int k = 0;
	if (list != NULL && out != NULL) {
		for (int i = 0; i < n; i++) {
			struct tp_dev *d = dev_named(ibv_get_device_name(list[i]));
			if (d != NULL)
				out[k++] = d->ctx;
		}
	}
	if (list != NULL)
		ibv_free_device_list(list);
	if (num_devices)
		*num_devices = out ? k : 0;
	return out;
}

TP_EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

int tp_cm_errno(int32_t e)
{
	if (e != 0) {
		errno = e;
		return -1;
	}
	return 0;
}

int tp_cm_call(struct tp_channel *c, uint16_t op, const void *req, size_t req_len, void *rep, size_t rep_len,
	       int *fds_out, int *nfds_out)
{
	pthread_mutex_lock(&c->mu);
	int r = tp_call_sock(c->sock, &c->seq, op, req, req_len, rep, rep_len, NULL, 0, fds_out, nfds_out);
	int e = errno;
	pthread_mutex_unlock(&c->mu);
	errno = e;
	return r;
}

/* id_call sends a request that answers with an errno. */
static int id_call(struct tp_id *t, uint16_t op, const void *req, size_t len)
{
	struct taproce_errno_reply rep;
	if (tp_cm_call(t->chan, op, req, len, &rep, sizeof(rep), NULL, NULL) < 0)
		return -1;
	return tp_cm_errno(rep.errnum);
}

static int id_op(struct tp_id *t, uint16_t op, uint32_t arg)
{
	struct taproce_cmid_request req = {.id = t->handle, .arg = arg};
	return id_call(t, op, &req, sizeof(req));
}

TP_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct tp_channel *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	pthread_mutex_init(&c->mu, NULL);
	c->sock = tp_connect();
	if (c->sock < 0) {
		/* No appliance: librdmacm's answer when there is no RDMA device. */
		free(c);
		errno = ENODEV;
		return NULL;
	}
	struct taproce_errno_reply rep;
	int fd = -1, nfds = 1;
	if (tp_call_sock(c->sock, &c->seq, TAPROCE_OP_CM_CHANNEL, NULL, 0, &rep, sizeof(rep), NULL, 0, &fd, &nfds) < 0 ||
	    tp_cm_errno(rep.errnum) < 0 || nfds != 1) {
		int e = errno ? errno : EIO;
		if (nfds == 1)
			close(fd);
		close(c->sock);
		free(c);
		errno = e;
		return NULL;
	}
	c->ch.fd = fd;
	return &c->ch;
}

TP_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct tp_channel *c = (struct tp_channel *)channel;
	atomic_store(&c->closing, 1);
	close(c->ch.fd);
	close(c->sock);
	/* A thread still reading the channel (rping's event thread, whose
	 * program ends right after) keeps the structure: see
	 * rdma_get_cm_event. */
	if (atomic_load(&c->readers) > 0)
		return;
	pthread_mutex_destroy(&c->mu);
	free(c);
}

static enum ibv_qp_type qp_type_of(enum rdma_port_space ps)
{
	return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
}

/* new_id makes the library's side of an ID the appliance knows as handle. */
static struct tp_id *new_id(struct tp_channel *c, uint32_t handle, void *context, enum rdma_port_space ps,
			    enum ibv_qp_type qt)
{
	struct tp_id *t = calloc(1, sizeof(*t));
	if (t == NULL)
		return NULL;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cond, NULL);
	t->chan = c;
	t->handle = handle;
	t->id.channel = &c->ch;
	t->id.context = context;
	t->id.ps = ps;
	t->id.qp_type = qt;
	pthread_mutex_lock(&c->mu);
	t->next = c->ids;
	c->ids = t;
	pthread_mutex_unlock(&c->mu);
	return t;
}

static struct tp_id *find_id(struct tp_channel *c, uint32_t handle)
{
	pthread_mutex_lock(&c->mu);
	struct tp_id *t = c->ids;
	while (t && t->handle != handle)
		t = t->next;
	pthread_mutex_unlock(&c->mu);
	return t;
}

static void free_id(struct tp_id *t)
{
	struct tp_channel *c = t->chan;
	pthread_mutex_lock(&c->mu);
	for (struct tp_id **p = &c->ids; *p; p = &(*p)->next)
		if (*p == t) {
			*p = t->next;
			break;
		}
	pthread_mutex_unlock(&c->mu);
	free(t->id.route.path_rec);
	free(t->qp_init);
	pthread_cond_destroy(&t->cond);
	pthread_mutex_destroy(&t->mu);
	free(t);
}

static int create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		     enum rdma_port_space ps, enum ibv_qp_type qt)
{
	int sync = channel == NULL;
	if (sync && (channel = rdma_create_event_channel()) == NULL)
		return -1;
	struct tp_channel *c = (struct tp_channel *)channel;
	struct taproce_cm_create_id_request req = {.context = 0, .port_space = (uint16_t)ps, .qp_type = (uint8_t)qt};
	struct taproce_cmid_reply rep;
	if (tp_cm_call(c, TAPROCE_OP_CM_CREATE_ID, &req, sizeof(req), &rep, sizeof(rep), NULL, NULL) < 0 ||
	    tp_cm_errno(rep.errnum) < 0)
		goto fail;
	struct tp_id *t = new_id(c, rep.id, context, ps, qt);
	if (t == NULL) {
		struct taproce_cmid_request d = {.id = rep.id};
		struct taproce_cm_destroy_reply drep;
		tp_cm_call(c, TAPROCE_OP_CM_DESTROY_ID, &d, sizeof(d), &drep, sizeof(drep), NULL, NULL);
		errno = ENOMEM;
		goto fail;
	}
	t->sync = t->own_chan = sync;
	*id = &t->id;
	return 0;
fail:
	if (sync) {
		int e = errno;
		rdma_destroy_event_channel(channel);
		errno = e;
	}
	return -1;
}

TP_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			     enum rdma_port_space ps)
{
	return create_id(channel, id, context, ps, qp_type_of(ps));
}

/* destroy_own_cqs destroys the CQs and channels the library made for the
 * ID's QP (rdma_create_qp without CQs), however far their making got. */
static void destroy_own_cqs(struct tp_id *t)
{
	struct rdma_cm_id *id = &t->id;
	if (!t->own_cqs)
		return;
	if (id->send_cq)
		ibv_destroy_cq(id->send_cq);
	if (id->recv_cq && id->recv_cq != id->send_cq)
		ibv_destroy_cq(id->recv_cq);
	if (id->send_cq_channel)
		ibv_destroy_comp_channel(id->send_cq_channel);
	if (id->recv_cq_channel && id->recv_cq_channel != id->send_cq_channel)
		ibv_destroy_comp_channel(id->recv_cq_channel);
	id->send_cq = id->recv_cq = NULL;
	id->send_cq_channel = id->recv_cq_channel = NULL;
	t->own_cqs = 0;
}

TP_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct tp_id *t = tp_id_of(id);
	struct taproce_cmid_request req = {.id = t->handle};
	struct taproce_cm_destroy_reply rep;
	if (tp_cm_call(t->chan, TAPROCE_OP_CM_DESTROY_ID, &req, sizeof(req), &rep, sizeof(rep), NULL, NULL) < 0)
		return -1;
	if (tp_cm_errno(rep.errnum) < 0)
		return -1;
	/* As librdmacm: wait until the events handed out are acknowledged. */
	pthread_mutex_lock(&t->mu);
	while (t->acked < t->gotten)
		pthread_cond_wait(&t->cond, &t->mu);
	pthread_mutex_unlock(&t->mu);
	destroy_own_cqs(t);
	struct rdma_event_channel *ch = t->own_chan ? id->channel : NULL;
	free_id(t);
	if (ch)
		rdma_destroy_event_channel(ch);
	return 0;
}

/* sockaddr_to and sockaddr_from convert between struct sockaddr and the
 * abi's SockAddr. */
static int sockaddr_to(const struct sockaddr *sa, struct taproce_sock_addr *out)
{
	memset(out, 0, sizeof(*out));
	if (sa == NULL)
		return 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		out->family = TAPROCE_AF_INET;
		out->port = ntohs(in->sin_port);
		out->addr[10] = out->addr[11] = 0xff;
		memcpy(out->addr + 12, &in->sin_addr, 4);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		out->family = TAPROCE_AF_INET6;
		out->port = ntohs(in6->sin6_port);
		out->scope_id = in6->sin6_scope_id;
		memcpy(out->addr, &in6->sin6_addr, 16);
		return 0;
	}
	errno = EAFNOSUPPORT;
	return -1;
}

static void sockaddr_from(const struct taproce_sock_addr *s, struct sockaddr_storage *out)
{
	memset(out, 0, sizeof(*out));
	if (s->family == TAPROCE_AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)out;
		in->sin_family = AF_INET;
		in->sin_port = htons(s->port);
		memcpy(&in->sin_addr, s->addr + 12, 4);
	} else if (s->family == TAPROCE_AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(s->port);
		in6->sin6_scope_id = s->scope_id;
		memcpy(&in6->sin6_addr, s->addr, 16);
	}
}

/* query fills the ID's addresses, device and path from the appliance. */
static int query(struct tp_id *t)
{
	struct taproce_cmid_request req = {.id = t->handle};
	struct taproce_cm_query_reply rep;
	if (tp_cm_call(t->chan, TAPROCE_OP_CM_QUERY, &req, sizeof(req), &rep, sizeof(rep), NULL, NULL) < 0 ||
	    tp_cm_errno(rep.errnum) < 0)
		return -1;
	struct rdma_cm_id *id = &t->id;
	if (rep.src.family)
		sockaddr_from(&rep.src, &id->route.addr.src_storage);
	if (rep.dst.family)
		sockaddr_from(&rep.dst, &id->route.addr.dst_storage);
	if (rep.device[0] == '\0')
		return 0;
	char name[sizeof(rep.device) + 1];
	memcpy(name, rep.device, sizeof(rep.device));
	name[sizeof(rep.device)] = '\0';
	if (id->verbs == NULL) {
		struct tp_dev *d = dev_named(name);
		if (d == NULL)
			return -1;
		id->verbs = d->ctx;
	}
	id->port_num = rep.port;
	memcpy(id->route.addr.addr.ibaddr.sgid.raw, rep.sgid, 16);
	memcpy(id->route.addr.addr.ibaddr.dgid.raw, rep.dgid, 16);
	id->route.addr.addr.ibaddr.pkey = htons(rep.pkey);
	struct ibv_sa_path_rec *p = &t->path;
	memset(p, 0, sizeof(*p));
	memcpy(p->sgid.raw, rep.sgid, 16);
	memcpy(p->dgid.raw, rep.dgid, 16);
	p->flow_label = htonl(rep.flow_label);
	p->hop_limit = rep.hop_limit;
	p->traffic_class = rep.tclass;
	p->reversible = 1;
	p->numb_path = 1;
	p->pkey = htons(rep.pkey);
	p->mtu_selector = 2; /* exactly */
	p->mtu = rep.path_mtu;
	p->rate_selector = 2;
	p->rate = 3; /* 10 Gb/s, as rxe's query says */
	p->packet_life_time_selector = 2;
	return 0;
}

/* path makes the route's path record, once the route is resolved. */
static int path(struct tp_id *t)
{
	if (t->id.route.path_rec == NULL) {
		t->id.route.path_rec = calloc(1, sizeof(struct ibv_sa_path_rec));
		if (t->id.route.path_rec == NULL)
			return -1;
	}
	*t->id.route.path_rec = t->path;
	t->id.route.num_paths = 1;
	return 0;
}

/* wait_event is what a synchronous ID's calls do: read its channel's next
 * event, which must be want, and acknowledge it. */
static int wait_event(struct tp_id *t, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(t->id.channel, &ev) < 0)
		return -1;
	int ok = ev->event == want && ev->status == 0;
	int status = ev->status;
	enum rdma_cm_event_type got = ev->event;
	rdma_ack_cm_event(ev);
	if (ok)
		return 0;
	if (got == RDMA_CM_EVENT_REJECTED)
		errno = ECONNREFUSED;
	else if (status < 0)
		errno = -status;
	else
		errno = ETIMEDOUT;
	return -1;
}

TP_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct tp_id *t = tp_id_of(id);
	struct taproce_cm_addr_request req = {.id = t->handle};
	if (addr == NULL) {
		errno = EINVAL;
		return -1;
	}
	if (sockaddr_to(addr, &req.src) < 0)
		return -1;
	if (id_call(t, TAPROCE_OP_CM_BIND, &req, sizeof(req)) < 0)
		return -1;
	return query(t);
}

TP_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
				int timeout_ms)
{
	struct tp_id *t = tp_id_of(id);
	struct taproce_cm_addr_request req = {.id = t->handle, .timeout_ms = timeout_ms > 0 ? (uint32_t)timeout_ms : 0};
	if (dst_addr == NULL) {
		errno = EINVAL;
		return -1;
	}
	if (sockaddr_to(src_addr, &req.src) < 0 || sockaddr_to(dst_addr, &req.dst) < 0)
		return -1;
	if (id_call(t, TAPROCE_OP_CM_RESOLVE_ADDR, &req, sizeof(req)) < 0)
		return -1;
	size_t len = dst_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	memcpy(&id->route.addr.dst_storage, dst_addr, len);
	return t->sync ? wait_event(t, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

TP_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct tp_id *t = tp_id_of(id);
	if (id_op(t, TAPROCE_OP_CM_RESOLVE_ROUTE, timeout_ms > 0 ? (uint32_t)timeout_ms : 0) < 0)
		return -1;
	return t->sync ? wait_event(t, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}

/* qp_attr asks the appliance for the attributes that take the ID's QP to
 * state (rdma_init_qp_attr). */
static int qp_attr(struct tp_id *t, enum ibv_qp_state state, struct ibv_qp_attr *attr, int *mask)
{
	struct taproce_cmid_request req = {.id = t->handle, .arg = (uint32_t)state};
	struct taproce_cm_init_qp_attr_reply rep;
	if (tp_cm_call(t->chan, TAPROCE_OP_CM_INIT_QP_ATTR, &req, sizeof(req), &rep, sizeof(rep), NULL, NULL) < 0 ||
	    tp_cm_errno(rep.errnum) < 0)
		return -1;
	memset(attr, 0, sizeof(*attr));
	const struct taproce_qp_attr *a = &rep.attr;
	attr->qp_state = (enum ibv_qp_state)a->state;
	attr->path_mtu = (enum ibv_mtu)a->path_mtu;
	attr->timeout = a->timeout;
	attr->retry_cnt = a->retry_cnt;
	attr->rnr_retry = a->rnr_retry;
	attr->min_rnr_timer = a->min_rnr_timer;
	attr->max_rd_atomic = a->max_rd_atomic;
	attr->max_dest_rd_atomic = a->max_dest_rd_atomic;
	attr->port_num = a->port;
	attr->pkey_index = a->pkey_index;
	attr->qp_access_flags = (int)a->access;
	attr->qkey = a->qkey;
	attr->dest_qp_num = a->dest_qpn;
	attr->rq_psn = a->rqpsn;
	attr->sq_psn = a->sqpsn;
	attr->ah_attr.is_global = 1;
	attr->ah_attr.port_num = a->port;
	attr->ah_attr.grh.sgid_index = a->sgid_index;
	attr->ah_attr.grh.hop_limit = a->hop_limit;
	attr->ah_attr.grh.traffic_class = t->tos_set ? t->tos : a->tclass;
	attr->ah_attr.grh.flow_label = a->flow_label;
	memcpy(attr->ah_attr.grh.dgid.raw, a->dgid, 16);
	*mask = (int)rep.mask;
	return 0;
}

TP_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr_out, int *qp_attr_mask)
{
	if (qp_attr_out == NULL || qp_attr_mask == NULL) {
		errno = EINVAL;
		return -1;
	}
	return qp_attr(tp_id_of(id), qp_attr_out->qp_state, qp_attr_out, qp_attr_mask);
}

/* modify moves the ID's QP to state with the appliance's attributes;
 * depth, when not negative, caps the RTS's max_rd_atomic (the initiator
 * depth the application asked for). */
static int modify(struct tp_id *t, enum ibv_qp_state state, int depth)
{
	struct ibv_qp_attr attr;
	int mask;
	attr.qp_state = state;
	if (qp_attr(t, state, &attr, &mask) < 0)
		return -1;
	if (depth >= 0 && (mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > depth)
		attr.max_rd_atomic = (uint8_t)depth;
	int r = ibv_modify_qp(t->id.qp, &attr, mask);
	if (r != 0) {
		errno = r;
		return -1;
	}
	return 0;
}

/* modify_rtr is librdmacm's ucma_modify_qp_rtr: INIT again first, for the
 * access flags the connection's responder resources allow (the QP was
 * made before the peer said), then RTR. */
static int modify_rtr(struct tp_id *t)
{
	if (modify(t, IBV_QPS_INIT, -1) < 0)
		return -1;
	return modify(t, IBV_QPS_RTR, -1);
}

static int modify_err(struct tp_id *t)
{
	if (t->id.qp == NULL)
		return 0;
	struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
	int r = ibv_modify_qp(t->id.qp, &attr, IBV_QP_STATE);
	if (r != 0) {
		errno = r;
		return -1;
	}
	return 0;
}

/* init_qp takes a new QP where librdmacm's ucma_init_conn_qp and
 * ucma_init_ud_qp do: a connected QP to INIT, a UD QP to RTS. */
static int init_qp(struct tp_id *t)
{
	if (modify(t, IBV_QPS_INIT, -1) < 0)
		return -1;
	if (t->id.qp_type != IBV_QPT_UD)
		return 0;
	if (modify(t, IBV_QPS_RTR, -1) < 0)
		return -1;
	return modify(t, IBV_QPS_RTS, -1);
}

TP_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	struct tp_id *t = tp_id_of(id);
	if (id->verbs == NULL || attr == NULL) {
		errno = EINVAL;
		return -1;
	}
	if (attr->comp_mask & IBV_QP_INIT_ATTR_PD) {
		if (attr->pd->context != id->verbs) {
			errno = EINVAL;
			return -1;
		}
	} else {
		attr->pd = id->pd ? id->pd : default_pd(id->verbs);
		if (attr->pd == NULL)
			return -1;
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	int made_cqs = 0;
	if (attr->send_cq == NULL || attr->recv_cq == NULL) {
		/* librdmacm's ucma_create_cqs: a channel and a CQ each way. */
		if (id->recv_cq == NULL) {
			made_cqs = 1;
			t->own_cqs = 1;
			id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
			if (id->recv_cq_channel == NULL)
				goto fail;
			id->recv_cq = ibv_create_cq(id->verbs, (int)(attr->cap.max_recv_wr ? attr->cap.max_recv_wr : 1),
						    id, id->recv_cq_channel, 0);
			if (id->recv_cq == NULL)
				goto fail;
			id->send_cq_channel = ibv_create_comp_channel(id->verbs);
			if (id->send_cq_channel == NULL)
				goto fail;
			id->send_cq = ibv_create_cq(id->verbs, (int)(attr->cap.max_send_wr ? attr->cap.max_send_wr : 1),
						    id, id->send_cq_channel, 0);
			if (id->send_cq == NULL)
				goto fail;
		}
		if (attr->send_cq == NULL)
			attr->send_cq = id->send_cq;
		if (attr->recv_cq == NULL)
			attr->recv_cq = id->recv_cq;
	}
	if (attr->srq == NULL && id->srq)
		attr->srq = id->srq;
	attr->qp_type = id->qp_type;
	struct ibv_qp *qp = ibv_create_qp_ex(id->verbs, attr);
	if (qp == NULL)
		goto fail;
	id->qp = qp;
	id->pd = attr->pd;
	if (init_qp(t) < 0) {
		int e = errno;
		ibv_destroy_qp(qp);
		id->qp = NULL;
		errno = e;
		goto fail;
	}
	return 0;
fail:
	if (made_cqs) {
		int e = errno;
		destroy_own_cqs(t);
		errno = e;
	}
	return -1;
}

TP_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	if (qp_init_attr == NULL) {
		errno = EINVAL;
		return -1;
	}
	struct ibv_qp_init_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
	if (pd) {
		ex.pd = pd;
		ex.comp_mask |= IBV_QP_INIT_ATTR_PD;
	}
	if (rdma_create_qp_ex(id, &ex) < 0)
		return -1;
	qp_init_attr->send_cq = ex.send_cq;
	qp_init_attr->recv_cq = ex.recv_cq;
	qp_init_attr->cap = ex.cap;
	return 0;
}

TP_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	if (id->qp) {
		ibv_destroy_qp(id->qp);
		id->qp = NULL;
	}
}

/* conn_param fills the abi's connection parameters from the application's
 * (librdmacm's ucma_copy_conn_param_to_kern), with the ID's QP when it has
 * one. */
static int conn_param(struct tp_id *t, const struct rdma_conn_param *p, struct taproce_cm_conn_param *out, int accept)
{
	memset(out, 0, sizeof(*out));
	out->retry_count = 7;
	out->rnr_retry_count = 7;
	if (p) {
		out->responder_resources = p->responder_resources;
		out->initiator_depth = p->initiator_depth;
		out->flow_control = p->flow_control;
		out->retry_count = p->retry_count;
		out->rnr_retry_count = p->rnr_retry_count;
		out->srq = p->srq;
		out->qpn = p->qp_num;
		if (p->private_data_len) {
			if (p->private_data == NULL || p->private_data_len > sizeof(out->private_data)) {
				errno = EINVAL;
				return -1;
			}
			memcpy(out->private_data, p->private_data, p->private_data_len);
			out->private_data_len = p->private_data_len;
		}
	} else if (accept) {
		/* librdmacm's rdma_accept without parameters: the request's
		 * resources, as its event gave them. */
		out->responder_resources = t->req_resp_res;
		out->initiator_depth = t->req_init_depth;
	} else {
		/* rdma_connect without: as much as the device takes. */
		out->responder_resources = out->initiator_depth = 0xff;
	}
	if (t->id.qp) {
		out->qpn = t->id.qp->qp_num;
		out->srq = t->id.qp->srq != NULL;
	}
	if (t->id.verbs) {
		struct ibv_device_attr da;
		if (ibv_query_device(t->id.verbs, &da) == 0) {
			if (out->responder_resources > da.max_qp_rd_atom)
				out->responder_resources = (uint8_t)da.max_qp_rd_atom;
			if (out->initiator_depth > da.max_qp_init_rd_atom)
				out->initiator_depth = (uint8_t)da.max_qp_init_rd_atom;
		}
	}
	return 0;
}

TP_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct tp_id *t = tp_id_of(id);
	struct taproce_cm_connect_request req = {.id = t->handle};
	if (conn_param(t, p, &req.param, 0) < 0)
		return -1;
	if (id->qp_type == IBV_QPT_UD && p && p->private_data_len > 180) {
		errno = EINVAL;
		return -1;
	}
	if (id_call(t, TAPROCE_OP_CM_CONNECT, &req, sizeof(req)) < 0)
		return -1;
	return t->sync ? wait_event(t, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

TP_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	return id_op(tp_id_of(id), TAPROCE_OP_CM_ESTABLISH, 0);
}

TP_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct tp_id *t = tp_id_of(id);
	if (id_op(t, TAPROCE_OP_CM_LISTEN, backlog > 0 ? (uint32_t)backlog : 0) < 0)
		return -1;
	return query(t);
}

TP_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct tp_id *t = tp_id_of(id);
	struct taproce_cm_connect_request req = {.id = t->handle};
	if (conn_param(t, p, &req.param, 1) < 0)
		return -1;
	if (id->qp && id->qp_type != IBV_QPT_UD) {
		/* librdmacm's rdma_accept: RTR and RTS before the REP. */
		if (modify_rtr(t) < 0 || modify(t, IBV_QPS_RTS, req.param.initiator_depth) < 0) {
			int e = errno;
			rdma_reject(id, NULL, 0);
			errno = e;
			return -1;
		}
	}
	if (id->qp && id->qp_type == IBV_QPT_UD)
		req.param.qkey = RDMA_UDP_QKEY;
	if (id_call(t, TAPROCE_OP_CM_ACCEPT, &req, sizeof(req)) < 0) {
		int e = errno;
		modify_err(t);
		errno = e;
		return -1;
	}
	if (t->sync && id->qp_type != IBV_QPT_UD)
		return wait_event(t, RDMA_CM_EVENT_ESTABLISHED);
	return 0;
}

TP_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	struct tp_id *t = tp_id_of(id);
	struct taproce_cm_connect_request req = {.id = t->handle};
	if (private_data_len) {
		if (private_data == NULL || private_data_len > sizeof(req.param.private_data)) {
			errno = EINVAL;
			return -1;
		}
		memcpy(req.param.private_data, private_data, private_data_len);
		req.param.private_data_len = private_data_len;
	}
	return id_call(t, TAPROCE_OP_CM_REJECT, &req, sizeof(req));
}

TP_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

TP_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct tp_id *t = tp_id_of(id);
	if (modify_err(t) < 0)
		return -1;
	return id_op(t, TAPROCE_OP_CM_DISCONNECT, 0);
}

/* conn_resp is librdmacm's ucma_process_conn_resp: the active side's QP
 * goes to RTR and RTS, then the RTU; a failure rejects the connection. */
static int conn_resp(struct tp_id *t, uint8_t depth)
{
	if (modify_rtr(t) < 0 || modify(t, IBV_QPS_RTS, depth) < 0 ||
	    id_op(t, TAPROCE_OP_CM_ESTABLISH, 0) < 0) {
		int e = errno;
		rdma_reject(&t->id, NULL, 0);
		errno = e;
		return -1;
	}
	return 0;
}

TP_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct tp_channel *c = (struct tp_channel *)channel;
	if (event == NULL) {
		errno = EINVAL;
		return -1;
	}
	for (;;) {
		uint8_t buf[sizeof(struct taproce_header) + sizeof(struct taproce_cm_event)];
		ssize_t n;
		atomic_fetch_add(&c->readers, 1);
		n = recv(c->ch.fd, buf, sizeof(buf), 0);
		if (n <= 0 && atomic_load(&c->closing)) {
			/* The channel was destroyed under this read. ucma's read
			 * then blocks until the process ends; so does this one,
			 * rather than report an error the program never expects. */
			for (;;)
				pause();
		}
		atomic_fetch_sub(&c->readers, 1);
		if (n < 0)
			return -1; /* EAGAIN on a non-blocking channel, EINTR on a signal, as librdmacm */
		if (n == 0) {
			errno = ENODEV; /* the appliance is gone */
			return -1;
		}
		struct taproce_header h;
		struct taproce_cm_event e;
		if ((size_t)n != sizeof(buf)) {
			errno = EIO;
			return -1;
		}
		memcpy(&h, buf, sizeof(h));
		memcpy(&e, buf + sizeof(h), sizeof(e));
		if (h.magic != TAPROCE_ABI_MAGIC || h.op != TAPROCE_OP_CM_EVENT || !(h.flags & TAPROCE_FLAG_EVENT)) {
			errno = EIO;
			return -1;
		}
		struct tp_event *ev = calloc(1, sizeof(*ev));
		if (ev == NULL)
			return -1;
		struct tp_id *t;
		if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct tp_id *l = find_id(c, e.listener);
			if (l == NULL) {
				free(ev);
				continue;
			}
			t = new_id(c, e.id, l->id.context, l->id.ps, l->id.qp_type);
			if (t == NULL) {
				free(ev);
				return -1;
			}
			if (query(t) < 0) {
				struct taproce_cmid_request d = {.id = e.id};
				struct taproce_cm_destroy_reply drep;
				tp_cm_call(c, TAPROCE_OP_CM_DESTROY_ID, &d, sizeof(d), &drep, sizeof(drep), NULL, NULL);
				free_id(t);
				free(ev);
				continue;
			}
			path(t);
			ev->ev.listen_id = &l->id;
		} else if ((t = find_id(c, e.id)) == NULL) {
			free(ev);
			continue; /* destroyed meanwhile */
		}
		ev->ev.id = &t->id;
		ev->ev.event = (enum rdma_cm_event_type)e.event;
		ev->ev.status = e.status;
		memcpy(ev->private_data, e.param.private_data, sizeof(ev->private_data));
		switch (e.event) {
		case RDMA_CM_EVENT_ADDR_RESOLVED:
			if (query(t) < 0) {
				ev->ev.event = RDMA_CM_EVENT_ADDR_ERROR;
				ev->ev.status = -errno;
			}
			break;
		case RDMA_CM_EVENT_ROUTE_RESOLVED:
			if (query(t) < 0 || path(t) < 0) {
				ev->ev.event = RDMA_CM_EVENT_ROUTE_ERROR;
				ev->ev.status = -errno;
			}
			break;
		case RDMA_CM_EVENT_CONNECT_RESPONSE:
			if (t->id.qp) {
				if (conn_resp(t, e.param.initiator_depth) < 0) {
					ev->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
					ev->ev.status = -errno;
				} else {
					ev->ev.event = RDMA_CM_EVENT_ESTABLISHED;
				}
			}
			break;
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_CONNECT_ERROR:
			modify_err(t);
			break;
		default:
			break;
		}
		if (t->id.qp_type == IBV_QPT_UD &&
		    (e.event == RDMA_CM_EVENT_ESTABLISHED || e.event == RDMA_CM_EVENT_CONNECT_REQUEST)) {
			struct rdma_ud_param *ud = &ev->ev.param.ud;
			ud->private_data = ev->private_data;
			ud->private_data_len = e.param.private_data_len;
			ud->qp_num = e.param.qpn;
			ud->qkey = e.param.qkey;
			ud->ah_attr.is_global = 1;
			ud->ah_attr.port_num = 1;
			memcpy(ud->ah_attr.grh.dgid.raw, e.dgid, 16);
			ud->ah_attr.grh.flow_label = e.flow_label;
			ud->ah_attr.grh.hop_limit = e.hop_limit;
			ud->ah_attr.grh.traffic_class = e.tclass;
			for (int i = 0; t->id.verbs && i < 16; i++) {
				union ibv_gid g;
				if (ibv_query_gid(t->id.verbs, 1, i, &g) != 0)
					break;
				if (memcmp(g.raw, t->id.route.addr.addr.ibaddr.sgid.raw, 16) == 0) {
					ud->ah_attr.grh.sgid_index = (uint8_t)i;
					break;
				}
			}
		} else {
			struct rdma_conn_param *cp = &ev->ev.param.conn;
			cp->private_data = e.param.private_data_len ? ev->private_data : NULL;
			cp->private_data_len = e.param.private_data_len;
			cp->responder_resources = e.param.responder_resources;
			cp->initiator_depth = e.param.initiator_depth;
			cp->flow_control = e.param.flow_control;
			cp->retry_count = e.param.retry_count;
			cp->rnr_retry_count = e.param.rnr_retry_count;
			cp->srq = e.param.srq;
			cp->qp_num = e.param.qpn;
			if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
				t->req_resp_res = e.param.responder_resources;
				t->req_init_depth = e.param.initiator_depth;
			}
		}
		pthread_mutex_lock(&t->mu);
		t->gotten++;
		pthread_mutex_unlock(&t->mu);
		t->id.event = &ev->ev;
		*event = &ev->ev;
		return 0;
	}
}

TP_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (event == NULL) {
		errno = EINVAL;
		return -1;
	}
	struct tp_id *t = tp_id_of(event->id);
	pthread_mutex_lock(&t->mu);
	t->acked++;
	if (t->id.event == event)
		t->id.event = NULL;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->mu);
	free(event);
	return 0;
}

TP_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const names[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED",	  "RDMA_CM_EVENT_ADDR_ERROR",	    "RDMA_CM_EVENT_ROUTE_RESOLVED",
		"RDMA_CM_EVENT_ROUTE_ERROR",	  "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR",	  "RDMA_CM_EVENT_UNREACHABLE",	    "RDMA_CM_EVENT_REJECTED",
		"RDMA_CM_EVENT_ESTABLISHED",	  "RDMA_CM_EVENT_DISCONNECTED",    "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN",	  "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
		"RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((unsigned)event < sizeof(names) / sizeof(names[0]))
		return names[event];
	return "UNKNOWN EVENT";
}

TP_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	struct sockaddr *sa = &id->route.addr.src_addr;
	if (sa->sa_family == AF_INET)
		return ((struct sockaddr_in *)sa)->sin_port;
	if (sa->sa_family == AF_INET6)
		return ((struct sockaddr_in6 *)sa)->sin6_port;
	return 0;
}

TP_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	struct sockaddr *sa = &id->route.addr.dst_addr;
	if (sa->sa_family == AF_INET)
		return ((struct sockaddr_in *)sa)->sin_port;
	if (sa->sa_family == AF_INET6)
		return ((struct sockaddr_in6 *)sa)->sin6_port;
	return 0;
}

TP_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	struct tp_id *t = tp_id_of(id);
	if (level != RDMA_OPTION_ID || optval == NULL) {
		/* RDMA_OPTION_IB_PATH: RoCE takes no path records from the user. */
		errno = level == RDMA_OPTION_IB ? ENOSYS : EINVAL;
		return -1;
	}
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		if (optlen != sizeof(uint8_t))
			break;
		t->tos = *(uint8_t *)optval;
		t->tos_set = 1;
		return 0;
	case RDMA_OPTION_ID_REUSEADDR:
	case RDMA_OPTION_ID_AFONLY:
		if (optlen != sizeof(int))
			break;
		return 0; /* the appliance's ports are per listener, reused once free */
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (optlen != sizeof(uint8_t))
			break;
		return 0;
	}
	errno = EINVAL;
	return -1;
}

/* rdma_notify passes the QP's async event to the connection manager, as
 * ucma's NOTIFY: IBV_EVENT_COMM_EST establishes a connection whose RTU is
 * lost (EISCONN once it is established), IBV_EVENT_LID_CHANGE is taken,
 * anything else is EINVAL — the appliance answers as Linux's CM. */
TP_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	return id_op(tp_id_of(id), TAPROCE_OP_CM_NOTIFY, (uint32_t)event);
}

/* rdma_migrate_id moves the ID to channel (NULL: a channel of its own,
 * the ID then synchronous), as librdmacm's does: the request goes on the
 * new channel's connection and names the old channel by its fd, as
 * ucma's MIGRATE_ID does; the appliance moves the ID, its connection and
 * its queued events, and gives its new handle. Then, as librdmacm, the
 * ID's own old channel goes, and the call waits until the events the old
 * channel reported for the ID are acknowledged. */
TP_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct tp_id *t = tp_id_of(id);
	int sync = channel == NULL;
	if (sync && (channel = rdma_create_event_channel()) == NULL)
		return -1;
	struct tp_channel *to = (struct tp_channel *)channel, *from = t->chan;
	struct taproce_cmid_request req = {.id = t->handle};
	struct taproce_cm_migrate_reply rep;
	pthread_mutex_lock(&to->mu);
	int r = tp_call_sock(to->sock, &to->seq, TAPROCE_OP_CM_MIGRATE_ID, &req, sizeof(req), &rep, sizeof(rep),
			     &from->ch.fd, 1, NULL, NULL);
	int e = errno;
	pthread_mutex_unlock(&to->mu);
	errno = e;
	if (r < 0 || tp_cm_errno(rep.errnum) < 0) {
		e = errno;
		if (sync)
			rdma_destroy_event_channel(channel);
		errno = e;
		return -1;
	}
	if (to != from) {
		pthread_mutex_lock(&from->mu);
		for (struct tp_id **p = &from->ids; *p; p = &(*p)->next)
			if (*p == t) {
				*p = t->next;
				break;
			}
		pthread_mutex_unlock(&from->mu);
		pthread_mutex_lock(&to->mu);
		t->handle = rep.id;
		t->chan = to;
		t->next = to->ids;
		to->ids = t;
		pthread_mutex_unlock(&to->mu);
	}
	if (t->own_chan && to != from) {
		if (id->event) {
			rdma_ack_cm_event(id->event);
			id->event = NULL;
		}
		rdma_destroy_event_channel(&from->ch);
	}
	pthread_mutex_lock(&t->mu);
	t->sync = t->own_chan = sync;
	id->channel = channel;
	while (t->acked < rep.events_reported)
		pthread_cond_wait(&t->cond, &t->mu);
	pthread_mutex_unlock(&t->mu);
	return 0;
}

TP_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (ece == NULL) {
		errno = EINVAL;
		return -1;
	}
	tp_id_of(id)->ece = *ece;
	return 0;
}

TP_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id;
	if (ece == NULL) {
		errno = EINVAL;
		return -1;
	}
	memset(ece, 0, sizeof(*ece)); /* no ECE from the peer, as with rxe */
	return 0;
}

/* The synchronous endpoint API of rdma_verbs.h's users (rdma_server,
 * rdma_client). */

TP_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr)
{
	if (id == NULL || res == NULL) {
		errno = EINVAL;
		return -1;
	}
	struct rdma_cm_id *cid;
	enum rdma_port_space ps = res->ai_port_space ? (enum rdma_port_space)res->ai_port_space : RDMA_PS_TCP;
	enum ibv_qp_type qt = res->ai_qp_type ? (enum ibv_qp_type)res->ai_qp_type : qp_type_of(ps);
	if (create_id(NULL, &cid, NULL, ps, qt) < 0)
		return -1;
	struct tp_id *t = tp_id_of(cid);
	if (res->ai_flags & RAI_PASSIVE) {
		if (rdma_bind_addr(cid, res->ai_src_addr) < 0)
			goto fail;
		if (qp_init_attr) {
			t->qp_init = malloc(sizeof(*qp_init_attr));
			if (t->qp_init == NULL)
				goto fail;
			*t->qp_init = *qp_init_attr;
		}
		cid->pd = pd;
		*id = cid;
		return 0;
	}
	if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) < 0 || rdma_resolve_route(cid, 2000) < 0)
		goto fail;
	if (qp_init_attr && rdma_create_qp(cid, pd, qp_init_attr) < 0)
		goto fail;
	*id = cid;
	return 0;
fail : {
	int e = errno;
	rdma_destroy_id(cid);
	errno = e;
	return -1;
}
}

TP_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

TP_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct tp_id *l = tp_id_of(listen);
	if (!l->sync) {
		errno = EINVAL;
		return -1;
	}
	struct rdma_cm_event *ev;
	for (;;) {
		if (rdma_get_cm_event(listen->channel, &ev) < 0)
			return -1;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		rdma_ack_cm_event(ev);
	}
	struct rdma_cm_id *cid = ev->id;
	struct tp_id *t = tp_id_of(cid);
	rdma_ack_cm_event(ev);
	/* The new ID is synchronous too (rdma_accept waits for ESTABLISHED);
	 * it stays on the listener's channel, which it does not own. */
	t->sync = 1;
	cid->pd = listen->pd;
	if (l->qp_init) {
		struct ibv_qp_init_attr a = *l->qp_init;
		if (rdma_create_qp(cid, listen->pd, &a) < 0)
			goto fail;
	}
	*id = cid;
	return 0;
fail : {
	int e = errno;
	rdma_reject(cid, NULL, 0);
	rdma_destroy_id(cid);
	errno = e;
	return -1;
}
}

TP_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	(void)id;
	(void)attr;
	errno = EOPNOTSUPP; /* ibv_create_srq_ex: taproce's libibverbs has none */
	return -1;
}

TP_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (id->verbs == NULL || attr == NULL) {
		errno = EINVAL;
		return -1;
	}
	if (pd == NULL && (pd = id->pd ? id->pd : default_pd(id->verbs)) == NULL)
		return -1;
	struct ibv_srq *srq = ibv_create_srq(pd, attr);
	if (srq == NULL)
		return -1;
	id->srq = srq;
	id->pd = pd;
	return 0;
}

TP_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (id->srq) {
		ibv_destroy_srq(id->srq);
		id->srq = NULL;
	}
}
