/* Protection domains and memory regions of the application's own memory.
 *
 * The appliance reads and writes a region's bytes itself, so they must be
 * memory it can map: at registration the library moves the pages under
 * the region onto a memfd (a "chunk") — the whole mapping that holds them
 * (a heap, an mmap, a data segment), copied, then mapped over the same
 * addresses, MAP_SHARED|MAP_FIXED, with the same protection — and sends
 * the memfd. The program sees the same bytes at the same addresses; the
 * appliance sees them too, with no copy at post time. Pages stay on their
 * chunk after deregistration, so a later region there reuses it. A chunk
 * is MADV_DONTFORK, as ibv_fork_init makes registered memory: a forked
 * child does not get it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "taproce.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

TP_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct tp_context *c = tp_ctx(context);
	struct taproce_handle_reply rep;
	if (tp_call(c, TAPROCE_OP_ALLOC_PD, NULL, 0, &rep, sizeof(rep), NULL, 0, NULL, NULL) < 0)
		return NULL;
	if (tp_errno(rep.errnum))
		return NULL;
	struct tp_pd *pd = calloc(1, sizeof(*pd));
	if (pd == NULL) {
		tp_destroy_handle(c, TAPROCE_OP_DEALLOC_PD, rep.handle);
		errno = ENOMEM;
		return NULL;
	}
	pd->pd.context = context;
	pd->pd.handle = rep.handle;
	pd->h = rep.handle;
	return &pd->pd;
}
TP_DEFAULT_VERSION(ibv_alloc_pd, "IBVERBS_1.1");

TP_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct tp_pd *p = tp_container_of(pd, struct tp_pd, pd);
	int e = tp_destroy_handle(tp_ctx(pd->context), TAPROCE_OP_DEALLOC_PD, p->h);
	if (e)
		return e;
	free(p);
	return 0;
}
TP_DEFAULT_VERSION(ibv_dealloc_pd, "IBVERBS_1.1");

/* A chunk: pages of the process moved onto a memfd. */
struct chunk {
	uintptr_t start, end;
	int fd;
	ino_t ino;
	struct chunk *next;
};

static pthread_mutex_t chunks_mu = PTHREAD_MUTEX_INITIALIZER;
static struct chunk *chunks;

/* A mapping of the process, as /proc/self/maps lists it. */
struct vma {
	uintptr_t start, end;
	int prot;
	int shared;
	ino_t ino;
	char path[64];
};

/* read_maps reads the mappings that meet [start, end); it returns how many
 * (at most cap), or -1. */
static int read_maps(uintptr_t start, uintptr_t end, struct vma *out, int cap)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (f == NULL)
		return -1;
	char line[512];
	int n = 0;
	while (fgets(line, sizeof(line), f)) {
		uintptr_t s, e;
		char perms[5];
		unsigned long long off;
		unsigned dmaj, dmin;
		unsigned long ino;
		int pathpos = 0;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %llx %x:%x %lu %n", &s, &e, perms, &off, &dmaj, &dmin, &ino,
			   &pathpos) < 7)
			continue;
		if (e <= start || s >= end)
			continue;
		if (n == cap) {
			n = -1;
			errno = E2BIG;
			break;
		}
		struct vma *v = &out[n++];
		v->start = s;
		v->end = e;
		v->prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			  (perms[2] == 'x' ? PROT_EXEC : 0);
		v->shared = perms[3] == 's';
		v->ino = (ino_t)ino;
		v->path[0] = '\0';
		if (pathpos > 0) {
			const char *p = line + pathpos;
			size_t k = strcspn(p, "\n");
			if (k >= sizeof(v->path))
				k = sizeof(v->path) - 1;
			memcpy(v->path, p, k);
			v->path[k] = '\0';
		}
	}
	fclose(f);
	return n;
}

static struct chunk *chunk_by_ino(ino_t ino)
{
	for (struct chunk *c = chunks; c; c = c->next)
		if (c->ino == ino)
			return c;
	return NULL;
}

/* forget_stale drops the chunks whose pages the process unmapped or
 * replaced since (a freed allocation, a heap trimmed): a region there now
 * needs a chunk of its own. */
static void forget_stale(void)
{
	struct chunk **pp = &chunks;
	while (*pp) {
		struct chunk *c = *pp;
		struct vma v[64];
		int n = read_maps(c->start, c->end, v, 64);
		int alive = n > 0;
		uintptr_t at = c->start;
		for (int i = 0; alive && i < n; i++) {
			if (v[i].start > at || v[i].ino != c->ino)
				alive = 0;
			at = v[i].end;
		}
		if (alive && at >= c->end) {
			pp = &c->next;
			continue;
		}
		*pp = c->next;
		close(c->fd);
		free(c);
	}
}

/* copy_pages copies whole pages of the process, bytes the program owns
 * and bytes around them that it does not (a heap's other blocks, a
 * sanitizer's redzones) alike: exempt from AddressSanitizer, which would
 * take those for the program's overflow, and a loop of its own, since the
 * sanitizer checks memcpy wherever it is called from. */
__attribute__((no_sanitize("address"))) static void copy_pages(uint8_t *dst, const uint8_t *src, size_t n)
{
	const uint64_t *s = (const uint64_t *)src;
	uint64_t *d = (uint64_t *)dst;
	for (size_t i = 0; i < n / 8; i++)
		d[i] = s[i];
}

/* make_chunk moves [start, end), which the mappings v[0..n) cover with no
 * gap, onto a new memfd. */
static struct chunk *make_chunk(uintptr_t start, uintptr_t end, const struct vma *v, int n)
{
	size_t size = end - start;
	int fd = memfd_create("taproce-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 || fstat(fd, &st) < 0) {
		close(fd);
		return NULL;
	}
	uint8_t *tmp = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (tmp == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	/* Pages the program cannot read are copied as zeros: it never could
	 * have read them either. */
	for (int i = 0; i < n; i++) {
		uintptr_t s = v[i].start > start ? v[i].start : start;
		uintptr_t e = v[i].end < end ? v[i].end : end;
		if (v[i].prot & PROT_READ)
			copy_pages(tmp + (s - start), (const uint8_t *)s, e - s);
	}
	munmap(tmp, size);
	for (int i = 0; i < n; i++) {
		uintptr_t s = v[i].start > start ? v[i].start : start;
		uintptr_t e = v[i].end < end ? v[i].end : end;
		void *p = mmap((void *)s, e - s, v[i].prot, MAP_SHARED | MAP_FIXED, fd, (off_t)(s - start));
		if (p == MAP_FAILED) {
			/* The pages already moved keep their bytes: the memfd
			 * stays mapped where it was; the chunk is still made. */
			int err = errno;
			close(fd);
			errno = err;
			return NULL;
		}
	}
	madvise((void *)start, size, MADV_DONTFORK);
	struct chunk *c = calloc(1, sizeof(*c));
	if (c == NULL) {
		close(fd);
		errno = ENOMEM;
		return NULL;
	}
	c->start = start;
	c->end = end;
	c->fd = fd;
	c->ino = st.st_ino;
	c->next = chunks;
	chunks = c;
	return c;
}

/* chunk_for finds or makes the chunk under [addr, addr+len); chunks_mu is
 * held. It returns NULL with errno EFAULT for memory the process has not
 * mapped, EOPNOTSUPP where the region would span chunks or share a file
 * with others. */
static struct chunk *chunk_for(uintptr_t addr, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t start = addr & ~(uintptr_t)(pg - 1);
	uintptr_t end = (addr + len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	forget_stale();
	struct vma v[256];
	int n = read_maps(start, end, v, 256);
	if (n <= 0) {
		errno = n == 0 ? EFAULT : errno;
		return NULL;
	}
	uintptr_t at = start;
	for (int i = 0; i < n; i++) {
		if (v[i].start > at) {
			errno = EFAULT; /* a hole */
			return NULL;
		}
		at = v[i].end;
	}
	if (at < end) {
		errno = EFAULT;
		return NULL;
	}
	/* On a chunk already? */
	struct chunk *c = chunk_by_ino(v[0].ino);
	if (c != NULL) {
		if (c->start <= start && end <= c->end)
			return c;
		errno = EOPNOTSUPP;
		return NULL;
	}
	for (int i = 0; i < n; i++) {
		if (chunk_by_ino(v[i].ino) != NULL || (v[i].shared && v[i].ino != 0)) {
			errno = EOPNOTSUPP;
			return NULL;
		}
	}
	/* Whole mappings, so that the next region of the same heap or mmap
	 * finds its chunk — but only the region's pages of a stack, which
	 * must keep growing down below them. */
	uintptr_t cs = start, ce = end;
	if (strcmp(v[0].path, "[stack]") != 0)
		cs = v[0].start;
	if (strcmp(v[n - 1].path, "[stack]") != 0)
		ce = v[n - 1].end;
	struct vma all[256];
	int m = read_maps(cs, ce, all, 256);
	if (m <= 0) {
		errno = EFAULT;
		return NULL;
	}
	return make_chunk(cs, ce, all, m);
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access)
{
	struct tp_context *c = tp_ctx(pd->context);
	struct tp_pd *p = tp_container_of(pd, struct tp_pd, pd);
	if (length == 0 || addr == NULL || iova != (uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	}
	if (access & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_OPTIONAL_RANGE)) {
		errno = EINVAL;
		return NULL;
	}
	pthread_mutex_lock(&chunks_mu);
	struct chunk *ch = chunk_for((uintptr_t)addr, length);
	if (ch == NULL) {
		pthread_mutex_unlock(&chunks_mu);
		return NULL;
	}
	struct taproce_reg_mr_request req = {.pd = p->h, .access = access & 0xf, .addr = (uintptr_t)addr, .length = length,
					     .offset = (uintptr_t)addr - ch->start, .size = ch->end - ch->start};
	struct taproce_reg_mr_reply rep;
	int fd = ch->fd;
	int r = tp_call(c, TAPROCE_OP_REG_MR, &req, sizeof(req), &rep, sizeof(rep), &fd, 1, NULL, NULL);
	pthread_mutex_unlock(&chunks_mu);
	if (r < 0 || tp_errno(rep.errnum))
		return NULL;
	struct tp_mr *m = calloc(1, sizeof(*m));
	if (m == NULL) {
		tp_destroy_handle(c, TAPROCE_OP_DEREG_MR, rep.handle);
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.handle = rep.handle;
	m->mr.lkey = rep.lkey;
	m->mr.rkey = rep.rkey;
	m->h = rep.handle;
	return &m->mr;
}

TP_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}
TP_DEFAULT_VERSION(ibv_reg_mr, "IBVERBS_1.1");

TP_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, (unsigned)access);
}

TP_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

TP_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					   int access)
{
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct tp_mr *m = tp_container_of(mr, struct tp_mr, mr);
	int e = tp_destroy_handle(tp_ctx(mr->context), TAPROCE_OP_DEREG_MR, m->h);
	if (e)
		return e;
	free(m);
	return 0;
}
TP_DEFAULT_VERSION(ibv_dereg_mr, "IBVERBS_1.1");

TP_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
	(void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

/* Fork: registered memory and the rings are always MADV_DONTFORK, as
 * after ibv_fork_init. */
TP_EXPORT int ibv_fork_init(void) { return 0; }

TP_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_ENABLED; }

TP_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	return madvise(base, size, MADV_DONTFORK) < 0 ? errno : 0;
}

TP_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	return madvise(base, size, MADV_DOFORK) < 0 ? errno : 0;
}
