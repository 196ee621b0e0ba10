// Package runon runs an unmodified program on taproce (`taproce exec`):
// it finds taproce's libibverbs.so.1 and puts its directory, where
// taproce's librdmacm.so.1 goes too, first on the program's library path, points the program at the appliance's socket, gives it a
// /sys/class/infiniband and a /dev/infiniband describing the appliance's
// devices as the kernel describes rxe's (programs such as UCX read them
// themselves), and then becomes the program (execve), so that its
// signals and exit status are the program's own.
package runon

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/taproce/taproce/internal/ibvlib"
	"github.com/taproce/taproce/verbs/abi"
)

// NoLibError is Exec's error when no directory it looked in holds
// taproce's library (ibvlib.Find); its text says how to get one.
type NoLibError struct{ Err error }

func (e *NoLibError) Error() string {
	return fmt.Sprintf("%v\nBuild and install it with `make -C verbs/libibverbs install` (into /usr/local/lib/taproce),\n"+
		"and `make -C verbs/librdmacm install` beside it for programs that connect with the RDMA CM,\n"+
		"or name its directory with --lib DIR or $%s.", e.Err, ibvlib.EnvDir)
}

// MissingLibs returns those of taproce's libraries (ibvlib.Names) that
// program, an ELF executable, is linked to and dir lacks: the loader
// gives the program rdma-core's in their place, which finds no device
// without kernel RDMA. A program that is not ELF (a script) lacks none.
func MissingLibs(program, dir string) []string {
	f, err := elf.Open(program)
	if err != nil {
		return nil
	}
	defer f.Close()
	needed, _ := f.ImportedLibraries()
	var out []string
	for _, name := range ibvlib.Names {
		if !slices.Contains(needed, name) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			out = append(out, name)
		}
	}
	return out
}

func (e *NoLibError) Unwrap() error { return e.Err }

// Env returns environ with libDir first on LD_LIBRARY_PATH and
// TAPROCE_SOCKET set to socket: what the program needs to load taproce's
// library and reach the appliance.
func Env(environ []string, libDir, socket string) []string {
	out := make([]string, 0, len(environ)+2)
	path := libDir
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_LIBRARY_PATH":
			if v != "" {
				path = libDir + ":" + v
			}
			continue
		case abi.SocketEnv:
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_LIBRARY_PATH="+path, abi.SocketEnv+"="+socket)
}

// Options is what Exec runs, and how.
type Options struct {
	// LibDir is --lib: the directory of taproce's library ("" to look
	// for it where ibvlib.Find looks).
	LibDir string
	// Socket is the appliance's socket.
	Socket string
	// NoSysfs leaves the program the machine's own /sys/class and /dev.
	NoSysfs bool
	// Program and Args are what to run; Program is looked up in PATH.
	Program string
	Args    []string
	// Warn is told what Exec could not give the program and why, when
	// it runs the program all the same.
	Warn io.Writer
}

// treeEnv carries the devices (JSON) from `taproce exec` run by a user
// other than root to its second stage: itself again, in a user and mount
// namespace of its own (inUserNamespace).
const treeEnv = "TAPROCE_EXEC_TREE"

// Exec becomes o.Program on taproce: it returns only when it could not.
// Unless o.NoSysfs, it first asks the appliance for its devices (an
// error when none listens: the program could use no device) and gives
// the program a private view of /sys/class and /dev that shows them: as
// root in a mount namespace it makes (Sysfs), as another user in a user
// namespace (inUserNamespace: a child that becomes the program, whose
// exit status this process then exits with). Where neither can be had,
// it says so on o.Warn and runs the program without.
func Exec(ctx context.Context, o Options) error {
	exe, _ := os.Executable()
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	found, err := ibvlib.Find(o.LibDir, exe)
	if errors.Is(err, ibvlib.ErrNotFound) {
		return &NoLibError{Err: err}
	}
	if err != nil {
		return err
	}
	lib, err := filepath.Abs(found.Dir)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(o.Program)
	if err != nil {
		return err
	}
	tree, stage2 := os.LookupEnv(treeEnv)
	if err := os.Unsetenv(treeEnv); err != nil {
		return err
	}
	if missing := MissingLibs(path, lib); len(missing) > 0 && !stage2 {
		fmt.Fprintf(o.Warn, "taproce exec: %s is linked to %s, which %s lacks: it will load rdma-core's, which finds no device here"+
			" (taproce's librdmacm.so.1 goes beside libibverbs.so.1: `make -C verbs/librdmacm install`)\n",
			o.Program, strings.Join(missing, " and "), lib)
	}
	env := Env(os.Environ(), lib, o.Socket)
	argv := append([]string{o.Program}, o.Args...)
	warn := func(err error) {
		fmt.Fprintf(o.Warn, "taproce exec: %v\ntaproce exec: running %s without a /sys/class/infiniband of the appliance's devices:"+
			" programs that read it themselves (UCX) will find none\n", err, o.Program)
	}
	switch {
	case stage2:
		// In the user namespace inUserNamespace made, with CAP_SYS_ADMIN
		// there; Sysfs's mount namespace is this thread's own (were the
		// variable set by hand, outside any, the tree stays as private).
		var devs []Device
		err := json.Unmarshal([]byte(tree), &devs)
		if err == nil {
			err = Sysfs(devs)
		}
		if err != nil {
			warn(fmt.Errorf("in a user namespace: %w", err))
		}
		if err := dropCapabilities(); err != nil {
			return err
		}
	case !o.NoSysfs:
		// The verbs package reads the socket from the environment.
		if err := os.Setenv(abi.SocketEnv, o.Socket); err != nil {
			return err
		}
		devs, err := Query(ctx)
		if err != nil {
			return err
		}
		if os.Geteuid() == 0 {
			err = Sysfs(devs)
		} else {
			err = inUserNamespace(devs)
		}
		if err != nil {
			warn(err)
		}
	}
	if err := syscall.Exec(path, argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", path, err)
	}
	return nil
}
