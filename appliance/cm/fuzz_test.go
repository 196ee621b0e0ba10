package cm_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/taproce/taproce/appliance/cm"
	"github.com/taproce/taproce/appliance/roce"
	"github.com/taproce/taproce/internal/testvectors"
)

// FuzzParseMAD: any bytes parse or fail without panicking; what parses
// encodes to a MAD that parses to the same message and encodes to the
// same bytes (parse(encode(parse(x))) is stable), and formats; private
// data of any content gives a CMA header or an error.
func FuzzParseMAD(f *testing.F) {
	for _, fr := range testvectors.Frames() {
		var p roce.Packet
		if roce.Parse(fr, &p) == nil && cm.IsGSI(&p) {
			f.Add(p.Payload(fr))
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, a := range allAttrs {
		m := randomMessage(r, a)
		b := make([]byte, cm.MADLen)
		if _, err := m.Encode(b); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m cm.Message
		if err := cm.Parse(b, &m); err != nil {
			if len(b) == cm.MADLen && m.Header != cm.MAD(b).Header() {
				t.Fatalf("header not filled on %v", err)
			}
			return
		}
		_ = m.String()
		_, _ = cm.ParseCMAHeader(m.REQ.PrivateData[:])
		_, _ = cm.ParseCMAHeader(b)
		enc := make([]byte, cm.MADLen)
		if _, err := m.Encode(enc); err != nil {
			t.Fatalf("Encode of a parsed message: %v", err)
		}
		var again cm.Message
		if err := cm.Parse(enc, &again); err != nil {
			t.Fatalf("Parse of an encoded message: %v", err)
		}
		if again != m {
			t.Fatalf("parse(encode(parse(x))) differs\n got %+v\nwant %+v", again, m)
		}
		enc2 := make([]byte, cm.MADLen)
		if _, err := again.Encode(enc2); err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable (%v)", err)
		}
	})
}
