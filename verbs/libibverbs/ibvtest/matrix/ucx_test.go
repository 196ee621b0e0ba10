package matrix

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// ucxOut is the end of ucx_perftest's client output with UCX_LOG_LEVEL=info.
const ucxOut = `[1795829801.346777] [vm:10151:0]      ucp_worker.c:1763 UCX  INFO    ep_cfg[0]: tag(rc_verbs/taproce0:1)
Final:                  1000      0.361    79.548    79.548       49.11      49.11       12571       12571
`

// TestUCXRuns: every UCP test over RC and UD, and the UCT runs; each side's
// command line and environment; the verdict from the exit statuses, the
// final line and the lane on the client's device.
func TestUCXRuns(t *testing.T) {
	var names []string
	for _, r := range UCXRuns() {
		names = append(names, r.Name)
	}
	for _, want := range []string{"rc_verbs/tag_bw", "rc_verbs/tag_lat", "rc_verbs/ucp_put_bw", "rc_verbs/ucp_get",
		"ud_verbs/tag_bw", "ud_verbs/tag_lat", "ud_verbs/ucp_put_bw", "ud_verbs/ucp_get", "uct rc_verbs/put_bw -D zcopy", "uct rc_verbs/get -D zcopy"} {
		if !slices.Contains(names, want) {
			t.Errorf("no run %s among %v", want, names)
		}
	}
	byName := func(name string) UCXRun {
		i := slices.Index(names, name)
		return UCXRuns()[i]
	}
	rc := byName("rc_verbs/tag_bw")
	if got := strings.Join(rc.Server("taproce1", 13337), " "); got != "-p 13337" {
		t.Errorf("server: %s", got)
	}
	if got := strings.Join(rc.Client("taproce0", 13337, "10.55.0.102"), " "); got != "-p 13337 -t tag_bw -n 1000 -s 4096 10.55.0.102" {
		t.Errorf("client: %s", got)
	}
	if got := strings.Join(rc.Env("taproce0"), " "); got != "UCX_TLS=rc_verbs,ud_verbs:aux UCX_NET_DEVICES=taproce0:1 UCX_IB_GID_INDEX=0 UCX_LOG_LEVEL=info" {
		t.Errorf("environment: %s", got)
	}
	uct := byName("uct rc_verbs/get -D zcopy")
	if got := strings.Join(uct.Client("taproce0", 1, ""), " "); !uct.UCT || got != "-p 1 -x rc_verbs -d taproce0:1 -t get -D zcopy -n 1000 -s 65536" {
		t.Errorf("UCT client: %v %s", uct.UCT, got)
	}

	cli := Result{Device: "taproce0", Out: ucxOut}
	if err := rc.Judge(Result{}, cli); err != nil {
		t.Errorf("good run: %v", err)
	}
	if err := uct.Judge(Result{}, Result{Device: "taproce0", Out: "\nFinal: 1000\n"}); err != nil {
		t.Errorf("UCT run without lanes: %v", err)
	}
	for _, c := range []struct {
		name     string
		r        UCXRun
		srv, cli Result
		want     string
	}{
		{"server's exit", rc, Result{Err: errors.New("exit status 1")}, cli, "server: exit status 1"},
		{"client's exit", rc, Result{}, Result{Device: "taproce0", Out: ucxOut, Err: errors.New("exit status 255")}, "client: exit status 255"},
		{"no final line", rc, Result{}, Result{Device: "taproce0", Out: strings.Replace(ucxOut, "Final:", "Finale", 1)}, "no final result"},
		{"lane on another device", rc, Result{}, Result{Device: "taproce1", Out: ucxOut}, "no lane (rc_verbs/taproce1:1)"},
		{"lane of another transport", byName("ud_verbs/tag_bw"), Result{}, cli, "no lane (ud_verbs/taproce0:1)"},
	} {
		if err := c.r.Judge(c.srv, c.cli); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
