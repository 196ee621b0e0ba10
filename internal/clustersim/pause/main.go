// Command pause is the process of a pod sandbox in internal/clustersim's
// CRI test (TestCRI), as the kubelet's pause image holds a pod's
// namespaces: it waits, reaping whatever children it inherits, until
// SIGINT or SIGTERM ends it. Built static (CGO_ENABLED=0), it is the one
// file of the sandbox image the test writes itself, so that no registry
// is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
