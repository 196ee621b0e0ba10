/* A user's program, built against Debian's libibverbs-dev and
 * librdmacm-dev, whose waits a signal interrupts: with a SIGALRM handler
 * installed without SA_RESTART (as qperf installs its test timer),
 * ibv_get_cq_event on an armed CQ that gets no completion,
 * ibv_get_async_event with no event, and rdma_get_cm_event on a channel
 * with no event each fail with EINTR when the timer fires, as rdma-core's
 * do, instead of waiting on. It prints "ok" and exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "die.h"

static volatile sig_atomic_t fired;

static void on_alarm(int sig)
{
	(void)sig;
	fired++;
}

/* arm makes SIGALRM come in 100 ms. */
static void arm(void)
{
	struct itimerval t = {.it_value = {.tv_usec = 100000}};
	if (setitimer(ITIMER_REAL, &t, NULL))
		die("setitimer");
}

int main(void)
{
	struct sigaction sa = {.sa_handler = on_alarm};
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL))
		die("sigaction");

	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (l == NULL || n < 1)
		die("no device");
	struct ibv_context *ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (ctx == NULL)
		die("ibv_open_device");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (cq == NULL || ibv_req_notify_cq(cq, 0))
		die("an armed CQ");

	arm();
	struct ibv_cq *ecq;
	void *ectx;
	errno = 0;
	if (ibv_get_cq_event(ch, &ecq, &ectx) != -1 || errno != EINTR || fired != 1)
		die("ibv_get_cq_event interrupted: want -1 and EINTR");

	arm();
	struct ibv_async_event ev;
	errno = 0;
	if (ibv_get_async_event(ctx, &ev) != -1 || errno != EINTR || fired != 2)
		die("ibv_get_async_event interrupted: want -1 and EINTR");

	struct rdma_event_channel *ech = rdma_create_event_channel();
	if (ech == NULL)
		die("rdma_create_event_channel");
	arm();
	struct rdma_cm_event *cev;
	errno = 0;
	if (rdma_get_cm_event(ech, &cev) != -1 || errno != EINTR || fired != 3)
		die("rdma_get_cm_event interrupted: want -1 and EINTR");

	rdma_destroy_event_channel(ech);
	if (ibv_destroy_cq(cq) || ibv_destroy_comp_channel(ch) || ibv_close_device(ctx))
		die("cleanup");
	printf("ok\n");
	return 0;
}
