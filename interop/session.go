package interop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A session is a shell in a VM that runs Exec's commands one after
// another over one ssh connection (peer-exec.sh NAME bash, commands on its
// standard input), which saves the connection's setup, about a second
// under TCG, for every command but the first. Each command runs as
// `setsid -w bash -c CMD </dev/null` in a session of its own, as a
// command of its own ssh connection would; the exit status and the end of
// its output follow it on both streams behind a random mark.
type session struct {
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	out, errOut *bufio.Reader
	done        chan struct{} // closed when the ssh process has ended
}

// exitError is the non-zero exit status of a command a session ran.
type exitError struct{ code int }

func (e *exitError) Error() string { return "exit status " + strconv.Itoa(e.code) }

// errSessionLost: the session ended before the command did.
var errSessionLost = errors.New("ssh session ended")

// openSession starts a session in the VM.
func (p *Peer) openSession() (*session, error) {
	c := exec.Command(filepath.Join(p.dir, "peer-exec.sh"), p.Name, "bash")
	stdin, err := c.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	stdout, err := c.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	stderr, err := c.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("interop: %w", err)
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("interop: %s: %w", p.Name, err)
	}
	s := &session{cmd: c, stdin: stdin, out: bufio.NewReader(stdout), errOut: bufio.NewReader(stderr), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		c.Wait()
	}()
	return s, nil
}

// run runs cmd and returns its output and exit status. An error other
// than ctx's end means the session is lost: close it.
func (s *session) run(ctx context.Context, cmd string) (stdout, stderr string, code int, err error) {
	mark := fmt.Sprintf("@@@exec-%016x@@@", rand.Uint64())
	line := fmt.Sprintf("setsid -w bash -c %s </dev/null; rc=$?; echo; echo %s $rc; echo >&2; echo %s >&2\n", Quote(cmd), mark, mark)
	if _, err := io.WriteString(s.stdin, line); err != nil {
		return "", "", -1, fmt.Errorf("%w: %w", errSessionLost, err)
	}
	type result struct {
		text, tail string
		err        error
	}
	outc, errc := make(chan result, 1), make(chan result, 1)
	go func() {
		text, tail, err := readToMark(s.out, mark)
		outc <- result{text, tail, err}
	}()
	go func() {
		text, tail, err := readToMark(s.errOut, mark)
		errc <- result{text, tail, err}
	}()
	var o, e result
	gotOut, gotErr := false, false
	for !gotOut || !gotErr {
		select {
		case o = <-outc:
			gotOut = true
		case e = <-errc:
			gotErr = true
		case <-ctx.Done():
			// The readers end with the ssh process; wait only for the
			// ones not heard from (one may have sent its mark already).
			s.close()
			if !gotOut {
				o = <-outc
			}
			if !gotErr {
				e = <-errc
			}
			return o.text, e.text, -1, ctx.Err()
		}
	}
	if o.err != nil || e.err != nil {
		return o.text, e.text, -1, fmt.Errorf("%w: %w", errSessionLost, errors.Join(o.err, e.err))
	}
	code, err = strconv.Atoi(strings.TrimSpace(o.tail))
	if err != nil {
		return o.text, e.text, -1, fmt.Errorf("%w: exit status %q", errSessionLost, o.tail)
	}
	return o.text, e.text, code, nil
}

// readToMark reads lines up to the one that starts with mark and returns
// what came before it, less the newline run put there, and the rest of
// the mark's line.
func readToMark(r *bufio.Reader, mark string) (text, tail string, err error) {
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		if rest, ok := strings.CutPrefix(line, mark); ok && err == nil {
			return strings.TrimSuffix(b.String(), "\n"), rest, nil
		}
		b.WriteString(line)
		if err != nil {
			return b.String(), "", err
		}
	}
}

// close ends the session: its shell exits when its input closes; an ssh
// process still there 5 s later is killed.
func (s *session) close() {
	s.stdin.Close()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// session returns an idle session of the VM, or a new one.
func (p *Peer) session() (*session, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return s, nil
	}
	p.mu.Unlock()
	return p.openSession()
}

// release makes s idle again, or closes it once the VM is stopping.
func (p *Peer) release(s *session) {
	p.mu.Lock()
	if !p.closing {
		p.idle = append(p.idle, s)
		s = nil
	}
	p.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// closeSessions closes the idle sessions; with stopping, sessions in use
// are closed when their command ends.
func (p *Peer) closeSessions(stopping bool) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closing = p.closing || stopping
	p.mu.Unlock()
	for _, s := range idle {
		s.close()
	}
}
