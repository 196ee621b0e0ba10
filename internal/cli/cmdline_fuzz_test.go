package cli

import (
	"strings"
	"testing"

	"github.com/taproce/taproce/internal/perf"
	"github.com/taproce/taproce/internal/pingpong"
)

// FuzzCommandLine: any command line of `taproce perf` and `taproce
// pingpong` gives a configuration or an error, never a panic, and the
// error is one line for "taproce perf: " or "taproce pingpong: " to
// precede: no prefix of its own, no strconv's words. The fuzzer's string
// is split at NUL bytes into the arguments.
func FuzzCommandLine(f *testing.F) {
	for _, s := range []string{"", "write_bw", "write_bw\x00-s\x0065536\x00-n\x005\x00host", "send_lat\x00-a",
		"atomic_bw\x00-A\x00CMP_AND_SWAP", "read_bw\x00-q\x000", "write_bw\x00-D\x00-1", "send_bw\x00--size=9999999999999",
		"-g\x001\x00-n\x0010", "--size=4096\x00host", "-s", "-n\x00-1", "--ib-port=0\x00-m\x00999", "-e\x00-c\x00--gid-idx", "-\x00--",
		"write_bw\x00-s\x0099G", "write_bw\x00-n\x0099999999999999999999", "-s\x00-99999999999999999999", "-m\x00x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var args []string
		if s != "" {
			args = strings.Split(s, "\x00")
		}
		_, perr := perf.ParseArgs(args)
		_, perr2 := pingpong.ParseArgs(args)
		for _, err := range []error{perr, perr2} {
			if err == nil {
				continue
			}
			msg := err.Error()
			for _, bad := range []string{"\n", "strconv", "invalid syntax", "value out of range"} {
				if strings.Contains(msg, bad) {
					t.Errorf("%q: error %q has %q", args, msg, bad)
				}
			}
			if strings.HasPrefix(msg, "perf:") || strings.HasPrefix(msg, "pingpong:") || strings.HasPrefix(msg, "usage:") {
				t.Errorf("%q: error %q has a prefix of its own", args, msg)
			}
		}
	})
}
