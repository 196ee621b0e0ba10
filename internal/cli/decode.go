package cli

import (
	"flag"
	"fmt"
	"io"

	"github.com/taproce/taproce/internal/decode"
)

// runDecode implements `taproce decode [--json] FILE...`. Exit status: 0
// when every RoCE frame parses and carries a good ICRC, 1 when one does
// not, 2 for usage errors and unreadable files. Each unreadable file gets
// an error line; the summary counts the files that were captures, and is
// left out when none was.
func runDecode(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.Bool("json", false, "print one JSON object per frame")
	quiet := fs.Bool("q", false, "print only the summary")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: taproce decode [--json] [-q] FILE...")
		fmt.Fprintln(stderr, "\nPrints one line per frame of each pcap or pcapng file: frame number,")
		fmt.Fprintln(stderr, "addresses, UDP ports, opcode, destination QP, PSN, flags, extension")
		fmt.Fprintln(stderr, "header fields, payload length and icrc=ok or icrc=BAD(want X got Y).")
		fmt.Fprintln(stderr, "Frames that are not RoCEv2 are listed as skipped. Exit status 1 when")
		fmt.Fprintln(stderr, "a RoCE frame does not parse or has a bad ICRC, 2 when a file cannot be")
		fmt.Fprintln(stderr, "read as a capture.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	out := stdout
	if *quiet {
		out = io.Discard
	}
	opt := decode.Options{JSON: *jsonOut, WithFile: fs.NArg() > 1}
	var total decode.Stats
	status := 0
	for _, path := range fs.Args() {
		st, err := decode.File(out, path, opt)
		total.Add(st)
		if err != nil {
			fmt.Fprintf(stderr, "taproce decode: %v\n", err)
			status = 2
		}
	}
	if total.Files > 0 {
		in := ""
		if total.Files < fs.NArg() {
			in = fmt.Sprintf(" in %d of %d files", total.Files, fs.NArg())
		}
		fmt.Fprintf(stderr, "%d frames%s: %d RoCE, %d skipped, %d bad\n", total.Frames, in, total.RoCE, total.Skipped, total.Bad)
	}
	if status == 0 && total.Bad > 0 {
		status = 1
	}
	return status
}
