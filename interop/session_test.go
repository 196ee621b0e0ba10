package interop

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestSessionCancelAfterOneMark: a command whose standard output has
// ended (its mark read) when its context ends, its standard error not
// yet, returns the context's error once the session is closed — it used
// to wait for the output's mark a second time, for ever, which hung a
// whole interop run when a task was killed just as it ended.
func TestSessionCancelAfterOneMark(t *testing.T) {
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &session{stdin: inW, out: bufio.NewReader(outR), errOut: bufio.NewReader(errR), done: make(chan struct{})}
	// The shell: it answers the command's standard output with its mark
	// alone, and ends when its input does.
	marked := make(chan struct{})
	go func() {
		defer close(s.done)
		defer outW.Close()
		defer errW.Close()
		line, _ := bufio.NewReader(inR).ReadString('\n')
		i := strings.Index(line, "echo @@@exec-")
		mark := strings.Fields(line[i+len("echo "):])[0]
		_, _ = io.WriteString(outW, "output\n"+mark+" 0\n")
		close(marked)
		_, _ = io.Copy(io.Discard, inR)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-marked
		time.Sleep(50 * time.Millisecond) // the output's mark is read
		cancel()
	}()
	done := make(chan error, 1)
	go func() {
		_, _, _, err := s.run(ctx, "true")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v, want the context's end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}
