package pingpong

import (
	"strings"
	"testing"
)

// FuzzParseArgs: any command line gives options or an error, never a
// panic. The fuzzer's string is split at NUL bytes into the arguments.
func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{"", "-g\x001\x00-n\x0010", "--size=4096\x00host", "-s", "-n\x00-1", "--ib-port=0\x00-m\x00999", "-e\x00-c\x00--gid-idx", "-\x00--"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var args []string
		if s != "" {
			args = strings.Split(s, "\x00")
		}
		_, _ = ParseArgs(args)
	})
}
