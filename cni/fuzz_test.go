package cni

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzConf feeds the plugin what a container runtime hands it on stdin:
// a network configuration and its prevResult, in any CNI version. Bad
// input must give a CNI error, never a panic, and the addresses taken
// from a prevResult must be valid prefixes of plain IPv4 or IPv6
// addresses — what the appliance is asked to make GIDs of.
func FuzzConf(f *testing.F) {
	for _, prev := range []string{prev100, prev020, "", `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/x"}]}`,
		`{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/8"}]}`,
		`{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/0"}]}`,
		`{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"::ffff:10.0.0.2/120","interface":0}]}`} {
		f.Add(conf("1.1.0", "/run/taproce/admin.sock", prev), "eth0")
	}
	f.Add([]byte(`{"cniVersion":`), "eth0")
	f.Fuzz(func(t *testing.T, stdin []byte, ifName string) {
		isCNI := func(what string, err error) {
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("%s: %v (%T) is not a CNI error", what, err, err)
			}
		}
		c, err := parseConf(stdin)
		if err != nil {
			isCNI("parseConf", err)
			return
		}
		if c.AdminSocket == "" || c.PortName == "" {
			t.Fatalf("parseConf left defaults unset: %+v", c)
		}
		res, err := prevResult(c, "ADD")
		if err != nil {
			isCNI("prevResult", err)
			return
		}
		ips, err := podIPs(res, ifName)
		if err != nil {
			isCNI("podIPs", err)
			return
		}
		for _, p := range ips {
			if !p.IsValid() || p.Addr().Is4In6() {
				t.Fatalf("podIPs gave %v (from %s)", p, stdin)
			}
		}
	})
}

// TestPodIPs pins how prevResult addresses become the port's addresses:
// IPv4 in either of Go's forms, IPv6, IPv4-mapped IPv6 as the IPv4 address
// it maps, and a CNI error naming an address that cannot be one. An
// IPv4-mapped address with a prefix shorter than /96 once came out as an
// invalid prefix, which the appliance then refused without saying why
// (testdata/fuzz/FuzzConf keeps that input for FuzzConf).
func TestPodIPs(t *testing.T) {
	const ifs = `"interfaces":[{"name":"eth0","sandbox":"/x"}]`
	for _, tt := range []struct {
		name, ips string
		want      []string
		wantErr   string
	}{
		{"ipv4", `[{"address":"10.1.0.5/24","interface":0}]`, []string{"10.1.0.5/24"}, ""},
		{"ipv6", `[{"address":"fd00:1::5/64","interface":0}]`, []string{"fd00:1::5/64"}, ""},
		{"mapped", `[{"address":"::ffff:10.1.0.5/120","interface":0}]`, []string{"10.1.0.5/24"}, ""},
		{"mapped /96", `[{"address":"::ffff:10.1.0.5/96","interface":0}]`, []string{"10.1.0.5/0"}, ""},
		{"mapped, short prefix", `[{"address":"::ffff:10.1.0.5/64","interface":0}]`, nil, "/96 or longer, not /64"},
		{"other interface", `[{"address":"10.1.0.5/24","interface":1}]`, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConf(conf("1.1.0", "/s", `{"cniVersion":"1.1.0",`+ifs+`,"ips":`+tt.ips+`}`))
			if err != nil {
				t.Fatal(err)
			}
			res, err := prevResult(c, "ADD")
			if err != nil {
				t.Fatal(err)
			}
			ips, err := podIPs(res, "eth0")
			if tt.wantErr != "" {
				if cniCode(t, err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want an invalid-config error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range ips {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("podIPs = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestIPPrefixMasks covers the address and mask shapes a decoded result
// can hold, which JSON alone does not produce.
func TestIPPrefixMasks(t *testing.T) {
	v4in16 := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 0, 5}
	for _, tt := range []struct {
		name string
		ip   []byte
		mask []byte
		want string // "" for an error
	}{
		{"4-byte IPv4, 4-byte mask", []byte{10, 1, 0, 5}, []byte{255, 255, 255, 0}, "10.1.0.5/24"},
		{"16-byte IPv4, 4-byte mask", v4in16, []byte{255, 255, 0, 0}, "10.1.0.5/16"},
		{"4-byte IPv4, 16-byte mask", []byte{10, 1, 0, 5}, slices.Repeat([]byte{255}, 16), ""},
		{"no IP", nil, []byte{255, 255, 255, 0}, ""},
		{"holes in the mask", []byte{10, 1, 0, 5}, []byte{255, 0, 255, 0}, ""},
		{"IPv6, 4-byte mask", netip.MustParseAddr("fd00::5").AsSlice(), []byte{255, 255, 255, 0}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ipPrefix(ipNet(tt.ip, tt.mask))
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ipPrefix = %v, want an error", p)
				}
				return
			}
			if err != nil || p.String() != tt.want {
				t.Fatalf("ipPrefix = %v, %v; want %s", p, err, tt.want)
			}
		})
	}
}

func ipNet(ip, mask []byte) net.IPNet { return net.IPNet{IP: ip, Mask: mask} }

// TestAddrText: errors name an address as the configuration wrote it.
func TestAddrText(t *testing.T) {
	v4in16 := net.ParseIP("10.1.0.5")
	for _, tt := range []struct {
		n    net.IPNet
		want string
	}{
		{ipNet(v4in16, net.CIDRMask(24, 32)), "10.1.0.5/24"},
		{ipNet(v4in16, net.CIDRMask(64, 128)), "::ffff:10.1.0.5/64"},
		{ipNet(net.ParseIP("fd00::5"), net.CIDRMask(64, 128)), "fd00::5/64"},
		{ipNet([]byte{10, 1, 0, 5}, []byte{255, 0, 255, 0}), "10.1.0.5 mask ff00ff00"},
		{ipNet(nil, nil), "<nil>"},
	} {
		if got := addrText(tt.n); got != tt.want {
			t.Errorf("addrText(%#v) = %q, want %q", tt.n, got, tt.want)
		}
	}
}
