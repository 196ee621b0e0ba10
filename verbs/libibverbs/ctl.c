/* The control protocol with the appliance (verbs/abi): one SOCK_SEQPACKET
 * message per request and per reply, descriptors as SCM_RIGHTS. */
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "taproce.h"

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

int tp_call(struct tp_context *c, uint16_t op, const void *req, size_t req_len, void *rep, size_t rep_len, const int *fds,
	    int nfds, int *fds_out, int *nfds_out)
{
	if (atomic_load(&c->dead)) {
		if (nfds_out)
			*nfds_out = 0;
		errno = EIO;
		return -1;
	}
	pthread_mutex_lock(&c->mu);
	int r = tp_call_sock(c->sock, &c->seq, op, req, req_len, rep, rep_len, fds, nfds, fds_out, nfds_out);
	int e = errno;
	pthread_mutex_unlock(&c->mu);
	if (r < 0 && e == EIO)
		atomic_store(&c->dead, 1);
	errno = e;
	return r;
}

int tp_errno(int32_t e)
{
	if (e != 0)
		errno = e;
	return e;
}

int tp_destroy_handle(struct tp_context *c, uint16_t op, uint32_t h)
{
	struct taproce_handle_request req = {.handle = h};
	struct taproce_errno_reply rep;
	if (tp_call(c, op, &req, sizeof(req), &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		/* The appliance gone took the object with it: destroying
		 * succeeds, so that the program can free what it holds. */
		return atomic_load(&c->dead) ? 0 : errno;
	return tp_errno(rep.errnum);
}

/* tp_kick rings the appliance's doorbell, a pipe. A pipe without a
 * reader — the appliance gone — raises SIGPIPE, which would kill a
 * program that never asked for it: the signal is blocked around the
 * write and, if the write raised it, taken back. */
void tp_kick(struct tp_context *c)
{
	static const char one = 1;
	if (atomic_load(&c->dead))
		return;
	sigset_t pipe, old, pending;
	sigemptyset(&pipe);
	sigaddset(&pipe, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe, &old);
	sigpending(&pending);
	int had = sigismember(&pending, SIGPIPE);
	ssize_t n;
	do
		n = write(c->kick_fd, &one, 1);
	while (n < 0 && errno == EINTR);
	/* EAGAIN: the pipe is full of rings already. */
	if (n < 0 && errno == EPIPE) {
		if (!had) {
			struct timespec zero = {0, 0};
			while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR)
				;
		}
		atomic_store(&c->dead, 1);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void tp_handles_add(struct tp_context *c, uint32_t h, enum tp_kind kind, void *obj)
{
	pthread_mutex_lock(&c->mu);
	if (c->nhandles == c->caphandles) {
		size_t cap = c->caphandles ? 2 * c->caphandles : 16;
		struct tp_handle_entry *p = realloc(c->handles, cap * sizeof(*p));
		if (p == NULL) { /* events for this object are then dropped */
			pthread_mutex_unlock(&c->mu);
			return;
		}
		c->handles = p;
		c->caphandles = cap;
	}
	c->handles[c->nhandles++] = (struct tp_handle_entry){.h = h, .kind = kind, .obj = obj};
	pthread_mutex_unlock(&c->mu);
}

void tp_handles_del(struct tp_context *c, uint32_t h)
{
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nhandles; i++) {
		if (c->handles[i].h == h) {
			c->handles[i] = c->handles[--c->nhandles];
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
}

void *tp_handles_find(struct tp_context *c, uint32_t h, enum tp_kind kind)
{
	void *obj = NULL;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nhandles; i++) {
		if (c->handles[i].h == h && c->handles[i].kind == kind) {
			obj = c->handles[i].obj;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return obj;
}

uint8_t *tp_map_region(int fd, uint64_t size)
{
	struct stat st;
	if (size == 0 || size > (1ULL << 34) || fstat(fd, &st) < 0 || (uint64_t)st.st_size < size) {
		close(fd);
		errno = EIO;
		return NULL;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	/* The rings are the appliance's too: a forked child must not share them. */
	madvise(p, size, MADV_DONTFORK);
	return p;
}
