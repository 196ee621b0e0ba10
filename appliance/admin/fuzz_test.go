package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeAttachRequest feeds arbitrary bodies to the decoders the
// server uses: they never panic, reject with ErrInvalid, and what they
// accept is valid and survives a round trip through JSON unchanged.
func FuzzDecodeAttachRequest(f *testing.F) {
	for _, s := range []string{
		`{"containerID":"c","ifName":"eth0","netns":"/var/run/netns/p","ips":["10.0.0.1/8","fd00::1/64"]}`,
		`{"containerID":"c","ifName":"eth0","netns":"/n","ips":["10.0.0.1/8"],"portName":"rdma0","network":"k8s-pod-network"}`,
		`{"containerID":"c","ifName":"eth0","netns":"/n","ips":["::ffff:10.0.0.1/104"]}`,
		`{"containerID":"c","ifName":"eth0","netns":"/n","ips":["fe80::1%eth0/64"]}`,
		`{"network":"n","valid":["a/eth0","b/net1"]}`,
		`{"containerID":"c","ifName":"eth0"}`,
		`{"ips":null}`, `null`, `{}`, `[`, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeAttachRequest(bytes.NewReader(body))
		roundTrip(t, req, err, func(b []byte) (AttachRequest, error) { return DecodeAttachRequest(bytes.NewReader(b)) })
		det, err := DecodeDetachRequest(bytes.NewReader(body))
		roundTrip(t, det, err, func(b []byte) (DetachRequest, error) { return DecodeDetachRequest(bytes.NewReader(b)) })
		chk, err := DecodeCheckRequest(bytes.NewReader(body))
		roundTrip(t, chk, err, func(b []byte) (CheckRequest, error) { return DecodeCheckRequest(bytes.NewReader(b)) })
		gc, err := DecodeGCRequest(bytes.NewReader(body))
		roundTrip(t, gc, err, func(b []byte) (GCRequest, error) { return DecodeGCRequest(bytes.NewReader(b)) })
	})
}

func roundTrip[T any, P interface {
	*T
	normalizer
}](t *testing.T, v T, err error, dec func([]byte) (T, error)) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("decoding error %v does not wrap ErrInvalid", err)
		}
		return
	}
	if err := P(&v).Normalize(); err != nil {
		t.Fatalf("accepted %+v, which does not validate again: %v", v, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encoding %+v: %v", v, err)
	}
	w, err := dec(b)
	if err != nil {
		t.Fatalf("re-decoding %s: %v", b, err)
	}
	if !reflect.DeepEqual(v, w) {
		t.Fatalf("round trip changed the request:\n%+v\n%+v", v, w)
	}
}
