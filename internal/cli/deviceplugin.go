package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/taproce/taproce/deviceplugin"
)

// runDevicePlugin implements `taproce device-plugin`: the kubelet's device
// plugin for taproce.io/roce (package deviceplugin), beside the appliance
// in the DaemonSet, and the CDI spec of the same. It serves until SIGTERM
// or SIGINT and exits 0; 1 when it could not start; 2 for a wrong
// command line.
func runDevicePlugin(args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("device-plugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c deviceplugin.Config
	fs.StringVar(&c.Resource, "resource", deviceplugin.DefaultResource, "the extended resource's `name`")
	fs.IntVar(&c.Slots, "slots", deviceplugin.DefaultSlots, "how many pods of the node may hold the resource at once")
	fs.StringVar(&c.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin `directory`")
	fs.StringVar(&c.AdminSocket, "admin-socket", "/run/taproce/admin.sock", "the appliance's admin API `socket`, whose health makes the slots'")
	fs.StringVar(&c.SocketDir, "socket-dir", deviceplugin.DefaultSocketDir, "the `directory` of the appliance's control socket, mounted into containers")
	fs.StringVar(&c.LibDir, "lib-dir", deviceplugin.DefaultLibDir, "the `directory` of taproce's libibverbs.so.1 and librdmacm.so.1 on the node, mounted into containers")
	health := fs.String("health-address", "127.0.0.1:9477", "where to serve GET /healthz (200 once registered with the kubelet) for probes (`host:port`; empty: nowhere)")
	cdiDir := fs.String("cdi-dir", deviceplugin.DefaultCDIDir, "where to write the CDI spec (`directory`; empty: none)")
	level := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	format := fs.String("log-format", "json", "log `format`: json or text")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce device-plugin [flags]")
		fmt.Fprintln(stderr, "\nServes the kubelet's device-plugin API for taproce.io/roce until SIGTERM or SIGINT. Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "taproce device-plugin: unexpected arguments %q\n\n", fs.Args())
		fs.Usage()
		return 2
	}
	logger, err := newLogger(stderr, *level, *format)
	if err != nil {
		fmt.Fprintf(stderr, "taproce device-plugin: %v\n", err)
		return 2
	}
	c.Logger = logger
	p, err := deviceplugin.New(c)
	if err != nil {
		fmt.Fprintf(stderr, "taproce device-plugin: %v\n", err)
		return 2
	}
	if *cdiDir != "" {
		path, err := p.WriteCDISpec(*cdiDir)
		if err != nil {
			logger.Error("device plugin: writing the CDI spec", "err", err)
			return 1
		}
		logger.Info("device plugin: CDI spec written", "path", path, "device", p.Config().Resource+"="+deviceplugin.CDIDevice)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *health != "" {
		ln, err := net.Listen("tcp", *health)
		if err != nil {
			logger.Error("device plugin: the health check's address", "err", err)
			return 1
		}
		srv := &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	if err := p.Run(ctx); err != nil {
		logger.Error("device plugin failed", "err", err)
		return 1
	}
	return 0
}
