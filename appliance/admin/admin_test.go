package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeBackend keeps attachments in a map and records the requests it got.
type fakeBackend struct {
	mu        sync.Mutex
	atts      map[string]Attachment
	attachErr error
	detachErr map[string]error
	checkErr  error
	block     chan struct{} // when set, Attach waits for it or the context
	lastReq   AttachRequest
}

func newFake() *fakeBackend {
	return &fakeBackend{atts: map[string]Attachment{}, detachErr: map[string]error{}}
}

func (f *fakeBackend) Attach(ctx context.Context, req AttachRequest) (Attachment, error) {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return Attachment{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastReq = req
	if f.attachErr != nil {
		return Attachment{}, f.attachErr
	}
	a := Attachment{ID: req.ID(), ContainerID: req.ContainerID, IfName: req.IfName, Network: req.Network,
		Netns: req.Netns, PortName: req.PortName, Mode: ModeRedirect, MAC: "02:00:00:00:00:01", State: StateActive}
	for _, p := range req.IPs {
		a.GIDs = append(a.GIDs, netip.AddrFrom16(p.Addr().As16()))
	}
	f.atts[a.ID] = a
	return a, nil
}

func (f *fakeBackend) Detach(_ context.Context, req DetachRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.detachErr[req.ID()]; err != nil {
		return err
	}
	delete(f.atts, req.ID())
	return nil
}

func (f *fakeBackend) Check(_ context.Context, req CheckRequest) (Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.atts[req.ID()]
	if !ok {
		return Attachment{}, fmt.Errorf("%w: %s", ErrNotFound, req.ID())
	}
	if f.checkErr != nil {
		return Attachment{}, f.checkErr
	}
	return a, nil
}

func (f *fakeBackend) List(context.Context) ([]Attachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Attachment
	for _, a := range f.atts {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Attachment) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// serve runs the API for b on a socket in a temporary directory and
// returns a client of it.
func serve(t *testing.T, b Backend) *Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", "admin.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: NewServer(b), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return NewClient(path)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

var goodReq = AttachRequest{
	ContainerID: "c0ffee",
	IfName:      "eth0",
	Netns:       "/var/run/netns/pod",
	IPs:         []netip.Prefix{netip.MustParsePrefix("10.1.2.3/24"), netip.MustParsePrefix("fd00::3/64")},
	Network:     "net1",
}

func TestAttach(t *testing.T) {
	with := func(f func(r *AttachRequest)) AttachRequest {
		r := goodReq
		r.IPs = slices.Clone(goodReq.IPs)
		f(&r)
		return r
	}
	tests := []struct {
		name    string
		req     AttachRequest
		backend error
		wantErr error
		wantMsg string
	}{
		{name: "ok", req: goodReq},
		{name: "missing netns", req: with(func(r *AttachRequest) { r.Netns = "" }), wantErr: ErrInvalid, wantMsg: "netns is empty"},
		{name: "relative netns", req: with(func(r *AttachRequest) { r.Netns = "netns/pod" }), wantErr: ErrInvalid, wantMsg: "absolute"},
		{name: "no ips", req: with(func(r *AttachRequest) { r.IPs = nil }), wantErr: ErrInvalid, wantMsg: "at least one address"},
		{name: "multicast ip", req: with(func(r *AttachRequest) { r.IPs[0] = netip.MustParsePrefix("224.0.0.1/32") }), wantErr: ErrInvalid, wantMsg: "not a unicast"},
		{name: "duplicate ip", req: with(func(r *AttachRequest) { r.IPs[1] = r.IPs[0] }), wantErr: ErrInvalid, wantMsg: "given twice"},
		{name: "bad container id", req: with(func(r *AttachRequest) { r.ContainerID = "-x" }), wantErr: ErrInvalid, wantMsg: "containerID"},
		{name: "long ifname", req: with(func(r *AttachRequest) { r.IfName = "a-very-long-ifname" }), wantErr: ErrInvalid, wantMsg: "longer than 15"},
		{name: "port is pod interface", req: with(func(r *AttachRequest) { r.PortName = "eth0" }), wantErr: ErrInvalid, wantMsg: "pod interface itself"},
		{name: "conflict", req: goodReq, backend: fmt.Errorf("%w: attached in /x", ErrConflict), wantErr: ErrConflict, wantMsg: "attached in /x"},
		{name: "netns gone", req: goodReq, backend: fmt.Errorf("%w: /var/run/netns/pod", ErrNetnsGone), wantErr: ErrNetnsGone},
		{name: "internal", req: goodReq, backend: errors.New("tap: no /dev/net/tun"), wantErr: ErrInternal, wantMsg: "no /dev/net/tun"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newFake()
			b.attachErr = tt.backend
			c := serve(t, b)
			att, err := c.Attach(ctx(t), tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				var ae *Error
				if !errors.As(err, &ae) {
					t.Fatalf("error %T, want *Error", err)
				}
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("error %q does not say %q", err, tt.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if att.ID != "c0ffee/eth0" || att.PortName != DefaultPortName || len(att.GIDs) != 2 ||
				att.GIDs[0] != netip.MustParseAddr("::ffff:10.1.2.3") {
				t.Errorf("attachment %+v", att)
			}
			if b.lastReq.PortName != DefaultPortName || b.lastReq.Network != "net1" {
				t.Errorf("backend got %+v", b.lastReq)
			}
		})
	}
}

func TestDetachCheckList(t *testing.T) {
	b := newFake()
	c := serve(t, b)
	if _, err := c.Attach(ctx(t), goodReq); err != nil {
		t.Fatal(err)
	}
	atts, err := c.List(ctx(t))
	if err != nil || len(atts) != 1 || atts[0].ID != "c0ffee/eth0" {
		t.Fatalf("list: %v %+v", err, atts)
	}
	if _, err := c.Check(ctx(t), CheckRequest{ContainerID: "c0ffee", IfName: "eth0"}); err != nil {
		t.Fatalf("check: %v", err)
	}
	b.checkErr = fmt.Errorf("%w: tc filter on eth0 ingress (IPv4) missing", ErrIncomplete)
	_, err = c.Check(ctx(t), CheckRequest{ContainerID: "c0ffee", IfName: "eth0"})
	if !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "IPv4) missing") {
		t.Fatalf("check of a broken attachment: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := c.Detach(ctx(t), DetachRequest{ContainerID: "c0ffee", IfName: "eth0"}); err != nil {
			t.Fatalf("detach %d: %v", i, err)
		}
	}
	_, err = c.Check(ctx(t), CheckRequest{ContainerID: "c0ffee", IfName: "eth0"})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("check after detach: %v, want ErrNotFound", err)
	}
	if atts, err := c.List(ctx(t)); err != nil || len(atts) != 0 || atts == nil {
		t.Fatalf("list after detach: %v %#v", err, atts)
	}
	if err := c.Detach(ctx(t), DetachRequest{ContainerID: "c0ffee", IfName: "eth/0"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("detach with a bad name: %v", err)
	}
}

func TestGC(t *testing.T) {
	tests := []struct {
		name        string
		network     string
		valid       []string
		failing     string
		wantRemoved []string
		wantLeft    []string
		wantErr     error
	}{
		{name: "all valid", network: "net1", valid: []string{"a/eth0", "b/eth0"},
			wantRemoved: []string{}, wantLeft: []string{"a/eth0", "b/eth0", "c/eth0"}},
		{name: "one stale", network: "net1", valid: []string{"a/eth0"},
			wantRemoved: []string{"b/eth0"}, wantLeft: []string{"a/eth0", "c/eth0"}},
		{name: "none valid", network: "net1",
			wantRemoved: []string{"a/eth0", "b/eth0"}, wantLeft: []string{"c/eth0"}},
		{name: "other network", network: "net2",
			wantRemoved: []string{"c/eth0"}, wantLeft: []string{"a/eth0", "b/eth0"}},
		{name: "failure", network: "net1", failing: "b/eth0",
			wantLeft: []string{"b/eth0", "c/eth0"}, wantErr: ErrInternal},
		{name: "bad id", network: "net1", valid: []string{"nope"}, wantErr: ErrInvalid,
			wantLeft: []string{"a/eth0", "b/eth0", "c/eth0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newFake()
			c := serve(t, b)
			for _, a := range []struct{ id, net string }{{"a", "net1"}, {"b", "net1"}, {"c", "net2"}} {
				r := goodReq
				r.ContainerID, r.Network = a.id, a.net
				if _, err := c.Attach(ctx(t), r); err != nil {
					t.Fatal(err)
				}
			}
			if tt.failing != "" {
				b.detachErr[tt.failing] = errors.New("netlink: device busy")
			}
			res, err := c.GC(ctx(t), GCRequest{Network: tt.network, Valid: tt.valid})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("gc: %v, want %v", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if !slices.Equal(res.Removed, tt.wantRemoved) {
				t.Errorf("removed %v, want %v", res.Removed, tt.wantRemoved)
			}
			atts, _ := c.List(ctx(t))
			var left []string
			for _, a := range atts {
				left = append(left, a.ID)
			}
			if !slices.Equal(left, tt.wantLeft) {
				t.Errorf("left %v, want %v", left, tt.wantLeft)
			}
		})
	}
}

func TestUnavailable(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	tests := []struct{ name, path string }{
		{"no socket", filepath.Join(dir, "missing.sock")},
		{"nobody listening", stale},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClient(tt.path)
			err := c.Health(ctx(t))
			if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tt.path) {
				t.Fatalf("health: %v, want ErrUnavailable naming the socket", err)
			}
			if err := c.Detach(ctx(t), DetachRequest{ContainerID: "a", IfName: "eth0"}); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("detach: %v", err)
			}
		})
	}
}

func TestHealthAndDeadline(t *testing.T) {
	b := newFake()
	b.block = make(chan struct{})
	c := serve(t, b)
	if err := c.Health(ctx(t)); err != nil {
		t.Fatal(err)
	}
	cx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Attach(cx, goodReq)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("attach past its deadline: %v", err)
	}
	close(b.block)
}

func TestRouting(t *testing.T) {
	c := serve(t, newFake())
	tests := []struct {
		method, path string
		status       int
	}{
		{"GET", "/v1/attach", http.StatusMethodNotAllowed},
		{"POST", "/v1/nothing", http.StatusNotFound},
	}
	for _, tt := range tests {
		err := c.call(ctx(t), "test", tt.method, tt.path, nil, nil)
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != tt.status || !errors.Is(err, ErrInternal) {
			t.Errorf("%s %s: %v, want status %d", tt.method, tt.path, err, tt.status)
		}
	}
}

func TestListen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, %v", fi.Mode(), err)
	}
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "another appliance") {
		t.Errorf("second Listen on a served socket: %v", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := Listen(path)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	l2.Close()
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name, body string
		wantErr    string
	}{
		{"ok", `{"containerID":"c","ifName":"eth0","netns":"/n","ips":["10.0.0.1/8"]}`, ""},
		{"unknown field ignored", `{"containerID":"c","ifName":"eth0","netns":"/n","ips":["10.0.0.1/8"],"future":1}`, ""},
		{"trailing data", `{"containerID":"c","ifName":"eth0","netns":"/n","ips":["10.0.0.1/8"]} {}`, "data after"},
		{"bad prefix", `{"containerID":"c","ifName":"eth0","netns":"/n","ips":["10.0.0.1"]}`, "decoding JSON"},
		{"not an object", `[]`, "decoding JSON"},
		{"empty", ``, "decoding JSON"},
		{"too big", `{"containerID":"` + strings.Repeat("a", maxBody) + `"}`, "larger than"},
		{"many errors", `{"ifName":"","netns":"x","ips":[]}`, "containerID is empty\nifName is empty\nnetns \"x\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := DecodeAttachRequest(strings.NewReader(tt.body))
			if tt.wantErr == "" {
				if err != nil || req.PortName != DefaultPortName {
					t.Fatalf("%v %+v", err, req)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want ErrInvalid saying %q", err, tt.wantErr)
			}
		})
	}
}
