/* The control protocol's messages, shared by taproce's libibverbs.so.1
 * and librdmacm.so.1 (msg.c). */
#ifndef TAPROCE_MSG_H
#define TAPROCE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "abi.h"

/* tp_connect connects to the appliance's control socket ($TAPROCE_SOCKET,
 * else the default). tp_call_sock sends a request (with fds) on sock and
 * waits for its reply, whose body must be rep_len bytes; it returns 0 or
 * -1 with errno (EIO when the appliance is gone or spoke nonsense), and
 * the reply's descriptors in fds_out (up to *nfds_out). The reply's errno
 * is the body's first field; the caller reads it. Callers serialise the
 * calls on one socket. */
int tp_connect(void);
int tp_call_sock(int sock, uint32_t *seq, uint16_t op, const void *req, size_t req_len, void *rep, size_t rep_len,
		 const int *fds, int nfds, int *fds_out, int *nfds_out);

#endif /* TAPROCE_MSG_H */
