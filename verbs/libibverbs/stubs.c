/* The private symbols of rdma-core's libibverbs (IBVERBS_PRIVATE_34) that
 * its provider libraries import. Programs such as Debian's perftest link
 * libmlx5 and libefa, which do not load without them; with no mlx5 or EFA
 * device their code is never called, so each stands for the command it
 * names and fails as a device without it would (EOPNOTSUPP). Also the
 * conversions of kernel structures only rdma-core's librdmacm uses on
 * answers of the kernel, which taproce never gives. */
#include <errno.h>
#include <stdbool.h>

#include "taproce.h"

/* libmlx5 relocates against this flag of rdma-core's. */
TP_EXPORT bool verbs_allow_disassociate_destroy;

TP_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void *cmd)
{
	(void)cmd;
	return num_attrs;
}

TP_EXPORT void __verbs_log(void *ctx, unsigned int level, const char *fmt, ...)
{
	(void)ctx, (void)level, (void)fmt;
}

TP_EXPORT void verbs_register_driver_34(const void *ops) { (void)ops; }

/* ibv_register_driver@IBVERBS_1.1: the registration of a provider of the
 * oldest kind; there is nothing to register with. */
void tp_register_driver_1_1(const char *name, void *init_func);
void tp_register_driver_1_1(const char *name, void *init_func) { (void)name, (void)init_func; }

TP_EXPORT void *_verbs_init_and_alloc_context(void *device, int cmd_fd, size_t alloc_size, void *context_offset,
					      uint32_t driver_id)
{
	(void)device, (void)cmd_fd, (void)alloc_size, (void)context_offset, (void)driver_id;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT void *verbs_open_device(void *device, void *private_data)
{
	(void)device, (void)private_data;
	errno = EOPNOTSUPP;
	return NULL;
}

TP_EXPORT void verbs_set_ops(void *vctx, const void *ops) { (void)vctx, (void)ops; }
TP_EXPORT void verbs_uninit_context(void *context) { (void)context; }

TP_EXPORT int verbs_init_cq(void *cq, void *context, void *channel, void *cq_context)
{
	(void)cq, (void)context, (void)channel, (void)cq_context;
	return EOPNOTSUPP;
}

TP_EXPORT int execute_ioctl(void *context, void *cmd)
{
	(void)context, (void)cmd;
	return EOPNOTSUPP;
}

/* The kernel structures' conversions: no kernel answers, nothing to copy. */
TP_EXPORT void ibv_copy_qp_attr_from_kern(void *dst, const void *src) { (void)dst, (void)src; }
TP_EXPORT void ibv_copy_ah_attr_from_kern(void *dst, const void *src) { (void)dst, (void)src; }
TP_EXPORT void ibv_copy_path_rec_from_kern(void *dst, const void *src) { (void)dst, (void)src; }
TP_EXPORT void ibv_copy_path_rec_to_kern(void *dst, const void *src) { (void)dst, (void)src; }

#define TP_CMD(name)                                                                                                   \
	TP_EXPORT int name(void);                                                                                      \
	TP_EXPORT int name(void) { return EOPNOTSUPP; }

TP_CMD(ibv_cmd_advise_mr)
TP_CMD(ibv_cmd_alloc_dm)
TP_CMD(ibv_cmd_alloc_mw)
TP_CMD(ibv_cmd_alloc_pd)
TP_CMD(ibv_cmd_attach_mcast)
TP_CMD(ibv_cmd_close_xrcd)
TP_CMD(ibv_cmd_create_ah)
TP_CMD(ibv_cmd_create_counters)
TP_CMD(ibv_cmd_create_cq)
TP_CMD(ibv_cmd_create_cq_ex)
TP_CMD(ibv_cmd_create_flow)
TP_CMD(ibv_cmd_create_flow_action_esp)
TP_CMD(ibv_cmd_create_qp)
TP_CMD(ibv_cmd_create_qp_ex)
TP_CMD(ibv_cmd_create_qp_ex2)
TP_CMD(ibv_cmd_create_rwq_ind_table)
TP_CMD(ibv_cmd_create_srq)
TP_CMD(ibv_cmd_create_srq_ex)
TP_CMD(ibv_cmd_create_wq)
TP_CMD(ibv_cmd_dealloc_mw)
TP_CMD(ibv_cmd_dealloc_pd)
TP_CMD(ibv_cmd_dereg_mr)
TP_CMD(ibv_cmd_destroy_ah)
TP_CMD(ibv_cmd_destroy_counters)
TP_CMD(ibv_cmd_destroy_cq)
TP_CMD(ibv_cmd_destroy_flow)
TP_CMD(ibv_cmd_destroy_flow_action)
TP_CMD(ibv_cmd_destroy_qp)
TP_CMD(ibv_cmd_destroy_rwq_ind_table)
TP_CMD(ibv_cmd_destroy_srq)
TP_CMD(ibv_cmd_destroy_wq)
TP_CMD(ibv_cmd_detach_mcast)
TP_CMD(ibv_cmd_free_dm)
TP_CMD(ibv_cmd_get_context)
TP_CMD(ibv_cmd_modify_cq)
TP_CMD(ibv_cmd_modify_flow_action_esp)
TP_CMD(ibv_cmd_modify_qp)
TP_CMD(ibv_cmd_modify_qp_ex)
TP_CMD(ibv_cmd_modify_srq)
TP_CMD(ibv_cmd_modify_wq)
TP_CMD(ibv_cmd_open_qp)
TP_CMD(ibv_cmd_open_xrcd)
TP_CMD(ibv_cmd_poll_cq)
TP_CMD(ibv_cmd_post_recv)
TP_CMD(ibv_cmd_post_send)
TP_CMD(ibv_cmd_post_srq_recv)
TP_CMD(ibv_cmd_query_context)
TP_CMD(ibv_cmd_query_device_any)
TP_CMD(ibv_cmd_query_mr)
TP_CMD(ibv_cmd_query_port)
TP_CMD(ibv_cmd_query_qp)
TP_CMD(ibv_cmd_query_srq)
TP_CMD(ibv_cmd_read_counters)
TP_CMD(ibv_cmd_reg_dm_mr)
TP_CMD(ibv_cmd_reg_dmabuf_mr)
TP_CMD(ibv_cmd_reg_mr)
TP_CMD(ibv_cmd_req_notify_cq)
TP_CMD(ibv_cmd_rereg_mr)
TP_CMD(ibv_cmd_resize_cq)
