package impair

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseSpec(t *testing.T) {
	tests := []struct {
		in   string
		want Spec
	}{
		{"", Spec{}},
		{"   ", Spec{}},
		{"loss=1%", Spec{Loss: 0.01}},
		{"loss=0.01", Spec{Loss: 0.01}},
		{"loss=0", Spec{}},
		{"loss=-0", Spec{}},
		{"loss=0%", Spec{}},
		{"loss=100%", Spec{Loss: 1}},
		{"loss=1", Spec{Loss: 1}},
		{"duplicate=2.5%", Spec{Duplicate: 0.025}},
		{"reorder=0.05", Spec{Reorder: 0.05}},
		{"corrupt=0.1%", Spec{Corrupt: 0.001}},
		{"delay=200us", Spec{Delay: 200 * time.Microsecond}},
		{"delay=200µs", Spec{Delay: 200 * time.Microsecond}},
		{"delay=1.5ms", Spec{Delay: 1500 * time.Microsecond}},
		{"delay=0", Spec{}},
		{"seed=7", Spec{Seed: 7}},
		{"seed=18446744073709551615", Spec{Seed: math.MaxUint64}},
		{
			"loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,seed=7",
			Spec{Loss: 0.01, Duplicate: 0.01, Reorder: 0.05, Corrupt: 0.001, Delay: 200 * time.Microsecond, Seed: 7},
		},
		{"seed=3,loss=50%", Spec{Loss: 0.5, Seed: 3}},
		{" loss = 1% , seed = 2 ", Spec{Loss: 0.01, Seed: 2}},
		{"loss=1 %", Spec{Loss: 0.01}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if err != nil {
				t.Fatalf("ParseSpec(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("ParseSpec(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
			back, err := ParseSpec(got.String())
			if err != nil || back != got {
				t.Fatalf("ParseSpec(%q) = %+v, %v; want %+v", got.String(), back, err, got)
			}
		})
	}
}

func TestParseSpecErrors(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string
	}{
		{"loss", `"loss" is not key=value`},
		{"loss=1%,,seed=2", "empty item"},
		{"loss=1%,", "empty item"},
		{",", "empty item"},
		{"jitter=1ms", `unknown key "jitter"`},
		{"Loss=1%", `unknown key "Loss"`},
		{"=1%", `unknown key ""`},
		{"loss=1%,loss=2%", "loss: given twice"},
		{"seed=1,seed=1", "seed: given twice"},
		{"loss=", `loss: "" is not a number`},
		{"loss=%", `loss: "%" is not a number`},
		{"loss=abc", `loss: "abc" is not a number`},
		{"loss=1%%", `loss: "1%%" is not a number`},
		{"loss=nan", "loss: nan is outside 0..1"},
		{"loss=NaN%", "loss: NaN% is outside 0%..100%"},
		{"loss=inf", "loss: inf is outside 0..1"},
		{"loss=1e400", `loss: "1e400" is not a number`},
		{"loss=101%", "loss: 101% is outside 0%..100%"},
		{"loss=-1%", "loss: -1% is outside 0%..100%"},
		{"loss=1.5", "loss: 1.5 is outside 0..1 (write 1.5% for a percentage)"},
		{"loss=150", "loss: 150 is outside 0..1"},
		{"duplicate=-0.1", "duplicate: -0.1 is outside 0..1"},
		{"reorder=200%", "reorder: 200% is outside 0%..100%"},
		{"corrupt=x%", `corrupt: "x%" is not a number`},
		{"delay=-1ms", "delay: -1ms is negative"},
		{"delay=5", "delay: time: missing unit"},
		{"delay=fast", `delay: time: invalid duration "fast"`},
		{"delay=1%", `delay: time: unknown unit "%"`},
		{"seed=-1", `seed: "-1" is not an unsigned decimal integer`},
		{"seed=0x10", `seed: "0x10" is not an unsigned decimal integer`},
		{"seed=18446744073709551616", `seed: "18446744073709551616" is not an unsigned`},
		{"seed=1%", `seed: "1%" is not an unsigned`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if err == nil {
				t.Fatalf("ParseSpec(%q) = %+v, want error containing %q", tt.in, got, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Errorf("error %v does not wrap ErrInvalidSpec", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSpec(%q) error %q, want it to contain %q", tt.in, err, tt.wantErr)
			}
			if got != (Spec{}) {
				t.Errorf("ParseSpec(%q) returned %+v with its error, want the zero Spec", tt.in, got)
			}
		})
	}
}

func TestSpecString(t *testing.T) {
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{}, ""},
		{Spec{Seed: 1}, "seed=1"},
		{Spec{Loss: 0.01}, "loss=1%"},
		{Spec{Loss: 1}, "loss=100%"},
		{Spec{Corrupt: 0.001}, "corrupt=0.1%"},
		{Spec{Duplicate: 0.025}, "duplicate=2.5%"},
		{Spec{Reorder: 1e-9}, "reorder=1e-09"},
		{Spec{Loss: 0.07}, "loss=7%"},
		{Spec{Loss: 0.29}, "loss=29%"},
		{Spec{Loss: 1.0 / 3}, "loss=0.3333333333333333"},
		{Spec{Loss: 0.123456}, "loss=12.3456%"},
		{Spec{Delay: 200 * time.Microsecond}, "delay=200us"},
		{Spec{Delay: 90 * time.Second}, "delay=1m30s"},
		{Spec{Delay: 1}, "delay=1ns"},
		{
			Spec{Loss: 0.01, Duplicate: 0.01, Reorder: 0.05, Corrupt: 0.001, Delay: 200 * time.Microsecond, Seed: 7},
			"loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,seed=7",
		},
		{Spec{Seed: 9, Loss: 0.5}, "loss=50%,seed=9"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.spec.String(); got != tt.want {
				t.Errorf("%+v.String() = %q, want %q", tt.spec, got, tt.want)
			}
			back, err := ParseSpec(tt.want)
			if err != nil || back != tt.spec {
				t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tt.want, back, err, tt.spec)
			}
		})
	}
}

// TestSpecStringExact checks that probabilities whose percentage does not
// round-trip exactly are written as fractions, so String stays exact.
func TestSpecStringExact(t *testing.T) {
	for _, p := range []float64{0.07, 0.29, 0.57, 1.0 / 3, math.SmallestNonzeroFloat64, math.Nextafter(1, 0), 0.1 + 0.2 - 0.3} {
		s := Spec{Loss: p, Duplicate: p, Reorder: p, Corrupt: p}
		back, err := ParseSpec(s.String())
		if err != nil || back != s {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", s.String(), back, err, s)
		}
	}
}

func TestSpecEnabled(t *testing.T) {
	tests := []struct {
		spec Spec
		want bool
	}{
		{Spec{}, false},
		{Spec{Seed: 7}, false},
		{Spec{Loss: 0.01}, true},
		{Spec{Duplicate: 0.01}, true},
		{Spec{Reorder: 0.01}, true},
		{Spec{Corrupt: 0.01}, true},
		{Spec{Delay: time.Nanosecond}, true},
	}
	for _, tt := range tests {
		if got := tt.spec.Enabled(); got != tt.want {
			t.Errorf("%+v.Enabled() = %v, want %v", tt.spec, got, tt.want)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	tests := []struct {
		spec    Spec
		wantErr []string // nil: valid
	}{
		{Spec{}, nil},
		{Spec{Loss: 1, Duplicate: 1, Reorder: 1, Corrupt: 1, Delay: time.Hour, Seed: math.MaxUint64}, nil},
		{Spec{Loss: 1.01}, []string{"loss: 1.01 is outside 0..1"}},
		{Spec{Duplicate: -0.5}, []string{"duplicate: -0.5 is outside 0..1"}},
		{Spec{Reorder: math.NaN()}, []string{"reorder: NaN is outside 0..1"}},
		{Spec{Corrupt: math.Inf(1)}, []string{"corrupt: +Inf is outside 0..1"}},
		{Spec{Delay: -time.Millisecond}, []string{"delay: -1ms is negative"}},
		{Spec{Loss: 2, Delay: -1}, []string{"loss: 2 is outside", "delay: -1ns is negative"}},
	}
	for _, tt := range tests {
		err := tt.spec.Validate()
		if tt.wantErr == nil {
			if err != nil {
				t.Errorf("%+v.Validate() = %v, want nil", tt.spec, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%+v.Validate() = %v, want an ErrInvalidSpec", tt.spec, err)
			continue
		}
		for _, w := range tt.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v.Validate() = %q, want it to contain %q", tt.spec, err, w)
			}
		}
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"", "loss=1%", "loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,seed=7",
		"loss=0.01", "delay=1h2m3.5s", "seed=18446744073709551615", "loss=1e-300",
		"corrupt=0x1p-4", "loss=1%,loss=2%", "x=y", ",,", "delay=-1ns", "loss= 5 % ",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseSpec(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("ParseSpec(%q) error %v does not wrap ErrInvalidSpec", s, err)
			}
			return
		}
		if err := spec.Validate(); err != nil {
			t.Fatalf("ParseSpec(%q) = %+v, which does not validate: %v", s, spec, err)
		}
		canon := spec.String()
		back, err := ParseSpec(canon)
		if err != nil {
			t.Fatalf("ParseSpec(%q) (String of ParseSpec(%q)): %v", canon, s, err)
		}
		if back != spec {
			t.Fatalf("ParseSpec(%q) = %+v, want %+v (from %q)", canon, back, spec, s)
		}
		if again := back.String(); again != canon {
			t.Fatalf("String not canonical: %q then %q", canon, again)
		}
	})
}
