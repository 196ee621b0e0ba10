package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/taproce/taproce/internal/pingpong"
)

// runPingpong is `taproce pingpong [options] [server]`: the rdma-core
// pingpong tools' behaviour, flags, output and out-of-band exchange, as a
// client process of the appliance (verbs.Socket, TAPROCE_SOCKET).
func runPingpong(args []string, stdout, stderr io.Writer) int {
	const argv0 = "taproce pingpong"
	o, err := pingpong.ParseArgs(args)
	if errors.Is(err, pingpong.ErrHelp) {
		pingpong.Usage(stdout, argv0)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", argv0, err)
		pingpong.Usage(stderr, argv0)
		return 2
	}
	singleProc()
	ctx, stop := interruptible()
	defer stop()
	if _, err := pingpong.Run(ctx, o, pingpong.Env{}, stdout); err != nil {
		printError(stderr, "pingpong", orInterrupted(ctx, err))
		return 1
	}
	return 0
}
