package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Client calls the admin API over a unix socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client of the appliance serving the socket at path
// (DefaultSocket when empty). Deadlines come from the contexts of the
// calls.
func NewClient(path string) *Client {
	if path == "" {
		path = DefaultSocket
	}
	var d net.Dialer
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		DisableCompression: true,
		MaxIdleConns:       1,
	}
	return &Client{socket: path, hc: &http.Client{Transport: tr}}
}

// Socket returns the path of the socket the client calls.
func (c *Client) Socket() string { return c.socket }

// Error is an error the appliance answered with.
type Error struct {
	// Op is the call: "attach", "detach", "check", "list", "gc", "health".
	Op string
	// Status is the HTTP status, Kind the error class, Message the
	// appliance's explanation.
	Status  int
	Kind    Kind
	Message string
}

// Error returns the appliance's message with the call.
func (e *Error) Error() string { return "appliance " + e.Op + ": " + e.Message }

// Unwrap returns the sentinel error of the kind, so that errors.Is(err,
// ErrNotFound) and the like work on the client side.
func (e *Error) Unwrap() error { return sentinel(e.Kind) }

// Attach attaches a port as req asks and returns the attachment.
func (c *Client) Attach(ctx context.Context, req AttachRequest) (Attachment, error) {
	var att Attachment
	err := c.call(ctx, "attach", http.MethodPost, "/v1/attach", req, &att)
	return att, err
}

// Detach removes an attachment; an unknown one is success.
func (c *Client) Detach(ctx context.Context, req DetachRequest) error {
	return c.call(ctx, "detach", http.MethodPost, "/v1/detach", req, nil)
}

// Check verifies an attachment and returns it.
func (c *Client) Check(ctx context.Context, req CheckRequest) (Attachment, error) {
	var att Attachment
	err := c.call(ctx, "check", http.MethodPost, "/v1/check", req, &att)
	return att, err
}

// List returns the appliance's attachments.
func (c *Client) List(ctx context.Context) ([]Attachment, error) {
	var atts []Attachment
	err := c.call(ctx, "list", http.MethodGet, "/v1/attachments", nil, &atts)
	return atts, err
}

// GC detaches the attachments of req.Network not in req.Valid.
func (c *Client) GC(ctx context.Context, req GCRequest) (GCResult, error) {
	var res GCResult
	err := c.call(ctx, "gc", http.MethodPost, "/v1/gc", req, &res)
	return res, err
}

// Health returns nil when the appliance answers its health check.
func (c *Client) Health(ctx context.Context) error {
	return c.call(ctx, "health", http.MethodGet, "/healthz", nil, nil)
}

// call sends one request and decodes a 2xx reply into out (when not nil).
// Failures to reach the appliance wrap ErrUnavailable; its error answers
// are *Error.
func (c *Client) call(ctx context.Context, op, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("appliance %s: encoding the request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://taproce"+path, body)
	if err != nil {
		return fmt.Errorf("appliance %s: %w", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("appliance %s at %s: %w", op, c.socket, ctxErr)
		}
		return fmt.Errorf("appliance %s: %w at %s: %w", op, ErrUnavailable, c.socket, unwrapURL(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("appliance %s: %w: reading the answer: %w", op, ErrUnavailable, err)
	}
	if resp.StatusCode/100 != 2 {
		var eb errorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb = errorBody{Error: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(data))), Kind: KindInternal}
		}
		return &Error{Op: op, Status: resp.StatusCode, Kind: eb.Kind, Message: eb.Error}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("appliance %s: decoding the answer: %w", op, err)
		}
	}
	return nil
}

// unwrapURL drops the *url.Error around a transport error: its text
// names the made-up URL, not the socket.
func unwrapURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok && ue.Err != nil {
		return ue.Err
	}
	return err
}
