package cli

import (
	"strings"
	"testing"

	"github.com/taproce/taproce/internal/perf"
	"github.com/taproce/taproce/internal/pingpong"
)

// FuzzCommandLine: any command line of `taproce perf` and `taproce
// pingpong` gives a configuration or an error, never a panic. The
// fuzzer's string is split at NUL bytes into the arguments.
func FuzzCommandLine(f *testing.F) {
	for _, s := range []string{"", "write_bw", "write_bw\x00-s\x0065536\x00-n\x005\x00host", "send_lat\x00-a",
		"atomic_bw\x00-A\x00CMP_AND_SWAP", "read_bw\x00-q\x000", "write_bw\x00-D\x00-1", "send_bw\x00--size=9999999999999",
		"-g\x001\x00-n\x0010", "--size=4096\x00host", "-s", "-n\x00-1", "--ib-port=0\x00-m\x00999", "-e\x00-c\x00--gid-idx", "-\x00--"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var args []string
		if s != "" {
			args = strings.Split(s, "\x00")
		}
		_, _ = perf.ParseArgs(args)
		_, _ = pingpong.ParseArgs(args)
	})
}
