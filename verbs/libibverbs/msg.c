/* The control protocol's messages (verbs/abi): one SOCK_SEQPACKET message
 * per request and per reply, descriptors as SCM_RIGHTS. Shared by
 * libibverbs.so.1 and librdmacm.so.1, which build this file each. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "msg.h"

#define TP_MAX_FDS TAPROCE_MAX_MR_SEGMENTS

int tp_connect(void)
{
	const char *path = getenv(TAPROCE_SOCKET_ENV);
	if (path == NULL || path[0] == '\0')
		path = TAPROCE_DEFAULT_SOCKET;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(sa.sun_path, path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(s);
		errno = e;
		return -1;
	}
	return s;
}

static int send_msg(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	union {
		char buf[CMSG_SPACE(sizeof(int) * TP_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > 0) {
		if (nfds > TP_MAX_FDS) {
			errno = EINVAL;
			return -1;
		}
		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	for (;;) {
		ssize_t n = sendmsg(sock, &m, MSG_NOSIGNAL);
		if (n >= 0)
			return 0;
		if (errno != EINTR)
			return -1;
	}
}

/* recv_msg reads one message; the descriptors it carries go to fds (up to
 * *nfds, the rest closed). It returns the length, 0 at end of file. */
static ssize_t recv_msg(int sock, void *buf, size_t len, int *fds, int *nfds)
{
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	union {
		char buf[CMSG_SPACE(sizeof(int) * TP_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	ssize_t n;
	do
		n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	int got = 0, cap = nfds ? *nfds : 0;
	if (n >= 0) {
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			int *p = (int *)CMSG_DATA(c);
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, p + i, sizeof(fd));
				if (got < cap)
					fds[got++] = fd;
				else
					close(fd);
			}
		}
		if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
			for (int i = 0; i < got; i++)
				close(fds[i]);
			got = 0;
			errno = EPROTO;
			n = -1;
		}
	}
	if (nfds)
		*nfds = got;
	return n;
}

int tp_call_sock(int sock, uint32_t *seq, uint16_t op, const void *req, size_t req_len, void *rep, size_t rep_len,
		 const int *fds, int nfds, int *fds_out, int *nfds_out)
{
	uint8_t *buf = malloc(TAPROCE_MAX_MESSAGE);
	if (buf == NULL)
		return -1;
	struct taproce_header h = {.magic = TAPROCE_ABI_MAGIC, .version = TAPROCE_ABI_VERSION, .op = op, .seq = ++*seq,
				   .len = (uint32_t)req_len};
	memcpy(buf, &h, sizeof(h));
	if (req_len > 0)
		memcpy(buf + sizeof(h), req, req_len);
	int ret = -1;
	if (send_msg(sock, buf, sizeof(h) + req_len, fds, nfds) < 0) {
		if (errno == EPIPE || errno == ECONNRESET)
			errno = EIO;
		goto out;
	}
	for (;;) {
		int got = TP_MAX_FDS, rfds[TP_MAX_FDS];
		ssize_t n = recv_msg(sock, buf, TAPROCE_MAX_MESSAGE, rfds, &got);
		if (n <= 0) {
			if (n == 0 || errno == ECONNRESET)
				errno = EIO; /* the appliance is gone */
			goto out;
		}
		struct taproce_header rh;
		if ((size_t)n < sizeof(rh)) {
			errno = EIO;
			goto closefds;
		}
		memcpy(&rh, buf, sizeof(rh));
		if (rh.magic != TAPROCE_ABI_MAGIC || rh.version != TAPROCE_ABI_VERSION || rh.len != (size_t)n - sizeof(rh)) {
			errno = EIO;
			goto closefds;
		}
		if (rh.flags & TAPROCE_FLAG_EVENT) {
			for (int i = 0; i < got; i++)
				close(rfds[i]);
			continue; /* events have their own socket; never here */
		}
		if (!(rh.flags & TAPROCE_FLAG_REPLY) || rh.seq != h.seq || rh.op != op || rh.len != rep_len) {
			errno = EIO;
			goto closefds;
		}
		memcpy(rep, buf + sizeof(rh), rep_len);
		int cap = nfds_out ? *nfds_out : 0;
		for (int i = 0; i < got; i++) {
			if (i < cap)
				fds_out[i] = rfds[i];
			else
				close(rfds[i]);
		}
		if (nfds_out)
			*nfds_out = got < cap ? got : cap;
		ret = 0;
		goto out;
	closefds:
		for (int i = 0; i < got; i++)
			close(rfds[i]);
		goto out;
	}
out:
	if (ret < 0 && nfds_out)
		*nfds_out = 0;
	free(buf);
	return ret;
}

