// Command readme writes the interop tables of docs/interop.md from the results
// the interop suite recorded (interop/testdata/perf-results.json, written
// by `TAPROCE_INTEROP_PERF_RESULTS=FILE go test ./interop/`), between the
// page's interop markers: the perftest matrix (interop.PerfTable), the
// runs under loss (interop.LossTable) and the runs between two rxe VMs
// next to taproce's (interop.PairTable). Run it from the module root.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/taproce/taproce/interop"
)

const (
	begin = "<!-- interop:begin -->"
	end   = "<!-- interop:end -->"
)

func main() {
	if err := run("interop/testdata/perf-results.json", "docs/interop.md"); err != nil {
		fmt.Fprintln(os.Stderr, "readme:", err)
		os.Exit(1)
	}
}

func run(results, readme string) error {
	r, err := interop.ReadPerfResults(results)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	s := string(text)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", readme, begin, end)
	}
	pass := 0
	for _, x := range r.Results {
		if x.Pass {
			pass++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\nRecorded %s against %s: %d of %d runs passed.\n\n%s\n",
		begin, r.Generated, r.Peer, pass, len(r.Results), strings.TrimSpace(interop.PerfTable(r)))
	if t := interop.LossTable(r); t != "" {
		b.WriteString("\nUnder loss: each side drops a share of the frames it sends (netem in the VM, sparing rxe's\n" +
			"ACKs in the ping-pong runs, see interop/README.md; the port's impairment on taproce's side),\n" +
			"and every run must still end well. The last columns add up the row's runs: frames each side\n" +
			"lost, PSN sequence error NAKs each side sent, the ACK timeouts after which taproce sent again,\n" +
			"and the retries rxe began (its completer_retry_err, which counts a retry after a NAK and after\n" +
			"an ACK timeout alike).\n\n")
		b.WriteString(t)
	}
	if t := interop.PairTable(r); t != "" {
		b.WriteString("\ntaproce ↔ rxe next to rxe ↔ rxe (same run, VMs under TCG software emulation; rxe ↔ rxe runs\n" +
			"two VMs of one emulated vCPU each at once, taproce ↔ rxe one VM and taproce on the host):\n\n")
		b.WriteString(t)
	}
	s = s[:i] + b.String() + s[j:]
	return os.WriteFile(readme, []byte(s), 0o644)
}
