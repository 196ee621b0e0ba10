package runon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// Sysfs gives the program about to be executed from this thread a
// /sys/class/infiniband, /sys/class/infiniband_verbs and /dev/infiniband
// describing devs (WriteSysfs, WriteDev), in a mount namespace of its
// own, so that nothing changes for any other process: it unshares this
// thread's mount namespace, makes every mount in it private (none of
// its mounts propagates back), and covers /sys/class and /dev with tmpfs
// copies that hold the same entries (each bound from the original) plus
// the tree's. It locks the goroutine to its thread, which the caller
// must exec from. It needs CAP_SYS_ADMIN.
func Sysfs(devs []Device) error {
	runtime.LockOSThread() // for good: this thread becomes the program
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace of its own: unshare: %w", err)
	}
	return install(devs)
}

// install builds the tree in the calling thread's mount namespace, which
// is its own.
func install(devs []Device) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	const sysFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := cover("/sys/class", SysfsEntries, sysFlags, func(dir string) error {
		return WriteSysfs(dir, devs)
	}); err != nil {
		return err
	}
	return cover("/dev", []string{"infiniband"}, unix.MS_NOSUID|unix.MS_NOEXEC, func(dir string) error {
		missing, err := WriteDev(filepath.Join(dir, "infiniband"), devs, mknod)
		if errors.Is(err, ErrNoMknod) {
			// The null device stands in: a character device anyone may
			// read and write, as UCX wants to see.
			for _, m := range missing {
				if err := unix.Mount("/dev/null", m, "", unix.MS_BIND, ""); err != nil {
					return fmt.Errorf("bind /dev/null on %s: %w", m, err)
				}
			}
			return nil
		}
		return err
	})
}

// forwarded are the signals the program gets when they are sent to the
// process that waits for it in inUserNamespace. SIGINT and SIGQUIT are
// not among them: a terminal sends them to its whole foreground process
// group, the program included, which would get them twice; the waiting
// process ignores them.
var forwarded = []os.Signal{unix.SIGHUP, unix.SIGTERM, unix.SIGUSR1, unix.SIGUSR2, unix.SIGALRM, unix.SIGCONT, unix.SIGWINCH}

// inUserNamespace runs this command again (/proc/self/exe, the same
// arguments) in a user namespace mapping the caller's user and group to
// themselves and a mount namespace it owns, with CAP_SYS_ADMIN there only
// (ambient), and devs in treeEnv: that second stage builds the tree and
// becomes the program (Exec). This process passes on the signals it gets
// (forwarded), and exits as the program exited: with its status, or
// killed by the same signal. The program is killed if this process dies
// (Pdeathsig). It returns only when the child could not be started: the
// kernel allows no user namespace to this user, for one.
func inUserNamespace(devs []Device) error {
	js, err := json.Marshal(devs)
	if err != nil {
		return err
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), treeEnv+"="+string(js))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	uid, gid := os.Geteuid(), os.Getegid()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN},
		Pdeathsig:   unix.SIGKILL,
	}
	// Pdeathsig fires when the thread that started the child ends: this
	// one, kept until the process exits.
	runtime.LockOSThread()
	signal.Ignore(unix.SIGINT, unix.SIGQUIT)
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, forwarded...)
	if err := cmd.Start(); err != nil {
		signal.Stop(sigs)
		signal.Reset(unix.SIGINT, unix.SIGQUIT)
		runtime.UnlockOSThread()
		return fmt.Errorf("a user namespace: %w", err)
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			signal.Reset(ws.Signal())
			_ = unix.Kill(os.Getpid(), ws.Signal())
			os.Exit(128 + int(ws.Signal()))
		}
		os.Exit(ee.ExitCode())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "taproce exec: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
	return nil
}

// dropCapabilities clears the ambient capabilities inUserNamespace gave
// its second stage, on the thread that is to become the program (it stays
// locked to it), so that the program runs with none.
func dropCapabilities() error {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("drop the ambient capabilities: %w", err)
	}
	return nil
}

func mknod(path string, mode uint32, major, minor int) error {
	return unix.Mknod(path, unix.S_IFCHR|mode, int(unix.Mkdev(uint32(major), uint32(minor))))
}

// cover mounts a tmpfs over dir that holds what dir holds — each entry
// bound from the original, with the mounts beneath it, or a symbolic
// link copied — except the entries named in replace, and then lets fill
// add its own. The originals are reached through descriptors opened
// before the tmpfs hides them.
func cover(dir string, replace []string, flags uintptr, fill func(dir string) error) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type kept struct {
		name string
		typ  fs.FileMode
		fd   int
		link string
	}
	var keep []kept
	defer func() {
		for _, k := range keep {
			if k.fd >= 0 {
				unix.Close(k.fd)
			}
		}
	}()
	for _, e := range ents {
		if slices.Contains(replace, e.Name()) {
			continue
		}
		k := kept{name: e.Name(), typ: e.Type(), fd: -1}
		p := filepath.Join(dir, e.Name())
		if k.typ&fs.ModeSymlink != 0 {
			if k.link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if k.fd, err = unix.Open(p, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0); err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		keep = append(keep, k)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", flags, fmt.Sprintf("mode=%o", st.Mode&0o7777)); err != nil {
		return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
	}
	for _, k := range keep {
		p := filepath.Join(dir, k.name)
		switch {
		case k.typ&fs.ModeSymlink != 0:
			err = os.Symlink(k.link, p)
		case k.typ.IsDir():
			err = os.Mkdir(p, 0o755)
		default:
			err = os.WriteFile(p, nil, 0o600)
		}
		if err != nil {
			return err
		}
		if k.fd < 0 {
			continue
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", k.fd), p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s back: %w", p, err)
		}
	}
	return fill(dir)
}
