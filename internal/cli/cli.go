// Package cli is the taproce command: every subcommand, registered in one
// table (commands), and the dispatch from the command line to them. The
// binary's main only calls Main.
//
//	taproce run --config FILE         the appliance daemon
//	taproce lab [flags]               the veth-pair lab: namespaces, ports, checks, RDMA, client processes
//	taproce devices | devinfo         the devices this namespace may use (ibv_devices, ibv_devinfo)
//	taproce exec [flags] -- PROG ...  run an unmodified libibverbs program on taproce
//	taproce pingpong [flags] [host]   ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong
//	taproce perf TEST [flags] [host]  perftest: write_bw, read_bw, send_bw, atomic_bw, *_lat
//	taproce rdma-demo listen|dial     two applications check each other's RDMA
//	taproce decode [--json] FILE...   dissect RoCEv2 captures, check every ICRC
//	taproce config FILE               check an appliance configuration
//	taproce version                   print the version
package cli

import (
	"fmt"
	"io"
	"runtime/debug"
	"sort"
)

// command is one subcommand: it gets the arguments after its name and
// returns the process exit status (0 done, 1 failed, 2 usage).
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is every subcommand, by name: the one place they are
// registered.
var commands = map[string]command{
	"config":        {"check an appliance configuration file", runConfig},
	"decode":        {"dissect RoCEv2 frames in pcap/pcapng files and check their ICRC", runDecode},
	"device-plugin": {"serve the kubelet's device-plugin API for taproce.io/roce, and write its CDI spec", runDevicePlugin},
	"devices":       {"list the appliance's devices, as ibv_devices does", runDevices},
	"devinfo":       {"show devices' attributes, as ibv_devinfo does", runDevinfo},
	"exec":          {"run an unmodified libibverbs program (ibv_*, perftest, UCX, pyverbs) on the appliance's devices", runExec},
	"lab":           {"build a lab of network namespaces with a taproce port in each and prove it works", runLab},
	"perf":          {"measure RDMA bandwidth and latency as perftest does (write_bw, send_lat, …), against perftest or taproce", runPerf},
	"pingpong":      {"ibv_rc_pingpong, ibv_uc_pingpong and ibv_ud_pingpong on the appliance's verbs", runPingpong},
	"rdma-demo":     {"exchange data with RDMA WRITE, READ and FETCH_ADD between two applications and check it (a smoke test)", runRDMADemo},
	"run":           {"run the appliance daemon: ports, verbs, admin API for the CNI plugin, metrics", runRun},
	"version":       {"print the version", runVersion},
}

// Version is the binary's version when it was set at build time (main's
// -ldflags "-X main.version=…"); empty, the module version or VCS
// revision from the build info is used.
var Version = ""

// Main runs the command line args (without the program name) and returns
// the process's exit status.
func Main(args []string, stdout, stderr io.Writer) int {
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
		fmt.Fprintf(w, "  %-13s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'taproce COMMAND -h' for a command's flags.")
}

func versionString() string {
	if Version != "" {
		return Version
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
