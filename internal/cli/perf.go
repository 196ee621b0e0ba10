package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/taproce/taproce/internal/perf"
)

// singleProc runs the process on one P unless GOMAXPROCS says otherwise:
// perf and pingpong measure with one goroutine, as perftest and the
// pingpong tools measure with one thread, and the Go scheduler's other Ps
// would only spin up threads that look for work between two polls —
// taking the core the appliance's data path needs on a small machine
// (docs/performance-log.md, one P for the tools).
func singleProc() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// runPerf implements `taproce perf TEST [options] [server-address]`:
// perftest's ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw,
// ib_write_lat, ib_read_lat, ib_send_lat and ib_atomic_lat on a taproce
// device, speaking perftest's out-of-band protocol. It exits 0 when the
// test ran, 1 when it failed, 2 for a wrong command line.
func runPerf(args []string, stdout, stderr io.Writer) int {
	cfg, err := perf.ParseArgs(args)
	switch {
	case errors.Is(err, perf.ErrHelp):
		fmt.Fprint(stdout, perf.Usage())
		return 0
	case errors.Is(err, perf.ErrVersion):
		fmt.Fprintf(stdout, "Version: %s\n", perf.Version)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "taproce perf: %v\n\n%s", err, perf.Usage())
		return 2
	}
	singleProc()
	ctx, stop := interruptible()
	defer stop()
	if _, err := perf.Run(ctx, cfg, stdout); err != nil {
		printError(stderr, "perf", orInterrupted(ctx, err))
		return 1
	}
	return 0
}
