package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// ErrNoNft is returned when the nft tool is missing (scripts/setup
// installs it).
var ErrNoNft = errors.New("lab: nft (nftables) is not installed")

// errRedirectLoss says why a lab in redirect mode has no kernel loss:
// nftables sees no RoCE in its namespaces.
var errRedirectLoss = errors.New("in redirect mode the tc filters move RoCE between the uplink and the TAP before " +
	"nftables' netdev ingress hook, and the kernel skips the egress hooks for what tc redirects: no nftables rule sees it")

// kernelLoss makes the kernel of every host drop pct percent of the RoCE
// packets arriving on its uplink: an nftables rule in a netdev ingress
// chain, `udp dport 4791 numgen random mod 100 < pct drop` — loss made by
// the kernel rather than by the ports' own impairment. A lab in redirect
// mode has none (errRedirectLoss).
func (l *Lab) kernelLoss(pct int) error {
	if l.Redirect {
		return errRedirectLoss
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return ErrNoNft
	}
	for _, h := range l.Hosts {
		rules := fmt.Sprintf(`table netdev taproce_lab {
	chain ingress {
		type filter hook ingress device %q priority 0; policy accept;
		udp dport 4791 numgen random mod 100 < %d counter drop
	}
}
`, h.Uplink, pct)
		cmd := exec.Command("ip", "netns", "exec", h.Namespace, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: nft in %s: %v: %s", h.Namespace, err, bytes.TrimSpace(out))
		}
	}
	return nil
}

var counterRE = regexp.MustCompile(`counter packets (\d+)`)

// kernelDropped returns the packets the kernel loss rules dropped.
func (l *Lab) kernelDropped() (int, error) {
	total := 0
	for _, h := range l.Hosts {
		out, err := exec.Command("ip", "netns", "exec", h.Namespace, "nft", "list", "table", "netdev", "taproce_lab").CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("lab: nft list in %s: %v: %s", h.Namespace, err, bytes.TrimSpace(out))
		}
		for _, m := range counterRE.FindAllSubmatch(out, -1) {
			n, _ := strconv.Atoi(string(m[1]))
			total += n
		}
	}
	return total, nil
}
