// Command taproce-entrypoint is the entrypoint of the taproce image: it
// runs the appliance (`taproce run`) and, once the appliance's admin
// socket accepts connections, installs the CNI plugin onto the node —
// the taproce-cni binary into the node's CNI binary directory and
// taproce-cni chained into the node's primary network configuration —
// and taproce's libibverbs.so.1 and librdmacm.so.1 into the node's
// /opt/taproce/lib, for pods' unmodified ibverbs and RDMA CM programs,
// then keeps them in place while the appliance runs.
//
//	taproce-entrypoint [flags] [-- extra arguments of taproce run]
//
// The node's directories are expected where the DaemonSet mounts them:
// /host/opt/cni/bin, /host/etc/cni/net.d and /host/opt/taproce/lib; the
// libraries where the image has them, /usr/lib/taproce (-lib names that
// directory; a path to one of the libraries, the form -lib had when it
// installed libibverbs.so.1 alone, stands for its directory). The plugin
// is installed only after the appliance serves, so that pods the runtime
// creates meanwhile do not fail for want of it; when another installer
// (the cluster's network plugin rewriting its configuration) undoes the
// chaining, the next check, every -resync, redoes it.
//
// SIGTERM and SIGINT are passed to the appliance; the entrypoint exits
// with the appliance's status. By default it leaves the plugin installed
// when it stops (a restarting appliance adopts its pods, and pods created
// meanwhile are retried by the kubelet); -uninstall-on-exit takes it out,
// and -uninstall alone takes it out and exits, for removing taproce from
// a node.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/taproce/taproce/config"
	"github.com/taproce/taproce/internal/ibvlib"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "devel"

// Defaults of the flags: the image's layout and the DaemonSet's mounts.
const (
	DefaultTaproce = "/usr/local/bin/taproce"
	DefaultPlugin  = "/usr/local/bin/taproce-cni"
	DefaultConfig  = "/etc/taproce/taproce.toml"
	DefaultBinDir  = "/host/opt/cni/bin"
	DefaultConfDir = "/host/etc/cni/net.d"
	// DefaultLibSrc is where the image has taproce's libraries
	// (ibvlib.Names), and DefaultLibDir the node's /opt/taproce/lib as
	// the DaemonSet mounts it, which pods mount in turn.
	DefaultLibSrc = "/usr/lib/taproce"
	DefaultLibDir = "/host/opt/taproce/lib"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command line.
type options struct {
	taproce, configPath string
	install             Installer
	resync, readyWait   time.Duration
	installOnly         bool
	uninstall           bool
	uninstallOnExit     bool
	runArgs             []string
}

func parseFlags(args []string, stdout, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("taproce-entrypoint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.taproce, "taproce", DefaultTaproce, "the appliance's `binary`")
	fs.StringVar(&o.configPath, "config", DefaultConfig, "the appliance's configuration `file`, given to taproce run")
	fs.StringVar(&o.install.Plugin, "plugin", DefaultPlugin, "the taproce-cni `binary` to install")
	fs.StringVar(&o.install.BinDir, "cni-bin-dir", DefaultBinDir, "the node's CNI binary `directory`, as mounted")
	fs.StringVar(&o.install.ConfDir, "cni-conf-dir", DefaultConfDir, "the node's CNI configuration `directory`, as mounted")
	fs.StringVar(&o.install.LibSrc, "lib", DefaultLibSrc, "the `directory` of taproce's "+strings.Join(ibvlib.Names, " and ")+
		" to install for pods' ibverbs and RDMA CM programs (a path to one of them: its directory; empty: none)")
	fs.StringVar(&o.install.LibDir, "lib-dir", DefaultLibDir, "the node's `directory` for the libraries, as mounted; pods mount it and name it in LD_LIBRARY_PATH")
	fs.StringVar(&o.install.Mode, "mode", ModePrimary, "`how` the network configuration names taproce-cni: primary (chain it into the first configuration), file (install -conflist), none (only the binary, e.g. for Multus)")
	fs.StringVar(&o.install.Conflist, "conflist", "", "the conflist `file` mode file installs")
	fs.StringVar(&o.install.Entry.PortName, "port-name", "", "the pods' TAP device `name` in the chained entry (default: the plugin's, roce0)")
	fs.DurationVar(&o.resync, "resync", 30*time.Second, "how often to check that the plugin is still installed and chained")
	fs.DurationVar(&o.readyWait, "ready-timeout", time.Minute, "how long to wait for the appliance's admin socket before giving up")
	fs.BoolVar(&o.installOnly, "install-only", false, "install the plugin and the libraries and exit, without running the appliance")
	fs.BoolVar(&o.uninstall, "uninstall", false, "remove the plugin, its entries and the libraries and exit")
	fs.BoolVar(&o.uninstallOnExit, "uninstall-on-exit", false, "remove the plugin, its entries and the libraries when the appliance stops")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce-entrypoint [flags] [-- extra arguments of taproce run]")
		fmt.Fprintf(stderr, "\nRuns the appliance and installs the CNI plugin and taproce's %s onto the node. Flags:\n", strings.Join(ibvlib.Names, " and "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *showVersion {
		fmt.Fprintf(stdout, "taproce-entrypoint %s\n", version)
		return nil, flag.ErrHelp
	}
	o.runArgs = fs.Args()
	// -lib naming one of the libraries (it named libibverbs.so.1 when
	// that was the only one) stands for the directory holding them.
	if slices.Contains(ibvlib.Names, filepath.Base(o.install.LibSrc)) {
		o.install.LibSrc = filepath.Dir(o.install.LibSrc)
	}
	switch o.install.Mode {
	case ModePrimary, ModeNone:
	case ModeFile:
		if o.install.Conflist == "" {
			return nil, errors.New("-mode file needs -conflist")
		}
	default:
		return nil, fmt.Errorf("-mode %q is not primary, file or none", o.install.Mode)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "taproce-entrypoint: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil)).With("component", "entrypoint")
	o.install.Logger = logger
	if o.uninstall {
		if _, err := o.install.Uninstall(); err != nil {
			logger.Error("uninstall failed", "err", err)
			return 1
		}
		return 0
	}
	cfg, err := config.Load(o.configPath)
	if err != nil {
		logger.Error("appliance configuration", "err", err)
		return 1
	}
	o.install.Entry.AdminSocket = cfg.AdminSocket
	if o.installOnly {
		if _, err := o.install.Install(); err != nil {
			logger.Error("install failed", "err", err)
			return 1
		}
		return 0
	}
	return supervise(o, cfg, logger)
}

// supervise runs the appliance as a child, passes signals on, installs the
// plugin once the admin socket accepts and re-checks it every o.resync,
// and returns the appliance's exit status.
func supervise(o *options, cfg *config.Config, logger *slog.Logger) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	cmd := exec.Command(o.taproce, append([]string{"run", "--config", o.configPath}, o.runArgs...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		logger.Error("starting the appliance", "binary", o.taproce, "err", err)
		return 1
	}
	logger.Info("appliance started", "pid", cmd.Process.Pid, "version", version)
	exited := make(chan int, 1)
	go func() { exited <- exitStatus(cmd.Wait()) }()

	ready := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { ready <- waitSocket(ctx, cfg.AdminSocket, o.readyWait) }()

	retry := time.NewTimer(time.Hour)
	retry.Stop()
	installed := false
	for {
		select {
		case s := <-sigs:
			logger.Info("passing the signal on to the appliance", "signal", s.String())
			_ = cmd.Process.Signal(s)
		case err := <-ready:
			if err != nil {
				logger.Error("the appliance's admin socket does not accept connections; stopping it", "socket", cfg.AdminSocket, "err", err)
				_ = cmd.Process.Signal(syscall.SIGTERM)
				continue
			}
			installed = tryInstall(&o.install, logger, installed)
			retry.Reset(nextCheck(installed, o.resync))
		case <-retry.C:
			installed = tryInstall(&o.install, logger, installed)
			retry.Reset(nextCheck(installed, o.resync))
		case code := <-exited:
			retry.Stop()
			logger.Info("appliance exited", "status", code)
			if o.uninstallOnExit {
				if _, err := o.install.Uninstall(); err != nil {
					logger.Error("uninstall on exit", "err", err)
				}
			}
			return code
		}
	}
}

// nextCheck is when the next Install runs: soon while the first has not
// succeeded (the cluster's network plugin may not have written its
// configuration yet), every resync after.
func nextCheck(installed bool, resync time.Duration) time.Duration {
	if !installed {
		return min(resync, 2*time.Second)
	}
	return resync
}

// tryInstall installs and reports success; a failure is logged (once it
// worked, as a warning: something undid it).
func tryInstall(in *Installer, logger *slog.Logger, before bool) bool {
	res, err := in.Install()
	if err != nil {
		if errors.Is(err, ErrNoPrimary) && !before {
			logger.Info("waiting for the cluster's network configuration to chain into", "dir", in.ConfDir)
		} else {
			logger.Warn("installing the CNI plugin", "err", err)
		}
		return false
	}
	if !before {
		logger.Info("CNI plugin in place", "binary", res.Binary, "conf", res.Conf, "mode", in.Mode, "libs", res.Libs)
	}
	return true
}

// waitSocket waits until a unix socket at path accepts a connection.
func waitSocket(ctx context.Context, path string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exitStatus turns a child's Wait result into an exit status: its own, or
// 128 + the signal that killed it.
func exitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}
