/* Protection domains and memory regions of the application's own memory.
 *
 * The appliance reads and writes a region's bytes itself, so they must lie
 * on memory it can map. At registration the library moves the region's
 * pages that are not on a memfd of its own yet onto a new one — copied,
 * then the memfd mapped over the same addresses, MAP_SHARED|MAP_FIXED,
 * with the same protection — and sends the appliance the memfds under the
 * region, piece by piece (TAPROCE_OP_REG_MR_SEGMENTS). The program sees
 * the same bytes at the same addresses, and so does the appliance, with no
 * copy at post time. Only the region's own pages move: the rest of a heap
 * stays as it was. Moved pages stay on their memfd after deregistration,
 * so registering them again copies nothing.
 *
 * The copy and the remap are two steps: a write another thread makes to
 * the same pages between them is lost. A program does not write a buffer
 * while it registers it; what remains is the bytes sharing the region's
 * first and last page, a heap's neighbouring blocks.
 *
 * Fork behaves as after ibv_fork_init: a live region's pages are
 * MADV_DONTFORK, so a child does not get them. Before a fork the moved
 * pages that back no live region are mapped again MAP_PRIVATE from their
 * memfd — the same bytes in one mmap, no write lost — so that parent and
 * child each get pages of their own, copied on write, as with any private
 * memory, not pages they share. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <linux/memfd.h>
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

/* A memfd of the library's, onto which it moved pages of the process. */
struct memfd {
	int fd;
	dev_t dev;
	ino_t ino;
	uint64_t size;
	size_t pagesize; /* a huge page size for a hugetlb memfd */
	struct memfd *next;
};

/* mem_mu guards memfds and live, and keeps the memory map still while a
 * registration reads and changes it; a fork holds it (mem_atfork). */
static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct memfd *memfds;
static struct tp_mr *live; /* the registered regions */

/* A mapping of the process, as /proc/self/maps lists it. */
struct vma {
	uintptr_t start, end;
	uint64_t off; /* in the file */
	int prot;
	int shared;
	dev_t dev;
	ino_t ino;
	int hugetlb; /* anonymous huge pages (MAP_HUGETLB) */
};

struct maps {
	struct vma *v;
	int n, cap;
};

/* maps_read reads the process's mappings, in address order. */
static int maps_read(struct maps *m)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (f == NULL)
		return -1;
	m->n = 0;
	char *line = NULL;
	size_t cap = 0;
	int ret = 0;
	while (getline(&line, &cap, f) > 0) {
		uintptr_t s, e;
		char perms[5];
		unsigned long long off;
		unsigned dmaj, dmin;
		unsigned long ino;
		int pathpos = 0;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %llx %x:%x %lu %n", &s, &e, perms, &off, &dmaj, &dmin, &ino,
			   &pathpos) < 7)
			continue;
		if (m->n == m->cap) {
			int nc = m->cap ? 2 * m->cap : 256;
			struct vma *nv = realloc(m->v, (size_t)nc * sizeof(*nv));
			if (nv == NULL) {
				ret = -1;
				break;
			}
			m->v = nv;
			m->cap = nc;
		}
		struct vma *v = &m->v[m->n++];
		*v = (struct vma){.start = s, .end = e, .off = off, .dev = makedev(dmaj, dmin), .ino = (ino_t)ino,
				  .shared = perms[3] == 's'};
		v->prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			  (perms[2] == 'x' ? PROT_EXEC : 0);
		v->hugetlb = pathpos > 0 && strncmp(line + pathpos, "/anon_hugepage", 14) == 0;
	}
	free(line);
	fclose(f);
	if (ret < 0)
		errno = ENOMEM;
	return ret;
}

/* maps_at returns the index of the mapping holding addr, or -1. */
static int maps_at(const struct maps *m, uintptr_t addr)
{
	int lo = 0, hi = m->n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (m->v[mid].end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < m->n && m->v[lo].start <= addr ? lo : -1;
}

static struct memfd *memfd_of(const struct vma *v)
{
	if (!v->shared)
		return NULL;
	for (struct memfd *f = memfds; f; f = f->next)
		if (f->ino == v->ino && f->dev == v->dev)
			return f;
	return NULL;
}

/* memfds_gc closes the memfds no mapping shares any more: the program
 * unmapped them, or a fork made them private. */
static void memfds_gc(const struct maps *m)
{
	for (struct memfd *f = memfds; f; f = f->next)
		f->size |= 1ull << 63; /* unseen */
	for (int i = 0; i < m->n; i++) {
		struct memfd *f = memfd_of(&m->v[i]);
		if (f != NULL)
			f->size &= ~(1ull << 63);
	}
	struct memfd **pp = &memfds;
	while (*pp) {
		struct memfd *f = *pp;
		if (!(f->size >> 63)) {
			pp = &f->next;
			continue;
		}
		*pp = f->next;
		close(f->fd);
		free(f);
	}
}

/* hugetlb_pagesize returns the page size of the huge page mapping at
 * start, from /proc/self/smaps. */
static size_t hugetlb_pagesize(uintptr_t start)
{
	size_t ps = 2u << 20;
	FILE *f = fopen("/proc/self/smaps", "re");
	if (f == NULL)
		return ps;
	char *line = NULL;
	size_t cap = 0;
	int in = 0;
	while (getline(&line, &cap, f) > 0) {
		uintptr_t s, e;
		unsigned long kb;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &s, &e) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = s == start;
		else if (in && sscanf(line, "KernelPageSize: %lu kB", &kb) == 1) {
			ps = kb << 10;
			break;
		}
	}
	free(line);
	fclose(f);
	return ps;
}

/* The devices of hugetlbfs mounts seen, and their page sizes: anonymous
 * huge pages and hugetlb memfds, shared or made private by a fork, lie on
 * the kernel's internal ones. */
static struct {
	dev_t dev;
	size_t pagesize;
} huge_devs[8];
static int nhuge_devs;

static void note_huge_dev(dev_t dev, size_t pagesize)
{
	for (int i = 0; i < nhuge_devs; i++)
		if (huge_devs[i].dev == dev)
			return;
	if (nhuge_devs < (int)(sizeof(huge_devs) / sizeof(huge_devs[0])))
		huge_devs[nhuge_devs++].dev = dev, huge_devs[nhuge_devs - 1].pagesize = pagesize;
}

/* pagesize_of returns the size of the pages of mapping v. */
static size_t pagesize_of(const struct vma *v)
{
	if (v->ino != 0)
		for (int i = 0; i < nhuge_devs; i++)
			if (huge_devs[i].dev == v->dev)
				return huge_devs[i].pagesize;
	if (v->hugetlb) {
		size_t ps = hugetlb_pagesize(v->start);
		note_huge_dev(v->dev, ps);
		return ps;
	}
	return (size_t)sysconf(_SC_PAGESIZE);
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

/* write_pages writes n bytes of the process at src into fd at off: the
 * kernel copies them into the memfd's pages as it allocates them, several
 * times faster than faulting a mapping of it in page by page. The system
 * call is made directly, not through the C library's pwrite, which
 * AddressSanitizer would check as if the program wrote what it owns
 * (see copy_pages). */
static int write_pages(int fd, uint64_t off, const uint8_t *src, size_t n)
{
	while (n > 0) {
		long w = syscall(SYS_pwrite64, fd, src, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			return -1;
		}
		src += w, off += (uint64_t)w, n -= (size_t)w;
	}
	return 0;
}

/* new_memfd makes a sealed memfd of size bytes, of huge pages of
 * pagesize when that is more than the base page size and the machine has
 * them free, else of base pages. */
static struct memfd *new_memfd(size_t size, size_t pagesize)
{
	size_t base = (size_t)sysconf(_SC_PAGESIZE);
	struct memfd *f = calloc(1, sizeof(*f));
	if (f == NULL)
		return NULL;
	f->fd = -1;
	if (pagesize > base) {
		unsigned shift = (unsigned)__builtin_ctzl(pagesize);
		f->fd = memfd_create("taproce-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | (shift << MFD_HUGE_SHIFT));
		f->pagesize = pagesize;
		if (f->fd >= 0 && ftruncate(f->fd, (off_t)size) < 0) {
			close(f->fd);
			f->fd = -1;
		}
	}
	if (f->fd < 0) {
		f->fd = memfd_create("taproce-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		f->pagesize = base;
		if (f->fd >= 0 && ftruncate(f->fd, (off_t)size) < 0)
			goto fail;
	}
	struct stat st;
	if (f->fd < 0 || fcntl(f->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 || fstat(f->fd, &st) < 0)
		goto fail;
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->size = size;
	if (f->pagesize > base)
		note_huge_dev(f->dev, f->pagesize);
	return f;
fail:;
	int e = errno;
	if (f->fd >= 0)
		close(f->fd);
	free(f);
	errno = e;
	return NULL;
}

/* move_pages moves [start, end), which the private mappings v[0..n) cover
 * with no gap, onto a new memfd and returns it. */
static struct memfd *move_pages(uintptr_t start, uintptr_t end, const struct vma *v, int n, size_t pagesize)
{
	size_t size = end - start;
	struct memfd *f = new_memfd(size, pagesize);
	if (f == NULL)
		return NULL;
	if (f->pagesize > (size_t)sysconf(_SC_PAGESIZE)) {
		/* hugetlbfs has no write(): through a mapping, faulted in
		 * whole first. */
		uint8_t *tmp = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, f->fd, 0);
		if (tmp == MAP_FAILED)
			goto fail;
		for (int i = 0; i < n; i++) {
			uintptr_t s = v[i].start > start ? v[i].start : start;
			uintptr_t e = v[i].end < end ? v[i].end : end;
			copy_pages(tmp + (s - start), (const uint8_t *)s, e - s);
		}
		munmap(tmp, size);
	} else {
		for (int i = 0; i < n; i++) {
			uintptr_t s = v[i].start > start ? v[i].start : start;
			uintptr_t e = v[i].end < end ? v[i].end : end;
			if (write_pages(f->fd, s - start, (const uint8_t *)s, e - s) < 0)
				goto fail;
		}
	}
	for (int i = 0; i < n; i++) {
		uintptr_t s = v[i].start > start ? v[i].start : start;
		uintptr_t e = v[i].end < end ? v[i].end : end;
		if (mmap((void *)s, e - s, v[i].prot, MAP_SHARED | MAP_FIXED, f->fd, (off_t)(s - start)) == MAP_FAILED) {
			/* The pages already moved keep their bytes on the
			 * memfd, which stays known. */
			if (i == 0)
				goto fail;
			break;
		}
	}
	f->next = memfds;
	memfds = f;
	return f;
fail:;
	int e = errno;
	close(f->fd);
	free(f);
	errno = e;
	return NULL;
}

/* A piece of a region: len bytes at off of a memfd of size bytes. */
struct seg {
	int fd;
	uint64_t off, len, size;
};

static int add_seg(struct seg *segs, int n, int fd, uint64_t off, uint64_t len, uint64_t size)
{
	if (n > 0 && segs[n - 1].fd == fd && segs[n - 1].off + segs[n - 1].len == off) {
		segs[n - 1].len += len;
		return n;
	}
	if (n == TAPROCE_MAX_MR_SEGMENTS) {
		errno = ENOMEM; /* too many pieces for one registration */
		return -1;
	}
	segs[n] = (struct seg){.fd = fd, .off = off, .len = len, .size = size};
	return n + 1;
}

/* segments_for puts the pages under [addr, addr+len) on memfds of the
 * library's, moving those that are not yet, and lists the pieces; mem_mu
 * is held. It returns their number and in *first where the first begins,
 * or -1 with errno: EFAULT for memory the process has not mapped, or not
 * readable, or not writable for a region that may be written, as the
 * kernel's page pinning answers; EOPNOTSUPP for memory the process shares
 * with others through a file (the library cannot hand the appliance that
 * file in a form it can trust). */
static int segments_for(uintptr_t addr, size_t len, int writable, struct seg *segs, uintptr_t *first)
{
	uintptr_t base = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = addr & ~(base - 1), end = (addr + len + base - 1) & ~(base - 1);
	if (end < addr) {
		errno = EINVAL;
		return -1;
	}
	struct maps m = {0};
	int n = -1;
	if (maps_read(&m) < 0)
		goto out;
	memfds_gc(&m);
	int i = maps_at(&m, start);
	if (i < 0) {
		errno = EFAULT;
		goto out;
	}
	/* Huge pages move whole. */
	size_t ps = pagesize_of(&m.v[i]);
	start &= ~(uintptr_t)(ps - 1);
	for (int k = i;; k++) {
		if (k == m.n || m.v[k].start > (k == i ? start : m.v[k - 1].end)) {
			errno = EFAULT; /* a hole */
			goto out;
		}
		const struct vma *v = &m.v[k];
		if (!(v->prot & PROT_READ) || (writable && !(v->prot & PROT_WRITE))) {
			errno = EFAULT;
			goto out;
		}
		if (v->end >= end) {
			ps = pagesize_of(v);
			end = (end + ps - 1) & ~(uintptr_t)(ps - 1);
			break;
		}
	}
	*first = start;
	n = 0;
	for (uintptr_t at = start; at < end && n >= 0;) {
		const struct vma *v = &m.v[i];
		uintptr_t e = v->end < end ? v->end : end;
		if (v->shared) {
			struct memfd *f = memfd_of(v);
			if (f == NULL) {
				errno = EOPNOTSUPP;
				n = -1;
				break;
			}
			n = add_seg(segs, n, f->fd, v->off + (at - v->start), e - at, f->size);
			at = e;
			i++;
			continue;
		}
		/* A run of private mappings (anonymous, a file's private
		 * copy, a data segment) moves onto one new memfd; a huge page
		 * mapping onto one of its own. */
		int k = i;
		while (e < end && !m.v[k].hugetlb && !m.v[k + 1].shared && !m.v[k + 1].hugetlb) {
			k++;
			e = m.v[k].end < end ? m.v[k].end : end;
		}
		struct memfd *f = move_pages(at, e, &m.v[i], k - i + 1, pagesize_of(v));
		if (f == NULL) {
			n = -1;
			break;
		}
		n = add_seg(segs, n, f->fd, 0, e - at, f->size);
		at = e;
		i = k + 1;
	}
out:
	free(m.v);
	return n;
}

/* mem_prepare, before a fork, maps the moved pages that back no live
 * region privately again (see the top of the file); mem_mu stays held
 * until the fork is done. */
static void mem_prepare(void)
{
	pthread_mutex_lock(&mem_mu);
	struct maps m = {0};
	if (maps_read(&m) < 0)
		goto out;
	for (int i = 0; i < m.n; i++) {
		const struct vma *v = &m.v[i];
		struct memfd *f = memfd_of(v);
		if (f == NULL)
			continue;
		/* The parts of v no live region covers. */
		for (uintptr_t at = v->start; at < v->end;) {
			uintptr_t e = v->end;
			for (struct tp_mr *r = live; r; r = r->next) {
				if (r->start <= at && at < r->end) {
					at = r->end;
					e = 0;
					break;
				}
				if (r->start > at && r->start < e)
					e = r->start;
			}
			if (e == 0)
				continue;
			mmap((void *)at, e - at, v->prot, MAP_PRIVATE | MAP_FIXED, f->fd, (off_t)(v->off + (at - v->start)));
			at = e;
		}
	}
	memfds_gc(&m);
out:
	free(m.v);
}

static void mem_unlock(void) { pthread_mutex_unlock(&mem_mu); }

static pthread_once_t mem_once = PTHREAD_ONCE_INIT;

static void mem_atfork(void) { pthread_atfork(mem_prepare, mem_unlock, mem_unlock); }

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
	struct tp_mr *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return NULL;
	pthread_once(&mem_once, mem_atfork);
	pthread_mutex_lock(&mem_mu);
	struct seg segs[TAPROCE_MAX_MR_SEGMENTS];
	uintptr_t first;
	int writable = (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
	int n = segments_for((uintptr_t)addr, length, writable, segs, &first);
	if (n < 0)
		goto fail;
	struct taproce_reg_mr_segments_request req = {.pd = p->h, .access = access & 0xf, .addr = (uintptr_t)addr,
						       .length = length, .lead = (uintptr_t)addr - first,
						       .num_segments = (uint32_t)n};
	int fds[TAPROCE_MAX_MR_SEGMENTS];
	uint64_t total = 0;
	for (int i = 0; i < n; i++) {
		req.segments[i] = (struct taproce_mr_segment){.offset = segs[i].off, .length = segs[i].len, .size = segs[i].size};
		fds[i] = segs[i].fd;
		total += segs[i].len;
	}
	struct taproce_reg_mr_reply rep;
	if (tp_call(c, TAPROCE_OP_REG_MR_SEGMENTS, &req, sizeof(req), &rep, sizeof(rep), fds, n, NULL, NULL) < 0 ||
	    tp_errno(rep.errnum))
		goto fail;
	/* As ibv_fork_init: a child does not get a live region's pages. */
	m->start = first;
	m->end = first + total;
	madvise((void *)m->start, m->end - m->start, MADV_DONTFORK);
	m->next = live;
	live = m;
	pthread_mutex_unlock(&mem_mu);
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.handle = rep.handle;
	m->mr.lkey = rep.lkey;
	m->mr.rkey = rep.rkey;
	m->h = rep.handle;
	return &m->mr;
fail:;
	int e = errno;
	pthread_mutex_unlock(&mem_mu);
	free(m);
	errno = e;
	return NULL;
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
	/* Its pages stay MADV_DONTFORK until a fork maps them privately
	 * again (mem_prepare), unless another live region covers them. */
	pthread_mutex_lock(&mem_mu);
	for (struct tp_mr **pp = &live; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	pthread_mutex_unlock(&mem_mu);
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

/* Fork: live regions and the rings are always MADV_DONTFORK, as after
 * ibv_fork_init (see the top of the file). */
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
