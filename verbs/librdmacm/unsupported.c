/* What taproce's librdmacm exports so that programs linked to rdma-core's
 * load, and answers as a device without the feature: multicast (the
 * appliance's CM joins no groups) and rsockets (librdmacm's socket API
 * over RDMA, not provided). Each fails with ENOSYS. */
#include <errno.h>
#include <poll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <rdma/rsocket.h>

#include "cma.h"

#define TP_NOSYS(ret)         \
	do {                  \
		errno = ENOSYS; \
		return ret;   \
	} while (0)

TP_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id, (void)addr, (void)context;
	TP_NOSYS(-1);
}

TP_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	(void)id, (void)attr, (void)context;
	TP_NOSYS(-1);
}

TP_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id, (void)addr;
	TP_NOSYS(-1);
}

TP_EXPORT int rsocket(int domain, int type, int protocol)
{
	(void)domain, (void)type, (void)protocol;
	TP_NOSYS(-1);
}

TP_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	(void)socket, (void)addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rlisten(int socket, int backlog)
{
	(void)socket, (void)backlog;
	TP_NOSYS(-1);
}

TP_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	(void)socket, (void)addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen)
{
	(void)socket, (void)addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rshutdown(int socket, int how)
{
	(void)socket, (void)how;
	TP_NOSYS(-1);
}

TP_EXPORT int rclose(int socket)
{
	(void)socket;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags)
{
	(void)socket, (void)buf, (void)len, (void)flags;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr, socklen_t *addrlen)
{
	(void)socket, (void)buf, (void)len, (void)flags, (void)src_addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags)
{
	(void)socket, (void)msg, (void)flags;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags)
{
	(void)socket, (void)buf, (void)len, (void)flags;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
			  socklen_t addrlen)
{
	(void)socket, (void)buf, (void)len, (void)flags, (void)dest_addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags)
{
	(void)socket, (void)msg, (void)flags;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rread(int socket, void *buf, size_t count)
{
	(void)socket, (void)buf, (void)count;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt)
{
	(void)socket, (void)iov, (void)iovcnt;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count)
{
	(void)socket, (void)buf, (void)count;
	TP_NOSYS(-1);
}

TP_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt)
{
	(void)socket, (void)iov, (void)iovcnt;
	TP_NOSYS(-1);
}

TP_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	(void)fds, (void)nfds, (void)timeout;
	TP_NOSYS(-1);
}

TP_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *timeout)
{
	(void)nfds, (void)readfds, (void)writefds, (void)exceptfds, (void)timeout;
	TP_NOSYS(-1);
}

TP_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	(void)socket, (void)addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen)
{
	(void)socket, (void)addr, (void)addrlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen)
{
	(void)socket, (void)level, (void)optname, (void)optval, (void)optlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen)
{
	(void)socket, (void)level, (void)optname, (void)optval, (void)optlen;
	TP_NOSYS(-1);
}

TP_EXPORT int rfcntl(int socket, int cmd, ... /* arg */)
{
	(void)socket, (void)cmd;
	TP_NOSYS(-1);
}

TP_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset)
{
	(void)socket, (void)buf, (void)len, (void)prot, (void)flags, (void)offset;
	TP_NOSYS(-1);
}

TP_EXPORT int riounmap(int socket, void *buf, size_t len)
{
	(void)socket, (void)buf, (void)len;
	TP_NOSYS(-1);
}

TP_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags)
{
	(void)socket, (void)buf, (void)count, (void)offset, (void)flags;
	errno = ENOSYS;
	return 0;
}
