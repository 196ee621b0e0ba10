"""Moves data over an RC QP between taproce0 and taproce1 with rdma-core's
Python bindings (python3-pyverbs), unmodified: SEND with immediate, RDMA
WRITE, RDMA READ and FETCH_ADD, each checked at both ends. Prints "ok"
when every check held; any failure raises (exit status 1).

Usage: python3 pyverbs_rc.py [GID_INDEX]
"""

import os
import sys

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

SIZE = 8192
GID = int(sys.argv[1]) if len(sys.argv) > 1 else 1
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
          e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)


class End:
    """One side: a device, and on it a PD, a CQ, a region and an RC QP."""

    def __init__(self, name):
        self.ctx = Context(name=name)
        port = self.ctx.query_port(1)
        if port.state != e.IBV_PORT_ACTIVE:
            raise RuntimeError(f"{name}: port 1 is not active ({port.state})")
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64)
        self.mr = MR(self.pd, SIZE, ACCESS)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1,
                    max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq,
                                         rcq=self.cq, cap=cap))
        self.gid = self.ctx.query_gid(1, GID)
        self.psn = int.from_bytes(os.urandom(3), "little")

    def connect(self, peer):
        """Moves the QP to RTS, addressed to peer's QP."""
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = ACCESS
        self.qp.to_init(attr)
        attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_1024)
        attr.dest_qp_num = peer.qp.qp_num
        attr.rq_psn = peer.psn
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        gr = GlobalRoute(dgid=peer.gid, sgid_index=GID, hop_limit=64)
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
        self.qp.to_rtr(attr)
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.sq_psn = self.psn
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)

    def wait(self, wr_id):
        """Polls the CQ for wr_id's completion, which must be a success."""
        for _ in range(10_000_000):
            n, wcs = self.cq.poll()
            if n:
                wc = wcs[0]
                if wc.status != e.IBV_WC_SUCCESS:
                    raise RuntimeError(f"work request {wc.wr_id}: status {wc.status}")
                if wc.wr_id != wr_id:
                    raise RuntimeError(f"completion of {wc.wr_id}, want {wr_id}")
                return wc
        raise RuntimeError(f"no completion for work request {wr_id}")


def check(what, got, want):
    if got != want:
        raise RuntimeError(f"{what}: got {got[:32]!r}…, want {want[:32]!r}…")


def main():
    a, b = End("taproce0"), End("taproce1")
    a.connect(b)
    b.connect(a)

    # SEND with immediate: a's pattern lands in b's posted buffer.
    msg = bytes((i * 7 + 3) & 0xFF for i in range(SIZE))
    a.mr.write(msg, SIZE)
    b.qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(b.mr.buf, SIZE, b.mr.lkey)]))
    a.qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1,
                          imm_data=0x12345678, send_flags=e.IBV_SEND_SIGNALED,
                          sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)]))
    a.wait(2)
    wc = b.wait(1)
    if wc.byte_len != SIZE or not wc.wc_flags & e.IBV_WC_WITH_IMM:
        raise RuntimeError(f"receive: {wc.byte_len} bytes, flags {wc.wc_flags:#x}")
    check("SEND", b.mr.read(SIZE, 0), msg)

    # RDMA WRITE: another pattern into the second half of b's region.
    half = SIZE // 2
    pattern = bytes((255 - i) & 0xFF for i in range(half))
    a.mr.write(pattern, half)
    wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                send_flags=e.IBV_SEND_SIGNALED, sg=[SGE(a.mr.buf, half, a.mr.lkey)])
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf + half)
    a.qp.post_send(wr)
    a.wait(3)
    check("RDMA WRITE", b.mr.read(half, half), pattern)

    # RDMA READ: b's whole region back into a's.
    a.mr.write(bytes(SIZE), SIZE)
    wr = SendWR(wr_id=4, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                send_flags=e.IBV_SEND_SIGNALED, sg=[SGE(a.mr.buf, SIZE, a.mr.lkey)])
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(wr)
    a.wait(4)
    check("RDMA READ", a.mr.read(SIZE, 0), b.mr.read(SIZE, 0))

    # FETCH_ADD on b's first 8 bytes: the old value comes back, b's grows.
    old = int.from_bytes(b.mr.read(8, 0), sys.byteorder)
    wr = SendWR(wr_id=5, opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1,
                send_flags=e.IBV_SEND_SIGNALED, sg=[SGE(a.mr.buf, 8, a.mr.lkey)])
    wr.set_wr_atomic(b.mr.rkey, b.mr.buf, 41)
    a.qp.post_send(wr)
    a.wait(5)
    got_old = int.from_bytes(a.mr.read(8, 0), sys.byteorder)
    new = int.from_bytes(b.mr.read(8, 0), sys.byteorder)
    if got_old != old or new != (old + 41) % (1 << 64):
        raise RuntimeError(f"FETCH_ADD: fetched {got_old:#x} (want {old:#x}), now {new:#x}")

    for end in (a, b):
        end.qp.close()
        end.mr.close()
        end.cq.close()
        end.pd.close()
        end.ctx.close()
    print("ok")


if __name__ == "__main__":
    main()
