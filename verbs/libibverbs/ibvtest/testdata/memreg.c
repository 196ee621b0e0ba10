/* A user's program, built against Debian's libibverbs-dev: it registers
 * memory of every kind a program has — heap (unaligned, small and large),
 * anonymous and file mmaps, globals, huge pages — on two devices, connects
 * an RC QP of each to the other's, and moves data into each kind with SEND
 * with immediate, RDMA WRITE, RDMA READ and both atomics, checking the
 * bytes at both ends. With "fork" it forks with a region live: the
 * parent's RDMA goes on while the child lives and after it ends, and the
 * child's memory is its own, the parent's bytes as they were. It
 * prints "ok" and exits 0 when everything arrived as sent. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ends.h"

#define N 8192

static char global_buf[3 * N + 13];

/* exercise moves data between a's memory at pa and b's at pb, len bytes
 * each (at least 16), checking everything at both ends. */
static void exercise(struct end *a, struct end *b, const char *what, uint8_t *pa, uint8_t *pb, size_t len, int round)
{
	struct ibv_mr *ma = ibv_reg_mr(a->pd, pa, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
							IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_mr *mb = ibv_reg_mr(b->pd, pb, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
							IBV_ACCESS_REMOTE_ATOMIC);
	if (ma == NULL || mb == NULL)
		die("%s: ibv_reg_mr", what);
	for (size_t i = 0; i < len; i++)
		pa[i] = (uint8_t)(i * 7 + round), pb[i] = 0;

	/* SEND with immediate, a to b. */
	struct ibv_sge rs = {.addr = (uintptr_t)pb, .length = (uint32_t)len, .lkey = mb->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &rs, .num_sge = 1};
	struct ibv_recv_wr *bad;
	if (ibv_post_recv(b->qp, &rwr, &bad))
		die("%s: ibv_post_recv", what);
	struct ibv_sge s = {.addr = (uintptr_t)pa, .length = (uint32_t)len, .lkey = ma->lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x1234 + round)};
	post(a, &wr);
	wait_wc(a, IBV_WC_SEND);
	struct ibv_wc wc = wait_wc(b, IBV_WC_RECV);
	if (wc.byte_len != len || !(wc.wc_flags & IBV_WC_WITH_IMM) || ntohl(wc.imm_data) != (uint32_t)(0x1234 + round) ||
	    memcmp(pa, pb, len) != 0)
		die("%s: SEND with immediate arrived wrong (%u bytes)", what, wc.byte_len);

	/* RDMA WRITE, b to a's region, other bytes. */
	for (size_t i = 0; i < len; i++)
		pb[i] = (uint8_t)(i * 13 + round);
	s = (struct ibv_sge){.addr = (uintptr_t)pb, .length = (uint32_t)len, .lkey = mb->lkey};
	wr = (struct ibv_send_wr){.wr_id = 3, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)pa;
	wr.wr.rdma.rkey = ma->rkey;
	post(b, &wr);
	wait_wc(b, IBV_WC_RDMA_WRITE);
	if (memcmp(pa, pb, len) != 0)
		die("%s: RDMA WRITE landed wrong", what);

	/* RDMA READ: a reads b's region into its own after changing both. */
	for (size_t i = 0; i < len; i++)
		pb[i] = (uint8_t)(i * 31 + round), pa[i] = 0;
	s = (struct ibv_sge){.addr = (uintptr_t)pa, .length = (uint32_t)len, .lkey = ma->lkey};
	wr = (struct ibv_send_wr){.wr_id = 4, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = (uintptr_t)pb;
	wr.wr.rdma.rkey = mb->rkey;
	post(a, &wr);
	wait_wc(a, IBV_WC_RDMA_READ);
	if (memcmp(pa, pb, len) != 0)
		die("%s: RDMA READ brought wrong bytes", what);

	/* Atomics on an 8-byte-aligned word in b's region. */
	uint64_t *word = (uint64_t *)(((uintptr_t)pb + 7) & ~(uintptr_t)7);
	*word = 1000;
	uint64_t *res = (uint64_t *)(((uintptr_t)pa + 7) & ~(uintptr_t)7);
	s = (struct ibv_sge){.addr = (uintptr_t)res, .length = 8, .lkey = ma->lkey};
	wr = (struct ibv_send_wr){.wr_id = 5, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED};
	wr.wr.atomic.remote_addr = (uintptr_t)word;
	wr.wr.atomic.rkey = mb->rkey;
	wr.wr.atomic.compare_add = 42;
	post(a, &wr);
	wait_wc(a, IBV_WC_FETCH_ADD);
	if (*res != 1000 || *word != 1042)
		die("%s: FETCH_ADD: got %llu, word %llu", what, (unsigned long long)*res, (unsigned long long)*word);
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 1042;
	wr.wr.atomic.swap = 7;
	post(a, &wr);
	wait_wc(a, IBV_WC_COMP_SWAP);
	if (*res != 1042 || *word != 7)
		die("%s: CMP_SWAP: got %llu, word %llu", what, (unsigned long long)*res, (unsigned long long)*word);
	if (ibv_dereg_mr(ma) || ibv_dereg_mr(mb))
		die("%s: ibv_dereg_mr", what);
}

static uint8_t *file_map(const char *dir, int shared, size_t len)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/memreg-%d-%d", dir, getpid(), shared);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0)
		die("file %s", path);
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd, 0);
	close(fd);
	unlink(path);
	if (p == MAP_FAILED)
		die("mmap %s", path);
	return p;
}

/* kernel_page_kb returns the size of the pages under p, from smaps. */
static size_t kernel_page_kb(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	int in = 0;
	size_t kb = 0;
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		char c;
		if (sscanf(line, "%lx-%lx %c", &s, &e, &c) == 3)
			in = s <= (uintptr_t)p && (uintptr_t)p < e;
		else if (in && sscanf(line, "KernelPageSize: %zu kB", &kb) == 1)
			break;
	}
	if (f)
		fclose(f);
	return kb;
}

int main(int argc, char **argv)
{
	int do_fork = argc > 1 && strcmp(argv[1], "fork") == 0;
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	struct end a = {0}, b = {0};
	open_end(&a, "taproce0", 64);
	open_end(&b, "taproce1", 64);
	connect_to(&a, &b);
	connect_to(&b, &a);

	uint8_t *small_a = malloc(100), *small_b = malloc(100);
	uint8_t *heap_a = malloc(N + 64), *heap_b = malloc(N + 64);
	uint8_t *big_a = malloc(4 << 20), *big_b = malloc(4 << 20);
	uint8_t *anon = mmap(NULL, 5 * N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *priv = file_map(dir, 0, 2 * N);
	if (!small_a || !small_b || !heap_a || !heap_b || !big_a || !big_b || anon == MAP_FAILED)
		die("allocations");
	uint8_t *huge = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);

	/* Memory shared through a file with whoever else maps it is the one
	 * kind taproce refuses, with EOPNOTSUPP: it would have to hand the
	 * appliance a file anyone may truncate under it. */
	uint8_t *shared = file_map(dir, 1, N);
	errno = 0;
	if (ibv_reg_mr(a.pd, shared, N, IBV_ACCESS_LOCAL_WRITE) != NULL || errno != EOPNOTSUPP)
		die("a shared file mapping: want EOPNOTSUPP");
	munmap(shared, N);

	for (int round = 0; round < 2; round++) {
		exercise(&a, &b, "small heap", small_a + 3, small_b + 5, 90, round);
		exercise(&a, &b, "unaligned heap", heap_a + 1, heap_b + 3, N, round);
		exercise(&a, &b, "large heap", big_a + 17, big_b, (4 << 20) - 64, round);
		exercise(&a, &b, "anonymous mmap", anon + 5, anon + 2 * N, N, round);
		exercise(&a, &b, "private file mmap", priv + 1, priv + N, N - 8, round);
		exercise(&a, &b, "global", (uint8_t *)global_buf + 1, (uint8_t *)global_buf + N + 11, N, round);
		exercise(&a, &b, "heap to global", heap_a + 7, (uint8_t *)global_buf + 2 * N + 12, N - 7, round);
		if (huge != MAP_FAILED)
			exercise(&a, &b, "huge pages", huge, huge + (1 << 20), 1 << 20, round);
		if (do_fork && round == 0) {
			/* A region live across the fork, and bytes on pages
			 * regions had, which the child must get as its own. */
			uint8_t *kept = anon + 3 * N;
			struct ibv_mr *live = ibv_reg_mr(a.pd, kept, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
			if (live == NULL)
				die("ibv_reg_mr before fork");
			global_buf[0] = 0x11;
			small_a[0] = 0x22;
			pid_t pid = fork();
			if (pid < 0)
				die("fork");
			if (pid == 0) {
				/* The child has its own heap and globals, which it
				 * may use and change without the parent seeing; the
				 * live region is not its (ibv_fork_init). */
				char *p = malloc(1 << 16);
				memset(p, 1, 1 << 16);
				int ok = p[100] == 1 && global_buf[0] == 0x11 && small_a[0] == 0x22;
				global_buf[0] = 0x5a;
				small_a[0] = 0x5b;
				_exit(ok ? 0 : 1);
			}
			/* The parent's RDMA goes on while the child lives. */
			exercise(&a, &b, "heap after fork", heap_a + 2, heap_b + 2, N, 9);
			int st;
			if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
				die("the child failed (status %d)", st);
			if (global_buf[0] != 0x11 || small_a[0] != 0x22)
				die("the child's writes reached the parent (%#x %#x)", global_buf[0], small_a[0]);
			/* The live region still takes RDMA WRITE. */
			uint8_t *src = heap_b + 1;
			struct ibv_mr *ms = ibv_reg_mr(b.pd, src, N, IBV_ACCESS_LOCAL_WRITE);
			if (ms == NULL)
				die("ibv_reg_mr after fork");
			for (size_t i = 0; i < N; i++)
				src[i] = (uint8_t)(i * 3 + 1), kept[i] = 0;
			struct ibv_sge s = {.addr = (uintptr_t)src, .length = N, .lkey = ms->lkey};
			struct ibv_send_wr wr = {.wr_id = 6, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
						 .send_flags = IBV_SEND_SIGNALED};
			wr.wr.rdma.remote_addr = (uintptr_t)kept;
			wr.wr.rdma.rkey = live->rkey;
			post(&b, &wr);
			wait_wc(&b, IBV_WC_RDMA_WRITE);
			if (memcmp(src, kept, N) != 0)
				die("RDMA WRITE into the region live across the fork landed wrong");
			if (ibv_dereg_mr(ms) || ibv_dereg_mr(live))
				die("ibv_dereg_mr after fork");
		}
	}
	if (huge == MAP_FAILED) {
		printf("ok (no huge pages here)\n");
		return 0;
	}
	printf("ok (huge pages: %zu kB pages after registration)\n", kernel_page_kb(huge));
	return 0;
}
