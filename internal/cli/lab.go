package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/taproce/taproce/appliance"
	"github.com/taproce/taproce/internal/cpulist"
	"github.com/taproce/taproce/internal/lab"
)

// labFlags are the flags of `taproce lab`.
type labFlags struct {
	fs      *flag.FlagSet
	o       lab.Options
	poll    *string
	rdmaMiB *int
	verbose *bool
}

// newLabFlags defines the flags of `taproce lab`, with its usage written
// to stderr. No usage string back-quotes a word: the flag package would
// print that word as the flag's argument, a bool flag's too.
func newLabFlags(stderr io.Writer) *labFlags {
	f := &labFlags{fs: flag.NewFlagSet("lab", flag.ContinueOnError)}
	fs, o := f.fs, &f.o
	fs.SetOutput(stderr)
	fs.IntVar(&o.Hosts, "hosts", 2, "number of host namespaces")
	fs.IntVar(&o.MTU, "mtu", 1500, "MTU of veths, bridges and TAPs (9000: the configuration the performance figures are measured in)")
	fs.StringVar(&o.Impair, "impair", "", `fault injection on every port, both directions: "loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,seed=7"; a bottleneck link: "rate=1gbit,queue=256KiB,ecn=32KiB"`)
	fs.StringVar(&o.Pcap, "pcap", "", "write every frame the ports send and receive to this pcap file")
	fs.BoolVar(&o.Keep, "keep", false, "leave the lab up until interrupted (Ctrl-C, or \"taproce lab down\" from a second terminal), serving verbs clients")
	fs.BoolVar(&o.Offload, "super-frames", true, "move many RoCE packets per TAP syscall (UDP GSO)")
	fs.IntVar(&o.Frames, "frames", 20000, "RoCE frames per direction in the exchange")
	fs.IntVar(&o.KernelLoss, "kernel-loss", 0, "percent of RoCE packets the kernels drop on each veth (nftables; needs nft)")
	fs.BoolVar(&o.Redirect, "redirect", false, "attach the ports in redirect mode, as pods' are: each veth carries its kernel's addresses, without a bridge, and the port shares them and the veth's MAC, tc moving RoCEv2 between veth and TAP; for programs that use one address for their sockets and for RDMA (qperf -cm1, libfabric's verbs provider); --kernel-loss is then skipped (default: bridge mode, each port a host of its own with addresses of its own)")
	fs.BoolVar(&o.LocalSwitch, "local-switch", false, "let the ports' traffic cross in memory instead of through the TAPs and the veth")
	fs.StringVar(&o.Socket, "socket", "", "control socket of the lab's appliance (default "+lab.DefaultSocket+")")
	f.poll = fs.String("poll", "adaptive", `how the appliance waits for its clients' posts: "block", "spin" or "adaptive"`)
	fs.IntVar(&o.Procs, "procs", 0, "processors the appliance runs on while clients use it, as the config's procs (0: as --poll chooses: for spin half of them, two where there are two or three; all otherwise)")
	fs.StringVar(&o.CPUs, "cpus", "", `processors the appliance runs on while clients use it, as the config's cpus ("1", "2-3"); the client processes run on the others (default: all, for both)`)
	fs.StringVar(&o.LibDir, "lib", "", "directory of taproce's libibverbs.so.1, on which the lab runs Debian's ibv_rc_pingpong, ib_write_bw and ib_send_lat (default: $TAPROCE_LIBDIR, else ../lib/taproce beside taproce, /usr/local/lib/taproce, /usr/lib/taproce, else built with make in the source checkout the lab runs in)")
	f.rdmaMiB = fs.Int("rdma-mib", 64, "MiB moved by RDMA WRITE and read back by RDMA READ between the first two hosts (0: skip)")
	f.verbose = fs.Bool("v", false, "log port events")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce lab [flags]    build the lab, run the checks and the exchange, print the results")
		fmt.Fprintln(stderr, "       taproce lab down       remove a lab left up (--keep) or left behind")
		fmt.Fprintln(stderr, "\nNeeds root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and /dev/net/tun; no kernel RDMA support.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	return f
}

// runLab implements `taproce lab [flags]` and `taproce lab down`.
func runLab(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "down" {
		r, err := lab.Down("")
		if err != nil {
			fmt.Fprintf(stderr, "taproce lab down: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, r)
		return 0
	}
	f := newLabFlags(stderr)
	fs, o := f.fs, &f.o
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	o.Out = stdout
	pm, err := appliance.ParsePollMode(*f.poll)
	if err != nil {
		fmt.Fprintln(stderr, "taproce lab:", err)
		return 2
	}
	o.Poll = pm
	if o.Procs < 0 {
		fmt.Fprintf(stderr, "taproce lab: --procs %d: want 0 or more\n", o.Procs)
		return 2
	}
	if o.CPUs != "" {
		if _, err := cpulist.Parse(o.CPUs); err != nil {
			fmt.Fprintf(stderr, "taproce lab: --cpus: %v\n", err)
			return 2
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "taproce lab: needs root (network namespaces, TAP devices)")
		return 2
	}
	o.RDMA = *f.rdmaMiB << 20
	if *f.rdmaMiB <= 0 {
		o.RDMA = -1
	}
	if *f.verbose {
		o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := lab.Run(ctx, *o); err != nil {
		if !errors.Is(err, lab.ErrFailed) {
			fmt.Fprintf(stderr, "taproce lab: %v\n", err)
			return 2
		}
		return 1
	}
	return 0
}
