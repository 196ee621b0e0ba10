// Package admin is the appliance's administrative API, the one the CNI
// plugin uses: HTTP with JSON bodies over a unix socket (by default
// /run/taproce/admin.sock) to attach a port to a pod's network namespace,
// detach it, check it, list the attachments and collect the stale ones.
//
// The API, all bodies JSON:
//
//	POST /v1/attach        AttachRequest → Attachment   (idempotent per ID)
//	POST /v1/detach        DetachRequest → 204          (idempotent)
//	POST /v1/check         CheckRequest  → Attachment   (ErrIncomplete says what is missing)
//	GET  /v1/attachments   → []Attachment
//	POST /v1/gc            GCRequest     → GCResult
//	GET  /healthz          → 200 "ok"
//
// Errors come back as {"error": message, "kind": kind} with an HTTP status
// that follows the kind; the Client turns them into *Error values that
// wrap the package's sentinel errors, so callers branch with errors.Is.
//
// The appliance supplies the behaviour through the Backend interface;
// NewServer turns a Backend into an http.Handler.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
)

// DefaultSocket is where the appliance serves the admin API.
const DefaultSocket = "/run/taproce/admin.sock"

// DefaultPortName is the name of an attachment's TAP device when the
// request names none.
const DefaultPortName = "roce0"

// maxBody bounds a request body.
const maxBody = 1 << 20

// maxIPs bounds the addresses of one attachment.
const maxIPs = 64

// Sentinel errors. The server maps them to HTTP statuses and kinds, the
// client maps the kinds back, so errors.Is works on both sides.
var (
	// ErrInvalid: the request is malformed or names something invalid.
	ErrInvalid = errors.New("invalid request")
	// ErrNotFound: no attachment has the ID.
	ErrNotFound = errors.New("no such attachment")
	// ErrConflict: the ID is attached already, differently (another
	// namespace or port name).
	ErrConflict = errors.New("attachment exists with other parameters")
	// ErrNetnsGone: the network namespace (or the pod interface in it)
	// does not exist.
	ErrNetnsGone = errors.New("network namespace or interface not found")
	// ErrIncomplete: an attachment's port, TAP device or tc filters are
	// not all in place; the message says what is missing.
	ErrIncomplete = errors.New("attachment incomplete")
	// ErrUnavailable: the client could not reach the appliance (no
	// socket, nobody listening, connection broken). Never sent by a server.
	ErrUnavailable = errors.New("appliance unavailable")
	// ErrInternal: the appliance failed for another reason.
	ErrInternal = errors.New("appliance error")
)

// Kind names an error class on the wire.
type Kind string

// Kinds of errors on the wire, one per sentinel error.
const (
	KindInvalid    Kind = "invalid"
	KindNotFound   Kind = "not_found"
	KindConflict   Kind = "conflict"
	KindNetnsGone  Kind = "netns_gone"
	KindIncomplete Kind = "incomplete"
	KindInternal   Kind = "internal"
)

// kinds maps each kind to its sentinel and HTTP status.
var kinds = []struct {
	kind   Kind
	err    error
	status int
}{
	{KindInvalid, ErrInvalid, 400},
	{KindNotFound, ErrNotFound, 404},
	{KindConflict, ErrConflict, 409},
	{KindNetnsGone, ErrNetnsGone, 410},
	{KindIncomplete, ErrIncomplete, 424},
	{KindInternal, ErrInternal, 500},
}

// kindOf classifies an error of a Backend.
func kindOf(err error) (Kind, int) {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind, k.status
		}
	}
	return KindInternal, 500
}

// sentinel returns the sentinel error of a kind (ErrInternal for unknown
// ones).
func sentinel(k Kind) error {
	for _, e := range kinds {
		if e.kind == k {
			return e.err
		}
	}
	return ErrInternal
}

// AttachRequest asks for a port attached to a pod's network namespace in
// redirect mode: the port takes the pod interface's MAC and the pod's IPs
// as its GIDs, and tc filters move RoCEv2 traffic between the pod
// interface and the port's TAP device.
type AttachRequest struct {
	// ContainerID and IfName (the pod's interface, such as eth0) identify
	// the attachment, as CNI identifies an attachment.
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// Netns is the path of the pod's network namespace.
	Netns string `json:"netns"`
	// IPs are the pod interface's addresses (from the CNI prevResult):
	// the port's GIDs.
	IPs []netip.Prefix `json:"ips"`
	// PortName is the TAP device's name (default "roce0").
	PortName string `json:"portName,omitempty"`
	// Network is the CNI network name, which scopes garbage collection.
	Network string `json:"network,omitempty"`
}

// ID returns the attachment ID the request creates.
func (r *AttachRequest) ID() string { return AttachmentID(r.ContainerID, r.IfName) }

// Normalize fills in defaults and validates the request.
func (r *AttachRequest) Normalize() error {
	if r.PortName == "" {
		r.PortName = DefaultPortName
	}
	var errs []error
	errs = append(errs, validContainerID(r.ContainerID), validIfName("ifName", r.IfName),
		validIfName("portName", r.PortName), validNetns(r.Netns, true), validNetwork(r.Network))
	if r.PortName == r.IfName {
		errs = append(errs, fmt.Errorf("portName %q is the pod interface itself", r.PortName))
	}
	switch {
	case len(r.IPs) == 0:
		errs = append(errs, errors.New("ips: at least one address is required"))
	case len(r.IPs) > maxIPs:
		errs = append(errs, fmt.Errorf("ips: %d addresses, at most %d", len(r.IPs), maxIPs))
	}
	seen := map[netip.Addr]bool{}
	for i, p := range r.IPs {
		a := p.Addr()
		switch {
		case !p.IsValid():
			errs = append(errs, fmt.Errorf("ips[%d]: invalid prefix", i))
		case a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.Is4In6():
			errs = append(errs, fmt.Errorf("ips[%d]: %v is not a unicast interface address", i, p))
		case seen[a]:
			errs = append(errs, fmt.Errorf("ips[%d]: %v given twice", i, a))
		}
		seen[a] = true
	}
	return invalid(errs)
}

// DetachRequest asks for an attachment to be removed. Netns, when given,
// lets the appliance remove leftovers of an attachment it does not know
// (one of an earlier run).
type DetachRequest struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns,omitempty"`
	// PortName is the TAP device's name (default "roce0").
	PortName string `json:"portName,omitempty"`
}

// ID returns the attachment ID.
func (r *DetachRequest) ID() string { return AttachmentID(r.ContainerID, r.IfName) }

// Normalize fills in defaults and validates the request.
func (r *DetachRequest) Normalize() error {
	if r.PortName == "" {
		r.PortName = DefaultPortName
	}
	return invalid([]error{validContainerID(r.ContainerID), validIfName("ifName", r.IfName),
		validIfName("portName", r.PortName), validNetns(r.Netns, false)})
}

// CheckRequest asks the appliance to verify an attachment.
type CheckRequest struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// ID returns the attachment ID.
func (r *CheckRequest) ID() string { return AttachmentID(r.ContainerID, r.IfName) }

// Normalize validates the request.
func (r *CheckRequest) Normalize() error {
	return invalid([]error{validContainerID(r.ContainerID), validIfName("ifName", r.IfName)})
}

// GCRequest asks the appliance to detach every attachment of Network
// whose ID is not in Valid.
type GCRequest struct {
	// Network scopes the collection: only attachments made for this CNI
	// network are considered (those made without a name match "").
	Network string `json:"network,omitempty"`
	// Valid are the IDs (ContainerID/IfName) that must stay.
	Valid []string `json:"valid"`
}

// Normalize validates the request.
func (r *GCRequest) Normalize() error {
	errs := []error{validNetwork(r.Network)}
	for i, id := range r.Valid {
		c, i2, ok := strings.Cut(id, "/")
		if !ok || validContainerID(c) != nil || validIfName("", i2) != nil {
			errs = append(errs, fmt.Errorf("valid[%d]: %q is not an attachment ID (CONTAINERID/IFNAME)", i, id))
		}
	}
	return invalid(errs)
}

// GCResult lists what a collection detached and what it could not.
type GCResult struct {
	Removed []string `json:"removed"`
	// Failed maps IDs to the error that kept them attached.
	Failed map[string]string `json:"failed,omitempty"`
}

// State is an attachment's condition.
type State string

// States of an attachment.
const (
	// StateActive: port, TAP and filters are in place.
	StateActive State = "active"
	// StateDegraded: something is missing; Check says what.
	StateDegraded State = "degraded"
)

// Mode is how a port reaches the network.
type Mode string

// ModeRedirect: tc filters move RoCEv2 traffic between a pod interface and
// the port's TAP; the port uses the pod's MAC and IPs.
const ModeRedirect Mode = "redirect"

// Attachment describes an attached port.
type Attachment struct {
	// ID is ContainerID + "/" + IfName.
	ID          string `json:"id"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Network     string `json:"network,omitempty"`
	Netns       string `json:"netns"`
	PortName    string `json:"portName"`
	Mode        Mode   `json:"mode"`
	// MAC is the port's MAC (in redirect mode the pod interface's), as
	// "02:00:00:00:00:01".
	MAC string `json:"mac"`
	// GIDs is the port's GID table in index order; IPv4 GIDs appear as
	// ::ffff:a.b.c.d.
	GIDs  []netip.Addr `json:"gids"`
	State State        `json:"state"`
	// Device is the verbs device that serves the port (taproce3), which
	// the pod's applications open; empty when the port is not one.
	Device string `json:"device,omitempty"`
}

// AttachmentID returns the ID of the attachment of containerID's interface
// ifName.
func AttachmentID(containerID, ifName string) string { return containerID + "/" + ifName }

// DecodeAttachRequest reads an attach request as the server does:
// at most 1 MiB of one JSON object (unknown fields are ignored so that a
// newer plugin can talk to an older appliance), defaults filled in,
// validated. Errors wrap ErrInvalid.
func DecodeAttachRequest(r io.Reader) (AttachRequest, error) {
	var req AttachRequest
	err := decode(r, &req)
	return req, err
}

// DecodeDetachRequest reads a detach request as the server does.
func DecodeDetachRequest(r io.Reader) (DetachRequest, error) {
	var req DetachRequest
	err := decode(r, &req)
	return req, err
}

// DecodeCheckRequest reads a check request as the server does.
func DecodeCheckRequest(r io.Reader) (CheckRequest, error) {
	var req CheckRequest
	err := decode(r, &req)
	return req, err
}

// DecodeGCRequest reads a garbage-collection request as the server does.
func DecodeGCRequest(r io.Reader) (GCRequest, error) {
	var req GCRequest
	err := decode(r, &req)
	return req, err
}

type normalizer interface{ Normalize() error }

func decode(r io.Reader, v normalizer) error {
	body, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return fmt.Errorf("%w: reading the body: %w", ErrInvalid, err)
	}
	if len(body) > maxBody {
		return fmt.Errorf("%w: body larger than %d bytes", ErrInvalid, maxBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: decoding JSON: %w", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: data after the JSON object", ErrInvalid)
	}
	return v.Normalize()
}

// invalid joins validation errors under ErrInvalid (nil when there are
// none).
func invalid(errs []error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// validContainerID accepts what CNI accepts: a letter or digit, then
// letters, digits, '_', '.' and '-'.
func validContainerID(id string) error {
	if id == "" {
		return errors.New("containerID is empty")
	}
	if len(id) > 1024 {
		return errors.New("containerID longer than 1024 bytes")
	}
	for i, c := range []byte(id) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return fmt.Errorf("containerID %q: character %d is not allowed", id, i)
		}
	}
	return nil
}

// validIfName accepts Linux interface names: 1 to 15 bytes, not "." or
// "..", without '/', ':' or white space.
func validIfName(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is empty", field)
	case len(name) > 15:
		return fmt.Errorf("%s %q is longer than 15 bytes", field, name)
	case name == "." || name == "..":
		return fmt.Errorf("%s %q is not an interface name", field, name)
	}
	for _, c := range []byte(name) {
		if c == '/' || c == ':' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("%s %q contains a character not allowed in interface names", field, name)
		}
	}
	return nil
}

// validNetns accepts an absolute, clean path (empty when not required).
func validNetns(path string, required bool) error {
	switch {
	case path == "" && !required:
		return nil
	case path == "":
		return errors.New("netns is empty")
	case !filepath.IsAbs(path) || filepath.Clean(path) != path:
		return fmt.Errorf("netns %q is not an absolute, clean path", path)
	case strings.ContainsRune(path, 0):
		return fmt.Errorf("netns %q contains a NUL byte", path)
	}
	return nil
}

// validNetwork accepts CNI network names: empty, or without NUL bytes and
// at most 256 bytes.
func validNetwork(name string) error {
	if len(name) > 256 || strings.ContainsRune(name, 0) {
		return fmt.Errorf("network name %q is not valid", name)
	}
	return nil
}

// Backend is what the appliance implements behind the API. Methods are
// called concurrently.
type Backend interface {
	// Attach creates the attachment, or returns the existing one when an
	// attachment with the same ID, namespace and port name exists
	// (ErrConflict when it differs). The request is normalized.
	Attach(ctx context.Context, req AttachRequest) (Attachment, error)
	// Detach removes the attachment. An unknown ID, or a namespace that
	// vanished, is success.
	Detach(ctx context.Context, req DetachRequest) error
	// Check verifies that the attachment's port, TAP device and tc
	// filters are in place: ErrNotFound for an unknown ID, ErrIncomplete
	// (saying what is missing) otherwise.
	Check(ctx context.Context, req CheckRequest) (Attachment, error)
	// List returns every attachment, sorted by ID.
	List(ctx context.Context) ([]Attachment, error)
}
