package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestBadCommandLines: a wrong command line of perf or pingpong is one
// sentence after one prefix, in the user's terms (the value as typed, the
// allowed range), then the usage; exit status 2.
func TestBadCommandLines(t *testing.T) {
	for _, c := range []struct {
		args string
		want string
	}{
		{"perf", "no test given"},
		{"perf write", `unknown test "write" (want one of write_bw, read_bw, send_bw, atomic_bw, write_lat, read_lat, send_lat, atomic_lat)`},
		{"perf write_bw -s 99G", `message size "99G": not a number of bytes (K and M suffixes allowed)`},
		{"perf write_bw -s 3000M", `message size "3000M": too large (max 2147483647)`},
		{"perf write_bw --size=16777216M", `message size "16777216M": too large (max 2147483647)`},
		{"perf write_bw -s 99999999999999999999", `message size "99999999999999999999": too large (max 2147483647)`},
		{"perf write_bw -s 0", `message size "0": too small (min 1)`},
		{"perf write_bw -s -1K", `message size "-1K": too small (min 1)`},
		{"perf write_bw -n 4", `iterations "4": too small (min 5)`},
		{"perf write_bw -n 1e3", `iterations "1e3": not a number`},
		{"perf write_bw -p 70000", `port "70000": too large (max 65535)`},
		{"perf write_bw -q 0", `QPs "0": too small (min 1)`},
		{"perf write_bw -D -99999999999999999999", `duration "-99999999999999999999": too small (min 1)`},
		{"perf write_bw -x 0x100", `GID index "0x100": too large (max 255)`},
		{"perf write_bw -m 1000", `path MTU "1000": choose from 256, 512, 1024, 2048 or 4096`},
		{"perf write_bw -i 2", `IB port "2": taproce devices have one port, 1`},
		{"perf write_bw -c UD", `connection type "UD": only RC is supported`},
		{"perf atomic_bw -A ADD", `atomic type "ADD": choose from CMP_AND_SWAP or FETCH_AND_ADD`},
		{"perf write_bw -A FETCH_AND_ADD", "-A applies to the atomic tests only"},
		{"perf write_bw --bogus", "unknown option --bogus"},
		{"perf write_bw -z", "unknown option -z"},
		{"perf write_bw -a7", "option -a takes no value"},
		{"perf write_bw --all=1", "option --all=1 takes no value"},
		{"perf write_bw -s", "option -s needs a value"},
		{"perf write_bw a b", `more than one server address: ["a" "b"]`},
		{"perf atomic_bw -s 16", "message size cannot be changed for atomic tests"},
		{"perf write_lat -q 2", "multiple QPs only available on bandwidth tests"},
		{"perf write_bw -a -D 5", "duration mode doesn't support running on all sizes"},
		{"perf write_bw -D 2 -f 1", "the duration must be more than twice the margin"},
		{"perf read_bw -r 4", "on RDMA verbs rx depth can be only 1"},

		{"pingpong -x", "invalid option -- 'x'"},
		{"pingpong -s", "option requires an argument -- 's'"},
		{"pingpong --size", "option '--size' requires an argument"},
		{"pingpong --events=1", "option '--events' doesn't allow an argument"},
		{"pingpong --bogus", "unrecognized option '--bogus'"},
		{"pingpong --u", "option '--u' is ambiguous"},
		{"pingpong -s 99G", `message size "99G": not a number`},
		{"pingpong -s 1_000", `message size "1_000": not a number`},
		{"pingpong -s 99999999999", `message size "99999999999": too large (max 2147483607)`},
		{"pingpong -n -1", `iterations "-1": too small (min 0)`},
		{"pingpong -p 65536", `port "65536": too large (max 65535)`},
		{"pingpong -r 0", `rx depth "0": too small (min 1)`},
		{"pingpong -i 0", `IB port "0": too small (min 1)`},
		{"pingpong -l 16", `service level "16": too large (max 15)`},
		{"pingpong -g -2", `GID index "-2": too small (min -1)`},
		{"pingpong -m 1000", `path MTU "1000": choose from 256, 512, 1024, 2048 or 4096`},
		{"pingpong -t rd", `transport "rd": want rc, uc or ud`},
		{"pingpong a b", `more than one server name: ["a" "b"]`},
	} {
		args := strings.Fields(c.args)
		code, out, errOut := runCmd(args...)
		first, rest, _ := strings.Cut(errOut, "\n")
		if want := "taproce " + args[0] + ": " + c.want; code != 2 || out != "" || first != want || !strings.Contains(rest, "Usage:") {
			t.Errorf("taproce %s: exit %d, out %q, stderr\n%.300s\nwant 2, nothing, and\n%s\nthen the usage", c.args, code, out, errOut, want)
		}
	}
}

// TestClientNoServer: a perf or pingpong client pointed at a port where
// no server listens gives up by itself after its few tries, with the
// tools' "couldn't connect to HOST:PORT" and exit status 1. (The minute
// allowed only turns a hang into a failure.)
func TestClientNoServer(t *testing.T) {
	startVerbsRig(t)
	port := fmt.Sprint(ppFreePort(t))
	for _, args := range [][]string{
		{"perf", "send_lat", "-d", "taproce1", "-p", port, "127.0.0.1"},
		{"perf", "write_bw", "-d", "taproce1", "127.0.0.1:" + port},
		{"pingpong", "-d", "taproce1", "-p", port, "127.0.0.1"},
		{"pingpong", "--ud", "-d", "taproce1", "-p", port, "127.0.0.1"},
	} {
		type result struct {
			code   int
			errOut string
		}
		done := make(chan result, 1)
		go func() {
			code, _, errOut := runCmd(args...)
			done <- result{code, errOut}
		}()
		select {
		case r := <-done:
			want := "taproce " + args[0] + ": couldn't connect to 127.0.0.1:" + port + ": connection refused (tried 10 times, 100ms apart)\n"
			if r.code != 1 || r.errOut != want {
				t.Errorf("taproce %q: exit %d, stderr %q; want 1 and %q", args, r.code, r.errOut, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("taproce %q still waits for a server after a minute", args)
		}
	}
}
