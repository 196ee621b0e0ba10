package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// ServerOption configures NewServer.
type ServerOption func(*server)

// WithLogger sets the server's logger (default slog.Default()).
func WithLogger(l *slog.Logger) ServerOption {
	return func(s *server) { s.log = l }
}

type server struct {
	b   Backend
	log *slog.Logger
	mux *http.ServeMux
}

// NewServer returns the API's HTTP handler over b.
func NewServer(b Backend, opts ...ServerOption) http.Handler {
	s := &server{b: b, log: slog.Default(), mux: http.NewServeMux()}
	for _, o := range opts {
		o(s)
	}
	s.mux.HandleFunc("POST /v1/attach", s.attach)
	s.mux.HandleFunc("POST /v1/detach", s.detach)
	s.mux.HandleFunc("POST /v1/check", s.check)
	s.mux.HandleFunc("GET /v1/attachments", s.list)
	s.mux.HandleFunc("POST /v1/gc", s.gc)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	return s
}

// ServeHTTP serves the API.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

func (s *server) attach(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeAttachRequest(r.Body)
	if err != nil {
		s.fail(w, r, "attach", err)
		return
	}
	start := time.Now()
	att, err := s.b.Attach(r.Context(), req)
	if err != nil {
		s.fail(w, r, "attach "+req.ID(), err)
		return
	}
	s.log.Info("attached", "id", att.ID, "netns", att.Netns, "port", att.PortName, "mac", att.MAC, "took", time.Since(start))
	s.reply(w, http.StatusOK, att)
}

func (s *server) detach(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeDetachRequest(r.Body)
	if err != nil {
		s.fail(w, r, "detach", err)
		return
	}
	if err := s.b.Detach(r.Context(), req); err != nil {
		s.fail(w, r, "detach "+req.ID(), err)
		return
	}
	s.log.Info("detached", "id", req.ID())
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) check(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeCheckRequest(r.Body)
	if err != nil {
		s.fail(w, r, "check", err)
		return
	}
	att, err := s.b.Check(r.Context(), req)
	if err != nil {
		s.fail(w, r, "check "+req.ID(), err)
		return
	}
	s.reply(w, http.StatusOK, att)
}

func (s *server) list(w http.ResponseWriter, r *http.Request) {
	atts, err := s.b.List(r.Context())
	if err != nil {
		s.fail(w, r, "list", err)
		return
	}
	if atts == nil {
		atts = []Attachment{}
	}
	s.reply(w, http.StatusOK, atts)
}

// gc detaches the attachments of the request's network that are not in
// its valid set, each as a DetachRequest would.
func (s *server) gc(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeGCRequest(r.Body)
	if err != nil {
		s.fail(w, r, "gc", err)
		return
	}
	atts, err := s.b.List(r.Context())
	if err != nil {
		s.fail(w, r, "gc", err)
		return
	}
	res := GCResult{Removed: []string{}}
	var errs []error
	for _, a := range atts {
		if a.Network != req.Network || slices.Contains(req.Valid, a.ID) {
			continue
		}
		err := s.b.Detach(r.Context(), DetachRequest{ContainerID: a.ContainerID, IfName: a.IfName, Netns: a.Netns, PortName: a.PortName})
		if err != nil {
			if res.Failed == nil {
				res.Failed = map[string]string{}
			}
			res.Failed[a.ID] = err.Error()
			errs = append(errs, fmt.Errorf("%s: %w", a.ID, err))
			continue
		}
		res.Removed = append(res.Removed, a.ID)
	}
	if len(res.Removed) > 0 || len(errs) > 0 {
		s.log.Info("garbage collected", "network", req.Network, "removed", res.Removed, "failed", len(errs))
	}
	if len(errs) > 0 {
		s.fail(w, r, "gc", fmt.Errorf("%d of %d stale attachments not detached: %w",
			len(errs), len(errs)+len(res.Removed), errors.Join(errs...)))
		return
	}
	s.reply(w, http.StatusOK, res)
}

// errorBody is the body of every error response.
type errorBody struct {
	Error string `json:"error"`
	Kind  Kind   `json:"kind"`
}

func (s *server) fail(w http.ResponseWriter, r *http.Request, op string, err error) {
	kind, status := kindOf(err)
	lvl := slog.LevelWarn
	if status >= 500 {
		lvl = slog.LevelError
	}
	s.log.Log(r.Context(), lvl, "admin request failed", "op", op, "kind", kind, "err", err)
	s.reply(w, status, errorBody{Error: err.Error(), Kind: kind})
}

func (s *server) reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.log.Debug("writing admin response", "err", err)
	}
}

// Listen creates the unix socket at path for the API: its directory is
// created (0755) when missing, a stale socket file left by an earlier run
// is replaced, and the socket is made accessible to root only (0600). A
// socket that another process still serves is left alone: Listen fails.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("admin socket directory: %w", err)
	}
	l, err := net.Listen("unix", path)
	if errors.Is(err, syscall.EADDRINUSE) {
		if c, derr := net.DialTimeout("unix", path, time.Second); derr == nil {
			c.Close()
			return nil, fmt.Errorf("admin socket %s: another appliance is serving it", path)
		}
		if rerr := os.Remove(path); rerr != nil {
			return nil, fmt.Errorf("admin socket %s: removing the stale socket: %w", path, rerr)
		}
		l, err = net.Listen("unix", path)
	}
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("admin socket %s: %w", path, err)
	}
	return l, nil
}
