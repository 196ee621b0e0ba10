/* The context's calls over the control protocol (msg.c has its messages),
 * the handle table, doorbells and shared regions. */
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
