// Command taproce is the software RoCEv2 NIC's one binary: the appliance
// daemon, the lab, and the tools around them.
//
//	taproce run --config FILE         the appliance daemon
//	taproce lab [flags]               the veth-pair lab: namespaces, ports, checks, RDMA, client processes
//	taproce devices | devinfo         the devices this namespace may use (ibv_devices, ibv_devinfo)
//	taproce pingpong [flags] [host]   ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong
//	taproce perf TEST [flags] [host]  perftest: write_bw, read_bw, send_bw, atomic_bw, *_lat
//	taproce decode [--json] FILE...   dissect RoCEv2 captures, check every ICRC
//	taproce config FILE               check an appliance configuration
//	taproce version                   print the version
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
)

// command is one subcommand: it gets the arguments after its name and
// returns the process exit status.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"config":  {"check an appliance configuration file", runConfig},
	"decode":  {"dissect RoCEv2 frames in pcap/pcapng files and check their ICRC", runDecode},
	"lab":     {"build a lab of network namespaces with a taproce port in each and prove it works", runLab},
	"version": {"print the version", runVersion},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	case "-version", "--version":
		return runVersion(nil, stdout, stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "taproce: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "taproce: a software RoCEv2 NIC in user space")
	fmt.Fprintln(w, "\nUsage: taproce COMMAND [ARGS]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'taproce COMMAND -h' for a command's flags.")
}

// version is set at build time with -ldflags "-X main.version=…"; without
// it the module version or VCS revision from the build info is used.
var version = ""

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			return v
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "devel-" + s.Value[:12]
			}
		}
	}
	return "devel"
}

func runVersion(_ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "taproce %s\n", versionString())
	return 0
}
