/* Times ibv_reg_mr of a program's buffer (the library moves its pages
 * onto a memfd: new pages, a copy and an mmap), of the same buffer again
 * (its pages are on the memfd already), and ibv_dereg_mr, next to a copy
 * of as many bytes into new memory (new pages and a copy: what any way of
 * giving the appliance the bytes pays at least) and a memcpy between two
 * buffers in use, for sizes from 4 KiB to 64 MiB. Prints one line per
 * size: "size first_us again_us dereg_us fresh_copy_us memcpy_us"
 * (medians of the rounds). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "ends.h"

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp);
	return v[n / 2];
}

#define ROUNDS 7

int main(void)
{
	struct end e = {0};
	open_end(&e, "taproce0", 16);
	for (size_t size = 4096; size <= (64u << 20); size *= 4) {
		double first[ROUNDS], again[ROUNDS], dereg[ROUNDS], fresh[ROUNDS], copy[ROUNDS];
		for (int r = 0; r < ROUNDS; r++) {
			uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			uint8_t *q = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED || q == MAP_FAILED)
				die("mmap");
			memset(p, 1, size); /* touched, as a program's buffer is */
			memset(q, 2, size);
			uint8_t *f = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (f == MAP_FAILED)
				die("mmap");
			double tf = now_us();
			memcpy(f, p, size);
			fresh[r] = now_us() - tf;
			munmap(f, size);
			double t0 = now_us();
			memcpy(q, p, size);
			double t1 = now_us();
			struct ibv_mr *m = ibv_reg_mr(e.pd, p, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			double t2 = now_us();
			if (m == NULL)
				die("ibv_reg_mr");
			if (ibv_dereg_mr(m))
				die("ibv_dereg_mr");
			double t3 = now_us();
			m = ibv_reg_mr(e.pd, p, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			double t4 = now_us();
			if (m == NULL || ibv_dereg_mr(m))
				die("again");
			copy[r] = t1 - t0, first[r] = t2 - t1, dereg[r] = t3 - t2, again[r] = t4 - t3;
			munmap(p, size);
			munmap(q, size);
		}
		printf("%zu %.1f %.1f %.1f %.1f %.1f\n", size, median(first, ROUNDS), median(again, ROUNDS), median(dereg, ROUNDS),
		       median(fresh, ROUNDS), median(copy, ROUNDS));
	}
	return 0;
}
