package interop

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PerfResultsEnv names the environment variable that, when set, makes the
// perftest interop tests write their outcome as JSON (PerfResults) to the
// file it names, e.g. interop/testdata/perf-results.json, from which
// PerfTable makes the table of docs/interop.md.
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
	// Between two rxe VMs (Between "rxe-rxe"), Theirs is the client's
	// figure and Ours the server's.
	Ours   float64 `json:"ours"`
	Theirs float64 `json:"theirs"`
	Unit   string  `json:"unit,omitempty"`
	// Untimed says perftest could not time the run (its clock measurement
	// failed): Theirs is missing, and so is Ours for a taproce server that
	// prints its perftest client's figures.
	Untimed bool `json:"untimed,omitempty"`
	// Loss, when not 0, is the share of its RoCE frames each side lost on
	// the way out during the run (netem in the VM, the port's impairment
	// on taproce's side), e.g. 0.01; Recovery then says what was lost and
	// how it was recovered.
	Loss     float64   `json:"loss,omitempty"`
	Recovery *Recovery `json:"recovery,omitempty"`
	// Between is empty for a run of taproce against rxe, and "rxe-rxe"
	// for the same tool run between two rxe VMs (Taproce empty): the
	// reference figures of the same machine.
	Between string `json:"between,omitempty"`
}

// BetweenRxe is PerfResult.Between for a run between two rxe VMs.
const BetweenRxe = "rxe-rxe"

// Recovery counts, for a run under loss, the frames lost and what both
// sides did about them.
type Recovery struct {
	// TaproceLost is the frames the port's egress impairment dropped;
	// RxeLost the RoCE packets rxe sent that taproce did not receive
	// (netem in the VM dropped them).
	TaproceLost uint64 `json:"taproce_lost"`
	RxeLost     uint64 `json:"rxe_lost"`
	// SeqNAKsSent and SeqNAKsReceived are the PSN sequence error NAKs
	// taproce sent and received (seen on its port).
	SeqNAKsSent     uint64 `json:"seq_naks_sent"`
	SeqNAKsReceived uint64 `json:"seq_naks_received"`
	// TaproceTimeouts are the ACK timeouts after which taproce sent
	// again, TaproceRetransmits the packets it sent again. RxeRetries are
	// the retries rxe began, after a NAK or an ACK timeout alike (its
	// completer_retry_err).
	TaproceTimeouts    uint64 `json:"taproce_timeouts"`
	TaproceRetransmits uint64 `json:"taproce_retransmits"`
	RxeRetries         uint64 `json:"rxe_retries"`
}

// add adds o to r.
func (r *Recovery) add(o *Recovery) {
	if o == nil {
		return
	}
	r.TaproceLost += o.TaproceLost
	r.RxeLost += o.RxeLost
	r.SeqNAKsSent += o.SeqNAKsSent
	r.SeqNAKsReceived += o.SeqNAKsReceived
	r.TaproceTimeouts += o.TaproceTimeouts
	r.RxeRetries += o.RxeRetries
	r.TaproceRetransmits += o.TaproceRetransmits
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

// toolName is a result's row label: the tool, its -A and its further
// options.
func toolName(x PerfResult) string {
	tool := x.Tool
	if x.Atomic != "" {
		tool += " -A " + x.Atomic
	}
	if x.Args != "" {
		tool += " " + x.Args
	}
	return tool
}

// sizeCell lists the sizes of rs that passed (✅) and those that failed
// (❌), or "–" for none.
func sizeCell(rs []PerfResult) string {
	var ok, bad []string
	for _, x := range rs {
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
		return "–"
	}
	return strings.Join(parts, "; ")
}

// roles are the columns of a taproce role, in table order.
var roles = []struct{ role, title string }{{"client", "taproce → rxe server"}, {"server", "rxe client → taproce"}}

// PerfTable renders the results of taproce against rxe without loss as a
// Markdown table: one row per tool (and atomic type), one column per path
// MTU and role of taproce, each cell the sizes that passed (✅) and those
// that failed (❌).
func PerfTable(r *PerfResults) string {
	type key struct {
		tool, role string
		mtu        int
	}
	cells := map[key][]PerfResult{}
	var tools []string
	var mtus []int
	for _, x := range r.Results {
		if x.Loss != 0 || x.Between != "" {
			continue
		}
		tool := toolName(x)
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
				fmt.Fprintf(&b, " %s |", sizeCell(cells[key{tool, ro.role, m}]))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// percent writes a share as a percentage: 0.01 is "1 %".
func percent(f float64) string {
	return strconv.FormatFloat(f*100, 'g', 4, 64) + " %"
}

// LossTable renders the runs under loss as a Markdown table, empty when
// there are none: one row per tool, a column per role of taproce with the
// sizes that passed and failed, and the frames lost and the recoveries of
// all the row's runs (Recovery summed). The path MTU and the loss go into
// the header when all runs share them, else into the rows.
func LossTable(r *PerfResults) string {
	type key struct {
		tool string
		mtu  int
		loss float64
	}
	type row struct {
		key
		runs map[string][]PerfResult
		sum  Recovery
	}
	var rows []*row
	byKey := map[key]*row{}
	for _, x := range r.Results {
		if x.Loss == 0 || x.Between != "" {
			continue
		}
		k := key{toolName(x), x.MTU, x.Loss}
		w := byKey[k]
		if w == nil {
			w = &row{key: k, runs: map[string][]PerfResult{}}
			byKey[k] = w
			rows = append(rows, w)
		}
		w.runs[x.Taproce] = append(w.runs[x.Taproce], x)
		w.sum.add(x.Recovery)
	}
	if len(rows) == 0 {
		return ""
	}
	uniform := true
	for _, w := range rows {
		uniform = uniform && w.mtu == rows[0].mtu && w.loss == rows[0].loss
	}
	var b strings.Builder
	b.WriteString("| tool")
	if uniform {
		fmt.Fprintf(&b, ", MTU %d, %s loss each way", rows[0].mtu, percent(rows[0].loss))
	}
	b.WriteString(" |")
	for _, ro := range roles {
		fmt.Fprintf(&b, " %s |", ro.title)
	}
	b.WriteString(" frames lost: taproce's / rxe's | PSN sequence NAKs: taproce's / rxe's | taproce's ACK timeouts | rxe's retries (after a NAK or an ACK timeout) |\n|---|")
	for range roles {
		b.WriteString("---|")
	}
	b.WriteString("---|---|---|---|\n")
	for _, w := range rows {
		fmt.Fprintf(&b, "| `%s`", w.tool)
		if !uniform {
			fmt.Fprintf(&b, ", MTU %d, %s loss", w.mtu, percent(w.loss))
		}
		b.WriteString(" |")
		for _, ro := range roles {
			fmt.Fprintf(&b, " %s |", sizeCell(w.runs[ro.role]))
		}
		s := w.sum
		fmt.Fprintf(&b, " %d / %d | %d / %d | %d | %d |\n", s.TaproceLost, s.RxeLost,
			s.SeqNAKsSent, s.SeqNAKsReceived, s.TaproceTimeouts, s.RxeRetries)
	}
	return b.String()
}

// figure writes a result's figure: the client's bandwidth in MB/s or
// typical latency in µs; ❌ for a run that failed.
func figure(x PerfResult, v float64) string {
	switch {
	case !x.Pass:
		return "❌"
	case x.Untimed && v == 0:
		return "untimed"
	case x.Unit == "MB/sec":
		return fmt.Sprintf("%.1f MB/s", v)
	case x.Unit == "usec":
		return fmt.Sprintf("%.0f µs", v)
	}
	return "–"
}

// PairTable renders the runs between two rxe VMs next to the same runs
// (tool, size, path MTU, iterations) of taproce against rxe, both ways,
// as a Markdown table of the clients' figures; empty when there are no
// runs between rxe VMs.
func PairTable(r *PerfResults) string {
	var b strings.Builder
	for _, x := range r.Results {
		if x.Between != BetweenRxe {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("| run (client's figure: average bandwidth, typical latency) |")
			for _, ro := range roles {
				fmt.Fprintf(&b, " %s |", ro.title)
			}
			b.WriteString(" rxe → rxe server |\n|---|---|---|---|\n")
		}
		fmt.Fprintf(&b, "| `%s` %s, MTU %d, %d iterations |", toolName(x), sizeName(x.Size), x.MTU, x.Iters)
		for _, ro := range roles {
			cell := "–"
			for _, y := range r.Results {
				if y.Between == "" && y.Loss == 0 && y.Taproce == ro.role && toolName(y) == toolName(x) &&
					y.Size == x.Size && y.MTU == x.MTU && y.Iters == x.Iters {
					v := y.Ours // taproce is the client
					if ro.role == "server" {
						v = y.Theirs
					}
					cell = figure(y, v)
				}
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		fmt.Fprintf(&b, " %s |\n", figure(x, x.Theirs))
	}
	return b.String()
}
