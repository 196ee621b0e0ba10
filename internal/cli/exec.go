package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/taproce/taproce/internal/ibvlib"
	"github.com/taproce/taproce/internal/runon"
	"github.com/taproce/taproce/verbs"
)

// execTimeout bounds the talk with the appliance before the program runs.
const execTimeout = 10 * time.Second

// runExec is `taproce exec [flags] [--] PROGRAM ARGS…`: PROGRAM, an
// unmodified program linked against libibverbs, run on taproce
// (runon.Exec). The process becomes the program, so that on success
// nothing returns; it exits 1 when it could not start the program, 2 for
// a wrong command line.
func runExec(args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lib := fs.String("lib", "", "the `DIR`ectory of taproce's libibverbs.so.1 and librdmacm.so.1 (default: $"+ibvlib.EnvDir+
		", then ../lib/taproce beside this binary, /usr/local/lib/taproce, /usr/lib/taproce)")
	socket := fs.String("socket", verbs.Socket(), "the appliance's control socket `PATH` ($TAPROCE_SOCKET)")
	noSysfs := fs.Bool("no-sysfs", false, "leave the program the machine's own /sys/class and /dev (see above)")
	fs.Usage = func() { execUsage(stderr, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // fs.Usage said it
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "taproce exec: no program to run")
		fs.Usage()
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	err := runon.Exec(ctx, runon.Options{LibDir: *lib, Socket: *socket, NoSysfs: *noSysfs,
		Program: fs.Arg(0), Args: fs.Args()[1:], Warn: stderr})
	printError(stderr, "exec", err)
	return 1
}

func execUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, `Usage: taproce exec [flags] [--] PROGRAM [ARGS...]

Runs PROGRAM, an unmodified program linked against libibverbs (ibv_devinfo,
ibv_rc_pingpong, perftest, UCX, pyverbs, …) or librdmacm (rping, perftest -R,
rdma_server/rdma_client), on taproce: the directory of taproce's
libibverbs.so.1 and librdmacm.so.1 first on its LD_LIBRARY_PATH,
TAPROCE_SOCKET naming the appliance. A warning says when PROGRAM is linked to
librdmacm.so.1 and that directory lacks taproce's. taproce exec then becomes
PROGRAM, whose signals and exit status are its own.

Programs such as UCX also read /sys/class/infiniband and look for
/dev/infiniband/uverbsN themselves. Unless --no-sysfs, PROGRAM gets a mount
namespace of its own where both describe the appliance's devices as the
kernel describes rxe's: as root directly; for another user in a user
namespace, where taproce exec waits for PROGRAM and exits with its status;
where the kernel allows neither, PROGRAM runs without them and a warning
says so.

Without taproce exec, the same run is
  LD_LIBRARY_PATH=/usr/local/lib/taproce TAPROCE_SOCKET=%s PROGRAM ARGS...
for every program that does not read sysfs itself
(docs/unmodified-programs.md says which do).

Flags:
`, verbs.DefaultSocket)
	fs.SetOutput(w)
	fs.PrintDefaults()
}
