package runon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"

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
func Sysfs(devs []Device, path string, argv, env []string) error {
	_, _, _ = path, argv, env
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
