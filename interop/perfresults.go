package interop

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// PerfResultsEnv names the environment variable that, when set, makes the
// perftest interop tests write their outcome as JSON (PerfResults) to the
// file it names, e.g. interop/testdata/perf-results.json, from which
// PerfTable makes the README's table.
const PerfResultsEnv = "TAPROCE_INTEROP_PERF_RESULTS"

// PerfResult is the outcome of one perftest run against `taproce perf`.
type PerfResult struct {
	// Tool is the perftest program in the VM, e.g. "ib_write_bw"; Atomic
	// its -A for the atomic tests.
	Tool   string `json:"tool"`
	Atomic string `json:"atomic,omitempty"`
	// Args are further options both sides ran with (-a, -q N); with -a,
	// Size is 0.
	Args string `json:"args,omitempty"`
	// Taproce is the role of `taproce perf`: "client" (the tool is the
	// server in the VM) or "server".
	Taproce string `json:"taproce"`
	// MTU is the path MTU both sides asked for (and reported); Size the
	// message size; Iters the iterations.
	MTU   int  `json:"mtu"`
	Size  int  `json:"size"`
	Iters int  `json:"iters"`
	Pass  bool `json:"pass"`
	// Problems says what failed.
	Problems []string `json:"problems,omitempty"`
	// Ours and Theirs are the result lines of both sides: bandwidth in
	// MB/sec (2^20 bytes) or the typical latency in µs.
	Ours   float64 `json:"ours"`
	Theirs float64 `json:"theirs"`
	Unit   string  `json:"unit,omitempty"`
}

// PerfResults is what the tests write to $TAPROCE_INTEROP_PERF_RESULTS.
type PerfResults struct {
	Generated time.Time    `json:"generated"`
	Peer      string       `json:"peer"`
	Results   []PerfResult `json:"results"`
}

// WriteFile writes the results as indented JSON.
func (r *PerfResults) WriteFile(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("interop: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("interop: %w", err)
	}
	return nil
}

// ReadPerfResults reads a file WriteFile wrote.
func ReadPerfResults(path string) (*PerfResults, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	var r PerfResults
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("interop: %s: %w", path, err)
	}
	return &r, nil
}

// sizeName writes a message size as 2 B, 4 KiB, 1 MiB; 0 stands for all
// of -a.
func sizeName(n int) string {
	switch {
	case n == 0:
		return "2 B–8 MiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// PerfTable renders results as a Markdown table: one row per tool (and
// atomic type), one column per path MTU and role of taproce, each cell
// the sizes that passed (✅) and those that failed (❌).
func PerfTable(r *PerfResults) string {
	type key struct {
		tool, role string
		mtu        int
	}
	cells := map[key][]PerfResult{}
	var tools []string
	var mtus []int
	for _, x := range r.Results {
		tool := x.Tool
		if x.Atomic != "" {
			tool += " -A " + x.Atomic
		}
		if x.Args != "" {
			tool += " " + x.Args
		}
		if !slices.Contains(tools, tool) {
			tools = append(tools, tool)
		}
		if !slices.Contains(mtus, x.MTU) {
			mtus = append(mtus, x.MTU)
		}
		k := key{tool, x.Taproce, x.MTU}
		cells[k] = append(cells[k], x)
	}
	slices.Sort(mtus)
	roles := []struct{ role, title string }{{"client", "taproce → rxe server"}, {"server", "rxe client → taproce"}}
	var b strings.Builder
	b.WriteString("| perftest tool |")
	for _, m := range mtus {
		for _, ro := range roles {
			fmt.Fprintf(&b, " %s, MTU %d |", ro.title, m)
		}
	}
	b.WriteString("\n|---|")
	for range mtus {
		for range roles {
			b.WriteString("---|")
		}
	}
	b.WriteString("\n")
	for _, tool := range tools {
		fmt.Fprintf(&b, "| `%s` |", tool)
		for _, m := range mtus {
			for _, ro := range roles {
				var ok, bad []string
				for _, x := range cells[key{tool, ro.role, m}] {
					if x.Pass {
						ok = append(ok, sizeName(x.Size))
					} else {
						bad = append(bad, sizeName(x.Size))
					}
				}
				var parts []string
				if len(ok) > 0 {
					parts = append(parts, "✅ "+strings.Join(ok, ", "))
				}
				if len(bad) > 0 {
					parts = append(parts, "❌ "+strings.Join(bad, ", "))
				}
				if len(parts) == 0 {
					parts = []string{"–"}
				}
				fmt.Fprintf(&b, " %s |", strings.Join(parts, "; "))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
