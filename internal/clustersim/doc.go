// Package clustersim holds the one-machine cluster simulation: a test
// that runs taproce as a Kubernetes cluster would, with real namespaces
// for the nodes and the pods, the real CNI chain (the reference bridge
// and host-local plugins, then taproce-cni) driven through libcni as a
// container runtime drives it, and RDMA between applications in the
// pods.
//
// Node 1 runs its appliance in the test process (daemon.Start) with the
// DaemonSet's configuration and the plain chained conflist of images/.
// Node 2 runs the image's entrypoint as the DaemonSet does: with only the
// capabilities the DaemonSet grants, it starts `taproce run`, installs
// taproce-cni into a CNI binary directory laid out like the node's and
// chains it into the node's primary conflist, which the test then uses
// as a runtime would. The nodes are joined by a veth and route each
// other's pod subnets, so a pod on node 2 reaches a pod on node 1 in
// redirect mode across the two appliances, while two pods on node 1 talk
// through its local switch.
//
// load_test.go fills a node: 64 pods attached by concurrent CNI ADDs,
// every port checked by a verbs client in its pod and by RoCEv2 from the
// node, then 64 concurrent DELs leaving nothing (TestLoad); and measures
// the resident memory of `taproce run` idle and with 64 pods × 16
// connected QPs against the targets (TestMemory). The test binary is
// itself the verbs client it runs in the pods.
//
// cri_test.go (TestCRI) does what the kubelet does with Debian's
// containerd: two nodes, each with containerd (its CRI plugin, the
// chained conflist of images/) and an appliance, run Debian's ib_write_bw
// and ibv_rc_pingpong, unmodified, in pods made through the CRI, whose
// containers get only what the device plugin's Allocate answers; pods on
// one node and across the nodes; nothing left after the pods are removed.
// It needs TAPROCE_IMAGE_TEST=1, containerd, runc and podman (the perftest
// image); pause/ is its sandbox's program.
//
// The package has no code of its own besides this comment and pause/;
// everything is in its tests. It needs root, /dev/net/tun, iproute2's ip
// and util-linux's setpriv, and skips without them.
package clustersim
