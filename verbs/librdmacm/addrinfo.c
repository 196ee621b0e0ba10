/* rdma_getaddrinfo: getaddrinfo(3)'s answer in rdma_addrinfo's shape, as
 * librdmacm gives it where no ib_acm service runs: a passive request's
 * address is the source, an active one's the destination, with the port
 * space and QP type of the hints (TCP and RC by default). Without a node
 * and a service, the hints are the answer: their flags, family, port
 * space, QP type and addresses (libfabric's verbs provider asks so for
 * the destination an endpoint name gave it). */
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cma.h"

static void free_one(struct rdma_addrinfo *r)
{
	free(r->ai_src_addr);
	free(r->ai_dst_addr);
	free(r->ai_src_canonname);
	free(r->ai_dst_canonname);
	free(r->ai_route);
	free(r->ai_connect);
	free(r);
}

TP_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free_one(res);
		res = next;
	}
}

/* copy_addr sets *dst to a copy of the len bytes at src; -1 with errno
 * when there is no memory. */
static int copy_addr(struct sockaddr **dst, socklen_t *dst_len, const struct sockaddr *src, socklen_t len)
{
	*dst = malloc(len);
	if (*dst == NULL)
		return -1;
	memcpy(*dst, src, len);
	*dst_len = len;
	return 0;
}

/* from_hints is rdma_getaddrinfo without a node and a service. */
static int from_hints(const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{
	struct rdma_addrinfo *out = calloc(1, sizeof(*out));
	if (out == NULL)
		return -1;
	out->ai_flags = hints->ai_flags;
	out->ai_family = hints->ai_family;
	out->ai_qp_type = hints->ai_qp_type;
	out->ai_port_space = hints->ai_port_space;
	if ((hints->ai_dst_len && copy_addr(&out->ai_dst_addr, &out->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len) < 0) ||
	    (hints->ai_src_len && copy_addr(&out->ai_src_addr, &out->ai_src_len, hints->ai_src_addr, hints->ai_src_len) < 0)) {
		rdma_freeaddrinfo(out);
		return -1;
	}
	*res = out;
	return 0;
}

TP_EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
			       struct rdma_addrinfo **res)
{
	if (res == NULL || (node == NULL && service == NULL && hints == NULL)) {
		errno = EINVAL;
		return -1;
	}
	if (node == NULL && service == NULL)
		return from_hints(hints, res);
	struct addrinfo ah = {.ai_socktype = SOCK_STREAM};
	int passive = 0;
	struct rdma_addrinfo *out = calloc(1, sizeof(*out));
	if (out == NULL)
		return -1;
	out->ai_port_space = RDMA_PS_TCP;
	out->ai_qp_type = IBV_QPT_RC;
	if (hints) {
		passive = hints->ai_flags & RAI_PASSIVE;
		if (hints->ai_flags & RAI_NUMERICHOST)
			ah.ai_flags |= AI_NUMERICHOST;
		if (hints->ai_flags & RAI_FAMILY)
			ah.ai_family = hints->ai_family;
		if (hints->ai_port_space)
			out->ai_port_space = hints->ai_port_space;
		if (hints->ai_qp_type)
			out->ai_qp_type = hints->ai_qp_type;
		else if (hints->ai_port_space == RDMA_PS_UDP)
			out->ai_qp_type = IBV_QPT_UD;
		out->ai_flags = hints->ai_flags;
	}
	if (passive)
		ah.ai_flags |= AI_PASSIVE;
	if (out->ai_port_space == RDMA_PS_UDP)
		ah.ai_socktype = SOCK_DGRAM;
	struct addrinfo *ai;
	int r = getaddrinfo(node, service, &ah, &ai);
	if (r != 0) {
		free(out);
		errno = r == EAI_SYSTEM ? errno : ENOENT;
		return r == EAI_SYSTEM ? -1 : r;
	}
	struct sockaddr *sa = malloc(ai->ai_addrlen);
	if (sa == NULL) {
		freeaddrinfo(ai);
		free(out);
		return -1;
	}
	memcpy(sa, ai->ai_addr, ai->ai_addrlen);
	out->ai_family = ai->ai_family;
	if (passive) {
		out->ai_src_addr = sa;
		out->ai_src_len = ai->ai_addrlen;
	} else {
		out->ai_dst_addr = sa;
		out->ai_dst_len = ai->ai_addrlen;
		if (hints && hints->ai_src_addr && hints->ai_src_len &&
		    copy_addr(&out->ai_src_addr, &out->ai_src_len, hints->ai_src_addr, hints->ai_src_len) < 0) {
			freeaddrinfo(ai);
			rdma_freeaddrinfo(out);
			return -1;
		}
	}
	freeaddrinfo(ai);
	*res = out;
	return 0;
}
