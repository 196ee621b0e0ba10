package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"

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
	printConfig(stdout, c)
	return 0
}

// printConfig prints every setting of c, defaults included.
func printConfig(w io.Writer, c *config.Config) {
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	orOff := func(s, what string) string {
		if s == "" {
			return "off"
		}
		return s + what
	}
	l := c.Limits
	fmt.Fprintf(w, "  control socket   %s\n", c.Socket)
	fmt.Fprintf(w, "  socket access    %s\n", socketAccess(c))
	if c.ListAllDevices {
		fmt.Fprintf(w, "  device listing   all devices, other namespaces' unusable\n")
	} else {
		fmt.Fprintf(w, "  device listing   a client's own namespace's only\n")
	}
	fmt.Fprintf(w, "  admin socket     %s\n", c.AdminSocket)
	fmt.Fprintf(w, "  metrics          %s\n", orOff(c.MetricsAddress, " (/metrics, /healthz)"))
	fmt.Fprintf(w, "  state file       %s\n", orOff(c.StateFile, ""))
	fmt.Fprintf(w, "  local switch     %s\n", onOff(c.LocalSwitch))
	fmt.Fprintf(w, "  poll             %s\n", c.Poll)
	if c.Procs > 0 {
		fmt.Fprintf(w, "  procs            %d\n", c.Procs)
	} else {
		fmt.Fprintf(w, "  procs            chosen by poll\n")
	}
	if c.CPUs != "" {
		fmt.Fprintf(w, "  cpus             %s\n", c.CPUs)
	} else {
		fmt.Fprintf(w, "  cpus             all\n")
	}
	fmt.Fprintf(w, "  linger           %v\n", c.Linger)
	fmt.Fprintf(w, "  default MTU      %d\n", c.DefaultMTU)
	a := c.ApplianceLimits
	fmt.Fprintf(w, "  client limits    %s\n", objectLimits(l))
	fmt.Fprintf(w, "  appliance limits %s\n", objectLimits(a.Limits))
	fmt.Fprintf(w, "  connections      %d, %d per user\n", a.Connections, a.ConnectionsPerUID)
	if a.Descriptors > 0 {
		fmt.Fprintf(w, "  descriptors      %d for clients\n", a.Descriptors)
	} else {
		fmt.Fprintf(w, "  descriptors      3/4 of RLIMIT_NOFILE for clients\n")
	}
	for _, p := range c.Ports {
		fmt.Fprintf(w, "  port %s/%s mode %s mtu %d addresses %v", p.Namespace, p.Name, p.Mode, p.MTU, p.Addresses)
		if p.MAC != nil {
			fmt.Fprintf(w, " mac %s", p.MAC)
		}
		if p.Impair.Ingress.Enabled() {
			fmt.Fprintf(w, " ingress %q", p.Impair.Ingress.String())
		}
		if p.Impair.Egress.Enabled() {
			fmt.Fprintf(w, " egress %q", p.Impair.Egress.String())
		}
		fmt.Fprintln(w)
	}
}

// objectLimits lists the limits of a [limits] table.
func objectLimits(l config.Limits) string {
	return fmt.Sprintf("%d QPs, %d CQs, %d SRQs, %d MRs, %d PDs, %d AHs, %d channels, %s of MRs",
		l.QPs, l.CQs, l.SRQs, l.MRs, l.PDs, l.AHs, l.Channels, byteSize(l.MRBytes))
}

// socketAccess says who may connect to the control socket.
func socketAccess(c *config.Config) string {
	if strings.HasPrefix(c.Socket, "@") {
		return "abstract: any process in the appliance's network namespace"
	}
	group := "the appliance's group"
	if c.SocketGroup != "" {
		group = "group " + c.SocketGroup
	}
	return fmt.Sprintf("mode %04o, %s", uint32(c.SocketMode), group)
}

// byteSize writes n bytes in the largest binary unit that divides it.
func byteSize(n int64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
