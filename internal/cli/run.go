package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/taproce/taproce/appliance/daemon"
	"github.com/taproce/taproce/config"
)

// errNoConfig is the usage error of `taproce run` without --config: the
// daemon has no default configuration, so it names where an example is.
var errNoConfig = errors.New("--config FILE is required (config/taproce.toml in the source tree is an example; `taproce config FILE` checks one)")

// runRun implements `taproce run --config FILE`: the appliance daemon. It
// serves until SIGTERM or SIGINT, shuts down, and exits 0 when the
// shutdown was clean; 1 when the daemon could not start or failed; 2 for
// a wrong command line.
func runRun(args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "the appliance's configuration `FILE` (TOML; see `taproce config`)")
	level := fs.String("log-level", "", "log `level`: debug, info, warn or error (default: the file's log_level)")
	format := fs.String("log-format", "json", "log `format`: json or text")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce run --config FILE [--log-level LEVEL] [--log-format json|text]")
		fmt.Fprintln(stderr, "\nRuns the appliance until SIGTERM or SIGINT. Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() != 0:
		fmt.Fprintf(stderr, "taproce run: unexpected arguments %q\n\n", fs.Args())
		fs.Usage()
		return 2
	case *path == "":
		fmt.Fprintf(stderr, "taproce run: %v\n\n", errNoConfig)
		fs.Usage()
		return 2
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *level != "" {
		cfg.LogLevel = *level
	}
	logger, err := newLogger(stderr, cfg.LogLevel, *format)
	if err != nil {
		fmt.Fprintf(stderr, "taproce run: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon.Run(ctx, cfg, logger); err != nil {
		logger.Error("appliance failed", "err", err)
		return 1
	}
	return 0
}

// newLogger returns a structured logger writing to w at level in format
// (json or text).
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	switch level {
	case config.LogDebug:
		l = slog.LevelDebug
	case config.LogInfo:
		l = slog.LevelInfo
	case config.LogWarn:
		l = slog.LevelWarn
	case config.LogError:
		l = slog.LevelError
	default:
		return nil, fmt.Errorf("log level %q is not one of debug, info, warn, error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q is not json or text", format)
}
