"""Moves data over an RC QP between two processes with rdma-core's Python
bindings (python3-pyverbs), unmodified: a server and its client, each on
its own device (in the lab, each in its own network namespace), which
exchange their QP's number, PSN, GID and region over TCP, as
ibv_rc_pingpong does. The client then does SEND with immediate, RDMA
WRITE, RDMA READ and FETCH_ADD on the server's QP and region, and each is
checked at both ends: the side that did not post it checks it too, told
over TCP when to look. Each side prints "ok" when every check held; any
failure raises (exit status 1).

Usage: python3 pyverbs_rc.py -d DEVICE [-g GID_INDEX] [-p PORT] [SERVER]
(without SERVER: the server, listening on PORT).
"""

import argparse
import json
import os
import socket
import sys

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

SIZE = 8192
HALF = SIZE // 2
IMM = 0x12345678
ADD = 41
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
          e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)

# What each step moves: SEND's message, RDMA WRITE's pattern (into the
# second half of the server's region), the server's region that RDMA READ
# fetches, and the counter FETCH_ADD adds to.
MESSAGE = bytes((i * 7 + 3) & 0xFF for i in range(SIZE))
PATTERN = bytes((255 - i) & 0xFF for i in range(HALF))
REGION = bytes((i * 13 + 5) & 0xFF for i in range(SIZE))
COUNTER = 0x0123456789ABCDEF


class End:
    """This side: a device, and on it a PD, a CQ, a region and an RC QP."""

    def __init__(self, name, gid_index):
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
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = ACCESS
        self.qp.to_init(attr)  # where it takes receives
        self.gid_index = gid_index
        self.gid = self.ctx.query_gid(1, gid_index)
        self.psn = int.from_bytes(os.urandom(3), "little")

    def info(self):
        """What the peer needs to reach this QP and region."""
        return {"qpn": self.qp.qp_num, "psn": self.psn, "gid": self.gid.gid,
                "rkey": self.mr.rkey, "addr": self.mr.buf}

    def connect(self, peer):
        """Moves the QP to RTS, addressed to the peer's QP (its info)."""
        attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_1024)
        attr.dest_qp_num = peer["qpn"]
        attr.rq_psn = peer["psn"]
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=self.gid_index,
                         hop_limit=64)
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

    def send_wr(self, wr_id, opcode, length, **kw):
        """A signaled send work request of length bytes of this region."""
        return SendWR(wr_id=wr_id, opcode=opcode, num_sge=1,
                      send_flags=e.IBV_SEND_SIGNALED,
                      sg=[SGE(self.mr.buf, length, self.mr.lkey)], **kw)

    def close(self):
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            obj.close()


class Line:
    """The TCP connection to the peer, one JSON value a line."""

    def __init__(self, sock):
        self.sock = sock
        self.file = sock.makefile("rw")

    def send(self, value):
        self.file.write(json.dumps(value) + "\n")
        self.file.flush()

    def recv(self):
        line = self.file.readline()
        if not line:
            raise RuntimeError("the peer closed the connection")
        return json.loads(line)

    def expect(self, word):
        got = self.recv()
        if got != word:
            raise RuntimeError(f"the peer said {got!r}, want {word!r}")


def check(what, got, want):
    if got != want:
        raise RuntimeError(f"{what}: got {got[:32]!r}…, want {want[:32]!r}…")


def counter(end):
    return int.from_bytes(end.mr.read(8, 0), sys.byteorder)


def server(end, line):
    # The receive is posted before the client learns where to send.
    end.qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(end.mr.buf, SIZE, end.mr.lkey)]))
    line.send(end.info())
    end.connect(line.recv())
    line.send("ready")

    # SEND with immediate: the client's message in the posted buffer.
    wc = end.wait(1)
    if wc.byte_len != SIZE or not wc.wc_flags & e.IBV_WC_WITH_IMM or wc.imm_data != IMM:
        raise RuntimeError(f"receive: {wc.byte_len} bytes, flags {wc.wc_flags:#x}, immediate {wc.imm_data:#x}")
    check("SEND", end.mr.read(SIZE, 0), MESSAGE)
    line.expect("sent")

    # RDMA READ: the client fetches the region, which stays as it was.
    end.mr.write(REGION, SIZE)
    line.send("read")
    line.expect("read")
    check("the region RDMA READ read", end.mr.read(SIZE, 0), REGION)
    line.send("write")

    # RDMA WRITE: the client's pattern in the region's second half.
    line.expect("written")
    check("RDMA WRITE", end.mr.read(HALF, HALF), PATTERN)

    # FETCH_ADD on the region's first 8 bytes.
    end.mr.write(COUNTER.to_bytes(8, sys.byteorder), 8)
    line.send("add")
    line.expect("added")
    if counter(end) != COUNTER + ADD:
        raise RuntimeError(f"FETCH_ADD: the counter is {counter(end):#x}, want {COUNTER + ADD:#x}")
    line.send("done")


def client(end, line):
    peer = line.recv()
    line.send(end.info())
    end.connect(peer)
    line.expect("ready")

    # SEND with immediate into the server's posted buffer.
    end.mr.write(MESSAGE, SIZE)
    end.qp.post_send(end.send_wr(2, e.IBV_WR_SEND_WITH_IMM, SIZE, imm_data=IMM))
    end.wait(2)
    line.send("sent")

    # RDMA READ: the server's whole region into this one.
    line.expect("read")
    end.mr.write(bytes(SIZE), SIZE)
    wr = end.send_wr(3, e.IBV_WR_RDMA_READ, SIZE)
    wr.set_wr_rdma(peer["rkey"], peer["addr"])
    end.qp.post_send(wr)
    end.wait(3)
    check("RDMA READ", end.mr.read(SIZE, 0), REGION)
    line.send("read")

    # RDMA WRITE: the pattern into the second half of the server's region.
    line.expect("write")
    end.mr.write(PATTERN, HALF)
    wr = end.send_wr(4, e.IBV_WR_RDMA_WRITE, HALF)
    wr.set_wr_rdma(peer["rkey"], peer["addr"] + HALF)
    end.qp.post_send(wr)
    end.wait(4)
    line.send("written")

    # FETCH_ADD: the server's counter comes back, and grows there.
    line.expect("add")
    end.mr.write(bytes(8), 8)
    wr = end.send_wr(5, e.IBV_WR_ATOMIC_FETCH_AND_ADD, 8)
    wr.set_wr_atomic(peer["rkey"], peer["addr"], ADD)
    end.qp.post_send(wr)
    end.wait(5)
    if counter(end) != COUNTER:
        raise RuntimeError(f"FETCH_ADD: fetched {counter(end):#x}, want {COUNTER:#x}")
    line.send("added")
    line.expect("done")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-d", "--device", required=True)
    p.add_argument("-g", "--gid-index", type=int, default=1)
    p.add_argument("-p", "--port", type=int, default=18515)
    p.add_argument("server", nargs="?")
    args = p.parse_args()
    end = End(args.device, args.gid_index)
    if args.server is None:
        with socket.create_server(("", args.port), family=socket.AF_INET6, dualstack_ipv6=True) as ls:
            conn, _ = ls.accept()
        with conn:
            server(end, Line(conn))
    else:
        with socket.create_connection((args.server, args.port)) as conn:
            client(end, Line(conn))
    end.close()
    print("ok")


if __name__ == "__main__":
    main()
