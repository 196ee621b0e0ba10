package cli

import (
	"flag"
	"io"
	"regexp"
	"strings"
	"testing"
)

// TestLabHelp: `taproce lab -h` lists every flag of lab, a bool flag
// without an argument (a back-quoted word in its usage would print as
// one: "-keep taproce lab down") and every other flag with one.
func TestLabHelp(t *testing.T) {
	code, out, errOut := runCmd("lab", "-h")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, errOut)
	}
	help := strings.Split(out+errOut, "\n")
	withArg := regexp.MustCompile(`^ [a-z]+(\t|$)`)
	n := 0
	newLabFlags(io.Discard).fs.VisitAll(func(f *flag.Flag) {
		n++
		head := "  -" + f.Name
		var rest *string
		for _, line := range help {
			if r, ok := strings.CutPrefix(line, head); ok && (r == "" || r[0] == ' ' || r[0] == '\t') {
				rest = &r
				break
			}
		}
		if rest == nil {
			t.Errorf("-%s not in the help:\n%s", f.Name, strings.Join(help, "\n"))
			return
		}
		isBool := false
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok {
			isBool = b.IsBoolFlag()
		}
		switch {
		case isBool && *rest != "" && (*rest)[0] != '\t':
			t.Errorf("bool flag shown with an argument: %q", head+*rest)
		case !isBool && !withArg.MatchString(*rest):
			t.Errorf("flag shown without its argument: %q", head+*rest)
		}
	})
	if n < 10 {
		t.Errorf("%d flags: not lab's", n)
	}
}
