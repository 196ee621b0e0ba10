// Command taproce is the software RoCEv2 NIC's one binary: the appliance
// daemon, the lab, and the tools around them (internal/cli).
package main

import (
	"os"

	"github.com/taproce/taproce/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

func main() {
	cli.Version = version
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
