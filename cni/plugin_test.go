package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/taproce/taproce/appliance/admin"
)

// fakeAppliance records requests and answers as told.
type fakeAppliance struct {
	mu       sync.Mutex
	attached map[string]admin.Attachment
	attach   []admin.AttachRequest
	err      error // returned by every call when set
}

func (f *fakeAppliance) Attach(_ context.Context, r admin.AttachRequest) (admin.Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attach = append(f.attach, r)
	if f.err != nil {
		return admin.Attachment{}, f.err
	}
	a := admin.Attachment{ID: r.ID(), ContainerID: r.ContainerID, IfName: r.IfName, Netns: r.Netns, Network: r.Network,
		PortName: r.PortName, Mode: admin.ModeRedirect, MAC: "0a:58:0a:01:00:05", State: admin.StateActive}
	for _, p := range r.IPs {
		a.GIDs = append(a.GIDs, netip.AddrFrom16(p.Addr().As16()))
	}
	f.attached[a.ID] = a
	return a, nil
}

func (f *fakeAppliance) Detach(_ context.Context, r admin.DetachRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	delete(f.attached, r.ID())
	return nil
}

func (f *fakeAppliance) Check(_ context.Context, r admin.CheckRequest) (admin.Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return admin.Attachment{}, f.err
	}
	a, ok := f.attached[r.ID()]
	if !ok {
		return a, fmt.Errorf("%w: %s", admin.ErrNotFound, r.ID())
	}
	return a, nil
}

func (f *fakeAppliance) List(context.Context) ([]admin.Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []admin.Attachment
	for _, a := range f.attached {
		out = append(out, a)
	}
	return out, nil
}

// serveFake runs the admin API over f and returns its socket.
func serveFake(t *testing.T, f *fakeAppliance) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	l, err := admin.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: admin.NewServer(f, admin.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return path
}

const netns = "/var/run/netns/pod"

// conf returns a network configuration for the plugin at version ver with
// prevResult (raw JSON, may be empty).
func conf(ver, socket, prev string) []byte {
	c := fmt.Sprintf(`{"cniVersion":%q,"name":"rdma","type":"taproce-cni","adminSocket":%q`, ver, socket)
	if prev != "" {
		c += `,"prevResult":` + prev
	}
	return []byte(c + "}")
}

// prev100 is what bridge with host-local returns: the bridge, the host
// veth, the pod's eth0, and addresses on eth0 plus one on the bridge.
const prev100 = `{"cniVersion":"1.1.0",
 "interfaces":[{"name":"cni0","mac":"aa:aa:aa:aa:aa:aa"},{"name":"veth1","mac":"bb:bb:bb:bb:bb:bb"},
               {"name":"eth0","mac":"0a:58:0a:01:00:05","sandbox":"/var/run/netns/pod"}],
 "ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":2},
        {"address":"fd00:1::5/64","interface":2},
        {"address":"10.1.0.1/24","interface":0}]}`

const prev020 = `{"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.5/24","gateway":"10.1.0.1"}}`

func args(stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "ctr1", Netns: netns, IfName: "eth0", StdinData: stdin}
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a CNI error", err, err)
	}
	return e.Code
}

func TestAdd(t *testing.T) {
	f := &fakeAppliance{attached: map[string]admin.Attachment{}}
	sock := serveFake(t, f)
	down := filepath.Join(t.TempDir(), "nobody.sock")
	tests := []struct {
		name     string
		stdin    []byte
		err      error
		wantCode uint // 0: success
		wantMsg  string
		wantIPs  []string
		wantOut  []string // in the printed result
	}{
		{name: "1.1.0", stdin: conf("1.1.0", sock, prev100), wantIPs: []string{"10.1.0.5/24", "fd00:1::5/64"},
			wantOut: []string{`{"mac":"0a:58:0a:01:00:05","name":"roce0","sandbox":"/var/run/netns/pod"}`, `"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":2`}},
		{name: "0.2.0", stdin: conf("0.2.0", sock, prev020), wantIPs: []string{"10.1.0.5/24"},
			wantOut: []string{`"ip4":{"ip":"10.1.0.5/24","gateway":"10.1.0.1"}`}},
		{name: "no prevResult", stdin: conf("1.1.0", sock, ""), wantCode: types.ErrInvalidNetworkConfig, wantMsg: "must be chained after"},
		{name: "no IPs", stdin: conf("1.1.0", sock, `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/x"}]}`),
			wantCode: types.ErrInvalidNetworkConfig, wantMsg: "no IP address for eth0"},
		{name: "bad JSON", stdin: []byte(`{"cniVersion":`), wantCode: types.ErrDecodingFailure},
		{name: "unusable address", stdin: conf("1.1.0", sock, `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"::ffff:10.1.0.5/64","interface":0}]}`),
			wantCode: types.ErrInvalidNetworkConfig, wantMsg: `"::ffff:10.1.0.5/64": an IPv4-mapped address`},
		{name: "appliance down", stdin: conf("1.1.0", down, prev100), wantCode: types.ErrTryAgainLater, wantMsg: "DaemonSet"},
		{name: "conflict", stdin: conf("1.1.0", sock, prev100), err: admin.ErrConflict, wantCode: CodeConflict},
		{name: "netns gone", stdin: conf("1.1.0", sock, prev100), err: admin.ErrNetnsGone, wantCode: types.ErrInvalidNetNS},
		{name: "failure", stdin: conf("1.1.0", sock, prev100), err: errors.New("tap: no /dev/net/tun"), wantCode: CodeAttach, wantMsg: "see its log"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.err, f.attach = tt.err, nil
			f.mu.Unlock()
			var out bytes.Buffer
			p := &Plugin{Stdout: &out, Timeout: 5 * time.Second}
			err := p.Add(args(tt.stdin))
			if tt.wantCode != 0 {
				if code := cniCode(t, err); code != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
					t.Fatalf("error %v (code %d), want code %d saying %q", err, code, tt.wantCode, tt.wantMsg)
				}
				if out.Len() != 0 {
					t.Errorf("a failed ADD printed %s", out.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ips []string
			for _, p := range f.attach[0].IPs {
				ips = append(ips, p.String())
			}
			if !slices.Equal(ips, tt.wantIPs) || f.attach[0].Netns != netns || f.attach[0].Network != "rdma" {
				t.Errorf("appliance asked for %+v, want IPs %v", f.attach[0], tt.wantIPs)
			}
			compact := new(bytes.Buffer)
			json.Compact(compact, out.Bytes())
			for _, w := range tt.wantOut {
				if !strings.Contains(compact.String(), w) {
					t.Errorf("result %s lacks %s", compact, w)
				}
			}
		})
	}
}

func TestDelCheckStatusGC(t *testing.T) {
	f := &fakeAppliance{attached: map[string]admin.Attachment{}}
	sock := serveFake(t, f)
	down := filepath.Join(t.TempDir(), "nobody.sock")
	p := &Plugin{Stdout: io.Discard, Timeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var out bytes.Buffer
	if err := (&Plugin{Stdout: &out}).Add(args(conf("1.1.0", sock, prev100))); err != nil {
		t.Fatal(err)
	}
	final := out.String()
	tests := []struct {
		name     string
		run      func(*skel.CmdArgs) error
		stdin    []byte
		err      error
		wantCode uint
		wantMsg  string
	}{
		{name: "check", run: p.Check, stdin: conf("1.1.0", sock, final)},
		{name: "check without prevResult", run: p.Check, stdin: conf("1.1.0", sock, ""), wantCode: types.ErrInvalidNetworkConfig},
		{name: "check against a result without roce0", run: p.Check, stdin: conf("1.1.0", sock, prev100), wantCode: CodeIncomplete, wantMsg: "no interface roce0"},
		{name: "check incomplete", run: p.Check, stdin: conf("1.1.0", sock, final), err: fmt.Errorf("%w: tc filter missing", admin.ErrIncomplete), wantCode: CodeIncomplete, wantMsg: "incomplete"},
		{name: "check appliance down", run: p.Check, stdin: conf("1.1.0", down, final), wantCode: types.ErrTryAgainLater},
		{name: "status", run: p.Status, stdin: conf("1.1.0", sock, "")},
		{name: "status appliance down", run: p.Status, stdin: conf("1.1.0", down, ""), wantCode: types.ErrPluginNotAvailable, wantMsg: "not reachable"},
		{name: "gc appliance down", run: p.GC, stdin: conf("1.1.0", down, "")},
		{name: "del appliance down", run: p.Del, stdin: conf("1.1.0", down, "")},
		{name: "del netns gone", run: p.Del, stdin: conf("1.1.0", sock, ""), err: admin.ErrNetnsGone},
		{name: "del failing", run: p.Del, stdin: conf("1.1.0", sock, ""), err: errors.New("netlink: busy"), wantCode: CodeAttach},
		{name: "del", run: p.Del, stdin: conf("1.1.0", sock, "")},
		{name: "del again", run: p.Del, stdin: conf("1.1.0", sock, "")},
		{name: "check after del", run: p.Check, stdin: conf("1.1.0", sock, final), wantCode: types.ErrUnknownContainer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.mu.Lock()
			f.err = tt.err
			f.mu.Unlock()
			err := tt.run(args(tt.stdin))
			if tt.wantCode == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if code := cniCode(t, err); code != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %v (code %d), want code %d saying %q", err, code, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func TestGCValidAttachments(t *testing.T) {
	f := &fakeAppliance{attached: map[string]admin.Attachment{}}
	sock := serveFake(t, f)
	for _, id := range []string{"keep", "drop"} {
		a := args(conf("1.1.0", sock, prev100))
		a.ContainerID = id
		if err := (&Plugin{Stdout: io.Discard}).Add(a); err != nil {
			t.Fatal(err)
		}
	}
	stdin := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rdma","type":"taproce-cni","adminSocket":%q,
		"cni.dev/valid-attachments":[{"containerID":"keep","ifname":"eth0"}]}`, sock))
	if err := (&Plugin{}).GC(&skel.CmdArgs{StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.attached["keep/eth0"]; !ok || len(f.attached) != 1 {
		t.Fatalf("after GC: %v", f.attached)
	}
}
