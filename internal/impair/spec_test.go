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

		{"rate=1gbit", Spec{Rate: 1e9}},
		{"rate=1Gbit", Spec{Rate: 1e9}},
		{"rate=1GBIT", Spec{Rate: 1e9}},
		{"rate=200mbit", Spec{Rate: 200e6}},
		{"rate=500kbit", Spec{Rate: 500e3}},
		{"rate=1000000bit", Spec{Rate: 1e6}},
		{"rate=1000000", Spec{Rate: 1e6}},
		{"rate=2tbit", Spec{Rate: 2e12}},
		{"rate=1.5gbit", Spec{Rate: 1.5e9}},
		{"rate=2.500kbit", Spec{Rate: 2500}},
		{"rate=1.0bit", Spec{Rate: 1}},
		{"rate=0", Spec{}},
		{"rate=0gbit", Spec{}},
		{"rate=18446744073709551615", Spec{Rate: math.MaxUint64}},
		{"rate=18446744073.709551615gbit", Spec{Rate: math.MaxUint64}},
		{"rate=1mbit,queue=65536", Spec{Rate: 1e6, Queue: 64 << 10}},
		{"rate=1mbit,queue=64KiB", Spec{Rate: 1e6, Queue: 64 << 10}},
		{"rate=1mbit,queue=64kib", Spec{Rate: 1e6, Queue: 64 << 10}},
		{"rate=1mbit,queue=1.5KiB", Spec{Rate: 1e6, Queue: 1536}},
		{"rate=1mbit,queue=0.5MiB", Spec{Rate: 1e6, Queue: 512 << 10}},
		{"rate=1mbit,queue=1GiB", Spec{Rate: 1e6, Queue: MaxQueue}},
		{"rate=1mbit,queue=0", Spec{Rate: 1e6}},
		{"queue=0", Spec{}},
		{"rate=1gbit,queue=256KiB,ecn=32KiB", Spec{Rate: 1e9, Queue: 256 << 10, ECN: 32 << 10}},
		{"ecn=32KiB,queue=256KiB,rate=1gbit", Spec{Rate: 1e9, Queue: 256 << 10, ECN: 32 << 10}},
		{"rate=1gbit,ecn=122KiB", Spec{Rate: 1e9, ECN: 122 << 10}}, // below the default 125000
		{"rate=1mbit,ecn=65535", Spec{Rate: 1e6, ECN: 65535}},      // below the default 64KiB
		{
			"loss=1%,delay=200us,rate=10gbit,queue=1MiB,ecn=100KiB,seed=7",
			Spec{Loss: 0.01, Delay: 200 * time.Microsecond, Rate: 10e9, Queue: 1 << 20, ECN: 100 << 10, Seed: 7},
		},
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

		{"rate=", `rate: "" is not a rate (a number of bits/s`},
		{"rate=fast", `rate: "fast" is not a rate (a number of bits/s`},
		{"rate=gbit", `rate: "gbit" is not a rate`},
		{"rate=1kb", `rate: "1kb" is not a rate`},
		{"rate=1k", `rate: "1k" is not a rate`},
		{"rate=1kibit", `rate: "1kibit" is not a rate`},
		{"rate=1 gbit", `rate: "1 gbit" is not a rate`},
		{"rate=-1gbit", `rate: "-1gbit" is not a rate`},
		{"rate=+1gbit", `rate: "+1gbit" is not a rate`},
		{"rate=1e9", `rate: "1e9" is not a rate`},
		{"rate=.5gbit", `rate: ".5gbit" is not a rate`},
		{"rate=1.gbit", `rate: "1.gbit" is not a rate`},
		{"rate=1.2.3gbit", `rate: "1.2.3gbit" is not a rate`},
		{"rate=1gbps", "(tc's bps is bytes per second: write bit units)"},
		{"rate=100Mbps", "(tc's bps is bytes per second: write bit units)"},
		{"rate=18446744073709551616", "rate: 18446744073709551616 is too large"},
		{"rate=18446744073709552gbit", "rate: 18446744073709552gbit is too large"},
		{"rate=99999999999999999999999tbit", "rate: 99999999999999999999999tbit is too large"},
		{"rate=18446744073.709551616gbit", "rate: 18446744073.709551616gbit is too large"},
		{"rate=1.5bit", "rate: 1.5bit is not a whole number of bits/s"},
		{"rate=1.0000000001kbit", "rate: 1.0000000001kbit is not a whole number of bits/s"},
		{"rate=1.00000000000000000001tbit", "rate: 1.00000000000000000001tbit is not a whole number of bits/s"},
		{"rate=1gbit,rate=2gbit", "rate: given twice"},
		{"queue=64KiB", "queue: needs a rate"},
		{"rate=1gbit,queue=64kb", `queue: "64kb" is not a size in bytes`},
		{"rate=1gbit,queue=64K", `queue: "64K" is not a size in bytes`},
		{"rate=1gbit,queue=64KB", `queue: "64KB" is not a size in bytes`},
		{"rate=1gbit,queue=1.5", "queue: 1.5 is not a whole number of bytes"},
		{"rate=1gbit,queue=2GiB", "queue: 2GiB exceeds 1GiB"},
		{"rate=1gbit,queue=1073741825", "queue: 1073741825 exceeds 1GiB"},
		{"rate=1gbit,queue=17179869184GiB", "queue: 17179869184GiB is too large"},
		{"ecn=1KiB", "ecn: needs a rate"},
		{"queue=64KiB,ecn=1KiB", "queue: needs a rate"},
		{"rate=1gbit,ecn=1kb", `ecn: "1kb" is not a size in bytes`},
		{"rate=1gbit,queue=64KiB,ecn=64KiB", "ecn: 64KiB is not below the queue's limit of 64KiB, so no frame would be marked"},
		{"rate=1gbit,ecn=123KiB", "ecn: 123KiB is not below the queue's limit of 125000"},
		{"rate=1mbit,ecn=1MiB", "ecn: 1MiB is not below the queue's limit of 64KiB"},
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
		{Spec{Rate: 1e9}, "rate=1gbit"},
		{Spec{Rate: 1e12}, "rate=1tbit"},
		{Spec{Rate: 1.5e9}, "rate=1500mbit"},
		{Spec{Rate: 200e6}, "rate=200mbit"},
		{Spec{Rate: 1500}, "rate=1500bit"},
		{Spec{Rate: 1}, "rate=1bit"},
		{Spec{Rate: math.MaxUint64}, "rate=18446744073709551615bit"},
		{Spec{Rate: 1e6, Queue: 1500}, "rate=1mbit,queue=1500"},
		{Spec{Rate: 1e6, Queue: 1536}, "rate=1mbit,queue=1536"},
		{Spec{Rate: 1e6, Queue: 1 << 20}, "rate=1mbit,queue=1MiB"},
		{Spec{Rate: 1e6, Queue: 3 << 19}, "rate=1mbit,queue=1536KiB"},
		{Spec{Rate: 1e6, Queue: 1 << 30}, "rate=1mbit,queue=1GiB"},
		{Spec{Rate: 1e9, Queue: 256 << 10, ECN: 32 << 10}, "rate=1gbit,queue=256KiB,ecn=32KiB"},
		{
			Spec{Loss: 0.01, Duplicate: 0.01, Reorder: 0.05, Corrupt: 0.001, Delay: 200 * time.Microsecond, Rate: 25e9, Queue: 4 << 20, ECN: 1000, Seed: 7},
			"loss=1%,duplicate=1%,reorder=5%,corrupt=0.1%,delay=200us,rate=25gbit,queue=4MiB,ecn=1000,seed=7",
		},
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
		{Spec{Rate: 1}, true},
	}
	for _, tt := range tests {
		if got := tt.spec.Enabled(); got != tt.want {
			t.Errorf("%+v.Enabled() = %v, want %v", tt.spec, got, tt.want)
		}
	}
}

func TestSpecHolds(t *testing.T) {
	tests := []struct {
		spec Spec
		want bool
	}{
		{Spec{}, false},
		{Spec{Loss: 0.5, Duplicate: 0.5, Corrupt: 0.5, Seed: 3}, false},
		{Spec{Reorder: 0.01}, true},
		{Spec{Delay: time.Nanosecond}, true},
		{Spec{Rate: 1e9}, true},
		{Spec{Rate: 1e9, Queue: 1 << 20, ECN: 1 << 10}, true},
	}
	for _, tt := range tests {
		if got := tt.spec.Holds(); got != tt.want {
			t.Errorf("%+v.Holds() = %v, want %v", tt.spec, got, tt.want)
		}
	}
}

func TestSpecQueueLimit(t *testing.T) {
	tests := []struct {
		spec Spec
		want uint64
	}{
		{Spec{}, 0},
		{Spec{Queue: 1 << 20}, 0}, // no link
		{Spec{Rate: 1}, DefaultQueue},
		{Spec{Rate: 1e6}, DefaultQueue},
		{Spec{Rate: 524_288_000}, DefaultQueue}, // 65536 bytes a millisecond
		{Spec{Rate: 524_296_000}, DefaultQueue + 1},
		{Spec{Rate: 1e9}, 125_000},
		{Spec{Rate: 100e9}, 12_500_000},
		{Spec{Rate: math.MaxUint64}, MaxQueue},
		{Spec{Rate: 1e9, Queue: 1000}, 1000},
		{Spec{Rate: 1e9, Queue: MaxQueue + 1}, MaxQueue},
	}
	for _, tt := range tests {
		if got := tt.spec.QueueLimit(); got != tt.want {
			t.Errorf("%+v.QueueLimit() = %d, want %d", tt.spec, got, tt.want)
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
		{Spec{Rate: math.MaxUint64, Queue: MaxQueue, ECN: MaxQueue - 1}, nil},
		{Spec{Rate: 1e9, ECN: 124_999}, nil},
		{Spec{Queue: 1}, []string{"queue: needs a rate"}},
		{Spec{ECN: 1}, []string{"ecn: needs a rate"}},
		{Spec{Queue: 1, ECN: 1}, []string{"queue: needs a rate", "ecn: needs a rate"}},
		{Spec{Rate: 1e9, Queue: MaxQueue + 1}, []string{"queue: 1073741825 exceeds 1GiB"}},
		{Spec{Rate: 1e9, ECN: 125_000}, []string{"ecn: 125000 is not below the queue's limit of 125000"}},
		{Spec{Rate: 1e9, Queue: 1000, ECN: 5000}, []string{"ecn: 5000 is not below the queue's limit of 1000"}},
		{Spec{Loss: -1, Queue: 1}, []string{"loss: -1 is outside", "queue: needs a rate"}},
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
		"rate=1gbit,queue=256KiB,ecn=32KiB", "rate=1.5gbit", "rate=1Gbps", "queue=64KiB",
		"rate=18446744073709551615bit", "rate=1mbit,queue=0.5MiB,ecn=1.25KiB", "rate=3bit,ecn=65535",
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
