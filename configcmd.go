package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/taproce/taproce/config"
)

// runConfig implements `taproce config FILE`: it checks an appliance
// configuration and prints every problem with its line, or a summary.
func runConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce config FILE    check an appliance configuration (exit 1 when invalid)")
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	c, err := config.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok: socket %s, log level %s, %d port(s)\n", fs.Arg(0), c.Socket, c.LogLevel, len(c.Ports))
	for _, p := range c.Ports {
		fmt.Fprintf(stdout, "  port %s/%s mode %s mtu %d addresses %v\n", p.Namespace, p.Name, p.Mode, p.MTU, p.Addresses)
	}
	return 0
}
