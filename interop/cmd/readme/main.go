// Command readme writes the interop table of README.md from the results
// the interop suite recorded (interop/testdata/perf-results.json, written
// by `TAPROCE_INTEROP_PERF_RESULTS=FILE go test ./interop/`), between the
// README's interop markers. Run it from the module root.
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
	if err := run("interop/testdata/perf-results.json", "README.md"); err != nil {
		fmt.Fprintln(os.Stderr, "readme:", err)
		os.Exit(1)
	}
}

func run(results, readme string) error {
	r, err := interop.ReadPerfResults(results)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	s := string(b)
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
	table := fmt.Sprintf("%s\nRecorded %s against %s: %d of %d runs passed.\n\n%s\n",
		begin, r.Generated, r.Peer, pass, len(r.Results), strings.TrimSpace(interop.PerfTable(r)))
	s = s[:i] + table + s[j:]
	return os.WriteFile(readme, []byte(s), 0o644)
}
