package lab

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/taproce/taproce/verbs/libibverbs/ibvtest/matrix"
)

// TestLabDebianMatrix runs the whole matrix of Debian's programs
// (verbs/libibverbs/ibvtest/matrix) between two lab namespaces, over
// their TAPs, bridges and veth, on taproce's libibverbs.so.1 built from
// this checkout: ibv_devices and ibv_devinfo -v in each namespace (each
// sees its own port, with the port's addresses among its GIDs); then
// every pingpong run — each tool at every GID index the ports have and
// at every size — and every perftest tool with every option perftest
// allows, a server in the second namespace and its client in the first,
// reaching it at its kernel's address as the lab's own runs do. Each is
// judged by the programs' own verdict (exit statuses, result lines,
// results tables).
func TestLabDebianMatrix(t *testing.T) {
	l, env := debianLab(t)
	ctx := context.Background()
	a, b := l.Hosts[0], l.Hosts[1]
	start := time.Now()

	// Each namespace's device, as its programs see it.
	var port matrix.Port
	runs := matrix.Info()
	for _, r := range runs {
		for _, h := range l.Hosts {
			c, err := l.startClientEnv(ctx, env, r.Tool, h, r.Command(h.Device, 0, "")...)
			if err != nil {
				t.Fatal(err)
			}
			err = c.wait(r.Timeout)
			out := c.output()
			if err := r.Judge(matrix.Result{}, matrix.Result{Device: h.Device, Out: out, Err: err}); err != nil {
				t.Errorf("%s in %s: %v", r.Name(), h.Namespace, err)
			}
			if r.Tool != "ibv_devinfo" {
				continue
			}
			for _, addr := range []string{"::ffff:" + h.PortIPv4().String(), h.PortIPv6().String()} {
				if !strings.Contains(out, "\t\t"+addr+", RoCE v2\n") {
					t.Errorf("ibv_devinfo -v in %s does not list the port's %s:\n%s", h.Namespace, addr, out)
				}
			}
			if h == a {
				if port, err = matrix.ParseDevinfo(out); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("the ports: GIDs %v, the IPv4 one %d, active MTU %d", port.GIDs, port.IPv4GID, port.ActiveMTU)

	var took []string
	for _, r := range append(matrix.Pingpong(port), matrix.Perftest(port)...) {
		t.Run(r.Name(), func(t *testing.T) {
			begin := time.Now()
			srvOut, cliOut, err := l.pairEnv(ctx, env, r.Tool, a, b, r.Command(b.Device, 0, ""), r.Command(a.Device, 0, ""), exchangePort, r.Timeout)
			if err == nil {
				err = r.Judge(matrix.Result{Device: b.Device, Out: srvOut}, matrix.Result{Device: a.Device, Out: cliOut})
			}
			took = append(took, fmt.Sprintf("%7.2fs  %s", time.Since(begin).Seconds(), r.Name()))
			if err != nil {
				t.Fatalf("%v\nclient in %s:\n%s\nserver in %s:\n%s\n%s", err, a.Namespace, cliOut, b.Namespace, srvOut, linkStats(l))
			}
		})
	}
	t.Logf("%d runs in %v:\n%s", len(took)+2*len(runs), time.Since(start).Round(time.Millisecond), strings.Join(took, "\n"))
}

// linkStats returns every lab namespace's links with their counters
// (ip -s link), where a failed run's lost frames show as drops.
func linkStats(l *Lab) string {
	var b strings.Builder
	for _, h := range l.Hosts {
		out, err := exec.Command("ip", "netns", "exec", h.Namespace, "ip", "-s", "link").CombinedOutput()
		fmt.Fprintf(&b, "ip -s link in %s: %v\n%s", h.Namespace, err, out)
	}
	return b.String()
}
