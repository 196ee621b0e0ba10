/* What libibverbs exports besides the verbs: strings, rates, sysfs
 * reads, and what a taproce device does not have (failing as libibverbs
 * fails for a device that lacks it). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "taproce.h"

TP_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const names[] = {
		"success", "local length error", "local QP operation error", "local EE context operation error",
		"local protection error", "Work Request Flushed Error", "memory management operation error",
		"bad response error", "local access error", "remote invalid request error", "remote access error",
		"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
		"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
		"invalid EE context state", "fatal error", "response timeout error", "general error", "TM error",
		"TM software rendezvous"};
	if ((unsigned)status < sizeof(names) / sizeof(names[0]))
		return names[status];
	return "unknown";
}

TP_EXPORT const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const names[] = {"unknown", "InfiniBand channel adapter", "InfiniBand switch",
					    "InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP", "unspecified"};
	if ((unsigned)node_type < sizeof(names) / sizeof(names[0]))
		return names[node_type];
	return "unknown";
}

TP_EXPORT const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const names[] = {"no state change (NOP)", "down", "init", "armed", "active", "active defer"};
	if ((unsigned)port_state < sizeof(names) / sizeof(names[0]))
		return names[port_state];
	return "unknown";
}

TP_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const names[] = {
		"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
		"local access violation work queue error", "communication established", "send queue drained",
		"path migrated", "path migration request error", "local catastrophic error", "port active", "port error",
		"LID change", "P_Key change", "SM change", "SRQ catastrophic error", "SRQ limit reached",
		"last WQE reached", "client reregistration", "GID table change", "WQ fatal"};
	if ((unsigned)event < sizeof(names) / sizeof(names[0]))
		return names[event];
	return "unknown";
}

/* The IB rates: multiples of 2.5 Gb/s, and Mb/s. */
static const struct {
	enum ibv_rate rate;
	int mult, mbps;
} rates[] = {
	{IBV_RATE_2_5_GBPS, 1, 2500},	  {IBV_RATE_5_GBPS, 2, 5000},	  {IBV_RATE_10_GBPS, 4, 10000},
	{IBV_RATE_20_GBPS, 8, 20000},	  {IBV_RATE_30_GBPS, 12, 30000},  {IBV_RATE_40_GBPS, 16, 40000},
	{IBV_RATE_60_GBPS, 24, 60000},	  {IBV_RATE_80_GBPS, 32, 80000},  {IBV_RATE_120_GBPS, 48, 120000},
	{IBV_RATE_14_GBPS, -1, 14062},	  {IBV_RATE_56_GBPS, -1, 56250},  {IBV_RATE_112_GBPS, -1, 112500},
	{IBV_RATE_168_GBPS, -1, 168750},  {IBV_RATE_25_GBPS, -1, 25781},  {IBV_RATE_100_GBPS, -1, 103125},
	{IBV_RATE_200_GBPS, -1, 206250},  {IBV_RATE_300_GBPS, -1, 309375}, {IBV_RATE_28_GBPS, 11, 28125},
	{IBV_RATE_50_GBPS, 20, 53125},	  {IBV_RATE_400_GBPS, 160, 425000}, {IBV_RATE_600_GBPS, 240, 637500},
	{IBV_RATE_800_GBPS, 320, 850000}, {IBV_RATE_1200_GBPS, 480, 1275000},
};
#define NRATES (sizeof(rates) / sizeof(rates[0]))

TP_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < NRATES; i++)
		if (rates[i].rate == rate)
			return rates[i].mult;
	return -1;
}

TP_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < NRATES; i++)
		if (rates[i].mult == mult && mult > 0)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

TP_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < NRATES; i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

TP_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < NRATES; i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

/* sysfs_path is ibv_get_sysfs_path's answer, decided once: SYSFS_PATH
 * without its trailing slashes (at most IBV_SYSFS_PATH_MAX bytes of it; an
 * empty one stays empty), unless the program runs set-user-ID, else /sys,
 * as rdma-core decides it. */
static const char *sysfs_path;
static pthread_once_t sysfs_once = PTHREAD_ONCE_INIT;

static void find_sysfs_path(void)
{
	const char *env = getuid() == geteuid() ? getenv("SYSFS_PATH") : NULL;
	char *p = env ? strndup(env, IBV_SYSFS_PATH_MAX) : NULL;
	if (p == NULL) {
		sysfs_path = "/sys";
		return;
	}
	for (size_t n = strlen(p); n > 0 && p[n - 1] == '/'; n--)
		p[n - 1] = '\0';
	sysfs_path = p;
}

TP_EXPORT const char *ibv_get_sysfs_path(void)
{
	pthread_once(&sysfs_once, find_sysfs_path);
	return sysfs_path;
}

/* ibv_read_sysfs_file reads dir/file into buf as rdma-core does: the
 * bytes read, a final newline replaced by the terminating NUL; -1 when it
 * cannot be opened or read, or when it fills buf with no newline at its
 * end (no room for the NUL); 0, buf untouched, for an empty file. */
TP_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char *path;
	if (asprintf(&path, "%s/%s", dir, file) < 0)
		return -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	int e = errno;
	close(fd);
	errno = e;
	if (n <= 0)
		return (int)n;
	if (buf[n - 1] == '\n')
		buf[--n] = '\0';
	else if ((size_t)n < size)
		buf[n] = '\0';
	else
		return -1;
	return (int)n;
}

TP_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, struct ibv_device *device, const char *fnfmt, ...)
{
	(void)buf, (void)size, (void)device, (void)fnfmt;
	errno = ENOENT;
	return -1;
}

TP_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr, uint8_t eth_mac[6],
					  uint16_t *vid)
{
	(void)context, (void)attr, (void)eth_mac, (void)vid;
	/* The appliance resolves the MAC of every address vector itself. */
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

TP_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}
TP_DEFAULT_VERSION(ibv_attach_mcast, "IBVERBS_1.1");

TP_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}
TP_DEFAULT_VERSION(ibv_detach_mcast, "IBVERBS_1.1");

TP_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp, (void)op, (void)flags;
	return 0; /* in order as the data arrives only, as a software NIC */
}

TP_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

TP_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

TP_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)context, (void)pd_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT void ibv_unimport_pd(struct ibv_pd *pd) { (void)pd; }

TP_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)pd, (void)mr_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT void ibv_unimport_mr(struct ibv_mr *mr) { (void)mr; }

TP_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)context, (void)dm_handle;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT void ibv_unimport_dm(struct ibv_dm *dm) { (void)dm; }
