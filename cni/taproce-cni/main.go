// Command taproce-cni is the CNI plugin that attaches taproce RDMA ports
// to pods; see package github.com/taproce/taproce/cni.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/taproce/taproce/cni"
)

func main() {
	skel.PluginMainFuncs(cni.Funcs(), cni.Versions, cni.About())
}
