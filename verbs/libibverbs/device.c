/* Devices and contexts: what the appliance serves this process, opening
 * one, and what it reports of itself (ibv_query_device, _port, _gid). */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "taproce.h"

#undef ibv_query_port
#undef ibv_get_device_list

static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tp_device *devices; /* every device listed so far, never freed */

/* warn_no_appliance says once why there is no device, as libibverbs
 * warns of what keeps it from a device. */
static void warn_no_appliance(int err)
{
	static atomic_int warned;
	if (atomic_exchange(&warned, 1) || getenv("TAPROCE_QUIET") != NULL)
		return;
	const char *path = getenv(TAPROCE_SOCKET_ENV);
	if (path == NULL || path[0] == '\0')
		path = TAPROCE_DEFAULT_SOCKET;
	fprintf(stderr, "libibverbs (taproce): no appliance at %s (%s); start one with `taproce run`, or set %s\n", path,
		strerror(err), TAPROCE_SOCKET_ENV);
}

static struct tp_device *device_named(const char *name)
{
	for (struct tp_device *d = devices; d; d = d->next)
		if (strcmp(d->dev.name, name) == 0)
			return d;
	return NULL;
}

TP_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	if (num_devices)
		*num_devices = 0;
	int s = tp_connect();
	if (s < 0) {
		/* No appliance is what no kernel RDMA is to rdma-core's library:
		 * no list, ENOSYS. */
		warn_no_appliance(errno);
		errno = ENOSYS;
		return NULL;
	}
	struct taproce_list_devices_reply *rep = malloc(sizeof(*rep));
	if (rep == NULL) {
		close(s);
		errno = ENOMEM;
		return NULL;
	}
	uint32_t seq = 0;
	int r = tp_call_sock(s, &seq, TAPROCE_OP_LIST_DEVICES, NULL, 0, rep, sizeof(*rep), NULL, 0, NULL, NULL);
	close(s);
	if (r < 0 || rep->errnum != 0) {
		int e = r < 0 ? errno : rep->errnum;
		free(rep);
		errno = e == EIO ? ENOSYS : e;
		return NULL;
	}
	uint32_t count = rep->count < TAPROCE_MAX_DEVICES ? rep->count : TAPROCE_MAX_DEVICES;
	struct ibv_device **list = calloc(count + 1, sizeof(*list));
	if (list == NULL) {
		free(rep);
		errno = ENOMEM;
		return NULL;
	}
	int n = 0;
	pthread_mutex_lock(&devices_mu);
	for (uint32_t i = 0; i < count; i++) {
		struct taproce_device *ad = &rep->devices[i];
		char name[sizeof(ad->name) + 1];
		memcpy(name, ad->name, sizeof(ad->name));
		name[sizeof(ad->name)] = '\0';
		if (!ad->usable || name[0] == '\0')
			continue; /* another namespace's: not this process's to open */
		struct tp_device *d = device_named(name);
		if (d == NULL) {
			d = calloc(1, sizeof(*d));
			if (d == NULL)
				break;
			d->dev.node_type = IBV_NODE_CA;
			d->dev.transport_type = IBV_TRANSPORT_IB;
			snprintf(d->dev.name, sizeof(d->dev.name), "%s", name);
			snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", n);
			snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/%s", d->dev.dev_name);
			snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s", name);
			d->next = devices;
			devices = d;
		}
		d->guid = ad->node_guid;
		d->usable = 1;
		list[n++] = &d->dev;
	}
	pthread_mutex_unlock(&devices_mu);
	free(rep);
	if (num_devices)
		*num_devices = n;
	return list;
}
TP_DEFAULT_VERSION(ibv_get_device_list, "IBVERBS_1.1");

TP_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

TP_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}
TP_DEFAULT_VERSION(ibv_get_device_name, "IBVERBS_1.1");
TP_DEFAULT_VERSION(ibv_free_device_list, "IBVERBS_1.1");

TP_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return htobe64(tp_container_of(device, struct tp_device, dev)->guid);
}
TP_DEFAULT_VERSION(ibv_get_device_guid, "IBVERBS_1.1");

TP_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	int i = 0;
	pthread_mutex_lock(&devices_mu);
	for (struct tp_device *d = devices; d; d = d->next, i++)
		if (&d->dev == device)
			break;
	pthread_mutex_unlock(&devices_mu);
	/* The appliance names its devices taproce0, taproce1, …: the number
	 * is the index, as a kernel's device index is stable. */
	int idx;
	if (sscanf(device->name, "taproce%d", &idx) == 1)
		return idx;
	return i;
}


/* watch waits for the end of the event socket — the appliance gone — or
 * for ibv_close_device, so that a program asleep on a completion channel
 * or spinning on a CQ learns of the death at once (tp_device_died). */
static void *watch(void *arg)
{
	struct tp_context *c = arg;
	struct pollfd p[2] = {{.fd = c->vctx.context.async_fd, .events = POLLRDHUP}, {.fd = c->stop_fd, .events = POLLIN}};
	for (;;) {
		int n = poll(p, 2, -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || p[1].revents != 0 || (p[0].revents & POLLNVAL))
			return NULL;
		if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
			tp_device_died(c);
			return NULL;
		}
	}
}

/* start_watcher starts the context's watcher thread, with every signal
 * blocked: the program's signals are not the library's to take. */
static int start_watcher(struct tp_context *c)
{
	c->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (c->stop_fd < 0)
		return -1;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int e = pthread_create(&c->watcher, NULL, watch, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e != 0) {
		close(c->stop_fd);
		errno = e;
		return -1;
	}
	return 0;
}

void tp_device_died(struct tp_context *c)
{
	atomic_store(&c->dead, 1);
	static const uint64_t one = 1;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nhandles; i++) {
		if (c->handles[i].kind != TP_CHANNEL)
			continue;
		struct tp_comp_channel *ch = c->handles[i].obj;
		ssize_t n;
		do
			n = write(ch->ch.fd, &one, sizeof(one));
		while (n < 0 && errno == EINTR);
	}
	pthread_mutex_unlock(&c->mu);
}

TP_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct tp_context *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	c->sock = tp_connect();
	if (c->sock < 0) {
		int e = errno;
		free(c);
		errno = (e == ENOENT || e == ECONNREFUSED) ? ENODEV : e;
		return NULL;
	}
	pthread_mutex_init(&c->mu, NULL);
	struct taproce_open_request req = {.flags = 1 /* abi.OpenEventSocket */};
	size_t nlen = strnlen(device->name, sizeof(req.name) - 1);
	memcpy(req.name, device->name, nlen);
	struct taproce_open_reply rep;
	int fds[2], nfds = 2;
	if (tp_call_sock(c->sock, &c->seq, TAPROCE_OP_OPEN, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, fds, &nfds) < 0)
		goto fail;
	if (rep.errnum != 0) {
		errno = rep.errnum;
		goto closefds;
	}
	if (nfds != 2) {
		errno = EIO;
		goto closefds;
	}
	c->kick_fd = fds[0];
	c->attr = rep.device;
	c->port = rep.port;

	struct verbs_context *v = &c->vctx;
	struct ibv_context *ctx = &v->context;
	v->sz = sizeof(*v);
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->device = device;
	ctx->cmd_fd = c->sock;
	ctx->async_fd = fds[1];
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->ops.poll_cq = tp_poll_cq;
	ctx->ops.req_notify_cq = tp_req_notify_cq;
	ctx->ops.post_send = tp_post_send;
	ctx->ops.post_recv = tp_post_recv;
	ctx->ops.post_srq_recv = tp_post_srq_recv;
	v->query_port = tp_query_port_ex;
	v->query_device_ex = tp_query_device_ex;
	v->create_qp_ex = tp_create_qp_ex;
	v->create_cq_ex = tp_create_cq_ex;
	if (start_watcher(c) != 0) {
		int e = errno;
		close(fds[0]);
		close(fds[1]);
		close(c->sock);
		pthread_mutex_destroy(&ctx->mutex);
		pthread_mutex_destroy(&c->mu);
		free(c);
		errno = e;
		return NULL;
	}
	return ctx;
closefds:
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
fail:
	{
		int e = errno;
		close(c->sock);
		pthread_mutex_destroy(&c->mu);
		free(c);
		errno = e;
	}
	return NULL;
}
TP_DEFAULT_VERSION(ibv_open_device, "IBVERBS_1.1");

TP_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct tp_context *c = tp_ctx(context);
	static const uint64_t one = 1;
	if (write(c->stop_fd, &one, sizeof(one)) == sizeof(one))
		pthread_join(c->watcher, NULL);
	close(c->stop_fd);
	/* The appliance tears down what the connection made. */
	close(c->sock);
	close(c->kick_fd);
	close(context->async_fd);
	for (unsigned i = 0; i < 64; i++)
		tp_qp_free(c->graves[i]);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&context->mutex);
	free(c->handles);
	free(c);
	return 0;
}
TP_DEFAULT_VERSION(ibv_close_device, "IBVERBS_1.1");

TP_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
	struct tp_context *c = tp_ctx(context);
	struct taproce_device_attr *d = &c->attr;
	memset(a, 0, sizeof(*a));
	size_t n = strnlen((const char *)d->fw_ver, sizeof(d->fw_ver));
	memcpy(a->fw_ver, d->fw_ver, n < sizeof(a->fw_ver) - 1 ? n : sizeof(a->fw_ver) - 1);
	a->node_guid = htobe64(d->node_guid);
	a->sys_image_guid = htobe64(d->sys_image_guid);
	a->max_mr_size = d->max_mr_size;
	a->page_size_cap = d->page_size_cap;
	a->vendor_id = d->vendor_id;
	a->vendor_part_id = d->vendor_part_id;
	a->hw_ver = d->hw_ver;
	a->max_qp = (int)d->max_qp;
	a->max_qp_wr = (int)d->max_qp_wr;
	a->device_cap_flags = d->device_cap_flag;
	a->max_sge = (int)d->max_sge;
	a->max_sge_rd = (int)d->max_sge;
	a->max_cq = (int)d->max_cq;
	a->max_cqe = (int)d->max_cqe;
	a->max_mr = (int)d->max_mr;
	a->max_pd = (int)d->max_pd;
	a->max_qp_rd_atom = (int)d->max_qp_rd_atom;
	a->max_res_rd_atom = (int)(d->max_qp_rd_atom * d->max_qp);
	a->max_qp_init_rd_atom = (int)d->max_qp_init_rd;
	a->atomic_cap = (enum ibv_atomic_cap)d->atomic_cap;
	a->max_ah = (int)d->max_ah;
	a->max_srq = (int)d->max_srq;
	a->max_srq_wr = (int)d->max_srq_wr;
	a->max_srq_sge = (int)d->max_srq_sge;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15; /* rxe's */
	a->phys_port_cnt = d->phys_port_cnt;
	return 0;
}
TP_DEFAULT_VERSION(ibv_query_device, "IBVERBS_1.1");

int tp_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *in,
		       struct ibv_device_attr_ex *attr, size_t len)
{
	if (in && in->comp_mask)
		return EINVAL;
	if (len < sizeof(attr->orig_attr))
		return EINVAL;
	struct ibv_device_attr_ex ex;
	memset(&ex, 0, sizeof(ex));
	ibv_query_device(context, &ex.orig_attr);
	ex.device_cap_flags_ex = ex.orig_attr.device_cap_flags;
	memcpy(attr, &ex, len < sizeof(ex) ? len : sizeof(ex));
	return 0;
}

static int refresh_port(struct tp_context *c)
{
	struct taproce_query_port_reply rep;
	if (tp_call(c, TAPROCE_OP_QUERY_PORT, NULL, 0, &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		return errno;
	if (rep.errnum != 0)
		return tp_errno(rep.errnum);
	pthread_mutex_lock(&c->mu);
	c->port = rep.port;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

static void fill_port(const struct taproce_port_attr *p, struct ibv_port_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->state = (enum ibv_port_state)p->state;
	a->max_mtu = (enum ibv_mtu)p->max_mtu;
	a->active_mtu = (enum ibv_mtu)p->active_mtu;
	a->gid_tbl_len = (int)p->gid_tbl_len;
	a->port_cap_flags = p->port_cap_flags;
	a->max_msg_sz = p->max_msg_sz;
	a->pkey_tbl_len = p->pkey_tbl_len;
	a->lid = p->lid;
	a->max_vl_num = 1;
	a->active_width = p->active_width;
	a->active_speed = p->active_speed;
	a->phys_state = p->phys_state;
	a->link_layer = p->link_layer;
}

int tp_query_port_ex(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	struct tp_context *c = tp_ctx(context);
	if (port != 1)
		return EINVAL;
	int e = refresh_port(c);
	if (e)
		return e;
	struct ibv_port_attr a;
	pthread_mutex_lock(&c->mu);
	fill_port(&c->port, &a);
	pthread_mutex_unlock(&c->mu);
	memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

/* ibv_query_port is the compat entry of programs built before the
 * extended one (the header's macro calls tp_query_port_ex): the layout
 * is struct ibv_port_attr's, the caller's struct as large. */
TP_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *port_attr)
{
	return tp_query_port_ex(context, port_num, (struct ibv_port_attr *)port_attr, sizeof(struct ibv_port_attr));
}
TP_DEFAULT_VERSION(ibv_query_port, "IBVERBS_1.1");

static int gid_at(struct tp_context *c, uint8_t port, int index, union ibv_gid *gid, uint8_t *type)
{
	if (port != 1 || index < 0) {
		errno = EINVAL;
		return -1;
	}
	int e = refresh_port(c);
	if (e) {
		errno = e;
		return -1;
	}
	pthread_mutex_lock(&c->mu);
	uint32_t n = c->port.num_gids < TAPROCE_MAX_GIDS ? c->port.num_gids : TAPROCE_MAX_GIDS;
	if ((uint32_t)index >= c->port.gid_tbl_len) {
		pthread_mutex_unlock(&c->mu);
		errno = EINVAL;
		return -1;
	}
	if ((uint32_t)index < n) {
		memcpy(gid->raw, c->port.gids[index], 16);
		if (type)
			*type = c->port.gid_types[index];
	} else {
		memset(gid->raw, 0, 16); /* an empty entry of the table, as rxe's */
		if (type)
			*type = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}

TP_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	return gid_at(tp_ctx(context), port_num, index, gid, NULL);
}
TP_DEFAULT_VERSION(ibv_query_gid, "IBVERBS_1.1");

TP_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
				 enum ibv_gid_type_sysfs *type)
{
	union ibv_gid gid;
	uint8_t t;
	if (gid_at(tp_ctx(context), port_num, (int)index, &gid, &t) < 0)
		return -1;
	/* Every GID of a taproce port is RoCE v2, the link-local one too. */
	*type = IBV_GID_TYPE_SYSFS_ROCE_V2;
	return 0;
}

TP_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct tp_context *c = tp_ctx(context);
	if (flags || entry_size < sizeof(*entry) || port_num != 1)
		return EINVAL;
	union ibv_gid gid;
	if (gid_at(c, (uint8_t)port_num, (int)gid_index, &gid, NULL) < 0)
		return errno;
	static const uint8_t zero[16];
	if (memcmp(gid.raw, zero, 16) == 0)
		return ENODATA; /* an empty entry, as the kernel answers */
	memset(entry, 0, sizeof(*entry));
	memcpy(entry->gid.raw, gid.raw, 16);
	entry->gid_index = gid_index;
	entry->port_num = port_num;
	entry->gid_type = IBV_GID_TYPE_ROCE_V2;
	entry->ndev_ifindex = 0;
	return 0;
}

TP_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries,
				       uint32_t flags, size_t entry_size)
{
	struct tp_context *c = tp_ctx(context);
	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	int e = refresh_port(c);
	if (e)
		return -e;
	pthread_mutex_lock(&c->mu);
	uint32_t n = c->port.num_gids < TAPROCE_MAX_GIDS ? c->port.num_gids : TAPROCE_MAX_GIDS;
	if (n > max_entries) {
		pthread_mutex_unlock(&c->mu);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct ibv_gid_entry *en = (struct ibv_gid_entry *)((char *)entries + i * entry_size);
		memset(en, 0, sizeof(*en));
		memcpy(en->gid.raw, c->port.gids[i], 16);
		en->gid_index = i;
		en->port_num = 1;
		en->gid_type = IBV_GID_TYPE_ROCE_V2;
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}

TP_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	(void)context;
	if (port_num != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff); /* the default P_Key, the only one */
	return 0;
}
TP_DEFAULT_VERSION(ibv_query_pkey, "IBVERBS_1.1");

TP_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	(void)context;
	if (port_num != 1 || (be16toh(pkey) & 0x7fff) != 0x7fff) {
		errno = ENOENT;
		return -1;
	}
	return 0;
}
